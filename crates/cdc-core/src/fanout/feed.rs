//! One member's feed from its group's log: the frames a decoding session of its own would have
//! emitted for it.
//!
//! The group's session hands every table of the publications to pgoutput; a sink's own session
//! hands only the sink's tables (and their lookup tables), and pgoutput then leaves out a
//! transaction with nothing for them, Begin and Commit included. The feed does the same to the
//! log: it skips what the member's position covers, drops the changes of tables it does not
//! carry, and holds a transaction's Begin (and an Origin frame after it) until the transaction
//! has something for the member — a change it carries or a message — so a transaction with
//! nothing for it leaves nothing. Messages go to every member, as they do from pgoutput.
//!
//! Descriptions (Relation and Type frames) go out as pgoutput sends them on a session of the
//! member's own: a table's last description right before the member's first change of it since
//! that description, whenever the log had it (before the member's position, in a transaction the
//! member did not get, or in the log's relations file for what was trimmed). So a member that
//! starts reading mid-log, or starts carrying a table later, always knows the columns of what it
//! gets. What comes out is pushed into the member's spool and read as before.
use std::collections::{HashSet, VecDeque};
use std::io;
use std::path::PathBuf;

use super::log::{change_tables, describe, ChangeTables, LogEnd, LogReader, Start};
use crate::deliver::spool::Coverage;
use crate::frame::RawFrame;
use crate::Lsn;

/// Where the feed is in the log's stream of transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Between units.
    Outside,
    /// In a transaction with nothing for the member so far (its frames are held).
    Holding,
    /// In a transaction that has something for the member (its frames go out).
    Passing,
}

/// A member's reader of its group's log, filtered for its tables.
#[derive(Debug)]
pub struct Feed {
    reader: LogReader,
    /// The last description of every table and type the log had so far.
    described: Vec<RawFrame>,
    /// Tables (`R`, OID) and types (`Y`, OID) whose last description the member got.
    given: HashSet<(u8, u32)>,
    /// What the member's position covers, until the first frame it does not.
    coverage: Option<Coverage>,
    carried: Option<HashSet<u32>>,
    place: Place,
    held: Vec<RawFrame>,
    /// Frames read from the log and not taken yet (a pull that stopped at a Commit).
    pending: VecDeque<RawFrame>,
    skipped: u64,
    /// The furthest WAL position of a log frame past the member's position it read.
    furthest: Lsn,
    /// WAL the log frames it read since the last count moved it over (see [`Feed::take_wal_passed`]).
    passed: u64,
    /// Buffers of frames it dropped, for the next frames it reads (see [`LogReader::read_into`]).
    spare: Vec<Vec<u8>>,
}

/// Log frames a feed reads at a time: its spare buffers serve a read of this many whole.
const READ_FRAMES: usize = 256;

/// The most spare buffers a feed keeps, and the largest it keeps (a frame larger than that is
/// rare: a row's change; its buffer is freed). At most 512 KiB per member.
const SPARE_BUFFERS: usize = 2 * READ_FRAMES;
const SPARE_BYTES: usize = 1024;

/// A frame the member gets, in a buffer no larger than about twice its bytes: it may have been
/// read into a spare buffer of a larger frame, and the member's spool counts frames by their
/// bytes, not by what their buffers hold.
fn fitted(mut frame: RawFrame) -> RawFrame {
    if frame.data.capacity() > 2 * frame.data.len() + 64 {
        frame.data.shrink_to_fit();
    }
    frame
}

/// What opening a feed found.
#[derive(Debug)]
pub enum Opened {
    /// A feed from the member's position.
    Feed(Box<Feed>),
    /// The log does not hold what comes after the position: the member reads its own slot.
    Behind,
    /// There is no log (the group's decoder has not written one yet).
    Missing,
}

