//! The Kafka sink: librdkafka's idempotent producer, acks=all by default, transactional when
//! exactly-once is on (the default).
//!
//! Exactly-once protocol (see ARCHITECTURE.md): the pipeline has a stable `transactional.id`;
//! `open` calls `init_transactions` (which fences any older producer with that id and aborts its
//! open transaction), makes sure the pipeline's single-partition compacted progress topic exists,
//! and reads the last checkpoint committed there with a read_committed consumer. The first `send`
//! begins a Kafka transaction; every event of the batch (sent in pieces when a PostgreSQL
//! transaction is too large to hold) and, at `flush`, one checkpoint record go into that ONE Kafka
//! transaction; the worker confirms the slot only after the commit, and skips transactions at or
//! below the checkpoint after a restart.
//!
//! At-least-once: `send` enqueues, `flush` polls until each delivery report arrived.
//! Delivery reports are served by `poll` on the calling thread, so no callback ever runs on a
//! librdkafka thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cdc_core::envelope::Event;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::Message;
use rdkafka::{Offset, TopicPartitionList};

mod bell;
pub mod config;
pub mod groups;

use self::bell::ReportBell;
use self::config::{expand_topic, KafkaSinkConfig};
use crate::{Checkpoint, DeliveryMode, ErrorClass, PublishStats, Sink, SinkError};

/// How long a Kafka transaction commit (or abort, or init) may take.
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// What makes a Kafka sink transactional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transactional {
    /// `transactional.id`, stable for the pipeline across restarts.
    pub transactional_id: String,
    /// Single-partition compacted topic holding the pipeline's checkpoints.
    pub progress_topic: String,
    /// Key of the checkpoint records (the sink id).
    pub progress_key: String,
    /// This cluster's `system_identifier`, written with each checkpoint (see [`progress_record`]).
    pub system: String,
}

/// A checkpoint as the progress topic holds it: the checkpoint's own fields and the system
/// identifier of the cluster that wrote it.
pub fn progress_record(checkpoint: &Checkpoint, system: &str) -> Vec<u8> {
    checkpoint.encode_with(&[("system", system)])
}

/// The checkpoint of a progress record, if this cluster (`system`) wrote it. A record another
/// cluster wrote comes from the cluster that `pg_upgrade` made this one from: pg_upgrade carries
/// a logical slot over (from PostgreSQL 17 on) only once it has consumed all WAL, so every change
/// was delivered, and the carried slot starts at the new cluster's WAL position, above every
/// position of the old one. Its checkpoint neither bounds the slot nor skips anything here: the
/// sink resumes with none. Records of pg_cdc before 0.8.0 name no cluster and count as this one's.
pub fn own_checkpoint(record: &[u8], system: &str) -> Option<Checkpoint> {
    let checkpoint = Checkpoint::decode(record)?;
    let v: serde_json::Value = serde_json::from_slice(record).ok()?;
    match v.get("system").and_then(|s| s.as_str()) {
        Some(writer) if writer != system => None,
        _ => Some(checkpoint),
    }
}

fn kafka_err(what: &str, e: KafkaError) -> SinkError {
    SinkError { class: classify(&e), message: format!("{what}: {e}") }
}

/// Runs `f` with every signal blocked in this thread, so a thread it spawns (rdkafka's admin
/// client polls on a Rust thread) inherits the mask and never runs PostgreSQL's signal handlers.
pub fn with_signals_blocked<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: plain POSIX calls on stack-allocated signal sets; the old mask is restored.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let r = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r
    }
}

/// Upper bound of librdkafka's local queue, in KiB (its default is about 1 GB), unless the sink's
/// `properties` set `queue.buffering.max.kbytes`. The worker hands a batch over and then waits for
/// it, so the queue only needs a batch in flight; it is most of the worker's memory while a large
/// transaction streams through (measured: 64 MB -> 32 MB took a 1,000,000-row transaction's peak
/// from 78 to 60 MB, delivery time unchanged; 32 MB -> 16 MB from 68.2 to 43.7 MiB, delivered in
/// 28.7 and 26.8 s, and a 2,000,000-change backlog drained at 108-121k and 108k events/s).
pub const QUEUE_MAX_KBYTES: u32 = 16_384;

/// How long one delivery may take before it counts as failed (librdkafka `message.timeout.ms`).
pub const MESSAGE_TIMEOUT_MS: u32 = 30_000;

/// How long `open` waits for the brokers at a time before it looks whether librdkafka reported
/// them all down (so a closed port or a name that does not resolve is reported within a second,
/// not after the 30 s of a timeout).
const OPEN_STEP: Duration = Duration::from_millis(250);

