//! A worker's passes: the catalog read (or its copy reused), and for a sink worker one step of its
//! sink. The decisions of a step are its driver's (`cdc_core::driver`); this is the PostgreSQL
//! side around them: the transactions, the decoding session, the snapshot chunks, opening the
//! destination. One [`SinkRun`] per sink holds the driver and what only the worker holds (its
//! decoding session, a producer being opened, a keyless table's cursor).
use std::collections::HashMap;
use std::time::{Duration, Instant};

use cdc_core::config::{checkpoint_interval, SnapshotMode};
use cdc_core::deliver::protocol;
use cdc_core::deliver::read::{Batch, Failure, BUFFER_FRAMES, FETCH_ROWS};
use cdc_core::driver::{Producer, Read, ReadSettings};
use cdc_core::failpoint::Armed;
use cdc_core::pipeline::SinkTables;
use cdc_core::snapshot::MvccSnapshot;
use cdc_core::state::SinkState;
use cdc_core::types::TypeRegistry;
use cdc_core::Lsn;
use cdc_sinks::open::Opening;
use cdc_sinks::SinkConfig;

use super::decoding::{self, Session, SessionRead};
use super::env;
use super::keyless;
use super::launcher::Role;
use super::open::{finish_open, open_in_place, start_open};
use super::run::{confirm_or_warn, SinkRun};
use super::snapshot as snapshots;
use super::source::{self, Catalog, SinkRow};
use super::{run_read_tx, run_tx, stop_requested};
use crate::{gucs, lookups};

/// A unit of at least this many rows (a backlog, or a high rate) is committed on the sink's
/// delivery thread while the next one is read. A smaller one is waited for before the next read:
/// at a low rate a read right after handing a unit over finds only the few changes committed
/// since, and the sink would commit twice as many, smaller, transactions for no gain.
const OVERLAP_ROWS: u64 = FETCH_ROWS as u64;

/// A worker: the launcher, or one sink's worker.
pub struct Worker {
    role: Role,
    /// The launcher's chores.
    chores: super::chores::Chores,
    /// A sink worker's sink was dropped (or the extension): it exits.
    finished: bool,
    /// The sink name a sink worker shows in `application_name` (`pg_cdc worker: <name>`).
    shown_name: Option<String>,
    sinks: HashMap<String, SinkRun>,
    types: TypeRegistry,
    /// The captured tables' configs.
    configs: super::configs::Configs,
    schema: Option<String>,
    /// `cdc.schema_registry` as the Avro sinks were built with (a change rebuilds them).
    schema_registry: String,
    /// The keys events are tokenized and user contexts sealed with.
    keys: super::configs::Keys,
    /// `cdc.test_failpoint` as last read, and what it arms.
    failpoint: (String, Armed),
    /// A sink worker's copy of its catalog (its sink only), the generation it was read at, and
    /// when: used instead of reading it again while its session holds the slot, nothing changed
    /// and it is younger than `launcher::CATALOG_REFRESH`.
    cached: Option<(Catalog, u64, Instant)>,
    /// Sinks being opened on their own thread whose result is no longer wanted (the sink failed,
    /// or was dropped): the process waits for them before it exits ([`Worker::wait_for_openings`]).
    abandoned: Vec<Opening>,
}

impl Worker {
    pub fn new(role: Role) -> Self {
        Worker {
            role,
            chores: Default::default(),
            finished: false,
            shown_name: None,
            sinks: HashMap::new(),
            types: TypeRegistry::new(),
            schema: None,
            schema_registry: String::new(),
            keys: Default::default(),
            configs: Default::default(),
            failpoint: (String::new(), Armed::default()),
            cached: None,
            abandoned: Vec::new(),
        }
    }

    /// The settings were reloaded (SIGHUP).
    pub fn reloaded(&mut self) {
        self.chores.reloaded();
    }

    /// Reads `cdc.test_failpoint` again when it changed (see `env::refresh_failpoint`).
    fn refresh_failpoint(&mut self) {
        env::refresh_failpoint(&mut self.failpoint, self.role.name());
    }

