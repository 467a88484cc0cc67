//! One process per sink. The launcher (the static background worker) starts a sink worker (a
//! dynamic background worker) for each sink in the catalog and does the chores that concern all
//! sinks; each sink worker reads, delivers and confirms its own sink only, so a destination that
//! is slow or down holds back no other sink.
//!
//! ```text
//!  launcher ── each pass: catalog ─▶ for each sink without a live worker: start one (extra = sink id)
//!           └─ chores: free dropped sinks' counters, retained-WAL warnings, running-xacts records,
//!                      drop orphaned slots
//!  sink worker ── claims its sink in shared memory (a second one for the same sink exits at once)
//!              └─ the delivery loop for that sink (state.rs); exits when the sink is dropped
//! ```
//! Sink workers are never restarted by the postmaster (`BGW_NEVER_RESTART`): the launcher starts
//! a new one when the claim's process is gone, so a restarted launcher (or a crash restart) never
//! leaves two processes on one sink.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorkerBuilder, BackgroundWorkerStatus, BgWorkerStartTime, DynamicBackgroundWorker};
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};

use crate::stats::{sink_key, MAX_SINKS};

#[derive(Clone, Copy, Default)]
struct Claim {
    /// The sink id (uuid bytes); all zero when free.
    id: [u8; 16],
    /// The sink worker serving it.
    pid: i32,
}

#[derive(Clone, Copy)]
struct Claims {
    entries: [Claim; MAX_SINKS],
    /// Bumped when a transaction that changed pg_cdc's catalog commits ([`catalog_changed`]).
    generation: u64,
}

// SAFETY: plain old data (integers and byte arrays), no pointers.
unsafe impl PGRXSharedMemory for Claims {}

static CLAIMS: PgLwLock<Claims> = unsafe { PgLwLock::new(c"pg_cdc sink workers") };

/// Reserves the shared memory (from `_PG_init` while preloading).
// pg_shmem_init! tests pgrx's own PostgreSQL-version features.
#[allow(unexpected_cfgs)]
pub fn init() {
    pg_shmem_init!(CLAIMS = Claims { entries: [Claim::default(); MAX_SINKS], generation: 0 });
}

/// Marks pg_cdc's catalog (sinks, captured tables) as changed once the current transaction
/// commits: sink workers read it again at their next pass instead of using the copy they keep
/// (they also read it again every [`CATALOG_REFRESH`] whatever happens, which covers changes made
/// by other paths: the event trigger of a dropped table, DROP EXTENSION).
pub fn catalog_changed() {
    if !crate::preloaded() {
        return;
    }
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, || {
        CLAIMS.exclusive().generation += 1;
        // Sinks reading the shared decoding's log sleep until woken.
        super::group::wake_every_member();
    });
}

/// The catalog's generation: changes whenever a transaction that changed it commits.
pub fn catalog_generation() -> u64 {
    if !crate::preloaded() {
        return 0;
    }
    CLAIMS.share().generation
}

/// The longest a sink worker uses its copy of the catalog without reading it again.
pub const CATALOG_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `pid` is a live pg_cdc sink worker. A claim left by a process that died without
/// releasing it (kill -9, a failpoint) names a pid the kernel may give to any other process later:
/// the process title (`postgres: pg_cdc worker ...`) tells them apart.
fn alive(pid: i32) -> bool {
    alive_as(pid, SINK_WORKER)
}

/// Whether `pid` is a live process whose title contains `title` (a pg_cdc process of that kind).
pub fn alive_as(pid: i32, title: &str) -> bool {
    // SAFETY: signal 0 only checks that the process exists (the postmaster's children run as the
    // same user, so permission is never the reason it fails).
    if pid <= 0 || unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|t| t.windows(title.len()).any(|w| w == title.as_bytes()))
        .unwrap_or(true)
}

/// The sink workers' `backend_type` and `application_name` (before the sink's name is known).
pub const SINK_WORKER: &str = "pg_cdc worker";
/// The launcher's.
pub const LAUNCHER: &str = "pg_cdc launcher";