/// How long [`KafkaSink::wait_for_reports`] sleeps when no delivery report was waiting and it has
/// no [`ReportBell`].
const REPORT_WAIT: Duration = Duration::from_micros(200);

/// How long [`KafkaSink::wait_for_reports`] waits for its bell at most: its callers look at the
/// interrupt flag and their deadlines between waits.
const REPORT_WAIT_MAX: Duration = Duration::from_millis(20);

/// Events [`KafkaSink::wait_for_reports`] serves in one call at most (each `poll(ZERO)` serves
/// one; a delivery-report event carries a batch of reports).
const REPORT_SERVE_MAX: usize = 1024;

/// Delivery accounting shared with librdkafka's callbacks.
#[derive(Default)]
pub struct DeliveryCounter {
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<(ErrorClass, String)>>,
    /// The broker refused the credentials (librdkafka's error callback): waiting for delivery
    /// reports would only end at `message.timeout.ms` with "timed out".
    auth_error: Mutex<Option<String>>,
    /// The last failed connection to each broker (librdkafka's error callback: its reason names
    /// the broker and the transport's error, e.g. "127.0.0.1:9092/bootstrap: Connect to
    /// ipv4#127.0.0.1:9092 failed: Connection refused"), by `host:port`. `open` reports them once
    /// every bootstrap broker failed, instead of waiting for its timeouts.
    failed_brokers: Mutex<HashMap<String, String>>,
}

/// The `host:port` of the broker a librdkafka error's reason begins with
/// (`[<protocol>://]<host>:<port>/<id>: ...`), lowercased.
fn broker_of(reason: &str) -> Option<String> {
    let (name, _) = reason.split_once(": ")?;
    let name = name.rsplit_once('/').map_or(name, |(n, _)| n);
    Some(without_protocol(name).to_ascii_lowercase())
}

/// `host:port` without a leading `<protocol>://`.
fn without_protocol(broker: &str) -> &str {
    broker.split_once("://").map_or(broker, |(_, b)| b)
}

impl ClientContext for DeliveryCounter {
    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed) => {
                if let Ok(mut slot) = self.auth_error.lock() {
                    // librdkafka's reason names the broker and the mechanism's answer, never the password.
                    slot.get_or_insert_with(|| reason.to_string());
                }
            }
            Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::Resolve | RDKafkaErrorCode::SSL) => {
                if let (Some(broker), Ok(mut failed)) = (broker_of(reason), self.failed_brokers.lock()) {
                    failed.insert(broker, reason.to_string());
                }
            }
            _ => {}
        }
    }
}

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

/// Whether a call gave up waiting for the brokers (and may be called again).
fn is_timeout(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::OperationTimedOut
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::Resolve
        )
    )
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
    /// Wakes [`KafkaSink::wait_for_reports`] when a report arrives (declared before the producer:
    /// it is dropped first).
    bell: Option<ReportBell>,
    producer: BaseProducer<DeliveryCounter>,
    topic_template: String,
    database: String,
    /// Topic by table and the version whose topic of its own the table's events go to.
    topics: HashMap<(u32, Option<i32>), String>,
    interrupt: Option<Box<dyn Fn() -> bool + Send>>,
    /// Connection settings without producer keys, for the admin client and the progress reader.
    client_config: ClientConfig,
    /// `bootstrap.servers`, for messages.
    bootstrap: String,
    transactional: Option<Transactional>,
    /// A Kafka transaction (or, at-least-once, a delivery count) is open.
    in_transaction: bool,
    /// Records queued since it opened.
    sent: u64,
    /// (delivered, failed) reports when it opened (at-least-once).
    reports_at_begin: (u64, u64),
}

/// The name of the progress topic of the exactly-once sink whose slot is `slot` (`_cdc_<hex>`).
pub fn progress_topic(slot: &str) -> String {
    format!("pg_cdc.progress.{}", slot.trim_start_matches("_cdc_"))
}

/// Deletes `topic` (a dropped sink's progress topic), waiting up to `timeout` for the broker. Ok(true)
/// when it was deleted, Ok(false) when the broker has no such topic (deleted already, or never made).
pub fn delete_topic(
    cfg: &KafkaSinkConfig,
    default_bootstrap: &str,
    client_id: &str,
    topic: &str,
    timeout: Duration,
) -> Result<bool, SinkError> {
    let (client_config, _) = client_configs(cfg, default_bootstrap, client_id, None);
    let admin: AdminClient<DefaultClientContext> = with_signals_blocked(|| client_config.create())
        .map_err(|e| kafka_err("cannot create a Kafka admin client", e))?;
    let opts = AdminOptions::new().operation_timeout(Some(timeout)).request_timeout(Some(timeout));
    let results = futures_executor::block_on(admin.delete_topics(&[topic], &opts))
        .map_err(|e| kafka_err(&format!("cannot delete topic {topic}"), e))?;
    let mut deleted = false;
    for r in results {
        match r {
            Ok(_) => deleted = true,
            Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((name, code)) => {
                return Err(kafka_err(&format!("cannot delete topic {name}"), KafkaError::AdminOp(code)))
            }
        }
    }
    Ok(deleted)
}

