//! Lookup tables for `enrich`, as they were when each change committed.
//!
//! An `enrich` transformation adds columns of a lookup table's row to a change's event. The
//! values must be those in force when the change COMMITTED, not when the worker reads it (it may
//! be seconds or hours behind). So the worker never queries the live lookup table: it keeps its
//! own copy, moved forward by the lookup table's changes read from the same slot, in commit
//! order, in step with the changes it enriches.
//!
//! ```text
//!   cdc_enable / cdc_add_sink: copy the table under SHARE lock, as of LSN S (persisted copy)
//!   stream:  ... T1(lookup UPDATE) ... T2(reading INSERT) ... T3(lookup UPDATE) ...
//!            a transaction's lookup changes are applied at its commit, before its own events
//!            are encoded, and only if it committed at or after the copy's position
//!   memory:  a bounded cache of rows (hits); a miss reads the persisted copy (LookupSource)
//!   confirm: changed rows and the new position are written to the persisted copy before the
//!            slot moves, so after a crash the copy is never behind the slot
//! ```
//!
//! Rows changed since the last flush stay in memory until they are flushed (the persisted copy
//! does not have them yet); other rows are evicted when the cache is over its capacity.
use std::collections::HashMap;
use std::sync::Arc;

use crate::decode::{Relation, Tuple, TupleValue};
use crate::lsn::Lsn;

/// The values of a lookup row's added columns, in `add_columns` order, in PostgreSQL's text
/// output (`None` is SQL NULL).
pub type LookupRow = Arc<[Option<Box<str>>]>;

/// One enrich transformation of one captured table: the table and the transformation's
/// position among the table's `enrich` transformations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LookupId {
    /// The captured table.
    pub table_oid: u32,
    /// Index among the table's `enrich` transformations (config order).
    pub position: u32,
}

/// What the catalog says about one lookup of one sink (set up by `cdc_enable` or
/// `cdc_add_sink`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupBinding {
    /// Which transformation.
    pub id: LookupId,
    /// The lookup table.
    pub lookup_oid: u32,
    /// Its key column.
    pub lookup_column: String,
    /// Its columns added to events.
    pub add_columns: Vec<String>,
    /// Their type OIDs (for encoding).
    pub add_types: Vec<u32>,
    /// The persisted copy holds every lookup change of transactions that committed before this.
    pub as_of: Lsn,
}

/// Where lookups the cache cannot answer go: the sink's persisted copy.
pub trait LookupSource {
    /// The row of lookup `id` with key `key` in the persisted copy (`None`: no such row).
    fn fetch(&mut self, id: LookupId, key: &str) -> Result<Option<LookupRow>, String>;
}

/// A change of a lookup table, as read from the WAL.
#[derive(Debug, Clone)]
pub enum LookupChange<'a> {
    /// An INSERT or UPDATE: `old` is the old image when the WAL carries one (the key changed, or
    /// REPLICA IDENTITY FULL).
    Upsert {
        /// The lookup table.
        oid: u32,
        /// Old image, if any.
        old: Option<Tuple<'a>>,
        /// New image.
        new: Tuple<'a>,
    },
    /// A DELETE (old image: at least the key).
    Delete {
        /// The lookup table.
        oid: u32,
        /// Old image.
        old: Tuple<'a>,
    },
    /// A TRUNCATE of these tables.
    Truncate(Vec<u32>),
}

/// What a flush writes for one lookup: the rows changed since the last flush and the position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupFlush {
    /// Which lookup.
    pub id: LookupId,
    /// Every row of the copy goes first (the table was truncated since the last flush).
    pub truncate: bool,
    /// Changed rows: key and new values (`None`: deleted).
    pub rows: Vec<(String, Option<LookupRow>)>,
    /// The new position of the copy.
    pub as_of: Lsn,
}

/// Outcome of one lookup, for the hit-rate counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Answered from the worker's memory.
    Hit,
    /// Read from the persisted copy.
    Miss,
}

#[derive(Debug, Clone)]
struct Entry {
    row: Option<LookupRow>,
    /// Changed since the last flush: kept until flushed.
    dirty: bool,
    /// Used since the last eviction sweep.
    used: bool,
}

/// One lookup's rows in memory.
#[derive(Debug)]
struct Cache {
    binding: LookupBinding,
    /// Every lookup change of transactions that committed before this is applied.
    as_of: Lsn,
    rows: HashMap<Box<str>, Entry>,
    /// Truncated since the last flush: rows not in memory do not exist.
    truncated: bool,
    /// Sweep when `rows` grows past this.
    sweep_at: usize,
}

/// The lookups of one sink: caches, the lookup tables' relation descriptions, the source of misses.
pub struct Lookups {
    caches: Vec<Cache>,
    relations: HashMap<u32, Relation>,
    source: Option<Box<dyn LookupSource>>,
    capacity: usize,
}

impl std::fmt::Debug for Lookups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookups").field("caches", &self.caches.len()).field("capacity", &self.capacity).finish()
    }
}

impl Default for Lookups {
    fn default() -> Self {
        Lookups { caches: Vec::new(), relations: HashMap::new(), source: None, capacity: DEFAULT_CAPACITY }
    }
}

