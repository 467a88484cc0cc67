//! Counters in shared memory: per sink ([`cdc_core::stats::DeliveryCounters`], for
//! `cdc_delivery_status`), per (sink, table) ([`cdc_core::stats::TableCounters`], for
//! `cdc_filter_metrics` and `cdc_metrics`), and latency histograms per sink and per table
//! ([`Histogram`], for `cdc_metrics`, `cdc_status` and the Prometheus text). The worker adds to
//! them, any session reads them. Created with the shared memory, so they survive a worker restart
//! but not a server restart or a database crash.
use std::collections::HashMap;

use cdc_core::metrics::Histogram;
use cdc_core::stats::{DeliveryCounters, TableCounters};
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};

/// Sinks counted at once; a sink beyond it is not counted (its status says so).
pub const MAX_SINKS: usize = 256;

#[derive(Clone, Copy, Default)]
struct Entry {
    /// The sink id (uuid bytes); all zero when free.
    id: [u8; 16],
    counters: DeliveryCounters,
}

#[derive(Clone, Copy)]
struct Table {
    /// When counting started, Unix microseconds.
    since_unix_micros: i64,
    entries: [Entry; MAX_SINKS],
}

impl Table {
    fn new() -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Table { since_unix_micros: now, entries: [Entry::default(); MAX_SINKS] }
    }
}

// SAFETY: plain old data (integers and byte arrays), no pointers.
unsafe impl PGRXSharedMemory for Table {}

static STATS: PgLwLock<Table> = unsafe { PgLwLock::new(c"pg_cdc delivery counters") };

/// (sink, table) pairs counted at once; pairs beyond it are not counted.
pub const MAX_SINK_TABLES: usize = 2048;

#[derive(Clone, Copy, Default)]
struct TableEntry {
    /// The sink id (uuid bytes); all zero when free.
    sink: [u8; 16],
    table_oid: u32,
    counters: TableCounters,
}

#[derive(Clone, Copy)]
struct TableStats {
    entries: [TableEntry; MAX_SINK_TABLES],
}

// SAFETY: plain old data (integers and byte arrays), no pointers.
unsafe impl PGRXSharedMemory for TableStats {}

static TABLE_STATS: PgLwLock<TableStats> = unsafe { PgLwLock::new(c"pg_cdc table counters") };

/// Sinks whose latencies are measured at once (a histogram pair is 9.5 KB).
pub const MAX_LATENCY_SINKS: usize = 64;
/// Tables whose latencies are measured at once.
pub const MAX_LATENCY_TABLES: usize = 128;

/// Latencies of one sink: publish (handed to the producer -> acknowledged) and end to end
/// (committed in PostgreSQL -> acknowledged), one value per event.
#[derive(Clone, Copy, Default)]
pub struct SinkLatency {
    /// The sink id (uuid bytes); all zero when free.
    id: [u8; 16],
    /// Handed to the producer -> acknowledged by the broker (exactly-once: committed).
    pub publish: Histogram,
    /// Committed in PostgreSQL -> acknowledged by the broker.
    pub end_to_end: Histogram,
}

/// Latencies of one table's events, over every sink: capture (committed -> decoded and encoded
/// by the worker) and end to end.
#[derive(Clone, Copy, Default)]
pub struct TableLatency {
    /// The table OID; 0 when free.
    oid: u32,
    /// Committed in PostgreSQL -> its event built by the worker.
    pub capture: Histogram,
    /// Committed in PostgreSQL -> acknowledged by the broker.
    pub end_to_end: Histogram,
}

#[derive(Clone, Copy)]
struct Latencies {
    sinks: [SinkLatency; MAX_LATENCY_SINKS],
    tables: [TableLatency; MAX_LATENCY_TABLES],
}

// SAFETY: plain old data (integers and arrays of them), no pointers.
unsafe impl PGRXSharedMemory for Latencies {}

static LATENCIES: PgLwLock<Latencies> = unsafe { PgLwLock::new(c"pg_cdc latencies") };

/// Requests the shared memory (from `_PG_init` while preloading).
// The macro tests features of other PostgreSQL versions this crate does not declare.
#[allow(unexpected_cfgs)]
pub fn init() {
    pg_shmem_init!(STATS = Table::new());
    pg_shmem_init!(TABLE_STATS = TableStats { entries: [TableEntry::default(); MAX_SINK_TABLES] });
    pg_shmem_init!(
        LATENCIES = Latencies {
            sinks: [SinkLatency::default(); MAX_LATENCY_SINKS],
            tables: [TableLatency::default(); MAX_LATENCY_TABLES],
        }
    );
}

/// Adds one delivery's latencies: the sink's, and each table's (capture, end to end).
pub fn add_latencies(id: &str, sink: &SinkLatency, tables: &HashMap<u32, TableLatency>) {
    let Some(key) = id_bytes(id) else { return };
    if !crate::preloaded() {
        return;
    }
    let mut l = LATENCIES.exclusive();
    let at = l.sinks.iter().position(|e| e.id == key).or_else(|| l.sinks.iter().position(|e| e.id == [0; 16]));
    if let Some(i) = at {
        let e = &mut l.sinks[i];
        e.id = key;
        e.publish.merge(&sink.publish);
        e.end_to_end.merge(&sink.end_to_end);
    }
    for (&oid, t) in tables {
        let at = l.tables.iter().position(|e| e.oid == oid).or_else(|| l.tables.iter().position(|e| e.oid == 0));
        if let Some(i) = at {
            let e = &mut l.tables[i];
            e.oid = oid;
            e.capture.merge(&t.capture);
            e.end_to_end.merge(&t.end_to_end);
        }
    }
}