impl Feed {
    /// A feed of the log in `dir` (published up to `end`) from `confirmed`, the member's position,
    /// carrying the tables `carried` (every table when `None`).
    pub fn open(
        dir: impl Into<PathBuf>,
        confirmed: Lsn,
        end: LogEnd,
        carried: Option<HashSet<u32>>,
    ) -> io::Result<Opened> {
        Ok(match LogReader::open(dir, confirmed, end)? {
            Start::At(reader, described) => Opened::Feed(Box::new(Feed {
                reader,
                described,
                given: HashSet::new(),
                coverage: Some(Coverage::new(confirmed)),
                carried,
                place: Place::Outside,
                held: Vec::new(),
                pending: VecDeque::new(),
                skipped: 0,
                furthest: confirmed,
                passed: 0,
                spare: Vec::new(),
            })),
            Start::Behind => Opened::Behind,
            Start::Missing => Opened::Missing,
        })
    }

    /// The tables whose changes the member gets from now on (`None`: every table).
    pub fn carry_only(&mut self, tables: Option<HashSet<u32>>) {
        self.carried = tables;
    }

    /// Whether the last frame handed out is inside a transaction (its Commit comes later): a read
    /// must not end there, as a session's never does (it emits a transaction whole).
    pub fn mid_transaction(&self) -> bool {
        self.place == Place::Passing
    }

    /// Whether every frame published up to `end` was read.
    pub fn caught_up(&self, end: LogEnd) -> bool {
        self.pending.is_empty() && self.reader.caught_up(end)
    }

    /// Changes of tables the member does not carry dropped since the last call.
    pub fn take_skipped(&mut self) -> u64 {
        std::mem::take(&mut self.skipped)
    }

    /// WAL bytes the log frames it read moved it over since the last call: from its position at
    /// the open to the furthest frame read (every table's, before its filter). What a session of
    /// its own would have decoded to get the same frames, about: the rate of its events per WAL
    /// byte, behind `cdc_metrics`' `lag_events`, takes it as the WAL the member read.
    pub fn take_wal_passed(&mut self) -> u64 {
        std::mem::take(&mut self.passed)
    }

    /// The member's frames among the next `max` frames of the log, up to `end`.
    pub fn pull(&mut self, end: LogEnd, max: usize) -> io::Result<Vec<RawFrame>> {
        self.pull_until(end, max, false)
    }

    /// The rest of the transaction the last pull stopped inside of (see
    /// [`Feed::mid_transaction`]): the member's frames up to its Commit, reading at most `max`
    /// frames of the log; nothing past that Commit is taken, so a read ends where a session's
    /// would, however large the transactions after it.
    pub fn finish_transaction(&mut self, end: LogEnd, max: usize) -> io::Result<Vec<RawFrame>> {
        self.pull_until(end, max, true)
    }

    fn pull_until(&mut self, end: LogEnd, max: usize, to_commit: bool) -> io::Result<Vec<RawFrame>> {
        let mut out = Vec::new();
        // Read in chunks, each frame's buffer handed back before the next chunk is read.
        let mut budget = max;
        loop {
            if self.pending.is_empty() {
                if budget == 0 {
                    break;
                }
                self.reader.read_into(end, budget.min(READ_FRAMES), &mut self.pending, &mut self.spare)?;
                if self.pending.is_empty() {
                    break;
                }
                budget = budget.saturating_sub(self.pending.len());
            }
            let Some(frame) = self.pending.pop_front() else { break };
            if let Some(coverage) = self.coverage.as_mut() {
                if coverage.covers(&frame) {
                    // A description among the covered frames still holds for what follows.
                    if description_key(&frame).is_some() {
                        self.note_description(frame);
                    } else {
                        self.recycle(frame);
                    }
                    continue;
                }
                self.coverage = None;
            }
            if frame.lsn > self.furthest {
                self.passed += frame.lsn.0 - self.furthest.0;
                self.furthest = frame.lsn;
            }
            self.take(frame, &mut out);
            if to_commit && !self.mid_transaction() {
                break;
            }
        }
        Ok(out)
    }

