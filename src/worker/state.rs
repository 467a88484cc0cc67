//! The worker's state across ticks: one [`SinkRun`] per sink, the type registry, the parsed
//! capture configs, and orphan-slot sightings.
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdc_core::config::{checkpoint_interval, parse_stored_capture_config, CaptureConfig, SnapshotMode};
use cdc_core::failpoint::{Armed, Failpoint};
use cdc_core::pipeline::{Assembler, SinkTables};
use cdc_core::redact::TokenKey;
use cdc_core::snapshot::{Chunk, ChunkSource, MvccSnapshot, Pieces, SnapshotReader};
use cdc_core::state::SinkState;
use cdc_core::stats::DeliveryCounters;
use cdc_core::types::TypeRegistry;
use cdc_core::Lsn;
use cdc_sinks::kinesis::aws::Defaults;
use cdc_sinks::open::{with_signals_blocked, OpenContext, Opening, ServerSettings};
use cdc_sinks::postgres::SourceTable;
use cdc_sinks::table::EventStore;
use cdc_sinks::{parse_config, Checkpoint, DeliveryMode, ErrorClass, Sink, SinkConfig, SinkError};
use pgrx::pg_sys;

use super::batch::{self, Batch, Failure, Inputs, Unit};
use super::decoding::{self, Session, SessionRead};
use super::keyless;
use super::snapshot::{self as snapshots, Next, Previous};
use super::source::{self, Catalog, SinkRow};
use super::table_sink::SpiStore;
use super::{retry_at, run_tx, stop_requested, OrphanSightings};
use crate::catalog::PUBLICATION_NAMES;
use crate::{gucs, keys, lookups};
use cdc_core::deliver::handoff::DeliveryThread;
use cdc_core::deliver::port::ChangeSource;
use cdc_core::deliver::protocol::{self, SlotView};
use cdc_core::deliver::read::{Sent, TableProgress};
use cdc_core::stats::TableCounters;

/// WAL written between two running-transactions records of the launcher: about the most a new
/// decoding session decodes again before the slot's confirmed position (see
/// [`Worker::mark_restart_point`]).
const RESTART_POINT_BYTES: u64 = 2 << 20;

/// While deliveries keep coming, the slot is confirmed (and `_cdc_offsets` written, in the same
/// transaction) at most this often; at once after a pass that read nothing, and for the first
/// delivery after a quiet spell. Confirming after every delivery was the largest fixed cost of a
/// pass at a steady 2,000 small transactions/s (an upsert planned again each time, and a
/// transaction). What is delivered and not confirmed yet is read again only by a new session (a
/// crash, a failure): an exactly-once sink skips it (its checkpoint covers it), an at-least-once
/// sink sends it again.
const CONFIRM_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// A unit of at least this many rows (a backlog, or a high rate) is committed on the sink's
/// delivery thread while the next one is read. A smaller one is waited for before the next read:
/// at a low rate a read right after handing a unit over finds only the few changes committed
/// since, and the sink would commit twice as many, smaller, transactions for no gain.
const OVERLAP_ROWS: u64 = batch::FETCH_ROWS as u64;

/// Runtime state of one sink.
pub struct SinkRun {
    pub(super) row: SinkRow,
    config: Result<SinkConfig, String>,
    pub(super) assembler: Assembler,
    pub(super) producer: Option<Producer>,
    failures: u32,
    retry_at: Option<Instant>,
    /// (state, last_error) as last written to the catalog (`None`: a label this version does not
    /// know, so the next state is always written).
    written: (Option<SinkState>, Option<String>),
    last_heartbeat: Option<Instant>,
    heartbeat_end: Option<Lsn>,
    /// Last checkpoint the sink committed (exactly-once), read at open and kept current.
    checkpoint: Option<Checkpoint>,
    /// The producer being opened, when it is.
    opening: Option<Opening>,
    /// Its events are held back for a compliance reason (mirrors the shared counter, so a
    /// delivering sink does not take the counters' lock each pass to clear it).
    compliance_hold: bool,
    /// Its decoding session (holds the slot), open from the first read until a failure.
    session: Option<Session>,
    /// Delivered (flushed) up to here: ahead of the slot's confirmed position until the next
    /// confirm ([`CONFIRM_INTERVAL`]); reads go on from here.
    delivered: Option<Lsn>,
    /// Per-table progress of what was delivered since the last confirm (written with it).
    unrecorded: HashMap<u32, TableProgress>,
    /// Per `regional_routing` route, what was delivered since the last confirm (see
    /// [`cdc_core::deliver::read::Batch::routes`]).
    unrecorded_routes: RouteProgress,
    /// When the slot was last confirmed.
    last_confirm: Option<Instant>,
    /// Units read and handed to the sink that are not delivered yet, oldest first: their
    /// flushes run on the sink's delivery thread while the next unit is read.
    handed: VecDeque<Handed>,
    /// When a delivery of something last ended: while a unit is in flight and for
    /// [`DELIVERING_FOR`] after that, its reads take turns among the delivering sinks, never
    /// waiting behind the reads of sinks with nothing to deliver.
    last_delivered: Option<Instant>,
    /// Its snapshot's chunk in flight and the transactions its reads met lately.
    snap: SnapshotReader,
    /// Whether it has snapshot rows left to deliver (`None`: not looked up yet).
    snapshotting: Option<bool>,
    /// The chunk it held was delivered, and the catalog does not say so yet.
    chunk_delivered: bool,
    /// Where it stood (checkpoint, or the slot's confirmed position) when its destination was
    /// first opened in this run, before it delivered anything: a chunk the catalog has in flight
    /// from an earlier run was delivered if this is past its watermark.
    opened_at: Option<Lsn>,
    /// Chunks read in this run (names their watermarks).
    chunks: u64,
    /// The keyless table's snapshot whose pieces it is delivering (see [`super::keyless`]).
    keyless: Option<keyless::Plan>,
}

/// A unit read and handed to its sink, waiting to be delivered: what its delivery records.
struct Handed {
    /// Its flush runs on the sink's delivery thread; its report is awaited (else it is done:
    /// flushed already, or with nothing to flush).
    awaiting: bool,
    /// The checkpoint it is flushed with, if any.
    flushed: Option<Checkpoint>,
    /// When the flush returned, Unix microseconds.
    acked: i64,
    /// Where the slot may be confirmed once it is delivered.
    target: Option<Lsn>,
    /// Its events were committed at the destination once flushed (an in-database sink commits
    /// nothing for a unit without events).
    commits: bool,
    exactly_once: bool,
    progress: HashMap<u32, TableProgress>,
    routes: RouteProgress,
    counted: DeliveryCounters,
    tables: HashMap<u32, TableCounters>,
    sent_log: Vec<Sent>,
}

impl SinkRun {
    /// Where reading stands: the slot's confirmed position, or past it by what was delivered
    /// since the last confirm and what was handed to the sink since.
    fn position(&self, confirmed: Lsn) -> Lsn {
        let handed = self.handed.iter().filter_map(|h| h.target).max();
        [self.delivered, handed].into_iter().flatten().filter(|d| *d > confirmed).max().unwrap_or(confirmed)
    }

    /// Its destination was opened: the first time in this run, where it stood then.
    fn note_opened(&mut self, confirmed: Lsn) {
        if self.opened_at.is_none() {
            let checkpoint = self.checkpoint.filter(|_| !gucs::TEST_SNAPSHOT_IGNORE_CHECKPOINT.get());
            self.opened_at = Some(checkpoint.map_or(confirmed, |c| c.end_lsn.max(confirmed)));
        }
    }

    /// Whether it reads a snapshot chunk before its next read: it has snapshot rows left, holds
    /// no chunk, and its destination is open (so it knows where it stands).
    fn wants_chunk(&self) -> bool {
        self.snapshotting == Some(true) && self.snap.chunk.is_none() && self.opened_at.is_some()
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
}

/// Events per `regional_routing` route (table OID, route, routing LSN): count, and the commit
/// time of the last delivered transaction with one (Unix microseconds).
type RouteProgress = HashMap<(u32, Arc<str>, Lsn), (u64, i64)>;

/// A sink's open destination.
pub(super) enum Producer {
    /// Opened on a thread of its own (see [`start_open`]) and then driven by its delivery thread:
    /// the next unit is read while the last one commits.
    Threaded(DeliveryThread),
    /// Opened in the read's transaction, and driven in it (an in-database sink, a webhook).
    InPlace(Box<dyn Sink>),
}

impl Producer {
    fn sink(&mut self) -> &mut dyn Sink {
        match self {
            Producer::Threaded(t) => t,
            Producer::InPlace(s) => s.as_mut(),
        }
    }

