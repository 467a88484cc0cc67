//! The initial snapshot of a table without a key (ARCHITECTURE.md, "Keyless tables"): its rows
//! cannot be read in chunks by key, nor told apart from its changes, so they are read whole from
//! one snapshot whose place in the stream is exact: the snapshot of a replication slot's
//! consistent point, which sees exactly the transactions that commit before that point.
//!
//! ```text
//!  plan:   count the rows ─ K watermarks, each with room for a piece ─ an ephemeral slot:
//!          its consistent point P and its snapshot ─ DECLARE ... WITH HOLD over the table ─ drop the slot
//!  pieces: FETCH a piece a pass ─▶ delivered at its own watermark (all of them before P)
//!  stream: the table's changes that commit before P are dropped (the rows hold them)
//! ```
//! Until its plan is made, a keyless table's changes are dropped as they are read: they commit
//! before any point a later plan finds, so its rows hold them. A worker that restarts in the
//! middle reads the table again from the start, with a new plan: the pieces it delivered before
//! arrive again (rows without a key cannot be told apart), which the README says.
use std::ffi::CString;
use std::ptr::null_mut;

use cdc_core::decode::Relation;
use cdc_core::snapshot::{watermark_content, Chunk, Pieces, WATERMARK_PREFIX};
use cdc_core::types::TypeRegistry;
use cdc_core::Lsn;
use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::prelude::*;

use super::run::SinkRun;
use super::run_tx;
use super::snapshot::{describe, relation_of, CHUNK_BYTES};
use crate::catalog;
use crate::lookups::quote_ident;

extern "C-unwind" {
    fn wal_segment_open(state: *mut pg_sys::XLogReaderState, seg: pg_sys::XLogSegNo, tli: *mut pg_sys::TimeLineID);
    fn wal_segment_close(state: *mut pg_sys::XLogReaderState);
    /// PostgreSQL's local WAL page reader, which waits for WAL not flushed yet.
    #[link_name = "read_local_xlog_page"]
    fn waiting_page_read(
        state: *mut pg_sys::XLogReaderState,
        target_page: pg_sys::XLogRecPtr,
        req_len: std::ffi::c_int,
        target_rec: pg_sys::XLogRecPtr,
        buf: *mut std::ffi::c_char,
    ) -> std::ffi::c_int;
    /// replication/snapbuild.h, which pgrx does not bind: the snapshot of a slot just made
    /// consistent (what CREATE_REPLICATION_SLOT ... (SNAPSHOT 'use') installs).
    fn SnapBuildInitialSnapshot(builder: *mut pg_sys::SnapBuild) -> pg_sys::Snapshot;
}

/// A keyless table's snapshot being delivered: its rows wait in a held cursor.
pub struct Plan {
    /// Its `_cdc_snapshots` row.
    pub snapshot_id: i64,
    /// The table.
    pub table_oid: u32,
    /// The cursor its rows are fetched from (WITH HOLD: it outlives the plan's transaction).
    pub cursor: String,
    /// The table as its rows lay it out.
    pub relation: Relation,
    /// The column types (learned before the first piece is delivered).
    pub types: Vec<u32>,
    /// Rows a piece holds at most (the room each watermark has).
    pub piece_rows: u32,
    /// The end of each piece's watermark, piece 1 first.
    pub watermarks: Vec<Lsn>,
    /// The consistent point: the table's changes that commit before it are in the rows.
    pub until: Lsn,
    /// Rows the snapshot holds.
    pub rows: i64,
    /// The last piece that holds rows (0: none).
    pub last: u32,
}

/// What [`plan`] made.
pub enum Planned {
    /// The rows wait in the cursor.
    Ready(Plan),
    /// The snapshot held more rows than the watermarks had room for (rows were inserted between
    /// the count and the snapshot): plan again.
    Again,
}

