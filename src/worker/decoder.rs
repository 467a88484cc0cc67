//! The shared decoding's decoder: one process that decodes the WAL once, through the group's
//! slot, into the group's log, for every sink that reads it (see [`super::group`]).
//!
//! ```text
//!  loop: decode flushed WAL (every published table) ─▶ LogWriter ─▶ publish (shared memory;
//!        the members whose tables changed are woken)
//!        every CONFIRM_EVERY: the slowest member's own slot (members more than
//!        cdc.shared_decoding_max_lag behind left out) ─▶ confirm _cdc_group there, trim the log
//!        the members' heartbeat: when the slot is behind the WAL at all for
//!        cdc.heartbeat_interval_ms, or far behind (fanout::members_heartbeat_due; sinks reading
//!        the log write none of their own)
//! ```
//! Started by the launcher while `cdc.shared_decoding` is on and sinks exist; exits when it is
//! turned off, or no sink is left (or the extension was dropped). A failure drops the session; the next one writes a new log (a new epoch) from the
//! slot's confirmed position, and every member opens it again from its own position (or, when
//! it cannot serve that, decodes its own slot).
use std::time::{Duration, Instant};

use cdc_core::fanout::members_heartbeat_due;
use cdc_core::Lsn;
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;
use serde_json::Value;

use super::decoding::{held_slot_confirmed, release_slot, Kind, Session};
use super::group::{self, DECODER, GROUP_SLOT};
use super::{nap, naptime, run_read_tx, run_tx, run_tx_coded, source, stop_requested, wal_flushed, WAL_POLL};
use crate::{catalog, gucs};

/// WAL decoded before the log is published (and the loop looks at confirms and stop requests).
const DECODE_BYTES: u64 = 4 << 20;

/// How often the group's slot is confirmed and its log trimmed.
const CONFIRM_EVERY: Duration = Duration::from_millis(200);

/// How often the decoder looks whether any sink is left.
const WANTED_EVERY: Duration = Duration::from_secs(5);

/// The least time between two heartbeats of the decoder.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// The decoder's state between passes.
#[derive(Default)]
struct Decoder {
    session: Option<Session>,
    epoch: u64,
    confirmed_at: Option<Instant>,
    heartbeat_at: Option<Instant>,
    /// After a failure: not before then, and how many in a row.
    retry_at: Option<Instant>,
    failures: u32,
}

/// The decoder's entry point.
pub fn main() {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let database = gucs::string(&gucs::DATABASE);
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    if !group::claim_decoder() {
        // SAFETY: ends this dynamic background worker; another decoder runs.
        unsafe { pg_sys::proc_exit(0) };
    }
    pgrx::log!("{DECODER} started in database \"{database}\"");
    if let Err(e) = run_tx(|| source::set_session_settings(DECODER)) {
        pgrx::warning!("{DECODER}: cannot set its session settings: {e}");
    }
    let mut decoder = Decoder::default();
    let mut poll = WAL_POLL;
    let mut looked = Instant::now();
    while !stop_requested() {
        if BackgroundWorker::sighup_received() {
            // SAFETY: the documented way for a background worker to reload postgresql.conf.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        if !gucs::shared_decoding_allowed() {
            break;
        }
        // No sink left (with `auto`, fewer than it shares from), or the extension dropped: nothing
        // to decode for (the launcher starts a decoder again when it is wanted).
        if looked.elapsed() >= WANTED_EVERY {
            looked = Instant::now();
            if !run_tx(|| gucs::shared_decoding_wanted(sinks_with_workers())).unwrap_or(true) {
                break;
            }
        }
        let flushed = wal_flushed();
        if decoder.tick() {
            poll = WAL_POLL;
            continue;
        }
        if !nap(flushed, poll, true) {
            break;
        }
        poll = (poll * 2).min(naptime());
    }
    decoder.confirm();
    decoder.session = None;
    group::release_decoder();
    pgrx::log!("{DECODER} stopping");
    // SAFETY: ends this background worker; the launcher starts a new one while shared decoding is on.
    unsafe { pg_sys::proc_exit(0) };
}

