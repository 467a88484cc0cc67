//! One decoding shared by many sinks (ARCHITECTURE.md, "Many sinks, one decoding").
//!
//! ```text
//!  group slot ──decoder's session──▶ LogWriter ──▶ segment files ──▶ LogReader ─▶ Feed ─▶ member's spool
//!                 (every published table)        (published end       (one per member, at its own
//!                                                 in shared memory)    position; its tables only)
//! ```
//! [`log`] is the decoded log of a group (written once, read by every member at its own pace,
//! trimmed behind the slowest); [`feed`] is one member's view of it, the frames a decoding session
//! of the member's own would have emitted.
pub mod feed;
pub mod log;

#[cfg(test)]
mod tests;

use std::time::Duration;

/// The most WAL the group's slot stays behind before the decoder writes the members' heartbeat
/// sooner than `cdc.heartbeat_interval_ms` (see [`members_heartbeat_due`]).
pub const MEMBERS_HEARTBEAT_BYTES: u64 = 64 << 20;

/// Whether the decoder writes the members' heartbeat now: a logical message every member reads,
/// after which each moves its position (an exactly-once member commits a Kafka transaction with
/// its checkpoint for it, which is why it is rare). Due when the group's slot is `behind` the
/// flushed WAL at all and `quiet_for` (since the last heartbeat) reached `interval`, or sooner
/// when it is a quarter of `max_lag` (`cdc.shared_decoding_max_lag`, a member further behind
/// loses the log) or [`MEMBERS_HEARTBEAT_BYTES`] behind, whichever is less.
///
/// Until 2026-12-07 "sooner" was 2 MB behind, the bound of a sink's own slot (whose session
/// decodes again what lies behind it at every read); the decoder keeps its session, so that
/// bound only woke every idle member for a Kafka transaction every few seconds under a steady
/// load: 19 transactions each in 62 s at 2,000 tx/s.
pub fn members_heartbeat_due(behind: u64, quiet_for: Duration, interval: Duration, max_lag: u64) -> bool {
    let far = (max_lag / 4).min(MEMBERS_HEARTBEAT_BYTES);
    behind > 0 && (behind >= far || quiet_for >= interval)
}
