//! The worker's side of snapshots: reads a sink's next chunk, writes its watermark, and keeps
//! `_cdc_snapshots` current (the rules are in [`cdc_core::snapshot`]; ARCHITECTURE.md,
//! "Snapshots").
//!
//! ```text
//!  take_chunk (one transaction):
//!    the chunk before it delivered? ─▶ last_key moves on (or the table is done)
//!    SELECT next rows by key, pg_current_snapshot() ─▶ a transaction read lately in progress? read later
//!    pg_logical_emit_message(false, 'pg_cdc_snapshot', '<sink> <pid> <n>\n' + a byte per row) ─▶ flushed
//!    _cdc_snapshots: the chunk in flight (watermark, last key, rows)
//! ```
//! The catalog row says which rows were delivered. A chunk in flight is known delivered once
//! the sink's delivered position passes its watermark: the worker knows it for the chunk it
//! holds; after a restart it compares the watermark with where the sink stood when it was opened
//! again (its checkpoint, or the slot's confirmed position), before anything new is delivered.
use std::ffi::CStr;

use cdc_core::decode::{Relation, RelationColumn};
use cdc_core::deliver::read::unix_micros_now;
use cdc_core::driver::snapshot::{Next, OpenSnapshots, Previous};
use cdc_core::snapshot::{watermark_content, Chunk, MvccSnapshot, SnapshotReader, WATERMARK_PREFIX};
use cdc_core::state::SnapshotState;
use cdc_core::time::PG_EPOCH_OFFSET_MICROS;
use cdc_core::types::TypeRegistry;
use cdc_core::Lsn;
use pgrx::prelude::*;
use serde::Deserialize;

use crate::catalog;
use crate::lookups::quote_ident;

/// The open snapshot a chunk is read for.
#[derive(Deserialize)]
struct Open {
    snapshot_id: i64,
    table_oid: u32,
    last_key: Option<Vec<Option<String>>>,
    rows_estimate: Option<i64>,
    kind: String,
}

/// A table as pgoutput describes it, and the key chunks are read by.
#[derive(Deserialize)]
pub(super) struct Described {
    pub(super) namespace: String,
    pub(super) name: String,
    replident: String,
    pub(super) columns: Vec<Column>,
    pk: Option<Vec<String>>,
    ri: Option<Vec<String>>,
}

#[derive(Deserialize)]
pub(super) struct Column {
    pub(super) name: String,
    #[serde(rename = "type")]
    pub(super) type_oid: u32,
    typmod: i32,
    type_sql: String,
    ident: bool,
}

/// Reads the next chunk of a sink's snapshots (in the caller's transaction), after settling the
/// one read before; `nonce` names the chunk's watermark (unique in this worker's life). Returns
/// it with the tables whose snapshots still have rows left. The chunk's column types are learned
/// into `types` (a table snapshotted before any of its changes was streamed has no relation
/// message yet to learn them from).
pub fn take_chunk(
    schema: &str,
    sink_id: &str,
    previous: Previous,
    chunk_size: u32,
    reader: &SnapshotReader,
    nonce: &str,
    types: &mut TypeRegistry,
) -> Result<(Next, Vec<u32>), String> {
    let next = next_chunk(schema, sink_id, previous, chunk_size, reader, nonce, types)?;
    Ok((next, open_oids(schema, sink_id)?))
}

