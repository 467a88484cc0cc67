//! The decoded log of a group: what the group's decoding session emitted, in files every member
//! reads at its own pace.
//!
//! ```text
//!  <dir>/start                 the group slot's confirmed position when the session opened
//!  <dir>/0000000000000000.seg  header (magic, the first frame's unit key), then frames
//!  <dir>/0000000000000001.seg  … a new segment starts at a unit (a Begin, or a message outside a
//!                              transaction) once the current one holds SEGMENT_BYTES
//!  <dir>/relations             every Relation and Type frame with where it was written
//! ```
//! One writer (the decoder) appends and publishes how far readers may read ([`LogEnd`], kept in
//! shared memory by the caller); it writes a frame's bytes before it publishes them, and a segment
//! is never written again once the next one exists. Readers (the sink workers) read with `pread`
//! up to the published end and never write. The files are a cache of the group slot: a decoder
//! that starts again writes a new log (in a new directory) from the slot's confirmed position, and
//! its members start reading it again from their own.
//!
//! A reader starts at the last segment whose first unit its confirmed position covers (every unit
//! before it is covered too: units come out in commit order), or at the first segment when the log
//! started at or before that position; it is handed the last Relation and Type frames written
//! before that segment, so it knows every table's columns without the frames it skips. The writer removes a
//! segment once the next one's first unit is covered by every member's position ([`LogWriter::trim`]).
use std::collections::{BTreeSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::deliver::spool::{self, encode_frame, unit_key, ReadAhead, UnitKey, IO_CHUNK};
use crate::frame::RawFrame;
use crate::Lsn;

/// The first bytes of a segment.
const MAGIC: &[u8; 8] = b"CDCLOG01";

/// A segment's header: [`MAGIC`], the kind of its first unit (`B` or `M`), that unit's key (LE).
pub const SEGMENT_HEADER: u64 = 17;

/// A frame in a segment, as in a spill file (see [`spool::HEADER`]).
const FRAME_HEADER: u64 = spool::HEADER as u64;

/// A record of the relations file: segment (8), offset (8), then a frame as in a segment.
const RELATION_HEADER: usize = 16 + FRAME_HEADER as usize;

/// A segment holds about this many bytes before the next unit starts a new one.
pub const SEGMENT_BYTES: u64 = 16 << 20;

const START_FILE: &str = "start";
const RELATIONS_FILE: &str = "relations";

/// How far the writer has published: a reader reads segments before `segment` whole and
/// `segment` up to `bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct LogEnd {
    /// The segment being written.
    pub segment: u64,
    /// Its bytes a reader may read (its header included; 0 before its first frame).
    pub bytes: u64,
}

fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("{n:016x}.seg"))
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn header(key: UnitKey) -> Vec<u8> {
    let (kind, lsn) = match key {
        UnitKey::Transaction(l) => (b'B', l),
        UnitKey::Message(l) => (b'M', l),
    };
    let mut h = MAGIC.to_vec();
    h.push(kind);
    h.extend_from_slice(&lsn.0.to_le_bytes());
    h
}

fn parse_header(h: &[u8]) -> Option<UnitKey> {
    if h.len() < SEGMENT_HEADER as usize || &h[..8] != MAGIC {
        return None;
    }
    let lsn = Lsn(u64::from_le_bytes(h[9..17].try_into().ok()?));
    match h[8] {
        b'B' => Some(UnitKey::Transaction(lsn)),
        b'M' => Some(UnitKey::Message(lsn)),
        _ => None,
    }
}

/// The end LSN a Commit carries (`C`, flags, commit LSN, end LSN, time).
fn commit_end_lsn(data: &[u8]) -> Option<Lsn> {
    Some(Lsn(u64::from_be_bytes(data.get(10..18)?.try_into().ok()?)))
}

