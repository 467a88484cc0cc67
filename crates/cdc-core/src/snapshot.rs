//! Snapshots consistent with the stream (issue 16): rows that existed before a sink's slot, read
//! in chunks by key while the stream goes on, each delivered at a point of the stream where it is
//! exactly right (DBLog's watermarks, with the worker writing and reading both).
//!
//! ```text
//!  worker: track the table ── SELECT the next chunk ── emit its watermark (a logical message) ── ...
//!  stream: ... every change of the table the reader meets (its window) ... watermark ...
//!                      │ keys                                                │
//!                      ▼                                                     ▼
//!          SnapshotReader::track: the keys changed          Chunk: its rows without those keys,
//!          since the table's snapshot started               as one transaction of READ events
//! ```
//!
//! Why it is exact: a row the chunk read was current when the chunk's snapshot was taken. Every
//! change made after that commits after the snapshot, so the reader meets it after the chunk was
//! read (in the window, or after the watermark, where it is delivered after the row and wins).
//! A row whose key changed in the window is dropped from the chunk: the change, delivered in
//! stream order, is at least as new. The window of a table opens when its snapshot starts (with
//! the sink's stream, for an initial snapshot), so a row changed after that arrives as its changes
//! only, never also as a READ: what committed before the stream arrives as READ events, what after
//! as changes. One case escapes the window: a transaction whose commit was read (and delivered)
//! before the table was tracked but which the chunk's snapshot did not see yet (a commit waits for a
//! synchronous standby after its WAL is flushed). [`RecentXids`] remembers the transactions read
//! lately; a chunk whose snapshot has one of them in progress is read again.
//!
//! - [`SnapshotReader`]: what a sink's reader keeps: the tables tracked, their windows, the chunk;
//! - [`Chunk`]: one chunk's rows and its watermark;
//! - [`ChunkSource`]: the slot read with the chunk spliced in at its watermark;
//! - [`MvccSnapshot`]: the chunk's snapshot (`pg_current_snapshot()`).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::decode::{decode, Message, Relation, TupleValue};
use crate::deliver::port::ChangeSource;
use crate::frame::RawFrame;
use crate::types::TypeRegistry;
use crate::{CdcError, CdcResult, ErrorKind, Lsn};

pub use crate::frame::MvccSnapshot;

/// The prefix of the high watermark messages the worker writes (`pg_logical_emit_message`,
/// non-transactional): the content names the chunk, so every other sink (whose slot decodes the
/// same WAL) and a later life of the same one ignore it.
pub const WATERMARK_PREFIX: &str = "pg_cdc_snapshot";

/// The content of a chunk's watermark message: its id, then one byte per row, so the watermark
/// record spans more WAL positions than the chunk has rows and each READ event gets an `lsn` of
/// its own inside it (no other record starts there: `(commit_lsn, lsn)` stays unique).
pub fn watermark_content(id: &str, rows: usize) -> String {
    format!("{id}\n{}", ".".repeat(rows))
}

/// A row's key as the window compares it: the text of each key column, length-prefixed.
fn encode_key(values: &[TupleValue<'_>], positions: &[usize]) -> Option<Vec<u8>> {
    let mut key = Vec::new();
    for &i in positions {
        match values.get(i)? {
            TupleValue::Text(t) => {
                key.push(b't');
                key.extend_from_slice(&(t.len() as u32).to_be_bytes());
                key.extend_from_slice(t);
            }
            TupleValue::Null => key.push(b'n'),
            // An unchanged TOASTed key column of an UPDATE without an old image: the key did not
            // change, and the new image does not carry it; the row cannot be named.
            TupleValue::UnchangedToast => return None,
        }
    }
    Some(key)
}

/// Appends one tuple in pgoutput's format (text values).
pub(crate) fn write_tuple(out: &mut Vec<u8>, values: &[Option<&[u8]>]) {
    out.extend_from_slice(&(values.len() as u16).to_be_bytes());
    for v in values {
        match v {
            None => out.push(b'n'),
            Some(t) => {
                out.push(b't');
                out.extend_from_slice(&(t.len() as u32).to_be_bytes());
                out.extend_from_slice(t);
            }
        }
    }
}

/// Appends a relation description in pgoutput's format, without its tag.
pub(crate) fn write_relation(out: &mut Vec<u8>, rel: &Relation) {
    let cstr = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    };
    out.extend_from_slice(&rel.oid.to_be_bytes());
    cstr(out, &rel.namespace);
    cstr(out, &rel.name);
    out.push(rel.replica_identity);
    out.extend_from_slice(&(rel.columns.len() as u16).to_be_bytes());
    for c in &rel.columns {
        out.push(u8::from(c.is_key));
        cstr(out, &c.name);
        out.extend_from_slice(&c.type_oid.to_be_bytes());
        out.extend_from_slice(&c.type_mod.to_be_bytes());
    }
}

