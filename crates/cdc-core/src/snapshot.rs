//! Snapshots consistent with the stream (issue 16; not wired into the worker yet): the two rules
//! that decide, for a chunk of a table read while the stream goes on, which of its rows and which
//! of the stream's changes are delivered.
//!
//! ```text
//!  WAL:  ... low watermark ── changes of the table (in the window) ── high watermark ...
//!  chunk read between the two watermarks ─▶ ChunkWindow ─(keys changed in the window)─▶ rows kept
//! ```
//!
//! - A table with a key: [`ChunkWindow`] (DBLog's rule). The chunk's rows wait for the stream to
//!   reach the high watermark; a row whose key changed inside the window is dropped, because the
//!   change, delivered in stream order, is at least as new as the row.
//! - A table without a key, read in one chunk: [`MvccSnapshot`]. A change of the table inside the
//!   window is dropped exactly when its transaction is visible in the chunk's snapshot (the chunk
//!   already holds it).

use std::collections::HashSet;

use crate::envelope::Event;
use crate::{CdcError, CdcResult, ErrorKind};

/// A transaction snapshot as `pg_current_snapshot()` prints it (`xmin:xmax:xip,...`): 64-bit
/// transaction ids (epoch and xid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MvccSnapshot {
    xmin: u64,
    xmax: u64,
    /// Transactions in progress when the snapshot was taken, ascending.
    xip: Vec<u64>,
}

impl MvccSnapshot {
    /// Parses `pg_current_snapshot()::text`.
    pub fn parse(text: &str) -> CdcResult<Self> {
        let bad = || CdcError::new(ErrorKind::InvalidParameter, format!("not a transaction snapshot: {text:?}"));
        let mut parts = text.trim().splitn(3, ':');
        let (Some(xmin), Some(xmax), Some(xip)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        let xmin: u64 = xmin.parse().map_err(|_| bad())?;
        let xmax: u64 = xmax.parse().map_err(|_| bad())?;
        let mut xip = xip
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<u64>().map_err(|_| bad()))
            .collect::<CdcResult<Vec<_>>>()?;
        if xmin > xmax || xip.iter().any(|&x| x < xmin || x >= xmax) {
            return Err(bad());
        }
        xip.sort_unstable();
        Ok(MvccSnapshot { xmin, xmax, xip })
    }

    /// Whether a committed top-level transaction, known by the 32-bit xid pgoutput's BEGIN
    /// carries, is visible in this snapshot: it committed before the snapshot was taken. The
    /// epoch comes from the snapshot's xmax: a transaction decoded while the snapshot matters is
    /// within 2^31 of it (PostgreSQL's wraparound limit keeps every live xid there).
    pub fn sees_committed(&self, xid: u32) -> bool {
        let full = self.widen(xid);
        if full < self.xmin {
            return true;
        }
        if full >= self.xmax {
            return false;
        }
        self.xip.binary_search(&full).is_err()
    }

    /// The 64-bit id of `xid`: the one nearest to xmax.
    fn widen(&self, xid: u32) -> u64 {
        let delta = i64::from(xid.wrapping_sub(self.xmax as u32) as i32);
        (self.xmax as i64 + delta).max(0) as u64
    }
}

/// One chunk of a keyed table between its watermarks: its rows as READ events, and the keys of
/// the table's changes the stream delivered inside the window.
#[derive(Debug)]
pub struct ChunkWindow {
    table_oid: u32,
    rows: Vec<Event>,
    changed: HashSet<Vec<u8>>,
    open: bool,
}

impl ChunkWindow {
    /// The chunk's rows, read after its low watermark was written and before its high one.
    pub fn new(table_oid: u32, rows: Vec<Event>) -> Self {
        ChunkWindow { table_oid, rows, changed: HashSet::new(), open: false }
    }

    /// The stream reached the low watermark: changes count from here.
    pub fn open(&mut self) {
        self.open = true;
    }

