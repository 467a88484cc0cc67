//! Snapshots on request: `cdc_snapshot` asks the sinks that carry a captured table to deliver the
//! rows it holds now as READ events, while their streams go on (the worker reads them in chunks by
//! key, as for a new sink's initial snapshot: `worker::snapshot`, `cdc_core::snapshot`).
//!
//! With `wait => true` the request must be committed before the call returns, so the worker can
//! start on it while the caller waits: a short-lived background worker writes it in its own
//! transaction (an autonomous transaction), and the caller then follows the progress.

use std::time::{Duration, Instant};

use cdc_core::state::SnapshotState;
use cdc_core::{CdcError, ErrorKind};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime};
use pgrx::prelude::*;
use serde::Deserialize;

use super::{captured_table_name, check_prerequisites, not_captured, required, schema};
use crate::catalog;
use crate::errors::raise;

/// Starts a snapshot of a captured table for the sinks that carry it (or for `sink_name` only)
/// and returns one snapshot id per sink: at once, or with `wait => true` once every one is done
/// (with a NOTICE on progress every few seconds). Each sink's worker delivers every row the table
/// holds as a `READ` event, in chunks of its `snapshot_chunk_size` rows read by key, while it goes
/// on delivering the table's changes: a row changed while its chunk is in flight is delivered as
/// that change, never as an older READ. The table's capture config (filters, columns, masks,
/// tokens, enrichment) applies as to its changes. A sink already snapshotting the table keeps that
/// snapshot (its id is returned). Refuses (0A000) a table with neither a primary key nor a replica
/// identity index: its chunks could not be read by key. The view `cdc_snapshots` shows progress.
///
/// ```sql
/// SELECT cdc_snapshot('orders');                               -- every sink that carries orders
/// SELECT cdc_snapshot('orders', 'orders_kafka', wait => true); -- one sink, returns when done
/// ```
// Declared by hand so the argument is a plain regclass (as cdc_enable's).
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_snapshot(table_name regclass, sink_name text DEFAULT NULL, wait boolean DEFAULT false)
RETURNS SETOF bigint VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_snapshot(
    table_name: Option<pg_sys::Oid>,
    sink_name: Option<&str>,
    wait: Option<bool>,
) -> SetOfIterator<'static, i64> {
    let oid = required(table_name, "table_name");
    let wait = required(wait, "wait");
    if wait {
        refuse_waiting_in_a_transaction();
    }
    check_prerequisites();
    super::access::require_select(oid, "snapshot");
    let _entry = super::access::enter();
    let schema = schema();
    let (table, sinks) = validate(&schema, oid, sink_name);
    if !wait {
        return SetOfIterator::new(request(&schema, oid, &table, &sinks));
    }
    // The named sink by its id: the helper process gets a few bytes, and the sink may not be
    // renamed meanwhile (no sink is).
    let only = sink_name.and_then(|_| sinks.first().map(|(id, _)| id.clone()));
    run_request(oid, only.as_deref());
    let ids = super::fresh(|| requested_ids(&schema, oid, &sinks));
    if ids.is_empty() {
        raise(CdcError::new(
            ErrorKind::Internal,
            format!("the snapshot request of {table} was not recorded: see the server log"),
        ));
    }
    follow(&schema, &table, &ids);
    SetOfIterator::new(ids)
}