impl Decoder {
    /// One pass: the session opened when there is none, flushed WAL decoded into the log and
    /// published, the slot confirmed when due. Returns true when it decoded WAL.
    fn tick(&mut self) -> bool {
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        if self.session.is_none() && !self.open() {
            return false;
        }
        let Some(session) = self.session.as_mut() else { return false };
        let epoch = self.epoch;
        let decoded = run_read_tx(|| {
            let any = session.decode_log(DECODE_BYTES);
            let Some(log) = session.log() else { pgrx::error!("pg_cdc: the decoder's session writes no log") };
            match log.publish() {
                Ok(end) => (any, end, log.complete_to(), log.take_touched()),
                Err(e) => pgrx::error!("pg_cdc: cannot write the shared decoding's log: {e}"),
            }
        });
        let any = match decoded {
            Ok((any, end, complete_to, touched)) => {
                group::publish(epoch, end, complete_to, &touched);
                self.failures = 0;
                any
            }
            Err(e) => {
                self.fail(&format!("cannot decode the WAL: {e}"));
                return false;
            }
        };
        if self.confirmed_at.is_none_or(|t| t.elapsed() >= CONFIRM_EVERY) {
            self.confirm();
        }
        any
    }

    /// Opens the session on the group's slot (made when missing) with a new log.
    fn open(&mut self) -> bool {
        let opened = run_tx_coded(|| {
            ensure_group_slot();
            remove_old_logs();
            let epoch = group::new_epoch();
            (epoch, Session::open(GROUP_SLOT, Kind::Group(group::log_dir(epoch))))
        });
        match opened {
            Ok((epoch, session)) => {
                self.epoch = epoch;
                self.session = Some(session);
                true
            }
            Err(e) => {
                release_slot();
                // PostgreSQL's hint is not in the message: say which setting, and what goes on
                // meanwhile. Every slot in use is the one configuration limit a slot's creation
                // reaches (ReplicationSlotCreate; max_wal_senders is not involved here).
                let hint = if e.code == PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED {
                    // SAFETY: reads a setting fixed at server start.
                    let slots = unsafe { pg_sys::max_replication_slots };
                    format!(
                        " (max_replication_slots, currently {slots}: the shared decoding needs one slot more than \
                         the sinks; meanwhile every sink decodes its own slot)"
                    )
                } else {
                    String::new()
                };
                self.fail(&format!("cannot start decoding replication slot {GROUP_SLOT}: {}{hint}", e.message));
                false
            }
        }
    }

    fn fail(&mut self, message: &str) {
        pgrx::warning!("{DECODER}: {message}");
        group::close_log();
        self.session = None;
        release_slot();
        self.failures += 1;
        let backoff = Duration::from_secs(1 << self.failures.min(5));
        self.retry_at = Some(Instant::now() + backoff.min(Duration::from_secs(30)));
    }

    /// Confirms the group's slot up to the slowest member's own slot (its log up to what every
    /// member's position covers), never past what the log holds nor backwards; trims the log to
    /// there. With no member, up to where the log is complete. Writes a heartbeat when the slot
    /// stays behind the WAL.
    fn confirm(&mut self) {
        let Some(session) = self.session.as_mut() else { return };
        self.confirmed_at = Some(Instant::now());
        let members = group::member_slots();
        let max_lag = member_lag_bound();
        let heartbeat_due = self.heartbeat_at.is_none_or(|t| t.elapsed() >= HEARTBEAT_EVERY);
        let quiet_for = self.heartbeat_at.map_or(Duration::MAX, |t| t.elapsed());
        let heartbeat_interval = super::env::settings().heartbeat_interval;
        let result = run_tx(|| {
            let Some(log) = session.log() else { return Ok(false) };
            let complete = log.complete_to();
            let slowest = if members.is_empty() { None } else { slowest_member(&members, max_lag) };
            let target = slowest.unwrap_or(complete).min(complete);
            let current = held_slot_confirmed().unwrap_or_default();
            if target > current {
                session.confirm(target);
            }
            if let Some(log) = session.log() {
                log.trim(target).map_err(|e| format!("cannot trim the shared decoding's log: {e}"))?;
            }
            // The members' heartbeat: their quiet tables' WAL is passed, their slots and this one
            // move (a sink reading the log writes none of its own).
            let behind = wal_flushed().saturating_sub(held_slot_confirmed().unwrap_or_default().0);
            let due = members_heartbeat_due(behind, quiet_for, heartbeat_interval, max_lag.max(0) as u64);
            Ok(heartbeat_due && due && source::emit_heartbeat().is_some())
        });
        match result {
            Ok(Ok(true)) => self.heartbeat_at = Some(Instant::now()),
            Ok(Ok(false)) => {}
            Ok(Err(e)) | Err(e) => pgrx::warning!("{DECODER}: {e}"),
        }
    }
}