    /// Keeps a Relation or Type frame as its table's or type's last description (the member gets
    /// it before its next change of that table); other frames are left alone. Whether it was one.
    fn note_description(&mut self, frame: RawFrame) -> bool {
        let Some(key) = description_key(&frame) else { return false };
        self.given.remove(&key);
        describe(&mut self.described, frame);
        true
    }

    /// Puts out the last description of each of `tables` the member has not got yet, after those
    /// of the types it has not got (a table's columns may be of them), at `lsn`: the position of
    /// the change they come before, as pgoutput stamps a description it sends.
    fn give_descriptions(&mut self, tables: ChangeTables<'_>, lsn: Lsn, out: &mut Vec<RawFrame>) {
        if tables.iter().all(|t| self.given.contains(&(b'R', t))) {
            return;
        }
        let mut wanted: Vec<(u8, u32)> =
            self.described.iter().filter_map(description_key).filter(|k| k.0 == b'Y').collect();
        wanted.extend(tables.iter().map(|t| (b'R', t)));
        for key in wanted {
            if self.given.contains(&key) {
                continue;
            }
            if let Some(frame) = self.described.iter().find(|f| description_key(f) == Some(key)) {
                out.push(RawFrame { lsn, data: frame.data.clone() });
                self.given.insert(key);
            }
        }
    }

    fn carries(&self, oid: u32) -> bool {
        self.carried.as_ref().is_none_or(|c| c.contains(&oid))
    }

    fn take(&mut self, frame: RawFrame, out: &mut Vec<RawFrame>) {
        let tag = frame.data.first().copied();
        match (self.place, tag) {
            (Place::Outside, Some(b'B')) => {
                self.place = Place::Holding;
                self.held.push(frame);
                return;
            }
            (Place::Holding, Some(b'C')) => {
                // Nothing for the member: the transaction leaves nothing.
                let mut held = std::mem::take(&mut self.held);
                for f in held.drain(..).chain([frame]) {
                    self.recycle(f);
                }
                self.held = held;
                self.place = Place::Outside;
                return;
            }
            (Place::Passing, Some(b'C')) => {
                out.push(fitted(frame));
                self.place = Place::Outside;
                return;
            }
            _ => {}
        }
        let Some(frame) = self.absorb_description(frame) else { return };
        match change_tables(&frame.data) {
            Some(tables) if !tables.iter().any(|t| self.carries(t)) => {
                self.skipped += 1;
                self.recycle(frame);
                return;
            }
            Some(tables) => {
                self.release(out);
                self.give_descriptions(tables, frame.lsn, out);
            }
            // A message is for every member: the transaction goes out.
            None if tag == Some(b'M') => self.release(out),
            None => {}
        }
        match self.place {
            Place::Holding => self.held.push(frame),
            _ => out.push(fitted(frame)),
        }
    }

    /// Keeps the buffer of a frame the member does not get for a frame read later.
    fn recycle(&mut self, frame: RawFrame) {
        if self.spare.len() < SPARE_BUFFERS && frame.data.capacity() <= SPARE_BYTES {
            self.spare.push(frame.data);
        }
    }

    /// A description is kept (see [`Feed::note_description`]), any other frame handed back.
    fn absorb_description(&mut self, frame: RawFrame) -> Option<RawFrame> {
        if description_key(&frame).is_some() {
            self.note_description(frame);
            return None;
        }
        Some(frame)
    }

    /// The held transaction has something for the member: what was held goes out first.
    fn release(&mut self, out: &mut Vec<RawFrame>) {
        if self.place == Place::Holding {
            out.extend(self.held.drain(..).map(fitted));
            self.place = Place::Passing;
        }
    }
}

/// `(b'R', table OID)` of a Relation frame, `(b'Y', type OID)` of a Type frame.
fn description_key(frame: &RawFrame) -> Option<(u8, u32)> {
    let tag = *frame.data.first()?;
    let oid = frame.data.get(1..5)?;
    matches!(tag, b'R' | b'Y').then(|| (tag, u32::from_be_bytes([oid[0], oid[1], oid[2], oid[3]])))
}
