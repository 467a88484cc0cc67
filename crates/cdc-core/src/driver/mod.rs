//! The delivery loop of one sink, as far as it is decisions: what becomes of a read handed to the
//! sink, when a handed unit counts as delivered, when the slot is confirmed (never past a unit the
//! destination has not acknowledged), how a failure backs off, and which state the sink shows.
//!
//! ```text
//!  read (Batch) ──▶ hand_over: flush now, or on the delivery thread ──▶ handed (oldest first)
//!                                                                           │ settle
//!   confirm_delivered ◀── delivered (position, progress) ◀── delivered_unit ◀┘
//! ```
//! What only the host can do (write the catalog, confirm the slot with the progress in one
//! transaction, the shared counters, a test failpoint, a stop request) goes through
//! [`DriverPort`]; the worker implements it over SPI and shared memory, [`memory::MemoryPort`]
//! over memory for the tests. Time-dependent settings are handed in ([`Settings`]), never read
//! through the port.
//!
//! A failure is returned as a [`Failure`]; the caller hands it back to [`Driver::fail`], after
//! letting go of what it holds besides (the decoding session, a producer still opening).
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::deliver::handoff::{DeliveryThread, Flushed};
use crate::deliver::port::{ChangeSource, Checkpoint, DeliveryMode, Sink, SinkError};
use crate::deliver::protocol::{self, FlushPlan};
pub use crate::deliver::read::RouteProgress;
use crate::deliver::read::{self, unix_micros_now, Batch, Failure, Inputs, Sent, TableProgress, Unit, FETCH_ROWS};
use crate::format::Registration;
use crate::lookup::LookupFlush;
use crate::pipeline::{Assembler, SinkTables};
use crate::snapshot::{ChunkSource, SnapshotReader};
use crate::state::SinkState;
use crate::stats::{DeliveryCounters, TableCounters};
use crate::types::TypeRegistry;
use crate::Lsn;

pub mod cadence;
#[cfg(any(test, feature = "testutil"))]
pub mod memory;
pub mod snapshot;
#[cfg(test)]
mod tests;

/// While deliveries keep coming, the slot is confirmed (and the per-table progress written, in
/// the same transaction) at most this often; at once after a pass that read nothing, and for the
/// first delivery after a quiet spell. Confirming after every delivery was the largest fixed cost
/// of a pass at a steady 2,000 small transactions/s (an upsert planned again each time, and a
/// transaction). What is delivered and not confirmed yet is read again only by a new session (a
/// crash, a failure): an exactly-once sink skips it (its checkpoint covers it), an at-least-once
/// sink sends it again.
pub const CONFIRM_INTERVAL: Duration = Duration::from_millis(200);

/// How long after a delivery of something a sink's reads take the delivering sinks' turns (a pass
/// in between that finds nothing, woken by WAL of other tables, does not move it back).
pub const DELIVERING_FOR: Duration = Duration::from_secs(1);

/// WAL written between two running-transactions records of the launcher: about the most a new
/// decoding session decodes again before the slot's confirmed position. A slot this far behind
/// the WAL gets a heartbeat sooner ([`Driver::heartbeat_due`]).
pub const RESTART_POINT_BYTES: u64 = 2 << 20;

/// Reads in a row that may stop at a change the worker's catalog copy does not show yet and be
/// read again at once, keeping the destination (see [`Driver::fail`]); the next one is a failure
/// that backs off, so a copy that never catches up makes no hot loop.
pub const MAX_REREADS: u32 = 3;

/// How long a worker napping until `left` has passed waits on its latch next, looking at least
/// every `poll`: whole milliseconds (PostgreSQL's `WaitLatch` takes milliseconds), rounded up. A
/// wait rounded down would be 0 for the nap's last fraction of a millisecond, and the nap would
/// spin through it in calls that return at once (a dozen or more per nap, measured).
pub fn latch_wait(left: Duration, poll: Duration) -> Duration {
    Duration::from_millis(left.min(poll).as_micros().div_ceil(1000) as u64)
}

/// The settings a step runs with (the host reads them; the driver never does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The longest backoff after a failure (`cdc.max_retry_backoff_ms`).
    pub max_backoff: Duration,
    /// How often a sink with nothing to deliver writes a heartbeat (`cdc.heartbeat_interval_ms`).
    pub heartbeat_interval: Duration,
}

