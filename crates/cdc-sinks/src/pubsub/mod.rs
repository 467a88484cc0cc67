//! The Pub/Sub sink: events as messages of one Google Cloud Pub/Sub topic, at-least-once, each key's
//! messages in order (its ordering key).
//!
//! ```text
//!  send: events ─▶ messages (data = the event, ordering key = its key, attributes id/table/...) ─▶ publisher
//!        more than max_outstanding_messages (or 64 MiB) handed over ─▶ wait for their acknowledgements
//!  flush: wait until every message handed over is acknowledged ─▶ Ok ─▶ the slot is confirmed
//!  a failure: the publisher pauses the failed message's ordering key (its later messages fail
//!             unsent), every key is resumed, the delivery fails and is read again
//! ```
//! Pub/Sub keeps the order of the messages of one ordering key as the publisher hands them over,
//! and the publisher sends a key's next batch only once the one before it is acknowledged. When a
//! message fails, the key's later messages of the delivery fail without being sent, so no later
//! message of a key is ever stored before an earlier one. The delivery is then read again whole:
//! messages Pub/Sub had stored are published a second time, byte-identical, with the same `id`
//! attribute (`<commit_lsn>-<event_index>`) to deduplicate by.
//!
//! The Pub/Sub API is behind [`PubSubApi`]: Google's Rust client in [`google`], a scripted double in
//! the tests.
pub mod config;
pub mod google;

use std::time::Duration;

use cdc_core::envelope::Event;

use self::config::{PubSubSinkConfig, MAX_MESSAGE_BYTES};
use crate::window::Outstanding;
use crate::{Checkpoint, DeliveryMode, ErrorClass, PublishStats, Sink, SinkError};

/// The longest ordering key Pub/Sub takes, in bytes.
pub const MAX_ORDERING_KEY_BYTES: usize = 1024;

/// Bytes of messages handed over and not yet acknowledged at most, before the sink waits.
pub const MAX_OUTSTANDING_BYTES: usize = 64 << 20;

/// One message for the publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The event, byte for byte.
    pub data: Vec<u8>,
    /// Its ordering key (empty: none).
    pub ordering_key: String,
    /// Its attributes: `id`, `commit_lsn`, `table`, `operation`.
    pub attributes: Vec<(&'static str, String)>,
}

/// A failed publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// Whether it may succeed later or needs an operator.
    pub class: ErrorClass,
    /// What happened (no secrets).
    pub message: String,
}

/// The publisher the sink hands its messages to.
pub trait PubSubApi {
    /// Hands `message` over: it is published after the earlier messages of its ordering key.
    fn publish(&mut self, message: Message);

    /// Waits (at most `timeout`) until every message handed over is acknowledged or failed; the
    /// first failure, if any. Afterwards nothing is outstanding and every ordering key is accepted
    /// again.
    fn wait(&mut self, timeout: Duration) -> Result<(), ApiError>;

    /// Forgets the messages handed over (the delivery is abandoned) and accepts every ordering key
    /// again.
    fn abandon(&mut self);
}

/// What a gRPC status code means: retried (unavailable, deadline exceeded, aborted, internal,
/// resource exhausted, anything unknown) or needs an operator (a missing topic, refused credentials
/// or permissions, an invalid request).
pub fn classify_code(code: &str) -> ErrorClass {
    const OPERATOR: &[&str] =
        &["NotFound", "PermissionDenied", "Unauthenticated", "InvalidArgument", "FailedPrecondition", "OutOfRange"];
    if OPERATOR.contains(&code) {
        ErrorClass::Operator
    } else {
        ErrorClass::Retry
    }
}

/// A message's ordering key: its event's key as JSON text (the Kafka sink's message key: the
/// tables' key columns, or the `partition_key` column); a key longer than Pub/Sub takes becomes
/// `sha256:<hex of the key>` (the same key, the same ordering key). An event without a key has none:
/// it has no order to keep.
pub fn ordering_key_of(ev: &Event) -> String {
    let Some(key) = ev.key.as_deref().filter(|k| !k.is_empty()) else {
        return String::new();
    };
    if key.len() <= MAX_ORDERING_KEY_BYTES {
        return String::from_utf8_lossy(key).into_owned();
    }
    crate::hashed_key(key)
}

/// The message of an event: the event as its data, its key as the ordering key, and attributes a
/// subscription can filter on: `id` (`<commit_lsn>-<event_index>`, the event's identity), `commit_lsn`,
/// `table` (`schema.table`) and `operation`.
pub fn message_of(ev: &Event) -> Message {
    Message {
        data: ev.payload.clone(),
        ordering_key: ordering_key_of(ev),
        attributes: vec![
            ("id", format!("{}-{}", ev.commit_lsn.0, ev.index)),
            ("commit_lsn", ev.commit_lsn.0.to_string()),
            ("table", format!("{}.{}", ev.schema, ev.table)),
            ("operation", ev.op.as_str().to_string()),
        ],
    }
}

/// The Pub/Sub sink, over a publisher.
pub struct PubSubSink<A: PubSubApi> {
    api: A,
    topic: String,
    timeout: Duration,
    outstanding: Outstanding,
}

impl<A: PubSubApi> PubSubSink<A> {
    /// A sink publishing to `cfg`'s topic through `api`.
    pub fn new(cfg: &PubSubSinkConfig, api: A) -> Self {
        PubSubSink {
            api,
            topic: cfg.topic_path(),
            timeout: Duration::from_millis(cfg.timeout_ms),
            outstanding: Outstanding::new(cfg.max_outstanding_messages, MAX_OUTSTANDING_BYTES),
        }
    }

    /// The publisher.
    pub fn api_mut(&mut self) -> &mut A {
        &mut self.api
    }

    fn error(&self, class: ErrorClass, what: impl std::fmt::Display) -> SinkError {
        SinkError { class, message: format!("Pub/Sub topic \"{}\": {what}", self.topic) }
    }

    fn wait(&mut self) -> Result<(), SinkError> {
        self.outstanding.clear();
        self.api.wait(self.timeout).map_err(|e| self.error(e.class, e.message))
    }
}

impl<A: PubSubApi> Sink for PubSubSink<A> {
    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        let mut stats = PublishStats::default();
        for ev in events {
            if let Err(e) = self.outstanding.admit(ev, MAX_MESSAGE_BYTES, &mut stats) {
                return Err(self.error(
                    ErrorClass::Operator,
                    format!("{e}, more than a Pub/Sub message holds ({MAX_MESSAGE_BYTES} with its attributes)"),
                ));
            }
            self.api.publish(message_of(ev));
            if self.outstanding.full() {
                self.wait()?;
            }
        }
        Ok(stats)
    }

    fn flush(&mut self, _checkpoint: Checkpoint) -> Result<(), SinkError> {
        self.wait()
    }

    fn abort(&mut self) {
        self.outstanding.clear();
        self.api.abandon();
    }

    fn delivery_mode(&self) -> DeliveryMode {
        DeliveryMode::AtLeastOnce
    }
}

#[cfg(test)]
mod tests;
