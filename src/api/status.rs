//! `cdc_delivery_status` and `cdc_filter_metrics`: what a sink delivered and what the filters and
//! transformations of a table did, from the worker's counters in shared memory.
use cdc_core::stats::{filter_metrics_json, DeliveryStatus};
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;

use super::{required, schema};

/// How a sink is delivering: its type, delivery mode and state; its delivery transactions open,
/// committed and aborted (Kafka transactions, or a table sink's database transactions); the WAL position read and the one committed (`offset_tracking`); duplicates the worker
/// found after a restart and filtered; events delivered. Counters start when the server starts (or
/// restarts after a crash) and survive worker restarts.
///
/// ```sql
/// SELECT cdc_delivery_status('kafka_orders');
/// ```
#[pg_extern(volatile)]
fn cdc_delivery_status(sink_name: Option<&str>) -> JsonB {
    let sink_name = required(sink_name, "sink_name");
    let _entry = super::access::enter();
    let schema = schema();
    let row = crate::catalog::json(
        &format!(
            "SELECT jsonb_build_object('id', sink_id::text, 'sink_type', sink_type, 'delivery_mode', delivery_mode, 'state', state, \
             'last_error', last_error, 'since', to_char(state_since AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')) \
             FROM {schema}._cdc_sinks WHERE sink_name = $1"
        ),
        &[sink_name.into()],
    )
    .unwrap_or_else(|| super::no_such_sink(sink_name));
    let field = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let counters_since = counters_since();
    let (id, mode, state, since) = (field("id"), field("delivery_mode"), field("state"), field("since"));
    let last_error = row.get("last_error").and_then(Value::as_str);
    let sink_type = field("sink_type");
    JsonB(
        DeliveryStatus {
            sink: sink_name,
            sink_type: &sink_type,
            delivery_mode: &mode,
            state: &state,
            last_error,
            since: &since,
            counters: crate::stats::read(&id),
            counters_since: &counters_since,
        }
        .to_json(),
    )
}

/// When the shared-memory counters started, ISO-8601 UTC.
pub(crate) fn counters_since() -> String {
    crate::stats::since_unix_micros()
        .and_then(|us| {
            crate::catalog::select_one::<String>(
                "SELECT to_char(to_timestamp($1 / 1e6) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')",
                &[us.into()],
            )
        })
        .unwrap_or_default()
}

/// What a captured table's filter and transformations did: changes seen, matched and excluded,
/// the ratio, the bytes the filter kept off the wire (the encoded size of the dropped events),
/// updates that entered or left the filter, computed columns and masks applied, expression
/// errors; at the top level for the sink that has seen the most changes, and under `sinks` for
/// each. Counters start when the server starts (or restarts after a crash).
///
/// ```sql
/// SELECT cdc_filter_metrics('sensor_readings');
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_filter_metrics(table_name regclass) RETURNS jsonb
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_filter_metrics(table_name: Option<pg_sys::Oid>) -> JsonB {
    let oid = required(table_name, "table_name");
    let _entry = super::access::enter();
    let schema = schema();
    let name = super::captured_table_name(&schema, oid);
    let sinks = crate::catalog::json(
        &format!(
            "SELECT coalesce(jsonb_object_agg(sink_id::text, sink_name), '{{}}') FROM {schema}._cdc_sinks \
             WHERE table_oids IS NULL OR $1 = ANY (table_oids)"
        ),
        &[oid.into()],
    )
    .unwrap_or_default();
    let mut per_sink: Vec<(String, cdc_core::stats::TableCounters)> = Vec::new();
    if let Some(map) = sinks.as_object() {
        let counts = crate::stats::read_table(oid.to_u32());
        for (id, sink_name) in map {
            let key = crate::stats::sink_key(id);
            let c = counts.iter().find(|(k, _)| Some(*k) == key).map(|(_, c)| *c).unwrap_or_default();
            per_sink.push((sink_name.as_str().unwrap_or_default().to_string(), c));
        }
    }
    per_sink.sort_by(|a, b| a.0.cmp(&b.0));
    JsonB(filter_metrics_json(&name, &per_sink, &counters_since()))
}