/// The settings of one read (the host reads them; the driver never does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadSettings {
    /// The most rows a read holds in memory before a transaction is read in two passes
    /// (`cdc.batch_changes`).
    pub large_frames: usize,
    /// Transactions the destination holds already are skipped (off only in tests).
    pub dedup: bool,
    /// Test only: keep every row of a snapshot chunk (see `SnapshotReader::skip_window`).
    pub skip_window: bool,
    /// A unit is flushed once it is this old (`checkpoint_interval_ms`).
    pub checkpoint_interval: Option<Duration>,
}

/// What a read did ([`Driver::read`]).
#[derive(Debug)]
pub enum Read {
    /// The slot held nothing past where the sink stands.
    Nothing,
    /// Nothing was sent: there is something to send and no destination, which the caller opens
    /// (the next steps wait for it). The worker also answers this for a destination it just
    /// opened in place while the sink has a snapshot to deliver: it reads a chunk first.
    Open,
    /// A unit was sent: the read, and the flush plan an in-database sink followed in it.
    Sent(Box<Batch>, Option<FlushPlan>),
}

/// What only the host can do for a sink's driver. Each call is about the one sink the port was
/// made for.
pub trait DriverPort {
    /// The sink's name, for log lines.
    fn sink_name(&self) -> &str;

    /// A line for the server log.
    fn log(&mut self, message: &str);

    /// Records the sink's state and last error in the catalog.
    fn write_state(&mut self, state: SinkState, error: Option<&str>) -> Result<(), String>;

    /// Changes the sink's shared counters.
    fn counters(&mut self, f: &mut dyn FnMut(&mut DeliveryCounters));

    /// Adds filter and transformation counts, by table OID.
    fn add_tables(&mut self, counts: &HashMap<u32, TableCounters>);

    /// Records the latencies of the events in `sent`, acknowledged at `acked` (Unix microseconds).
    fn record_latencies(&mut self, sent: &[Sent], acked: i64);

    /// Writes the changed rows of the sink's lookup copies (before the slot moves past them).
    fn save_lookups(&mut self, flush: &[LookupFlush]) -> Result<(), String>;

    /// In one transaction: records the per-table and per-route progress delivered since the last
    /// confirm and the schema registrations, and confirms the slot up to `lsn`.
    fn confirm(
        &mut self,
        lsn: Lsn,
        progress: &HashMap<u32, TableProgress>,
        routes: &RouteProgress,
        registrations: &[Registration],
    ) -> Result<(), String>;

    /// A unit was committed at the destination and the slot is not confirmed past it yet (the
    /// test failpoint `after_sink_commit` ends the process here).
    fn committed_at_destination(&mut self) {}

    /// The process is asked to stop.
    fn stop_requested(&self) -> bool;
}

/// A sink's open destination.
pub enum Producer {
    /// Opened on a thread of its own and then driven by its delivery thread: the next unit is
    /// read while the last one commits.
    Threaded(DeliveryThread),
    /// Opened in the read's transaction, and driven in it (an in-database sink, a webhook).
    InPlace(Box<dyn Sink>),
}

impl Producer {
    /// Gives up the open unit and keeps the destination for the next one (see
    /// [`DeliveryThread::discard`]; a sink in place aborts it).
    pub fn discard(&mut self) -> Result<(), SinkError> {
        match self {
            Producer::Threaded(t) => t.discard(),
            Producer::InPlace(s) => {
                s.abort();
                Ok(())
            }
        }
    }

    /// The sink behind it.
    pub fn sink(&mut self) -> &mut dyn Sink {
        match self {
            Producer::Threaded(t) => t,
            Producer::InPlace(s) => s.as_mut(),
        }
    }

    /// It writes into the source database (see [`Sink::in_source_database`]).
    pub fn in_source_database(&self) -> bool {
        match self {
            Producer::Threaded(t) => t.in_source_database(),
            Producer::InPlace(s) => s.in_source_database(),
        }
    }
}

