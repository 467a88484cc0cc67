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