/// One chunk of a keyed table, from the moment it was read until it is delivered: its rows, and
/// where its watermark is once the reader met it.
#[derive(Debug)]
pub struct Chunk {
    /// The content of its watermark message.
    id: String,
    relation: Relation,
    /// Positions of the chunk key's columns in `relation.columns`.
    key: Vec<usize>,
    /// Each row's key and its tuple in pgoutput's format.
    rows: Vec<(Vec<u8>, Vec<u8>)>,
    /// Rows delivered at its watermark (set when the reader met it).
    kept: usize,
    /// When it was read, microseconds since 2000-01-01 UTC.
    read_at: i64,
    /// The end of its watermark record, once the reader met it.
    watermark: Option<Lsn>,
}

impl Chunk {
    /// An empty chunk of `relation` (described as pgoutput would describe it), keyed by the
    /// columns named `key`, to be delivered at the watermark whose content is `id`.
    pub fn new(id: String, relation: Relation, key: &[String], read_at: i64) -> CdcResult<Self> {
        let positions = key
            .iter()
            .map(|k| relation.columns.iter().position(|c| &c.name == k))
            .collect::<Option<Vec<_>>>()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| {
                CdcError::new(
                    ErrorKind::InvalidParameter,
                    format!(
                        "the chunk key {key:?} is not among the columns of {}.{}",
                        relation.namespace, relation.name
                    ),
                )
            })?;
        Ok(Chunk { id, relation, key: positions, rows: Vec::new(), kept: 0, read_at, watermark: None })
    }

    /// An empty piece of a keyless table (see [`Pieces`]): its rows are all delivered at its
    /// watermark (no window: the table's changes its snapshot holds are dropped instead).
    pub fn keyless(id: String, relation: Relation, read_at: i64) -> Self {
        Chunk { id, relation, key: Vec::new(), rows: Vec::new(), kept: 0, read_at, watermark: None }
    }

    /// Adds a row read by the chunk's query: its column values as text (output functions), in
    /// the relation's column order.
    pub fn push_row(&mut self, values: &[Option<&[u8]>]) -> CdcResult<()> {
        if values.len() != self.relation.columns.len() {
            return Err(CdcError::new(
                ErrorKind::InvalidParameter,
                format!("a chunk row has {} columns, the relation {}", values.len(), self.relation.columns.len()),
            ));
        }
        let tuple: Vec<TupleValue<'_>> = values.iter().map(|v| v.map_or(TupleValue::Null, TupleValue::Text)).collect();
        let key = encode_key(&tuple, &self.key).unwrap_or_default();
        let mut row = Vec::with_capacity(2 + values.iter().map(|v| 5 + v.map_or(0, <[u8]>::len)).sum::<usize>());
        write_tuple(&mut row, values);
        self.rows.push((key, row));
        Ok(())
    }

    /// The chunk's table.
    pub fn table_oid(&self) -> u32 {
        self.relation.oid
    }

    /// Rows read.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it read no row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rows delivered at its watermark: those whose key did not change in the window (0 until the
    /// reader met the watermark).
    pub fn kept(&self) -> usize {
        self.kept
    }

    /// The end of its watermark record, once the reader met it: delivered once the sink's
    /// delivered position reaches it.
    pub fn watermark(&self) -> Option<Lsn> {
        self.watermark
    }

    /// Whether `frame` is this chunk's watermark; returns the end of its record.
    fn is_watermark(&self, frame: &[u8]) -> Option<Lsn> {
        if frame.first() != Some(&b'M') {
            return None;
        }
        match decode(frame) {
            Ok(Message::LogicalMessage { transactional: false, lsn, prefix, content })
                if prefix == WATERMARK_PREFIX
                    && content.split(|&b| b == b'\n').next() == Some(self.id.as_bytes())
                    && content.len() > self.id.len() + self.rows.len() =>
            {
                Some(lsn)
            }
            _ => None,
        }
    }

    /// The chunk as one frame ([`Message::SnapshotChunk`]) at its watermark `at` (the end of the
    /// watermark's record): its events' `commit_lsn` is `at - 1`, and the `lsn` of its n-th row
    /// of N `at - 1 - N + n`, all inside the watermark record ([`watermark_content`]), where no
    /// transaction's change or commit can start, so `(commit_lsn, lsn)` stays unique.
    fn frame(&mut self, at: Lsn, changed: &HashSet<Vec<u8>>) -> RawFrame {
        let mut data = vec![b'Z'];
        data.extend_from_slice(&(at.0 - 1).to_be_bytes());
        data.extend_from_slice(&at.0.to_be_bytes());
        data.extend_from_slice(&self.read_at.to_be_bytes());
        write_relation(&mut data, &self.relation);
        let kept: Vec<&Vec<u8>> = self.rows.iter().filter(|(k, _)| !changed.contains(k)).map(|(_, r)| r).collect();
        self.kept = kept.len();
        data.reserve(4 + kept.iter().map(|r| r.len()).sum::<usize>());
        data.extend_from_slice(&(kept.len() as u32).to_be_bytes());
        for r in kept {
            data.extend_from_slice(r);
        }
        RawFrame { lsn: at, data }
    }
}

