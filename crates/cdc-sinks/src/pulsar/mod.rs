//! The Pulsar sink: events as messages of Apache Pulsar topics (one per table, or a template),
//! at-least-once, each key's messages in order.
//!
//! ```text
//!  send: events ─▶ messages (payload = the event, partition and ordering key = its key,
//!        properties id/commit_lsn/table/operation) ─▶ the topic's producer (opened on first use)
//!        more than MAX_OUTSTANDING (or 64 MiB) handed over ─▶ wait for their receipts
//!  flush: wait until every message handed over has its receipt ─▶ Ok ─▶ the slot is confirmed
//!  a failure: the producers are closed, the delivery fails and is read again
//! ```
//! A producer sends its messages in order on one connection, and the broker stores them in that
//! order, so each topic (and, for a partitioned topic, each key's partition) gets a key's events in
//! commit order. Broker-side deduplication (`brokerDeduplicationEnabled`) drops a message the
//! client sends again after a reconnect within a producer's life: the client resends it with the
//! same producer name and sequence id. The Rust client numbers a producer's messages from 0 every
//! time it creates one and does not read the broker's last sequence id for the name, so a producer
//! name used again would have its first messages dropped as duplicates of the earlier producer's:
//! each producer gets a name of its own, `<producer_name>-<session>-<n>`. After a failure the
//! delivery is sent again by a new producer: messages the broker had stored arrive a second time,
//! byte-identical, with the same `id` property (`<commit_lsn>-<event_index>`) to deduplicate by.
//!
//! The client is behind [`PulsarApi`]: the `pulsar` crate in [`client`], a scripted double in the
//! tests.
pub mod client;
pub mod config;

use std::time::Duration;

use cdc_core::envelope::Event;

use self::config::PulsarSinkConfig;
use crate::kafka::config::expand_topic;
use crate::window::Outstanding;
use crate::{Checkpoint, DeliveryMode, ErrorClass, PublishStats, Sink, SinkError};

/// Messages handed over and not yet acknowledged at most, before the sink waits.
pub const MAX_OUTSTANDING: usize = 10_000;

/// Bytes of messages handed over and not yet acknowledged at most, before the sink waits.
pub const MAX_OUTSTANDING_BYTES: usize = 64 << 20;

/// Bytes of one event at most: the broker's default `maxMessageSize` (5 MiB) less room for the
/// message's metadata.
pub const MAX_MESSAGE_BYTES: usize = (5 << 20) - (16 << 10);

/// One message for a producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its topic's full name (`persistent://tenant/namespace/topic`).
    pub topic: String,
    /// The event, byte for byte.
    pub payload: Vec<u8>,
    /// Its key as JSON text: the partition key (which partition of a partitioned topic) and the
    /// ordering key (Key_Shared subscriptions); `None` for an event without a key.
    pub key: Option<String>,
    /// Its properties: `id`, `commit_lsn`, `table`, `operation`.
    pub properties: Vec<(&'static str, String)>,
}

/// A failed send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// Whether it may succeed later or needs an operator.
    pub class: ErrorClass,
    /// What happened (no secrets).
    pub message: String,
}

/// The producers the sink hands its messages to.
pub trait PulsarApi {
    /// Hands `message` over to its topic's producer (opened on first use).
    fn send(&mut self, message: Message) -> Result<(), ApiError>;

    /// Waits (at most `timeout`) until every message handed over has its receipt; the first
    /// failure, if any.
    fn wait(&mut self, timeout: Duration) -> Result<(), ApiError>;

    /// Forgets the messages handed over (the delivery is abandoned) and closes the producers.
    fn abandon(&mut self);
}

/// What a client error means, by its text: an operator must act on refused credentials or
/// permissions, a topic that does not exist (auto-creation off), a tenant or namespace that does
/// not exist, a message the broker refuses; anything else (connection, timeout, a broker not ready)
/// is retried.
pub fn classify(error: &str) -> ErrorClass {
    const OPERATOR: &[&str] = &[
        "AuthenticationError",
        "AuthorizationError",
        "TopicNotFound",
        "NotAllowedError",
        "InvalidTopicName",
        "does not exist",
        "not found",
        "Policies not found",
        "ProducerBlockedQuotaExceededError",
        "MessageTooLarge",
        "InvalidMessage",
    ];
    if OPERATOR.iter().any(|m| error.contains(m)) {
        ErrorClass::Operator
    } else {
        ErrorClass::Retry
    }
}

/// The message of an event, for `topic`.
pub fn message_of(ev: &Event, topic: String) -> Message {
    Message {
        topic,
        payload: ev.payload.clone(),
        key: ev.key.as_deref().filter(|k| !k.is_empty()).map(|k| String::from_utf8_lossy(k).into_owned()),
        properties: vec![
            ("id", format!("{}-{}", ev.commit_lsn.0, ev.index)),
            ("commit_lsn", ev.commit_lsn.0.to_string()),
            ("table", format!("{}.{}", ev.schema, ev.table)),
            ("operation", ev.op.as_str().to_string()),
        ],
    }
}

/// The Pulsar sink, over a client.
pub struct PulsarSink<A: PulsarApi> {
    api: A,
    namespace: String,
    template: String,
    database: String,
    timeout: Duration,
    outstanding: Outstanding,
}

impl<A: PulsarApi> PulsarSink<A> {
    /// A sink sending `database`'s events to `cfg`'s topics through `api`.
    pub fn new(cfg: &PulsarSinkConfig, database: &str, api: A) -> Self {
        PulsarSink {
            api,
            namespace: cfg.namespace.clone(),
            template: cfg.topic.clone(),
            database: database.to_string(),
            timeout: Duration::from_millis(cfg.timeout_ms),
            outstanding: Outstanding::new(MAX_OUTSTANDING, MAX_OUTSTANDING_BYTES),
        }
    }

    /// The client.
    pub fn api_mut(&mut self) -> &mut A {
        &mut self.api
    }

    /// The full name of an event's topic.
    pub fn topic_of(&self, ev: &Event) -> String {
        format!("{}{}", self.namespace, expand_topic(&self.template, &self.database, &ev.schema, &ev.table))
    }

    fn error(&self, class: ErrorClass, what: impl std::fmt::Display) -> SinkError {
        SinkError { class, message: format!("Pulsar: {what}") }
    }

    fn wait(&mut self) -> Result<(), SinkError> {
        self.outstanding.clear();
        self.api.wait(self.timeout).map_err(|e| self.error(e.class, e.message))
    }
}

impl<A: PulsarApi> Sink for PulsarSink<A> {
    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        let mut stats = PublishStats::default();
        for ev in events {
            if let Err(e) = self.outstanding.admit(ev, MAX_MESSAGE_BYTES, &mut stats) {
                return Err(self.error(
                    ErrorClass::Operator,
                    format!("{e}, more than a Pulsar message holds by default ({MAX_MESSAGE_BYTES})"),
                ));
            }
            let message = message_of(ev, self.topic_of(ev));
            self.api.send(message).map_err(|e| self.error(e.class, e.message))?;
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