/// Cancels the snapshots of a table under way (pending or running) for the sinks that carry it, or
/// for `sink_name` only, and returns their ids. Each becomes `cancelled` in `cdc_snapshots`, with the
/// rows delivered so far: the chunk in flight (at most `snapshot_chunk_size` rows) is still
/// delivered, and no chunk is read after it, so the table's rows arrive in part only. The table's
/// changes go on as before. A NOTICE says when none was under way. A sink with `snapshot_mode`
/// `initial_only` whose snapshots are all done or cancelled finishes.
///
/// ```sql
/// SELECT cdc_cancel_snapshot('orders');                   -- every sink snapshotting orders
/// SELECT cdc_cancel_snapshot('orders', 'orders_kafka');   -- one sink
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_cancel_snapshot(table_name regclass, sink_name text DEFAULT NULL)
RETURNS SETOF bigint VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_cancel_snapshot(table_name: Option<pg_sys::Oid>, sink_name: Option<&str>) -> SetOfIterator<'static, i64> {
    let (open, cancelled) = (SnapshotState::open_sql(), SnapshotState::Cancelled.sql());
    let oid = required(table_name, "table_name");
    check_prerequisites();
    super::access::require_select(oid, "cancel the snapshots of");
    let _entry = super::access::enter();
    let schema = schema();
    require_snapshots_catalog(&schema);
    if let Some(name) = sink_name {
        require_sink(&schema, name);
    }
    crate::worker::launcher::catalog_changed();
    // The sink rows first, FOR UPDATE: a worker reading a chunk holds its sink's row (FOR KEY
    // SHARE) until the chunk is recorded, so the cancel comes after that chunk or before the next.
    catalog::json_write(
        &format!(
            "SELECT to_jsonb(count(*)) FROM (SELECT 1 FROM {schema}._cdc_sinks k
               WHERE ($1::text IS NULL OR k.sink_name = $1)
                 AND EXISTS (SELECT 1 FROM {schema}._cdc_snapshots s WHERE s.sink_id = k.sink_id
                                AND s.table_oid = $2 AND s.state IN {open})
               FOR UPDATE OF k) x"
        ),
        &[sink_name.into(), oid.into()],
    );
    let ids: Vec<i64> = catalog::json_write(
        &format!(
            "WITH c AS (UPDATE {schema}._cdc_snapshots s SET state = {cancelled}, finished_at = now(),
                                note = 'cancelled by ' || $3
                          FROM {schema}._cdc_sinks k
                         WHERE k.sink_id = s.sink_id AND ($1::text IS NULL OR k.sink_name = $1)
                           AND s.table_oid = $2 AND s.state IN {open}
                        RETURNING s.snapshot_id)
             SELECT coalesce(jsonb_agg(snapshot_id ORDER BY snapshot_id), '[]') FROM c"
        ),
        &[sink_name.into(), oid.into(), super::access::caller_name().into()],
    )
    .and_then(|v| serde_json::from_value(v).ok())
    .unwrap_or_default();
    if ids.is_empty() {
        let table = super::table_display_name(oid);
        pgrx::notice!(
            "no snapshot of table {table} is under way{}",
            sink_name.map(|n| format!(" for sink \"{n}\"")).unwrap_or_default()
        );
    }
    SetOfIterator::new(ids)
}

/// Waiting follows progress that other transactions commit: the call must be its own statement's
/// transaction, READ COMMITTED (each of its reads then sees what committed before it).
fn refuse_waiting_in_a_transaction() {
    // SAFETY: reads the current transaction's state, on the backend's own thread.
    if unsafe { pg_sys::IsTransactionBlock() } {
        raise(
            CdcError::new(
                ErrorKind::ActiveSqlTransaction,
                "cdc_snapshot(..., wait => true) cannot run inside a transaction block",
            )
            .detail("Its request must commit before it can wait for the worker to deliver it.")
            .hint("Run it on its own (autocommit), or call it without wait and follow the view cdc_snapshots."),
        );
    }
    let isolation = catalog::transaction_isolation();
    if isolation != "read committed" {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!("cdc_snapshot(..., wait => true) needs READ COMMITTED, not {isolation}"),
            )
            .detail("It follows the progress the worker commits, which a single snapshot would never see.")
            .hint("SET default_transaction_isolation = 'read committed' for the call."),
        );
    }
}

