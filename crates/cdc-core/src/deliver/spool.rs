//! The frames a decoding session has produced and its sink has not yet confirmed: the buffer
//! between a decoding session kept open across reads (the worker's) and the reads of
//! [`super::read`].
//!
//! ```text
//!  decoding session ──push──▶ [ memory (up to `limit` bytes) | spill file ] ──fetch/seek──▶ read
//!        (a whole transaction per commit record)      ▲
//!                        begin_read(confirmed): drop what the slot's confirm covers
//! ```
//! A decoding session emits a transaction's messages all at once, when it decodes the commit
//! record, however large the transaction: what does not fit in `limit` goes to a file (unlinked at
//! once, so nothing is left behind by a crash). A read numbers the spool's frames from 0 at
//! [`Spool::begin_read`], may [`Spool::seek`] back to any frame it has not released with
//! [`Spool::release_before`] (the two passes of a large transaction), and what it does not
//! confirm stays for the next read — exactly what a new decoding session started at the slot's
//! confirmed position would emit again (see [`Spool::begin_read`]).
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use crate::frame::RawFrame;
use crate::Lsn;

/// A frame in a file (a spill file, or a segment of the shared decoding's log): its LSN (8 bytes,
/// LE), its length (4, LE), its bytes.
pub(crate) const HEADER: usize = 12;

/// Bytes written to such a file at a time, and read from it at a time.
pub(crate) const IO_CHUNK: usize = 256 << 10;

/// Appends `frame` to `out` as it is kept in a file (see [`HEADER`]).
pub(crate) fn encode_frame(out: &mut Vec<u8>, frame: &RawFrame) -> io::Result<()> {
    let Ok(len) = u32::try_from(frame.data.len()) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a message of 4 GB or more"));
    };
    out.extend_from_slice(&frame.lsn.0.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&frame.data);
    Ok(())
}

/// The LSN and length a frame's header (its first [`HEADER`] bytes) holds.
pub(crate) fn decode_header(h: &[u8]) -> (Lsn, usize) {
    let lsn = u64::from_le_bytes(h[0..8].try_into().unwrap_or_default());
    (Lsn(lsn), u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize)
}

/// A chunk of a file read ahead, so that frames are read [`IO_CHUNK`] bytes at a time.
#[derive(Debug, Default)]
pub(crate) struct ReadAhead {
    at: u64,
    buf: Vec<u8>,
}

impl ReadAhead {
    /// `len` bytes at `offset` of `file`, which holds `end` bytes.
    pub(crate) fn bytes(&mut self, file: &File, offset: u64, len: usize, end: u64) -> io::Result<&[u8]> {
        let buffered = offset >= self.at && offset + len as u64 <= self.at + self.buf.len() as u64;
        if !buffered {
            let want = len.max(IO_CHUNK).min(end.saturating_sub(offset) as usize);
            if want < len {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a file shorter than its frames"));
            }
            self.buf.resize(want, 0);
            file.read_exact_at(&mut self.buf, offset)?;
            self.at = offset;
        }
        let from = (offset - self.at) as usize;
        Ok(&self.buf[from..from + len])
    }

    /// Forgets what was read ahead (the file changed).
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
    }
}

/// Every this many frames of the spill file, where the frame starts (to seek without reading from
/// the start of the file).
const INDEX_EVERY: u64 = 256;

/// The frames of a decoding session not yet confirmed, in order.
#[derive(Debug)]
pub struct Spool {
    /// Absolute number of the frame at the front (frames are numbered as they are pushed).
    front: u64,
    /// Absolute number of the current read's frame 0.
    read_base: u64,
    /// Absolute number of the next frame a fetch returns.
    cursor: u64,
    /// The first frames, in memory.
    mem: VecDeque<RawFrame>,
    mem_bytes: usize,
    /// Bytes of frames held in memory before the rest goes to the spill file.
    limit: usize,
    /// Where the spill file is made.
    dir: PathBuf,
    /// The frames after `mem`, once memory was full.
    file: Option<SpillFile>,
    /// Spill files made so far (their names).
    files_made: u64,
    /// What the position of a read begun on an empty spool covers, for the frames pushed next
    /// (see [`Spool::begin_read`]); gone at the first frame it does not cover.
    skip: Option<Coverage>,
}