fn next_chunk(
    schema: &str,
    sink_id: &str,
    previous: Previous,
    chunk_size: u32,
    reader: &SnapshotReader,
    nonce: &str,
    types: &mut TypeRegistry,
) -> Result<Next, String> {
    let (open, running, done, skipped) = (
        SnapshotState::open_sql(),
        SnapshotState::Running.sql(),
        SnapshotState::Done.sql(),
        SnapshotState::Skipped.sql(),
    );
    // The sink's row first, as cdc_drop_sink does (its DELETE cascades here): a drop waits for
    // this transaction, or this one sees the sink gone; never both waiting for each other.
    let alive = catalog::select_one_write::<bool>(
        &format!("SELECT true FROM {schema}._cdc_sinks WHERE sink_id = $1::uuid FOR KEY SHARE"),
        &[sink_id.into()],
    );
    if alive.is_none() {
        return Ok(Next::Done);
    }
    let (delivered, at) = match previous {
        Previous::Delivered => (true, Lsn(0)),
        Previous::OpenedAt(l) => (false, l),
    };
    catalog::run(
        &format!(
            "WITH s AS (SELECT snapshot_id, ($2 OR chunk_watermark <= $3::text::pg_lsn) AS delivered
                          FROM {schema}._cdc_snapshots WHERE sink_id = $1::uuid AND chunk_watermark IS NOT NULL)
             UPDATE {schema}._cdc_snapshots t SET
                    last_key = CASE WHEN s.delivered THEN t.chunk_last_key ELSE t.last_key END,
                    rows_done = t.rows_done + CASE WHEN s.delivered THEN t.chunk_rows ELSE 0 END,
                    state = CASE WHEN s.delivered AND t.chunk_last AND t.state = {running} THEN {done} ELSE t.state END,
                    finished_at = CASE WHEN s.delivered AND t.chunk_last AND t.state = {running} THEN now()
                                       ELSE t.finished_at END,
                    chunk_watermark = NULL, chunk_last_key = NULL, chunk_rows = NULL, chunk_last = NULL
               FROM s WHERE t.snapshot_id = s.snapshot_id"
        ),
        &[sink_id.into(), delivered.into(), at.to_string().as_str().into()],
    );
    // A table no longer captured has nothing to snapshot.
    catalog::run(
        &format!(
            "UPDATE {schema}._cdc_snapshots s SET state = {skipped}, finished_at = now(),
                    note = 'the table is no longer captured'
              WHERE s.sink_id = $1::uuid AND s.state IN {open}
                AND NOT EXISTS (SELECT 1 FROM {schema}._cdc_publications p
                                 WHERE p.table_oid = s.table_oid AND p.status = 'active')"
        ),
        &[sink_id.into()],
    );
    loop {
        let open = catalog::json(
            &format!(
                "SELECT to_jsonb(x) FROM (SELECT snapshot_id, table_oid::bigint AS table_oid, last_key, rows_estimate, kind
                   FROM {schema}._cdc_snapshots WHERE sink_id = $1::uuid AND state IN {open}
                  ORDER BY snapshot_id LIMIT 1) x"
            ),
            &[sink_id.into()],
        );
        let Some(open) = open.filter(|v| !v.is_null()) else {
            return Ok(Next::Done);
        };
        let open: Open = serde_json::from_value(open).map_err(|e| format!("unexpected snapshot row: {e}"))?;
        let table = describe(open.table_oid)?;
        let key = chunk_key(&table);
        if key.is_none() && open.kind == "initial" {
            // Read whole from the snapshot of a slot's consistent point (see super::keyless).
            return Ok(Next::Keyless { snapshot_id: open.snapshot_id, table_oid: open.table_oid });
        }
        let Some(key) = key else {
            pgrx::warning!(
                "pg_cdc: table {}.{} has no primary key or replica identity index: its {} snapshot is skipped \
                 (chunks are read by key; only an initial snapshot reads a keyless table)",
                table.namespace,
                table.name,
                open.kind
            );
            catalog::run(
                &format!(
                    "UPDATE {schema}._cdc_snapshots SET state = {skipped}, finished_at = now(),
                            note = 'no primary key or replica identity index: chunks are read by key'
                      WHERE snapshot_id = $1"
                ),
                &[open.snapshot_id.into()],
            );
            continue;
        };
        // A chunk read with no window open would keep rows changed while it is in flight.
        if !reader.tracks(open.table_oid) {
            return Ok(Next::Untracked);
        }
        let relation = relation_of(open.table_oid, &table);
        let read_at = unix_micros_now() - PG_EPOCH_OFFSET_MICROS;
        let id = format!("{sink_id} {nonce}");
        let mut chunk = Chunk::new(id.clone(), relation, &key, read_at).map_err(|e| e.message)?;
        let read = read_rows(&table, &key, open.last_key.as_deref(), chunk_size, CHUNK_BYTES, &mut chunk)?;
        if chunk.is_empty() {
            catalog::run(
                &format!(
                    "UPDATE {schema}._cdc_snapshots SET state = {done}, chunk_key = $2,
                            started_at = coalesce(started_at, now()), finished_at = now()
                      WHERE snapshot_id = $1"
                ),
                &[open.snapshot_id.into(), key.clone().into()],
            );
            continue;
        }
        let snapshot = MvccSnapshot::parse(&read.snapshot).map_err(|e| e.message)?;
        if reader.recent.any_in_progress(&snapshot) {
            return Ok(Next::Later);
        }
        let types_of: Vec<u32> = table.columns.iter().map(|c| c.type_oid).collect();
        super::source::learn_type_oids(&types_of, types);
        let (rows, end, last) = (chunk.len(), read.end, read.last_key);
        let estimate = open.rows_estimate.or_else(|| estimate_rows(open.table_oid, &table));
        let watermark = write_watermark(&watermark_content(&id, rows))?;
        catalog::run(
            &format!(
                "UPDATE {schema}._cdc_snapshots SET state = {running}, chunk_key = $2,
                        started_at = coalesce(started_at, now()), rows_estimate = $3,
                        chunk_watermark = $4::text::pg_lsn, chunk_last_key = $5, chunk_rows = $6, chunk_last = $7
                  WHERE snapshot_id = $1"
            ),
            &[
                open.snapshot_id.into(),
                key.into(),
                estimate.into(),
                watermark.to_string().as_str().into(),
                last.into(),
                (rows as i64).into(),
                end.into(),
            ],
        );
        return Ok(Next::Chunk(Box::new(chunk)));
    }
}

