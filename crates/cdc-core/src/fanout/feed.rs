//! One member's feed from its group's log: the frames a decoding session of its own would have
//! emitted for it.
//!
//! The group's session hands every table of the publications to pgoutput; a sink's own session
//! hands only the sink's tables (and their lookup tables), and pgoutput then leaves out a
//! transaction with nothing for them, Begin and Commit included. The feed does the same to the
//! log: it skips what the member's position covers, drops the changes of tables it does not
//! carry, and holds a transaction's Begin (and the Relation, Type and Origin frames after it)
//! until the transaction has something for the member — a change it carries or a message — so a
//! transaction with nothing for it leaves nothing. Messages go to every member, as they do from
//! pgoutput. What comes out is pushed into the member's spool and read as before.
use std::collections::HashSet;
use std::io;
use std::path::PathBuf;

use super::log::{describe, LogEnd, LogReader, Start};
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
    /// Frames to hand out before the first the member's position does not cover: the last
    /// Relation and Type frame of each table and type before it.
    first: Vec<RawFrame>,
    /// What the member's position covers, until the first frame it does not.
    coverage: Option<Coverage>,
    carried: Option<HashSet<u32>>,
    place: Place,
    held: Vec<RawFrame>,
    skipped: u64,
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
            Start::At(reader, first) => Opened::Feed(Box::new(Feed {
                reader,
                first,
                coverage: Some(Coverage::new(confirmed)),
                carried,
                place: Place::Outside,
                held: Vec::new(),
                skipped: 0,
            })),
            Start::Behind => Opened::Behind,
            Start::Missing => Opened::Missing,
        })
    }

    /// The tables whose changes the member gets from now on (`None`: every table).
    pub fn carry_only(&mut self, tables: Option<HashSet<u32>>) {
        self.carried = tables;
    }

    /// Changes of tables the member does not carry dropped since the last call.
    pub fn take_skipped(&mut self) -> u64 {
        std::mem::take(&mut self.skipped)
    }

    /// The member's frames among the next `max` frames of the log, up to `end`.
    pub fn pull(&mut self, end: LogEnd, max: usize) -> io::Result<Vec<RawFrame>> {
        let mut out = Vec::new();
        for frame in self.reader.read(end, max)? {
            if let Some(coverage) = self.coverage.as_mut() {
                if coverage.covers(&frame) {
                    // A description among the covered frames still holds for what follows.
                    if matches!(frame.data.first(), Some(b'R' | b'Y')) {
                        describe(&mut self.first, frame);
                    }
                    continue;
                }
                self.coverage = None;
                out.append(&mut self.first);
            }
            self.take(frame, &mut out);
        }
        Ok(out)
    }

    fn carries(&self, oid: u32) -> bool {
        self.carried.as_ref().is_none_or(|c| c.contains(&oid))
    }

    /// Whether a change frame is for the member: `Some(true)` it is, `Some(false)` it is not,
    /// `None` the frame is no change (Begin, Commit, Relation, Type, Origin, message).
    fn change_for_member(&self, data: &[u8]) -> Option<bool> {
        let u32_at = |i: usize| data.get(i..i + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        match data.first()? {
            b'I' | b'U' | b'D' => Some(u32_at(1).is_some_and(|oid| self.carries(oid))),
            b'T' => {
                // `T`, the number of relations, options, the relations.
                let n = u32_at(1).unwrap_or(0) as usize;
                Some((0..n).any(|i| u32_at(6 + 4 * i).is_some_and(|oid| self.carries(oid))))
            }
            _ => None,
        }
    }

    fn take(&mut self, frame: RawFrame, out: &mut Vec<RawFrame>) {
        let tag = frame.data.first().copied();
        match (self.place, tag) {
            (Place::Outside, Some(b'B')) => {
                self.place = Place::Holding;
                self.held.push(frame);
                return;
            }
            (Place::Outside, _) => {
                out.push(frame);
                return;
            }
            (Place::Holding, Some(b'C')) => {
                // Nothing for the member: the transaction leaves nothing.
                self.held.clear();
                self.place = Place::Outside;
                return;
            }
            (Place::Passing, Some(b'C')) => {
                out.push(frame);
                self.place = Place::Outside;
                return;
            }
            _ => {}
        }
        match self.change_for_member(&frame.data) {
            Some(false) => {
                self.skipped += 1;
                return;
            }
            // A change for the member, or a message (for every member): the transaction goes
            // out. A Relation, Type or Origin frame waits for what follows it.
            Some(true) => self.release(out),
            None if tag == Some(b'M') => self.release(out),
            None => {}
        }
        match self.place {
            Place::Holding => self.held.push(frame),
            _ => out.push(frame),
        }
    }

    /// The held transaction has something for the member: what was held goes out first.
    fn release(&mut self, out: &mut Vec<RawFrame>) {
        if self.place == Place::Holding {
            out.append(&mut self.held);
            self.place = Place::Passing;
        }
    }
}
