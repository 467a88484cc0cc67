//! The worker's state across ticks: one [`SinkRun`] per sink (its driver, `cdc_core::driver`, and
//! what only the worker holds: its decoding session, a producer being opened, a keyless table's
//! cursor), the type registry, the parsed capture configs, and orphan-slot sightings.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdc_core::config::{checkpoint_interval, parse_stored_capture_config, CaptureConfig, SnapshotMode};
use cdc_core::deliver::protocol::{self, SlotView};
use cdc_core::driver::{Driver, Producer, Read, ReadSettings, RESTART_POINT_BYTES};
use cdc_core::failpoint::Armed;
use cdc_core::pipeline::{Assembler, SinkTables};
use cdc_core::redact::TokenKey;
use cdc_core::snapshot::{Chunk, MvccSnapshot, Pieces};
use cdc_core::state::SinkState;
use cdc_core::types::TypeRegistry;
use cdc_core::Lsn;
use cdc_sinks::kinesis::aws::Defaults;
use cdc_sinks::open::{with_signals_blocked, OpenContext, Opening, ServerSettings};
use cdc_sinks::postgres::SourceTable;
use cdc_sinks::table::EventStore;
use cdc_sinks::{parse_config, Checkpoint, ErrorClass, SinkConfig, SinkError};
use pgrx::pg_sys;

use super::decoding::{self, Session, SessionRead};
use super::env::{self, Host};
use super::keyless;
use super::snapshot as snapshots;
use super::source::{self, Catalog, SinkRow};
use super::table_sink::SpiStore;
use super::{run_tx, stop_requested, OrphanSightings};
use crate::catalog::PUBLICATION_NAMES;
use crate::{gucs, keys, lookups};
use cdc_core::deliver::handoff::DeliveryThread;
use cdc_core::deliver::read::{Batch, Failure, BUFFER_FRAMES, FETCH_ROWS};

/// A unit of at least this many rows (a backlog, or a high rate) is committed on the sink's
/// delivery thread while the next one is read. A smaller one is waited for before the next read:
/// at a low rate a read right after handing a unit over finds only the few changes committed
/// since, and the sink would commit twice as many, smaller, transactions for no gain.
const OVERLAP_ROWS: u64 = FETCH_ROWS as u64;

/// Runtime state of one sink.
pub struct SinkRun {
    pub(super) row: SinkRow,
    config: Result<SinkConfig, String>,
    /// Its delivery: destination, units handed over and delivered, snapshot, failures, state.
    pub(super) driver: Driver,
    /// The producer being opened, when it is.
    opening: Option<Opening>,
    /// Its decoding session (holds the slot), open from the first read until a failure.
    session: Option<Session>,
    /// The keyless table's snapshot whose pieces it is delivering (see [`super::keyless`]).
    keyless: Option<keyless::Plan>,
}