/// The sinks that have a worker (every one but the finished `initial_only` sinks and the paused); 0 when the
/// extension is not installed.
fn sinks_with_workers() -> usize {
    let Some(schema) = catalog::extension_schema() else { return 0 };
    let idle: Vec<String> = cdc_core::state::SinkState::ALL
        .into_iter()
        .filter(|s| !s.has_worker())
        .map(|s| s.label().to_string())
        .collect();
    catalog::json(
        &format!("SELECT to_jsonb(count(*)) FROM {schema}._cdc_sinks WHERE state <> ALL ($1::text[])"),
        &[idle.into()],
    )
    .and_then(|v| v.as_u64())
    .map_or(0, |n| n as usize)
}

/// How far behind the WAL a member's slot may be and still hold the group's slot and log:
/// `cdc.shared_decoding_max_lag`, or half of `max_slot_wal_keep_size` when that is set and less,
/// so that a stuck member never gets the group's slot invalidated.
fn member_lag_bound() -> i64 {
    let max_lag = i64::from(gucs::SHARED_DECODING_MAX_LAG.get()) << 20;
    // SAFETY: reads a setting of this process (an int, changed only at its own reloads).
    let keep_mb = unsafe { pg_sys::max_slot_wal_keep_size_mb };
    if keep_mb >= 0 {
        max_lag.min((i64::from(keep_mb) << 20) / 2)
    } else {
        max_lag
    }
}

/// Makes the group's slot when it does not exist (waits, as every logical slot's creation does,
/// for the transactions running then to end). A group's slot that PostgreSQL invalidated (it
/// was behind by more than `max_slot_wal_keep_size`) can no longer be read: it is dropped and
/// made again at the WAL's end. The log starts there; members behind it decode their own slots
/// until they reach it.
fn ensure_group_slot() {
    let dropped = catalog::json(
        "SELECT to_jsonb(count(pg_drop_replication_slot(slot_name))) FROM pg_replication_slots \
          WHERE slot_name = $1 AND active_pid IS NULL AND (wal_status = 'lost' OR restart_lsn IS NULL)",
        &[GROUP_SLOT.into()],
    );
    if dropped.is_some_and(|v| v != 0) {
        pgrx::warning!(
            "{DECODER}: replication slot {GROUP_SLOT} was invalidated (its WAL was removed, see \
             max_slot_wal_keep_size); it is made again at the end of the WAL, and sinks behind that \
             decode their own slots until they reach it"
        );
    }
    let exists = catalog::json(
        "SELECT to_jsonb(EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1))",
        &[GROUP_SLOT.into()],
    );
    if exists != Some(Value::Bool(true)) {
        // A failover slot on PostgreSQL 17+, as the sinks' own slots are.
        catalog::create_logical_slot(GROUP_SLOT);
    }
}

/// The least confirmed position of the members' own slots among those at most `max_lag` bytes
/// behind the WAL.
fn slowest_member(slots: &[String], max_lag: i64) -> Option<Lsn> {
    let v = catalog::json(
        "SELECT to_jsonb(min(confirmed_flush_lsn)::text) FROM pg_replication_slots \
          WHERE slot_name = ANY($1) AND pg_current_wal_lsn() - confirmed_flush_lsn <= $2",
        &[slots.to_vec().into(), max_lag.into()],
    )?;
    match v {
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Removes the logs of earlier decoders (their members open the new one).
fn remove_old_logs() {
    let Ok(dir) = std::fs::read_dir("base/pgsql_tmp") else { return };
    for entry in dir.flatten() {
        if entry.file_name().to_string_lossy().starts_with("pgsql_tmp_cdc_group.") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