/// The tables a change frame touches, if it is one (an insert, update, delete or truncate).
pub(super) fn change_tables(data: &[u8]) -> Option<ChangeTables<'_>> {
    let count = |d: &[u8]| d.get(1..5).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    match data.first()? {
        b'I' | b'U' | b'D' => Some(ChangeTables { data, first: 1, count: 1 }),
        // `T`, the number of relations, options, the relations.
        b'T' => Some(ChangeTables { data, first: 6, count: count(data) }),
        _ => None,
    }
}

/// The tables of one change frame, read from the frame where they are (no copy: one per change).
#[derive(Debug, Clone, Copy)]
pub(super) struct ChangeTables<'a> {
    data: &'a [u8],
    first: usize,
    count: usize,
}

impl ChangeTables<'_> {
    /// Their OIDs (those the frame holds: a truncated frame gives fewer).
    pub(super) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.count).map_while(|i| {
            let at = self.first + 4 * i;
            self.data.get(at..at + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        })
    }
}

/// What the frames appended between two [`LogWriter::take_touched`] carry for members: whose
/// changes, and whether a message (a message goes to every member).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    /// The tables with a change (insert, update, delete, truncate).
    pub tables: BTreeSet<u32>,
    /// A logical decoding message (in a transaction or not).
    pub message: bool,
}

impl Touched {
    /// Whether a member carrying `carried` (every table when `None`) gets something from it.
    pub fn concerns(&self, carried: Option<&[u32]>) -> bool {
        self.message
            || match carried {
                None => !self.tables.is_empty(),
                Some(c) => c.iter().any(|t| self.tables.contains(t)),
            }
    }

    /// Whether nothing was touched.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty() && !self.message
    }
}

/// The writing side of a log: the decoder's.
#[derive(Debug)]
pub struct LogWriter {
    dir: PathBuf,
    /// The segment being written (none before the first frame).
    file: Option<File>,
    segment: u64,
    /// Bytes of it in the file, and those not written yet.
    written: u64,
    pending: Vec<u8>,
    /// The first unit of each segment on disk, oldest first.
    segments: VecDeque<(u64, UnitKey)>,
    relations: File,
    relations_written: u64,
    relations_pending: Vec<u8>,
    /// Inside a transaction (after its Begin).
    in_transaction: bool,
    /// Every unit that commits before this position is in the log.
    complete_to: Lsn,
    published: LogEnd,
    /// A new segment starts at the first unit once the current one holds this many bytes.
    segment_bytes: u64,
    touched: Touched,
}

impl LogWriter {
    /// A new, empty log in `dir` (what was there is removed), for a decoding session that started
    /// at the group slot's confirmed position `start`; segments of about `segment_bytes`
    /// ([`SEGMENT_BYTES`]).
    pub fn create(dir: impl Into<PathBuf>, start: Lsn, segment_bytes: u64) -> io::Result<LogWriter> {
        let dir = dir.into();
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        fs::create_dir_all(&dir)?;
        let relations = OpenOptions::new().create(true).truncate(true).write(true).open(dir.join(RELATIONS_FILE))?;
        // Written last, under its final name only once whole: a reader finds no log without it.
        let tmp = dir.join("start.tmp");
        fs::write(&tmp, start.0.to_le_bytes())?;
        fs::rename(&tmp, dir.join(START_FILE))?;
        Ok(LogWriter {
            dir,
            file: None,
            segment: 0,
            written: 0,
            pending: Vec::new(),
            segments: VecDeque::new(),
            relations,
            relations_written: 0,
            relations_pending: Vec::new(),
            in_transaction: false,
            complete_to: start,
            published: LogEnd::default(),
            segment_bytes,
            touched: Touched::default(),
        })
    }

