//! `cdc_delivery_status`: what a sink delivered, from the worker's counters in shared memory.
use cdc_core::stats::DeliveryStatus;
use cdc_core::{CdcError, ErrorKind};
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;

use super::{required, schema};
use crate::errors::raise;

/// How a sink is delivering: its delivery mode and state; Kafka transactions open, committed and
/// aborted; the WAL position read and the one committed (`offset_tracking`); duplicates the worker
/// found after a restart and filtered; events delivered. Counters start when the server starts (or
/// restarts after a crash) and survive worker restarts.
///
/// ```sql
/// SELECT cdc_delivery_status('kafka_orders');
/// ```
#[pg_extern(volatile)]
fn cdc_delivery_status(sink_name: Option<&str>) -> JsonB {
    let sink_name = required(sink_name, "sink_name");
    let schema = schema();
    let row = crate::catalog::json(
        &format!(
            "SELECT jsonb_build_object('id', sink_id::text, 'delivery_mode', delivery_mode, 'state', state, \
             'last_error', last_error, 'since', to_char(state_since AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')) \
             FROM {schema}._cdc_sinks WHERE sink_name = $1"
        ),
        &[sink_name.into()],
    )
    .unwrap_or_else(|| {
        raise(
            CdcError::new(ErrorKind::UndefinedObject, format!("sink \"{sink_name}\" does not exist"))
                .hint("SELECT sink_name FROM _cdc_sinks lists the sinks."),
        )
    });
    let field = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let counters_since = crate::stats::since_unix_micros()
        .and_then(|us| {
            crate::catalog::select_one::<String>(
                "SELECT to_char(to_timestamp($1 / 1e6) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')",
                &[us.into()],
            )
        })
        .unwrap_or_default();
    let (id, mode, state, since) = (field("id"), field("delivery_mode"), field("state"), field("since"));
    let last_error = row.get("last_error").and_then(Value::as_str);
    JsonB(
        DeliveryStatus {
            sink: sink_name,
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