    fn in_source_database(&self) -> bool {
        match self {
            Producer::Threaded(t) => t.in_source_database(),
            Producer::InPlace(s) => s.in_source_database(),
        }
    }
}

/// Opens a sink that opens quickly, in the read's transaction (see `cdc_sinks::open`); an
/// in-database sink writes through SPI. `None` for a sink that opens on its own thread.
fn open_in_place(
    schema: &str,
    row: &SinkRow,
    config: &SinkConfig,
) -> Result<Option<(Producer, Option<Checkpoint>)>, SinkError> {
    let opened = cdc_sinks::open::open_in_place(config, |cfg| {
        SpiStore::open(schema, &row.id, cfg).map(|s| Box::new(s) as Box<dyn EventStore>)
    })?;
    Ok(opened.map(|(sink, checkpoint)| (Producer::InPlace(sink), checkpoint)))
}

/// What opening a sink needs besides its config, from the catalog and the server settings.
fn open_context(run: &SinkRun, cat: &Catalog) -> OpenContext {
    let setting = |g| Some(gucs::string(g)).filter(|s| !s.trim().is_empty());
    // The sink's tables: their keys, and their schema histories (an apply sink creates and
    // alters its target tables from them).
    let source_tables: HashMap<u32, SourceTable> = cat
        .tables
        .iter()
        .filter(|t| run.row.carries(t.oid))
        .map(|t| {
            let history = t.history.as_ref().map(source::history).unwrap_or_default();
            (t.oid, SourceTable { key_columns: t.key_columns.clone(), history })
        })
        .collect();
    OpenContext {
        sink_id: run.row.id.clone(),
        sink_name: run.row.name.clone(),
        slot: run.row.slot.clone(),
        system_identifier: cat.system_identifier.clone(),
        database: cat.database.clone(),
        database_oid: cat.database_oid,
        settings: ServerSettings {
            kafka_bootstrap_servers: gucs::string(&gucs::KAFKA_BOOTSTRAP_SERVERS),
            kinesis: Defaults { region: setting(&gucs::AWS_REGION), endpoint: setting(&gucs::KINESIS_ENDPOINT) },
            pubsub_endpoint: setting(&gucs::PUBSUB_ENDPOINT),
            pulsar_reuse_producer_name: gucs::TEST_PULSAR_REUSE_PRODUCER_NAME.get(),
            apply_shuffle: i64::from(gucs::TEST_APPLY_SHUFFLE.get()),
        },
        delegated: run.row.delegated,
        source_tables,
        interrupt: Some(stop_requested),
    }
}

/// Starts opening a sink on its own thread (see `cdc_sinks::open::start_open`): a slow or
/// unreachable destination stalls no other sink.
fn start_open(run: &SinkRun, config: &SinkConfig, cat: &Catalog) -> Result<Opening, SinkError> {
    cdc_sinks::open::start_open(config, &open_context(run, cat))
}

/// Installs a producer that finished opening, refusing a slot ahead of its checkpoint.
fn finish_open(run: &mut SinkRun, opening: Opening, slot: &SlotView) -> Result<(), Failure> {
    let opened = opening.join().unwrap_or_else(|_| {
        Err(SinkError { class: ErrorClass::Retry, message: "opening the sink failed unexpectedly".into() })
    });
    let (opened, checkpoint) = opened.map_err(Failure::sink)?;
    protocol::check_checkpoint(slot, checkpoint, false)?;
    run.checkpoint = checkpoint;
    run.note_opened(slot.confirmed);
    // The delivery thread touches nothing of PostgreSQL and starts with every signal blocked.
    let mut thread = with_signals_blocked(|| DeliveryThread::start(opened))
        .map_err(|e| Failure::new(SinkState::Retrying, format!("cannot start the sink's delivery thread: {e}")))?;
    thread.set_interrupt(stop_requested);
    run.producer = Some(Producer::Threaded(thread));
    Ok(())
}

/// Adds one read's counts to a sink's counters.
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

/// Records the latencies of a delivery acknowledged at `acked` (Unix microseconds): per event,
/// publish (handed over -> acknowledged) and end to end (committed -> acknowledged) for the sink,
/// capture (committed -> handed over) and end to end for each table. Clock differences between
/// the commit and the worker (none: same server) never make a latency negative.
fn record_latencies(sink_id: &str, sent: &[batch::Sent], acked: i64) {
    if sent.is_empty() {
        return;
    }
    let since = |from: i64, to: i64| (to - from).max(0) as u64;
    let mut sink = crate::stats::SinkLatency::default();
    let mut tables: HashMap<u32, crate::stats::TableLatency> = HashMap::new();
    for s in sent {
        let (capture, publish, end_to_end) = (
            since(s.commit_unix_micros, s.sent_unix_micros),
            since(s.sent_unix_micros, acked),
            since(s.commit_unix_micros, acked),
        );
        for &(oid, n) in &s.tables {
            sink.publish.record_n(publish, n);
            sink.end_to_end.record_n(end_to_end, n);
            let t = tables.entry(oid).or_default();
            t.capture.record_n(capture, n);
            t.end_to_end.record_n(end_to_end, n);
        }
    }
    crate::stats::add_latencies(sink_id, &sink, &tables);
}

/// The first of pg_cdc's publications that does not exist (if one does not), and what the catalog
/// says about the sink's slot.
fn slot_view<'a>(cat: &'a Catalog, row: &SinkRow) -> (Option<&'a str>, SlotView) {
    let missing = PUBLICATION_NAMES.split(',').find(|p| !cat.publications.iter().any(|q| q == p));
    let found = cat.slots.iter().find(|s| s.name == row.slot);
    let slot = SlotView {
        name: row.slot.clone(),
        exists: found.is_some(),
        wal_status: found.and_then(|s| s.wal_status.clone()),
        // Its own session holds the slot between reads.
        // SAFETY: MyProcPid is this process's pid, set at its start.
        active_pid: found.and_then(|s| s.active_pid).filter(|&p| p != unsafe { pg_sys::MyProcPid }),
        confirmed: found.and_then(|s| s.confirmed.as_deref()).and_then(|s| s.parse().ok()).unwrap_or_default(),
    };
    (missing, slot)
}

/// Confirms the slot up to what the sink delivered, if that is past `confirmed` (the slot's
/// confirmed position), and records the per-table progress delivered since the last confirm in
/// `_cdc_offsets`, in one transaction: after a crash the slot and the offsets agree, and what was
/// delivered past them is counted when it is read again (see `deliver::read`).
fn confirm_delivered(schema: Option<&str>, run: &mut SinkRun, confirmed: Lsn) -> Result<(), String> {
    let Some(lsn) = run.delivered.filter(|d| *d > confirmed) else {
        return Ok(());
    };
    let (Some(schema), Some(session)) = (schema, run.session.as_mut()) else {
        return Err("the slot's decoding session is gone".into());
    };
    let (name, progress, routes) = (run.row.name.clone(), &run.unrecorded, &run.unrecorded_routes);
    let registrations = run.assembler.take_registrations();
    run_tx(|| {
        source::record_progress(schema, &name, progress);
        source::record_route_progress(schema, &name, routes);
        source::record_registrations(schema, &registrations);
        session.confirm(lsn);
    })?;
    run.unrecorded.clear();
    run.unrecorded_routes.clear();
    run.last_confirm = Some(Instant::now());
    Ok(())
}

/// [`confirm_delivered`] where a failure is only logged (the next worker or session reads the
/// unconfirmed tail again).
fn confirm_or_warn(schema: Option<&str>, run: &mut SinkRun, confirmed: Lsn) {
    if let Err(e) = confirm_delivered(schema, run, confirmed) {
        pgrx::warning!("pg_cdc sink \"{}\": cannot confirm replication slot {}: {e}", run.row.name, run.row.slot);
    }
}

/// How long after a delivery of something a sink's reads take the delivering sinks' turns (a pass
/// in between that finds nothing, woken by WAL of other tables, does not move it back).
const DELIVERING_FOR: Duration = Duration::from_secs(1);

/// Which read turn a sink waits for when every turn is taken: spreads the waiters over the turns.
fn read_turn_hint(id: &str) -> u32 {
    id.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
}

/// What a worker process does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Starts the sink workers; the chores that concern every sink.
    Launcher,
    /// Delivers the sink with this id.
    Sink(String),
}

impl Role {
    /// The process's `backend_type`, and the prefix of its log lines.
    pub fn name(&self) -> &'static str {
        match self {
            Role::Launcher => super::launcher::LAUNCHER,
            Role::Sink(_) => super::launcher::SINK_WORKER,
        }
    }
}

