//! The CopyBoth phase of a logical replication connection: the walsender's XLogData and
//! keepalive messages in, standby status updates out.
use std::time::Instant;

use crate::conn::{server_error, Connection};
use crate::wire::{self, be_u64, Socket, Timeouts};
use crate::{pg_now_micros, Error};

/// One message from the walsender.
#[derive(Debug, PartialEq, Eq)]
pub enum StreamMessage<'a> {
    /// One output plugin message (for pgoutput: Begin, Relation, Insert, ..., Commit, Message).
    XLogData {
        /// The LSN the output plugin wrote it at (the `lsn` column of a peek).
        start: u64,
        /// The walsender's sent position.
        end: u64,
        /// The output plugin's bytes.
        data: &'a [u8],
    },
    /// The walsender's sent position; it wants a status update soon when `reply` is set.
    Keepalive {
        /// Everything before this was decoded and sent (or skipped as unpublished).
        end: u64,
        /// Answer with a status update now (the walsender's timeout is near).
        reply: bool,
    },
}

/// A logical slot streamed by a walsender. Nothing is confirmed until [`LogicalStream::confirm`]:
/// the slot's `confirmed_flush_lsn` moves only then, and after a reconnection the stream starts
/// again at the last confirmed position.
pub struct LogicalStream<S = Socket> {
    conn: Connection<S>,
    confirmed: u64,
}

impl<S: std::io::Read + std::io::Write + Timeouts> LogicalStream<S> {
    pub(crate) fn new(conn: Connection<S>) -> LogicalStream<S> {
        LogicalStream { conn, confirmed: 0 }
    }

    /// The walsender's process id.
    pub fn backend_pid(&self) -> i32 {
        self.conn.backend_pid
    }

    /// The next message, waiting at most until `deadline`; `Ok(None)` if none came by then.
    pub fn recv(&mut self, deadline: Option<Instant>) -> Result<Option<StreamMessage<'_>>, Error> {
        let Some((tag, body)) = self.conn.wire.read(deadline)? else { return Ok(None) };
        match tag {
            b'd' => parse_copy_data(body).map(Some),
            b'E' => Err(server_error(body)),
            b'c' => Err(Error::Protocol("the server ended the replication stream".into())),
            t => Err(Error::Protocol(format!("unexpected message {:?} in the replication stream", t as char))),
        }
    }

    /// Confirms everything before `lsn` as durably delivered: the walsender moves the slot's
    /// confirmed position there (and its restart position and xmin as far as that allows).
    pub fn confirm(&mut self, lsn: u64) -> Result<(), Error> {
        self.confirmed = self.confirmed.max(lsn);
        self.send_status(false)
    }

    /// The last confirmed position.
    pub fn confirmed(&self) -> u64 {
        self.confirmed
    }

    /// Sends a standby status update with the confirmed position (the answer to a keepalive that
    /// asks for one); `reply` asks the walsender for a keepalive back.
    pub fn send_status(&mut self, reply: bool) -> Result<(), Error> {
        let mut out = Vec::with_capacity(40);
        wire::message(&mut out, b'd', &status_update(self.confirmed, pg_now_micros(), reply));
        let t = self.conn.timeout;
        self.conn.wire.write_all(&out, t)
    }

    /// Ends the stream and the connection (CopyDone, Terminate); errors are ignored, the socket
    /// closes either way.
    pub fn close(mut self) {
        let mut out = Vec::new();
        wire::message(&mut out, b'c', &[]);
        wire::message(&mut out, b'X', &[]);
        let _ = self.conn.wire.write_all(&out, std::time::Duration::from_millis(100));
    }
}

/// The body of a standby status update ('r').
pub(crate) fn status_update(lsn: u64, now_micros: i64, reply: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(34);
    b.push(b'r');
    for _ in 0..3 {
        // written, flushed, applied: all the confirmed position.
        b.extend_from_slice(&lsn.to_be_bytes());
    }
    b.extend_from_slice(&now_micros.to_be_bytes());
    b.push(u8::from(reply));
    b
}

/// A CopyData body from a walsender.
pub(crate) fn parse_copy_data(body: &[u8]) -> Result<StreamMessage<'_>, Error> {
    match body.first() {
        Some(b'w') => {
            if body.len() < 25 {
                return Err(Error::Protocol("short XLogData message".into()));
            }
            Ok(StreamMessage::XLogData { start: be_u64(body, 1)?, end: be_u64(body, 9)?, data: &body[25..] })
        }
        Some(b'k') => {
            let reply = *body.get(17).ok_or_else(|| Error::Protocol("short keepalive message".into()))?;
            Ok(StreamMessage::Keepalive { end: be_u64(body, 1)?, reply: reply != 0 })
        }
        Some(t) => Err(Error::Protocol(format!("unknown replication message {:?}", *t as char))),
        None => Err(Error::Protocol("empty CopyData message".into())),
    }
}