    /// Appends a frame of the decoding session's output (readers see it after [`LogWriter::publish`]).
    pub fn append(&mut self, frame: &RawFrame) -> io::Result<()> {
        let starts = if self.in_transaction { None } else { unit_key(frame) };
        let full = self.written + self.pending.len() as u64 >= self.segment_bytes;
        match starts {
            Some(key) if self.file.is_none() || full => self.start_segment(key)?,
            None if self.file.is_none() => {
                let tag = frame.data.first().map(|&b| b as char);
                return Err(invalid(format!("a log cannot start with a {tag:?} frame")));
            }
            _ => {}
        }
        let offset = self.written + self.pending.len() as u64;
        match frame.data.first() {
            Some(b'R' | b'Y') => {
                self.relations_pending.extend_from_slice(&self.segment.to_le_bytes());
                self.relations_pending.extend_from_slice(&offset.to_le_bytes());
                encode_frame(&mut self.relations_pending, frame)?;
            }
            Some(b'B') => self.in_transaction = true,
            Some(b'C') => {
                self.in_transaction = false;
                if let Some(end) = commit_end_lsn(&frame.data) {
                    self.complete_to = self.complete_to.max(end);
                }
            }
            Some(b'M') => {
                self.touched.message = true;
                if !self.in_transaction {
                    self.complete_to = self.complete_to.max(frame.lsn);
                }
            }
            _ => {
                if let Some(tables) = change_tables(&frame.data) {
                    self.touched.tables.extend(tables.iter());
                }
            }
        }
        encode_frame(&mut self.pending, frame)?;
        if self.pending.len() >= IO_CHUNK {
            self.write_pending()?;
        }
        Ok(())
    }

