//! pg_cdc's replication connection: a small blocking client of PostgreSQL's streaming replication
//! protocol, enough to stream a logical slot's changes from a walsender (`START_REPLICATION SLOT
//! ... LOGICAL` with pgoutput), confirm them, and run the replication commands around it
//! (`IDENTIFY_SYSTEM`, `CREATE_REPLICATION_SLOT`).
//!
//! ```text
//!  Connection::connect ─ startup (replication=database) ─ auth: trust / peer / password / md5 / SCRAM-SHA-256
//!        │ query()            simple-protocol replication commands, rows as text
//!        ▼ start_logical()    CopyBoth
//!  LogicalStream::recv ─▶ XLogData { start, end, data = one pgoutput message } | Keepalive { end, reply }
//!                 ::confirm ─▶ standby status update (written = flushed = applied = the confirmed LSN)
//! ```
//! It owns a socket and nothing else (no PostgreSQL memory, no signals), so it can run on any
//! thread. The pgoutput bytes are the same as `pg_logical_slot_peek_binary_changes` returns;
//! decoding them is `cdc_core::decode`'s business.
mod conn;
mod stream;
mod wire;

#[cfg(test)]
mod tests;

pub use conn::{Connection, Params};
pub use stream::{LogicalStream, StreamMessage};
pub use wire::{Endpoint, Socket, Timeouts};

/// What went wrong on a replication connection.
#[derive(Debug)]
pub enum Error {
    /// The socket failed or the server went away.
    Io(std::io::Error),
    /// The server answered with an ERROR (or FATAL).
    Server {
        /// SQLSTATE.
        code: String,
        /// Its message (and detail, if any).
        message: String,
    },
    /// The server asked for a password and none is configured, or for an unsupported method.
    Auth(String),
    /// The server sent something this client does not understand.
    Protocol(String),
}

impl Error {
    /// The SQLSTATE of a server error.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::Server { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "replication connection: {e}"),
            Error::Server { code, message } => write!(f, "{message} (SQLSTATE {code})"),
            Error::Auth(m) => write!(f, "replication connection: {m}"),
            Error::Protocol(m) => write!(f, "replication connection: protocol error: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}

/// Microseconds since 2000-01-01 00:00 UTC, PostgreSQL's epoch (the clock in status updates).
pub fn pg_now_micros() -> i64 {
    const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;
    let unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0);
    unix - (PG_EPOCH_UNIX_SECS as i64) * 1_000_000
}

/// Quotes an identifier for a replication command (`"name"`, inner quotes doubled).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a string literal for a replication command (`'value'`, inner quotes doubled).
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}
