//! The background workers: a launcher, and one sink worker per sink that reads its slot, builds
//! events, publishes, then confirms.
//!
//! ```text
//!  launcher (static worker, launcher.rs):
//!    catalog ── start a sink worker for each sink no live process serves; chores for all sinks
//!  sink worker (dynamic worker, one per sink; state.rs; the decisions are cdc_core::driver's and
//!  cdc_core::deliver's, env.rs is the driver's port):
//!    loop:
//!      catalog (one transaction, read-only) ── its sink, captured tables, slots
//!      protocol::slot_failure / check_checkpoint ── may it read?
//!      one transaction: its decoding session (decoding.rs, kept open across reads: the slot is
//!        held and each WAL record decoded once; the ChangeSource) ─▶ deliver::read: Assembler
//!        ─▶ events ─▶ sink.send (large transactions in pieces)
//!      protocol::plan_flush ─▶ sink.flush (no transaction open; Kafka commit with the checkpoint)
//!      _cdc_offsets + confirm the slot in the session (one short writing transaction; while
//!        deliveries keep coming at most every 200 ms, for all of them: cdc_core::driver::CONFIRM_INTERVAL)
//!      when nothing happened, sleep cdc.naptime_ms or until WAL is flushed; exit once the sink is dropped
//! ```
//! Ack before advance: the slot moves only after the sink acknowledged, so a crash anywhere
//! re-sends (at-least-once). Every SPI step runs in [`run_tx`], which turns a PostgreSQL ERROR
//! (a dropped slot, a dropped publication) into an `Err` for that sink instead of killing the worker.
//!
//! Threads: everything here runs on each worker's main thread. librdkafka's own threads never call
//! back into PostgreSQL: delivery reports are served by `poll` on this thread.
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod chores;
mod cleanup;
mod configs;
mod decoder;
pub(crate) mod decoding;
mod env;
pub mod group;
mod keyless;
pub mod launcher;
mod open;
mod run;
pub(crate) mod snapshot;
pub(crate) mod source;
mod state;
mod table_sink;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use cdc_core::driver::latch_wait;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;

use crate::gucs;
use launcher::Role;
use state::Worker;

/// Registers the launcher, the static worker (from `_PG_init` while preloading).
pub fn register() {
    BackgroundWorkerBuilder::new(launcher::LAUNCHER)
        .set_type(launcher::LAUNCHER)
        .set_function("pg_cdc_launcher_main")
        .set_library("pg_cdc")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        // Restarted one second after it exits with 1 (crash, pg_terminate_backend).
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

/// The launcher's entry point.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_cdc_launcher_main(_arg: pg_sys::Datum) {
    run(Role::Launcher)
}

/// The shared decoding's decoder's entry point (see [`decoder`]).
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_cdc_decoder_main(_arg: pg_sys::Datum) {
    decoder::main()
}

/// A sink worker's entry point; its sink id is the worker's extra data.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_cdc_sink_worker_main(_arg: pg_sys::Datum) {
    run(Role::Sink(BackgroundWorker::get_extra().to_string()))
}

fn run(role: Role) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let database = gucs::string(&gucs::DATABASE);
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    let what = match &role {
        Role::Launcher => role.name().to_string(),
        Role::Sink(id) => {
            if !launcher::claim(id) {
                // Another process serves this sink (one started by an earlier launcher).
                // SAFETY: ends this dynamic background worker; it is never restarted.
                unsafe { pg_sys::proc_exit(0) };
            }
            format!("{} for sink {id}", role.name())
        }
    };
    pgrx::log!("{what} started in database \"{database}\"");

    let sink_worker = matches!(role, Role::Sink(_));
    if let Err(e) = run_tx(|| source::set_session_settings(role.name())) {
        pgrx::warning!("{what}: cannot set its session settings: {e}");
    }
    let mut worker = Worker::new(role);
    let mut poll = WAL_POLL;
    while !stop_requested() && !worker.finished() {
        if BackgroundWorker::sighup_received() {
            // SAFETY: the documented way for a background worker to reload postgresql.conf.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            worker.reloaded();
        }
        let flushed = progress();
        if worker.tick() {
            poll = WAL_POLL;
            continue;
        }
        // A destination being opened: look again after `poll` (its thread's end wakes nobody).
        if worker.finished() || !nap(flushed, poll, !worker.opening()) {
            break;
        }
        // Nothing to read although WAL may have moved (tables no sink captures, or nothing at
        // all): look for new WAL less and less often, up to the naptime, until a pass reads again.
        poll = (poll * 2).min(naptime());
    }
    worker.confirm_delivered();
    worker.wait_for_openings(OPENING_GRACE);
    worker.release();
    // proc_exit skips Rust destructors: close the producers first.
    drop(worker);
    pgrx::log!("{what} stopping");
    // SAFETY: ends this background worker process. The launcher exits 1 so the postmaster restarts
    // it; a sink worker is never restarted by the postmaster (the launcher starts a new one while
    // its sink exists).
    unsafe { pg_sys::proc_exit(i32::from(!sink_worker)) };
}

/// How long an exiting worker waits for the threads still opening its sinks.
const OPENING_GRACE: Duration = Duration::from_secs(5);

/// How often a napping worker looks whether WAL was flushed since its last pass, right after a
/// pass that read something (doubling after each pass that did not, up to the naptime).
const WAL_POLL: Duration = Duration::from_millis(5);

/// How long a sink reading the shared decoding's log sleeps when nothing wakes it: it reads then
/// to move its position along (its slot, and with it the group's), and to look at its catalog.
/// Its changes and catalog changes wake it at once. Measured: five reads a second of a member
/// whose tables were quiet cost it 6-7 ms of CPU a second (at 2,000 transactions a second of
/// other tables).
const MEMBER_NAP: Duration = Duration::from_secs(1);