/// Rows kept in memory per lookup by default.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// The text of a tuple value (`None`: NULL or not carried).
fn text(v: Option<&TupleValue<'_>>) -> Option<Box<str>> {
    match v {
        Some(TupleValue::Text(t)) => Some(String::from_utf8_lossy(t).into()),
        _ => None,
    }
}

impl Lookups {
    /// Sets where misses are read (the worker's persisted copy; tests use a map).
    pub fn set_source(&mut self, source: Box<dyn LookupSource>) {
        self.source = Some(source);
    }

    /// Sets how many rows each lookup keeps in memory (at least 1; changed rows not yet flushed
    /// are kept beyond it).
    pub fn set_capacity(&mut self, rows: usize) {
        self.capacity = rows.max(1);
        for c in &mut self.caches {
            c.sweep_at = self.capacity;
        }
    }

    /// Takes the sink's lookups as the catalog has them. A lookup whose binding is unchanged
    /// keeps its memory (which may be ahead of the persisted position); a new or changed one
    /// starts from its persisted copy.
    pub fn set_bindings(&mut self, bindings: &[LookupBinding]) {
        let same = |a: &LookupBinding, b: &LookupBinding| {
            a.id == b.id
                && a.lookup_oid == b.lookup_oid
                && a.lookup_column == b.lookup_column
                && a.add_columns == b.add_columns
                && a.add_types == b.add_types
        };
        let mut old = std::mem::take(&mut self.caches);
        for b in bindings {
            match old.iter().position(|c| same(&c.binding, b)) {
                // A copy re-seeded behind our back (its position moved past ours) starts afresh.
                Some(i) if old[i].as_of >= b.as_of => self.caches.push(old.swap_remove(i)),
                _ => self.caches.push(Cache {
                    binding: b.clone(),
                    as_of: b.as_of,
                    rows: HashMap::new(),
                    truncated: false,
                    sweep_at: self.capacity,
                }),
            }
        }
        self.relations.retain(|oid, _| bindings.iter().any(|b| b.lookup_oid == *oid));
    }

    /// Forgets everything in memory (after a failed delivery the slot is read again from where
    /// it was confirmed, so memory must go back to the persisted copy too).
    pub fn reset(&mut self) {
        self.caches.clear();
        self.relations.clear();
    }

    /// Whether any lookup is set.
    pub fn is_empty(&self) -> bool {
        self.caches.is_empty()
    }

    /// Whether `oid` is a lookup table of this sink.
    pub fn is_lookup_table(&self, oid: u32) -> bool {
        self.caches.iter().any(|c| c.binding.lookup_oid == oid)
    }

