//! The Kinesis sink: events as records of one Kinesis data stream, at-least-once, per-key order kept.
//!
//! ```text
//!  send: events ─▶ records (data = the event, partition key = its key) ─▶ queue
//!        queue over two requests' worth ─▶ rounds
//!  flush: rounds until the queue is empty ─▶ Ok ─▶ the slot is confirmed
//!  round: the first queued record of each partition key (up to 500 / batch_max_bytes) ─▶ PutRecords
//!         acknowledged records leave the queue; failed ones stay first of their key
//! ```
//! Kinesis does not keep the order of the records of one PutRecords request, and fails records one
//! by one (a throttled shard, an internal failure) while it stores the others. So a request holds at
//! most one record per partition key, and a key's next record is sent only once the one before it
//! is acknowledged: a later record of a key never lands before an earlier one, even after a partial
//! failure. Throttled and failed records (and requests Kinesis answered with throttling or an
//! internal failure) are retried in place with a growing, jittered backoff; a delivery that makes no
//! progress for `retry_timeout_ms`, or whose request got no answer (no connection, a timeout), fails
//! (`retrying`), and the worker reads it again, so records of that delivery Kinesis had stored are
//! sent a second time, byte-identical.
//!
//! The Kinesis API is behind [`KinesisApi`]: the AWS SDK for Rust in [`aws`], a scripted double in
//! the tests.
pub mod aws;
pub mod config;

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use cdc_core::envelope::Event;

use self::config::{KinesisSinkConfig, MAX_RECORD_BYTES};
use crate::{Checkpoint, DeliveryMode, ErrorClass, PublishStats, Sink, SinkError};

/// The longest partition key Kinesis takes, in characters.
pub const MAX_PARTITION_KEY_CHARS: usize = 256;

/// One record of a PutRecords request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The record's partition key.
    pub partition_key: String,
    /// The record's data: the event, byte for byte.
    pub data: Vec<u8>,
}

impl Entry {
    /// What Kinesis counts against its size limits.
    pub fn size(&self) -> usize {
        self.data.len() + self.partition_key.len()
    }
}

/// A record Kinesis refused in an otherwise accepted request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// Kinesis' `ErrorCode` (`ProvisionedThroughputExceededException`, `InternalFailure`, ...).
    pub code: String,
    /// Kinesis' `ErrorMessage`.
    pub message: String,
}

/// A failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// Whether it may succeed later or needs an operator.
    pub class: ErrorClass,
    /// Kinesis answered it (throttled, an internal failure): retried in place. A request without
    /// an answer (no connection, a timeout) fails the delivery at once instead, so an endpoint that
    /// is down does not hold the worker for `retry_timeout_ms`.
    pub answered: bool,
    /// What happened (no secrets).
    pub message: String,
}

/// The one Kinesis call the sink makes.
pub trait KinesisApi {
    /// PutRecords of `records` to the stream: one result per record, in order (`None`: stored).
    fn put_records(&mut self, records: &[&Entry]) -> Result<Vec<Option<RecordError>>, ApiError>;
}

/// What a Kinesis error code means: retried in place (throttling, an internal failure, anything
/// unknown) or needs an operator (a missing stream, refused credentials or permissions, a KMS key
/// that cannot be used, an invalid request).
pub fn classify_code(code: &str) -> ErrorClass {
    const OPERATOR: &[&str] = &[
        "ResourceNotFoundException",
        "ResourceInUseException",
        "AccessDeniedException",
        "AccessDenied",
        "InvalidArgumentException",
        "ValidationException",
        "KMSDisabledException",
        "KMSInvalidStateException",
        "KMSAccessDeniedException",
        "KMSNotFoundException",
        "KMSOptInRequired",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "IncompleteSignature",
        "IncompleteSignatureException",
        "MissingAuthenticationToken",
        "MissingAuthenticationTokenException",
        "InvalidClientTokenId",
        "ExpiredTokenException",
        "ExpiredToken",
        "SignatureDoesNotMatch",
    ];
    if OPERATOR.contains(&code) {
        ErrorClass::Operator
    } else {
        ErrorClass::Retry
    }
}