    fn start_segment(&mut self, key: UnitKey) -> io::Result<()> {
        if self.file.is_some() {
            self.write_pending()?;
            self.segment += 1;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(segment_path(&self.dir, self.segment))?;
        self.file = Some(file);
        self.written = 0;
        self.pending = header(key);
        self.segments.push_back((self.segment, key));
        Ok(())
    }

    fn write_pending(&mut self) -> io::Result<()> {
        if let Some(f) = &self.file {
            if !self.pending.is_empty() {
                f.write_all_at(&self.pending, self.written)?;
                self.written += self.pending.len() as u64;
                self.pending.clear();
            }
        }
        Ok(())
    }

    /// Writes what was appended and returns how far readers may now read: the relations first,
    /// so a reader that starts after a frame finds the Relation frames before it.
    pub fn publish(&mut self) -> io::Result<LogEnd> {
        if !self.relations_pending.is_empty() {
            self.relations.write_all_at(&self.relations_pending, self.relations_written)?;
            self.relations_written += self.relations_pending.len() as u64;
            self.relations_pending.clear();
        }
        self.write_pending()?;
        if self.file.is_some() {
            self.published = LogEnd { segment: self.segment, bytes: self.written };
        }
        Ok(self.published)
    }

    /// The tables changed, and whether a message came, in the frames appended since the last call
    /// (the decoder wakes the members they concern once it published them).
    pub fn take_touched(&mut self) -> Touched {
        std::mem::take(&mut self.touched)
    }

    /// What the last [`LogWriter::publish`] returned.
    pub fn published(&self) -> LogEnd {
        self.published
    }

    /// Every transaction committing before this position, and every message outside a transaction
    /// at or before it, is in the log (appended; published with the next publish): a member may
    /// count itself delivered up to here when none of it was for its tables.
    pub fn complete_to(&self) -> Lsn {
        self.complete_to
    }

    /// Removes the segments no reader needs once every member's position is at or past
    /// `confirmed`: those before the last segment whose first unit `confirmed` covers. Returns
    /// how many were removed. The segment being written stays.
    pub fn trim(&mut self, confirmed: Lsn) -> io::Result<usize> {
        let mut removed = 0;
        while self.segments.len() >= 2 && self.segments[1].1.covered_by(confirmed) {
            let Some((n, _)) = self.segments.pop_front() else { break };
            match fs::remove_file(segment_path(&self.dir, n)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => removed += 1,
            }
        }
        Ok(removed)
    }

    /// Segments on disk (the one being written included).
    pub fn segments(&self) -> usize {
        self.segments.len()
    }
}

/// Where a reader of a log starts.
#[derive(Debug)]
pub enum Start {
    /// From this segment's first frame; with the last Relation and Type frame of each table and
    /// type written before it.
    At(LogReader, Vec<RawFrame>),
    /// The log no longer holds what comes after the position (or never did: it started after it).
    Behind,
    /// No log there (yet).
    Missing,
}

/// The reading side of a log: one member's.
#[derive(Debug)]
pub struct LogReader {
    dir: PathBuf,
    segment: u64,
    file: Option<File>,
    /// Where the next frame starts in the segment.
    offset: u64,
    /// The segment's length once it is known to be complete.
    complete_len: Option<u64>,
    ahead: ReadAhead,
}

impl LogReader {
    /// Where a member whose position is `confirmed` starts reading the log in `dir`, of which the
    /// writer published up to `end`.
    pub fn open(dir: impl Into<PathBuf>, confirmed: Lsn, end: LogEnd) -> io::Result<Start> {
        let dir = dir.into();
        let start = match fs::read(dir.join(START_FILE)) {
            Ok(b) => Lsn(u64::from_le_bytes(
                b.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(|| invalid("a short start file".into()))?,
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Start::Missing),
            Err(e) => return Err(e),
        };
        // The published segments still on disk, with their first units.
        let mut segments: Vec<(u64, UnitKey)> = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name();
            let Some(n) =
                name.to_str().and_then(|s| s.strip_suffix(".seg")).and_then(|s| u64::from_str_radix(s, 16).ok())
            else {
                continue;
            };
            if n > end.segment || (n == end.segment && end.bytes < SEGMENT_HEADER) {
                continue;
            }
            let mut h = [0u8; SEGMENT_HEADER as usize];
            match File::open(segment_path(&dir, n)).and_then(|f| f.read_exact_at(&mut h, 0)) {
                Ok(()) => {}
                // Removed by the writer meanwhile: no reader needs it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            let key = parse_header(&h).ok_or_else(|| invalid(format!("segment {n:016x} has no valid header")))?;
            segments.push((n, key));
        }
        segments.sort_unstable_by_key(|&(n, _)| n);
        let from = match segments.iter().rposition(|&(_, key)| key.covered_by(confirmed)) {
            Some(i) => segments[i].0,
            // Nothing covered: every unit in the log is after the position, so the log serves it
            // only if it holds everything after it (it started at or before it, and lost nothing).
            None if confirmed >= start && segments.first().is_none_or(|&(n, _)| n == 0) => 0,
            None => return Ok(Start::Behind),
        };
        let relations = relations_before(&dir, from)?;
        let reader = LogReader {
            dir,
            segment: from,
            file: None,
            offset: SEGMENT_HEADER,
            complete_len: None,
            ahead: ReadAhead::default(),
        };
        Ok(Start::At(reader, relations))
    }

    /// Whether every frame published up to `end` was read.
    pub fn caught_up(&self, end: LogEnd) -> bool {
        self.segment > end.segment || (self.segment == end.segment && self.offset + FRAME_HEADER > end.bytes)
    }

    /// Up to `max` frames after the last one read, up to `end`.
    pub fn read(&mut self, end: LogEnd, max: usize) -> io::Result<Vec<RawFrame>> {
        let mut out = VecDeque::new();
        self.read_into(end, max, &mut out, &mut Vec::new())?;
        Ok(out.into())
    }

    /// [`LogReader::read`] onto the back of `out`, the frames' bytes copied into buffers taken from
    /// `spare` (emptied first) while it has any: a reader that drops most frames it reads (a
    /// member's feed, the changes of tables it does not carry) hands their buffers back instead of
    /// allocating one per frame.
    pub fn read_into(
        &mut self,
        end: LogEnd,
        max: usize,
        out: &mut VecDeque<RawFrame>,
        spare: &mut Vec<Vec<u8>>,
    ) -> io::Result<()> {
        let mut read = 0;
        while read < max {
            if self.segment > end.segment {
                break;
            }
            let limit = if self.segment == end.segment {
                end.bytes
            } else {
                match self.complete_len {
                    Some(l) => l,
                    None => {
                        let l = self.file()?.metadata()?.len();
                        self.complete_len = Some(l);
                        l
                    }
                }
            };
            if self.offset + FRAME_HEADER > limit {
                if self.segment == end.segment {
                    break;
                }
                if self.offset != limit {
                    return Err(invalid(format!("segment {:016x} ends inside a frame", self.segment)));
                }
                self.segment += 1;
                self.file = None;
                self.offset = SEGMENT_HEADER;
                self.complete_len = None;
                self.ahead.clear();
                continue;
            }
            let (lsn, len) = spool::decode_header(self.bytes(self.offset, FRAME_HEADER as usize, limit)?);
            let len = len as u64;
            if self.offset + FRAME_HEADER + len > limit {
                return Err(invalid(format!("a frame of segment {:016x} goes past what was published", self.segment)));
            }
            let mut data = spare.pop().unwrap_or_default();
            data.clear();
            data.extend_from_slice(self.bytes(self.offset + FRAME_HEADER, len as usize, limit)?);
            self.offset += FRAME_HEADER + len;
            out.push_back(RawFrame { lsn, data });
            read += 1;
        }
        Ok(())
    }

    fn file(&mut self) -> io::Result<&File> {
        if self.file.is_none() {
            let file = File::open(segment_path(&self.dir, self.segment)).map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("segment {:016x} was trimmed before this reader reached it", self.segment),
                ),
                _ => e,
            })?;
            self.file = Some(file);
        }
        self.file.as_ref().ok_or_else(|| invalid("no segment".into()))
    }

    /// `len` bytes at `offset` of the current segment, which holds at least `limit` bytes.
    fn bytes(&mut self, offset: u64, len: usize, limit: u64) -> io::Result<&[u8]> {
        self.file()?;
        let Some(file) = self.file.as_ref() else { return Err(invalid("no segment".into())) };
        self.ahead.bytes(file, offset, len, limit)
    }
}