/// Plans a keyless table's snapshot: counts its rows, writes the watermarks of its pieces
/// (named `<base>/<i>`), then takes the snapshot of an ephemeral slot's consistent point and
/// opens a held cursor over the table with it. Runs its own transactions; the caller's process
/// must hold no replication slot.
pub fn plan(schema: &str, snapshot_id: i64, table_oid: u32, chunk_size: u32, base: &str) -> Result<Planned, String> {
    let (table, qualified, count, bytes) = super::run_tx(|| -> Result<_, String> {
        let table = describe(table_oid)?;
        let qualified = format!("{}.{}", quote_ident(&table.namespace), quote_ident(&table.name));
        let v = catalog::json(
            &format!(
                "SELECT jsonb_build_array(count(*), coalesce(sum(octet_length(t::text)), 0)) FROM ONLY {qualified} t"
            ),
            &[],
        )
        .ok_or("cannot count the table's rows")?;
        let (count, bytes): (i64, i64) = serde_json::from_value(v).map_err(|e| e.to_string())?;
        Ok((table, qualified, count, bytes))
    })??;
    // A piece's rows are about CHUNK_BYTES of text at most, as a keyed chunk's.
    let mean = (bytes / count.max(1)).max(1) as usize;
    let piece_rows = (CHUNK_BYTES / mean).clamp(1, chunk_size.max(1) as usize) as i64;
    // Room for a quarter more rows than counted, and a piece more: rows inserted meanwhile.
    let pieces = (count + count / 4 + piece_rows) / piece_rows + 1;
    let watermarks = super::run_tx(|| write_watermarks(base, pieces, piece_rows as usize))??;
    let cols: Vec<String> = table.columns.iter().map(|c| quote_ident(&c.name)).collect();
    let cursor = format!("pg_cdc_keyless_{snapshot_id}");
    let select = format!("SELECT {} FROM ONLY {qualified}", cols.join(", "));
    let room = pieces * piece_rows;
    // One left by a plan that failed after it was declared.
    close(&cursor);
    let (until, rows) = with_slot_snapshot(&format!("pg_cdc_keyless_{}", std::process::id()), || {
        let rows = catalog::select_one::<i64>(&format!("SELECT count(*) FROM ONLY {qualified}"), &[]).unwrap_or(0);
        if rows <= room {
            catalog::run(&format!("DECLARE {cursor} NO SCROLL CURSOR WITH HOLD FOR {select}"), &[]);
        }
        rows
    })?;
    if rows > room {
        return Ok(Planned::Again);
    }
    let last_watermark = watermarks.last().copied().unwrap_or_default();
    if last_watermark >= until {
        close(&cursor);
        return Err(format!("the watermarks ({last_watermark}) are not before the snapshot's point ({until})"));
    }
    let last = ((rows + piece_rows - 1) / piece_rows) as u32;
    super::run_tx(|| {
        catalog::run(
            &format!(
                "UPDATE {schema}._cdc_snapshots SET state = CASE WHEN $3 = 0 THEN 'done' ELSE 'running' END,
                        keyless_until = $2::text::pg_lsn, rows_estimate = $3, rows_done = 0,
                        started_at = coalesce(started_at, now()),
                        finished_at = CASE WHEN $3 = 0 THEN now() END,
                        note = CASE WHEN state = 'running' AND keyless_until IS NOT NULL
                                    THEN 'read again from the start after the worker restarted: rows delivered before arrive again'
                                    ELSE note END
                  WHERE snapshot_id = $1"
            ),
            &[snapshot_id.into(), until.to_string().as_str().into(), rows.into()],
        );
        if last == 0 {
            catalog::run(&format!("CLOSE {cursor}"), &[]);
        }
    })?;
    Ok(Planned::Ready(Plan {
        snapshot_id,
        table_oid,
        cursor,
        relation: relation_of(table_oid, &table),
        types: table.columns.iter().map(|c| c.type_oid).collect(),
        piece_rows: piece_rows as u32,
        watermarks,
        until,
        rows,
        last,
    }))
}

/// Writes `pieces` watermarks, each with room for `rows` rows, and flushes them; returns their ends.
fn write_watermarks(base: &str, pieces: i64, rows: usize) -> Result<Vec<Lsn>, String> {
    let padding = watermark_content("", rows);
    let ends = catalog::json(
        "SELECT jsonb_agg(pg_logical_emit_message(false, $1, $2 || '/' || i || $3)::text ORDER BY i)
           FROM generate_series(1, $4::int8) i",
        &[WATERMARK_PREFIX.into(), base.into(), padding.as_str().into(), pieces.into()],
    )
    .ok_or("cannot write the watermarks of a keyless table's pieces")?;
    let ends: Vec<String> = serde_json::from_value(ends).map_err(|e| e.to_string())?;
    let ends = ends.iter().map(|e| e.parse::<Lsn>()).collect::<Result<Vec<_>, _>>()?;
    if let Some(last) = ends.last() {
        // SAFETY: flushes WAL up to a position already inserted; callable in any backend.
        unsafe { pg_sys::XLogFlush(last.0) };
    }
    Ok(ends)
}

