//! Connecting, authenticating and simple queries on a replication connection.
use std::time::{Duration, Instant};

use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};

use crate::stream::LogicalStream;
use crate::wire::{self, cstr, fields, Endpoint, Socket, Timeouts, Wire};
use crate::{quote_ident, quote_literal, Error};

/// How to reach the server.
#[derive(Debug, Clone)]
pub struct Params {
    /// Socket file or host and port.
    pub endpoint: Endpoint,
    /// The role (it needs the REPLICATION attribute, or to be a superuser).
    pub user: String,
    /// The database whose slots are streamed (`replication=database`).
    pub database: String,
    /// `application_name`, shown in `pg_stat_replication`.
    pub application_name: String,
    /// For `password`, `md5` and `scram-sha-256` authentication; never shown.
    pub password: Option<String>,
    /// How long connecting and authenticating may take.
    pub connect_timeout: Duration,
}

/// A replication connection in the idle state (between commands).
pub struct Connection<S = Socket> {
    pub(crate) wire: Wire<S>,
    pub(crate) timeout: Duration,
    /// The walsender's process id.
    pub backend_pid: i32,
}

impl Connection<Socket> {
    /// Connects and authenticates.
    pub fn connect(p: &Params) -> Result<Connection<Socket>, Error> {
        let sock = Socket::connect(&p.endpoint, p.connect_timeout)
            .map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("cannot connect to {}: {e}", p.endpoint))))?;
        Connection::handshake(sock, p)
    }
}

impl<S: std::io::Read + std::io::Write + Timeouts> Connection<S> {
    /// Runs the startup and authentication exchange on a connected socket.
    pub(crate) fn handshake(sock: S, p: &Params) -> Result<Connection<S>, Error> {
        let mut c = Connection { wire: Wire::new(sock), timeout: p.connect_timeout, backend_pid: 0 };
        let deadline = Instant::now() + p.connect_timeout;
        let startup = wire::startup(&[
            ("user", &p.user),
            ("database", &p.database),
            ("replication", "database"),
            ("application_name", &p.application_name),
            ("client_encoding", "UTF8"),
        ]);
        c.wire.write_all(&startup, p.connect_timeout)?;
        let mut scram: Option<ScramSha256> = None;
        loop {
            let Some((tag, body)) = c.wire.read(Some(deadline))? else {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer from {} within {:?}", p.endpoint, p.connect_timeout),
                )));
            };
            match tag {
                b'R' => {
                    let code = be_i32(body, 0)?;
                    let rest = &body[4..];
                    let mut reply = Vec::new();
                    match code {
                        0 => {}
                        3 => {
                            let pw = password(p, "password")?;
                            let mut b = pw.as_bytes().to_vec();
                            b.push(0);
                            wire::message(&mut reply, b'p', &b);
                        }
                        5 => {
                            let salt: [u8; 4] = rest
                                .get(..4)
                                .and_then(|s| s.try_into().ok())
                                .ok_or_else(|| Error::Protocol("md5 request without salt".into()))?;
                            let mut b = md5_hash(p.user.as_bytes(), password(p, "md5")?.as_bytes(), salt).into_bytes();
                            b.push(0);
                            wire::message(&mut reply, b'p', &b);
                        }
                        10 => {
                            let mut offered = Vec::new();
                            let mut m = rest;
                            while let Ok((name, r)) = cstr(m) {
                                if name.is_empty() {
                                    break;
                                }
                                offered.push(name.to_string());
                                m = r;
                            }
                            if !offered.iter().any(|m| m == SCRAM_SHA_256) {
                                return Err(Error::Auth(format!(
                                    "the server offers SASL mechanisms {offered:?}; only {SCRAM_SHA_256} is supported"
                                )));
                            }
                            let s = ScramSha256::new(
                                password(p, "scram-sha-256")?.as_bytes(),
                                ChannelBinding::unsupported(),
                            );
                            let mut b = Vec::new();
                            b.extend_from_slice(SCRAM_SHA_256.as_bytes());
                            b.push(0);
                            b.extend_from_slice(&(s.message().len() as i32).to_be_bytes());
                            b.extend_from_slice(s.message());
                            wire::message(&mut reply, b'p', &b);
                            scram = Some(s);
                        }
                        11 => {
                            let s =
                                scram.as_mut().ok_or_else(|| Error::Protocol("SASL continue before start".into()))?;
                            s.update(rest).map_err(|e| Error::Auth(format!("SCRAM exchange failed: {e}")))?;
                            wire::message(&mut reply, b'p', s.message());
                        }
                        12 => {
                            let s = scram.as_mut().ok_or_else(|| Error::Protocol("SASL final before start".into()))?;
                            s.finish(rest)
                                .map_err(|e| Error::Auth(format!("the server's SCRAM proof is invalid: {e}")))?;
                        }
                        other => {
                            return Err(Error::Auth(format!(
                                "the server asks for authentication method {other}, which pg_cdc does not support \
                                 (use trust, peer, password, md5 or scram-sha-256 for replication connections)"
                            )))
                        }
                    }
                    if !reply.is_empty() {
                        c.wire.write_all(&reply, p.connect_timeout)?;
                    }
                }
                b'K' => c.backend_pid = be_i32(body, 0)?,
                b'S' | b'N' => {}
                b'E' => return Err(server_error(body)),
                b'Z' => return Ok(c),
                t => return Err(Error::Protocol(format!("unexpected message {:?} during startup", t as char))),
            }
        }
    }

    /// Runs one replication command or query; returns its rows as text (`None` for NULL).
    pub fn query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, Error> {
        self.wire.write_all(&wire::query(sql), self.timeout)?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let Some((tag, body)) = self.wire.read(None)? else { continue };
            match tag {
                b'D' => rows.push(data_row(body)?),
                b'E' => error = Some(server_error(body)),
                b'Z' => return error.map_or(Ok(rows), Err),
                b'T' | b'C' | b'I' | b'S' | b'N' => {}
                t => return Err(Error::Protocol(format!("unexpected message {:?} after a query", t as char))),
            }
        }
    }

    /// `IDENTIFY_SYSTEM`: the system identifier, timeline and current WAL flush position.
    pub fn identify_system(&mut self) -> Result<(String, u32, u64), Error> {
        let rows = self.query("IDENTIFY_SYSTEM")?;
        let row = rows.first().ok_or_else(|| Error::Protocol("IDENTIFY_SYSTEM returned no row".into()))?;
        let get = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
        let timeline = get(1).parse().map_err(|_| Error::Protocol("IDENTIFY_SYSTEM timeline".into()))?;
        let lsn = parse_lsn(&get(2)).ok_or_else(|| Error::Protocol("IDENTIFY_SYSTEM xlogpos".into()))?;
        Ok((get(0), timeline, lsn))
    }

    /// `START_REPLICATION SLOT slot LOGICAL start (options)`: the walsender streams the slot's
    /// changes from its confirmed position (or `start`, if later).
    pub fn start_logical(
        mut self,
        slot: &str,
        start: u64,
        options: &[(&str, &str)],
    ) -> Result<LogicalStream<S>, Error> {
        let opts: Vec<String> =
            options.iter().map(|(k, v)| format!("{} {}", quote_ident(k), quote_literal(v))).collect();
        let sql = format!(
            "START_REPLICATION SLOT {} LOGICAL {:X}/{:X} ({})",
            quote_ident(slot),
            start >> 32,
            start & 0xFFFF_FFFF,
            opts.join(", ")
        );
        self.wire.write_all(&wire::query(&sql), self.timeout)?;
        loop {
            let Some((tag, body)) = self.wire.read(None)? else { continue };
            match tag {
                b'W' => return Ok(LogicalStream::new(self)),
                b'E' => {
                    let e = server_error(body);
                    // The ReadyForQuery that follows leaves the connection usable; it is dropped anyway.
                    return Err(e);
                }
                b'N' | b'S' => {}
                t => {
                    return Err(Error::Protocol(format!("unexpected message {:?} after START_REPLICATION", t as char)))
                }
            }
        }
    }
}

