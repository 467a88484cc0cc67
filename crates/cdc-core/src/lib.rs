#![recursion_limit = "256"]
//! pg_cdc's pure core: everything between the bytes PostgreSQL's pgoutput plugin produces and the
//! bytes a sink publishes, with no pgrx and no network, so it is unit-tested with plain `cargo test`.
//!
//! ```text
//! decode (pgoutput v1) ─▶ pipeline (transactions, relation plans) ─▶ envelope (JSON event, key)
//!                              ▲                                          ▲
//!                       config (capture/sink)                  value + types (text -> JSON)
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod config;
pub mod context;
pub mod decode;
pub mod deliver;
pub mod driver;
pub mod envelope;
pub mod error;
pub mod expr;
pub mod failpoint;
pub mod fanout;
pub mod format;
pub mod frame;
pub mod json;
pub mod lookup;
pub mod lsn;
pub mod metrics;
pub mod object;
pub mod pipeline;
pub mod redact;
pub mod routing;
pub mod schema;
pub mod snapshot;
pub mod state;
pub mod stats;
pub mod time;
pub mod types;
pub mod value;

/// Test helpers over the golden pgoutput captures (for this crate's tests and, with the feature
/// `testutil`, for the crates that build on it).
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;

pub use error::{CdcError, CdcResult, ErrorKind};
pub use lsn::Lsn;