    /// A sink worker whose sink is gone: it exits.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Whether a thread is opening one of its sinks' destinations (the worker looks again soon: a
    /// thread's end wakes nobody).
    pub fn opening(&self) -> bool {
        self.sinks.values().any(|r| r.opening.is_some())
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
    /// up), and closes what they opened (see `open::wait_for`).
    pub fn wait_for_openings(&mut self, limit: Duration) {
        let mut threads: Vec<Opening> = self.sinks.values_mut().filter_map(|r| r.opening.take()).collect();
        threads.append(&mut self.abandoned);
        super::open::wait_for(threads, limit, self.role.name());
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
        // The launcher reads the catalog when something may need it, not at every wake-up.
        if self.role == Role::Launcher && !self.chores.due(generation) {
            return false;
        }
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
                self.chores.not_installed(&cat);
                return false;
            }
            Err(e) => {
                pgrx::warning!("{who}: cannot read its catalog: {e}");
                return false;
            }
        };
        let id = match &self.role {
            Role::Launcher => {
                self.refresh_failpoint();
                self.chores.tick(&cat, self.schema.as_deref(), &self.failpoint.1, generation);
                return false;
            }
            Role::Sink(id) => id.clone(),
        };
        // A finished (initial_only) sink reads nothing more, a paused one nothing until it is
        // resumed: its worker exits (confirming what it delivered first).
        cat.sinks.retain(|s| s.id == id && s.has_worker());
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
        cat.wal_insert_lsn = Lsn(super::wal_inserted()).to_string();
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
        self.configs.refresh(cat);
        self.sync_sinks(cat);
        self.refresh_keys();
        self.refresh_failpoint();
        self.step(id, cat)
    }

    /// Loads the keys again when they changed, and hands them to every sink's assembler.
    fn refresh_keys(&mut self) {
        if self.keys.refresh() {
            for run in self.sinks.values_mut() {
                run.driver.assembler.set_token_key(self.keys.token_key.clone());
                run.driver.assembler.set_context_key(self.keys.context_key.clone());
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
                let registry = Some(self.schema_registry.as_str()).filter(|s| !s.is_empty());
                let run = SinkRun::new(row, &cat.database, registry, &self.keys, self.schema.as_deref());
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

    /// Gives a sink's assembler the lookup copies its tables read (see `lookups::bind`). Returns
    /// false when the sink cannot read this time.
    fn bind_lookups(&mut self, id: &str, row: &SinkRow, tables: &SinkTables) -> bool {
        let (Some(schema), Some(run)) = (self.schema.as_deref(), self.sinks.get_mut(id)) else { return false };
        match lookups::bind(schema, row, &mut run.driver.assembler, tables) {
            Ok(()) => true,
            Err(f) => {
                self.fail_with(id, f);
                false
            }
        }
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
            run.membership.reset();
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
        let tables = self.configs.tables_for(&row);
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
        if let Some((oid, why)) = self.configs.unreadable_for(row) {
            let table =
                cat.tables.iter().find(|t| t.oid == oid).map_or_else(|| format!("OID {oid}"), |t| t.name.clone());
            let msg = format!(
                "the stored capture config of table {table} cannot be read ({why}); its changes are held back: \
                 cdc_enable the table again with a valid config"
            );
            self.fail(id, SinkState::Error, msg);
            return None;
        }
        let (missing, slot) = source::slot_view(cat, row);
        if missing.is_none() && !slot.exists && row.state == SinkState::CreatingSlot.label() {
            let slot = row.slot.clone();
            match run_tx(|| source::create_slot(&slot)) {
                Ok(()) => self.set_state(id, SinkState::Starting, None),
                // It stays creating_slot (with the reason) and is tried again after the backoff: a
                // sink marked error here was never given its slot (only creating_slot makes one),
                // and every later pass reported the slot as dropped.
                Err(e) => self.fail(id, SinkState::CreatingSlot, format!("cannot create replication slot {slot}: {e}")),
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
        let read = run_read_tx(|| -> Result<Read, Failure> {
            if run.driver.producer.is_none() && open_in_place(&mut run, &schema, config, confirmed)? {
                // Where it stands decides whether a chunk in flight was delivered: read the next
                // chunk before delivering anything.
                return Ok(Read::Open);
            }
            if let Some(Producer::InPlace(sink)) = run.driver.producer.as_mut() {
                sink.maintain();
            }
            // Only its tables (and their lookup tables) reach pgoutput.
            let lookups = run.driver.assembler.lookups().lookup_tables();
            let carried = row.tables.as_ref().map(|t| t.iter().copied().chain(lookups).collect());
            let delivering = run.driver.delivering(Instant::now());
            let frames = decoding::ready(&mut run.session, &mut run.membership, row, carried, position, delivering);
            let mut session_read =
                SessionRead { frames, most: batch_changes.max(1) as u64, schema: &schema, sink_name: &row.name };
            let opened = || crate::stats::update(&row.id, |c| c.open_transactions = 1);
            let in_source = run.driver.producer.as_ref().is_some_and(Producer::in_source_database);
            match run.driver.read(&mut session_read, &mut types, tables, &settings, position, Some(&opened)) {
                Ok(Read::Open) => {
                    // Only a sink with something to send opens a producer; the next steps wait for it.
                    run.opening = Some(start_open(&run, config, cat).map_err(Failure::sink)?);
                    Ok(Read::Open)
                }
                Err(f) if in_source => {
                    // Its events were written in this transaction: roll it back.
                    let message = f.message.clone();
                    rolled_back = Some(f);
                    pgrx::error!("pg_cdc: delivery rolled back: {message}");
                }
                other => other,
            }
        });
        let (decoded, skipped) = run.session.as_mut().map_or((0, 0), Session::take_counts);
        let log = run.membership.take_counts();
        let read_rows = matches!(&read, Ok(Ok(Read::Sent(b, _))) if b.rows > 0);
        crate::stats::update(&row.id, |c| {
            c.wal_decoded_bytes += decoded;
            c.changes_skipped += skipped + log.skipped;
            c.log_frames_read += log.frames;
            c.log_reads += log.reads;
            c.log_wal_bytes += log.wal_bytes;
            c.reads_overlapped += u64::from(overlapped && read_rows);
        });
        self.sinks.insert(id.to_string(), run);
        let failure = match read {
            Ok(Ok(read)) => {
                self.types = types;
                return match read {
                    Read::Open => None,
                    Read::Nothing => Some((Batch::default(), None)),
                    Read::Sent(b, plan) => Some((*b, plan)),
                };
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
                    let (missing, slot) = source::slot_view(&c, row);
                    protocol::slot_failure(missing, &slot)
                });
                explained.unwrap_or_else(|| {
                    let what = if writes { " or write its events" } else { "" };
                    Failure::new(SinkState::Error, format!("cannot read replication slot {}{what}: {e}", row.slot))
                })
            }
        };
        // A read that stopped at a change the catalog copy did not show yet keeps its
        // destination: `Driver::fail` gives up its unit then.
        if !self.sinks.get(id).is_some_and(|r| r.driver.keeps_producer(&failure)) {
            self.abort(id);
        }
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

    /// The next snapshot is a keyless table's (see `keyless::step`). Returns false when the sink
    /// failed.
    fn keyless_step(&mut self, id: &str, snapshot_id: i64, table_oid: u32, chunk_size: u32) -> bool {
        let (Some(schema), Some(run)) = (self.schema.as_deref(), self.sinks.get_mut(id)) else { return false };
        match keyless::step(schema, run, &mut self.types, snapshot_id, table_oid, chunk_size) {
            Ok(()) => true,
            Err(message) => {
                self.fail(id, SinkState::Retrying, message);
                false
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
    /// (see `Driver::heartbeat_due`). Not while the sink reads the shared decoding's log: the
    /// decoder writes one for all of them (each sink's own made a checkpoint for every sink that
    /// read it, the square of the sinks).
    fn maybe_heartbeat(&mut self, id: &str, confirmed: Lsn, cat: &Catalog) {
        let Some(run) = self.sinks.get_mut(id) else { return };
        if decoding::reads_log() {
            return;
        }
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
}