/// A unit read and handed to its sink, waiting to be delivered: what its delivery records.
#[derive(Debug, Default)]
pub struct Handed {
    /// Its flush runs on the sink's delivery thread; its report is awaited (else it is done:
    /// flushed already, or with nothing to flush).
    pub awaiting: bool,
    /// The checkpoint it is flushed with, if any.
    pub flushed: Option<Checkpoint>,
    /// When the flush returned, Unix microseconds.
    pub acked: i64,
    /// Where the slot may be confirmed once it is delivered.
    pub target: Option<Lsn>,
    /// Its events were committed at the destination once flushed (an in-database sink commits
    /// nothing for a unit without events).
    pub commits: bool,
    /// The sink is exactly-once.
    pub exactly_once: bool,
    /// Per-table progress of what it sent.
    pub progress: HashMap<u32, TableProgress>,
    /// Per-route progress of what it sent.
    pub routes: RouteProgress,
    /// Its counter increments.
    pub counted: DeliveryCounters,
    /// Its filter and transformation counts.
    pub tables: HashMap<u32, TableCounters>,
    /// What was handed over and when (for the latencies).
    pub sent_log: Vec<Sent>,
}

impl Handed {
    /// Its counter increments, with the delivery transaction of an exactly-once sink when it was
    /// flushed with `checkpoint`.
    fn counts(&self, checkpoint: Option<Checkpoint>) -> DeliveryCounters {
        let mut counted = self.counted;
        if let (Some(checkpoint), true) = (checkpoint, self.exactly_once) {
            counted.committed_transactions = 1;
            counted.committed_lsn = checkpoint.end_lsn.0;
        }
        counted
    }
}

/// Counts an abandoned delivery: an exactly-once sink's open transaction was aborted.
fn count_abort(port: &mut dyn DriverPort, exactly_once: bool) {
    port.counters(&mut |c| {
        if exactly_once && c.open_transactions > 0 {
            c.aborted_transactions += 1;
        }
        c.open_transactions = 0;
    });
}

/// The driver of one sink: its destination, what it handed over and delivered, where it stands in
/// its snapshot, its failures and the state last written.
pub struct Driver {
    /// Encodes its events (tables, format, keys, lookups).
    pub assembler: Assembler,
    /// Its open destination.
    pub producer: Option<Producer>,
    failures: u32,
    /// Reads in a row that stopped at a change the catalog copy did not show yet.
    rereads: u32,
    /// No step before this instant (backing off after a failure).
    pub retry_at: Option<Instant>,
    /// (state, last_error) as last written to the catalog (`None`: a label this version does not
    /// know, so the next state is always written).
    written: (Option<SinkState>, Option<String>),
    last_heartbeat: Option<Instant>,
    heartbeat_end: Option<Lsn>,
    /// Last checkpoint the sink committed (exactly-once), read at open and kept current.
    pub checkpoint: Option<Checkpoint>,
    /// Its events are held back for a compliance reason (mirrors the shared counter, so a
    /// delivering sink does not take the counters' lock each pass to clear it).
    compliance_hold: bool,
    /// Delivered (flushed) up to here: ahead of the slot's confirmed position until the next
    /// confirm ([`CONFIRM_INTERVAL`]); reads go on from here.
    pub delivered: Option<Lsn>,
    /// Per-table progress of what was delivered since the last confirm (written with it).
    unrecorded: HashMap<u32, TableProgress>,
    /// Per route, what was delivered since the last confirm.
    unrecorded_routes: RouteProgress,
    /// When the slot was last confirmed.
    last_confirm: Option<Instant>,
    /// Units read and handed to the sink that are not delivered yet, oldest first: their
    /// flushes run on the sink's delivery thread while the next unit is read.
    pub handed: VecDeque<Handed>,
    /// When a delivery of something last ended: while a unit is in flight and for
    /// [`DELIVERING_FOR`] after that, its reads take turns among the delivering sinks.
    last_delivered: Option<Instant>,
    /// Its snapshot's chunk in flight and the transactions its reads met lately.
    pub snap: SnapshotReader,
    /// Whether it has snapshot rows left to deliver (`None`: not looked up yet).
    pub snapshotting: Option<bool>,
    /// The chunk it held was delivered, and the catalog does not say so yet.
    pub chunk_delivered: bool,
    /// Where it stood (checkpoint, or the slot's confirmed position) when its destination was
    /// first opened in this run, before it delivered anything: a chunk the catalog has in flight
    /// from an earlier run was delivered if this is past its watermark.
    pub opened_at: Option<Lsn>,
    /// Chunks read in this run (names their watermarks).
    pub chunks: u64,
}

