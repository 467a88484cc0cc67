//! The snapshot side of a sink's driver: which windows its reader keeps open, when the chunk it
//! holds counts as delivered, what it asks the catalog for next and what it makes of the answer.
//! The catalog side (reading chunks by key, watermarks, `_cdc_snapshots`) is the worker's.
//!
//! ```text
//!  snapshots looked up ─▶ open_windows (keyed: track; keyless: hold, or drop before its plan)
//!  before each read:  chunk_delivered? (delivered >= its watermark) ─▶ chunk_wanted ─▶ Previous
//!  the catalog's Next ─▶ chunk_taken: windows of finished tables close, a stale keyless plan goes,
//!                        a chunk is kept until its watermark is read and delivered
//! ```
use super::Driver;
use crate::snapshot::Chunk;
use crate::Lsn;

/// How the chunk read before (if any) is settled when the next one is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Previous {
    /// The sink delivered the chunk it held.
    Delivered,
    /// It holds no chunk (it just started): one the catalog has in flight was delivered if the
    /// sink had delivered up to its watermark when it was opened.
    OpenedAt(Lsn),
}

/// What the catalog holds next for a sink's snapshots.
#[derive(Debug)]
pub enum Next {
    /// A chunk, its watermark written.
    Chunk(Box<Chunk>),
    /// Rows remain, but not now (a transaction read lately was in progress in the chunk's
    /// snapshot): try again on a later pass.
    Later,
    /// No snapshot of the sink has rows left.
    Done,
    /// The next snapshot's table has no window open (a snapshot requested or added while the sink
    /// was snapshotting other tables): open the windows of its snapshots' tables, then read.
    Untracked,
    /// The next snapshot is the initial one of a table without a key: its rows come from one
    /// snapshot, piece by piece.
    Keyless {
        /// Its `_cdc_snapshots` row.
        snapshot_id: i64,
        /// The table.
        table_oid: u32,
    },
}

/// A table being snapshotted: its OID, chunk key and columns.
pub type OpenTable = (u32, Vec<String>, Vec<String>);

/// What a sink's reader needs before its first read: whether it has snapshots with rows left; of
/// their tables, those with a chunk key (each with its key and its columns as the stream lays them
/// out); and the keyless tables of its initial snapshots, each with the point before which its
/// changes are dropped (`None`: no plan yet, so all of them are held).
#[derive(Debug, Default)]
pub struct OpenSnapshots {
    /// It has snapshots with rows left.
    pub any: bool,
    /// Their keyed tables.
    pub keyed: Vec<OpenTable>,
    /// The keyless tables of its initial snapshots.
    pub keyless: Vec<(u32, Option<Lsn>)>,
}

/// What the driver made of the catalog's answer ([`Driver::chunk_taken`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Taken {
    /// The keyless plan the caller follows is for a snapshot that is no longer next (cancelled):
    /// it closes the plan's cursor.
    pub give_up_plan: bool,
    /// The next snapshot is a keyless table's: (snapshot id, table OID).
    pub keyless: Option<(i64, u32)>,
}

impl Driver {
    /// Its snapshots are not looked up yet: its first step, or the catalog was read again.
    pub fn snapshots_unknown(&self) -> bool {
        self.snapshotting.is_none()
    }

    /// Opens the windows of its snapshots' tables before its first read: every change its reads
    /// meet from now on is delivered as a change, never also as a READ. A keyless table's changes
    /// wait for its plan, or follow the one they had (`plan_table`: the table of the keyless plan
    /// the caller follows, if any).
    pub fn open_windows(&mut self, open: OpenSnapshots, plan_table: Option<u32>) {
        for (oid, key, columns) in open.keyed {
            self.snap.track(oid, key, &columns);
        }
        for (oid, until) in open.keyless {
            match until {
                Some(p) => self.snap.drop_changes_before(oid, p),
                None if plan_table != Some(oid) => self.snap.hold(oid),
                None => {}
            }
        }
        self.snapshotting = Some(open.any);
    }

    /// Before a read: the chunk it holds counts as delivered once what the sink delivered reaches
    /// the chunk's watermark. Returns the rows it delivered then (those kept at the watermark).
    pub fn chunk_delivered(&mut self) -> Option<u64> {
        let watermark = self.snap.chunk.as_ref().and_then(Chunk::watermark)?;
        if self.delivered.is_none_or(|d| d < watermark) {
            return None;
        }
        let chunk = self.snap.chunk.take()?;
        self.chunk_delivered = true;
        Some(chunk.kept() as u64)
    }

    /// The next chunk to ask the catalog for, when it wants one (see [`Driver::wants_chunk`]):
    /// how the one before is settled, and the chunk's number in this run (it names the chunk's
    /// watermark).
    pub fn chunk_wanted(&mut self) -> Option<(Previous, u64)> {
        if !self.wants_chunk() {
            return None;
        }
        let previous = if self.chunk_delivered {
            Previous::Delivered
        } else {
            Previous::OpenedAt(self.opened_at.unwrap_or_default())
        };
        self.chunks += 1;
        Some((previous, self.chunks))
    }

    /// Takes the catalog's answer: the windows of tables whose snapshots are no longer open
    /// (`open`: the tables of those that are) close; a keyless table held for a plan that will not
    /// come (cancelled) is let go; the pieces of the keyless plan the caller follows
    /// (`plan_snapshot`) are given up when its snapshot is no longer next; a chunk is held until
    /// its watermark is read and delivered; `Done` ends the snapshot, `Untracked` looks the
    /// snapshots up again.
    pub fn chunk_taken(&mut self, next: Next, open: &[u32], plan_snapshot: Option<i64>) -> Taken {
        self.chunk_delivered = false;
        let closed: Vec<u32> = self.snap.tracked_tables().filter(|t| !open.contains(t)).collect();
        for t in closed {
            self.snap.untrack(t);
        }
        for t in self.snap.held().into_iter().filter(|t| !open.contains(t)) {
            self.snap.release_hold(t);
        }
        let keyless = match next {
            Next::Keyless { snapshot_id, table_oid } => Some((snapshot_id, table_oid)),
            _ => None,
        };
        let give_up_plan = plan_snapshot.is_some_and(|p| Some(p) != keyless.map(|k| k.0));
        if give_up_plan {
            self.snap.pieces = None;
        }
        match next {
            Next::Chunk(c) => self.snap.chunk = Some(*c),
            Next::Later | Next::Keyless { .. } => {}
            Next::Done => self.snapshotting = Some(false),
            Next::Untracked => self.snapshotting = None,
        }
        Taken { give_up_plan, keyless }
    }
}
