//! Delivery: from a sink's slot to its destination, with the guarantee the sink gives.
//!
//! ```text
//!  ChangeSource (the slot) ──▶ read: Assembler ─▶ dedup ─▶ Sink::send (one unit)
//!                                   │
//!                      protocol::plan_flush ──▶ Sink::flush(checkpoint) ──▶ confirm the slot
//! ```
//! - [`port`]: the two ports, [`port::Sink`] and [`port::ChangeSource`], and the checkpoint a
//!   sink keeps.
//! - [`read`]: one read of the slot delivered into one unit of the sink (whole transactions,
//!   large ones in pieces, duplicates skipped, the unit bounded by `checkpoint_interval_ms`).
//! - [`protocol`]: the decisions around it — may the sink read, what to flush, where to confirm,
//!   how long to back off.
//! - [`handoff`]: a sink on a thread of its own behind a queue bounded in bytes, so the next unit
//!   is read and encoded while the last one commits.
//! - [`spool`]: what a decoding session kept open across reads has emitted and its sink has not
//!   confirmed (in memory, the rest in a file), read and re-read by position.
//!
//! Everything here is plain Rust, tested with in-memory doubles of both ports (`memory`); the
//! worker (SPI, shared memory, threads, the loop) and the sinks (`cdc-sinks`) are the adapters.
pub mod handoff;
pub mod port;
pub mod protocol;
pub mod read;
pub mod spool;

#[cfg(any(test, feature = "testutil"))]
pub mod memory;
#[cfg(test)]
mod tests;