/// Runs `f` in a REPEATABLE READ transaction whose snapshot is that of a new ephemeral slot's
/// consistent point (made and dropped here; it waits, as any slot creation does, for the
/// transactions running when it starts); returns that point and what `f` returned. What `f`
/// leaves (a held cursor) outlives the transaction.
fn with_slot_snapshot<R>(slot: &str, f: impl FnOnce() -> R) -> Result<(Lsn, R), String> {
    let name = CString::new(slot).map_err(|e| e.to_string())?;
    // SAFETY: a background worker's transaction bracket, as run_tx; before any snapshot is taken
    // in it, the isolation level is set (what SET TRANSACTION does at that point).
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::XactIsoLevel = pg_sys::XACT_REPEATABLE_READ as i32;
    }
    crate::catalog::present_catalog();
    let result = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| -> Result<(Lsn, R), String> {
        // SAFETY: what the walsender does for CREATE_REPLICATION_SLOT ... LOGICAL pgoutput
        // (SNAPSHOT 'use') (walsender.c), in a transaction that has taken no snapshot: an ephemeral
        // slot (dropped when released), a decoding context that needs the full snapshot, decoded
        // up to its consistent point with PostgreSQL's waiting WAL reader, the slot's snapshot
        // installed as the transaction's; then the context freed and the slot released (dropped).
        let until = unsafe {
            pg_sys::CheckLogicalDecodingRequirements();
            crate::pg_compat::create_ephemeral_slot(&name);
            let mut routine = pg_sys::XLogReaderRoutine {
                page_read: Some(waiting_page_read),
                segment_open: Some(wal_segment_open),
                segment_close: Some(wal_segment_close),
            };
            let ctx = pg_sys::CreateInitDecodingContext(
                c"pgoutput".as_ptr(),
                null_mut(),
                true,
                0,
                &mut routine,
                Some(no_prepare_write),
                Some(no_write),
                None,
            );
            pg_sys::DecodingContextFindStartpoint(ctx);
            let snap = pg_guard_ffi_boundary(|| SnapBuildInitialSnapshot((*ctx).snapshot_builder));
            pg_sys::RestoreTransactionSnapshot(snap, pg_sys::MyProc as *mut std::ffi::c_void);
            let until = Lsn((*pg_sys::MyReplicationSlot).data.confirmed_flush);
            pg_sys::FreeDecodingContext(ctx);
            pg_sys::ReplicationSlotRelease();
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
            until
        };
        Ok((until, f()))
    }))
    .catch_others(|e| Err(super::caught_message(e)))
    .execute();
    // Committing keeps a held cursor's rows; after an error, a slot still held is released (so
    // dropped: it is ephemeral).
    super::end_tx(result.is_ok());
    if result.is_err() {
        super::decoding::release_slot();
    }
    result
}

/// The output callbacks of the plan's decoding context, which never writes (it only finds its
/// consistent point).
#[pg_guard]
extern "C-unwind" fn no_prepare_write(
    _ctx: *mut pg_sys::LogicalDecodingContext,
    _lsn: pg_sys::XLogRecPtr,
    _xid: pg_sys::TransactionId,
    _last_write: bool,
) {
}

#[pg_guard]
extern "C-unwind" fn no_write(
    _ctx: *mut pg_sys::LogicalDecodingContext,
    _lsn: pg_sys::XLogRecPtr,
    _xid: pg_sys::TransactionId,
    _last_write: bool,
) {
}