/// The transactions a sink's reader met lately (their xids, from the BEGIN frames), for the one
/// race the window cannot see (see the module documentation). Bounded: a transaction stays in
/// progress after its commit was read only while it waits for a synchronous standby, which
/// releases waiting commits in WAL order, so the transactions read after it wait too and there
/// are fewer of them than connections.
#[derive(Debug, Default)]
pub struct RecentXids {
    order: VecDeque<u32>,
    set: HashSet<u32>,
}

impl RecentXids {
    /// The most transactions remembered.
    pub const CAPACITY: usize = 16_384;

    /// Remembers the transaction of a BEGIN frame.
    fn record(&mut self, frame: &[u8]) {
        if frame.first() != Some(&b'B') || frame.len() < 21 {
            return;
        }
        let xid = u32::from_be_bytes([frame[17], frame[18], frame[19], frame[20]]);
        if self.set.insert(xid) {
            self.order.push_back(xid);
            if self.order.len() > Self::CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    /// Whether one of the transactions read lately was still in progress in `snapshot`: a chunk
    /// read with it may hold rows older than what the sink delivered already.
    pub fn any_in_progress(&self, snapshot: &MvccSnapshot) -> bool {
        snapshot.in_progress().iter().any(|x| self.set.contains(&(*x as u32)))
    }
}

/// A table being snapshotted, as the reader watches its changes.
#[derive(Debug)]
struct Tracked {
    /// The names of its chunk key's columns.
    key: Vec<String>,
    /// Their positions in the stream's rows (from its Relation messages; `None`: unknown).
    positions: Option<Vec<usize>>,
    /// The keys its changes touched since its snapshot started (old and new keys alike).
    changed: HashSet<Vec<u8>>,
}

/// The watermarks of a keyless table's snapshot, written ahead of its rows' snapshot, one per
/// piece of rows (ARCHITECTURE.md, "Keyless tables"): piece `i`'s watermark content starts with
/// `<base>/<i>`. The rows are read from one snapshot, a piece at a time, and each piece is
/// delivered at its own watermark, so the reader must not pass a watermark whose piece is not
/// loaded yet: it stops there and meets it again at its next read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pieces {
    /// What the watermarks' ids start with.
    pub base: String,
    /// The next piece to load (from 1).
    pub next: u32,
    /// The last piece that holds rows (the watermarks after it are passed over).
    pub last: u32,
}

impl Pieces {
    /// The id of piece `i`'s watermark.
    pub fn id(&self, i: u32) -> String {
        format!("{}/{i}", self.base)
    }

