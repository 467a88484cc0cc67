//! The Kafka sink: librdkafka's idempotent producer, acks=all by default.
//!
//! `publish` enqueues every event (waiting on the bounded local queue when it is full), then polls
//! until each delivery report arrived. Any failed delivery fails the whole publish; the worker
//! then re-reads the same transactions from its slot and publishes them again with a new producer.
//! Delivery reports are served by `poll` on the calling thread, so no callback ever runs on a
//! librdkafka thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cdc_core::config::{expand_topic, KafkaSinkConfig};
use cdc_core::pipeline::Transaction;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};

use crate::{ErrorClass, PublishStats, Sink, SinkError};

/// Upper bound of librdkafka's local queue, in KiB (its default is about 1 GB).
pub const QUEUE_MAX_KBYTES: u32 = 65_536;

/// How long one delivery may take before it counts as failed (librdkafka `message.timeout.ms`).
pub const MESSAGE_TIMEOUT_MS: u32 = 30_000;

/// Delivery accounting shared with librdkafka's callbacks.
#[derive(Default)]
pub struct DeliveryCounter {
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<(ErrorClass, String)>>,
}

impl ClientContext for DeliveryCounter {}

impl ProducerContext for DeliveryCounter {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut slot) = self.first_error.lock() {
                    if slot.is_none() {
                        *slot = Some((classify(e), e.to_string()));
                    }
                }
            }
        }
    }
}

/// Sorts a Kafka error into retry classes.
pub fn classify(e: &KafkaError) -> ErrorClass {
    use RDKafkaErrorCode::*;
    let code = match e {
        KafkaError::MessageProduction(c) | KafkaError::Global(c) => Some(*c),
        KafkaError::ClientCreation(_) | KafkaError::ClientConfig(..) => return ErrorClass::Operator,
        _ => e.rdkafka_error_code(),
    };
    match code {
        Some(
            TopicAuthorizationFailed
            | ClusterAuthorizationFailed
            | SaslAuthenticationFailed
            | Authentication
            | MessageSizeTooLarge
            | InvalidRecord
            | InvalidTopic
            | TransactionalIdAuthorizationFailed,
        ) => ErrorClass::Operator,
        _ => ErrorClass::Retry,
    }
}

/// A Kafka sink for one pg_cdc sink.
pub struct KafkaSink {
    producer: BaseProducer<DeliveryCounter>,
    topic_template: String,
    database: String,
    topics: HashMap<u32, String>,
    interrupt: Option<Box<dyn Fn() -> bool>>,
}

impl KafkaSink {
    /// Builds the producer. `default_bootstrap` is used when the config names no servers.
    /// No network I/O happens here; connection errors surface in `publish`.
    pub fn new(
        cfg: &KafkaSinkConfig,
        default_bootstrap: &str,
        database: &str,
        client_id: &str,
    ) -> Result<Self, SinkError> {
        let mut cc = ClientConfig::new();
        for (k, v) in &cfg.properties {
            cc.set(k, v);
        }
        cc.set("bootstrap.servers", cfg.bootstrap_servers.as_deref().unwrap_or(default_bootstrap))
            .set("client.id", client_id)
            .set("acks", &cfg.acks)
            .set("enable.idempotence", if cfg.acks == "all" { "true" } else { "false" })
            .set("queue.buffering.max.kbytes", QUEUE_MAX_KBYTES.to_string())
            .set("message.timeout.ms", MESSAGE_TIMEOUT_MS.to_string());
        if let Some(c) = &cfg.compression {
            cc.set("compression.type", c);
        }
        if let Some(b) = cfg.batch_size {
            cc.set("batch.size", b.to_string());
        }
        if let Some(l) = cfg.linger_ms {
            cc.set("linger.ms", l.to_string());
        }
        let producer = cc.create_with_context(DeliveryCounter::default()).map_err(|e| SinkError {
            class: ErrorClass::Operator,
            message: format!("cannot create the Kafka producer: {e}"),
        })?;
        Ok(KafkaSink {
            producer,
            topic_template: cfg.topic.clone(),
            database: database.to_string(),
            topics: HashMap::new(),
            interrupt: None,
        })
    }

    /// Installs a check polled while waiting for the broker; when it returns true, `publish` gives up
    /// with a retryable error (the worker uses it to honour SIGTERM promptly).
    pub fn set_interrupt(&mut self, f: impl Fn() -> bool + 'static) {
        self.interrupt = Some(Box::new(f));
    }

    fn interrupted(&self) -> bool {
        self.interrupt.as_ref().is_some_and(|f| f())
    }

    fn take_error(&self) -> Option<(ErrorClass, String)> {
        self.producer.context().first_error.lock().ok().and_then(|mut e| e.take())
    }
}

