//! Snapshots on request: `cdc_snapshot` asks the sinks that carry a captured table to deliver the
//! rows it holds now as READ events, while their streams go on (the worker reads them in chunks by
//! key, as for a new sink's initial snapshot: `worker::snapshot`, `cdc_core::snapshot`).

use cdc_core::{CdcError, ErrorKind};
use pgrx::prelude::*;

use super::{captured_table_name, check_prerequisites, not_captured, required, schema};
use crate::catalog;
use crate::errors::raise;

/// Starts a snapshot of a captured table for the sinks that carry it (or for `sink_name` only)
/// and returns at once, one snapshot id per sink. Each sink's worker delivers every row the table
/// holds as a `READ` event, in chunks of its `snapshot_chunk_size` rows read by key, while it goes
/// on delivering the table's changes: a row changed while its chunk is in flight is delivered as
/// that change, never as an older READ. The table's capture config (filters, columns, masks,
/// tokens, enrichment) applies as to its changes. A sink already snapshotting the table keeps that
/// snapshot (its id is returned). Refuses (0A000) a table with neither a primary key nor a replica
/// identity index: its chunks could not be read by key. The view `cdc_snapshots` shows progress.
///
/// ```sql
/// SELECT cdc_snapshot('orders');                 -- every sink that carries orders
/// SELECT cdc_snapshot('orders', 'orders_kafka'); -- one sink
/// ```
// Declared by hand so the argument is a plain regclass (as cdc_enable's).
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_snapshot(table_name regclass, sink_name text DEFAULT NULL) RETURNS SETOF bigint
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_snapshot(table_name: Option<pg_sys::Oid>, sink_name: Option<&str>) -> SetOfIterator<'static, i64> {
    let oid = required(table_name, "table_name");
    check_prerequisites();
    let schema = schema();
    if !super::sinks::has_snapshots(&schema) {
        raise(
            CdcError::new(ErrorKind::PrerequisiteState, "this catalog predates snapshots")
                .hint("Run ALTER EXTENSION pg_cdc UPDATE."),
        );
    }
    let active = catalog::select_one::<bool>(
        &format!("SELECT true FROM {schema}._cdc_publications WHERE table_oid = $1 AND status = 'active'"),
        &[oid.into()],
    );
    if active.is_none() {
        not_captured(oid, "Capture it first: SELECT cdc_enable('<table>').");
    }
    let table = captured_table_name(&schema, oid);
    match crate::worker::snapshot::table_chunk_key(oid.to_u32()) {
        Ok(Some(_)) => {}
        Ok(None) => raise(
            CdcError::new(
                ErrorKind::FeatureNotSupported,
                format!(
                    "table {table} has no primary key or replica identity index, so its snapshot cannot be read in chunks by key"
                ),
            )
            .detail("A row changed while its chunk is in flight is told apart from the chunk's rows by its key.")
            .hint("Add a primary key, or a unique index on NOT NULL columns set as REPLICA IDENTITY USING INDEX."),
        ),
        Err(e) => raise(CdcError::new(ErrorKind::Internal, e)),
    }
    let sinks = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_array(sink_id::text, sink_name) ORDER BY sink_name), '[]')
               FROM {schema}._cdc_sinks
              WHERE ($1::text IS NULL OR sink_name = $1) AND (table_oids IS NULL OR $2 = ANY (table_oids))"
        ),
        &[sink_name.into(), oid.into()],
    )
    .and_then(|v| serde_json::from_value::<Vec<(String, String)>>(v).ok())
    .unwrap_or_default();
    if sinks.is_empty() {
        match sink_name {
            Some(name) => {
                let exists = catalog::select_one::<bool>(
                    &format!("SELECT true FROM {schema}._cdc_sinks WHERE sink_name = $1"),
                    &[name.into()],
                );
                if exists.is_none() {
                    raise(
                        CdcError::new(ErrorKind::UndefinedObject, format!("sink \"{name}\" does not exist"))
                            .hint("SELECT sink_name FROM _cdc_sinks lists the sinks."),
                    );
                }
                raise(
                    CdcError::new(ErrorKind::InvalidParameter, format!("sink \"{name}\" does not carry table {table}"))
                        .hint("Its config's tables list names the tables it carries."),
                );
            }
            None => raise(
                CdcError::new(ErrorKind::PrerequisiteState, format!("no sink carries table {table}"))
                    .hint("Add one with cdc_add_sink: a new sink delivers the table's rows as its initial snapshot."),
            ),
        }
    }
    crate::worker::launcher::catalog_changed();
    let mut ids = Vec::with_capacity(sinks.len());
    for (sink_id, name) in sinks {
        // The sink row first, as the worker's chunk reads do: a drop of the sink waits, or wins.
        let running = catalog::select_one_write::<i64>(
            &format!(
                "SELECT s.snapshot_id FROM {schema}._cdc_sinks k JOIN {schema}._cdc_snapshots s USING (sink_id)
                  WHERE k.sink_id = $1::uuid AND s.table_oid = $2 AND s.state IN ('pending', 'running')
                  ORDER BY s.snapshot_id LIMIT 1 FOR KEY SHARE OF k"
            ),
            &[sink_id.as_str().into(), oid.into()],
        );
        let id = match running {
            Some(id) => {
                pgrx::notice!("sink \"{name}\" is already snapshotting table {table} (snapshot {id})");
                id
            }
            None => catalog::select_one_write::<i64>(
                &format!(
                    "INSERT INTO {schema}._cdc_snapshots (sink_id, table_oid, kind) VALUES ($1::uuid, $2, 'requested')
                     RETURNING snapshot_id"
                ),
                &[sink_id.as_str().into(), oid.into()],
            )
            .unwrap_or_else(|| pgrx::error!("pg_cdc: INSERT returned no row")),
        };
        ids.push(id);
    }
    SetOfIterator::new(ids)
}

/// Every sink that carries a table whose capture starts now, and whose `snapshot_mode` is
/// `initial`, gets a snapshot of it (kind `added`): its rows arrive as READ events as a new sink's
/// would. Nothing on a catalog that predates snapshots.
pub(crate) fn snapshot_added_table(schema: &str, oid: pg_sys::Oid) {
    if !super::sinks::has_snapshots(schema) {
        return;
    }
    // snapshot_mode defaults to initial (cdc_core::config::SnapshotMode).
    catalog::run(
        &format!(
            "INSERT INTO {schema}._cdc_snapshots (sink_id, table_oid, kind)
             SELECT k.sink_id, $1, 'added' FROM {schema}._cdc_sinks k
              WHERE (k.table_oids IS NULL OR $1 = ANY (k.table_oids))
                AND coalesce(k.config ->> 'snapshot_mode', 'initial') = 'initial'
                AND NOT EXISTS (SELECT 1 FROM {schema}._cdc_snapshots s WHERE s.sink_id = k.sink_id
                                   AND s.table_oid = $1 AND s.state IN ('pending', 'running'))
              ORDER BY k.sink_name"
        ),
        &[oid.into()],
    );
}