/// A sink's latencies (empty when none were measured).
pub fn sink_latency(id: &str) -> SinkLatency {
    let (Some(key), true) = (id_bytes(id), crate::preloaded()) else { return SinkLatency::default() };
    LATENCIES.share().sinks.iter().find(|e| e.id == key).copied().unwrap_or_default()
}

/// A table's latencies over every sink (empty when none were measured).
pub fn table_latency(oid: u32) -> TableLatency {
    if !crate::preloaded() {
        return TableLatency::default();
    }
    LATENCIES.share().tables.iter().find(|e| e.oid == oid).copied().unwrap_or_default()
}

/// Frees the latency entries of tables that are no longer captured.
pub fn retain_tables(oids: &[u32]) {
    if !crate::preloaded() {
        return;
    }
    let mut l = LATENCIES.exclusive();
    for e in l.tables.iter_mut() {
        if e.oid != 0 && !oids.contains(&e.oid) {
            *e = TableLatency::default();
        }
    }
}

/// Adds a delivery's filter and transformation counts to a sink's per-table counters.
pub fn add_tables(id: &str, counts: &HashMap<u32, TableCounters>) {
    let Some(sink) = id_bytes(id) else { return };
    if counts.is_empty() || !crate::preloaded() {
        return;
    }
    let mut stats = TABLE_STATS.exclusive();
    for (&oid, c) in counts {
        let at = stats.entries.iter().position(|e| e.sink == sink && e.table_oid == oid).or_else(|| {
            let free = stats.entries.iter().position(|e| e.sink == [0; 16])?;
            stats.entries[free] = TableEntry { sink, table_oid: oid, counters: TableCounters::default() };
            Some(free)
        });
        if let Some(i) = at {
            stats.entries[i].counters.add(c);
        }
    }
}

/// The per-sink counters of one table: (sink id as uuid bytes, counters).
pub fn read_table(oid: u32) -> Vec<([u8; 16], TableCounters)> {
    if !crate::preloaded() {
        return Vec::new();
    }
    let stats = TABLE_STATS.share();
    stats.entries.iter().filter(|e| e.sink != [0; 16] && e.table_oid == oid).map(|e| (e.sink, e.counters)).collect()
}

/// A sink id (uuid text) as bytes, as the counters key it.
pub fn sink_key(id: &str) -> Option<[u8; 16]> {
    id_bytes(id)
}

/// A sink id (uuid text) as bytes; `None` when it is not a uuid.
fn id_bytes(id: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = id.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    (out != [0; 16]).then_some(out)
}

/// Changes the counters of a sink (taking a free entry the first time).
pub fn update(id: &str, f: impl FnOnce(&mut DeliveryCounters)) {
    let Some(key) = id_bytes(id) else { return };
    if !crate::preloaded() {
        return;
    }
    let mut table = STATS.exclusive();
    let slot = match table.entries.iter().position(|e| e.id == key) {
        Some(i) => i,
        None => match table.entries.iter().position(|e| e.id == [0; 16]) {
            Some(i) => {
                table.entries[i] = Entry { id: key, counters: DeliveryCounters::default() };
                i
            }
            None => return,
        },
    };
    f(&mut table.entries[slot].counters);
}

/// The counters of a sink, `None` when it has none (yet).
pub fn read(id: &str) -> Option<DeliveryCounters> {
    let key = id_bytes(id)?;
    if !crate::preloaded() {
        return None;
    }
    let table = STATS.share();
    table.entries.iter().find(|e| e.id == key).map(|e| e.counters)
}

/// When counting started, Unix microseconds (`None` without the preload).
pub fn since_unix_micros() -> Option<i64> {
    crate::preloaded().then(|| STATS.share().since_unix_micros)
}

/// Frees the entries of sinks that no longer exist.
pub fn retain(ids: &[&str]) {
    if !crate::preloaded() {
        return;
    }
    let keep: Vec<[u8; 16]> = ids.iter().filter_map(|i| id_bytes(i)).collect();
    let mut table = STATS.exclusive();
    for e in table.entries.iter_mut() {
        if e.id != [0; 16] && !keep.contains(&e.id) {
            *e = Entry::default();
        }
    }
    drop(table);
    let mut tables = TABLE_STATS.exclusive();
    for e in tables.entries.iter_mut() {
        if e.sink != [0; 16] && !keep.contains(&e.sink) {
            *e = TableEntry::default();
        }
    }
    drop(tables);
    let mut l = LATENCIES.exclusive();
    for e in l.sinks.iter_mut() {
        if e.id != [0; 16] && !keep.contains(&e.id) {
            *e = SinkLatency::default();
        }
    }
}