/// Fetches piece `i` into `chunk` (in the caller's transaction) and records it in flight at its
/// watermark; the cursor is closed after the last piece.
pub fn take_piece(schema: &str, plan: &Plan, i: u32, chunk: &mut Chunk) -> Result<(), String> {
    let width = plan.relation.columns.len();
    crate::catalog::present_catalog();
    Spi::connect(|client| -> Result<Result<(), String>, pgrx::spi::Error> {
        let mut cursor = client.find_cursor(&plan.cursor)?;
        let n = cursor.fetch(i64::from(plan.piece_rows) as libc::c_long)?.len();
        // Not closed here: a later piece fetches from it again.
        let _ = cursor.detach_into_name();
        // SAFETY: SPI_tuptable is the result of the fetch just run, `n` rows of `width` columns.
        Ok(unsafe { super::snapshot::push_fetched(n, 1, width, &[], chunk) }.map(|_| ()))
    })
    .map_err(|e| format!("cannot read the next piece of a keyless table's snapshot: {e}"))??;
    let last = i >= plan.last;
    if last {
        catalog::run(&format!("CLOSE {}", plan.cursor), &[]);
    }
    let watermark = plan.watermarks.get(i as usize - 1).copied().ok_or("a piece past the last watermark")?;
    catalog::run(
        &format!(
            "UPDATE {schema}._cdc_snapshots SET chunk_watermark = $2::text::pg_lsn, chunk_last_key = NULL,
                    chunk_rows = $3, chunk_last = $4
              WHERE snapshot_id = $1"
        ),
        &[plan.snapshot_id.into(), watermark.to_string().as_str().into(), (chunk.len() as i64).into(), last.into()],
    );
    Ok(())
}

/// Closes a plan's cursor if it is still open (a cancelled snapshot).
pub fn close(cursor: &str) {
    let _ = super::run_tx(|| {
        let open = catalog::select_one::<bool>("SELECT true FROM pg_cursors WHERE name = $1", &[cursor.into()]);
        if open.is_some() {
            catalog::run(&format!("CLOSE {cursor}"), &[]);
        }
    });
}

/// A sink's next snapshot is keyless table `table_oid`'s (`snapshot_id`): plans it, its first time
/// in this run (the sink's slot is given back meanwhile: an ephemeral one finds the snapshot, and
/// a process holds one slot), else fetches its next piece into the sink's snapshot reader. Returns
/// what went wrong; the sink is then retried.
pub fn step(
    schema: &str,
    run: &mut SinkRun,
    types: &mut TypeRegistry,
    snapshot_id: i64,
    table_oid: u32,
    chunk_size: u32,
) -> Result<(), String> {
    if let Some(plan) = run.keyless.as_ref().filter(|k| k.snapshot_id == snapshot_id) {
        let Some(pieces) = run.driver.snap.pieces.as_mut() else { return Ok(()) };
        let i = pieces.next;
        let read_at = cdc_core::deliver::read::unix_micros_now() - cdc_core::time::PG_EPOCH_OFFSET_MICROS;
        let mut chunk = Chunk::keyless(pieces.id(i), plan.relation.clone(), read_at);
        match run_tx(|| take_piece(schema, plan, i, &mut chunk)) {
            Ok(Ok(())) => {
                pieces.next += 1;
                if i >= plan.last {
                    run.keyless = None;
                }
                run.driver.snap.chunk = Some(chunk);
                Ok(())
            }
            Ok(Err(e)) | Err(e) => Err(format!("cannot read the next piece of a keyless table: {e}")),
        }
    } else {
        // Its slot is given back while an ephemeral one finds the snapshot (a process holds
        // one slot); the next read opens a new session.
        run.session = None;
        run.driver.chunks += 1;
        let base = format!("{} {} k{}", run.row.id, std::process::id(), run.driver.chunks);
        match plan(schema, snapshot_id, table_oid, chunk_size, &base) {
            Ok(Planned::Ready(plan)) => {
                // Its column types, for a table none of whose changes was streamed yet.
                if let Err(e) = run_tx(|| super::source::learn_type_oids(&plan.types, types)) {
                    close(&plan.cursor);
                    return Err(format!("cannot look up a keyless table's types: {e}"));
                }
                run.driver.snap.drop_changes_before(table_oid, plan.until);
                run.driver.snap.pieces = Some(Pieces { base, next: 1, last: plan.last });
                pgrx::log!(
                    "pg_cdc sink \"{}\": table {} has no key: its {} rows are read from the snapshot of {} \
                     in {} pieces",
                    run.row.name,
                    plan.relation.name,
                    plan.rows,
                    plan.until,
                    plan.last
                );
                if plan.last > 0 {
                    run.keyless = Some(plan);
                }
                Ok(())
            }
            Ok(Planned::Again) => Ok(()),
            Err(e) => Err(format!("cannot plan the snapshot of a keyless table: {e}")),
        }
    }
}
