//! What logical decoding hands the core and what the core hands the sinks, with no behaviour of
//! their own: a pgoutput message with its LSN ([`RawFrame`]), a committed transaction's events
//! ([`Transaction`]), and a transaction snapshot ([`MvccSnapshot`]). Kept apart from the modules
//! that produce and consume them (`pipeline`, `snapshot`, `deliver`) so none of those needs another
//! for its types: `tests/module_cycles.rs` keeps the module graph free of new cycles.
use std::collections::HashMap;

use crate::envelope::Event;
use crate::stats::TableCounters;
use crate::{CdcError, CdcResult, ErrorKind, Lsn};

/// One pgoutput message and its LSN, as logical decoding writes it (a row of
/// `pg_logical_slot_peek_binary_changes`, or one write of the worker's decoding session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// The row's `lsn`.
    pub lsn: Lsn,
    /// The row's `data`: one pgoutput message.
    pub data: Vec<u8>,
}

/// A committed transaction, ready to publish.
#[derive(Debug, Clone)]
pub struct Transaction {
    /// Transaction id.
    pub xid: u32,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// LSN just past the commit record: confirm the slot to this once the events are delivered.
    pub end_lsn: Lsn,
    /// Commit time, PostgreSQL microseconds.
    pub commit_time: i64,
    /// Events for this sink, in commit order.
    pub events: Vec<Event>,
    /// Filter and transformation counts of this transaction, by table OID.
    pub counters: HashMap<u32, TableCounters>,
}

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

    /// The transactions in progress when it was taken.
    pub fn in_progress(&self) -> &[u64] {
        &self.xip
    }

    /// The 64-bit id of `xid`: the one nearest to xmax.
    fn widen(&self, xid: u32) -> u64 {
        let delta = i64::from(xid.wrapping_sub(self.xmax as u32) as i32);
        (self.xmax as i64 + delta).max(0) as u64
    }
}