/// A worker: the launcher, or one sink's worker.
pub struct Worker {
    role: Role,
    /// The launcher's sink workers.
    starter: super::launcher::Starter,
    /// A sink worker's sink was dropped (or the extension): it exits.
    finished: bool,
    /// The sink name a sink worker shows in `application_name` (`pg_cdc worker: <name>`).
    shown_name: Option<String>,
    sinks: HashMap<String, SinkRun>,
    types: TypeRegistry,
    /// Parsed capture configs by (oid, config text), so a config is parsed once.
    configs: HashMap<u32, (String, Arc<CaptureConfig>)>,
    /// Captured tables whose stored config cannot be read (changed by hand, or by a version that
    /// no longer accepts it), with the reason: the sinks that carry them stop instead of dropping
    /// their changes.
    unreadable: HashMap<u32, String>,
    orphans: OrphanSightings,
    schema: Option<String>,
    last_missing_extension_log: Option<Instant>,
    /// The tokenization key source last loaded (setting, file and its stamp), and the key it gave.
    token_settings: Option<keys::KeySource>,
    /// `cdc.schema_registry` as the Avro sinks were built with (a change rebuilds them).
    schema_registry: String,
    token_key: Option<TokenKey>,
    /// The key user context messages are sealed with (made on first use).
    context_key: Option<Vec<u8>>,
    /// When loading it last failed (tried again a minute later, not every tick).
    context_key_failed: Option<Instant>,
    /// When each slot's retained-WAL warning was last logged.
    wal_warned: HashMap<String, Instant>,
    /// Where this worker last wrote a running-transactions record ([`Worker::mark_restart_point`]).
    restart_mark: Option<Lsn>,
    /// `cdc.test_failpoint` as last read, and what it arms.
    failpoint: (String, Armed),
    /// A sink worker's copy of its catalog (its sink only), the generation it was read at, and
    /// when: used instead of reading it again while its session holds the slot, nothing changed
    /// and it is younger than `launcher::CATALOG_REFRESH`.
    cached: Option<(Catalog, u64, Instant)>,
    /// The launcher's deletion of what dropped sinks left at their destination.
    cleanups: super::cleanup::Cleanups,
    /// Sinks being opened on their own thread whose result is no longer wanted (the sink failed,
    /// or was dropped): the process waits for them before it exits ([`Worker::wait_for_openings`]).
    abandoned: Vec<Opening>,
}

impl Worker {
    pub fn new(role: Role) -> Self {
        Worker {
            role,
            starter: Default::default(),
            finished: false,
            shown_name: None,
            sinks: HashMap::new(),
            types: TypeRegistry::new(),
            configs: HashMap::new(),
            unreadable: HashMap::new(),
            orphans: HashMap::new(),
            schema: None,
            last_missing_extension_log: None,
            token_settings: None,
            schema_registry: String::new(),
            token_key: None,
            context_key: None,
            context_key_failed: None,
            wal_warned: HashMap::new(),
            restart_mark: None,
            failpoint: (String::new(), Armed::default()),
            cached: None,
            cleanups: Default::default(),
            abandoned: Vec::new(),
        }
    }

    /// Reads `cdc.test_failpoint` again when it changed (a refused value arms nothing and is
    /// logged once). Arming is logged, so a test knows when the worker has it.
    fn refresh_failpoint(&mut self) {
        let text = gucs::string(&gucs::TEST_FAILPOINT);
        if text == self.failpoint.0 {
            return;
        }
        let who = self.role.name();
        let armed = Armed::parse(&text).unwrap_or_else(|e| {
            pgrx::warning!("{who}: {e}; no failpoint is armed");
            Armed::default()
        });
        if armed != Armed::default() {
            pgrx::log!("{who}: test failpoint {} armed", text.trim());
        }
        self.failpoint = (text, armed);
    }

    /// A sink worker whose sink is gone: it exits.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Confirms what its sink delivered since the last confirm (before it exits: the next worker
    /// would read it again).
    pub fn confirm_delivered(&mut self) {
        let ids: Vec<String> = self.sinks.keys().cloned().collect();
        for id in ids {
            self.settle(&id, 0);
        }
        let confirmed = decoding::held_slot_confirmed().unwrap_or_default();
        for run in self.sinks.values_mut() {
            confirm_or_warn(self.schema.as_deref(), run, confirmed);
        }
    }

    /// Waits, at most `limit`, for the threads still opening a sink (this worker's, or one it gave
    /// up), and closes what they opened. A process that exits while such a thread runs inside
    /// librdkafka or a cloud client crashes in exit()'s cleanup (SIGSEGV), and the postmaster then
    /// restarts every backend: a sink dropped right after it was added did that.
    pub fn wait_for_openings(&mut self, limit: Duration) {
        let mut threads: Vec<Opening> = self.sinks.values_mut().filter_map(|r| r.opening.take()).collect();
        threads.append(&mut self.abandoned);
        let deadline = Instant::now() + limit;
        while threads.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let (done, running): (Vec<Opening>, Vec<Opening>) = threads.into_iter().partition(|h| h.is_finished());
        for h in done {
            // Dropping what it opened closes it (its producer, its client) on this thread.
            drop(h.join());
        }
        if !running.is_empty() {
            pgrx::warning!(
                "{}: {} sink(s) still opening after {} s; exiting anyway",
                self.role.name(),
                running.len(),
                limit.as_secs()
            );
        }
    }

    /// Gives up a sink worker's claim on its sink (before it exits).
    pub fn release(&self) {
        if let Role::Sink(id) = &self.role {
            super::launcher::release(id);
        }
    }

    /// One pass: the launcher's over every sink, a sink worker's over its sink. Returns true when
    /// the sink read changes (run again at once).
    pub fn tick(&mut self) -> bool {
        let who = self.role.name();
        if let Some(cat) = self.reuse_catalog() {
            let Role::Sink(id) = self.role.clone() else { return false };
            return self.pass(&id, &cat);
        }
        // Before the read: a change committed after it bumps the generation again.
        let generation = super::launcher::catalog_generation();
        let mut cat = match run_tx(source::load_catalog) {
            Ok(cat) if cat.installed => {
                self.schema = cat.schema.clone();
                cat
            }
            Ok(cat) => {
                if self.role != Role::Launcher {
                    self.finished = true;
                    return false;
                }
                if self.last_missing_extension_log.is_none_or(|t| t.elapsed().as_secs() > 300) {
                    pgrx::log!("{who}: extension pg_cdc is not installed in this database; waiting");
                    self.last_missing_extension_log = Some(Instant::now());
                }
                self.drop_orphan_slots(&cat);
                return false;
            }
            Err(e) => {
                pgrx::warning!("{who}: cannot read its catalog: {e}");
                return false;
            }
        };
        let id = match &self.role {
            Role::Launcher => {
                // Counters and latencies of dropped sinks and tables free their shared-memory entries.
                crate::stats::retain(&cat.sinks.iter().map(|s| s.id.as_str()).collect::<Vec<_>>());
                crate::stats::retain_tables(&cat.tables.iter().map(|t| t.oid).collect::<Vec<_>>());
                // A finished (initial_only) sink has no worker.
                let sinks: Vec<(String, String)> =
                    cat.sinks.iter().filter(|s| !s.finished()).map(|s| (s.id.clone(), s.name.clone())).collect();
                self.starter.ensure(&sinks);
                self.warn_retained_wal(&cat);
                self.mark_restart_point(&cat);
                self.drop_orphan_slots(&cat);
                self.refresh_failpoint();
                if let Some(schema) = &self.schema {
                    self.cleanups.tick(schema, &self.failpoint.1, generation);
                }
                return false;
            }
            Role::Sink(id) => id.clone(),
        };
        // A finished (initial_only) sink reads nothing more: its worker exits.
        cat.sinks.retain(|s| s.id == id && !s.finished());
        if cat.sinks.is_empty() {
            self.finished = true;
            return false;
        }
        self.cached = Some((cat.clone(), generation, Instant::now()));
        // With the catalog read again, its snapshots are looked up again: one requested
        // (cdc_snapshot) or a table added since starts at its next pass.
        if let Some(run) = self.sinks.get_mut(&id) {
            if run.snapshotting == Some(false) {
                run.snapshotting = None;
            }
        }
        self.pass(&id, &cat)
    }

    /// A sink worker's copy of its catalog, brought up to date where it moves on its own (its
    /// slot, the WAL position), when it may be used instead of reading the catalog: its session
    /// holds the slot (so the slot is as this process left it), no catalog change committed since
    /// the copy was read, and the copy is younger than `launcher::CATALOG_REFRESH`. Reading the
    /// catalog was the largest fixed cost of a pass (a query planned again at every pass, since
    /// each read invalidates the backend's caches).
    fn reuse_catalog(&mut self) -> Option<Catalog> {
        let Role::Sink(id) = &self.role else { return None };
        let (cat, generation, at) = self.cached.as_ref()?;
        let held = self.sinks.get(id).is_some_and(|r| r.session.is_some());
        if !held
            || *generation != super::launcher::catalog_generation()
            || at.elapsed() >= super::launcher::CATALOG_REFRESH
        {
            return None;
        }
        let mut cat = cat.clone();
        let confirmed = decoding::held_slot_confirmed()?;
        for slot in cat.slots.iter_mut().filter(|s| cat.sinks.iter().any(|k| k.slot == s.name)) {
            slot.confirmed = Some(confirmed.to_string());
        }
        // SAFETY: reads the shared insert position under its own lock; no transaction needed.
        cat.wal_insert_lsn = Lsn(unsafe { pg_sys::GetXLogInsertRecPtr() }).to_string();
        Some(cat)
    }