/// Checks the table and the sink, and returns the table's name and the sinks (id, name) that get
/// a snapshot of it.
fn validate(schema: &str, oid: pg_sys::Oid, sink_name: Option<&str>) -> (String, Vec<(String, String)>) {
    require_snapshots_catalog(schema);
    let active = catalog::select_one::<bool>(
        &format!("SELECT true FROM {schema}._cdc_publications WHERE table_oid = $1 AND status = 'active'"),
        &[oid.into()],
    );
    if active.is_none() {
        not_captured(oid, "Capture it first: SELECT cdc_enable('<table>').");
    }
    let table = captured_table_name(schema, oid);
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
    let sinks = carrying_sinks(schema, oid, sink_name, None);
    if let (Some(name), true) = (sink_name, sinks.is_empty()) {
        let finished = catalog::select_one::<bool>(
            &format!(
                "SELECT true FROM {schema}._cdc_sinks WHERE sink_name = $1 AND state = 'finished'
                    AND (table_oids IS NULL OR $2 = ANY (table_oids))"
            ),
            &[name.into(), oid.into()],
        );
        if finished.is_some() {
            raise(
                CdcError::new(
                    ErrorKind::PrerequisiteState,
                    format!("sink \"{name}\" finished its initial_only snapshot and reads nothing more"),
                )
                .detail("A sink with snapshot_mode initial_only drops its slot once its snapshot is delivered.")
                .hint("Drop it and add it again for a new copy, or add a sink with snapshot_mode initial."),
            );
        }
    }
    if sinks.is_empty() {
        match sink_name {
            Some(name) => {
                require_sink(schema, name);
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
    (table, sinks)
}

/// Refuses (55000) a catalog from before snapshots (0.4.0).
fn require_snapshots_catalog(schema: &str) {
    if !crate::catalog::has_snapshots(schema) {
        raise(
            CdcError::new(ErrorKind::PrerequisiteState, "this catalog predates snapshots")
                .hint("Run ALTER EXTENSION pg_cdc UPDATE."),
        );
    }
}

/// Refuses (42704) a sink name that names no sink.
fn require_sink(schema: &str, name: &str) {
    let exists = catalog::select_one::<bool>(
        &format!("SELECT true FROM {schema}._cdc_sinks WHERE sink_name = $1"),
        &[name.into()],
    );
    if exists.is_none() {
        super::no_such_sink(name);
    }
}

/// The sinks (id, name) that carry a table, all of them or the one named (by name or by id), but
/// not a finished `initial_only` sink (it reads nothing more).
fn carrying_sinks(schema: &str, oid: pg_sys::Oid, name: Option<&str>, id: Option<&str>) -> Vec<(String, String)> {
    catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_array(sink_id::text, sink_name) ORDER BY sink_name), '[]')
               FROM {schema}._cdc_sinks
              WHERE ($1::text IS NULL OR sink_name = $1) AND ($3::text IS NULL OR sink_id = $3::uuid)
                AND (table_oids IS NULL OR $2 = ANY (table_oids)) AND state <> 'finished'"
        ),
        &[name.into(), oid.into(), id.into()],
    )
    .and_then(|v| serde_json::from_value::<Vec<(String, String)>>(v).ok())
    .unwrap_or_default()
}