/// The connection settings (for the admin client and the progress reader) and the producer's
/// settings of a sink: its `properties`, then pg_cdc's choices. pg_cdc's defaults (`client.id`,
/// `queue.buffering.max.kbytes`, `message.timeout.ms`, `linger.ms`) give way to the sink's
/// `properties`; the keys pg_cdc must own (`bootstrap.servers`, `acks`, `enable.idempotence`,
/// `transactional.id`) are refused in `properties` when the config is validated.
pub fn client_configs(
    cfg: &KafkaSinkConfig,
    default_bootstrap: &str,
    client_id: &str,
    transactional: Option<&Transactional>,
) -> (ClientConfig, ClientConfig) {
    let mut client_config = ClientConfig::new();
    for (k, v) in &cfg.properties {
        client_config.set(k, v);
    }
    client_config.set("bootstrap.servers", cfg.bootstrap_servers.as_deref().unwrap_or(default_bootstrap));
    let default = |c: &mut ClientConfig, key: &str, value: &str| {
        if !cfg.properties.contains_key(key) {
            c.set(key, value);
        }
    };
    default(&mut client_config, "client.id", client_id);
    let mut cc = client_config.clone();
    if let Some(t) = transactional {
        cc.set("transactional.id", &t.transactional_id);
    }
    cc.set("acks", &cfg.acks).set("enable.idempotence", if cfg.acks == "all" { "true" } else { "false" });
    default(&mut cc, "queue.buffering.max.kbytes", &QUEUE_MAX_KBYTES.to_string());
    default(&mut cc, "message.timeout.ms", &MESSAGE_TIMEOUT_MS.to_string());
    if let Some(c) = &cfg.compression {
        cc.set("compression.type", c);
    }
    if let Some(b) = cfg.batch_size {
        cc.set("batch.size", b.to_string());
    }
    if let Some(l) = cfg.linger_ms {
        cc.set("linger.ms", l.to_string());
    } else if !cfg.properties.contains_key("linger.ms") && !cfg.properties.contains_key("queue.buffering.max.ms") {
        // The worker hands over a whole batch and then waits for it: lingering only delays the
        // last records of each batch (librdkafka's default of 5 ms, on every transaction).
        cc.set("linger.ms", "0");
    }
    (client_config, cc)
}

impl KafkaSink {
    /// Builds the producer. `default_bootstrap` is used when the config names no servers.
    /// No network I/O happens here; connection errors surface in `send` and `flush`.
    pub fn new(
        cfg: &KafkaSinkConfig,
        default_bootstrap: &str,
        database: &str,
        client_id: &str,
        transactional: Option<Transactional>,
    ) -> Result<Self, SinkError> {
        let (client_config, cc) = client_configs(cfg, default_bootstrap, client_id, transactional.as_ref());
        let producer = cc.create_with_context(DeliveryCounter::default()).map_err(|e| SinkError {
            class: ErrorClass::Operator,
            message: format!("cannot create the Kafka producer: {e}"),
        })?;
        let bootstrap = client_config.get("bootstrap.servers").unwrap_or_default().to_string();
        Ok(KafkaSink {
            bell: ReportBell::new(&producer),
            producer,
            bootstrap,
            topic_template: cfg.topic.clone(),
            database: database.to_string(),
            topics: HashMap::new(),
            interrupt: None,
            client_config,
            transactional,
            in_transaction: false,
            sent: 0,
            reports_at_begin: (0, 0),
        })
    }