/// A spill file: the frames after the spool's memory part, from `start`.
#[derive(Debug)]
struct SpillFile {
    file: File,
    /// Bytes not written yet, to be written at `written`.
    pending: Vec<u8>,
    /// Bytes in the file.
    written: u64,
    /// Offset of the first frame still held.
    start: u64,
    /// Frames held.
    count: u64,
    /// (absolute frame number, offset) every [`INDEX_EVERY`] frames.
    index: Vec<(u64, u64)>,
    /// The frame after the last one pushed: (absolute number, offset).
    end: (u64, u64),
    ahead: ReadAhead,
}

impl Spool {
    /// An empty spool that keeps up to `limit` bytes of frames in memory and spills the rest to a
    /// file made in `dir`.
    pub fn new(limit: usize, dir: impl Into<PathBuf>) -> Spool {
        Spool {
            front: 0,
            read_base: 0,
            cursor: 0,
            mem: VecDeque::new(),
            mem_bytes: 0,
            limit,
            dir: dir.into(),
            file: None,
            files_made: 0,
            skip: None,
        }
    }

    /// Frames held.
    pub fn len(&self) -> u64 {
        self.mem.len() as u64 + self.file.as_ref().map_or(0, |f| f.count)
    }

    /// Whether no frame is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of frames held in memory.
    pub fn memory_bytes(&self) -> usize {
        self.mem_bytes
    }

    /// Bytes of frames held in the spill file.
    pub fn spilled_bytes(&self) -> u64 {
        self.file.as_ref().map_or(0, |f| f.written + f.pending.len() as u64 - f.start)
    }

    /// Absolute number of the frame after the last one.
    fn end(&self) -> u64 {
        self.front + self.len()
    }

    /// Appends a frame (the decoding session's output).
    pub fn push(&mut self, frame: RawFrame) -> io::Result<()> {
        if let Some(skip) = self.skip.as_mut() {
            if skip.covers(&frame) {
                return Ok(());
            }
            self.skip = None;
        }
        if self.file.is_none() && self.mem_bytes + frame.data.len() <= self.limit {
            self.mem_bytes += frame.data.len();
            self.mem.push_back(frame);
            return Ok(());
        }
        let at = self.end();
        if self.file.is_none() {
            self.file = Some(SpillFile::create(&self.dir, self.files_made, at)?);
            self.files_made += 1;
        }
        let Some(f) = self.file.as_mut() else { unreachable!("made above") };
        f.append(at, &frame)
    }

    /// Starts a read: drops the frames the slot's confirmed position `confirmed` covers, then
    /// numbers the rest from 0 and puts the cursor on frame 0. A frame is covered exactly when a
    /// new decoding session started at `confirmed` would not emit it again: a transaction whose
    /// commit record starts before `confirmed` (its Begin carries that position), and a message
    /// outside any transaction whose record ends at or before it (its frame's LSN). What the last
    /// read returned but did not confirm is returned again.
    ///
    /// When that leaves the spool empty, the frames pushed next are dropped as long as `confirmed`
    /// covers them: a decoding session started anew (the sink left the shared decoding's log, or
    /// gave its session up) starts at its slot's confirmed position, which may be behind what the
    /// sink delivered and has not confirmed yet (`confirmed` is then that delivered position).
    /// Until 2026-12-07 those frames were read again: an exactly-once sink skipped their events
    /// as its destination held them already, and counted them a second time in `_cdc_offsets`.
    pub fn begin_read(&mut self, confirmed: Lsn) -> io::Result<()> {
        let mut coverage = Coverage::new(confirmed);
        while let Some(frame) = self.peek_front()? {
            if !coverage.covers(&frame) {
                break;
            }
            self.pop_front()?;
        }
        self.skip = self.is_empty().then_some(coverage);
        self.read_base = self.front;
        self.cursor = self.front;
        Ok(())
    }

    /// The read's position: the number of the next frame a fetch returns.
    pub fn position(&self) -> u64 {
        self.cursor - self.read_base
    }

    /// Frames of the read from the cursor to the end (those a fetch can return without more
    /// decoding).
    pub fn available(&self) -> u64 {
        self.end().saturating_sub(self.cursor)
    }

    /// Frames of the current read held so far (its frame 0 up to the last one pushed).
    pub fn read_len(&self) -> u64 {
        self.end() - self.read_base
    }