/// A record's partition key: its event's key as JSON text, the Kafka sink's message key (the
/// tables' key columns, or the `partition_key` column: `{"account_id":"ACC-1"}`); a key longer than
/// Kinesis takes becomes `sha256:<hex of the key>` (the same key, the same partition key). An event
/// without a key gets `<commit_lsn>-<event_index>`: it has no order to keep, and a re-sent record
/// lands on the same shard as its first send.
pub fn partition_key_of(ev: &Event) -> String {
    let Some(key) = ev.key.as_deref().filter(|k| !k.is_empty()) else {
        return format!("{}-{}", ev.commit_lsn.0, ev.index);
    };
    let text = String::from_utf8_lossy(key);
    if text.chars().count() <= MAX_PARTITION_KEY_CHARS {
        return text.into_owned();
    }
    crate::hashed_key(key)
}

/// Backoff between rounds that made no progress (a throttled shard, a failed request).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The first wait.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { first: Duration::from_millis(100), max: Duration::from_secs(2) }
    }
}

/// A queued record.
struct Queued {
    entry: Entry,
    /// For messages: where it came from (the event's own names, not a copy per record).
    schema: std::sync::Arc<str>,
    table: std::sync::Arc<str>,
    lsn: u64,
}

/// The Kinesis sink, over an API client.
pub struct KinesisSink<A: KinesisApi> {
    api: A,
    stream: String,
    queue: VecDeque<Queued>,
    queued_bytes: usize,
    max_records: usize,
    max_bytes: usize,
    retry_timeout: Duration,
    backoff: Backoff,
    interrupt: Option<Box<dyn Fn() -> bool + Send>>,
    /// Records Kinesis failed and were sent again, since the sink was built.
    retried_records: u64,
    seed: u64,
}