/// A table as pgoutput's Relation message describes it.
pub(super) fn relation_of(oid: u32, table: &Described) -> Relation {
    Relation {
        oid,
        namespace: table.namespace.clone(),
        name: table.name.clone(),
        replica_identity: table.replident.as_bytes().first().copied().unwrap_or(b'd'),
        columns: table
            .columns
            .iter()
            .map(|c| RelationColumn { is_key: c.ident, name: c.name.clone(), type_oid: c.type_oid, type_mod: c.typmod })
            .collect(),
    }
}

/// The columns a table's chunks are read by, and its changes matched by: those of the replica
/// identity index when the table has one (a DELETE's old key carries only them), else the primary
/// key; `None` for a table with neither.
fn chunk_key(table: &Described) -> Option<Vec<String>> {
    match table.replident.as_str() {
        "i" => table.ri.clone(),
        _ => table.pk.clone(),
    }
}

/// The columns a table's chunks are read by (see [`chunk_key`]); `None` for a table with neither
/// a primary key nor a replica identity index.
pub fn table_chunk_key(oid: u32) -> Result<Option<Vec<String>>, String> {
    Ok(chunk_key(&describe(oid)?))
}

/// How many rows the table holds, for the progress figures (read once per snapshot): the
/// planner's estimate once the table has statistics (scaled to its current size); before any
/// ANALYZE, the exact count of a small table, or a count of a sample of about 1,000 of its pages.
fn estimate_rows(oid: u32, table: &Described) -> Option<i64> {
    let qualified = format!("{}.{}", quote_ident(&table.namespace), quote_ident(&table.name));
    let (analyzed, pages) = catalog::json(
        "SELECT jsonb_build_array(reltuples >= 0, pg_relation_size(oid) / current_setting('block_size')::int8)
           FROM pg_class WHERE oid = $1::bigint::oid",
        &[i64::from(oid).into()],
    )
    .and_then(|v| serde_json::from_value::<(bool, i64)>(v).ok())?;
    const SAMPLED_PAGES: i64 = 1024;
    let sql = if analyzed {
        format!("EXPLAIN (FORMAT JSON) SELECT 1 FROM ONLY {qualified}")
    } else if pages <= SAMPLED_PAGES {
        return catalog::select_one::<i64>(&format!("SELECT count(*) FROM ONLY {qualified}"), &[]);
    } else {
        let percent = 100.0 * SAMPLED_PAGES as f64 / pages as f64;
        return catalog::select_one::<f64>(
            &format!(
                "SELECT count(*) * 100.0 / {percent}::float8 FROM ONLY {qualified} TABLESAMPLE SYSTEM ({percent})"
            ),
            &[],
        )
        .map(|n| n as i64);
    };
    crate::catalog::present_catalog();
    let plan = Spi::connect(|c| c.select(&sql, Some(1), &[])?.first().get_one::<pgrx::Json>()).ok().flatten()?;
    plan.0[0]["Plan"]["Plan Rows"].as_f64().map(|r| r.max(0.0) as i64)
}