    /// Moves the cursor to the read's frame `position` (one not released).
    pub fn seek(&mut self, position: u64) {
        self.cursor = (self.read_base + position).clamp(self.front, self.end());
    }

    /// The read will not go back before its frame `position`: those frames are dropped (from
    /// memory, and from the spill file when they reach into it: a unit split between the two must
    /// go whole, or the next read would start inside it). They are delivered with the read or the
    /// read fails; either way they are not read again from this spool.
    pub fn release_before(&mut self, position: u64) -> io::Result<()> {
        let upto = (self.read_base + position).min(self.cursor);
        while self.front < upto && !self.is_empty() {
            self.pop_front()?;
        }
        Ok(())
    }

    /// Up to `count` frames from the cursor, which moves past them.
    pub fn fetch(&mut self, count: usize) -> io::Result<Vec<RawFrame>> {
        let mut out = Vec::with_capacity(count.min(self.available() as usize));
        let mem_end = self.front + self.mem.len() as u64;
        while out.len() < count && self.cursor < self.end() {
            if self.cursor < mem_end {
                out.push(self.mem[(self.cursor - self.front) as usize].clone());
            } else {
                let Some(f) = self.file.as_mut() else { break };
                out.push(f.read(self.cursor)?);
            }
            self.cursor += 1;
        }
        Ok(out)
    }

    /// Forgets every frame (the decoding session is gone; a new one emits them again).
    pub fn clear(&mut self) {
        let end = self.end();
        self.mem.clear();
        self.mem_bytes = 0;
        self.file = None;
        self.front = end;
        self.read_base = end;
        self.cursor = end;
    }

    fn peek_front(&mut self) -> io::Result<Option<RawFrame>> {
        if let Some(f) = self.mem.front() {
            return Ok(Some(f.clone()));
        }
        match self.file.as_mut() {
            Some(f) if f.count > 0 => f.read(f.first()).map(Some),
            _ => Ok(None),
        }
    }

    fn pop_front(&mut self) -> io::Result<()> {
        if let Some(f) = self.mem.pop_front() {
            self.mem_bytes -= f.data.len();
        } else if let Some(file) = self.file.as_mut() {
            file.pop_front()?;
            if file.count == 0 {
                // Emptied: new frames go to memory again.
                self.file = None;
            }
        }
        self.front += 1;
        Ok(())
    }
}

/// The commit LSN a Begin message carries (`B`, final LSN, commit time, xid).
fn begin_commit_lsn(data: &[u8]) -> Option<Lsn> {
    Some(Lsn(u64::from_be_bytes(data.get(1..9)?.try_into().ok()?)))
}

/// Where a unit of a decoding session's output starts, and the position that says whether a
/// confirm covers it: a transaction (its Begin) by its commit LSN, a message outside any
/// transaction by its own LSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKey {
    /// A transaction committing at this LSN.
    Transaction(Lsn),
    /// A message outside any transaction, its record ending at this LSN.
    Message(Lsn),
}

impl UnitKey {
    /// Whether a new decoding session started at `confirmed` would not emit the unit again.
    pub fn covered_by(self, confirmed: Lsn) -> bool {
        match self {
            UnitKey::Transaction(commit) => commit < confirmed,
            UnitKey::Message(lsn) => lsn <= confirmed,
        }
    }
}

/// The key of the unit `frame` starts, if it can start one (a Begin, or a message: one inside a
/// transaction never comes first in a stream of whole units).
pub fn unit_key(frame: &RawFrame) -> Option<UnitKey> {
    match frame.data.first() {
        Some(b'B') => begin_commit_lsn(&frame.data).map(UnitKey::Transaction),
        Some(b'M') => Some(UnitKey::Message(frame.lsn)),
        _ => None,
    }
}

/// Which frames a confirmed position covers, read from the front of a stream of a decoding
/// session's output: exactly those a new decoding session started at `confirmed` would not emit
/// again — a transaction whose commit record starts before `confirmed` (its Begin carries that
/// position), and a message outside any transaction whose record ends at or before it (its frame's
/// LSN). Frames are asked about in stream order, each once; the first frame not covered ends the
/// covered part (every later one is after it: transactions come out in commit order).
#[derive(Debug, Clone, Copy)]
pub struct Coverage {
    confirmed: Lsn,
    /// Inside a covered transaction (after its Begin, up to its Commit).
    in_covered: bool,
}