    /// One pass of a sink worker over its sink, with its catalog.
    fn pass(&mut self, id: &str, cat: &Catalog) -> bool {
        let Some(name) = cat.sinks.first().map(|s| s.name.clone()) else {
            self.finished = true;
            return false;
        };
        if self.shown_name.as_ref() != Some(&name) {
            // Which process serves which sink, in pg_stat_activity.
            let shown = format!("{}: {name}", self.role.name());
            if run_tx(|| source::set_application_name(&shown)).is_ok() {
                self.shown_name = Some(name);
            }
        }
        self.refresh_configs(cat);
        self.sync_sinks(cat);
        self.refresh_token_key();
        self.refresh_failpoint();
        self.step(id, cat)
    }

    fn refresh_configs(&mut self, cat: &Catalog) {
        let mut next = HashMap::new();
        let mut unreadable = HashMap::new();
        for t in &cat.tables {
            let history = t.history.as_ref().map(ToString::to_string).unwrap_or_default();
            let text = t.config.to_string()
                + &t.key_columns.join("\u{1}")
                + "\u{2}"
                + &history
                + "\u{2}"
                + t.routing_lsn.as_deref().unwrap_or_default();
            let parsed = match self.configs.remove(&t.oid) {
                Some((old_text, cfg)) if old_text == text => cfg,
                _ => match parse_stored_capture_config(&t.config, t.key_columns.clone()) {
                    Ok(mut cfg) => {
                        cfg.history = t.history.as_ref().map(|h| Arc::new(source::history(h)));
                        cfg.routing_lsn = t.routing_lsn.as_deref().and_then(|l| l.parse().ok());
                        Arc::new(cfg)
                    }
                    Err(e) => {
                        unreadable.insert(t.oid, e.to_string());
                        continue;
                    }
                },
            };
            next.insert(t.oid, (text, parsed));
        }
        self.configs = next;
        self.unreadable = unreadable;
    }

    /// Logs a WARNING for each sink whose slot retains more WAL than `cdc.wal_warning_bytes`,
    /// at most every 5 minutes per slot while it stays above.
    fn warn_retained_wal(&mut self, cat: &Catalog) {
        let limit = i64::from(gucs::WAL_WARNING_BYTES.get()) << 20;
        self.wal_warned.retain(|slot, _| cat.slots.iter().any(|s| &s.name == slot));
        if limit <= 0 {
            return;
        }
        for sink in &cat.sinks {
            let Some(retained) = cat.slots.iter().find(|s| s.name == sink.slot).and_then(|s| s.retained) else {
                continue;
            };
            if retained <= limit {
                self.wal_warned.remove(&sink.slot);
                continue;
            }
            if self.wal_warned.get(&sink.slot).is_some_and(|t| t.elapsed().as_secs() < 300) {
                continue;
            }
            self.wal_warned.insert(sink.slot.clone(), Instant::now());
            pgrx::warning!(
                "pg_cdc sink \"{}\": replication slot {} retains {} MB of WAL (cdc.wal_warning_bytes = {} MB); state {}{}",
                sink.name,
                sink.slot,
                retained >> 20,
                limit >> 20,
                sink.state,
                sink.last_error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
            );
        }
    }

    /// Writes a running-transactions record into the WAL once [`RESTART_POINT_BYTES`] were written
    /// since the last one this worker wrote. A logical slot's restart_lsn can only move to such a
    /// record, and a new decoding session (a sink worker's start, or after a failure) decodes again
    /// from restart_lsn; PostgreSQL 15 writes one only every 15 s (the background writer), so under
    /// load that was up to 15 s of WAL (hundreds of MB; with the peek, at every batch). This is what
    /// PostgreSQL 16's pg_log_standby_snapshot() does; the cost is one small WAL record and a
    /// snapshot file per record.
    fn mark_restart_point(&mut self, cat: &Catalog) {
        if cat.sinks.is_empty() {
            return;
        }
        let insert: Lsn = cat.wal_insert_lsn.parse().unwrap_or_default();
        if self.restart_mark.is_some_and(|m| insert.0 < m.0.saturating_add(RESTART_POINT_BYTES)) {
            return;
        }
        match run_tx(source::log_running_xacts) {
            Ok(Some(lsn)) => self.restart_mark = Some(lsn),
            Ok(None) => self.restart_mark = Some(insert),
            Err(e) => {
                // Not fatal: the slots still move at the background writer's records.
                pgrx::warning!("{}: cannot write a running-transactions record: {e}", self.role.name());
                self.restart_mark = Some(insert);
            }
        }
    }

    /// Loads the tokenization key again when its settings changed (after a SIGHUP), and hands it
    /// to every sink's assembler.
    fn refresh_token_key(&mut self) {
        if self.context_key.is_none() && self.context_key_failed.is_none_or(|t| t.elapsed().as_secs() >= 60) {
            match keys::context_key() {
                Ok(k) => {
                    self.context_key = Some(k);
                    for run in self.sinks.values_mut() {
                        run.assembler.set_context_key(self.context_key.clone());
                    }
                }
                Err(e) => {
                    self.context_key_failed = Some(Instant::now());
                    pgrx::warning!("pg_cdc worker: {e}; user context is left out of events (trying again in a minute)")
                }
            }
        }
        let settings = keys::settings();
        if self.token_settings.as_ref() != Some(&settings) {
            self.token_key = keys::load(&settings).unwrap_or_else(|e| {
                pgrx::warning!("pg_cdc worker: {e}; tables that tokenize columns stop their sinks until it is fixed");
                None
            });
            self.token_settings = Some(settings);
            for run in self.sinks.values_mut() {
                run.assembler.set_token_key(self.token_key.clone());
            }
        }
    }

    fn sync_sinks(&mut self, cat: &Catalog) {
        self.sinks.retain(|id, _| cat.sinks.iter().any(|s| &s.id == id));
        let registry = gucs::string(&gucs::SCHEMA_REGISTRY);
        let registry_changed = registry != self.schema_registry;
        self.schema_registry = registry;
        for row in &cat.sinks {
            let avro = row.config.get("format").and_then(|f| f.as_str()) == Some("avro");
            let changed = (avro && registry_changed)
                || self.sinks.get(&row.id).is_none_or(|r| r.row.config != row.config || r.row.tables != row.tables);
            if changed {
                // Its session goes with it: confirm what it delivered first (an at-least-once
                // sink would send it again otherwise).
                self.settle(&row.id, 0);
                if let Some(run) = self.sinks.get_mut(&row.id) {
                    let confirmed = decoding::held_slot_confirmed().unwrap_or_default();
                    confirm_or_warn(self.schema.as_deref(), run, confirmed);
                }
                let config = parse_config(&row.sink_type, &row.config).map_err(|e| e.to_string());
                let mut assembler = Assembler::new(&cat.database);
                assembler.set_sink_name(&row.name);
                if let Ok(c) = &config {
                    assembler.set_transformations(c.common().include_transformations);
                    assembler.set_partition_key(c.common().partition_key.clone());
                    let server_registry = Some(self.schema_registry.clone()).filter(|s| !s.is_empty());
                    assembler.set_format(c.event_format(&cat.database, server_registry, env!("CARGO_PKG_VERSION")));
                }
                assembler.set_token_key(self.token_key.clone());
                assembler.set_context_key(self.context_key.clone());
                if let Some(schema) = &self.schema {
                    let copy = lookups::Copy { schema: schema.clone(), sink_id: row.id.clone() };
                    assembler.lookups_mut().set_source(Box::new(copy));
                }
                self.sinks.insert(
                    row.id.clone(),
                    SinkRun {
                        row: row.clone(),
                        config,
                        assembler,
                        producer: None,
                        failures: 0,
                        retry_at: None,
                        written: (SinkState::parse(&row.state), row.last_error.clone()),
                        last_heartbeat: None,
                        heartbeat_end: None,
                        checkpoint: None,
                        opening: None,
                        // The shared counter may be set from before (a worker restart, a changed
                        // config): cleared at the first delivery.
                        compliance_hold: true,
                        session: None,
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
                        keyless: None,
                    },
                );
            } else if let Some(r) = self.sinks.get_mut(&row.id) {
                r.row = row.clone();
            }
            // Which transactions the catalog copy reflects (capture and version messages of
            // later ones make the sink read it again).
            if let Some(r) = self.sinks.get_mut(&row.id) {
                r.assembler.set_catalog_snapshot(cat.snapshot.as_deref().and_then(|t| MvccSnapshot::parse(t).ok()));
            }
        }
    }

    fn tables_for(&self, row: &SinkRow) -> SinkTables {
        self.configs.iter().filter(|(oid, _)| row.carries(**oid)).map(|(oid, (_, cfg))| (*oid, cfg.clone())).collect()
    }