fn password<'a>(p: &'a Params, method: &str) -> Result<&'a str, Error> {
    p.password.as_deref().ok_or_else(|| {
        Error::Auth(format!(
            "the server asks role {} for a password ({method}) on {} and none is configured",
            p.user, p.endpoint
        ))
    })
}

pub(crate) fn be_i32(b: &[u8], at: usize) -> Result<i32, Error> {
    b.get(at..at + 4)
        .map(|s| i32::from_be_bytes(s.try_into().unwrap()))
        .ok_or_else(|| Error::Protocol("message too short".into()))
}

/// An ErrorResponse as an [`Error::Server`].
pub(crate) fn server_error(body: &[u8]) -> Error {
    let f = fields(body);
    let get = |c: u8| f.iter().find(|(k, _)| *k == c).map(|(_, v)| v.clone());
    let mut message = get(b'M').unwrap_or_else(|| "unknown error".into());
    if let Some(d) = get(b'D') {
        message = format!("{message}: {d}");
    }
    Error::Server { code: get(b'C').unwrap_or_else(|| "XX000".into()), message }
}

fn data_row(body: &[u8]) -> Result<Vec<Option<String>>, Error> {
    let n = body
        .get(..2)
        .map(|s| u16::from_be_bytes([s[0], s[1]]))
        .ok_or_else(|| Error::Protocol("short DataRow".into()))?;
    let mut at = 2;
    let mut row = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let len = be_i32(body, at)?;
        at += 4;
        if len < 0 {
            row.push(None);
            continue;
        }
        let v = body.get(at..at + len as usize).ok_or_else(|| Error::Protocol("short DataRow".into()))?;
        row.push(Some(String::from_utf8_lossy(v).into_owned()));
        at += len as usize;
    }
    Ok(row)
}

/// Parses PostgreSQL's `X/Y` LSN text.
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    Some((u64::from(u32::from_str_radix(hi, 16).ok()?) << 32) | u64::from(u32::from_str_radix(lo, 16).ok()?))
}
