//! `cdc_enable_multicloud` and `cdc_multicloud_status`: a table's rows routed to the sinks of their
//! region (`regional_routing`, see `cdc_core::routing`), and how each route is delivering.
use cdc_core::routing::{Routing, ROUTING_MESSAGE_PREFIX};
use cdc_core::{CdcError, ErrorKind};
use pgrx::prelude::*;
use pgrx::{JsonB, Uuid};
use serde_json::{Map, Value};

use super::{required, schema};
use crate::catalog;
use crate::errors::raise;

/// Routes a table's changes by a column's value to the sinks of each route (seed example 5):
/// `config` holds `regional_routing` with `routing_column`, `routes` (a value of the column ->
/// the sinks its rows go to), optionally `default_route` (the route of rows whose value names no
/// route, or is NULL) and `enabled` (false turns routing off). Enables capture of the table when
/// it is not captured yet, else keeps its capture config and adds the routing to it. Routing
/// needs before images, so it sets `include_before_image` (REPLICA IDENTITY FULL). A sink named
/// that exists must carry the table (22023, nothing changed otherwise). A row whose routing
/// value changes reaches its old route's sinks as a DELETE and its new route's as an INSERT (a
/// sink in both gets the UPDATE); a TRUNCATE reaches every sink of any route; a sink in no route
/// gets nothing of the table. A sink a route names that does not exist yet is accepted with a
/// WARNING (the seed adds its sinks after the routing): the route waits for it (`waiting_for_sink`
/// in `cdc_multicloud_status`), and the sink, once added, gets the route's rows as its snapshot and
/// then its changes. Returns the table's capture id, as `cdc_enable` does.
///
/// ```sql
/// SELECT cdc_enable_multicloud(table_name => 'global_customers', config => '{
///   "regional_routing": {"enabled": true, "routing_column": "customer_region",
///                        "routes": {"americas": ["aws_kinesis", "azure_eventhub"],
///                                   "europe": ["azure_eventhub", "gcp_pubsub"]}}}');
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_enable_multicloud(table_name regclass, config jsonb) RETURNS uuid
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_enable_multicloud(table_name: Option<pg_sys::Oid>, config: Option<JsonB>) -> Uuid {
    let _quiet = super::quiet_statement();
    let oid = required(table_name, "table_name");
    let config = required(config, "config").0;
    let given = cdc_core::object::Obj::root("config", &config).unwrap_or_else(|e| raise(e));
    given.check_keys(&["regional_routing"]).unwrap_or_else(|e| raise(e));
    let Some(routing) = given.get("regional_routing") else {
        raise(
            CdcError::new(ErrorKind::InvalidParameter, "config.regional_routing is required")
                .hint("Give {\"regional_routing\": {\"routing_column\": ..., \"routes\": {...}}}."),
        )
    };
    super::access::require_select(oid, "capture");
    let _entry = super::access::enter();
    let schema = schema();
    let current =
        catalog::json(&format!("SELECT config FROM {schema}._cdc_publications WHERE table_oid = $1"), &[oid.into()]);
    let mut merged = match current {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let turns_on = routing.get("enabled") != Some(&Value::Bool(false));
    merged.insert("regional_routing".into(), routing.clone());
    if turns_on {
        merged.remove("before_image");
        merged.insert("include_before_image".into(), Value::Bool(true));
    }
    super::capture::enable(oid, Value::Object(merged))
}

/// Refuses a routing to a sink that does not carry the table (22023), or a catalog older than 0.4.0
/// (55000); warns about the sinks it names that do not exist yet.
pub(crate) fn check_routes(schema: &str, oid: pg_sys::Oid, table: &str, routing: &Routing, catalog_ready: bool) {
    if !catalog_ready {
        raise(
            CdcError::new(ErrorKind::PrerequisiteState, "regional_routing needs pg_cdc's 0.4.0 catalog")
                .hint("ALTER EXTENSION pg_cdc UPDATE first."),
        );
    }
    let names: Vec<String> = routing.sinks().into_iter().map(str::to_string).collect();
    let found = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_object_agg(sink_name, table_oids IS NULL OR $2 = ANY (table_oids)), '{{}}') \
               FROM {schema}._cdc_sinks WHERE sink_name = ANY ($1)"
        ),
        &[names.clone().into(), oid.into()],
    )
    .unwrap_or_default();
    let mut waiting = Vec::new();
    for name in &names {
        match found.get(name).and_then(Value::as_bool) {
            Some(true) => {}
            Some(false) => raise(
                CdcError::new(
                    ErrorKind::InvalidParameter,
                    format!("config.regional_routing: sink \"{name}\" does not carry table {table} (its config.tables leaves it out)"),
                )
                .hint("Route the table to sinks that carry it, or add it to the sink's tables."),
            ),
            None => waiting.push(format!("\"{name}\"")),
        }
    }
    if !waiting.is_empty() {
        // The seed's order: the routing first, the sinks after. Their routes wait for them.
        pgrx::warning!(
            "config.regional_routing: {} {} not exist yet: {} waiting_for_sink in cdc_multicloud_status until \
             cdc_add_sink adds {}, and then {} the route's rows (its snapshot) and changes",
            if waiting.len() == 1 { "sink" } else { "sinks" },
            if waiting.len() == 1 { format!("{} does", waiting[0]) } else { format!("{} do", waiting.join(", ")) },
            if waiting.len() == 1 { "it is" } else { "they are" },
            if waiting.len() == 1 { "it" } else { "them" },
            if waiting.len() == 1 { "it gets" } else { "each gets" },
        );
    }
}