    /// Gives a sink's assembler the lookup copies its tables' `enrich` transformations read,
    /// copying the lookup tables it has none of yet (a sink whose slot the worker created).
    /// Returns false when the sink cannot read this time.
    fn bind_lookups(&mut self, id: &str, row: &SinkRow, tables: &SinkTables) -> bool {
        let Some(schema) = self.schema.clone() else {
            return false;
        };
        let Some(run) = self.sinks.get_mut(id) else {
            return false;
        };
        if tables.values().all(|c| c.enrich.is_empty()) {
            if run.assembler.has_lookups() {
                run.assembler.lookups_mut().set_bindings(&[]);
            }
            return true;
        }
        let load = || lookups::bindings(&schema, id);
        let mut bindings = match run_tx(load) {
            Ok(b) => b,
            Err(e) => {
                self.fail(id, SinkState::Retrying, format!("cannot read the lookup copies: {e}"));
                return false;
            }
        };
        let has = |b: &[cdc_core::lookup::LookupBinding], oid: u32, i: usize| {
            b.iter().any(|b| b.id.table_oid == oid && b.id.position as usize == i)
        };
        let missing = tables.iter().any(|(oid, c)| (0..c.enrich.len()).any(|i| !has(&bindings, *oid, i)));
        if missing {
            let covered = row.tables.clone();
            let seeded = run_tx(|| {
                let current = lookups::bindings(&schema, id);
                for spec in lookups::specs_for_sink(&schema, covered.as_deref()) {
                    if !has(&current, spec.table_oid, spec.position as usize) {
                        if let Some(why) = lookups::dropped(&spec) {
                            return Err(why);
                        }
                        lookups::seed(&schema, id, &spec);
                    }
                }
                Ok(lookups::bindings(&schema, id))
            });
            match seeded {
                Ok(Ok(b)) => {
                    pgrx::log!("pg_cdc sink \"{}\": copied its lookup tables", row.name);
                    bindings = b;
                }
                Ok(Err(why)) => {
                    // Retrying cannot bring a dropped table back: an operator must re-enable.
                    self.fail(
                        id,
                        SinkState::Error,
                        format!("{why}; cdc_enable the table again with a config that fits"),
                    );
                    return false;
                }
                Err(e) => {
                    self.fail(id, SinkState::Retrying, format!("cannot copy the lookup tables: {e}"));
                    return false;
                }
            }
        }
        let Some(run) = self.sinks.get_mut(id) else {
            return false;
        };
        let l = run.assembler.lookups_mut();
        l.set_capacity(gucs::ENRICH_CACHE_ROWS.get().max(1) as usize);
        l.set_bindings(&bindings);
        true
    }

    /// Records a state change in the catalog (only when it differs from what was written).
    fn set_state(&mut self, id: &str, state: SinkState, error: Option<String>) {
        let Some(schema) = self.schema.clone() else {
            return;
        };
        let Some(run) = self.sinks.get_mut(id) else {
            return;
        };
        if run.written.0 == Some(state) && run.written.1 == error {
            return;
        }
        match &error {
            Some(e) => pgrx::log!("pg_cdc sink \"{}\": {state}: {e}", run.row.name),
            None => pgrx::log!("pg_cdc sink \"{}\": {state}", run.row.name),
        }
        let (sid, er) = (id.to_string(), error.clone());
        if run_tx(|| source::set_state(&schema, &sid, state.label(), er.as_deref())).is_ok() {
            run.written = (Some(state), error);
        }
    }

    /// Marks a failure: state, backoff, fresh producer and relation state next time.
    fn fail(&mut self, id: &str, state: SinkState, error: String) {
        if let Some(run) = self.sinks.get_mut(id) {
            run.failures = run.failures.saturating_add(1);
            // Not before the destination asked (a webhook's Retry-After), whatever the backoff says.
            let hold = run.producer.as_mut().and_then(|p| p.sink().hold_until());
            run.retry_at = Some(retry_at(run.failures).max(hold.unwrap_or_else(Instant::now)));
            run.producer = None;
            if let Some(opening) = run.opening.take() {
                self.abandoned.retain(|h| !h.is_finished());
                self.abandoned.push(opening);
            }
            run.assembler.reset();
        }
        // Read the catalog again next time (a failure may come from a change it does not show yet).
        self.cached = None;
        self.set_state(id, state, Some(error));
        if let Some(run) = self.sinks.get_mut(id) {
            // What it decoded and sent is read again by a new session, from the slot's confirmed
            // position (the old one may have let go of messages the failed delivery held); what
            // was delivered since that position too (see CONFIRM_INTERVAL).
            run.session = None;
            run.delivered = None;
            run.unrecorded.clear();
            run.unrecorded_routes.clear();
            run.handed.clear();
        }
        // A session that failed to open may hold the slot already.
        decoding::release_slot();
    }

    /// Marks a failed read or delivery; one that holds events back for a compliance reason shows
    /// in `cdc_delivery_status` (`compliance_metrics`).
    fn fail_with(&mut self, id: &str, f: Failure) {
        if let Some(run) = self.sinks.get_mut(id).filter(|_| f.compliance) {
            run.compliance_hold = true;
            crate::stats::update(id, |c| c.compliance_hold = 1);
        }
        self.fail(id, f.state, f.message);
    }

