//! `cdc_alter_sink`: change a sink's config in place, keeping its slot (its position) and its
//! delivery guarantee. What may change and what may not is `cdc_sinks::alter`'s; this checks the
//! new config as `cdc_add_sink` checks a new one, writes it, back-fills the tables it now carries
//! and lets the worker reopen the destination.
use cdc_core::state::{SinkState, SnapshotState};
use cdc_core::{CdcError, ErrorKind};
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::{json, Value};

use super::sinks::Tables;
use super::{check_prerequisites, required, schema};
use crate::catalog;
use crate::errors::{raise, OrRaise};

/// Changes a sink's config: each key of `config` replaces the sink's value, a key set to null is
/// removed, the others stay. The sink keeps its slot, so its position and its guarantee: its worker
/// settles and confirms what it delivered, then opens the destination again with the new config
/// (within a second of COMMIT while it runs; a paused sink uses it when resumed). Tables added to
/// `tables` are back-filled by a snapshot (as `snapshot_mode` says; their changes from the sink's
/// position on follow), tables removed are no longer carried (their open snapshots for the sink are
/// cancelled). Keys its guarantee rests on are refused (0A000) with the alternative: `exactly_once`,
/// `snapshot_mode`, a Kafka sink's `transactional_id`, a table sink's `table`, a postgres sink's
/// `state_schema`. Returns `{"sink", "changed": {key: {"from", "to"}}, "snapshots": [tables back-filled],
/// "no_longer_carried": [tables]}`, secrets shown as `"(secret)"`.
///
/// ```sql
/// SELECT cdc_alter_sink('kafka_orders', '{"topic": "orders-v2", "linger_ms": 20}');
/// ```
#[pg_extern(volatile)]
pub(crate) fn cdc_alter_sink(sink_name: Option<&str>, config: Option<JsonB>) -> JsonB {
    let _quiet = super::quiet_statement();
    let sink_name = required(sink_name, "sink_name");
    let patch = required(config, "config");
    check_prerequisites();
    let schema = schema();
    let _entry = super::access::enter();
    let row = catalog::json_write(
        &format!(
            "SELECT jsonb_build_object('id', sink_id, 'type', sink_type, 'config', config, 'state', state,
                                       'oids', table_oids::bigint[]) FROM {schema}._cdc_sinks WHERE sink_name = $1 FOR UPDATE"
        ),
        &[sink_name.into()],
    )
    .unwrap_or_else(|| super::no_such_sink(sink_name));
    let (sink_type, current) = (catalog::str_field(&row, "type").to_string(), row["config"].clone());
    if catalog::str_field(&row, "state") == SinkState::Finished.label() {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!(
                    "sink \"{sink_name}\" is finished: it delivered its initial_only snapshot and reads nothing more"
                ),
            )
            .hint("Add a new sink with the config you want; cdc_drop_sink removes this one."),
        );
    }
    let plan = cdc_sinks::alter::plan(&sink_type, &current, &patch.0).or_raise();
    let diff = plan.diff(&current);
    if plan.changed.is_empty() {
        pgrx::notice!("sink \"{sink_name}\": nothing to change");
        return JsonB(json!({"sink": sink_name, "changed": {}, "snapshots": [], "no_longer_carried": []}));
    }
    let old: Option<Vec<pg_sys::Oid>> = row["oids"]
        .as_array()
        .map(|a| a.iter().filter_map(|o| o.as_u64()).map(|o| pg_sys::Oid::from(o as u32)).collect());
    // Unchanged `tables` stay as the sink has them (a table dropped since stays listed, waiting).
    let tables_changed = plan.changed.iter().any(|k| k == "tables");
    let tables = if tables_changed { Tables::Resolve } else { Tables::Kept(old.clone()) };
    let (table_oids, table_names) = super::sinks::check_sink(&schema, sink_name, &plan.parsed, tables);
    let sink_id = catalog::str_field(&row, "id").to_string();

    crate::worker::launcher::catalog_changed();
    catalog::run(
        &format!("UPDATE {schema}._cdc_sinks SET config = $2 WHERE sink_id = $1::uuid"),
        &[sink_id.as_str().into(), JsonB(plan.config.clone()).into()],
    );
    if tables_changed {
        let names_column =
            if catalog::has_column(&schema, "_cdc_sinks", "table_names") { ", table_names = $3" } else { "" };
        catalog::run(
            &format!("UPDATE {schema}._cdc_sinks SET table_oids = $2{names_column} WHERE sink_id = $1::uuid"),
            &[sink_id.as_str().into(), table_oids.clone().into(), table_names.into()],
        );
    }
    if !super::access::caller_is_superuser() && catalog::has_column(&schema, "_cdc_sinks", "added_by") {
        // Its config is now the caller's: the worker checks a postgres sink's connection as its.
        catalog::run(
            &format!("UPDATE {schema}._cdc_sinks SET added_by = $2 WHERE sink_id = $1::uuid"),
            &[sink_id.as_str().into(), super::access::caller().into()],
        );
    }
    let (mut snapshots, mut dropped) = (Value::Array(vec![]), Value::Array(vec![]));
    if old != table_oids && catalog::has_snapshots(&schema) {
        let (open, cancelled) = (SnapshotState::open_sql(), SnapshotState::Cancelled.sql());
        let args = || [sink_id.as_str().into(), old.clone().into(), table_oids.clone().into()];
        // No longer carried: the captured tables it stops carrying, and their open snapshots for it end.
        dropped = catalog::json(
            &format!(
                "SELECT coalesce(jsonb_agg(p.table_oid::regclass::text ORDER BY p.table_name), '[]')
                   FROM {schema}._cdc_publications p
                  WHERE ($2::oid[] IS NULL OR p.table_oid = ANY ($2::oid[]))
                    AND NOT ($3::oid[] IS NULL OR p.table_oid = ANY ($3::oid[]))"
            ),
            &args(),
        )
        .unwrap_or_default();
        catalog::run(
            &format!(
                "UPDATE {schema}._cdc_snapshots s SET state = {cancelled}, finished_at = now(),
                        note = 'the sink no longer carries the table (cdc_alter_sink)'
                  WHERE s.sink_id = $1::uuid AND s.state IN {open}
                    AND NOT ($3::oid[] IS NULL OR s.table_oid = ANY ($3::oid[]))"
            ),
            &args(),
        );
        if plan.parsed.common().snapshot_mode.snapshots() {
            // Newly carried and captured: its rows as READ events, as for a table captured later.
            snapshots = catalog::json_write(
                &format!(
                    "WITH a AS (INSERT INTO {schema}._cdc_snapshots (sink_id, table_oid, kind)
                                SELECT $1::uuid, p.table_oid, 'added' FROM {schema}._cdc_publications p
                                 WHERE p.status = 'active'
                                   AND ($3::oid[] IS NULL OR p.table_oid = ANY ($3::oid[]))
                                   AND NOT ($2::oid[] IS NULL OR p.table_oid = ANY ($2::oid[]))
                                   AND NOT EXISTS (SELECT 1 FROM {schema}._cdc_snapshots s WHERE s.sink_id = $1::uuid
                                                      AND s.table_oid = p.table_oid AND s.state IN {open})
                                 ORDER BY p.table_oid
                                RETURNING table_oid)
                     SELECT coalesce(jsonb_agg(a.table_oid::regclass::text ORDER BY a.table_oid), '[]') FROM a"
                ),
                &args(),
            )
            .unwrap_or_default();
        }
    }
    JsonB(json!({
        "sink": sink_name,
        "changed": diff,
        "snapshots": snapshots,
        "no_longer_carried": dropped,
    }))
}
