//! pg_cdc's sinks: where encoded events go. One folder per sink type owns its config, its errors
//! and its tests; [`registry`] lists the types (adding one adds its folder and one line there).
//!
//! Every sink implements the core's [`Sink`] port: the worker sends the events of committed
//! transactions, then flushes; `flush` returns only once each event is acknowledged by the
//! destination, or with an error. The slot is confirmed only after `flush` returns `Ok` ("ack
//! before advance"), so a failed or interrupted delivery re-sends the same transactions later;
//! a transactional sink (Kafka, the in-database table) makes that exactly-once with the checkpoint
//! it commits with the events.
//!
//! Sinks run on the worker's main thread and never call into PostgreSQL themselves: the
//! in-database sink writes through a port the worker implements with SPI.
#![warn(missing_docs)]

pub mod alter;
pub mod delegation;
pub mod eventhub;
pub mod format;
pub mod kafka;
pub mod kinesis;
pub mod open;
pub mod postgres;
pub mod pubsub;
pub mod pulsar;
pub mod registry;
pub mod secrets;
pub mod spec;
pub mod table;
#[cfg(test)]
mod testutil;
pub mod webhook;
pub mod window;

/// A key too long for a destination's partition or ordering key, as `sha256:<hex of the key>`: the
/// same key always gives the same value (Kinesis partition keys, Pub/Sub ordering keys).
pub(crate) fn hashed_key(key: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

// The ports live in the core (`cdc_core::deliver::port`), with the protocol that drives them and
// the in-memory doubles it is tested with; each sink here is one adapter.
pub use cdc_core::deliver::port::{Checkpoint, DeliveryMode, ErrorClass, PublishStats, Sink, SinkError};
pub use registry::{parse_config, SinkConfig};
