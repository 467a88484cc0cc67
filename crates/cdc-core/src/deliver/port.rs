//! The ports of delivery: what a sink must do ([`Sink`]) and what the slot reader must do
//! ([`ChangeSource`]). The Kafka sink (`cdc-sinks`) and the worker's decoding session (the extension)
//! are the adapters; `deliver::memory` has an in-memory double of each for the tests.
use std::collections::HashMap;

use crate::envelope::Event;
use crate::frame::{RawFrame, Transaction};
use crate::types::TypeRegistry;
use crate::Lsn;

/// What to do about a failed publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Transient (broker unreachable, timeout, leader change): back off and retry.
    Retry,
    /// Needs an operator (authentication, authorization, invalid config, record too large):
    /// keep the slot, report the error, retry slowly.
    Operator,
}

/// A failed publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkError {
    /// Retry class.
    pub class: ErrorClass,
    /// What happened, without secrets.
    pub message: String,
}

impl std::fmt::Display for SinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SinkError {}

/// Counts from one publish.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishStats {
    /// Events acknowledged.
    pub events: u64,
    /// Payload + key bytes acknowledged.
    pub bytes: u64,
}

/// How far a pipeline has durably delivered: the end LSN of the last delivered transaction (or
/// heartbeat). A transactional sink stores it atomically with the events; the slot is confirmed
/// only up to it. Stored as a JSON object: readers ignore fields they do not know, so later
/// versions can add what they need to resume (a snapshot position, schema ids) beside `end_lsn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Confirm the slot up to here; skip every transaction whose end LSN is at or below it.
    pub end_lsn: Lsn,
}

impl Checkpoint {
    /// The record stored in a progress topic.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(&[])
    }

    /// The record with string fields of the sink's own beside the checkpoint's (a Kafka sink's:
    /// the system identifier of the cluster that wrote it); [`Checkpoint::decode`] ignores them.
    pub fn encode_with(&self, extra: &[(&str, &str)]) -> Vec<u8> {
        let mut out = format!("{{\"end_lsn\":{}", self.end_lsn.0);
        for (k, v) in extra {
            out.push_str(&format!(",{}:{}", serde_json::Value::from(*k), serde_json::Value::from(*v)));
        }
        out.push('}');
        out.into_bytes()
    }

    /// Parses a progress record.
    pub fn decode(bytes: &[u8]) -> Option<Checkpoint> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        Some(Checkpoint { end_lsn: Lsn(v.get("end_lsn")?.as_u64()?) })
    }
}

/// The guarantee a sink gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryMode {
    /// Events and checkpoint commit together: consumers reading committed data see each event once.
    ExactlyOnce,
    /// Events are acknowledged before the slot moves; a crash re-sends the unconfirmed tail.
    AtLeastOnce,
}

impl DeliveryMode {
    /// The name in the catalog and in `cdc_delivery_status`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryMode::ExactlyOnce => "exactly_once",
            DeliveryMode::AtLeastOnce => "at_least_once",
        }
    }
}

/// A destination for events.
///
/// Contract: the core calls [`Sink::send`] any number of times (a transaction too large to hold in
/// memory is sent in pieces), then [`Sink::flush`] with the checkpoint the slot will be confirmed
/// to; everything sent since the last flush is one delivery unit. Nothing counts as delivered
/// before `flush` returns `Ok`; after an error the core calls [`Sink::abort`] (or drops the sink)
/// and reads the same changes again later. An exactly-once sink stores the checkpoint atomically
/// with the unit and returns it from [`Sink::open`]; an at-least-once sink may deliver a unit again
/// after a failure (every event carries `(commit_lsn, lsn)` to deduplicate by).
pub trait Sink {
    /// Prepares a fresh sink before its first send: a transactional sink fences older producers
    /// of the same pipeline and returns the last checkpoint it committed.
    fn open(&mut self) -> Result<Option<Checkpoint>, SinkError> {
        Ok(None)
    }

    /// Queues `events` in order (a transactional sink begins a unit with the first send after a
    /// flush). May wait while its local queue is full; returns what it queued.
    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError>;

    /// [`Sink::send`], given the events to keep: a sink that hands them to another thread
    /// ([`super::handoff::DeliveryThread`]) takes them without a copy.
    fn send_owned(&mut self, events: Vec<Event>) -> Result<PublishStats, SinkError> {
        self.send(&events)
    }

    /// Returns once everything sent since the last flush is acknowledged; a transactional sink
    /// commits its unit with `checkpoint` in it (a unit holding only the checkpoint when nothing
    /// was sent).
    fn flush(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError>;

    /// Abandons what was sent since the last flush (a transactional sink aborts its unit). Best
    /// effort: a sink that cannot abort is dropped by the caller.
    fn abort(&mut self);

    /// Sends every event of `transactions` and flushes.
    fn publish(&mut self, transactions: &[Transaction], checkpoint: Checkpoint) -> Result<PublishStats, SinkError> {
        let mut stats = PublishStats::default();
        let result = (|| {
            for t in transactions {
                let s = self.send(&t.events)?;
                stats.events += s.events;
                stats.bytes += s.bytes;
            }
            self.flush(checkpoint)
        })();
        if result.is_err() {
            self.abort();
        }
        result.map(|()| stats)
    }

    /// The guarantee this sink gives.
    fn delivery_mode(&self) -> DeliveryMode {
        DeliveryMode::AtLeastOnce
    }

    /// The sink writes into the source database (the in-database sink): its sends and its flush
    /// run inside the read's own transaction and commit with it, so the caller flushes before that
    /// transaction ends. Its checkpoint is written only with events (a checkpoint written for a
    /// heartbeat would be WAL that calls for the next heartbeat), so the slot may be confirmed
    /// past it.
    fn in_source_database(&self) -> bool {
        false
    }

    /// The destination asked not to be sent to before this instant (a webhook's `Retry-After`):
    /// after a failure the caller waits at least until then, whatever its own backoff says.
    fn hold_until(&self) -> Option<std::time::Instant> {
        None
    }

    /// Housekeeping of a sink the worker opened in its own transaction, called in that transaction
    /// before each read (the in-database sink trims its event table when due).
    fn maintain(&mut self) {}
}

/// One read of a sink's slot: the changes after its confirmed position, in LSN order, ending with
/// a whole transaction. Rows are counted from 0; a transaction too large to hold is read again
/// from its Begin with [`ChangeSource::seek`].
pub trait ChangeSource {
    /// Reads up to `count` more rows (fewer at the end of the read); learns the column types of
    /// the Relation messages among them into `types`.
    fn fetch(&mut self, count: usize, types: &mut TypeRegistry) -> Vec<RawFrame>;

    /// How many rows were read (the index of the next row).
    fn position(&self) -> u64;

    /// Makes the next fetch start at row `position`.
    fn seek(&mut self, position: u64);

    /// The read will not seek back before row `position` (rows before it are sent, whole
    /// transactions): a source that buffers rows may free them. Rows released are either
    /// delivered with this read or, when it fails, read again from the slot.
    fn release_before(&mut self, _position: u64) {}

    /// The commit LSN of the last transaction the progress store recorded for each table of the
    /// sink (`_cdc_offsets.last_lsn`): a delivered transaction past it was never recorded.
    fn recorded_offsets(&mut self) -> HashMap<u32, u64>;
}