    /// Whether a watermark frame belongs to a piece not loaded yet.
    fn waits_at(&self, frame: &[u8]) -> bool {
        if frame.first() != Some(&b'M') {
            return false;
        }
        let Ok(Message::LogicalMessage { transactional: false, prefix, content, .. }) = decode(frame) else {
            return false;
        };
        if prefix != WATERMARK_PREFIX {
            return false;
        }
        let first = content.split(|&b| b == b'\n').next().unwrap_or_default();
        let Some(rest) = first.strip_prefix(self.base.as_bytes()).and_then(|r| r.strip_prefix(b"/")) else {
            return false;
        };
        let i: Option<u32> = std::str::from_utf8(rest).ok().and_then(|t| t.parse().ok());
        i.is_some_and(|i| i >= self.next && i <= self.last)
    }
}

/// What a dropped change becomes: an Origin message (which the pipeline passes over), so a read
/// keeps one frame per frame of the slot and its positions stay those of the slot's read.
fn dropped_change(lsn: Lsn) -> RawFrame {
    let mut data = vec![b'O'];
    data.extend_from_slice(&lsn.0.to_be_bytes());
    data.extend_from_slice(b"pg_cdc.snapshot_holds_it\0");
    RawFrame { lsn, data }
}

/// What a sink's reader keeps between reads for its snapshot: the tables being snapshotted and
/// their windows, the chunk waiting for its watermark (or for its delivery), and the
/// transactions read lately.
#[derive(Debug, Default)]
pub struct SnapshotReader {
    /// The chunk read and not yet delivered.
    pub chunk: Option<Chunk>,
    /// The keyless table's pieces being delivered, if any.
    pub pieces: Option<Pieces>,
    /// Keyless tables whose changes in transactions that commit before a position are dropped:
    /// the snapshot their rows were read with holds them (it sees exactly what committed before
    /// that position, the consistent point of a slot created for it).
    drop_before: HashMap<u32, Lsn>,
    /// The commit position of the transaction the reader is in (from its BEGIN).
    in_txn: Option<Lsn>,
    tracked: HashMap<u32, Tracked>,
    /// The transactions the reader met lately.
    pub recent: RecentXids,
    /// Test only (`cdc.test_skip_snapshot_window`): keep every row of a chunk, so the tests can
    /// show that their oracle sees the stale rows the window drops.
    pub skip_window: bool,
}

impl SnapshotReader {
    /// Opens the window of a table whose snapshot starts (or goes on after a restart): from now
    /// on every change of it the reader meets puts its keys there, so the table's chunks leave
    /// those rows out. `columns` are its columns as the stream lays its rows out now (a Relation
    /// message of the table updates them).
    pub fn track(&mut self, table_oid: u32, key: Vec<String>, columns: &[String]) {
        let positions = key.iter().map(|k| columns.iter().position(|c| c == k)).collect::<Option<Vec<_>>>();
        self.tracked.entry(table_oid).or_insert(Tracked { key, positions, changed: HashSet::new() });
    }

    /// From now on, drops the changes of keyless table `table_oid` in transactions that commit
    /// before `position` (see [`Pieces`]).
    pub fn drop_changes_before(&mut self, table_oid: u32, position: Lsn) {
        let p = self.drop_before.entry(table_oid).or_insert(position);
        *p = if *p == Lsn(u64::MAX) { position } else { (*p).max(position) };
    }

    /// Drops every change of keyless table `table_oid` from now on, until its plan says from
    /// where on they are delivered ([`drop_changes_before`](Self::drop_changes_before)): each
    /// commits before the point that plan finds, so its rows hold them.
    pub fn hold(&mut self, table_oid: u32) {
        self.drop_before.insert(table_oid, Lsn(u64::MAX));
    }

    /// Ends a [`hold`](Self::hold) whose plan will not come (its snapshot was cancelled or skipped).
    pub fn release_hold(&mut self, table_oid: u32) {
        if self.drop_before.get(&table_oid) == Some(&Lsn(u64::MAX)) {
            self.drop_before.remove(&table_oid);
        }
    }

    /// The keyless tables held (no plan yet).
    pub fn held(&self) -> Vec<u32> {
        self.drop_before.iter().filter(|(_, p)| **p == Lsn(u64::MAX)).map(|(t, _)| *t).collect()
    }