impl<A: KinesisApi> KinesisSink<A> {
    /// A sink sending to `cfg.stream_name` through `api`.
    pub fn new(cfg: &KinesisSinkConfig, api: A) -> Self {
        KinesisSink {
            api,
            stream: cfg.stream_name.clone(),
            queue: VecDeque::new(),
            queued_bytes: 0,
            max_records: cfg.batch_max_records,
            max_bytes: cfg.batch_max_bytes,
            retry_timeout: Duration::from_millis(cfg.retry_timeout_ms),
            backoff: Backoff::default(),
            interrupt: None,
            retried_records: 0,
            seed: 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id()),
        }
    }

    /// Sets the pauses after a round with a failure.
    pub fn set_backoff(&mut self, backoff: Backoff) {
        self.backoff = backoff;
    }

    /// A check that stops a backoff early (the worker's shutdown request): the delivery then fails
    /// and is read again after the restart.
    pub fn set_interrupt(&mut self, f: impl Fn() -> bool + Send + 'static) {
        self.interrupt = Some(Box::new(f));
    }

    /// Records Kinesis failed (throttled, internal failure) and that were sent again in place.
    pub fn retried_records(&self) -> u64 {
        self.retried_records
    }

    /// The API client.
    pub fn api_mut(&mut self) -> &mut A {
        &mut self.api
    }

    fn error(&self, class: ErrorClass, what: impl std::fmt::Display) -> SinkError {
        SinkError { class, message: format!("Kinesis stream \"{}\": {what}", self.stream) }
    }

    /// The records of the next request: the first queued record of each partition key, in queue
    /// order, within the request limits (a key whose first record does not fit keeps its later
    /// ones back too). Looks at a bounded window of the queue.
    fn pick(&self) -> Vec<usize> {
        let window = self.max_records.saturating_mul(4).max(64);
        let mut seen: HashSet<&str> = HashSet::new();
        let mut picked = Vec::new();
        let mut bytes = 0usize;
        for (i, q) in self.queue.iter().enumerate().take(window) {
            if !seen.insert(q.entry.partition_key.as_str()) {
                continue;
            }
            let size = q.entry.size();
            if !picked.is_empty() && bytes + size > self.max_bytes {
                continue;
            }
            picked.push(i);
            bytes += size;
            if picked.len() >= self.max_records {
                break;
            }
        }
        picked
    }

    /// Sends one request. Returns how many records Kinesis stored, or the error that ends the
    /// delivery at once (an operator error).
    fn round(&mut self, picked: &[usize], failure: &mut Option<String>) -> Result<usize, SinkError> {
        let entries: Vec<&Entry> = picked.iter().map(|&i| &self.queue[i].entry).collect();
        let results = match self.api.put_records(&entries) {
            Ok(r) if r.len() == entries.len() => r,
            Ok(r) => {
                return Err(self.error(
                    ErrorClass::Retry,
                    format!("PutRecords answered {} results for {} records", r.len(), entries.len()),
                ))
            }
            Err(e) if e.class == ErrorClass::Operator || !e.answered => return Err(self.error(e.class, e.message)),
            Err(e) => {
                *failure = Some(e.message);
                return Ok(0);
            }
        };
        let mut stored = vec![false; self.queue.len()];
        let mut count = 0;
        for (&i, result) in picked.iter().zip(&results) {
            match result {
                None => {
                    stored[i] = true;
                    count += 1;
                }
                Some(e) if classify_code(&e.code) == ErrorClass::Operator => {
                    let q = &self.queue[i];
                    return Err(self.error(
                        ErrorClass::Operator,
                        format!(
                            "{}: {} (record of {}.{} at LSN {})",
                            e.code,
                            e.message,
                            q.schema,
                            q.table,
                            cdc_core::Lsn(q.lsn)
                        ),
                    ));
                }
                Some(e) => {
                    self.retried_records += 1;
                    *failure = Some(format!(
                        "{} records failed, e.g. {}: {}",
                        results.iter().flatten().count(),
                        e.code,
                        e.message
                    ));
                }
            }
        }
        let mut i = 0;
        self.queue.retain(|q| {
            let keep = !stored[i];
            if !keep {
                self.queued_bytes -= q.entry.size();
            }
            i += 1;
            keep
        });
        Ok(count)
    }

    /// Sends rounds until `done` holds. A round with a failure waits (backoff, jittered; back to
    /// the first wait after a round that stored records) before the next; `retry_timeout` without
    /// progress fails the delivery.
    fn drain(&mut self, done: impl Fn(&Self) -> bool) -> Result<(), SinkError> {
        let mut last_progress = Instant::now();
        let mut wait = self.backoff.first;
        while !done(self) {
            let picked = self.pick();
            if picked.is_empty() {
                break;
            }
            let mut failure = None;
            let stored = self.round(&picked, &mut failure)?;
            if stored > 0 {
                last_progress = Instant::now();
                wait = self.backoff.first;
            }
            let Some(failure) = failure else { continue };
            if last_progress.elapsed() >= self.retry_timeout {
                return Err(self.error(
                    ErrorClass::Retry,
                    format!("no progress for {} ms: {failure}", self.retry_timeout.as_millis()),
                ));
            }
            // Any failure pauses before the next round, even when other records went through (a
            // throttled shard is not sent to again at once); the pause grows while nothing is stored.
            let pause = self.jitter(wait);
            self.sleep(pause)?;
            wait = (wait * 2).min(self.backoff.max);
        }
        Ok(())
    }

    /// A wait between half and all of `d`.
    fn jitter(&mut self, d: Duration) -> Duration {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let half = d / 2;
        half + Duration::from_nanos(self.seed % (half.as_nanos() as u64 + 1))
    }

    fn sleep(&self, d: Duration) -> Result<(), SinkError> {
        let until = Instant::now() + d;
        loop {
            if self.interrupt.as_ref().is_some_and(|f| f()) {
                return Err(self.error(ErrorClass::Retry, "interrupted while backing off"));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
}

impl<A: KinesisApi> Sink for KinesisSink<A> {
    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        let mut stats = PublishStats::default();
        for ev in events {
            let entry = Entry { partition_key: partition_key_of(ev), data: ev.payload.clone() };
            if entry.size() > MAX_RECORD_BYTES {
                return Err(self.error(
                    ErrorClass::Operator,
                    format!(
                        "the event of {}.{} at LSN {} is {} bytes, more than the 1 MiB a Kinesis record holds",
                        ev.schema,
                        ev.table,
                        ev.lsn,
                        entry.size()
                    ),
                ));
            }
            stats.events += 1;
            stats.bytes += (ev.payload.len() + ev.key.as_ref().map_or(0, Vec::len)) as u64;
            self.queued_bytes += entry.size();
            let (schema, table) = (ev.schema.clone(), ev.table.clone());
            self.queue.push_back(Queued { entry, schema, table, lsn: ev.lsn.0 });
        }
        let (records, bytes) = (2 * self.max_records, 2 * self.max_bytes);
        self.drain(|s| s.queue.len() < records && s.queued_bytes < bytes)?;
        Ok(stats)
    }

    fn flush(&mut self, _checkpoint: Checkpoint) -> Result<(), SinkError> {
        self.drain(|s| s.queue.is_empty())
    }

    fn abort(&mut self) {
        self.queue.clear();
        self.queued_bytes = 0;
    }

    fn delivery_mode(&self) -> DeliveryMode {
        DeliveryMode::AtLeastOnce
    }
}

#[cfg(test)]
mod tests;