    /// Creates the progress topic (one partition, compacted) unless it exists.
    fn ensure_progress_topic(&self, t: &Transactional) -> Result<(), SinkError> {
        let admin: AdminClient<DefaultClientContext> = with_signals_blocked(|| self.client_config.create())
            .map_err(|e| kafka_err("cannot create a Kafka admin client", e))?;
        let topic = NewTopic::new(&t.progress_topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
        let opts = AdminOptions::new().operation_timeout(Some(TRANSACTION_TIMEOUT));
        let results = futures_executor::block_on(admin.create_topics([&topic], &opts))
            .map_err(|e| kafka_err(&format!("cannot create progress topic {}", t.progress_topic), e))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    let e = KafkaError::AdminOp(code);
                    return Err(kafka_err(&format!("cannot create progress topic {name}"), e));
                }
            }
        }
        Ok(())
    }

    /// Reads the last checkpoint committed to the progress topic (read_committed).
    fn read_checkpoint(&self, t: &Transactional) -> Result<Option<Checkpoint>, SinkError> {
        let mut cc = self.client_config.clone();
        cc.set("group.id", format!("{}-progress-reader", t.transactional_id))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        let consumer: BaseConsumer =
            with_signals_blocked(|| cc.create()).map_err(|e| kafka_err("cannot create the progress reader", e))?;
        let err = |e| kafka_err(&format!("cannot read progress topic {}", t.progress_topic), e);
        let (low, high) = consumer.fetch_watermarks(&t.progress_topic, 0, TRANSACTION_TIMEOUT).map_err(err)?;
        if high <= low {
            return Ok(None);
        }
        // The last checkpoint is near the end; scan the whole (compacted) topic only if the tail
        // holds none.
        for start in [(high - 1000).max(low), low] {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&t.progress_topic, 0, Offset::Offset(start)).map_err(err)?;
            consumer.assign(&tpl).map_err(err)?;
            let mut last = None;
            let deadline = Instant::now() + TRANSACTION_TIMEOUT;
            loop {
                if let Some(m) = consumer.poll(Duration::from_millis(200)) {
                    let m = m.map_err(err)?;
                    if m.key() == Some(t.progress_key.as_bytes()) {
                        // The last record decides: one another cluster wrote clears what came before.
                        if let Some(p) = m.payload().filter(|p| Checkpoint::decode(p).is_some()) {
                            last = own_checkpoint(p, &t.system);
                        }
                    }
                }
                let position = consumer
                    .position()
                    .map_err(err)?
                    .find_partition(&t.progress_topic, 0)
                    .and_then(|p| p.offset().to_raw())
                    .unwrap_or(start);
                if position >= high {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(SinkError {
                        class: ErrorClass::Retry,
                        message: format!("timed out reading progress topic {} up to offset {high}", t.progress_topic),
                    });
                }
            }
            if last.is_some() || start == low {
                return Ok(last);
            }
        }
        Ok(None)
    }

    /// Starts a Kafka transaction (transactional) or a delivery count (at-least-once) unless one
    /// is open.
    fn begin(&mut self) -> Result<(), SinkError> {
        if self.in_transaction {
            return Ok(());
        }
        if self.transactional.is_some() {
            self.producer.begin_transaction().map_err(|e| kafka_err("cannot begin a Kafka transaction", e))?;
        } else {
            let ctx = self.producer.context();
            self.reports_at_begin = (ctx.delivered.load(Ordering::Relaxed), ctx.failed.load(Ordering::Relaxed));
        }
        self.in_transaction = true;
        self.sent = 0;
        Ok(())
    }

    /// Enqueues one record, waiting while the local queue is full.
    fn enqueue(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        partition: Option<i32>,
    ) -> Result<(), SinkError> {
        let mut record: BaseRecord<'_, [u8], [u8], ()> = BaseRecord::to(topic);
        if let Some(p) = payload {
            record = record.payload(p);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(p) = partition {
            record = record.partition(p);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.check_auth()?;
                    if self.interrupted() {
                        return Err(SinkError { class: ErrorClass::Retry, message: "publish interrupted".into() });
                    }
                    self.wait_for_reports();
                }
                Err((e, _)) => return Err(kafka_err(&format!("cannot enqueue to topic {topic}"), e)),
            }
        }
    }

    /// Waits until every record handed to librdkafka is acknowledged (or failed), serving delivery
    /// reports as they come. rdkafka's own `commit_transaction` flushes first, but in steps of
    /// `poll(100 ms)` that always last the whole 100 ms: measured, a flat ~100 ms on every Kafka
    /// transaction whatever its size. Done here first, the commit finds nothing in flight.
    fn drain(&self) -> Result<(), SinkError> {
        let deadline = Instant::now() + TRANSACTION_TIMEOUT;
        while self.producer.in_flight_count() > 0 {
            self.check_auth()?;
            if self.interrupted() {
                return Err(SinkError { class: ErrorClass::Retry, message: "publish interrupted".into() });
            }
            if Instant::now() > deadline {
                // Let commit_transaction report what is stuck.
                break;
            }
            self.wait_for_reports();
        }
        Ok(())
    }

    /// Serves the waiting delivery reports, or sleeps until the next one arrives (at most
    /// [`REPORT_WAIT_MAX`]) when none was waiting. Not `poll(timeout)`: rdkafka's `poll` always
    /// lasts its whole timeout, and for the last millisecond of it calls librdkafka with a timeout
    /// rounded down to 0 in a loop — a busy spin (measured: a quarter of the worker's CPU in
    /// clock_gettime at 5,000 tx/s with 1 ms polls). Without a [`ReportBell`] it sleeps
    /// [`REPORT_WAIT`] steps.
    fn wait_for_reports(&self) {
        let before = self.producer.in_flight_count();
        let Some(bell) = &self.bell else {
            self.producer.poll(Duration::ZERO);
            if self.producer.in_flight_count() == before {
                std::thread::sleep(REPORT_WAIT);
            }
            return;
        };
        // Clear, then serve the queue empty (`poll(ZERO)` serves one event): an event queued
        // after that rings the bell, so the wait below cannot miss it.
        bell.clear();
        for _ in 0..REPORT_SERVE_MAX {
            self.producer.poll(Duration::ZERO);
            if bell.queued() == 0 {
                break;
            }
        }
        if self.producer.in_flight_count() == before {
            bell.wait(REPORT_WAIT_MAX);
        }
    }

    /// Topic of an event: its table's, or the topic of its own of the table version it belongs
    /// to (`cdc_create_version_topic`), which is created first with as many partitions as the
    /// table's topic has.
    fn topic_for(&mut self, ev: &Event) -> Result<String, SinkError> {
        if let Some(t) = self.topics.get(&(ev.table_oid, ev.topic_version)) {
            return Ok(t.clone());
        }
        let base = expand_topic(&self.topic_template, &self.database, &ev.schema, &ev.table);
        let topic = match ev.topic_version {
            Some(v) => {
                let topic = cdc_core::schema::version_topic(&base, v);
                self.ensure_version_topic(&base, &topic)?;
                topic
            }
            None => base,
        };
        self.topics.insert((ev.table_oid, ev.topic_version), topic.clone());
        Ok(topic)
    }

    /// Creates a table version's topic of its own unless it exists: as many partitions as the
    /// table's topic (so a key keeps its partition number across the two), the broker's default
    /// replication. When the table's topic does not exist either, the broker's defaults for both.
    fn ensure_version_topic(&self, base: &str, topic: &str) -> Result<(), SinkError> {
        let metadata = with_signals_blocked(|| self.producer.client().fetch_metadata(Some(base), TRANSACTION_TIMEOUT))
            .map_err(|e| kafka_err(&format!("cannot read topic {base}'s metadata"), e))?;
        let partitions = metadata
            .topics()
            .iter()
            .find(|t| t.name() == base && t.error().is_none())
            .map_or(-1, |t| t.partitions().len() as i32);
        let partitions = if partitions > 0 { partitions } else { -1 };
        let admin: AdminClient<DefaultClientContext> = with_signals_blocked(|| self.client_config.create())
            .map_err(|e| kafka_err("cannot create a Kafka admin client", e))?;
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
        let opts = AdminOptions::new().operation_timeout(Some(TRANSACTION_TIMEOUT));
        let results = futures_executor::block_on(admin.create_topics([&new], &opts))
            .map_err(|e| kafka_err(&format!("cannot create version topic {topic}"), e))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(kafka_err(&format!("cannot create version topic {name}"), KafkaError::AdminOp(code)));
                }
            }
        }
        Ok(())
    }

    /// Installs a check polled while waiting for the broker; when it returns true, `send` and `flush` give up
    /// with a retryable error (the worker uses it to honour SIGTERM promptly).
    pub fn set_interrupt(&mut self, f: impl Fn() -> bool + Send + 'static) {
        self.interrupt = Some(Box::new(f));
    }

    fn interrupted(&self) -> bool {
        self.interrupt.as_ref().is_some_and(|f| f())
    }

    fn take_error(&self) -> Option<(ErrorClass, String)> {
        self.producer.context().first_error.lock().ok().and_then(|mut e| e.take())
    }

    /// Runs `attempt` (a call that waits for the brokers up to [`OPEN_STEP`]) until it succeeds,
    /// returns an error other than a timeout, or [`TRANSACTION_TIMEOUT`] passed. Between attempts
    /// it serves librdkafka's error events and fails at once when the broker refused the
    /// credentials, or when every broker is down after a failed connection: the message names
    /// the broker and the transport's error ("Connection refused", "Failed to resolve ...").
    fn await_brokers(
        &self,
        attempt: impl Fn(&BaseProducer<DeliveryCounter>) -> KafkaResult<()>,
    ) -> Result<(), SinkError> {
        let deadline = Instant::now() + TRANSACTION_TIMEOUT;
        loop {
            let result = attempt(&self.producer);
            // Error events wait on the main queue until a poll serves them (a timed poll serves
            // every event that arrives before it ends; `poll(0)` serves one).
            self.producer.poll(Duration::from_millis(10));
            match result {
                Ok(()) => return Ok(()),
                Err(e) if is_timeout(&e) => {
                    self.check_auth()?;
                    self.check_reachable()?;
                    if self.interrupted() {
                        return Err(SinkError { class: ErrorClass::Retry, message: "interrupted".into() });
                    }
                    if Instant::now() > deadline {
                        return Err(SinkError {
                            class: ErrorClass::Retry,
                            message: format!(
                                "no answer from the Kafka brokers {} within {} s",
                                self.bootstrap,
                                TRANSACTION_TIMEOUT.as_secs()
                            ),
                        });
                    }
                }
                Err(e) => {
                    self.check_auth()?;
                    self.check_reachable()?;
                    return Err(kafka_err("the Kafka brokers answered with an error", e));
                }
            }
        }
    }

    /// Fails when a connection to every bootstrap broker failed (librdkafka goes on trying, but
    /// nothing can be delivered meanwhile): the message names each and its transport's error.
    fn check_reachable(&self) -> Result<(), SinkError> {
        let failed = self.producer.context().failed_brokers.lock().map(|f| f.clone()).unwrap_or_default();
        let reasons: Option<Vec<&String>> =
            self.bootstrap.split(',').map(|b| failed.get(&without_protocol(b.trim()).to_ascii_lowercase())).collect();
        match reasons {
            Some(reasons) if !reasons.is_empty() => Err(SinkError {
                class: ErrorClass::Retry,
                message: format!(
                    "cannot reach the Kafka brokers {}: {}",
                    self.bootstrap,
                    reasons.iter().map(|r| r.as_str()).collect::<Vec<_>>().join("; ")
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Fails at once when the broker refused the credentials (an operator must fix them).
    fn check_auth(&self) -> Result<(), SinkError> {
        match self.producer.context().auth_error.lock().ok().and_then(|e| e.clone()) {
            Some(reason) => Err(SinkError {
                class: ErrorClass::Operator,
                message: format!("the Kafka broker refused the sink's credentials: {reason}"),
            }),
            None => Ok(()),
        }
    }
}

impl Sink for KafkaSink {
    fn open(&mut self) -> Result<Option<Checkpoint>, SinkError> {
        let Some(t) = self.transactional.clone() else {
            // Nothing to initialize: ask for the cluster's metadata, so a broker nobody can reach
            // is reported now rather than by the first delivery's timeout.
            self.await_brokers(|p| p.client().fetch_metadata(None, OPEN_STEP).map(drop))?;
            return Ok(None);
        };
        // init_transactions may be called again after it timed out: it resumes where it was.
        self.await_brokers(|p| p.init_transactions(OPEN_STEP))
            .map_err(|e| SinkError { message: format!("cannot initialize Kafka transactions: {}", e.message), ..e })?;
        self.ensure_progress_topic(&t)?;
        self.read_checkpoint(&t)
    }

    fn delivery_mode(&self) -> DeliveryMode {
        if self.transactional.is_some() {
            DeliveryMode::ExactlyOnce
        } else {
            DeliveryMode::AtLeastOnce
        }
    }

    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        self.begin()?;
        let mut stats = PublishStats::default();
        for ev in events {
            let topic = self.topic_for(ev)?;
            self.enqueue(&topic, ev.key.as_deref(), Some(&ev.payload), None)?;
            self.sent += 1;
            if ev.tombstone {
                self.enqueue(&topic, ev.key.as_deref(), None, None)?;
                self.sent += 1;
            }
            stats.events += 1;
            stats.bytes += (ev.payload.len() + ev.key.as_ref().map_or(0, Vec::len)) as u64;
        }
        self.producer.poll(Duration::ZERO);
        Ok(stats)
    }

    fn flush(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        if let Some(t) = self.transactional.clone() {
            self.begin()?;
            let record = progress_record(&checkpoint, &t.system);
            self.enqueue(&t.progress_topic, Some(t.progress_key.as_bytes()), Some(&record), Some(0))?;
            self.drain()?;
            self.producer
                .commit_transaction(TRANSACTION_TIMEOUT)
                .map_err(|e| kafka_err("cannot commit the Kafka transaction", e))?;
            self.in_transaction = false;
            self.sent = 0;
            return Ok(());
        }
        let sent = std::mem::take(&mut self.sent);
        let (start_delivered, start_failed) = std::mem::take(&mut self.reports_at_begin);
        self.in_transaction = false;
        let ctx = self.producer.context();
        // Wait for every delivery report. librdkafka fails each message after message.timeout.ms,
        // so this loop ends; the extra margin only guards against a stuck client.
        let deadline = Instant::now() + Duration::from_millis(u64::from(MESSAGE_TIMEOUT_MS) + 30_000);
        loop {
            let done = (ctx.delivered.load(Ordering::Relaxed) - start_delivered)
                + (ctx.failed.load(Ordering::Relaxed) - start_failed);
            if done >= sent {
                break;
            }
            self.check_auth()?;
            if self.interrupted() {
                return Err(SinkError { class: ErrorClass::Retry, message: "publish interrupted".into() });
            }
            if Instant::now() > deadline {
                return Err(SinkError {
                    class: ErrorClass::Retry,
                    message: format!("{} of {sent} deliveries did not report in time", sent - done),
                });
            }
            self.wait_for_reports();
        }
        if ctx.failed.load(Ordering::Relaxed) > start_failed {
            let (class, msg) = self.take_error().unwrap_or((ErrorClass::Retry, "delivery failed".into()));
            return Err(SinkError { class, message: format!("Kafka delivery failed: {msg}") });
        }
        Ok(())
    }

    fn abort(&mut self) {
        if std::mem::take(&mut self.in_transaction) && self.transactional.is_some() {
            // Best effort: a fenced or fatal producer cannot abort; the worker replaces it, and the
            // next producer's init_transactions aborts whatever is left open.
            let _ = self.producer.abort_transaction(TRANSACTION_TIMEOUT);
        }
        self.sent = 0;
    }
}

#[cfg(test)]
mod tests {
    //! Error paths against librdkafka's in-process mock cluster (not a substitute for the real
    //! broker in the end-to-end tests: it shows aborted records and does not fence).
    use std::sync::Arc;

    use cdc_core::envelope::Op;
    use cdc_core::pipeline::Transaction;
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
                commit_lsn: Lsn(10),
                index: i as u32 + 1,
                key: Some(format!("{{\"id\":{i}}}").into_bytes()),
                payload: b"{}".to_vec(),
                tombstone: false,
                topic_version: None,
                schema_version: None,
                routes: Vec::new(),
            })
            .collect();
        Transaction {
            xid: 1,
            commit_lsn: Lsn(10),
            end_lsn: Lsn(11),
            commit_time: 0,
            events,
            counters: Default::default(),
        }
    }

    fn cp() -> Checkpoint {
        Checkpoint { end_lsn: Lsn(11) }
    }

    #[test]
    fn checkpoint_records_round_trip() {
        let c = Checkpoint { end_lsn: Lsn(u64::MAX - 1) };
        assert_eq!(Checkpoint::decode(&c.encode()), Some(c));
        assert_eq!(Checkpoint::decode(b"garbage"), None);
    }

    #[test]
    fn a_checkpoint_another_cluster_wrote_is_not_this_ones() {
        let c = Checkpoint { end_lsn: Lsn(0x1A08FC8) };
        let mine = progress_record(&c, "7312");
        assert_eq!(Checkpoint::decode(&mine), Some(c), "pg_cdc before 0.8.0 reads it as before");
        assert_eq!(own_checkpoint(&mine, "7312"), Some(c));
        // Written by the cluster pg_upgrade made this one from: no checkpoint here.
        assert_eq!(own_checkpoint(&mine, "9999"), None);
        // A record of pg_cdc before 0.8.0 names no cluster: this cluster's, as before.
        assert_eq!(own_checkpoint(&c.encode(), "9999"), Some(c));
        assert_eq!(own_checkpoint(b"garbage", "7312"), None);
    }

    fn config(topic: &str) -> KafkaSinkConfig {
        config::parse(&serde_json::json!({"topic": topic})).unwrap()
    }

    #[test]
    fn publishes_and_counts() {
        let cluster = MockCluster::new(1).unwrap();
        let mut sink =
            KafkaSink::new(&config("cdc.{schema}.{table}"), &cluster.bootstrap_servers(), "db", "test", None).unwrap();
        assert_eq!(sink.open().unwrap(), None);
        let stats = sink.publish(&[txn(3), txn(2)], cp()).unwrap();
        assert_eq!(stats.events, 5);
        assert_eq!(stats.bytes, 5 * 2 + 3 * 8 + 2 * 8);
        assert_eq!(sink.topics[&(1, None)], "cdc.public.orders");
    }

    #[test]
    fn broker_down_is_a_retryable_error_and_interrupt_stops_waiting() {
        let cluster = MockCluster::new(1).unwrap();
        let mut sink = KafkaSink::new(&config("t"), &cluster.bootstrap_servers(), "db", "test", None).unwrap();
        sink.publish(&[txn(1)], cp()).unwrap();
        cluster.broker_down(1).unwrap();
        let started = Instant::now();
        sink.set_interrupt(move || started.elapsed() > Duration::from_millis(500));
        let e = sink.publish(&[txn(1)], cp()).unwrap_err();
        assert_eq!(e.class, ErrorClass::Retry);
        assert!(started.elapsed() < Duration::from_secs(10), "interrupt honoured");
    }

    /// A port nothing listens on: 127.0.0.1 port 1 refuses connections at once.
    const CLOSED_PORT: &str = "127.0.0.1:1";

    fn transactional() -> Option<Transactional> {
        Some(Transactional {
            transactional_id: "pg_cdc-test-unreachable".into(),
            progress_topic: "pg_cdc.progress.test".into(),
            progress_key: "test".into(),
            system: "7312".into(),
        })
    }

    /// Opens a sink on `bootstrap` and returns its error and how long the open took.
    fn open_error(bootstrap: &str, transactional: Option<Transactional>) -> (SinkError, Duration) {
        let mut sink = KafkaSink::new(&config("t"), bootstrap, "db", "test", transactional).unwrap();
        let started = Instant::now();
        let e = sink.open().expect_err("no broker can answer");
        (e, started.elapsed())
    }

    #[test]
    fn a_closed_port_is_named_within_seconds_exactly_once() {
        let (e, took) = open_error(CLOSED_PORT, transactional());
        assert_eq!(e.class, ErrorClass::Retry, "{e:?}");
        assert!(e.message.contains(CLOSED_PORT), "names the broker: {}", e.message);
        assert!(e.message.contains("Connection refused"), "names the transport's error: {}", e.message);
        assert!(took < Duration::from_secs(5), "reported after {took:?}");
    }

    #[test]
    fn a_closed_port_is_named_within_seconds_at_least_once() {
        let (e, took) = open_error(CLOSED_PORT, None);
        assert_eq!(e.class, ErrorClass::Retry, "{e:?}");
        assert!(e.message.contains(CLOSED_PORT), "names the broker: {}", e.message);
        assert!(e.message.contains("Connection refused"), "names the transport's error: {}", e.message);
        assert!(took < Duration::from_secs(5), "reported after {took:?}");
    }

    #[test]
    fn a_host_that_does_not_resolve_is_named_within_seconds() {
        for t in [transactional(), None] {
            let (e, took) = open_error("broker.pg-cdc-test.invalid:9092", t);
            assert!(e.message.contains("broker.pg-cdc-test.invalid:9092"), "names the broker: {}", e.message);
            assert!(e.message.contains("resolve"), "says it does not resolve: {}", e.message);
            assert!(took < Duration::from_secs(5), "reported after {took:?}");
        }
    }

    #[test]
    fn a_failed_connection_is_told_by_its_broker() {
        let refused = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)";
        assert_eq!(broker_of(refused).as_deref(), Some("127.0.0.1:1"));
        let tls = "sasl_ssl://Broker.Example:9093/bootstrap: SSL handshake failed";
        assert_eq!(broker_of(tls).as_deref(), Some("broker.example:9093"));
        assert_eq!(broker_of("kafka:9092/3: Disconnected").as_deref(), Some("kafka:9092"));
        assert_eq!(broker_of("1/1 brokers are down"), None);
    }

    #[test]
    fn a_reachable_broker_opens_without_an_unreachable_error() {
        // The negative control of the three above: the same open against a broker that answers.
        let cluster = MockCluster::new(1).unwrap();
        let mut sink = KafkaSink::new(&config("t"), &cluster.bootstrap_servers(), "db", "test", None).unwrap();
        assert_eq!(sink.open().unwrap(), None);
    }

    #[test]
    fn properties_override_pg_cdc_defaults_but_not_what_it_owns() {
        let cfg =
            config::parse(&serde_json::json!({"topic": "t", "properties": {"queue.buffering.max.kbytes": "65536",
                                                            "client.id": "mine", "linger.ms": 7}}))
            .unwrap();
        let (conn, producer) = client_configs(&cfg, "b:9092", "pg_cdc-s", None);
        assert_eq!(producer.get("queue.buffering.max.kbytes"), Some("65536"));
        assert_eq!(producer.get("client.id"), Some("mine"));
        assert_eq!(conn.get("client.id"), Some("mine"));
        assert_eq!(producer.get("linger.ms"), Some("7"));
        assert_eq!(producer.get("acks"), Some("all"));
        assert_eq!(producer.get("enable.idempotence"), Some("true"));
        let (_, plain) = client_configs(&config("t"), "b:9092", "pg_cdc-s", None);
        assert_eq!(plain.get("queue.buffering.max.kbytes"), Some(QUEUE_MAX_KBYTES.to_string().as_str()));
        assert_eq!(plain.get("message.timeout.ms"), Some("30000"));
        assert_eq!(plain.get("linger.ms"), Some("0"));
        assert_eq!(plain.get("client.id"), Some("pg_cdc-s"));
        assert_eq!(plain.get("bootstrap.servers"), Some("b:9092"));
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
