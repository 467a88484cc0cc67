//! The per-sink delivery protocol, as decisions: whether a sink may read its slot at all, what a
//! read may be flushed with, where the slot may then be confirmed, and how long to wait after a
//! failure. The worker asks these and does the I/O (SPI, shared memory, the sink's thread).
//!
//! Invariants (README "Delivery guarantees", RELIABILITY P1–P9):
//! - ack before advance: the slot is confirmed only to a position the sink acknowledged — for an
//!   exactly-once sink, one covered by a checkpoint it committed;
//! - the checkpoint never moves backwards (a read below it is a re-read after a crash: only the
//!   slot moves);
//! - a slot confirmed past the checkpoint, a missing slot or publication, an invalidated slot are
//!   errors an operator must see, never a silent resync.
use std::time::Duration;

use super::port::{Checkpoint, DeliveryMode};
use super::read::{Batch, Failure};
use crate::state::SinkState;
use crate::Lsn;

/// What the catalog says about a sink's slot before a read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotView {
    /// The slot's name.
    pub name: String,
    /// It exists.
    pub exists: bool,
    /// `pg_replication_slots.wal_status` (`lost`: invalidated).
    pub wal_status: Option<String>,
    /// `pg_replication_slots.invalidation_reason` (PostgreSQL 17+): why PostgreSQL invalidated it.
    pub invalidation_reason: Option<String>,
    /// The process streaming from it, if any.
    pub active_pid: Option<i32>,
    /// `confirmed_flush_lsn`.
    pub confirmed: Lsn,
}

/// Why a sink cannot read now, if it cannot: the publications it decodes through (`missing` names
/// the first one that does not exist), and its slot.
pub fn slot_failure(missing_publication: Option<&str>, slot: &SlotView) -> Option<Failure> {
    if let Some(p) = missing_publication {
        // pgoutput cannot decode anything without it; changes made since it was dropped are lost
        // to every sink, so this is an error and never a silent resync.
        return Some(Failure::new(
            SinkState::Error,
            format!(
                "publication {p} does not exist (dropped outside pg_cdc?): changes since it was dropped cannot be \
                 decoded; recreate the extension (DROP EXTENSION pg_cdc CASCADE; CREATE EXTENSION pg_cdc), re-enable the \
                 tables and re-add the sinks"
            ),
        ));
    }
    if !slot.exists {
        return Some(Failure::new(
            SinkState::Error,
            format!(
                "replication slot {} does not exist: it was dropped outside pg_cdc, or this server was promoted \
                 from a standby that did not keep it (a standby keeps logical slots only from PostgreSQL 17 on, \
                 with sync_replication_slots = on). pg_cdc does not recreate it silently because changes would be \
                 lost: drop and re-add the sink (cdc_drop_sink, then cdc_add_sink with the same config; its \
                 initial snapshot sends every row again)",
                slot.name
            ),
        ));
    }
    if slot.wal_status.as_deref() == Some("lost") || slot.invalidation_reason.is_some() {
        return Some(Failure::new(
            SinkState::Error,
            format!(
                "replication slot {} was invalidated: {}; its changes since are lost to this sink, so drop and re-add \
                 it (cdc_drop_sink, then cdc_add_sink with the same config; its snapshot sends every row again)",
                slot.name,
                invalidation_cause(slot.invalidation_reason.as_deref())
            ),
        ));
    }
    if let Some(pid) = slot.active_pid {
        return Some(Failure::new(
            SinkState::Retrying,
            format!("replication slot {} is in use by process {pid}", slot.name),
        ));
    }
    None
}

/// What invalidated a slot, for a DBA, by PostgreSQL's `invalidation_reason` (none before 17,
/// where only removed WAL invalidated a logical slot on a primary).
fn invalidation_cause(reason: Option<&str>) -> String {
    match reason {
        None | Some("wal_removed") => {
            "the WAL it needed was removed (it fell more than max_slot_wal_keep_size behind)".to_string()
        }
        Some("idle_timeout") => "no process held it for longer than idle_replication_slot_timeout (a sink's slot is \
                                 idle while the sink retries or waits in error, and while pg_cdc's worker is not \
                                 running: set idle_replication_slot_timeout = 0, or longer than any outage of a \
                                 destination)"
            .to_string(),
        Some("rows_removed") => {
            "catalog rows it needed were removed (on a standby: set hot_standby_feedback = on and use \
             primary_slot_name)"
                .to_string()
        }
        Some("wal_level_insufficient") => "wal_level was set below logical".to_string(),
        Some(other) => format!("PostgreSQL gives the reason {other}"),
    }
}

/// An exactly-once sink confirms its slot only after committing a checkpoint, so the slot never
/// passes it; if it did, someone moved the slot (`pg_replication_slot_advance`) and the changes in
/// between were never delivered. A sink whose checkpoint may trail the slot (in the source
/// database, see [`super::port::Sink::in_source_database`]) is not checked.
pub fn check_checkpoint(slot: &SlotView, checkpoint: Option<Checkpoint>, trails: bool) -> Result<(), Failure> {
    match checkpoint.filter(|cp| !trails && slot.confirmed > cp.end_lsn) {
        None => Ok(()),
        Some(cp) => Err(Failure::new(
            SinkState::Error,
            format!(
                "replication slot {} is confirmed up to {}, past the last checkpoint its sink committed ({}): changes \
                 in between may never have been delivered; pg_cdc stops instead of guessing (drop and re-add the sink)",
                slot.name, slot.confirmed, cp.end_lsn
            ),
        )),
    }
}

/// What to do with a read once it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushPlan {
    /// Flush the sink with this checkpoint (`None`: nothing to flush).
    pub flush: Option<Checkpoint>,
    /// Then confirm the slot here (`None`: it stays).
    pub confirm: Option<Lsn>,
}

/// The flush and the confirm a read allows. An exactly-once sink commits a checkpoint whenever the
/// slot is to move (also for a read with nothing for it, a heartbeat), so the checkpoint always
/// covers the slot — except when the read ends at or below the last checkpoint (read again after
/// the slot went back in a crash): then only the slot moves, or a restart right after would
/// publish again what lies between. An at-least-once sink flushes only what it sent.
pub fn plan_flush(
    mode: DeliveryMode,
    batch: &Batch,
    confirmed: Lsn,
    last: Option<Checkpoint>,
    dedup: bool,
) -> FlushPlan {
    let confirm = batch.target.filter(|l| *l > confirmed && batch.rows > 0);
    let checkpoint = Checkpoint { end_lsn: confirm.unwrap_or(confirmed) };
    let flush = match mode {
        DeliveryMode::ExactlyOnce => {
            let covered = dedup && last.is_some_and(|cp| checkpoint.end_lsn <= cp.end_lsn);
            confirm.is_some() && !covered
        }
        DeliveryMode::AtLeastOnce => batch.sent,
    };
    FlushPlan { flush: flush.then_some(checkpoint), confirm }
}

/// How long a sink waits after its `failures`-th consecutive failure: 500 ms doubled per failure
/// (1 s after the first), capped by `cap` (`cdc.max_retry_backoff_ms`).
pub fn backoff(failures: u32, cap: Duration) -> Duration {
    let ms = 500u64.saturating_mul(1u64 << failures.min(16));
    Duration::from_millis(ms).min(cap)
}