impl SinkRun {
    /// The driver and its host for one call: the port borrows the session, the driver the rest.
    fn split<'a>(&'a mut self, schema: &'a str, failpoint: &'a Armed) -> (&'a mut Driver, Host<'a>) {
        let host = Host { schema, row: &self.row, session: self.session.as_mut(), failpoint };
        (&mut self.driver, host)
    }

    /// Its destination was opened: the first time in this run, where it stood then.
    fn note_opened(&mut self, confirmed: Lsn) {
        self.driver.note_opened(confirmed, gucs::TEST_SNAPSHOT_IGNORE_CHECKPOINT.get());
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
    run.driver.checkpoint = checkpoint;
    run.note_opened(slot.confirmed);
    // The delivery thread touches nothing of PostgreSQL and starts with every signal blocked.
    let mut thread = with_signals_blocked(|| DeliveryThread::start(opened))
        .map_err(|e| Failure::new(SinkState::Retrying, format!("cannot start the sink's delivery thread: {e}")))?;
    thread.set_interrupt(stop_requested);
    run.driver.producer = Some(Producer::Threaded(thread));
    Ok(())
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
/// Confirms what a sink delivered since the last confirm (see `Driver::confirm_delivered`); a
/// failure is only logged (the next worker or session reads the unconfirmed tail again).
fn confirm_or_warn(schema: Option<&str>, run: &mut SinkRun, failpoint: &Armed, confirmed: Lsn) {
    let Some(schema) = schema else { return };
    let (driver, mut host) = run.split(schema, failpoint);
    if let Err(e) = driver.confirm_delivered(&mut host, confirmed) {
        pgrx::warning!("pg_cdc sink \"{}\": cannot confirm replication slot {}: {e}", run.row.name, run.row.slot);
    }
}

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
            confirm_or_warn(self.schema.as_deref(), run, &self.failpoint.1, confirmed);
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
            if run.driver.snapshotting == Some(false) {
                run.driver.snapshotting = None;
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
                        run.driver.assembler.set_context_key(self.context_key.clone());
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
                run.driver.assembler.set_token_key(self.token_key.clone());
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
                    confirm_or_warn(self.schema.as_deref(), run, &self.failpoint.1, confirmed);
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
                let driver = Driver::new(assembler, (SinkState::parse(&row.state), row.last_error.clone()));
                let run = SinkRun { row: row.clone(), config, driver, opening: None, session: None, keyless: None };
                self.sinks.insert(row.id.clone(), run);
            } else if let Some(r) = self.sinks.get_mut(&row.id) {
                r.row = row.clone();
            }
            // Which transactions the catalog copy reflects (capture and version messages of
            // later ones make the sink read it again).
            if let Some(r) = self.sinks.get_mut(&row.id) {
                r.driver
                    .assembler
                    .set_catalog_snapshot(cat.snapshot.as_deref().and_then(|t| MvccSnapshot::parse(t).ok()));
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
            if run.driver.assembler.has_lookups() {
                run.driver.assembler.lookups_mut().set_bindings(&[]);
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
        let l = run.driver.assembler.lookups_mut();
        l.set_capacity(gucs::ENRICH_CACHE_ROWS.get().max(1) as usize);
        l.set_bindings(&bindings);
        true
    }

    /// Records a state change in the catalog (only when it differs from what was written).
    fn set_state(&mut self, id: &str, state: SinkState, error: Option<String>) {
        let (Some(schema), Some(run)) = (self.schema.as_deref(), self.sinks.get_mut(id)) else { return };
        let (driver, mut host) = run.split(schema, &self.failpoint.1);
        driver.set_state(&mut host, state, error);
    }

    /// Marks a failure: state, backoff, fresh producer and relation state next time.
    fn fail(&mut self, id: &str, state: SinkState, error: String) {
        self.fail_with(id, Failure::new(state, error));
    }

    /// Marks a failed read or delivery (see `Driver::fail`). Its decoding session goes too: what
    /// it decoded and sent is read again by a new session, from the slot's confirmed position (the
    /// old one may have let go of messages the failed delivery held).
    fn fail_with(&mut self, id: &str, f: Failure) {
        // Read the catalog again next time (a failure may come from a change it does not show yet).
        self.cached = None;
        if let Some(run) = self.sinks.get_mut(id) {
            if let Some(opening) = run.opening.take() {
                self.abandoned.retain(|h| !h.is_finished());
                self.abandoned.push(opening);
            }
            run.session = None;
            let schema = self.schema.as_deref().unwrap_or_default();
            let (driver, mut host) = run.split(schema, &self.failpoint.1);
            driver.fail(&mut host, f, &env::settings(), Instant::now());
        }
        // A session that failed to open may hold the slot already.
        decoding::release_slot();
    }

    /// One step of one sink: may it read, its snapshot's next chunk, one read handed over to its
    /// destination, what is delivered recorded and confirmed. Returns true when it read changes.
    fn step(&mut self, id: &str, cat: &Catalog) -> bool {
        let Some(run) = self.sinks.get(id) else { return false };
        if run.driver.backing_off(Instant::now()) {
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
        let Some(confirmed) = self.may_read(id, &row, cat) else { return false };
        if !self.snapshot_step(id, &config) {
            return false;
        }
        // An initial_only sink delivers nothing but its snapshot (and the changes around it).
        let one_off = config.common().snapshot_mode == SnapshotMode::InitialOnly;
        let snapshot_done = |r: &SinkRun| r.driver.snapshotting == Some(false) && r.driver.snap.chunk.is_none();
        if one_off && self.sinks.get(id).is_some_and(snapshot_done) {
            self.finish(id, confirmed);
            return false;
        }
        let tables = self.tables_for(&row);
        if !self.bind_lookups(id, &row, &tables) {
            return false;
        }
        let Some((batch, preflushed)) = self.read(id, &row, &config, &tables, confirmed, cat) else { return false };
        self.deliver(id, &config, batch, preflushed, confirmed, cat, one_off)
    }

    /// Whether the sink may read now: its stored capture configs can be read, its slot exists
    /// (made here when the sink was added inside a transaction), its publications and slot are
    /// fine, its destination is not behind the slot and is not being opened. Returns the slot's
    /// confirmed position; `None` after failing the sink, or while its destination opens.
    fn may_read(&mut self, id: &str, row: &SinkRow, cat: &Catalog) -> Option<Lsn> {
        if let Some((oid, why)) = self.unreadable.iter().find(|(oid, _)| row.carries(**oid)) {
            let table =
                cat.tables.iter().find(|t| t.oid == *oid).map_or_else(|| format!("OID {oid}"), |t| t.name.clone());
            let msg = format!(
                "the stored capture config of table {table} cannot be read ({why}); its changes are held back: \
                 cdc_enable the table again with a valid config"
            );
            self.fail(id, SinkState::Error, msg);
            return None;
        }
        let (missing, slot) = slot_view(cat, row);
        if missing.is_none() && !slot.exists && row.state == SinkState::CreatingSlot.label() {
            let slot = row.slot.clone();
            match run_tx(|| source::create_slot(&slot)) {
                Ok(()) => self.set_state(id, SinkState::Starting, None),
                Err(e) => self.fail(id, SinkState::Error, format!("cannot create replication slot {slot}: {e}")),
            }
            return None;
        }
        if let Some(f) = protocol::slot_failure(missing, &slot) {
            self.fail_with(id, f);
            return None;
        }
        let run = self.sinks.get_mut(id)?;
        if let Some(producer) = &run.driver.producer {
            if let Err(f) = protocol::check_checkpoint(&slot, run.driver.checkpoint, producer.in_source_database()) {
                self.fail_with(id, f);
                return None;
            }
        }
        // A producer being opened: wait for it without blocking the other sinks.
        if run.opening.as_ref().is_some_and(|h| !h.is_finished()) {
            return None;
        }
        if let Some(opening) = run.opening.take() {
            if let Err(f) = finish_open(run, opening, &slot) {
                self.fail_with(id, f);
                return None;
            }
        }
        Some(slot.confirmed)
    }

    /// Reads the sink's slot from where it stands and sends what it read to its destination,
    /// inside one transaction (an in-database sink writes its events in it, and flushes there
    /// too). Returns the read, and the flush plan of an in-database sink's; `None` after failing
    /// the sink, or when the read only started opening the destination.
    fn read(
        &mut self,
        id: &str,
        row: &SinkRow,
        config: &SinkConfig,
        tables: &SinkTables,
        confirmed: Lsn,
        cat: &Catalog,
    ) -> Option<(Batch, Option<protocol::FlushPlan>)> {
        let batch_changes = gucs::BATCH_CHANGES.get();
        let settings = ReadSettings {
            large_frames: (batch_changes.max(1) as usize).min(BUFFER_FRAMES),
            dedup: !gucs::TEST_SKIP_DEDUP.get(),
            skip_window: gucs::TEST_SKIP_SNAPSHOT_WINDOW.get(),
            checkpoint_interval: checkpoint_interval(
                config.common().checkpoint_interval_ms,
                tables.values().map(|c| &**c),
            )
            .map(|ms| Duration::from_millis(u64::from(ms))),
        };
        let schema = self.schema.clone()?;
        let mut types = std::mem::take(&mut self.types);
        let mut run = self.sinks.remove(id)?;
        // Reads go by what was delivered and handed over, the slot by what was confirmed.
        let position = run.driver.position(confirmed);
        // The unit before is still being committed on the delivery thread while this one is read.
        let overlapped = run.driver.overlapping();
        // A failure of an in-database sink rolls the read's transaction back (its events were
        // written in it); the failure itself comes back here.
        let mut rolled_back: Option<Failure> = None;
        let read = run_tx(|| -> Result<(Batch, Option<protocol::FlushPlan>), Failure> {
            if run.driver.producer.is_none() {
                match open_in_place(&schema, row, config) {
                    Ok(Some((producer, checkpoint))) => {
                        run.driver.checkpoint = checkpoint;
                        run.driver.producer = Some(producer);
                        let first_open = run.driver.opened_at.is_none();
                        run.note_opened(confirmed);
                        if run.driver.snapshotting == Some(true) && first_open {
                            // Where it stands decides whether a chunk in flight was delivered:
                            // read the next chunk before delivering anything.
                            return Ok((Batch { opening: true, ..Batch::default() }, None));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => return Err(Failure::sink(e)),
                }
            }
            if let Some(Producer::InPlace(sink)) = run.driver.producer.as_mut() {
                sink.maintain();
            }
            // Reading (decoding) takes a turn: with many sinks, parallel reads would take the
            // primary's CPU (each slot decodes all WAL). Flushing to the destination holds none.
            // A sink that is delivering takes its turn apart from those that had nothing to
            // deliver, so idle sinks' reads never queue ahead of it.
            let pool = if run.driver.delivering(Instant::now()) {
                source::ReadPool::Delivering
            } else {
                source::ReadPool::Idle
            };
            source::take_read_turn(gucs::MAX_CONCURRENT_READS.get(), read_turn_hint(&row.id), pool);
            let session = match run.session.as_mut() {
                Some(s) => s,
                None => {
                    crate::stats::update(&row.id, |c| c.decoding_sessions += 1);
                    run.session.insert(Session::open(&row.slot))
                }
            };
            // Only its tables (and their lookup tables) reach pgoutput.
            let lookups = run.driver.assembler.lookups().lookup_tables();
            let carried = row.tables.as_ref().map(|t| t.iter().copied().chain(lookups));
            session.carry_only(carried.map(Iterator::collect));
            session.begin_read(position);
            let mut session_read =
                SessionRead { session, most: batch_changes.max(1) as u64, schema: &schema, sink_name: &row.name };
            let opened = || crate::stats::update(&row.id, |c| c.open_transactions = 1);
            let in_source = run.driver.producer.as_ref().is_some_and(Producer::in_source_database);
            match run.driver.read(&mut session_read, &mut types, tables, &settings, position, Some(&opened)) {
                Ok(Read::Nothing) => Ok((Batch::default(), None)),
                Ok(Read::Open) => {
                    // Only a sink with something to send opens a producer; the next steps wait for it.
                    run.opening = Some(start_open(&run, config, cat).map_err(Failure::sink)?);
                    Ok((Batch { opening: true, ..Batch::default() }, None))
                }
                Ok(Read::Sent(b, plan)) => Ok((*b, plan)),
                Err(f) if in_source => {
                    // Its events were written in this transaction: roll it back.
                    let message = f.message.clone();
                    rolled_back = Some(f);
                    pgrx::error!("pg_cdc: delivery rolled back: {message}");
                }
                Err(f) => Err(f),
            }
        });
        let (decoded, skipped) = run.session.as_mut().map_or((0, 0), Session::take_counts);
        let read_rows = matches!(&read, Ok(Ok((b, _))) if b.rows > 0);
        crate::stats::update(&row.id, |c| {
            c.wal_decoded_bytes += decoded;
            c.changes_skipped += skipped;
            c.reads_overlapped += u64::from(overlapped && read_rows);
        });
        self.sinks.insert(id.to_string(), run);
        let failure = match read {
            Ok(Ok((b, _))) if b.opening => {
                self.types = types;
                return None;
            }
            Ok(Ok(read)) => {
                self.types = types;
                return Some(read);
            }
            Ok(Err(f)) => {
                self.types = types;
                f
            }
            Err(_) if rolled_back.is_some() => {
                self.types = TypeRegistry::new();
                rolled_back?
            }
            Err(e) => {
                self.types = TypeRegistry::new();
                let run = self.sinks.get(id)?;
                let writes = run.driver.producer.as_ref().is_some_and(Producer::in_source_database);
                // The worker may have used its copy of the catalog: read it, and report a
                // publication or slot dropped by hand as a pass that read it would.
                let explained = run_tx(source::load_catalog).ok().and_then(|c| {
                    let (missing, slot) = slot_view(&c, row);
                    protocol::slot_failure(missing, &slot)
                });
                explained.unwrap_or_else(|| {
                    let what = if writes { " or write its events" } else { "" };
                    Failure::new(SinkState::Error, format!("cannot read replication slot {}{what}: {e}", row.slot))
                })
            }
        };
        self.abort(id);
        self.fail_with(id, failure);
        None
    }

    /// Hands a read over to the sink's destination, flushes it as the protocol allows (see
    /// `cdc_core::deliver::protocol::plan_flush`; an in-database sink's `preflushed` in the read's
    /// transaction), settles what was delivered, confirms when due, and shows the state.
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        id: &str,
        config: &SinkConfig,
        batch: Batch,
        preflushed: Option<protocol::FlushPlan>,
        confirmed: Lsn,
        cat: &Catalog,
        one_off: bool,
    ) -> bool {
        let dedup = !gucs::TEST_SKIP_DEDUP.get();
        let Some(schema) = self.schema.clone() else { return false };
        let Some(run) = self.sinks.get_mut(id) else { return false };
        let position = run.driver.position(confirmed);
        let mode = run.driver.producer.as_mut().map_or(config.delivery_mode(), |p| p.sink().delivery_mode());
        let plan = match (&run.driver.producer, preflushed) {
            (_, Some(plan)) => plan,
            (Some(_), None) => protocol::plan_flush(mode, &batch, position, run.driver.checkpoint, dedup),
            (None, None) => {
                protocol::FlushPlan { flush: None, confirm: batch.target.filter(|l| *l > position && batch.rows > 0) }
            }
        };
        let rows = batch.rows;
        // A large unit commits on the delivery thread while the next is read (see OVERLAP_ROWS).
        // Not for a sink with lookup tables: their copies are written before the slot is
        // confirmed, and must not hold changes of a unit not yet delivered (a failed delivery
        // would read it again against a copy ahead of its commit).
        let overlap = rows >= OVERLAP_ROWS && !stop_requested() && !run.driver.assembler.has_lookups();
        let (driver, mut host) = run.split(&schema, &self.failpoint.1);
        if let Err(f) = driver.hand_over(&mut host, batch, plan, preflushed.is_some(), overlap, mode) {
            self.fail_with(id, f);
            return false;
        }
        if rows == 0 {
            self.maybe_heartbeat(id, position, cat);
        }
        if !self.settle(id, usize::from(overlap)) {
            return false;
        }
        let Some(run) = self.sinks.get_mut(id) else { return false };
        let (driver, mut host) = run.split(&schema, &self.failpoint.1);
        if driver.confirm_due(rows, stop_requested(), Instant::now()) {
            if let Err(e) = driver.confirm_delivered(&mut host, confirmed) {
                let msg = format!("cannot confirm replication slot {}: {e}", run.row.slot);
                self.fail(id, SinkState::Error, msg);
                return false;
            }
        }
        driver.succeeded(&mut host);
        let state = driver.delivering_state(one_off);
        driver.set_state(&mut host, state, None);
        if rows > BUFFER_FRAMES as u64 {
            // A big batch filled librdkafka's queue and the buffers; give the freed memory back
            // (glibc keeps it otherwise, and the worker's private memory stays at its peak).
            // SAFETY: glibc's malloc_trim only releases free heap pages; callable at any time.
            unsafe { libc::malloc_trim(0) };
        }
        rows > 0
    }

    /// Takes the reports of a sink's handed units until at most `keep` are still awaited (see
    /// `Driver::settle`). Returns false when one failed (the sink is failed then).
    fn settle(&mut self, id: &str, keep: usize) -> bool {
        let (Some(schema), Some(run)) = (self.schema.as_deref(), self.sinks.get_mut(id)) else { return false };
        let (driver, mut host) = run.split(schema, &self.failpoint.1);
        match driver.settle(&mut host, keep) {
            Ok(()) => true,
            Err(f) => {
                self.fail_with(id, f);
                false
            }
        }
    }

    /// Before a read: looks up whether the sink has snapshot rows left, notes a chunk delivered,
    /// and reads the next chunk when it wants one (the decisions are `cdc_core::driver::snapshot`'s).
    /// Returns false when the sink failed.
    fn snapshot_step(&mut self, id: &str, config: &SinkConfig) -> bool {
        let Some(schema) = self.schema.clone() else { return false };
        let Some(run) = self.sinks.get_mut(id) else { return false };
        if run.driver.snapshots_unknown() {
            match run_tx(|| snapshots::open_tables(&schema, id)) {
                Ok(Ok(open)) => run.driver.open_windows(open, run.keyless.as_ref().map(|k| k.table_oid)),
                Ok(Err(e)) | Err(e) => {
                    self.fail(id, SinkState::Retrying, format!("cannot read the sink's snapshots: {e}"));
                    return false;
                }
            }
        }
        if let Some(rows) = run.driver.chunk_delivered() {
            crate::stats::update(id, |s| s.snapshot_rows_delivered += rows);
        }
        let Some((previous, n)) = run.driver.chunk_wanted() else { return true };
        let nonce = format!("{} {n}", std::process::id());
        let size = config.common().snapshot_chunk_size;
        let (reader, types) = (&run.driver.snap, &mut self.types);
        match run_tx(|| snapshots::take_chunk(&schema, id, previous, size, reader, &nonce, types)) {
            Ok(Ok((next, open))) => {
                let taken = run.driver.chunk_taken(next, &open, run.keyless.as_ref().map(|k| k.snapshot_id));
                if taken.give_up_plan {
                    if let Some(k) = run.keyless.take() {
                        keyless::close(&k.cursor);
                    }
                }
                match taken.keyless {
                    Some((snapshot_id, table_oid)) => self.keyless_step(id, snapshot_id, table_oid, size),
                    None => true,
                }
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
            let Some(pieces) = run.driver.snap.pieces.as_mut() else { return false };
            let i = pieces.next;
            let read_at = cdc_core::deliver::read::unix_micros_now() - cdc_core::time::PG_EPOCH_OFFSET_MICROS;
            let mut chunk = Chunk::keyless(pieces.id(i), plan.relation.clone(), read_at);
            match run_tx(|| keyless::take_piece(&schema, plan, i, &mut chunk)) {
                Ok(Ok(())) => {
                    pieces.next += 1;
                    if i >= plan.last {
                        run.keyless = None;
                    }
                    run.driver.snap.chunk = Some(chunk);
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
            run.driver.chunks += 1;
            let base = format!("{id} {} k{}", std::process::id(), run.driver.chunks);
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
                    run.driver.snap.drop_changes_before(table_oid, plan.until);
                    run.driver.snap.pieces = Some(Pieces { base, next: 1, last: plan.last });
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
        let (driver, mut host) = run.split(&schema, &self.failpoint.1);
        if let Err(e) = driver.confirm_delivered(&mut host, confirmed) {
            let msg = format!("cannot confirm replication slot {}: {e}", run.row.slot);
            self.fail(id, SinkState::Error, msg);
            return;
        }
        match run_tx(|| source::finish_sink(&schema, id)) {
            Ok(true) => {}
            Ok(false) => {
                // A snapshot was requested since it looked: its next step opens its window.
                run.driver.snapshotting = None;
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

    /// Abandons a sink's open delivery (see `Driver::abort`).
    fn abort(&mut self, id: &str) {
        let (Some(schema), Some(run)) = (self.schema.as_deref(), self.sinks.get_mut(id)) else { return };
        let (driver, mut host) = run.split(schema, &self.failpoint.1);
        driver.abort(&mut host);
    }

    /// Emits a heartbeat when the slot is behind the WAL and nothing it captures was written
    /// (see `Driver::heartbeat_due`).
    fn maybe_heartbeat(&mut self, id: &str, confirmed: Lsn, cat: &Catalog) {
        let Some(run) = self.sinks.get_mut(id) else { return };
        let insert: Lsn = cat.wal_insert_lsn.parse().unwrap_or_default();
        if !run.driver.heartbeat_due(insert, confirmed, &env::settings(), Instant::now()) {
            return;
        }
        if let Ok(Some(end)) = run_tx(source::emit_heartbeat) {
            if let Ok(end) = end.parse() {
                run.driver.heartbeat_written(end);
            }
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
