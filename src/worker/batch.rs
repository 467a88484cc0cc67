//! The worker's side of one read: the SPI peek of a sink's slot as the core's
//! [`ChangeSource`]. What is read, sent, skipped and counted is decided in
//! `cdc_core::deliver::read`; this file only reaches PostgreSQL.
use std::collections::HashMap;

use cdc_core::deliver::port::ChangeSource;
use cdc_core::pipeline::RawFrame;
use cdc_core::types::TypeRegistry;

pub use cdc_core::deliver::read::{unix_micros_now, Batch, Failure, Inputs, Sent, Unit, BUFFER_FRAMES, FETCH_ROWS};

use super::source::{recorded_offsets, Peek};

/// A read of one sink's slot: a scrollable cursor over a peek (valid until the end of the
/// transaction that opened it), and where the sink's progress is recorded.
pub struct SlotRead<'a> {
    /// The cursor.
    pub peek: Peek,
    /// The extension's schema (for `_cdc_offsets`).
    pub schema: &'a str,
    /// The sink (its `_cdc_offsets` rows).
    pub sink_name: &'a str,
}

impl ChangeSource for SlotRead<'_> {
    fn fetch(&mut self, count: usize, types: &mut TypeRegistry) -> Vec<RawFrame> {
        self.peek.fetch(count as i64, types)
    }

    fn position(&self) -> u64 {
        self.peek.position()
    }

    fn seek(&mut self, position: u64) {
        self.peek.seek(position);
    }

    fn recorded_offsets(&mut self) -> HashMap<u32, u64> {
        recorded_offsets(self.schema, self.sink_name)
    }
}