/// Records a snapshot of the table for each of `sinks` (or finds the one under way) in the current
/// transaction; returns their ids.
fn request(schema: &str, oid: pg_sys::Oid, table: &str, sinks: &[(String, String)]) -> Vec<i64> {
    let open = SnapshotState::open_sql();
    crate::worker::launcher::catalog_changed();
    let mut ids = Vec::with_capacity(sinks.len());
    for (sink_id, name) in sinks {
        // The sink row first, as the worker's chunk reads do: a drop of the sink waits, or wins;
        // and an initial_only sink finishing meanwhile (it locks its row, then looks for open
        // snapshots) either comes after this request and sees it, or before and leaves it out.
        let finished = catalog::select_one_write::<bool>(
            &format!("SELECT state = 'finished' FROM {schema}._cdc_sinks WHERE sink_id = $1::uuid FOR KEY SHARE"),
            &[sink_id.as_str().into()],
        );
        if finished != Some(false) {
            continue;
        }
        // A statement of its own (writing SPI takes a new snapshot): it sees what committed while
        // the lock above waited.
        let running = catalog::select_one_write::<i64>(
            &format!(
                "SELECT snapshot_id FROM {schema}._cdc_snapshots
                  WHERE sink_id = $1::uuid AND table_oid = $2 AND state IN {open}
                  ORDER BY snapshot_id LIMIT 1"
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
    ids
}

/// The background worker that records a waited-for request in its own transaction.
const REQUEST_WORKER: &str = "pg_cdc snapshot request";

/// Has a short-lived background worker record the request (the caller's database OID, the table
/// OID, and the one sink's id or `*`), committed, and waits for it to end.
fn run_request(oid: pg_sys::Oid, sink_id: Option<&str>) {
    // SAFETY: reads the OID of the database this backend is connected to.
    let database = unsafe { pg_sys::MyDatabaseId };
    let extra = format!("{} {} {}", database.to_u32(), oid.to_u32(), sink_id.unwrap_or("*"));
    let started = BackgroundWorkerBuilder::new(REQUEST_WORKER)
        .set_type(REQUEST_WORKER)
        .set_function("pg_cdc_snapshot_request_main")
        .set_library("pg_cdc")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(None)
        // SAFETY: this backend's own pid, so it is told when the worker starts and ends.
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .set_extra(&extra)
        .load_dynamic();
    let worker = started.unwrap_or_else(|_| {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                "no background worker slot is free to record the snapshot request",
            )
            .hint("Raise max_worker_processes, or call cdc_snapshot without wait."),
        )
    });
    if worker.wait_for_shutdown().is_err() {
        raise(CdcError::new(ErrorKind::Internal, "the postmaster died while the snapshot request was recorded"));
    }
}

/// The request worker's entry point: records the snapshots its extra data names.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_cdc_snapshot_request_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(pgrx::bgworkers::SignalWakeFlags::SIGTERM);
    let extra = BackgroundWorker::get_extra().to_string();
    let mut parts = extra.split(' ');
    let mut next_oid = || parts.next().and_then(|o| o.parse::<u32>().ok()).map(pg_sys::Oid::from);
    let (Some(database), Some(oid)) = (next_oid(), next_oid()) else {
        pgrx::warning!("{REQUEST_WORKER}: malformed request \"{extra}\"");
        return;
    };
    let only = parts.next().filter(|s| *s != "*").map(str::to_string);
    // The caller's database (the one its request is about), as the bootstrap superuser: the caller's
    // own rights were checked before the request was handed over.
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(database), None);
    BackgroundWorker::transaction(|| {
        // As the sink workers (see worker::source::set_session_settings): a superuser's process
        // resolves nothing in a schema other roles may create in.
        catalog::run("SELECT set_config('search_path', 'pg_catalog, pg_temp', true)", &[]);
        let Some(schema) = catalog::extension_schema() else { return };
        let table = captured_table_name(&schema, oid);
        let sinks = carrying_sinks(&schema, oid, None, only.as_deref());
        request(&schema, oid, &table, &sinks);
    });
}

/// The snapshots of the table the request worker recorded (or found under way): per sink, the
/// one under way, or one requested since this statement started.
fn requested_ids(schema: &str, oid: pg_sys::Oid, sinks: &[(String, String)]) -> Vec<i64> {
    let open = SnapshotState::open_sql();
    let ids: Vec<String> = sinks.iter().map(|(id, _)| id.clone()).collect();
    catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(i ORDER BY i), '[]') FROM (
                 SELECT max(snapshot_id) AS i FROM {schema}._cdc_snapshots
                  WHERE table_oid = $1 AND sink_id::text = ANY ($2)
                    AND (state IN {open} OR requested_at >= statement_timestamp())
                  GROUP BY sink_id) x"
        ),
        &[oid.into(), ids.into()],
    )
    .and_then(|v| serde_json::from_value(v).ok())
    .unwrap_or_default()
}

#[derive(Deserialize)]
struct Progress {
    snapshot_id: i64,
    sink_name: String,
    sink_state: String,
    last_error: Option<String>,
    #[serde(deserialize_with = "snapshot_state")]
    state: SnapshotState,
    rows_done: i64,
    rows_estimate: Option<i64>,
    percent_done: Option<f64>,
    rows_per_second: Option<f64>,
    eta_seconds: Option<f64>,
}

/// A snapshot's stored state label, read into its enum.
fn snapshot_state<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SnapshotState, D::Error> {
    let label = String::deserialize(d)?;
    SnapshotState::parse(&label).ok_or_else(|| serde::de::Error::custom(format!("unknown snapshot state {label}")))
}

