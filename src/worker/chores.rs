//! The launcher's chores, which concern every sink: a worker for each sink that has none, the
//! shared-memory entries of dropped sinks and tables freed, retained-WAL warnings, the
//! running-transactions records that let slots move, orphaned slots dropped, and what dropped
//! sinks left at their destination deleted ([`super::cleanup`]).
use std::collections::HashMap;
use std::time::Instant;

use cdc_core::driver::cadence::{Cadence, Wake};
use cdc_core::driver::RESTART_POINT_BYTES;
use cdc_core::failpoint::Armed;
use cdc_core::Lsn;

use pgrx::bgworkers::{BackgroundWorkerBuilder, BgWorkerStartTime};

use super::group;
use super::launcher::{Starter, LAUNCHER};
use super::source::{self, Catalog};
use super::{run_tx, wal_inserted, OrphanSightings};
use crate::gucs;

/// What the launcher keeps between its passes.
#[derive(Default)]
pub struct Chores {
    /// Its sink workers.
    starter: Starter,
    /// Slots seen without a sink, and when first.
    orphans: OrphanSightings,
    /// When each slot's retained-WAL warning was last logged.
    wal_warned: HashMap<String, Instant>,
    /// Where it last wrote a running-transactions record ([`Chores::mark_restart_point`]).
    restart_mark: Option<Lsn>,
    /// The deletion of what dropped sinks left at their destination.
    cleanups: super::cleanup::Cleanups,
    /// When it last logged that the extension is not installed.
    last_missing_extension_log: Option<Instant>,
    /// When it last started the shared decoding's decoder, and last logged that it could not.
    decoder_started: Option<Instant>,
    decoder_warned: Option<Instant>,
    /// When it last read the catalog ([`Chores::due`]).
    cadence: Cadence,
    /// The settings were reloaded since.
    reloaded: bool,
    /// The last catalog it read had sinks (running-transactions records are written for them).
    had_sinks: bool,
}

impl Chores {
    /// Whether a wake-up of the launcher reads the catalog and does the chores (see
    /// `cdc_core::driver::cadence`); when it does, the pass is noted. `generation`: the catalog's,
    /// read before the catalog.
    pub fn due(&mut self, generation: u64) -> bool {
        let wake = Wake {
            now: Instant::now(),
            generation,
            restart_due: self.starter.restart_due(),
            reloaded: self.reloaded,
            restart_point_due: self.had_sinks && self.restart_point_due(Lsn(wal_inserted())),
        };
        if !self.cadence.due(&wake) {
            return false;
        }
        self.cadence.passed(wake.now, generation);
        self.reloaded = false;
        true
    }

    /// The settings were reloaded (SIGHUP): the next wake-up reads the catalog.
    pub fn reloaded(&mut self) {
        self.reloaded = true;
    }

    /// One pass over the catalog of an installed extension (`schema`; `generation`: the catalog's
    /// generation when it was read).
    pub fn tick(&mut self, cat: &Catalog, schema: Option<&str>, failpoint: &Armed, generation: u64) {
        // Counters and latencies of dropped sinks and tables free their shared-memory entries.
        crate::stats::retain(&cat.sinks.iter().map(|s| s.id.as_str()).collect::<Vec<_>>());
        crate::stats::retain_tables(&cat.tables.iter().map(|t| t.oid).collect::<Vec<_>>());
        // A finished (initial_only) sink has no worker, nor has a paused one.
        let sinks: Vec<(String, String)> =
            cat.sinks.iter().filter(|s| s.has_worker()).map(|s| (s.id.clone(), s.name.clone())).collect();
        self.had_sinks = !cat.sinks.is_empty();
        self.starter.ensure(&sinks);
        self.ensure_decoder(sinks.len());
        self.warn_retained_wal(cat);
        if let Some(schema) = schema {
            resume_paused_past_bound(cat, schema);
        }
        self.mark_restart_point(cat);
        self.drop_orphan_slots(cat, schema);
        if let Some(schema) = schema {
            self.cleanups.tick(schema, failpoint, generation);
        }
    }

    /// A pass while the extension is not installed in the database: says so every 5 minutes, and
    /// drops the slots pg_cdc left.
    pub fn not_installed(&mut self, cat: &Catalog) {
        if self.last_missing_extension_log.is_none_or(|t| t.elapsed().as_secs() > 300) {
            pgrx::log!("{LAUNCHER}: extension pg_cdc is not installed in this database; waiting");
            self.last_missing_extension_log = Some(Instant::now());
        }
        self.drop_orphan_slots(cat, None);
    }