/// Marks where a table's routing changes: with a SHARE lock on the table (every transaction that
/// wrote it has committed, the next ones wait for this one), a transactional message every sink
/// reads in its stream. Returns the message's LSN, which becomes `_cdc_publications.routing_lsn`.
pub(crate) fn mark_routing_change(qualified: &str, oid: pg_sys::Oid) -> String {
    catalog::run(&format!("LOCK TABLE {qualified} IN SHARE MODE"), &[]);
    catalog::emit_message(ROUTING_MESSAGE_PREFIX, &oid.to_u32().to_string())
}

/// How each routed table is delivering, one document per table (or only `table_name`'s): per
/// route, `event_count` (the most events any of its sinks delivered since the routing took effect)
/// and per sink its `status` (`healthy` while running, else the sink's state), `lag_ms` (commit
/// in PostgreSQL to the sink's acknowledgement, for the route's last delivered transaction),
/// `lag_bytes` (WAL the sink has not confirmed) and `event_count`; `cross_cloud_consistency`:
/// `max_lag_ms`, `divergence_events` (per route, the events its busiest sink delivered that
/// another of its sinks has not yet, summed) and `sync_status` (`synchronized`: every sink
/// healthy and no divergence; `catching_up`: every sink healthy, some divergence; `degraded`:
/// a sink is not healthy).
///
/// ```sql
/// SELECT * FROM cdc_multicloud_status();
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_multicloud_status(table_name regclass DEFAULT NULL) RETURNS SETOF jsonb
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_multicloud_status(table_name: Option<pg_sys::Oid>) -> SetOfIterator<'static, JsonB> {
    let _entry = super::access::enter();
    let schema = schema();
    if let Some(oid) = table_name {
        super::captured_table_name(&schema, oid);
    }
    let rows = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object(
                 'table', p.table_name, 'config', p.config, 'key_columns', p.key_columns, 'routing_lsn', p.routing_lsn::text,
                 'counts', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                'sink', o.sink_name, 'route', o.route, 'events', o.events,
                                'lag_ms', round(extract(epoch FROM o.last_acked_at - o.last_commit_at) * 1000))), '[]')
                              FROM {schema}._cdc_route_offsets o
                             WHERE o.table_oid = p.table_oid AND o.routing_lsn = p.routing_lsn)) ORDER BY p.table_name), '[]')
               FROM {schema}._cdc_publications p
              WHERE p.routing_lsn IS NOT NULL AND ($1::oid IS NULL OR p.table_oid = $1)"
        ),
        &[table_name.into()],
    )
    .unwrap_or_default();
    let sinks = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_object_agg(s.sink_name, jsonb_build_object('state', s.state,
                 'lag_bytes', (pg_current_wal_lsn() - r.confirmed_flush_lsn)::bigint)), '{{}}')
               FROM {schema}._cdc_sinks s LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name"
        ),
        &[],
    )
    .unwrap_or_default();
    let mut out = Vec::new();
    for row in rows.as_array().into_iter().flatten() {
        let keys: Vec<String> = serde_json::from_value(row["key_columns"].clone()).unwrap_or_default();
        let Ok(cfg) = cdc_core::config::parse_stored_capture_config(&row["config"], keys) else { continue };
        let Some(routing) = cfg.routing else { continue };
        let counts: Vec<cdc_core::routing::RouteCountRow> = row["counts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| cdc_core::routing::RouteCountRow {
                sink: c["sink"].as_str().unwrap_or_default().to_string(),
                route: c["route"].as_str().unwrap_or_default().to_string(),
                events: c["events"].as_u64().unwrap_or_default(),
                lag_ms: c["lag_ms"].as_f64().map(|v| v as u64),
            })
            .collect();
        let sink_views = |name: &str| {
            sinks.get(name).map(|s| cdc_core::routing::SinkView {
                state: s["state"].as_str().unwrap_or_default().to_string(),
                lag_bytes: s["lag_bytes"].as_i64(),
            })
        };
        let table = row["table"].as_str().unwrap_or_default();
        let since = row["routing_lsn"].as_str().unwrap_or_default();
        out.push(JsonB(cdc_core::routing::status_json(table, since, &routing, &counts, sink_views)));
    }
    SetOfIterator::new(out)
}