fn naptime() -> Duration {
    Duration::from_millis(gucs::NAPTIME_MS.get().max(10) as u64)
}

/// What a sink worker's nap waits to move: the WAL's flush position, or, while its sink reads the
/// shared decoding's log, the count of the decoder's wake-ups of it (of its publishes with
/// `cdc.test_members_poll_publishes`).
fn progress() -> u64 {
    if !decoding::reads_log() {
        wal_flushed()
    } else if gucs::TEST_MEMBERS_POLL_PUBLISHES.get() {
        group::publishes()
    } else {
        group::my_wakes()
    }
}

/// Sleeps `cdc.naptime_ms`, or less: wakes once WAL past `flushed` (the flush position when the
/// last pass started) is flushed, looking every `poll`, so while changes keep coming a commit made
/// while the worker naps waits for it a few milliseconds, not up to the whole naptime. A sink worker
/// reading the shared decoding's log does not look: the decoder wakes it (its latch) when a publish
/// holds something for its tables ([`progress`] moves) or pg_cdc's catalog changed, so it sleeps
/// through the changes of other sinks' tables, for [`MEMBER_NAP`] (or the naptime when longer).
/// With `woken` false (something ends that wakes nobody) it sleeps `poll` at most. Returns false
/// when the worker must stop.
fn nap(flushed: u64, poll: Duration, woken: bool) -> bool {
    let member = decoding::reads_log() && !gucs::TEST_MEMBERS_POLL_PUBLISHES.get();
    let nap = if !woken {
        poll.min(naptime())
    } else if member {
        naptime().max(MEMBER_NAP)
    } else {
        naptime()
    };
    // A wake-up during the pass may have been taken by a wait inside it (a lock's): look first.
    if member && progress() != flushed {
        return true;
    }
    let poll = if member { nap } else { poll };
    let start = Instant::now();
    loop {
        let left = nap.saturating_sub(start.elapsed());
        if left.is_zero() {
            return true;
        }
        if !BackgroundWorker::wait_latch(Some(latch_wait(left, poll))) {
            return false;
        }
        if progress() != flushed {
            return true;
        }
    }
}

/// Where WAL is flushed up to.
fn wal_flushed() -> u64 {
    // SAFETY: reads the shared flush position under its own spinlock; no transaction needed.
    unsafe { pg_sys::GetFlushRecPtr(std::ptr::null_mut()) }
}

/// Where WAL is inserted up to.
fn wal_inserted() -> u64 {
    // SAFETY: reads the shared insert position under its own spinlock; no transaction needed.
    unsafe { pg_sys::GetXLogInsertRecPtr() }
}

/// Whether the worker was asked to stop (SIGTERM: pg_terminate_backend or shutdown). Reads
/// PostgreSQL's sticky flag: pgrx's `sigterm_received()` clears itself when read, so a check deep
/// in a publish loop would hide the request from the main loop.
pub fn stop_requested() -> bool {
    // SAFETY: a sig_atomic_t the SIGTERM handler sets; reading it is what PostgreSQL's own loops do.
    unsafe { std::ptr::read_volatile(&raw const pg_sys::ShutdownRequestPending) != 0 }
}

fn caught_message(e: CaughtError) -> String {
    caught(e).message
}

/// The ERROR a worker's transaction ended with: its SQLSTATE and message.
#[derive(Debug)]
pub struct TxError {
    /// Its SQLSTATE (`ERRCODE_INTERNAL_ERROR` for a Rust panic).
    pub code: pgrx::PgSqlErrorCode,
    /// Its message.
    pub message: String,
}

fn caught(e: CaughtError) -> TxError {
    let report = match e {
        CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => r,
        CaughtError::RustPanic { ereport, .. } => ereport,
    };
    TxError { code: report.sql_error_code(), message: report.message().to_string() }
}

/// Runs `f` in its own transaction. An ERROR raised inside aborts the transaction and comes back
/// as `Err(message)`; the worker keeps running.
pub fn run_tx<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    in_tx(true, f).map_err(|e| e.message)
}

/// [`run_tx`] that keeps the error's SQLSTATE, for a caller that tells errors apart by it.
pub fn run_tx_coded<R>(f: impl FnOnce() -> R) -> Result<R, TxError> {
    in_tx(true, f)
}

/// [`run_tx`] for a read: the catalog caches are left as the last decoding left them, for the
/// decoding this transaction runs (see `catalog::present_catalog`; whatever else `f` does with the
/// catalogs goes through it).
pub fn run_read_tx<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    in_tx(false, f).map_err(|e| e.message)
}

fn in_tx<R>(present: bool, f: impl FnOnce() -> R) -> Result<R, TxError> {
    // SAFETY: the standard transaction bracket of a background worker; no transaction is open here.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    if present {
        crate::catalog::present_catalog();
    }
    let result = PgTryBuilder::new(AssertUnwindSafe(move || Ok(f()))).catch_others(|e| Err(caught(e))).execute();
    end_tx(result.is_ok());
    result
}

/// Closes the transaction a worker's bracket opened (with its active snapshot pushed): commits
/// it, or aborts it after an error. A transaction that wrote commits with present-time catalog
/// caches: its commit may run deferred triggers of an in-database sink's table.
fn end_tx(commit: bool) {
    // SAFETY: called once per transaction the caller started, on the main thread.
    unsafe {
        if commit {
            if pg_sys::GetTopTransactionIdIfAny() != pg_sys::InvalidTransactionId {
                crate::catalog::present_catalog();
            }
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        } else {
            pg_sys::AbortCurrentTransaction();
        }
    }
}

/// Per-slot bookkeeping for orphan detection: first time (database clock) a slot was seen without a sink.
pub type OrphanSightings = HashMap<String, String>;