/// What the reader of a sink needs to know of its snapshots before its first read ([`OpenSnapshots`]).
pub fn open_tables(schema: &str, sink_id: &str) -> Result<OpenSnapshots, String> {
    let open = SnapshotState::open_sql();
    let oids = open_oids(schema, sink_id)?;
    let mut keyed = Vec::new();
    for &oid in &oids {
        let Ok(table) = describe(oid) else { continue };
        if let Some(key) = chunk_key(&table) {
            keyed.push((oid, key, table.columns.into_iter().map(|c| c.name).collect()));
        }
    }
    let mut keyless = Vec::new();
    if crate::catalog::has_snapshots(schema) {
        let rows = catalog::json(
            &format!(
                "SELECT coalesce(jsonb_agg(jsonb_build_array(table_oid::bigint,
                        CASE WHEN state IN {open} THEN NULL ELSE keyless_until::text END)), '[]')
                   FROM {schema}._cdc_snapshots
                  WHERE sink_id = $1::uuid AND kind = 'initial'
                    AND (keyless_until IS NOT NULL OR state IN {open})"
            ),
            &[sink_id.into()],
        )
        .unwrap_or_default();
        let rows: Vec<(u32, Option<String>)> =
            serde_json::from_value(rows).map_err(|e| format!("unexpected snapshot rows: {e}"))?;
        for (oid, until) in rows {
            match until {
                Some(u) => keyless.push((oid, Some(u.parse::<Lsn>()?))),
                None if !keyed.iter().any(|k| k.0 == oid) && describe(oid).is_ok() => keyless.push((oid, None)),
                None => {}
            }
        }
    }
    Ok(OpenSnapshots { any: !oids.is_empty(), keyed, keyless })
}

/// The tables of a sink's snapshots with rows left.
fn open_oids(schema: &str, sink_id: &str) -> Result<Vec<u32>, String> {
    let open = SnapshotState::open_sql();
    if !crate::catalog::has_snapshots(schema) {
        return Ok(Vec::new());
    }
    let oids = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(DISTINCT table_oid::bigint), '[]') FROM {schema}._cdc_snapshots
              WHERE sink_id = $1::uuid AND state IN {open}"
        ),
        &[sink_id.into()],
    )
    .unwrap_or_default();
    serde_json::from_value(oids).map_err(|e| format!("unexpected snapshot tables: {e}"))
}

/// A table's columns as pgoutput describes them (attribute order, no dropped or generated
/// columns, the replica identity's columns flagged), its primary key and replica identity index.
pub(super) fn describe(oid: u32) -> Result<Described, String> {
    let v = catalog::json(
        "SELECT jsonb_build_object(
            'namespace', n.nspname, 'name', c.relname, 'replident', c.relreplident::text,
            'columns', (SELECT jsonb_agg(jsonb_build_object(
                            'name', a.attname, 'type', a.atttypid::bigint, 'typmod', a.atttypmod,
                            'type_sql', format_type(a.atttypid, a.atttypmod),
                            'ident', c.relreplident = 'f' OR a.attnum = ANY (
                                SELECT unnest(i.indkey::int2[]) FROM pg_index i
                                 WHERE i.indrelid = c.oid
                                   AND CASE c.relreplident WHEN 'd' THEN i.indisprimary
                                                           WHEN 'i' THEN i.indisreplident ELSE false END))
                          ORDER BY a.attnum)
                          FROM pg_attribute a
                         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
            'pk', (SELECT jsonb_agg(a.attname ORDER BY k.ord) FROM pg_index i
                     CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                    WHERE i.indrelid = c.oid AND i.indisprimary),
            'ri', (SELECT jsonb_agg(a.attname ORDER BY k.ord) FROM pg_index i
                     CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                    WHERE i.indrelid = c.oid AND i.indisreplident))
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::bigint::oid",
        &[i64::from(oid).into()],
    )
    .ok_or_else(|| format!("table with OID {oid} does not exist"))?;
    serde_json::from_value::<Described>(v).map_err(|e| format!("cannot describe table with OID {oid}: {e}"))
}