    /// Starts the shared decoding's decoder while `cdc.shared_decoding` wants one for the `sinks`
    /// sinks that have workers and none runs (at most once a second; a second one exits at once).
    fn ensure_decoder(&mut self, sinks: usize) {
        if !gucs::shared_decoding_wanted(sinks) || group::decoder_running() {
            return;
        }
        if self.decoder_started.is_some_and(|t| t.elapsed().as_secs() < 1) {
            return;
        }
        self.decoder_started = Some(Instant::now());
        let started = BackgroundWorkerBuilder::new(group::DECODER)
            .set_type(group::DECODER)
            .set_function("pg_cdc_decoder_main")
            .set_library("pg_cdc")
            .enable_spi_access()
            .set_start_time(BgWorkerStartTime::RecoveryFinished)
            .set_restart_time(None)
            .load_dynamic();
        if started.is_err() && self.decoder_warned.is_none_or(|t| t.elapsed().as_secs() >= 60) {
            self.decoder_warned = Some(Instant::now());
            pgrx::warning!(
                "{LAUNCHER}: no background worker slot free for the shared decoding's decoder (max_worker_processes, \
                 currently {}); sinks decode their own slots meanwhile",
                // SAFETY: a GUC variable, read on the launcher's own thread.
                unsafe { pgrx::pg_sys::max_worker_processes }
            );
        }
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
        if !self.restart_point_due(insert) {
            return;
        }
        match run_tx(source::log_running_xacts) {
            Ok(Some(lsn)) => self.restart_mark = Some(lsn),
            Ok(None) => self.restart_mark = Some(insert),
            Err(e) => {
                // Not fatal: the slots still move at the background writer's records.
                pgrx::warning!("{}: cannot write a running-transactions record: {e}", LAUNCHER);
                self.restart_mark = Some(insert);
            }
        }
    }

    /// Whether the WAL inserted up to `insert` is far enough past the last running-transactions
    /// record for the next one.
    fn restart_point_due(&self, insert: Lsn) -> bool {
        self.restart_mark.is_none_or(|m| insert.0 >= m.0.saturating_add(RESTART_POINT_BYTES))
    }

    /// Drops pg_cdc slots whose sink is gone, once no transaction that could still commit the
    /// sink row is open.
    fn drop_orphan_slots(&mut self, cat: &Catalog, schema: Option<&str>) {
        let mut still = OrphanSightings::new();
        // The shared decoding's slot while it is wanted (else an orphan like any other).
        let group_wanted = gucs::shared_decoding_wanted(cat.sinks.iter().filter(|s| s.has_worker()).count());
        for slot in &cat.slots {
            if slot.name == group::GROUP_SLOT && group_wanted {
                continue;
            }
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
                    let schema = schema.filter(|_| cat.installed);
                    let dropped = slot.active_pid.is_none()
                        && run_tx(|| {
                            // The catalog was read before this transaction: a sink committed since
                            // (its slot made inside its transaction) is looked for again here.
                            if source::older_transaction_open(&seen)
                                || schema.is_some_and(|s| source::slot_has_sink(s, &name))
                            {
                                false
                            } else {
                                source::drop_slot(&name);
                                true
                            }
                        })
                        .unwrap_or(false);
                    if dropped && name == group::GROUP_SLOT {
                        pgrx::log!(
                            "{}: dropped replication slot {name}: the decoding is not shared now (cdc.shared_decoding)",
                            LAUNCHER
                        );
                    } else if dropped {
                        pgrx::log!("{}: dropped replication slot {name} of a dropped sink", LAUNCHER);
                    } else {
                        still.insert(slot.name.clone(), first_seen.clone());
                    }
                }
            }
        }
        self.orphans = still;
    }
}

/// Resumes each paused sink whose slot holds more WAL than `cdc.paused_max_wal_size` (a WARNING
/// each); its worker starts at the next pass.
fn resume_paused_past_bound(cat: &Catalog, schema: &str) {
    let limit = gucs::PAUSED_MAX_WAL_SIZE.get();
    if limit < 0 || !cat.sinks.iter().any(|s| s.paused()) {
        return;
    }
    let limit = i64::from(limit) << 20;
    match run_tx(|| {
        let resumed = crate::api::pause::resume_past(schema, limit);
        if !resumed.is_empty() {
            super::launcher::catalog_changed();
        }
        resumed
    }) {
        Ok(resumed) => {
            for (name, bytes) in resumed {
                pgrx::warning!(
                    "pg_cdc sink \"{name}\": resumed by itself: its slot held {} MB of WAL while paused, over \
                     cdc.paused_max_wal_size ({} MB)",
                    bytes >> 20,
                    limit >> 20
                );
            }
        }
        Err(e) => pgrx::warning!("{LAUNCHER}: cannot resume the paused sinks past cdc.paused_max_wal_size: {e}"),
    }
}
