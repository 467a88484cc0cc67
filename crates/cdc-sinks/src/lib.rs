//! pg_cdc's sinks: where encoded events go.
//!
//! Every sink implements [`Sink`]: it takes whole committed transactions of encoded events and
//! returns only once each event is acknowledged by the destination, or with an error. The worker
//! confirms the replication slot only after `publish` returns `Ok` ("ack before advance"), so a
//! failed or interrupted publish re-sends the same transactions later: delivery is at-least-once,
//! and every event carries `(commit_lsn, lsn)` for consumers that deduplicate.
//!
//! Sinks run on the worker's main thread and never call into PostgreSQL.
#![warn(missing_docs)]

pub mod kafka;

use cdc_core::pipeline::Transaction;
use cdc_core::Lsn;

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
/// only up to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Confirm the slot up to here; skip every transaction whose end LSN is at or below it.
    pub end_lsn: Lsn,
}

impl Checkpoint {
    /// The record stored in a progress topic.
    pub fn encode(&self) -> Vec<u8> {
        format!("{{\"end_lsn\":{}}}", self.end_lsn.0).into_bytes()
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
pub trait Sink {
    /// Prepares a fresh sink before its first publish: a transactional sink fences older producers
    /// of the same pipeline and returns the last checkpoint it committed.
    fn open(&mut self) -> Result<Option<Checkpoint>, SinkError> {
        Ok(None)
    }

    /// Publishes every event of `transactions`, in order, and returns once all are acknowledged
    /// (and, for a transactional sink, committed together with `checkpoint`).
    fn publish(&mut self, transactions: &[Transaction], checkpoint: Checkpoint) -> Result<PublishStats, SinkError>;

    /// The guarantee this sink gives.
    fn delivery_mode(&self) -> DeliveryMode {
        DeliveryMode::AtLeastOnce
    }
}