    /// Whether a change frame is one [`drop_changes_before`](Self::drop_changes_before) drops;
    /// a TRUNCATE naming such a table along with others comes back without it.
    fn drops(&self, frame: &[u8]) -> Option<Option<Vec<u8>>> {
        let at = self.in_txn?;
        if self.drop_before.is_empty() || self.skip_window {
            return None;
        }
        let dropped = |oid: u32| self.drop_before.get(&oid).is_some_and(|&p| at < p);
        match frame.first().copied() {
            Some(b'I' | b'U' | b'D') if frame.len() >= 5 => {
                dropped(u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]])).then_some(None)
            }
            Some(b'T') => {
                let Ok(Message::Truncate { options, relations }) = decode(frame) else { return None };
                if !relations.iter().any(|&r| dropped(r)) {
                    return None;
                }
                let kept: Vec<u32> = relations.into_iter().filter(|&r| !dropped(r)).collect();
                if kept.is_empty() {
                    return Some(None);
                }
                let mut data = vec![b'T'];
                data.extend_from_slice(&(kept.len() as u32).to_be_bytes());
                data.push(options);
                for r in kept {
                    data.extend_from_slice(&r.to_be_bytes());
                }
                Some(Some(data))
            }
            _ => None,
        }
    }

    /// Closes a table's window (its snapshot is done), freeing its keys.
    pub fn untrack(&mut self, table_oid: u32) {
        self.tracked.remove(&table_oid);
    }

    /// Whether the table's window is open.
    pub fn tracks(&self, table_oid: u32) -> bool {
        self.tracked.contains_key(&table_oid)
    }

    /// The tables whose windows are open.
    pub fn tracked_tables(&self) -> impl Iterator<Item = u32> + '_ {
        self.tracked.keys().copied()
    }

    /// Keys in the windows of all tables (what the windows hold in memory).
    pub fn window_keys(&self) -> usize {
        self.tracked.values().map(|t| t.changed.len()).sum()
    }

    /// A frame the reader met: a change of a tracked table puts its keys (old and new) in the
    /// table's window. Filtered changes count too: a change that moved a row out of a filter
    /// makes a chunk's row stale all the same.
    fn observe(&mut self, frame: &[u8]) {
        let Some(tag @ (b'R' | b'I' | b'U' | b'D')) = frame.first().copied() else { return };
        if frame.len() < 5 {
            return;
        }
        let oid = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]);
        let Some(t) = self.tracked.get_mut(&oid) else { return };
        let keys = match (tag, decode(frame)) {
            (b'R', Ok(Message::Relation(rel))) => {
                let names: Vec<&str> = rel.columns.iter().map(|c| c.name.as_str()).collect();
                t.positions = t.key.iter().map(|k| names.iter().position(|c| c == k)).collect();
                return;
            }
            (_, Ok(Message::Insert { new, .. })) => [Some(new), None],
            (_, Ok(Message::Update { old, new, .. })) => [Some(new), old.map(|(_, o)| o)],
            (_, Ok(Message::Delete { old, .. })) => [Some(old), None],
            _ => return,
        };
        let Some(positions) = t.positions.as_deref() else { return };
        for k in keys.into_iter().flatten().filter_map(|tuple| encode_key(&tuple, positions)) {
            t.changed.insert(k);
        }
    }
}

/// A slot read with the pending chunk spliced in: the chunk's watermark frame is replaced by the
/// chunk (one frame, so row positions, seeks and releases are the inner source's), and the frames
/// before it feed the chunk's window.
pub struct ChunkSource<'a, S: ChangeSource + ?Sized> {
    /// The slot read.
    pub inner: &'a mut S,
    /// The sink's snapshot state.
    pub state: &'a mut SnapshotReader,
}