    /// One step of one sink. Returns true when it read changes.
    fn step(&mut self, id: &str, cat: &Catalog) -> bool {
        let Some(run) = self.sinks.get(id) else {
            return false;
        };
        if run.retry_at.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        let row = run.row.clone();
        let config = match &run.config {
            Ok(c) => c.clone(),
            Err(e) => {
                let msg = format!("invalid sink config: {e}");
                self.fail(id, SinkState::Error, msg);
                return false;
            }
        };
        if let Some((oid, why)) = self.unreadable.iter().find(|(oid, _)| row.carries(**oid)) {
            let table =
                cat.tables.iter().find(|t| t.oid == *oid).map_or_else(|| format!("OID {oid}"), |t| t.name.clone());
            let msg = format!(
                "the stored capture config of table {table} cannot be read ({why}); its changes are held back: \
                 cdc_enable the table again with a valid config"
            );
            self.fail(id, SinkState::Error, msg);
            return false;
        }
        let (missing, slot) = slot_view(cat, &row);
        if missing.is_none() && !slot.exists && row.state == SinkState::CreatingSlot.label() {
            let slot = row.slot.clone();
            match run_tx(|| source::create_slot(&slot)) {
                Ok(()) => self.set_state(id, SinkState::Starting, None),
                Err(e) => self.fail(id, SinkState::Error, format!("cannot create replication slot {slot}: {e}")),
            }
            return false;
        }
        if let Some(f) = protocol::slot_failure(missing, &slot) {
            self.fail_with(id, f);
            return false;
        }
        let confirmed = slot.confirmed;
        // Reads, flush plans and heartbeats go by what was delivered, the slot by what was confirmed.
        let position = run.position(confirmed);
        if let Some(producer) = &run.producer {
            if let Err(f) = protocol::check_checkpoint(&slot, run.checkpoint, producer.in_source_database()) {
                self.fail_with(id, f);
                return false;
            }
        }
        // A producer being opened: wait for it without blocking the other sinks.
        if run.opening.as_ref().is_some_and(|h| !h.is_finished()) {
            return false;
        }
        if let Some(run) = self.sinks.get_mut(id) {
            if let Some(opening) = run.opening.take() {
                if let Err(f) = finish_open(run, opening, &slot) {
                    self.fail_with(id, f);
                    return false;
                }
            }
        }

        if !self.snapshot_step(id, &config) {
            return false;
        }
        // An initial_only sink delivers nothing but its snapshot (and the changes around it).
        let one_off = config.common().snapshot_mode == SnapshotMode::InitialOnly;
        if one_off && self.sinks.get(id).is_some_and(|r| r.snapshotting == Some(false) && r.snap.chunk.is_none()) {
            self.finish(id, confirmed);
            return false;
        }

        // Read and send, inside one transaction (an in-database sink writes its events in it).
        let tables = self.tables_for(&row);
        if !self.bind_lookups(id, &row, &tables) {
            return false;
        }
        let batch_changes = gucs::BATCH_CHANGES.get();
        let dedup = !gucs::TEST_SKIP_DEDUP.get();
        let Some(schema) = self.schema.clone() else {
            return false;
        };
        let mut types = std::mem::take(&mut self.types);
        let Some(mut run) = self.sinks.remove(id) else {
            return false;
        };
        // The unit before is still being committed on the delivery thread while this one is read.
        let overlapped = run.handed.iter().any(|h| h.awaiting);
        // A failure of an in-database sink rolls the read's transaction back (its events were
        // written in it); the failure itself comes back here.
        let mut rolled_back: Option<Failure> = None;
        let read = run_tx(|| -> Result<(Batch, Option<protocol::FlushPlan>), Failure> {
            if run.producer.is_none() {
                match open_in_place(&schema, &row, &config) {
                    Ok(Some((producer, checkpoint))) => {
                        run.checkpoint = checkpoint;
                        run.producer = Some(producer);
                        if run.snapshotting == Some(true) && run.opened_at.is_none() {
                            // Where it stands decides whether a chunk in flight was delivered:
                            // read the next chunk before delivering anything.
                            run.note_opened(confirmed);
                            return Ok((Batch { opening: true, ..Batch::default() }, None));
                        }
                        run.note_opened(confirmed);
                    }
                    Ok(None) => {}
                    Err(e) => return Err(Failure::sink(e)),
                }
            }
            if let Some(Producer::InPlace(sink)) = run.producer.as_mut() {
                sink.maintain();
            }
            // Reading (decoding) takes a turn: with many sinks, parallel reads would take the
            // primary's CPU (each slot decodes all WAL). Flushing to the destination holds none.
            // A sink that is delivering takes its turn apart from those that had nothing to
            // deliver, so idle sinks' reads never queue ahead of it.
            // A unit still in flight counts as delivering, as does one delivered lately.
            let delivering = !run.handed.is_empty() || run.last_delivered.is_some_and(|t| t.elapsed() < DELIVERING_FOR);
            let pool = if delivering { source::ReadPool::Delivering } else { source::ReadPool::Idle };
            source::take_read_turn(gucs::MAX_CONCURRENT_READS.get(), read_turn_hint(&row.id), pool);
            let session = match run.session.as_mut() {
                Some(s) => s,
                None => {
                    crate::stats::update(&row.id, |c| c.decoding_sessions += 1);
                    run.session.insert(Session::open(&row.slot))
                }
            };
            // Only its tables (and their lookup tables) reach pgoutput.
            let carried = row.tables.as_ref().map(|t| t.iter().copied().chain(run.assembler.lookups().lookup_tables()));
            session.carry_only(carried.map(Iterator::collect));
            session.begin_read(position);
            let mut session_read =
                SessionRead { session, most: batch_changes.max(1) as u64, schema: &schema, sink_name: &row.name };
            // Reads go through the sink's snapshot reader: a chunk is spliced in at its watermark,
            // and the transactions met are remembered even with no snapshot open (one requested
            // later checks its first chunk against them).
            run.snap.skip_window = gucs::TEST_SKIP_SNAPSHOT_WINDOW.get();
            let mut spliced = ChunkSource { inner: &mut session_read, state: &mut run.snap };
            let source: &mut dyn ChangeSource = &mut spliced;
            let first = source.fetch(batch::FETCH_ROWS, &mut types);
            // A sink with a snapshot to deliver opens its destination even with no change to send.
            if first.is_empty() && !(run.producer.is_none() && run.snapshotting == Some(true)) {
                return Ok((Batch::default(), None));
            }
            if run.producer.is_none() {
                // Only a sink with something to send opens a producer; the next steps wait for it.
                run.opening = Some(start_open(&run, &config, cat).map_err(Failure::sink)?);
                return Ok((Batch { opening: true, ..Batch::default() }, None));
            }
            let opened = || crate::stats::update(&row.id, |c| c.open_transactions = 1);
            let inputs = Inputs {
                tables: &tables,
                checkpoint: run.checkpoint,
                dedup,
                large_frames: (batch_changes.max(1) as usize).min(batch::BUFFER_FRAMES),
                checkpoint_interval: checkpoint_interval(
                    config.common().checkpoint_interval_ms,
                    tables.values().map(|c| &**c),
                )
                .map(|ms| std::time::Duration::from_millis(u64::from(ms))),
                on_open: Some(&opened),
            };
            let (assembler, producer, checkpoint) = (&mut run.assembler, &mut run.producer, &mut run.checkpoint);
            let Some(producer) = producer.as_mut() else {
                return Err(Failure::new(SinkState::Retrying, "the sink is not open"));
            };
            let in_source = producer.in_source_database();
            let sink = producer.sink();
            let read = {
                let mut unit = Unit { assembler, sink: &mut *sink, source, types: &mut types };
                cdc_core::deliver::read::read(&mut unit, &inputs, first)
            };
            if !in_source {
                return read.map(|b| (b, None));
            }
            // An in-database sink flushes (writes its checkpoint) in this transaction too, so its
            // events and checkpoint commit together; any failure rolls both back.
            let flushed = read.and_then(|b| {
                let plan = protocol::plan_flush(sink.delivery_mode(), &b, position, *checkpoint, dedup);
                if let Some(cp) = plan.flush {
                    sink.flush(cp).map_err(Failure::sink)?;
                }
                Ok((b, Some(plan)))
            });
            if let Err(f) = flushed {
                sink.abort();
                let message = f.message.clone();
                rolled_back = Some(f);
                pgrx::error!("pg_cdc: delivery rolled back: {message}");
            }
            flushed
        });
        let (decoded, skipped) = run.session.as_mut().map_or((0, 0), Session::take_counts);
        let read_rows = matches!(&read, Ok(Ok((b, _))) if b.rows > 0);
        crate::stats::update(&row.id, |c| {
            c.wal_decoded_bytes += decoded;
            c.changes_skipped += skipped;
            c.reads_overlapped += u64::from(overlapped && read_rows);
        });
        self.sinks.insert(id.to_string(), run);
        let (batch, preflushed) = match read {
            Ok(Ok((b, _))) if b.opening => {
                self.types = types;
                return false;
            }
            Ok(Ok(b)) => {
                self.types = types;
                b
            }
            Ok(Err(f)) => {
                self.types = types;
                self.abort(id);
                self.fail_with(id, f);
                return false;
            }
            Err(_) if rolled_back.is_some() => {
                self.types = TypeRegistry::new();
                self.abort(id);
                if let Some(f) = rolled_back {
                    self.fail_with(id, f);
                }
                return false;
            }
            Err(e) => {
                self.types = TypeRegistry::new();
                let writes =
                    self.sinks.get_mut(id).and_then(|r| r.producer.as_ref()).is_some_and(|p| p.in_source_database());
                self.abort(id);
                // The worker may have used its copy of the catalog: read it, and report a
                // publication or slot dropped by hand as a pass that read it would.
                let explained = run_tx(source::load_catalog).ok().and_then(|c| {
                    let (missing, slot) = slot_view(&c, &row);
                    protocol::slot_failure(missing, &slot)
                });
                if let Some(f) = explained {
                    self.fail_with(id, f);
                    return false;
                }
                let what = if writes { " or write its events" } else { "" };
                self.fail(id, SinkState::Error, format!("cannot read replication slot {}{what}: {e}", row.slot));
                return false;
            }
        };

        // Flush, then confirm, as the protocol allows (see cdc_core::deliver::protocol::plan_flush).
        let Some(run) = self.sinks.get_mut(id) else {
            return false;
        };
        let mode = run.producer.as_mut().map_or(config.delivery_mode(), |p| p.sink().delivery_mode());
        let plan = match (&run.producer, preflushed) {
            (_, Some(plan)) => plan,
            (Some(_), None) => protocol::plan_flush(mode, &batch, position, run.checkpoint, dedup),
            (None, None) => {
                protocol::FlushPlan { flush: None, confirm: batch.target.filter(|l| *l > position && batch.rows > 0) }
            }
        };
        let rows = batch.rows;
        // A large unit commits on the delivery thread while the next is read (see OVERLAP_ROWS).
        // Not for a sink with lookup tables: their copies are written before the slot is
        // confirmed, and must not hold changes of a unit not yet delivered (a failed delivery
        // would read it again against a copy ahead of its commit).
        let overlap = rows >= OVERLAP_ROWS && !stop_requested() && !run.assembler.has_lookups();
        let mut handed = Handed {
            awaiting: false,
            flushed: plan.flush,
            acked: 0,
            target: plan.confirm,
            // An in-database sink commits nothing for a unit without events (a heartbeat's).
            commits: batch.sent || !run.producer.as_ref().is_some_and(Producer::in_source_database),
            exactly_once: mode == DeliveryMode::ExactlyOnce,
            progress: batch.progress,
            routes: batch.routes,
            counted: batch.counted,
            tables: batch.tables,
            sent_log: batch.sent_log,
        };
        if let Some(producer) = run.producer.as_mut() {
            if let Some(checkpoint) = plan.flush {
                // An in-database sink flushed in the read's transaction already; a large unit is
                // flushed on the delivery thread while the next is read, and so is one queued
                // behind a flush in flight; the others here.
                let flushed = match producer {
                    _ if preflushed.is_some() => Ok(()),
                    Producer::Threaded(t) if overlap || t.in_flight() > 0 => {
                        t.start_flush(checkpoint).map(|()| handed.awaiting = true)
                    }
                    p => p.sink().flush(checkpoint),
                };
                if let Err(e) = flushed {
                    self.abort(id);
                    self.fail_with(id, Failure::sink(e));
                    return false;
                }
                handed.acked = batch::unix_micros_now();
                if handed.exactly_once {
                    // The next read skips what this unit holds, as if it had committed; if it
                    // does not, the sink fails and is opened again, reading the checkpoint anew.
                    run.checkpoint = Some(checkpoint);
                }
            }
        }
        if let Some(lsn) = handed.target {
            crate::stats::update(&row.id, |c| c.read_lsn = c.read_lsn.max(lsn.0));
        }
        if rows == 0 {
            self.maybe_heartbeat(id, position, cat);
        }
        let Some(run) = self.sinks.get_mut(id) else {
            return false;
        };
        run.handed.push_back(handed);
        if !self.settle(id, usize::from(overlap)) {
            return false;
        }
        // Confirm what was delivered: at once after a pass that read nothing or the first delivery
        // after a quiet spell, else at most every CONFIRM_INTERVAL.
        if let Some(run) = self.sinks.get_mut(id) {
            let due = rows == 0 || stop_requested() || run.last_confirm.is_none_or(|t| t.elapsed() >= CONFIRM_INTERVAL);
            if due {
                if let Err(e) = confirm_delivered(Some(&schema), run, confirmed) {
                    self.fail(id, SinkState::Error, format!("cannot confirm replication slot {}: {e}", row.slot));
                    return false;
                }
            }
        }
        if let Some(run) = self.sinks.get_mut(id) {
            run.failures = 0;
            run.retry_at = None;
            if std::mem::take(&mut run.compliance_hold) {
                crate::stats::update(id, |c| c.compliance_hold = 0);
            }
        }
        let snapshotting =
            one_off || self.sinks.get(id).is_some_and(|r| r.snapshotting == Some(true) || r.snap.chunk.is_some());
        self.set_state(id, if snapshotting { SinkState::Snapshotting } else { SinkState::Running }, None);
        if rows > batch::BUFFER_FRAMES as u64 {
            // A big batch filled librdkafka's queue and the buffers; give the freed memory back
            // (glibc keeps it otherwise, and the worker's private memory stays at its peak).
            // SAFETY: glibc's malloc_trim only releases free heap pages; callable at any time.
            unsafe { libc::malloc_trim(0) };
        }
        rows > 0
    }