    /// The OIDs of this sink's lookup tables (with repeats when several lookups read one table).
    pub fn lookup_tables(&self) -> impl Iterator<Item = u32> + '_ {
        self.caches.iter().map(|c| c.binding.lookup_oid)
    }

    /// The binding of a lookup.
    pub fn binding(&self, id: LookupId) -> Option<&LookupBinding> {
        self.caches.iter().find(|c| c.binding.id == id).map(|c| &c.binding)
    }

    /// Records a lookup table's description (from its Relation message).
    pub fn relation(&mut self, rel: &Relation) {
        if self.is_lookup_table(rel.oid) {
            self.relations.insert(rel.oid, rel.clone());
        }
    }

    /// Applies the lookup changes of a transaction that committed at `commit_lsn` and ends at
    /// `end_lsn`, to each lookup whose copy does not have it yet. Call it once per transaction,
    /// before encoding the transaction's events (they see the lookup rows as of their commit).
    pub fn commit(&mut self, commit_lsn: Lsn, end_lsn: Lsn, changes: &[LookupChange<'_>]) -> Result<(), String> {
        self.apply(commit_lsn, changes)?;
        self.advance(commit_lsn, end_lsn);
        Ok(())
    }

    /// Applies changes of a transaction that commits at `commit_lsn` to each lookup whose copy
    /// does not have it yet (a transaction too large to hold is applied piece by piece, then
    /// [`Lookups::advance`]d).
    pub fn apply(&mut self, commit_lsn: Lsn, changes: &[LookupChange<'_>]) -> Result<(), String> {
        for i in 0..self.caches.len() {
            if commit_lsn < self.caches[i].as_of {
                continue; // already in the copy (read again after a restart)
            }
            for ch in changes {
                self.apply_one(i, ch)?;
            }
        }
        Ok(())
    }

    /// Marks the transaction that committed at `commit_lsn` and ends at `end_lsn` as applied.
    pub fn advance(&mut self, commit_lsn: Lsn, end_lsn: Lsn) {
        for c in &mut self.caches {
            if commit_lsn >= c.as_of {
                c.as_of = end_lsn;
            }
        }
    }

    /// Applies one change to lookup `i`.
    fn apply_one(&mut self, i: usize, ch: &LookupChange<'_>) -> Result<(), String> {
        let lookup_oid = self.caches[i].binding.lookup_oid;
        let oid = match ch {
            LookupChange::Truncate(oids) => {
                if oids.contains(&lookup_oid) {
                    let c = &mut self.caches[i];
                    c.rows.clear();
                    c.truncated = true;
                }
                return Ok(());
            }
            LookupChange::Upsert { oid, .. } | LookupChange::Delete { oid, .. } => *oid,
        };
        if oid != lookup_oid {
            return Ok(());
        }
        let b = &self.caches[i].binding;
        let rel = self.relations.get(&oid).ok_or_else(|| {
            format!("a change of lookup table OID {oid} arrived before its description (Relation message)")
        })?;
        let at = |name: &str| rel.columns.iter().position(|c| c.name == name);
        let key_at = at(&b.lookup_column).ok_or_else(|| {
            format!("lookup table {}.{} has no column \"{}\" any more", rel.namespace, rel.name, b.lookup_column)
        })?;
        let add_at: Vec<Option<usize>> = b.add_columns.iter().map(|c| at(c)).collect();
        match ch {
            LookupChange::Upsert { old, new, .. } => {
                let new_key = text(new.get(key_at)).ok_or("a lookup row without a key value")?;
                let old_key = old.as_ref().and_then(|o| text(o.get(key_at)));
                if let Some(k) = old_key.filter(|k| *k != new_key) {
                    self.set(i, k, None);
                }
                let mut previous = None;
                if new.contains(&TupleValue::UnchangedToast) {
                    // Values the WAL left out are unchanged: take them from the copy.
                    previous = self.get(i, &new_key)?.0;
                }
                let row: LookupRow = add_at
                    .iter()
                    .enumerate()
                    .map(|(j, at)| match at.and_then(|a| new.get(a)) {
                        Some(TupleValue::UnchangedToast) => previous.as_ref().and_then(|p| p[j].clone()),
                        v => text(v),
                    })
                    .collect();
                self.set(i, new_key, Some(row));
            }
            LookupChange::Delete { old, .. } => {
                if let Some(k) = text(old.get(key_at)) {
                    self.set(i, k, None);
                }
            }
            LookupChange::Truncate(_) => {}
        }
        Ok(())
    }

    fn set(&mut self, i: usize, key: Box<str>, row: Option<LookupRow>) {
        let c = &mut self.caches[i];
        c.rows.insert(key, Entry { row, dirty: true, used: true });
        self.evict(i);
    }

    /// Looks a key up in lookup `i`: memory first, then the persisted copy.
    fn get(&mut self, i: usize, key: &str) -> Result<(Option<LookupRow>, Answer), String> {
        let c = &mut self.caches[i];
        if let Some(e) = c.rows.get_mut(key) {
            e.used = true;
            return Ok((e.row.clone(), Answer::Hit));
        }
        if c.truncated {
            // Truncated since the last flush and not set since: known to be gone.
            return Ok((None, Answer::Hit));
        }
        let row = {
            let id = c.binding.id;
            let source = self.source.as_mut().ok_or("no persisted lookup copy to read a miss from")?;
            source.fetch(id, key)?
        };
        let c = &mut self.caches[i];
        c.rows.insert(key.into(), Entry { row: row.clone(), dirty: false, used: true });
        self.evict(i);
        Ok((row, Answer::Miss))
    }

    /// The row lookup `id` has for `key`, as of the last transaction committed through
    /// [`Lookups::commit`].
    pub fn lookup(&mut self, id: LookupId, key: &str) -> Result<(Option<LookupRow>, Answer), String> {
        let i = self
            .caches
            .iter()
            .position(|c| c.binding.id == id)
            .ok_or_else(|| format!("lookup {} of table OID {} is not set up", id.position, id.table_oid))?;
        self.get(i, key)
    }

    /// Drops rows that are clean and were not used since the last sweep, once over capacity.
    fn evict(&mut self, i: usize) {
        let capacity = self.capacity;
        let c = &mut self.caches[i];
        if c.rows.len() <= c.sweep_at {
            return;
        }
        c.rows.retain(|_, e| {
            let keep = e.dirty || e.used;
            e.used = false;
            keep
        });
        // Everything left was used or is waiting for a flush: sweep again after some growth.
        c.sweep_at = capacity.max(c.rows.len() + capacity / 8 + 1);
    }

    /// What to write to the persisted copy: the changed rows and the position of each lookup.
    /// They count as written once this returns (a failed write resets the sink, see
    /// [`Lookups::reset`]).
    pub fn take_flush(&mut self) -> Vec<LookupFlush> {
        let capacity = self.capacity;
        self.caches
            .iter_mut()
            .filter(|c| c.as_of > c.binding.as_of || c.truncated || c.rows.values().any(|e| e.dirty))
            .map(|c| {
                let rows = c
                    .rows
                    .iter_mut()
                    .filter(|(_, e)| e.dirty)
                    .map(|(k, e)| {
                        e.dirty = false;
                        (k.to_string(), e.row.clone())
                    })
                    .collect();
                let truncate = std::mem::take(&mut c.truncated);
                c.binding.as_of = c.as_of;
                c.sweep_at = capacity.min(c.sweep_at).max(1);
                LookupFlush { id: c.binding.id, truncate, rows, as_of: c.as_of }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