    /// A change the stream read (filtered out or not: a change that moved a row out of the
    /// sink's filter makes the chunk's row stale too). Only changes of the chunk's table inside
    /// the window count.
    pub fn observe(&mut self, table_oid: u32, key: &[u8]) {
        if self.open && table_oid == self.table_oid && !self.changed.contains(key) {
            self.changed.insert(key.to_vec());
        }
    }

    /// The stream reached the high watermark: the rows to deliver there, in the chunk's order,
    /// without those whose key changed in the window. A row without a key cannot be matched and
    /// is kept (a keyed table's rows always have one).
    pub fn close(self) -> Vec<Event> {
        let changed = self.changed;
        self.rows.into_iter().filter(|e| e.key.as_deref().is_none_or(|k| !changed.contains(k))).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::envelope::Op;
    use crate::Lsn;

    fn row(id: u32) -> Event {
        Event {
            table_oid: 7,
            schema: Arc::from("public"),
            table: Arc::from("t"),
            op: Op::Insert,
            lsn: Lsn(0),
            commit_lsn: Lsn(0),
            index: id,
            key: Some(format!("{{\"id\":{id}}}").into_bytes()),
            payload: Vec::new(),
        }
    }

    fn ids(events: &[Event]) -> Vec<u32> {
        events.iter().map(|e| e.index).collect()
    }

    #[test]
    fn a_snapshot_sees_what_committed_before_it() {
        let s = MvccSnapshot::parse("100:105:101,103").unwrap();
        assert!(s.sees_committed(99), "below xmin");
        assert!(s.sees_committed(100), "xmin itself, not in progress");
        assert!(!s.sees_committed(101), "in progress when taken");
        assert!(s.sees_committed(102));
        assert!(!s.sees_committed(103));
        assert!(s.sees_committed(104));
        assert!(!s.sees_committed(105), "xmax and after: not yet assigned when taken");
        assert!(!s.sees_committed(4_000_000));
    }

    #[test]
    fn xids_are_placed_in_the_epoch_nearest_the_snapshot() {
        // xmax just past a wraparound: epoch 1, xid 10; the in-progress xid is in epoch 0.
        let wrapped = (1u64 << 32) + 10;
        let s = MvccSnapshot::parse(&format!("{}:{wrapped}:{}", (1u64 << 32) - 5, (1u64 << 32) - 2)).unwrap();
        assert!(s.sees_committed(u32::MAX - 5), "epoch 0, before xmin");
        assert!(!s.sees_committed(u32::MAX - 1), "epoch 0, in progress");
        assert!(s.sees_committed(u32::MAX), "epoch 0, committed");
        assert!(s.sees_committed(3), "epoch 1, before xmax");
        assert!(!s.sees_committed(10), "epoch 1, xmax");
        assert!(!s.sees_committed(1_000), "epoch 1, after xmax");
    }

    #[test]
    fn malformed_snapshots_are_refused() {
        for bad in ["", "1:2", "a:2:", "5:4:", "1:10:12", "1:10:x", "1:10:0"] {
            assert!(MvccSnapshot::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(MvccSnapshot::parse("1:10:").unwrap(), MvccSnapshot { xmin: 1, xmax: 10, xip: vec![] });
        assert_eq!(MvccSnapshot::parse(" 3:10:7,4\n").unwrap().xip, vec![4, 7]);
    }

    #[test]
    fn rows_whose_key_changed_in_the_window_are_dropped() {
        let mut w = ChunkWindow::new(7, (1..=5).map(row).collect());
        w.observe(7, br#"{"id":1}"#); // before the low watermark: the row read after it is newer
        w.open();
        w.observe(7, br#"{"id":2}"#);
        w.observe(7, br#"{"id":4}"#);
        w.observe(7, br#"{"id":4}"#);
        w.observe(8, br#"{"id":3}"#); // another table
        w.observe(7, br#"{"id":99}"#); // a key the chunk does not hold
        assert_eq!(ids(&w.close()), vec![1, 3, 5]);
    }

    #[test]
    fn a_window_with_no_change_keeps_every_row_in_order() {
        let mut w = ChunkWindow::new(7, vec![row(3), row(1), row(2)]);
        w.open();
        assert_eq!(ids(&w.close()), vec![3, 1, 2]);
    }
}