impl Coverage {
    /// The coverage of `confirmed`, from the start of a stream (outside any transaction).
    pub fn new(confirmed: Lsn) -> Coverage {
        Coverage { confirmed, in_covered: false }
    }

    /// Whether `frame`, the next in the stream, is covered.
    pub fn covers(&mut self, frame: &RawFrame) -> bool {
        let covered = self.in_covered || unit_key(frame).is_some_and(|key| key.covered_by(self.confirmed));
        if covered {
            match frame.data.first() {
                Some(b'B') => self.in_covered = true,
                Some(b'C') => self.in_covered = false,
                _ => {}
            }
        }
        covered
    }
}

impl SpillFile {
    fn create(dir: &std::path::Path, n: u64, first: u64) -> io::Result<SpillFile> {
        std::fs::create_dir_all(dir)?;
        // PostgreSQL removes files named pgsql_tmp* from its temporary directory at startup.
        let path = dir.join(format!("pgsql_tmp{}.cdc_spool.{n}", std::process::id()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
        // Unlinked at once: the file lives as long as the handle, and a crash leaves nothing.
        std::fs::remove_file(&path)?;
        Ok(SpillFile {
            file,
            pending: Vec::new(),
            written: 0,
            start: 0,
            count: 0,
            index: vec![(first, 0)],
            end: (first, 0),
            ahead: ReadAhead::default(),
        })
    }

    /// Absolute number of the first frame held.
    fn first(&self) -> u64 {
        self.end.0 - self.count
    }

    fn append(&mut self, at: u64, frame: &RawFrame) -> io::Result<()> {
        debug_assert_eq!(at, self.end.0);
        if at.is_multiple_of(INDEX_EVERY) && self.index.last().is_none_or(|&(n, _)| n < at) {
            self.index.push((at, self.end.1));
        }
        encode_frame(&mut self.pending, frame)?;
        self.end = (at + 1, self.end.1 + (HEADER + frame.data.len()) as u64);
        self.count += 1;
        if self.pending.len() >= IO_CHUNK {
            self.write_pending()?;
        }
        Ok(())
    }

    fn write_pending(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            self.file.write_all_at(&self.pending, self.written)?;
            self.written += self.pending.len() as u64;
            self.pending.clear();
        }
        Ok(())
    }

    /// `len` bytes at `offset`.
    fn bytes(&mut self, offset: u64, len: usize) -> io::Result<&[u8]> {
        if offset + len as u64 > self.written {
            self.write_pending()?;
        }
        self.ahead.bytes(&self.file, offset, len, self.written)
    }

    /// Where frame `n` starts: from the nearest indexed frame, reading frame headers forward.
    fn offset_of(&mut self, n: u64) -> io::Result<u64> {
        let i = self.index.partition_point(|&(m, _)| m <= n);
        let (mut m, mut offset) = self.index[i.saturating_sub(1)];
        while m < n {
            let (_, len) = decode_header(self.bytes(offset, HEADER)?);
            offset += (HEADER + len) as u64;
            m += 1;
        }
        Ok(offset)
    }

    /// Frame `n` (held in the file).
    fn read(&mut self, n: u64) -> io::Result<RawFrame> {
        let offset = if n == self.first() { self.start } else { self.offset_of(n)? };
        let (lsn, len) = decode_header(self.bytes(offset, HEADER)?);
        let data = self.bytes(offset + HEADER as u64, len)?.to_vec();
        Ok(RawFrame { lsn, data })
    }

    fn pop_front(&mut self) -> io::Result<()> {
        let (_, len) = decode_header(self.bytes(self.start, HEADER)?);
        self.start += (HEADER + len) as u64;
        self.count -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("cdc_spool_test_{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn frame(kind: u8, lsn: u64, commit: u64, pad: usize) -> RawFrame {
        let mut data = vec![kind];
        data.extend_from_slice(&commit.to_be_bytes());
        data.resize(data.len() + pad, b'.');
        RawFrame { lsn: Lsn(lsn), data }
    }

    /// A transaction of `changes` inserts committing at `commit`, ending at `commit + 10`.
    fn txn(commit: u64, changes: usize, pad: usize) -> Vec<RawFrame> {
        let mut v = vec![frame(b'B', commit - 100, commit, 12)];
        for i in 0..changes {
            v.push(frame(b'I', commit - 99 + i as u64, 0, pad));
        }
        v.push(frame(b'C', commit + 10, commit, 17));
        v
    }

    fn fill(s: &mut Spool, frames: &[RawFrame]) {
        for f in frames {
            s.push(f.clone()).unwrap();
        }
    }

    fn all(s: &mut Spool) -> Vec<RawFrame> {
        s.fetch(usize::MAX).unwrap()
    }

    #[test]
    fn frames_come_back_in_order_from_memory_and_file_alike() {
        for limit in [usize::MAX, 0, 1000] {
            let mut s = Spool::new(limit, dir());
            let frames: Vec<RawFrame> = (1..=5).flat_map(|t| txn(t * 1000, 300, 40)).collect();
            fill(&mut s, &frames);
            s.begin_read(Lsn(0)).unwrap();
            assert_eq!(s.fetch(7).unwrap(), frames[..7].to_vec(), "limit {limit}");
            assert_eq!(all(&mut s), frames[7..].to_vec(), "limit {limit}");
            assert_eq!(s.position(), frames.len() as u64);
            assert!(s.fetch(10).unwrap().is_empty());
            if limit == 0 {
                assert_eq!(s.memory_bytes(), 0);
                assert!(s.spilled_bytes() > 0);
            }
        }
    }

    #[test]
    fn seek_back_reads_again_from_any_frame() {
        for limit in [usize::MAX, 0, 5000] {
            let mut s = Spool::new(limit, dir());
            let frames = txn(5000, 2000, 30);
            fill(&mut s, &frames);
            s.begin_read(Lsn(0)).unwrap();
            all(&mut s);
            for p in [0usize, 1, 255, 256, 257, 1023, 1999, 2001] {
                s.seek(p as u64);
                assert_eq!(s.fetch(3).unwrap(), frames[p..(p + 3).min(frames.len())].to_vec(), "{limit} {p}");
            }
        }
    }

    #[test]
    fn begin_read_drops_what_the_confirm_covers_and_keeps_the_rest() {
        for limit in [usize::MAX, 0, 400] {
            let mut s = Spool::new(limit, dir());
            let (a, b, c) = (txn(1000, 3, 10), txn(2000, 3, 10), txn(3000, 3, 10));
            // A heartbeat message outside any transaction, its record ending at 2500.
            let hb = frame(b'M', 2500, 0, 5);
            fill(&mut s, &a);
            fill(&mut s, &b);
            s.push(hb.clone()).unwrap();
            fill(&mut s, &c);
            s.begin_read(Lsn(0)).unwrap();
            all(&mut s);
            // Confirmed to the end of b: a and b go, the heartbeat and c stay.
            s.begin_read(Lsn(2010)).unwrap();
            let mut rest = vec![hb.clone()];
            rest.extend(c.clone());
            assert_eq!(all(&mut s), rest, "limit {limit}");
            // Confirmed to the heartbeat: only c stays, read from 0 again.
            s.begin_read(Lsn(2500)).unwrap();
            assert_eq!(s.position(), 0);
            assert_eq!(all(&mut s), c, "limit {limit}");
            // Nothing confirmed since: c again.
            s.begin_read(Lsn(2500)).unwrap();
            assert_eq!(all(&mut s), c);
            s.begin_read(Lsn(3010)).unwrap();
            assert!(s.is_empty());
            assert_eq!(s.spilled_bytes(), 0);
            // Empty again: new frames are held in memory again.
            fill(&mut s, &txn(4000, 1, 1));
            if limit > 0 {
                assert!(s.memory_bytes() > 0);
            }
        }
    }

    #[test]
    fn a_read_begun_on_an_empty_spool_drops_the_covered_frames_a_new_session_pushes() {
        let (a, b, c) = (txn(1000, 3, 10), txn(2000, 3, 10), txn(3000, 3, 10));
        let hb = frame(b'M', 2500, 0, 5);
        // A session started anew at the slot's position (0) emits a and b again, which the sink
        // delivered up to 2010 and has not confirmed: only the heartbeat and c are read.
        let mut s = Spool::new(usize::MAX, dir());
        s.begin_read(Lsn(2010)).unwrap();
        fill(&mut s, &a);
        fill(&mut s, &b);
        s.push(hb.clone()).unwrap();
        fill(&mut s, &c);
        let mut rest = vec![hb.clone()];
        rest.extend(c.clone());
        assert_eq!(all(&mut s), rest);
        // Once a frame was not covered, a later one that would be is kept (it cannot come from a
        // session reading on, and dropping it would lose it).
        let mut s = Spool::new(usize::MAX, dir());
        s.begin_read(Lsn(2010)).unwrap();
        fill(&mut s, &c);
        fill(&mut s, &a);
        let mut both = c.clone();
        both.extend(a.clone());
        assert_eq!(all(&mut s), both);
        // A spool holding frames after the position drops nothing pushed later.
        let mut s = Spool::new(usize::MAX, dir());
        fill(&mut s, &c);
        s.begin_read(Lsn(2010)).unwrap();
        fill(&mut s, &a);
        assert_eq!(all(&mut s), both);
    }

    #[test]
    fn released_frames_leave_memory_and_the_rest_reads_on() {
        let mut s = Spool::new(usize::MAX, dir());
        let (a, b) = (txn(1000, 50, 100), txn(2000, 50, 100));
        fill(&mut s, &a);
        fill(&mut s, &b);
        s.begin_read(Lsn(0)).unwrap();
        let before = s.memory_bytes();
        assert_eq!(s.fetch(a.len()).unwrap(), a);
        s.release_before(a.len() as u64).unwrap();
        assert!(s.memory_bytes() < before);
        assert_eq!(s.position(), a.len() as u64);
        s.seek(a.len() as u64 + 1);
        assert_eq!(s.fetch(1).unwrap(), vec![b[1].clone()]);
        // Not confirmed: b comes again in the next read.
        s.begin_read(Lsn(1010)).unwrap();
        assert_eq!(all(&mut s), b);
        // A frame not fetched yet is never released.
        s.seek(2);
        s.release_before(10_000).unwrap();
        assert_eq!(s.len(), b.len() as u64 - 2);
        assert_eq!(all(&mut s), b[2..].to_vec());
    }

    #[test]
    fn reads_that_release_as_they_go_resume_at_a_begin_whatever_spills() {
        for limit in [usize::MAX, 0, 700, 2000, 5000] {
            let mut s = Spool::new(limit, dir());
            let txns: Vec<Vec<RawFrame>> = (1..=40).map(|t| txn(t * 1000, (t as usize % 7) + 1, 300)).collect();
            let mut next = 0;
            let mut confirmed = Lsn(0);
            while next < txns.len() {
                // Some transactions are decoded before each read, some during it.
                for t in txns.iter().skip(next).take(3) {
                    fill(&mut s, t);
                }
                s.begin_read(confirmed).unwrap();
                let first = s.fetch(1).unwrap();
                assert_eq!(first[0].data[0], b'B', "limit {limit}: a read starts at a Begin; got {:?} at {:?}, confirmed {confirmed:?}, next {next}, len {}", first[0].data[0] as char, first[0].lsn, s.len());
                let mut seen = first;
                // Read like deliver::read: in chunks, releasing at each Commit.
                loop {
                    let chunk = s.fetch(4).unwrap();
                    if chunk.is_empty() {
                        break;
                    }
                    for f in chunk {
                        let commit = f.data[0] == b'C';
                        seen.push(f);
                        if commit {
                            s.release_before(s.position()).unwrap();
                        }
                    }
                }
                // Confirm what was released (the port's contract: released rows are delivered).
                let commits: Vec<&RawFrame> = seen.iter().filter(|f| f.data[0] == b'C').collect();
                confirmed = commits[commits.len() - 1].lsn;
                let delivered = seen.iter().filter(|f| f.data[0] == b'C' && f.lsn <= confirmed).count();
                next += delivered;
                if next < txns.len() && s.is_empty() {
                    continue;
                }
            }
        }
    }

    #[test]
    fn clear_forgets_everything() {
        let mut s = Spool::new(0, dir());
        fill(&mut s, &txn(1000, 10, 10));
        s.clear();
        s.begin_read(Lsn(0)).unwrap();
        assert!(s.is_empty() && all(&mut s).is_empty());
        let t = txn(2000, 2, 2);
        fill(&mut s, &t);
        assert_eq!(s.available(), t.len() as u64);
        assert_eq!(all(&mut s), t);
    }
}
