//! Counters in shared memory: per sink ([`cdc_core::stats::DeliveryCounters`], for
//! `cdc_delivery_status`) and per (sink, table) ([`cdc_core::stats::TableCounters`], for
//! `cdc_filter_metrics`). The worker adds to them, any session reads them. Created with the shared
//! memory, so they survive a worker restart but not a server restart or a database crash.
use std::collections::HashMap;

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

/// Requests the shared memory (from `_PG_init` while preloading).
// The macro tests features of other PostgreSQL versions this crate does not declare.
#[allow(unexpected_cfgs)]
pub fn init() {
    pg_shmem_init!(STATS = Table::new());
    pg_shmem_init!(TABLE_STATS = TableStats { entries: [TableEntry::default(); MAX_SINK_TABLES] });
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
}