impl<S: ChangeSource + ?Sized> ChangeSource for ChunkSource<'_, S> {
    fn fetch(&mut self, count: usize, types: &mut TypeRegistry) -> Vec<RawFrame> {
        let start = self.inner.position();
        let mut frames = self.inner.fetch(count, types);
        let state = &mut *self.state;
        let empty = HashSet::new();
        for (i, f) in frames.iter_mut().enumerate() {
            state.recent.record(&f.data);
            match f.data.first() {
                Some(b'B') if f.data.len() >= 9 => {
                    let mut lsn = [0u8; 8];
                    lsn.copy_from_slice(&f.data[1..9]);
                    state.in_txn = Some(Lsn(u64::from_be_bytes(lsn)));
                }
                Some(b'C') => state.in_txn = None,
                _ => {}
            }
            let Some(at) = state.chunk.as_ref().and_then(|c| c.is_watermark(&f.data)) else {
                if state.pieces.as_ref().is_some_and(|p| p.waits_at(&f.data)) {
                    // A piece not loaded yet goes here: the read ends before its watermark.
                    self.inner.seek(start + i as u64);
                    frames.truncate(i);
                    break;
                }
                match state.drops(&f.data) {
                    Some(Some(rest)) => f.data = rest,
                    Some(None) => *f = dropped_change(f.lsn),
                    None if !state.skip_window => state.observe(&f.data),
                    None => {}
                }
                continue;
            };
            let Some(chunk) = state.chunk.as_mut() else { continue };
            // Met again after a failed delivery: the changes in between were met again too.
            chunk.watermark = Some(at);
            let changed = match state.tracked.get(&chunk.table_oid()) {
                Some(t) if !state.skip_window => &t.changed,
                _ => &empty,
            };
            *f = chunk.frame(at, changed);
        }
        frames
    }

    fn position(&self) -> u64 {
        self.inner.position()
    }

    fn seek(&mut self, position: u64) {
        self.inner.seek(position)
    }

    fn release_before(&mut self, position: u64) {
        self.inner.release_before(position)
    }

    fn recorded_offsets(&mut self) -> HashMap<u32, u64> {
        self.inner.recorded_offsets()
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::Lsn;

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
        let empty = MvccSnapshot::parse("1:10:").unwrap();
        assert!(empty.in_progress().is_empty() && empty.sees_committed(9) && !empty.sees_committed(10));
        assert_eq!(MvccSnapshot::parse(" 3:10:7,4\n").unwrap().in_progress(), [4, 7]);
    }

    use crate::deliver::memory::MemorySource;
    use crate::testutil::wal::{begin, commit, delete, insert, piece_watermark, rekey, relation, watermark};

    /// A reader tracking table 7 (keyed by `id`) with a chunk of it holding `ids`.
    fn reader(ids: impl IntoIterator<Item = u32>) -> SnapshotReader {
        let mut r = SnapshotReader { chunk: Some(chunk(ids)), ..Default::default() };
        r.track(7, vec!["id".into()], &["id".into(), "v".into()]);
        r
    }

    fn chunk(ids: impl IntoIterator<Item = u32>) -> Chunk {
        let mut c = Chunk::new("sink-a 1".into(), relation(7), &["id".into()], 42).unwrap();
        for id in ids {
            c.push_row(&[Some(id.to_string().as_bytes()), Some(b"old")]).unwrap();
        }
        c
    }

    /// The rows of the chunk frame a read returned: (id, value).
    type Rows = Vec<(String, String)>;

    fn read_rows(frames: &[RawFrame]) -> Option<(Lsn, Lsn, Rows)> {
        frames.iter().find_map(|f| match decode(&f.data) {
            Ok(Message::SnapshotChunk { commit_lsn, end_lsn, rows, relation, commit_time }) => {
                assert_eq!((relation, commit_time), (super::tests::relation(7), 42));
                let text = |v: &TupleValue<'_>| match v {
                    TupleValue::Text(t) => String::from_utf8(t.to_vec()).unwrap(),
                    other => format!("{other:?}"),
                };
                Some((commit_lsn, end_lsn, rows.iter().map(|r| (text(&r[0]), text(&r[1]))).collect()))
            }
            _ => None,
        })
    }

    fn read_all(source: &mut impl ChangeSource) -> Vec<RawFrame> {
        source.fetch(usize::MAX, &mut TypeRegistry::new())
    }

    #[test]
    fn rows_whose_key_changed_in_the_window_are_dropped_at_the_watermark() {
        let frames = vec![
            begin(900, 100),
            insert(7, 2, 90),    // a row the chunk holds, inserted again after a delete: in the window
            rekey(7, 4, 40, 92), // moved away from key 4 (and to 40, which the chunk does not hold)
            delete(8, 3, 94),    // another table
            commit(100),
            watermark("sink-b 1", 150), // another sink's watermark: passed through
            watermark("sink-a 1", 200),
            begin(901, 300),
            delete(7, 5, 290), // after the watermark: delivered after the chunk, which keeps row 5
            commit(300),
        ];
        let mut inner = MemorySource::new(frames.clone());
        let mut state = reader(1..=5);
        let out = read_all(&mut ChunkSource { inner: &mut inner, state: &mut state });
        assert_eq!(out.len(), frames.len(), "the chunk takes its watermark's place");
        assert_eq!(out[5], frames[5]);
        assert_eq!(out[6].lsn, Lsn(200));
        let (commit_lsn, end_lsn, rows) = read_rows(&out).expect("the chunk at its watermark");
        assert_eq!((commit_lsn, end_lsn), (Lsn(199), Lsn(200)));
        let ids: Vec<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["1", "3", "5"]);
        assert!(rows.iter().all(|(_, v)| v == "old"));
        let c = state.chunk.as_ref().unwrap();
        assert_eq!((c.watermark(), c.len(), c.kept()), (Some(Lsn(200)), 5, 3));
    }

    #[test]
    fn a_chunk_read_again_after_a_failed_delivery_is_the_same() {
        let frames = vec![begin(900, 100), insert(7, 2, 90), commit(100), watermark("sink-a 1", 200)];
        let mut state = reader(1..=3);
        let first = read_all(&mut ChunkSource { inner: &mut MemorySource::new(frames.clone()), state: &mut state });
        let again = read_all(&mut ChunkSource { inner: &mut MemorySource::new(frames), state: &mut state });
        assert_eq!(first, again);
        assert_eq!(read_rows(&again).unwrap().2.len(), 2);
    }

    #[test]
    fn without_its_watermark_a_read_passes_frames_through_and_feeds_the_window() {
        let frames = vec![begin(900, 100), delete(7, 1, 90), commit(100)];
        let mut state = reader(1..=2);
        let out = read_all(&mut ChunkSource { inner: &mut MemorySource::new(frames.clone()), state: &mut state });
        assert_eq!(out, frames);
        let c = state.chunk.as_ref().unwrap();
        assert_eq!((c.watermark(), c.kept(), state.window_keys()), (None, 0, 1), "kept is known at the watermark");
    }

    #[test]
    fn a_table_window_opens_when_it_is_tracked_and_follows_its_relation() {
        // Changes before the table is tracked do not count; a Relation message that moves the key
        // column is followed; the window holds keys until the table is untracked.
        let mut state = SnapshotReader { chunk: Some(chunk(1..=4)), ..Default::default() };
        read_all(&mut ChunkSource { inner: &mut MemorySource::new(vec![delete(7, 1, 10)]), state: &mut state });
        state.track(7, vec!["id".into()], &["id".into(), "v".into()]);
        let mut moved = relation(7);
        moved.columns.reverse(); // (v, id)
        let mut rel = vec![b'R'];
        write_relation(&mut rel, &moved);
        let mut ins = vec![b'I'];
        ins.extend_from_slice(&7u32.to_be_bytes());
        ins.push(b'N');
        write_tuple(&mut ins, &[Some(b"x"), Some(b"3")]); // v = x, id = 3
        let frames = vec![
            RawFrame { lsn: Lsn(20), data: rel },
            begin(900, 100),
            RawFrame { lsn: Lsn(30), data: ins },
            commit(100),
            watermark("sink-a 1", 200),
        ];
        let out = read_all(&mut ChunkSource { inner: &mut MemorySource::new(frames), state: &mut state });
        let ids: Vec<String> = read_rows(&out).unwrap().2.into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["1", "2", "4"], "key 3 by its column's new place; key 1 before tracking kept");
        assert_eq!(state.window_keys(), 1);
        state.untrack(7);
        assert!(!state.tracks(7) && state.window_keys() == 0);
    }

    #[test]
    fn without_the_window_every_row_is_kept() {
        let mut state = reader(1..=3);
        state.skip_window = true;
        let frames = vec![begin(900, 100), delete(7, 2, 90), commit(100), watermark("sink-a 1", 200)];
        let out = read_all(&mut ChunkSource { inner: &mut MemorySource::new(frames), state: &mut state });
        assert_eq!(read_rows(&out).unwrap().2.len(), 3);
    }

    #[test]
    fn the_transactions_read_lately_are_remembered_for_the_snapshot_check() {
        let mut state = SnapshotReader::default();
        let frames = vec![begin(900, 100), commit(100), begin(905, 200), commit(200)];
        read_all(&mut ChunkSource { inner: &mut MemorySource::new(frames), state: &mut state });
        // 905 committed and was read, but the chunk's snapshot saw it in progress.
        assert!(state.recent.any_in_progress(&MvccSnapshot::parse("899:910:905,907").unwrap()));
        assert!(!state.recent.any_in_progress(&MvccSnapshot::parse("899:910:907").unwrap()));
        for xid in 0..RecentXids::CAPACITY as u32 + 1 {
            state.recent.record(&begin(1_000 + xid, 100).data);
        }
        assert!(!state.recent.any_in_progress(&MvccSnapshot::parse("899:910:900").unwrap()), "bounded");
    }

    fn piece(pieces: &Pieces, i: u32, ids: impl IntoIterator<Item = u32>) -> Chunk {
        let mut c = Chunk::keyless(pieces.id(i), relation(7), 42);
        for id in ids {
            c.push_row(&[Some(id.to_string().as_bytes()), Some(b"old")]).unwrap();
        }
        c
    }

    #[test]
    fn a_keyless_table_is_delivered_piece_by_piece_without_the_changes_its_snapshot_holds() {
        let pieces = Pieces { base: "sink-a 9 1".into(), next: 1, last: 2 };
        let frames = vec![
            begin(900, 100),
            insert(7, 50, 90), // committed before the consistent point (250): the rows hold it
            insert(8, 51, 92), // another table: delivered
            commit(100),
            piece_watermark("sink-a 9 1/1", 5, 150),
            piece_watermark("sink-a 9 1/2", 5, 160),
            piece_watermark("sink-a 9 1/3", 5, 170), // written ahead, holds no rows
            begin(901, 200),
            delete(7, 3, 190), // before 250 too
            commit(200),
            begin(902, 300),
            insert(7, 60, 290), // after: delivered after every piece
            commit(300),
        ];
        let mut inner = MemorySource::new(frames.clone());
        let mut state = SnapshotReader { pieces: Some(pieces.clone()), ..Default::default() };
        state.drop_changes_before(7, Lsn(250));
        // No piece loaded: the read stops at the first watermark.
        let out = read_all(&mut ChunkSource { inner: &mut inner, state: &mut state });
        assert_eq!(out.len(), 4);
        assert_eq!(out[1].data.first(), Some(&b'O'), "the insert its snapshot holds is dropped");
        assert_eq!((out[1].lsn, &out[2]), (Lsn(90), &frames[2]));
        assert_eq!(inner.position(), 4, "it reads from the watermark again");
        // Piece 1 loaded: delivered at its watermark; the read stops at piece 2's.
        state.chunk = Some(piece(&pieces, 1, [1, 2]));
        state.pieces.as_mut().unwrap().next = 2;
        let out = read_all(&mut ChunkSource { inner: &mut inner, state: &mut state });
        assert_eq!(out.len(), 1);
        assert_eq!(read_rows(&out).unwrap().2.len(), 2);
        assert_eq!(inner.position(), 5);
        // Piece 2, the last: then the rest, the unused watermark passed over.
        state.chunk = Some(piece(&pieces, 2, [3, 4]));
        state.pieces.as_mut().unwrap().next = 3;
        let out = read_all(&mut ChunkSource { inner: &mut inner, state: &mut state });
        assert_eq!(out.len(), 8);
        let (_, end, rows) = read_rows(&out).unwrap();
        assert_eq!((end, rows.len()), (Lsn(160), 2), "every row kept: no window");
        assert_eq!(out[1], frames[6]);
        assert_eq!(out[3].data.first(), Some(&b'O'), "the delete before 250 is dropped");
        assert_eq!(out[6], frames[11], "the insert after 250 is delivered");
    }

    #[test]
    fn a_truncate_before_the_consistent_point_loses_only_the_keyless_table() {
        let mut state = SnapshotReader::default();
        state.drop_changes_before(7, Lsn(250));
        let truncate = |oids: &[u32]| {
            let mut d = vec![b'T'];
            d.extend_from_slice(&(oids.len() as u32).to_be_bytes());
            d.push(1);
            for o in oids {
                d.extend_from_slice(&o.to_be_bytes());
            }
            RawFrame { lsn: Lsn(95), data: d }
        };
        let frames = vec![begin(900, 100), truncate(&[8, 7, 9]), truncate(&[7]), commit(100)];
        let out = read_all(&mut ChunkSource { inner: &mut MemorySource::new(frames), state: &mut state });
        assert_eq!(out[1], truncate(&[8, 9]));
        assert_eq!(out[2].data.first(), Some(&b'O'));
        // After the consistent point, and with the test switch that keeps every change, kept whole.
        let later = vec![begin(901, 300), truncate(&[7]), commit(300)];
        let out = read_all(&mut ChunkSource { inner: &mut MemorySource::new(later.clone()), state: &mut state });
        assert_eq!(out, later);
        state.skip_window = true;
        let before = vec![begin(900, 100), truncate(&[7]), commit(100)];
        let out = read_all(&mut ChunkSource { inner: &mut MemorySource::new(before.clone()), state: &mut state });
        assert_eq!(out, before);
    }

    #[test]
    fn a_chunk_key_must_name_columns_of_the_relation() {
        assert!(Chunk::new("x".into(), relation(7), &["nope".into()], 0).is_err());
        assert!(Chunk::new("x".into(), relation(7), &[], 0).is_err());
        let mut c = chunk([]);
        assert!(c.push_row(&[Some(b"1")]).is_err(), "a row of the wrong width");
        assert!(c.is_empty());
    }
}