impl Driver {
    /// A sink's driver; `written` is the state the catalog shows now.
    pub fn new(assembler: Assembler, written: (Option<SinkState>, Option<String>)) -> Driver {
        Driver {
            assembler,
            producer: None,
            failures: 0,
            rereads: 0,
            retry_at: None,
            written,
            last_heartbeat: None,
            heartbeat_end: None,
            checkpoint: None,
            // The shared counter may be set from before (a worker restart, a changed config):
            // cleared at the first delivery.
            compliance_hold: true,
            delivered: None,
            unrecorded: HashMap::new(),
            unrecorded_routes: HashMap::new(),
            last_confirm: None,
            handed: VecDeque::new(),
            last_delivered: None,
            snap: SnapshotReader::default(),
            snapshotting: None,
            chunk_delivered: false,
            opened_at: None,
            chunks: 0,
        }
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// It backs off after a failure: no step before `retry_at`.
    pub fn backing_off(&self, now: Instant) -> bool {
        self.retry_at.is_some_and(|t| now < t)
    }

    /// Where reading stands: the slot's confirmed position, or past it by what was delivered
    /// since the last confirm and what was handed to the sink since.
    pub fn position(&self, confirmed: Lsn) -> Lsn {
        let handed = self.handed.iter().filter_map(|h| h.target).max();
        [self.delivered, handed].into_iter().flatten().filter(|d| *d > confirmed).max().unwrap_or(confirmed)
    }

    /// Its destination was opened: the first time in this run, where it stood then (its
    /// checkpoint unless `ignore_checkpoint`, a test setting, and at least the slot's position).
    pub fn note_opened(&mut self, confirmed: Lsn, ignore_checkpoint: bool) {
        if self.opened_at.is_none() {
            let checkpoint = self.checkpoint.filter(|_| !ignore_checkpoint);
            self.opened_at = Some(checkpoint.map_or(confirmed, |c| c.end_lsn.max(confirmed)));
        }
    }

    /// Whether it reads a snapshot chunk before its next read: it has snapshot rows left, holds
    /// no chunk, and its destination is open (so it knows where it stands).
    pub fn wants_chunk(&self) -> bool {
        self.snapshotting == Some(true) && self.snap.chunk.is_none() && self.opened_at.is_some()
    }

    /// Whether its reads take the delivering sinks' turns: a unit is in flight, or one was
    /// delivered within [`DELIVERING_FOR`].
    pub fn delivering(&self, now: Instant) -> bool {
        !self.handed.is_empty()
            || self.last_delivered.is_some_and(|t| now.saturating_duration_since(t) < DELIVERING_FOR)
    }

    /// A unit handed over earlier is still being committed on the delivery thread.
    pub fn overlapping(&self) -> bool {
        self.handed.iter().any(|h| h.awaiting)
    }

    /// Records a state in the catalog, when it differs from what was written last (a write that
    /// fails is tried again with the next state).
    pub fn set_state(&mut self, port: &mut dyn DriverPort, state: SinkState, error: Option<String>) {
        if self.written.0 == Some(state) && self.written.1 == error {
            return;
        }
        let line = match &error {
            Some(e) => format!("pg_cdc sink \"{}\": {state}: {e}", port.sink_name()),
            None => format!("pg_cdc sink \"{}\": {state}", port.sink_name()),
        };
        port.log(&line);
        if port.write_state(state, error.as_deref()).is_ok() {
            self.written = (Some(state), error);
        }
    }

    /// Whether a read that failed with `failure` keeps its destination open (the caller does not
    /// abort it first, [`Driver::fail`] gives up the unit): the read stopped at a change the
    /// catalog copy did not show yet (`reread`), fewer than [`MAX_REREADS`] times in a row, and
    /// the destination is outside the source database (an in-database sink's unit went with the
    /// read's transaction).
    pub fn keeps_producer(&self, failure: &Failure) -> bool {
        failure.reread && self.rereads < MAX_REREADS && self.producer.as_ref().is_some_and(|p| !p.in_source_database())
    }

    /// Fails the sink: counts the failure, backs off (not before its destination asked, a
    /// webhook's `Retry-After`), gives up its producer and what it handed over and delivered
    /// since the last confirm (a new session reads it again from the slot's confirmed position),
    /// and records the state. A failure that holds events back for a compliance reason shows in
    /// the counters. The caller lets go of its decoding session and of a producer still opening.
    ///
    /// A read that stopped at a change the catalog copy did not show yet ([`Driver::keeps_producer`])
    /// is no failure of the destination: every DDL on a captured table can cause one, when the
    /// worker read its copy just before the DDL committed. Its units handed over earlier are
    /// settled, its open unit is given up (an exactly-once sink aborts its transaction) and the
    /// producer is kept; it reads again at once, with no backoff and its state unchanged. Before,
    /// each such read dropped the producer and backed off: an exactly-once sink then initialised
    /// its transactions again (seconds while the broker still aborts the fenced one) behind a
    /// backoff that doubled, and under steady DDL each wait let in the next DDL (seen: 8 minutes
    /// of retries in the chaos run after a broker restart).
    pub fn fail(&mut self, port: &mut dyn DriverPort, failure: Failure, settings: &Settings, now: Instant) {
        if self.keeps_producer(&failure) {
            self.rereads += 1;
            match self.reread(port) {
                Ok(()) => {
                    port.counters(&mut |c| c.catalog_rereads += 1);
                    port.log(&format!("pg_cdc sink \"{}\": {}", port.sink_name(), failure.message));
                    return;
                }
                Err(f) => return self.fail(port, f, settings, now),
            }
        }
        if failure.compliance {
            self.compliance_hold = true;
            port.counters(&mut |c| c.compliance_hold = 1);
        }
        self.failures = self.failures.saturating_add(1);
        let hold = self.producer.as_mut().and_then(|p| p.sink().hold_until());
        let backoff = protocol::backoff(self.failures, settings.max_backoff);
        self.retry_at = Some((now + backoff).max(hold.unwrap_or(now)));
        let unreported = match self.producer.take() {
            Some(Producer::Threaded(t)) => t.close(),
            _ => Vec::new(),
        };
        self.count_committed(port, unreported);
        self.set_state(port, failure.state, Some(failure.message));
        self.forget_since_confirm();
    }

    /// Counts the units handed over that reached the destination, before a failure forgets them
    /// (they are read again, found there and skipped, and counted as duplicates then): those
    /// flushed in place, and those whose flush on the delivery thread reported a commit (`reports`,
    /// the thread's untaken reports, in order), up to the first that did not. Without this, a read
    /// failing while a commit was in flight lost that unit from `events_delivered` for good.
    fn count_committed(&mut self, port: &mut dyn DriverPort, reports: Vec<Flushed>) {
        let mut reports = reports.into_iter();
        for unit in &self.handed {
            let checkpoint = if unit.awaiting {
                match reports.next() {
                    Some(Flushed { result: Ok(()), checkpoint, .. }) => Some(checkpoint),
                    _ => break,
                }
            } else {
                unit.flushed
            };
            let counted = unit.counts(checkpoint);
            port.counters(&mut |c| add(c, &counted));
            port.add_tables(&unit.tables);
        }
    }

    /// Forgets what was read and delivered since the last confirm, for a new session to read it
    /// again from the slot's confirmed position: the assembler's state, the delivered position
    /// and its progress not recorded yet, the units handed over.
    fn forget_since_confirm(&mut self) {
        self.assembler.reset();
        self.delivered = None;
        self.unrecorded.clear();
        self.unrecorded_routes.clear();
        self.handed.clear();
    }

    /// Settles the units handed over, gives up the open one keeping the producer, and forgets
    /// what a failure forgets (see [`Driver::fail`]).
    fn reread(&mut self, port: &mut dyn DriverPort) -> Result<(), Failure> {
        self.settle(port, 0)?;
        let Some(producer) = self.producer.as_mut() else { return Ok(()) };
        let exactly_once = producer.sink().delivery_mode() == DeliveryMode::ExactlyOnce;
        if let Err(e) = producer.discard() {
            self.producer = None;
            return Err(Failure::sink(e));
        }
        count_abort(port, exactly_once);
        self.forget_since_confirm();
        Ok(())
    }

    /// Abandons the sink's open delivery (its events are read again later) and counts it. When
    /// the process is stopping the producer is dropped instead: aborting can block up to the
    /// transaction timeout (measured: 30 s after a SIGTERM that interrupted the first delivery
    /// to a new topic), and the next producer's initialisation fences it and aborts its open
    /// transaction, which is what exactly-once relies on after a kill.
    pub fn abort(&mut self, port: &mut dyn DriverPort) {
        let Some(producer) = self.producer.as_mut() else { return };
        let exactly_once = producer.sink().delivery_mode() == DeliveryMode::ExactlyOnce;
        if port.stop_requested() {
            self.producer = None;
        } else {
            producer.sink().abort();
        }
        count_abort(port, exactly_once);
    }

    /// Reads the slot (`inner`, from where the sink stands) through the sink's snapshot reader (a
    /// chunk is spliced in at its watermark) and sends what it read to the destination as one unit
    /// (see `deliver::read`). A sink with a snapshot to deliver asks for its destination even with
    /// no change to send. An in-database sink is flushed here too, inside the caller's transaction,
    /// so its events and checkpoint commit together; a failure aborts what it sent (the caller
    /// rolls its transaction back).
    pub fn read(
        &mut self,
        inner: &mut dyn ChangeSource,
        types: &mut TypeRegistry,
        tables: &SinkTables,
        settings: &ReadSettings,
        position: Lsn,
        on_open: Option<&dyn Fn()>,
    ) -> Result<Read, Failure> {
        self.snap.skip_window = settings.skip_window;
        let mut source = ChunkSource { inner, state: &mut self.snap };
        let first = source.fetch(FETCH_ROWS, types);
        if first.is_empty() && !(self.producer.is_none() && self.snapshotting == Some(true)) {
            return Ok(Read::Nothing);
        }
        let Some(producer) = self.producer.as_mut() else { return Ok(Read::Open) };
        let inputs = Inputs {
            tables,
            checkpoint: self.checkpoint,
            dedup: settings.dedup,
            large_frames: settings.large_frames,
            checkpoint_interval: settings.checkpoint_interval,
            on_open,
        };
        let in_source = producer.in_source_database();
        let sink = producer.sink();
        let read = {
            let mut unit = Unit { assembler: &mut self.assembler, sink: &mut *sink, source: &mut source, types };
            read::read(&mut unit, &inputs, first)
        };
        if !in_source {
            return read.map(|b| Read::Sent(Box::new(b), None));
        }
        let flushed = read.and_then(|b| {
            let plan = protocol::plan_flush(sink.delivery_mode(), &b, position, self.checkpoint, settings.dedup);
            if let Some(cp) = plan.flush {
                sink.flush(cp).map_err(Failure::sink)?;
            }
            Ok(Read::Sent(Box::new(b), Some(plan)))
        });
        if flushed.is_err() {
            sink.abort();
        }
        flushed
    }

    /// Hands a read over to the sink: flushes it as `plan` says (`preflushed`: an in-database
    /// sink flushed in the read's transaction already), here or on the delivery thread when
    /// `overlap` (a large unit: the next one is read while it commits) or a flush is in flight,
    /// and queues it to be settled. An error aborts the delivery; the caller fails the sink.
    pub fn hand_over(
        &mut self,
        port: &mut dyn DriverPort,
        batch: Batch,
        plan: FlushPlan,
        preflushed: bool,
        overlap: bool,
        mode: DeliveryMode,
    ) -> Result<(), Failure> {
        let mut handed = Handed {
            awaiting: false,
            flushed: plan.flush,
            acked: 0,
            target: plan.confirm,
            // An in-database sink commits nothing for a unit without events (a heartbeat's).
            commits: batch.sent || !self.producer.as_ref().is_some_and(Producer::in_source_database),
            exactly_once: mode == DeliveryMode::ExactlyOnce,
            progress: batch.progress,
            routes: batch.routes,
            counted: batch.counted,
            tables: batch.tables,
            sent_log: batch.sent_log,
        };
        if let (Some(producer), Some(checkpoint)) = (self.producer.as_mut(), plan.flush) {
            let flushed = match producer {
                _ if preflushed => Ok(()),
                Producer::Threaded(t) if overlap || t.in_flight() > 0 => {
                    t.start_flush(checkpoint).map(|()| handed.awaiting = true)
                }
                p => p.sink().flush(checkpoint),
            };
            if let Err(e) = flushed {
                self.abort(port);
                return Err(Failure::sink(e));
            }
            handed.acked = unix_micros_now();
            if handed.exactly_once {
                // The next read skips what this unit holds, as if it had committed; if it does
                // not, the sink fails and is opened again, reading the checkpoint anew.
                self.checkpoint = Some(checkpoint);
            }
        }
        if let Some(lsn) = handed.target {
            port.counters(&mut |c| c.read_lsn = c.read_lsn.max(lsn.0));
        }
        self.handed.push_back(handed);
        Ok(())
    }

    /// Takes the reports of the handed units, oldest first, until at most `keep` are still
    /// awaited (waiting for the destination when needed), and records each delivered one. A
    /// failed one aborts the delivery: the caller fails the sink, and the units after it are read
    /// again. When the process is stopping it waits at most about 2 s.
    pub fn settle(&mut self, port: &mut dyn DriverPort, keep: usize) -> Result<(), Failure> {
        let started = Instant::now();
        loop {
            let Some(front) = self.handed.front() else { return Ok(()) };
            if front.awaiting {
                let awaited = self.handed.iter().filter(|h| h.awaiting).count();
                let t = match self.producer.as_mut() {
                    Some(Producer::Threaded(t)) if t.in_flight() > 0 => t,
                    // Cannot happen: each awaited unit has a flush in flight.
                    _ => return Err(Failure::new(SinkState::Retrying, "a delivery's report was lost")),
                };
                let report = if awaited > keep {
                    // Bounded by the sink's own timeouts; when stopping, its interrupt ends it
                    // within moments, and what is not reported by then is read again.
                    t.wait_flushed(Duration::from_millis(100))
                } else {
                    t.try_flushed()
                };
                let Some(report) = report else {
                    if awaited > keep && !(port.stop_requested() && started.elapsed() >= Duration::from_secs(2)) {
                        continue;
                    }
                    return Ok(());
                };
                if let Err(e) = report.result {
                    self.abort(port);
                    return Err(Failure::sink(e));
                }
                if let Some(front) = self.handed.front_mut() {
                    front.awaiting = false;
                    front.acked = report.at_unix_micros;
                }
            }
            let Some(done) = self.handed.pop_front() else { return Ok(()) };
            self.delivered_unit(port, done)?;
        }
    }

    /// Records a delivered unit: counters, latencies, the lookup copies, and the position and
    /// progress the next confirm writes.
    fn delivered_unit(&mut self, port: &mut dyn DriverPort, done: Handed) -> Result<(), Failure> {
        if !done.sent_log.is_empty() {
            // From the end of the delivery, not the read: a slow commit must not move the sink's
            // next read to the idle sinks' turns (an idle sink's units carry only heartbeats).
            self.last_delivered = Some(Instant::now());
        }
        let counted = done.counts(done.flushed);
        if done.flushed.is_some() {
            // A unit handed over after this one is open at the destination.
            let open = u64::from(!self.handed.is_empty());
            port.counters(&mut |c| {
                add(c, &counted);
                c.open_transactions = open;
            });
            port.add_tables(&done.tables);
            port.record_latencies(&done.sent_log, done.acked);
            if done.commits {
                port.committed_at_destination();
            }
        } else {
            port.counters(&mut |c| add(c, &counted));
            port.add_tables(&done.tables);
        }
        if counted.duplicate_events_filtered > 0 {
            let line = format!(
                "pg_cdc sink \"{}\": skipped {} events its destination holds already (checkpoint {})",
                port.sink_name(),
                counted.duplicate_events_filtered,
                self.checkpoint.map(|c| c.end_lsn).unwrap_or_default()
            );
            port.log(&line);
        }
        let Some(lsn) = done.target else { return Ok(()) };
        // The lookup copies first: after a crash between the two they are ahead of the slot,
        // which they know (their position) and skip; behind it they would miss changes.
        let flush = self.assembler.lookups_mut().take_flush();
        if !flush.is_empty() {
            port.save_lookups(&flush).map_err(|e| {
                Failure::new(
                    SinkState::Error,
                    format!("cannot save the lookup copies of sink \"{}\": {e}", port.sink_name()),
                )
            })?;
        }
        self.delivered = Some(lsn);
        self.add_progress(&done.progress, &done.routes);
        if !done.exactly_once {
            port.counters(&mut |c| c.committed_lsn = c.committed_lsn.max(lsn.0));
        }
        Ok(())
    }

    /// Adds a delivery's per-table progress to what the next confirm records.
    fn add_progress(&mut self, progress: &HashMap<u32, TableProgress>, routes: &RouteProgress) {
        for (key, (n, at)) in routes {
            let u = self.unrecorded_routes.entry(key.clone()).or_default();
            u.0 += n;
            u.1 = u.1.max(*at);
        }
        for (oid, p) in progress {
            let u = self.unrecorded.entry(*oid).or_default();
            u.events += p.events;
            if p.last_commit_lsn >= u.last_commit_lsn {
                u.last_commit_lsn = p.last_commit_lsn;
                u.last_commit_unix_micros = p.last_commit_unix_micros;
            }
        }
    }

    /// Whether the slot is confirmed after this step: at once after a pass that read nothing,
    /// when stopping, or for the first delivery after a quiet spell; else at most every
    /// [`CONFIRM_INTERVAL`].
    pub fn confirm_due(&self, rows: u64, stopping: bool, now: Instant) -> bool {
        rows == 0 || stopping || self.last_confirm.is_none_or(|t| now.saturating_duration_since(t) >= CONFIRM_INTERVAL)
    }

    /// Confirms the slot up to what the sink delivered, if that is past `confirmed` (the slot's
    /// confirmed position), with the progress delivered since the last confirm, in one
    /// transaction (see [`DriverPort::confirm`]): after a crash the slot and the offsets agree.
    /// What was handed over and not delivered is never confirmed.
    pub fn confirm_delivered(&mut self, port: &mut dyn DriverPort, confirmed: Lsn) -> Result<(), String> {
        let Some(lsn) = self.delivered.filter(|d| *d > confirmed) else {
            return Ok(());
        };
        let registrations = self.assembler.take_registrations();
        port.confirm(lsn, &self.unrecorded, &self.unrecorded_routes, &registrations)?;
        self.unrecorded.clear();
        self.unrecorded_routes.clear();
        self.last_confirm = Some(Instant::now());
        Ok(())
    }

    /// A step delivered (or had nothing to deliver) without a failure: the backoff is over, and
    /// a compliance hold is lifted.
    pub fn succeeded(&mut self, port: &mut dyn DriverPort) {
        self.failures = 0;
        self.rereads = 0;
        self.retry_at = None;
        if std::mem::take(&mut self.compliance_hold) {
            port.counters(&mut |c| c.compliance_hold = 0);
        }
    }

    /// Whether to write a heartbeat now, when a read found nothing: the slot is behind the WAL
    /// (`insert`) by more than its own last heartbeat, and the interval passed since the last one
    /// (or the slot is more than [`RESTART_POINT_BYTES`] behind and the last heartbeat was read
    /// already: a new session would decode all that WAL again). A heartbeat due is counted as
    /// written: call [`Driver::heartbeat_written`] with where it ended.
    pub fn heartbeat_due(&mut self, insert: Lsn, confirmed: Lsn, settings: &Settings, now: Instant) -> bool {
        let far = insert.0 > confirmed.0.saturating_add(RESTART_POINT_BYTES)
            && self.heartbeat_end.is_none_or(|h| h <= confirmed);
        let due =
            far || self.last_heartbeat.is_none_or(|t| now.saturating_duration_since(t) >= settings.heartbeat_interval);
        // Only when WAL other than its own last heartbeat was written since it.
        let moved = insert > confirmed && self.heartbeat_end.is_none_or(|h| insert.0 > h.0 + 128);
        if due && moved {
            self.last_heartbeat = Some(now);
        }
        due && moved
    }

    /// The heartbeat [`Driver::heartbeat_due`] asked for was written, ending at `end`.
    pub fn heartbeat_written(&mut self, end: Lsn) {
        self.heartbeat_end = Some(end);
    }

    /// The state a step that delivered shows: `snapshotting` while its snapshot has rows left
    /// (or it delivers nothing else, `one_off`), else `running`.
    pub fn delivering_state(&self, one_off: bool) -> SinkState {
        if one_off || self.snapshotting == Some(true) || self.snap.chunk.is_some() {
            SinkState::Snapshotting
        } else {
            SinkState::Running
        }
    }
}

/// Adds one delivery's counts to a sink's counters (it has no transaction open any more).
fn add(c: &mut DeliveryCounters, d: &DeliveryCounters) {
    c.open_transactions = 0;
    c.committed_transactions += d.committed_transactions;
    c.committed_lsn = c.committed_lsn.max(d.committed_lsn);
    c.duplicate_events_detected += d.duplicate_events_detected;
    c.duplicate_events_filtered += d.duplicate_events_filtered;
    c.events_delivered += d.events_delivered;
    c.bytes_delivered += d.bytes_delivered;
    c.source_transactions_delivered += d.source_transactions_delivered;
    c.large_transactions += d.large_transactions;
    c.pii_redactions += d.pii_redactions;
    c.audit_records += d.audit_records;
}