/// Whether a reader's error says the log no longer holds what the reader reads next: the writer
/// trimmed a segment the reader had not reached (the writer's caller trims past a member that lags
/// too far behind). The reader's member then reads from elsewhere; nothing is wrong with the log.
pub fn trimmed_under(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

/// The Relation and Type frames written before segment `from`: the last of each table and type,
/// in the order they were last written.
fn relations_before(dir: &Path, from: u64) -> io::Result<Vec<RawFrame>> {
    let bytes = match fs::read(dir.join(RELATIONS_FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let mut described = Vec::new();
    let mut at = 0;
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or_default());
    // A record cut short is one being written: it is after every published frame.
    while at + RELATION_HEADER <= bytes.len() {
        let (segment, lsn) = (u64_at(at), Lsn(u64_at(at + 16)));
        let len = u32::from_le_bytes(bytes[at + 24..at + 28].try_into().unwrap_or_default()) as usize;
        let data_at = at + RELATION_HEADER;
        if data_at + len > bytes.len() || segment >= from {
            break;
        }
        describe(&mut described, RawFrame { lsn, data: bytes[data_at..data_at + len].to_vec() });
        at = data_at + len;
    }
    Ok(described)
}

/// Adds a Relation or Type frame to `described`, in place of an earlier one of the same table or
/// type (the last description is the one that holds), at the end.
pub(super) fn describe(described: &mut Vec<RawFrame>, frame: RawFrame) {
    let key = |f: &RawFrame| (f.data.first().copied(), f.data.get(1..5).map(<[u8]>::to_vec));
    let k = key(&frame);
    described.retain(|f| key(f) != k);
    described.push(frame);
}