/// The most row text one chunk holds (at least one row): with wide rows a chunk ends here, before
/// `snapshot_chunk_size` rows, so the worker's memory stays bounded whatever the rows' width (a
/// chunk is held as pgoutput tuples, then as events, until it is delivered).
pub const CHUNK_BYTES: usize = 8 << 20;

/// Rows fetched at most at once while a chunk is read.
const FETCH_ROWS: usize = 1024;

/// What [`read_rows`] read besides the rows.
struct Read {
    /// The snapshot the query read them with (`pg_current_snapshot()`).
    snapshot: String,
    /// Whether they are the table's last.
    end: bool,
    /// The key of the last row (text of each key column; `None`: NULL).
    last_key: Vec<Option<String>>,
}

/// Reads the next rows after `after` by `key` into `chunk`, at most `limit` of them and about
/// `budget` bytes of text (the row that crosses it is the last), each column as its type's output
/// function writes it (what pgoutput sends). Each value goes from PostgreSQL's text straight into
/// the chunk's tuple, with no copy of its own.
fn read_rows(
    table: &Described,
    key: &[String],
    after: Option<&[Option<String>]>,
    limit: u32,
    budget: usize,
    chunk: &mut Chunk,
) -> Result<Read, String> {
    let qualified = format!("{}.{}", quote_ident(&table.namespace), quote_ident(&table.name));
    let cols: Vec<String> = table.columns.iter().map(|c| quote_ident(&c.name)).collect();
    let keys: Vec<String> = key.iter().map(|k| quote_ident(k)).collect();
    let key_type = |k: &String| table.columns.iter().find(|c| &c.name == k).map_or("text", |c| c.type_sql.as_str());
    let key_positions: Vec<usize> =
        key.iter().filter_map(|k| table.columns.iter().position(|c| &c.name == k)).collect();
    let filter = match after {
        Some(_) => format!(
            "WHERE ({}) > ({})",
            keys.join(", "),
            key.iter()
                .enumerate()
                .map(|(i, k)| format!("($1::text[])[{}]::{}", i + 1, key_type(k)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => String::new(),
    };
    // One statement (one cursor), so pg_current_snapshot() is the snapshot the rows were read with.
    let sql = format!(
        "SELECT pg_current_snapshot()::text, {} FROM ONLY {qualified} {filter} ORDER BY {} LIMIT {limit}",
        cols.join(", "),
        keys.join(", ")
    );
    let arg: Vec<Option<String>> = after.map(<[_]>::to_vec).unwrap_or_default();
    let width = cols.len();
    let limit = limit.max(1) as usize;
    crate::catalog::present_catalog();
    Spi::connect(|client| -> Result<Result<Read, String>, pgrx::spi::Error> {
        let args = if after.is_some() { vec![arg.clone().into()] } else { vec![] };
        let mut cursor = client.try_open_cursor(sql.as_str(), &args)?;
        let mut read = Read { snapshot: String::new(), end: false, last_key: Vec::new() };
        let mut bytes = 0usize;
        // The first fetch takes one row, each later one about the rows the budget has room for
        // at the mean width so far: a chunk of wide rows stops near its budget, not a fetch past it.
        let mut want = 1usize;
        while chunk.len() < limit && bytes < budget {
            let asked = want.min(limit - chunk.len());
            let n = cursor.fetch(asked as libc::c_long)?.len();
            // SAFETY: SPI_tuptable is the result of the fetch just run, with `n` rows of `width + 1`
            // columns (the snapshot, then the table's).
            unsafe {
                let tt = pg_sys::SPI_tuptable;
                if read.snapshot.is_empty() && n > 0 {
                    let p = pg_sys::SPI_getvalue(*(*tt).vals, (*tt).tupdesc, 1);
                    if !p.is_null() {
                        read.snapshot = CStr::from_ptr(p).to_string_lossy().into_owned();
                        pg_sys::pfree(p.cast());
                    }
                }
                match push_fetched(n, 2, width, &key_positions, chunk) {
                    Ok((b, key)) => {
                        bytes += b;
                        if n > 0 {
                            read.last_key = key;
                        }
                    }
                    Err(e) => return Ok(Err(e)),
                }
            }
            if n < asked {
                read.end = true;
                break;
            }
            let mean = (bytes / chunk.len().max(1)).max(1);
            want = (budget.saturating_sub(bytes) / mean).clamp(1, FETCH_ROWS);
        }
        Ok(Ok(read))
    })
    .map_err(|e| format!("cannot read the next snapshot chunk of {qualified}: {e}"))?
}

/// Copies the `n` rows of the last fetch into `chunk` (columns `first..first + width` of each,
/// 1-based), each value from PostgreSQL's text of it straight into the chunk's tuple, and frees
/// them; returns their text's bytes and, of the last row, the values of columns `keep` (0-based
/// among the `width`).
///
/// # Safety
/// `SPI_tuptable` is the result of the fetch just run, with `n` rows of at least
/// `first + width - 1` columns; SPI_getvalue returns a palloc'd C string (or NULL), read in place
/// and freed before the next row; the tuple table is freed once its rows are copied (pgrx does not
/// use it again: its next fetch replaces SPI_tuptable).
pub(super) unsafe fn push_fetched(
    n: usize,
    first: i32,
    width: usize,
    keep: &[usize],
    chunk: &mut Chunk,
) -> Result<(usize, Vec<Option<String>>), String> {
    let tt = pg_sys::SPI_tuptable;
    let mut bytes = 0usize;
    let mut kept = Vec::new();
    let mut values: Vec<Option<&[u8]>> = Vec::with_capacity(width);
    let mut texts: Vec<*mut libc::c_char> = Vec::with_capacity(width);
    for i in 0..n {
        let tuple = *(*tt).vals.add(i);
        texts.clear();
        texts.extend((0..width).map(|c| pg_sys::SPI_getvalue(tuple, (*tt).tupdesc, c as i32 + first)));
        values.clear();
        values.extend(texts.iter().map(|&p| (!p.is_null()).then(|| CStr::from_ptr(p).to_bytes())));
        bytes += values.iter().map(|v| v.map_or(1, <[u8]>::len)).sum::<usize>();
        let pushed = chunk.push_row(&values).map_err(|e| e.message);
        if i + 1 == n {
            kept = keep.iter().map(|&k| values[k].map(|v| String::from_utf8_lossy(v).into_owned())).collect();
        }
        values.clear();
        for &p in &texts {
            if !p.is_null() {
                pg_sys::pfree(p.cast());
            }
        }
        pushed?;
    }
    if !tt.is_null() {
        pg_sys::SPI_freetuptable(tt);
        pg_sys::SPI_tuptable = std::ptr::null_mut();
    }
    Ok((bytes, kept))
}

/// Writes a chunk's watermark (a non-transactional logical message, decoded at its place in the
/// WAL by every slot) and flushes it, so the sink's reader meets it without waiting for the WAL
/// writer; returns the end of its record (where pgoutput places it).
pub(super) fn write_watermark(content: &str) -> Result<Lsn, String> {
    let end = catalog::select_one::<String>(
        "SELECT pg_logical_emit_message(false, $1, $2)::text",
        &[WATERMARK_PREFIX.into(), content.into()],
    )
    .ok_or("cannot write a snapshot watermark")?;
    let end: Lsn = end.parse()?;
    // SAFETY: flushes WAL up to a position already inserted; callable in any backend.
    unsafe { pg_sys::XLogFlush(end.0) };
    Ok(end)
}