    /// Takes the reports of a sink's handed units, oldest first, until at most `keep` are still
    /// awaited (waiting for the destination when needed), and records each delivered one. Returns
    /// false when one failed (the sink is failed then: the units after it are read again).
    fn settle(&mut self, id: &str, keep: usize) -> bool {
        let started = Instant::now();
        loop {
            let Some(run) = self.sinks.get_mut(id) else { return false };
            let Some(front) = run.handed.front() else { return true };
            if front.awaiting {
                let awaited = run.handed.iter().filter(|h| h.awaiting).count();
                let t = match run.producer.as_mut() {
                    Some(Producer::Threaded(t)) if t.in_flight() > 0 => t,
                    _ => {
                        // Nothing to wait for (cannot happen: each awaited unit has a flush in flight).
                        self.fail(id, SinkState::Retrying, "a delivery's report was lost".into());
                        return false;
                    }
                };
                let report = if awaited > keep {
                    // Bounded by the sink's own timeouts; when stopping, its interrupt ends it
                    // within moments, and what is not reported by then is read again.
                    t.wait_flushed(std::time::Duration::from_millis(100))
                } else {
                    t.try_flushed()
                };
                let Some(report) = report else {
                    if awaited > keep && !(stop_requested() && started.elapsed().as_secs() >= 2) {
                        continue;
                    }
                    return true;
                };
                if let Err(e) = report.result {
                    self.abort(id);
                    self.fail_with(id, Failure::sink(e));
                    return false;
                }
                if let Some(front) = run.handed.front_mut() {
                    front.awaiting = false;
                    front.acked = report.at_unix_micros;
                }
            }
            let Some(done) = run.handed.pop_front() else { return true };
            if !self.delivered_unit(id, done) {
                return false;
            }
        }
    }

    /// Before a read: looks up whether the sink has snapshot rows left, notes a chunk delivered,
    /// and reads the next chunk when it wants one. Returns false when the sink failed.
    fn snapshot_step(&mut self, id: &str, config: &SinkConfig) -> bool {
        let Some(schema) = self.schema.clone() else { return false };
        let Some(run) = self.sinks.get_mut(id) else { return false };
        if run.snapshotting.is_none() {
            // The windows of its tables open before its first read: every change its reads meet
            // from now on is delivered as a change, never also as a READ.
            match run_tx(|| snapshots::open_tables(&schema, id)) {
                Ok(Ok(open)) => {
                    for (oid, key, columns) in open.keyed {
                        run.snap.track(oid, key, &columns);
                    }
                    // A keyless table's changes wait for its plan (or follow the one it had).
                    for (oid, until) in open.keyless {
                        match until {
                            Some(p) => run.snap.drop_changes_before(oid, p),
                            None if run.keyless.as_ref().is_none_or(|k| k.table_oid != oid) => run.snap.hold(oid),
                            None => {}
                        }
                    }
                    run.snapshotting = Some(open.any);
                }
                Ok(Err(e)) | Err(e) => {
                    self.fail(id, SinkState::Retrying, format!("cannot read the sink's snapshots: {e}"));
                    return false;
                }
            }
        }
        let Some(run) = self.sinks.get_mut(id) else { return false };
        let watermark = run.snap.chunk.as_ref().and_then(|c| c.watermark());
        if watermark.is_some_and(|w| run.delivered.is_some_and(|d| d >= w)) {
            if let Some(c) = run.snap.chunk.take() {
                crate::stats::update(id, |s| s.snapshot_rows_delivered += c.kept() as u64);
            }
            run.chunk_delivered = true;
        }
        if !run.wants_chunk() {
            return true;
        }
        let previous = if run.chunk_delivered {
            Previous::Delivered
        } else {
            Previous::OpenedAt(run.opened_at.unwrap_or_default())
        };
        run.chunks += 1;
        let nonce = format!("{} {}", std::process::id(), run.chunks);
        let size = config.common().snapshot_chunk_size;
        let reader = &run.snap;
        let types = &mut self.types;
        match run_tx(|| snapshots::take_chunk(&schema, id, previous, size, reader, &nonce, types)) {
            Ok(Ok((next, open))) => {
                run.chunk_delivered = false;
                // The windows of tables whose snapshots are done (or skipped) close.
                let closed: Vec<u32> = run.snap.tracked_tables().filter(|t| !open.contains(t)).collect();
                for t in closed {
                    run.snap.untrack(t);
                }
                // A keyless table held for a plan that will not come (cancelled) is let go.
                for t in run.snap.held().into_iter().filter(|t| !open.contains(t)) {
                    run.snap.release_hold(t);
                }
                // A plan whose snapshot is no longer next (cancelled) is given up.
                let keyless_next = match next {
                    Next::Keyless { snapshot_id, table_oid } => Some((snapshot_id, table_oid)),
                    _ => None,
                };
                if run.keyless.as_ref().is_some_and(|k| Some(k.snapshot_id) != keyless_next.map(|n| n.0)) {
                    if let Some(k) = run.keyless.take() {
                        keyless::close(&k.cursor);
                    }
                    run.snap.pieces = None;
                }
                match next {
                    Next::Chunk(c) => run.snap.chunk = Some(*c),
                    Next::Later => {}
                    Next::Done => run.snapshotting = Some(false),
                    // Its next step opens the windows first (as a sink's first step does).
                    Next::Untracked => run.snapshotting = None,
                    Next::Keyless { snapshot_id, table_oid } => {
                        return self.keyless_step(id, snapshot_id, table_oid, size);
                    }
                }
                true
            }
            Ok(Err(e)) | Err(e) => {
                self.fail(id, SinkState::Retrying, format!("cannot read the next snapshot chunk: {e}"));
                false
            }
        }
    }

    /// The next snapshot is a keyless table's: plans it (its first time in this run), else
    /// fetches its next piece. Returns false when the sink failed.
    fn keyless_step(&mut self, id: &str, snapshot_id: i64, table_oid: u32, chunk_size: u32) -> bool {
        let Some(schema) = self.schema.clone() else { return false };
        let Some(run) = self.sinks.get_mut(id) else { return false };
        if let Some(plan) = run.keyless.as_ref().filter(|k| k.snapshot_id == snapshot_id) {
            let Some(pieces) = run.snap.pieces.as_mut() else { return false };
            let i = pieces.next;
            let read_at = cdc_core::deliver::read::unix_micros_now() - cdc_core::time::PG_EPOCH_OFFSET_MICROS;
            let mut chunk = Chunk::keyless(pieces.id(i), plan.relation.clone(), read_at);
            match run_tx(|| keyless::take_piece(&schema, plan, i, &mut chunk)) {
                Ok(Ok(())) => {
                    pieces.next += 1;
                    if i >= plan.last {
                        run.keyless = None;
                    }
                    run.snap.chunk = Some(chunk);
                    true
                }
                Ok(Err(e)) | Err(e) => {
                    self.fail(id, SinkState::Retrying, format!("cannot read the next piece of a keyless table: {e}"));
                    false
                }
            }
        } else {
            // Its slot is given back while an ephemeral one finds the snapshot (a process holds
            // one slot); the next read opens a new session.
            run.session = None;
            run.chunks += 1;
            let base = format!("{id} {} k{}", std::process::id(), run.chunks);
            match keyless::plan(&schema, snapshot_id, table_oid, chunk_size, &base) {
                Ok(keyless::Planned::Ready(plan)) => {
                    // Its column types, for a table none of whose changes was streamed yet.
                    let types = &mut self.types;
                    if let Err(e) = run_tx(|| super::source::learn_type_oids(&plan.types, types)) {
                        keyless::close(&plan.cursor);
                        self.fail(id, SinkState::Retrying, format!("cannot look up a keyless table's types: {e}"));
                        return false;
                    }
                    let Some(run) = self.sinks.get_mut(id) else { return false };
                    run.snap.drop_changes_before(table_oid, plan.until);
                    run.snap.pieces = Some(Pieces { base, next: 1, last: plan.last });
                    pgrx::log!(
                        "pg_cdc sink \"{}\": table {} has no key: its {} rows are read from the snapshot of {} \
                         in {} pieces",
                        run.row.name,
                        plan.relation.name,
                        plan.rows,
                        plan.until,
                        plan.last
                    );
                    if plan.last > 0 {
                        run.keyless = Some(plan);
                    }
                    true
                }
                Ok(keyless::Planned::Again) => true,
                Err(e) => {
                    self.fail(id, SinkState::Retrying, format!("cannot plan the snapshot of a keyless table: {e}"));
                    false
                }
            }
        }
    }