/// How often a waiting call reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Waits until every snapshot of `ids` is done (or skipped, or gone with its sink), with a NOTICE
/// on each one's progress at once and every few seconds; an ERROR when a sink stops with an error (the snapshot
/// goes on once it runs again). Cancellable: the snapshots go on without the caller.
fn follow(schema: &str, table: &str, ids: &[i64]) {
    let mut last_notice: Option<Instant> = None;
    loop {
        let rows: Vec<Progress> = super::fresh(|| {
            catalog::json(
                &format!(
                    "SELECT coalesce(jsonb_agg(jsonb_build_object(
                     'snapshot_id', v.snapshot_id, 'sink_name', v.sink_name, 'sink_state', k.state,
                     'last_error', k.last_error, 'state', v.state, 'rows_done', v.rows_done,
                     'rows_estimate', v.rows_estimate, 'percent_done', v.percent_done,
                     'rows_per_second', v.rows_per_second, 'eta_seconds', extract(epoch FROM v.eta))
                     ORDER BY v.snapshot_id), '[]')
                   FROM {schema}.cdc_snapshots v JOIN {schema}._cdc_sinks k USING (sink_name)
                  WHERE v.snapshot_id = ANY ($1)"
                ),
                &[ids.to_vec().into()],
            )
        })
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
        let open: Vec<&Progress> = rows.iter().filter(|p| p.state.is_open()).collect();
        if open.is_empty() {
            for p in rows.iter().filter(|p| matches!(p.state, SnapshotState::Skipped | SnapshotState::Cancelled)) {
                pgrx::warning!("snapshot {} of {table} for sink \"{}\" was {}", p.snapshot_id, p.sink_name, p.state);
            }
            return;
        }
        if let Some(p) = open.iter().find(|p| p.sink_state == "error") {
            raise(
                CdcError::new(
                    ErrorKind::PrerequisiteState,
                    format!(
                        "sink \"{}\" stopped with an error: {}",
                        p.sink_name,
                        p.last_error.as_deref().unwrap_or("(none recorded)")
                    ),
                )
                .detail(format!("Snapshot {} of {table} goes on once the sink runs again.", p.snapshot_id)),
            );
        }
        if last_notice.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            last_notice = Some(Instant::now());
            for p in &open {
                pgrx::notice!("{}", progress_line(table, p));
            }
        }
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(100));
            pgrx::check_for_interrupts!();
        }
    }
}

/// One snapshot's progress as a NOTICE says it.
fn progress_line(table: &str, p: &Progress) -> String {
    let mut line = format!("snapshot {} of {table} for sink \"{}\": ", p.snapshot_id, p.sink_name);
    if p.state == SnapshotState::Pending {
        line.push_str("waiting for the sink's worker");
        return line;
    }
    line.push_str(&format!("{} rows", p.rows_done));
    if let Some(e) = p.rows_estimate {
        line.push_str(&format!(" of about {e}"));
    }
    if let Some(pct) = p.percent_done {
        line.push_str(&format!(" ({pct:.1} %)"));
    }
    if let Some(r) = p.rows_per_second {
        line.push_str(&format!(", {r:.0} rows/s"));
    }
    if let Some(s) = p.eta_seconds {
        line.push_str(&format!(", about {s:.0} s left"));
    }
    line
}

/// Every sink that carries a table whose capture starts now, and whose `snapshot_mode` is
/// `initial` (or `initial_only`, until it finished), gets a snapshot of it (kind `added`): its
/// rows arrive as READ events as a new sink's would. Nothing on a catalog that predates snapshots.
pub(crate) fn snapshot_added_table(schema: &str, oid: pg_sys::Oid) {
    let open = SnapshotState::open_sql();
    if !crate::catalog::has_snapshots(schema) {
        return;
    }
    // snapshot_mode defaults to initial (cdc_core::config::SnapshotMode).
    catalog::run(
        &format!(
            "INSERT INTO {schema}._cdc_snapshots (sink_id, table_oid, kind)
             SELECT k.sink_id, $1, 'added' FROM {schema}._cdc_sinks k
              WHERE (k.table_oids IS NULL OR $1 = ANY (k.table_oids))
                AND coalesce(k.config ->> 'snapshot_mode', 'initial') IN ('initial', 'initial_only')
                AND k.state <> 'finished'
                AND NOT EXISTS (SELECT 1 FROM {schema}._cdc_snapshots s WHERE s.sink_id = k.sink_id
                                   AND s.table_oid = $1 AND s.state IN {open})
              ORDER BY k.sink_name
                FOR KEY SHARE OF k"
        ),
        &[oid.into()],
    );
}