impl Sink for KafkaSink {
    fn publish(&mut self, transactions: &[Transaction]) -> Result<PublishStats, SinkError> {
        let ctx = self.producer.context().clone();
        let start_delivered = ctx.delivered.load(Ordering::Relaxed);
        let start_failed = ctx.failed.load(Ordering::Relaxed);
        let mut stats = PublishStats::default();
        let mut sent: u64 = 0;
        for txn in transactions {
            for ev in &txn.events {
                let topic = self
                    .topics
                    .entry(ev.table_oid)
                    .or_insert_with(|| expand_topic(&self.topic_template, &self.database, &ev.schema, &ev.table));
                let mut record: BaseRecord<'_, [u8], [u8], ()> =
                    BaseRecord::to(topic.as_str()).payload(&ev.payload[..]);
                if let Some(k) = &ev.key {
                    record = record.key(&k[..]);
                }
                loop {
                    match self.producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                            record = r;
                            if self.interrupt.as_ref().is_some_and(|f| f()) {
                                return Err(SinkError {
                                    class: ErrorClass::Retry,
                                    message: "publish interrupted".into(),
                                });
                            }
                            self.producer.poll(Duration::from_millis(50));
                        }
                        Err((e, _)) => {
                            return Err(SinkError {
                                class: classify(&e),
                                message: format!("cannot enqueue to topic {topic}: {e}"),
                            })
                        }
                    }
                }
                sent += 1;
                stats.bytes += (ev.payload.len() + ev.key.as_ref().map_or(0, Vec::len)) as u64;
            }
            self.producer.poll(Duration::ZERO);
        }
        // Wait for every delivery report. librdkafka fails each message after message.timeout.ms,
        // so this loop ends; the extra margin only guards against a stuck client.
        let deadline = Instant::now() + Duration::from_millis(u64::from(MESSAGE_TIMEOUT_MS) + 30_000);
        loop {
            let done = (ctx.delivered.load(Ordering::Relaxed) - start_delivered)
                + (ctx.failed.load(Ordering::Relaxed) - start_failed);
            if done >= sent {
                break;
            }
            if self.interrupted() {
                return Err(SinkError { class: ErrorClass::Retry, message: "publish interrupted".into() });
            }
            if Instant::now() > deadline {
                return Err(SinkError {
                    class: ErrorClass::Retry,
                    message: format!("{} of {sent} deliveries did not report in time", sent - done),
                });
            }
            self.producer.poll(Duration::from_millis(100));
        }
        if ctx.failed.load(Ordering::Relaxed) > start_failed {
            let (class, msg) = self.take_error().unwrap_or((ErrorClass::Retry, "delivery failed".into()));
            return Err(SinkError { class, message: format!("Kafka delivery failed: {msg}") });
        }
        stats.events = sent;
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    //! Error paths against librdkafka's in-process mock cluster (not a substitute for the real
    //! broker in the end-to-end tests: it shows aborted records and does not fence).
    use std::sync::Arc;

    use cdc_core::envelope::{Event, Op};
    use cdc_core::Lsn;
    use rdkafka::mocking::MockCluster;

    use super::*;

    fn txn(n: usize) -> Transaction {
        let events = (0..n)
            .map(|i| Event {
                table_oid: 1,
                schema: Arc::from("public"),
                table: Arc::from("orders"),
                op: Op::Insert,
                lsn: Lsn(i as u64),
                key: Some(format!("{{\"id\":{i}}}").into_bytes()),
                payload: b"{}".to_vec(),
            })
            .collect();
        Transaction { xid: 1, commit_lsn: Lsn(10), end_lsn: Lsn(11), commit_time: 0, events }
    }

    fn config(topic: &str) -> KafkaSinkConfig {
        cdc_core::config::parse_sink_config("kafka", &serde_json::json!({"topic": topic})).unwrap()
    }

    #[test]
    fn publishes_and_counts() {
        let cluster = MockCluster::new(1).unwrap();
        let mut sink =
            KafkaSink::new(&config("cdc.{schema}.{table}"), &cluster.bootstrap_servers(), "db", "test").unwrap();
        let stats = sink.publish(&[txn(3), txn(2)]).unwrap();
        assert_eq!(stats.events, 5);
        assert_eq!(stats.bytes, 5 * 2 + 3 * 8 + 2 * 8);
        assert_eq!(sink.topics[&1], "cdc.public.orders");
    }

    #[test]
    fn broker_down_is_a_retryable_error_and_interrupt_stops_waiting() {
        let cluster = MockCluster::new(1).unwrap();
        let mut sink = KafkaSink::new(&config("t"), &cluster.bootstrap_servers(), "db", "test").unwrap();
        sink.publish(&[txn(1)]).unwrap();
        cluster.broker_down(1).unwrap();
        let started = Instant::now();
        sink.set_interrupt(move || started.elapsed() > Duration::from_millis(500));
        let e = sink.publish(&[txn(1)]).unwrap_err();
        assert_eq!(e.class, ErrorClass::Retry);
        assert!(started.elapsed() < Duration::from_secs(10), "interrupt honoured");
    }

    #[test]
    fn operator_errors_are_classified() {
        assert_eq!(
            classify(&KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed)),
            ErrorClass::Operator
        );
        assert_eq!(
            classify(&KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)),
            ErrorClass::Operator
        );
        assert_eq!(classify(&KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut)), ErrorClass::Retry);
    }
}