    /// An `initial_only` sink whose snapshots are all delivered: what it handed over is delivered
    /// and confirmed, the sink is marked finished, its slot dropped (it holds no WAL from now on)
    /// and its worker exits. A snapshot requested meanwhile keeps it going (it reads that first).
    fn finish(&mut self, id: &str, confirmed: Lsn) {
        let Some(schema) = self.schema.clone() else { return };
        if !self.settle(id, 0) {
            return;
        }
        let Some(run) = self.sinks.get_mut(id) else { return };
        if let Err(e) = confirm_delivered(Some(&schema), run, confirmed) {
            let msg = format!("cannot confirm replication slot {}: {e}", run.row.slot);
            self.fail(id, SinkState::Error, msg);
            return;
        }
        match run_tx(|| source::finish_sink(&schema, id)) {
            Ok(true) => {}
            Ok(false) => {
                // A snapshot was requested since it looked: its next step opens its window.
                run.snapshotting = None;
                return;
            }
            Err(e) => {
                self.fail(id, SinkState::Retrying, format!("cannot mark the sink finished: {e}"));
                return;
            }
        }
        let Some(run) = self.sinks.remove(id) else { return };
        let (name, slot) = (run.row.name.clone(), run.row.slot.clone());
        // Its session and destination go first: the slot must be free to be dropped.
        drop(run);
        decoding::release_slot();
        match run_tx(|| source::drop_slot(&slot)) {
            Ok(()) => pgrx::log!(
                "pg_cdc sink \"{name}\": finished: its initial_only snapshot is delivered; dropped replication slot {slot}"
            ),
            Err(e) => pgrx::warning!(
                "pg_cdc sink \"{name}\": finished, but its replication slot {slot} could not be dropped ({e}); \
                 the launcher drops it"
            ),
        }
        self.cached = None;
        self.finished = true;
    }

    /// Records a delivered unit: counters, latencies, the lookup copies, and the position and
    /// progress the next confirm writes.
    fn delivered_unit(&mut self, id: &str, done: Handed) -> bool {
        let Some(run) = self.sinks.get_mut(id) else { return false };
        if !done.sent_log.is_empty() {
            // From the end of the delivery, not the read: a slow commit must not move the sink's
            // next read to the idle sinks' turns (an idle sink's units carry only heartbeats).
            run.last_delivered = Some(Instant::now());
        }
        let row = run.row.clone();
        let mut counted = done.counted;
        if let Some(checkpoint) = done.flushed {
            if done.exactly_once {
                counted.committed_transactions = 1;
                counted.committed_lsn = checkpoint.end_lsn.0;
            }
            // A unit handed over after this one is open at the destination.
            let open = u64::from(!run.handed.is_empty());
            crate::stats::update(&row.id, |c| {
                add(c, &counted);
                c.open_transactions = open;
            });
            crate::stats::add_tables(&row.id, &done.tables);
            record_latencies(&row.id, &done.sent_log, done.acked);
            if done.commits && self.failpoint.1.fires(Failpoint::AfterSinkCommit, &row.name) {
                pgrx::log!(
                    "pg_cdc worker: failpoint after_sink_commit of sink \"{}\": exiting before the slot is confirmed",
                    row.name
                );
                // SAFETY: ends this process on purpose (test failpoint); the postmaster restarts it.
                unsafe { pg_sys::proc_exit(1) };
            }
        } else {
            crate::stats::update(&row.id, |c| add(c, &counted));
            crate::stats::add_tables(&row.id, &done.tables);
        }
        if counted.duplicate_events_filtered > 0 {
            pgrx::log!(
                "pg_cdc sink \"{}\": skipped {} events its destination holds already (checkpoint {})",
                row.name,
                counted.duplicate_events_filtered,
                run.checkpoint.map(|c| c.end_lsn).unwrap_or_default()
            );
        }
        let Some(lsn) = done.target else { return true };
        // The lookup copies first: after a crash between the two they are ahead of the slot,
        // which they know (their position) and skip; behind it they would miss changes.
        let flush = run.assembler.lookups_mut().take_flush();
        if !flush.is_empty() {
            let Some(schema) = self.schema.clone() else { return false };
            if let Err(e) = run_tx(|| lookups::write(&schema, &row.id, &flush)) {
                self.fail(id, SinkState::Error, format!("cannot save the lookup copies of sink \"{}\": {e}", row.name));
                return false;
            }
        }
        let Some(run) = self.sinks.get_mut(id) else { return false };
        run.delivered = Some(lsn);
        run.add_progress(&done.progress, &done.routes);
        if !done.exactly_once {
            crate::stats::update(&row.id, |c| c.committed_lsn = c.committed_lsn.max(lsn.0));
        }
        true
    }

    /// Abandons a sink's open delivery (the events are read again later) and counts it.
    fn abort(&mut self, id: &str) {
        let Some(run) = self.sinks.get_mut(id) else { return };
        let Some(producer) = run.producer.as_mut() else { return };
        let exactly_once = producer.sink().delivery_mode() == DeliveryMode::ExactlyOnce;
        if stop_requested() {
            // Shutting down: aborting can block up to the transaction timeout (measured: 30 s after
            // a SIGTERM that interrupted the first delivery to a new topic, so pg_terminate_backend
            // took 30 s). Drop the producer instead: the next worker's init_transactions fences it
            // and aborts its open transaction, which is what exactly-once relies on after a kill.
            run.producer = None;
        } else {
            producer.sink().abort();
        }
        crate::stats::update(id, |c| {
            if exactly_once && c.open_transactions > 0 {
                c.aborted_transactions += 1;
            }
            c.open_transactions = 0;
        });
    }

    /// Emits a heartbeat when the slot is behind the WAL and nothing it captures was written.
    fn maybe_heartbeat(&mut self, id: &str, confirmed: Lsn, cat: &Catalog) {
        let Some(run) = self.sinks.get_mut(id) else {
            return;
        };
        let insert: Lsn = cat.wal_insert_lsn.parse().unwrap_or_default();
        let interval = std::time::Duration::from_millis(gucs::HEARTBEAT_INTERVAL_MS.get().max(100) as u64);
        // Also sooner when the slot is far behind (a new session would decode that WAL again; see
        // mark_restart_point) and the last heartbeat was read already.
        let far = insert.0 > confirmed.0.saturating_add(RESTART_POINT_BYTES)
            && run.heartbeat_end.is_none_or(|h| h <= confirmed);
        let due = far || run.last_heartbeat.is_none_or(|t| t.elapsed() >= interval);
        // Only when WAL other than our own last heartbeat was written since it.
        let moved = insert > confirmed && run.heartbeat_end.is_none_or(|h| insert.0 > h.0 + 128);
        if !(due && moved) {
            return;
        }
        run.last_heartbeat = Some(Instant::now());
        if let Ok(Some(lsn)) = run_tx(source::emit_heartbeat) {
            run.heartbeat_end = lsn.parse().ok();
        }
    }

    /// Drops pg_cdc slots whose sink is gone, once no transaction that could still commit the
    /// sink row is open.
    fn drop_orphan_slots(&mut self, cat: &Catalog) {
        let mut still = OrphanSightings::new();
        for slot in &cat.slots {
            // A finished sink's slot is dropped by its worker; should that fail, here.
            if cat.sinks.iter().any(|s| s.slot == slot.name && !s.finished()) {
                continue;
            }
            match self.orphans.get(&slot.name) {
                None => {
                    still.insert(slot.name.clone(), cat.now.clone());
                }
                Some(first_seen) => {
                    let (name, seen) = (slot.name.clone(), first_seen.clone());
                    let schema = cat.installed.then(|| self.schema.clone()).flatten();
                    let dropped = slot.active_pid.is_none()
                        && run_tx(|| {
                            // The catalog was read before this transaction: a sink committed since
                            // (its slot made inside its transaction) is looked for again here.
                            if source::older_transaction_open(&seen)
                                || schema.as_deref().is_some_and(|s| source::slot_has_sink(s, &name))
                            {
                                false
                            } else {
                                source::drop_slot(&name);
                                true
                            }
                        })
                        .unwrap_or(false);
                    if dropped {
                        pgrx::log!("{}: dropped replication slot {name} of a dropped sink", self.role.name());
                    } else {
                        still.insert(slot.name.clone(), first_seen.clone());
                    }
                }
            }
        }
        self.orphans = still;
    }
}
