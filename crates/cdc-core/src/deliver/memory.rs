//! In-memory doubles of the delivery ports, for tests without PostgreSQL or a broker.
use std::collections::HashMap;

use super::port::{ChangeSource, Checkpoint, DeliveryMode, ErrorClass, PublishStats, Sink, SinkError};
use crate::decode::{decode, Message};
use crate::envelope::Event;
use crate::frame::RawFrame;
use crate::types::TypeRegistry;

/// A slot read over frames held in memory; it hands out at most `chunk` rows per fetch, so tests
/// can put chunk boundaries where they want them.
pub struct MemorySource {
    /// The frames of the read.
    pub frames: Vec<RawFrame>,
    /// The most rows one fetch returns.
    pub chunk: usize,
    /// What the progress store recorded per table.
    pub recorded: HashMap<u32, u64>,
    position: u64,
    /// Rows handed out (a large transaction's rows count once per pass).
    pub fetched: u64,
    /// Rows before this were released: reading them again breaks the port's contract.
    released: u64,
}

impl MemorySource {
    /// A read over `frames`, any number of rows per fetch.
    pub fn new(frames: Vec<RawFrame>) -> Self {
        MemorySource { frames, chunk: usize::MAX, recorded: HashMap::new(), position: 0, fetched: 0, released: 0 }
    }

    /// The read a slot confirmed at `lsn` returns: every transaction whose commit ends after it
    /// (transactions arrive whole, in commit order).
    pub fn after(frames: &[RawFrame], lsn: crate::Lsn) -> Self {
        let done = frames
            .iter()
            .rposition(|f| matches!(decode(&f.data), Ok(Message::Commit { end_lsn, .. }) if end_lsn <= lsn))
            .map_or(0, |i| i + 1);
        Self::new(frames[done..].to_vec())
    }
}

impl ChangeSource for MemorySource {
    fn fetch(&mut self, count: usize, _types: &mut TypeRegistry) -> Vec<RawFrame> {
        let start = (self.position as usize).min(self.frames.len());
        let end = start.saturating_add(count.min(self.chunk)).min(self.frames.len());
        self.position = end as u64;
        self.fetched += (end - start) as u64;
        self.frames[start..end].to_vec()
    }

    fn position(&self) -> u64 {
        self.position
    }

    fn seek(&mut self, position: u64) {
        assert!(position >= self.released, "seek to row {position}, released before {}", self.released);
        self.position = position;
    }

    fn release_before(&mut self, position: u64) {
        assert!(position <= self.position, "released row {position} before fetching it");
        self.released = self.released.max(position);
    }

    fn recorded_offsets(&mut self) -> HashMap<u32, u64> {
        self.recorded.clone()
    }
}

/// Where a [`MemorySink`] fails on purpose, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkFault {
    /// The n-th send (1-based, counted over the sink's life) fails with this class.
    Send(usize, ErrorClass),
    /// The next flush fails with this class (its unit is not committed).
    Flush(ErrorClass),
}

/// A sink that keeps what it was given: the units it committed (each with its checkpoint), and
/// what it holds open. Exactly-once like a transactional broker (an aborted unit is dropped, the
/// last committed checkpoint is returned by `open`), or at-least-once.
pub struct MemorySink {
    /// The guarantee it gives.
    pub mode: DeliveryMode,
    /// Committed units: their events and checkpoint.
    pub committed: Vec<(Vec<Event>, Checkpoint)>,
    /// Events of the open unit.
    pub open_unit: Vec<Event>,
    /// Calls to `send`, and how many events each carried.
    pub sends: Vec<usize>,
    /// Units aborted.
    pub aborted: usize,
    /// A planned failure.
    pub fault: Option<SinkFault>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new(mode: DeliveryMode) -> Self {
        MemorySink { mode, committed: Vec::new(), open_unit: Vec::new(), sends: Vec::new(), aborted: 0, fault: None }
    }

    /// Every committed event, in order.
    pub fn events(&self) -> Vec<&Event> {
        self.committed.iter().flat_map(|(e, _)| e).collect()
    }
}

impl Sink for MemorySink {
    fn open(&mut self) -> Result<Option<Checkpoint>, SinkError> {
        self.open_unit.clear();
        Ok(match self.mode {
            DeliveryMode::ExactlyOnce => self.committed.last().map(|(_, cp)| *cp),
            DeliveryMode::AtLeastOnce => None,
        })
    }

    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        self.sends.push(events.len());
        if let Some(SinkFault::Send(n, class)) = self.fault {
            if self.sends.len() == n {
                return Err(SinkError { class, message: format!("send {n} failed (planned)") });
            }
        }
        self.open_unit.extend_from_slice(events);
        let bytes = events.iter().map(|e| e.payload.len() + e.key.as_ref().map_or(0, Vec::len)).sum::<usize>();
        Ok(PublishStats { events: events.len() as u64, bytes: bytes as u64 })
    }

    fn flush(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        if let Some(SinkFault::Flush(class)) = self.fault {
            self.fault = None;
            return Err(SinkError { class, message: "flush failed (planned)".into() });
        }
        self.committed.push((std::mem::take(&mut self.open_unit), checkpoint));
        Ok(())
    }

    fn abort(&mut self) {
        self.open_unit.clear();
        self.aborted += 1;
    }

    fn delivery_mode(&self) -> DeliveryMode {
        self.mode
    }
}
