//! The worker's side of one read: the names the read shares with `cdc_core::deliver::read`, which
//! decides what is read, sent, skipped and counted; the source it reads is
//! [`super::decoding::SessionRead`].
pub use cdc_core::deliver::read::{unix_micros_now, Batch, Failure, Inputs, Sent, Unit, BUFFER_FRAMES, FETCH_ROWS};
