//! pg_cdc's sinks: where encoded events go.
//!
//! Every sink implements the core's [`Sink`] port: the worker sends the events of committed
//! transactions, then flushes; `flush` returns only once each event is acknowledged by the
//! destination, or with an error. The slot is confirmed only after `flush` returns `Ok` ("ack
//! before advance"), so a failed or interrupted delivery re-sends the same transactions later;
//! a transactional sink (Kafka) makes that exactly-once with the checkpoint it commits.
//!
//! Sinks run on the worker's main thread and never call into PostgreSQL.
#![warn(missing_docs)]

pub mod kafka;

// The ports live in the core (`cdc_core::deliver::port`), with the protocol that drives them and
// the in-memory doubles it is tested with; each sink here is one adapter.
pub use cdc_core::deliver::port::{Checkpoint, DeliveryMode, ErrorClass, PublishStats, Sink, SinkError};