/// Claims `sink_id` for this process: false when a live process already serves it (or the table
/// is full).
pub fn claim(sink_id: &str) -> bool {
    let Some(key) = sink_key(sink_id) else { return false };
    // SAFETY: reads this process's pid, set at process start.
    let me = unsafe { pg_sys::MyProcPid };
    let mut claims = CLAIMS.exclusive();
    if let Some(c) = claims.entries.iter_mut().find(|c| c.id == key) {
        if c.pid != me && alive(c.pid) {
            return false;
        }
        c.pid = me;
        return true;
    }
    match claims.entries.iter_mut().find(|c| c.id == [0; 16] || !alive(c.pid)) {
        Some(c) => {
            *c = Claim { id: key, pid: me };
            true
        }
        None => false,
    }
}

/// Gives up this process's claim on `sink_id`.
pub fn release(sink_id: &str) {
    let Some(key) = sink_key(sink_id) else { return };
    // SAFETY: as in `claim`.
    let me = unsafe { pg_sys::MyProcPid };
    let mut claims = CLAIMS.exclusive();
    for c in claims.entries.iter_mut().filter(|c| c.id == key && c.pid == me) {
        *c = Claim::default();
    }
}

/// The live process serving `sink_id`, if any.
pub fn serving(sink_id: &str) -> Option<i32> {
    let key = sink_key(sink_id)?;
    let claims = CLAIMS.share();
    claims.entries.iter().find(|c| c.id == key).map(|c| c.pid).filter(|&pid| alive(pid))
}

/// The least time between two starts of a sink's worker (what the postmaster's restart delay was
/// for the single worker): a sink worker that exits at once is not restarted in a tight loop.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// The launcher's memory of the sink workers it started.
#[derive(Default)]
pub struct Starter {
    /// The worker last started for each sink, and when.
    started: HashMap<String, (DynamicBackgroundWorker, Instant)>,
    /// When starting one last failed for want of a worker slot (logged once a minute).
    no_slot_logged: Option<Instant>,
}

impl Starter {
    /// Starts a sink worker for each of `sinks` (id, name) that no live process serves and whose
    /// last worker is gone; a sink no worker slot is free for waits (logged once a minute).
    pub fn ensure(&mut self, sinks: &[(String, String)]) {
        self.started.retain(|id, _| sinks.iter().any(|(s, _)| s == id));
        for (id, name) in sinks {
            if serving(id).is_some() {
                continue;
            }
            if let Some((worker, at)) = self.started.get(id) {
                // Still starting (not claimed yet), or gone too recently.
                let gone = matches!(worker.pid(), Err(BackgroundWorkerStatus::Stopped));
                if !gone || at.elapsed() < RESTART_DELAY {
                    continue;
                }
            }
            let started = BackgroundWorkerBuilder::new(&format!("{SINK_WORKER} for sink {name}"))
                .set_type(SINK_WORKER)
                .set_function("pg_cdc_sink_worker_main")
                .set_library("pg_cdc")
                .enable_spi_access()
                .set_start_time(BgWorkerStartTime::RecoveryFinished)
                // Never restarted by the postmaster: the launcher decides.
                .set_restart_time(None)
                .set_extra(id)
                .load_dynamic();
            match started {
                Ok(worker) => {
                    self.started.insert(id.clone(), (worker, Instant::now()));
                }
                Err(_) => {
                    if self.no_slot_logged.is_none_or(|t| t.elapsed().as_secs() >= 60) {
                        self.no_slot_logged = Some(Instant::now());
                        pgrx::warning!(
                            "pg_cdc launcher: no background worker slot free for sink \"{name}\"; each sink needs one \
                             (max_worker_processes, currently {})",
                            // SAFETY: a GUC variable, read on the launcher's own thread.
                            unsafe { pg_sys::max_worker_processes }
                        );
                    }
                }
            }
        }
    }

    /// Whether a worker it started is gone, no other process serves its sink, and the restart
    /// delay passed: the next pass would start it again. Reads no catalog.
    pub fn restart_due(&self) -> bool {
        self.started.iter().any(|(id, (worker, at))| {
            at.elapsed() >= RESTART_DELAY
                && matches!(worker.pid(), Err(BackgroundWorkerStatus::Stopped))
                && serving(id).is_none()
        })
    }
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
            Role::Launcher => LAUNCHER,
            Role::Sink(_) => SINK_WORKER,
        }
    }
}
