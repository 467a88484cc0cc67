//! Framing of the PostgreSQL wire protocol (version 3): a socket, a read buffer that keeps a
//! partly received message across a timeout, and the few frontend messages a replication client
//! sends. Messages are borrowed from the buffer, so a stream of CopyData frames is not copied
//! until the caller keeps one.
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::Error;

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix-domain socket file (`<dir>/.s.PGSQL.<port>`).
    Unix(std::path::PathBuf),
    /// A TCP host and port.
    Tcp(String, u16),
}

impl Endpoint {
    /// The socket file of a server listening in `dir` on `port`, as libpq names it.
    pub fn unix_socket(dir: &str, port: u16) -> Endpoint {
        Endpoint::Unix(std::path::Path::new(dir).join(format!(".s.PGSQL.{port}")))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "socket {}", p.display()),
            Endpoint::Tcp(h, p) => write!(f, "{h}:{p}"),
        }
    }
}

/// A connected socket of either kind (what [`crate::Connection::connect`] opens).
pub enum Socket {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Socket {
    pub(crate) fn connect(endpoint: &Endpoint, timeout: Duration) -> io::Result<Socket> {
        match endpoint {
            // A local socket connects at once or not at all.
            Endpoint::Unix(path) => UnixStream::connect(path).map(Socket::Unix),
            Endpoint::Tcp(host, port) => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
                for addr in std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), *port))? {
                    match TcpStream::connect_timeout(&addr, timeout) {
                        Ok(s) => {
                            s.set_nodelay(true)?;
                            return Ok(Socket::Tcp(s));
                        }
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
        }
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Unix(s) => s.set_read_timeout(t),
            Socket::Tcp(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Unix(s) => s.set_write_timeout(t),
            Socket::Tcp(s) => s.set_write_timeout(t),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => s.read(buf),
            Socket::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => s.write(buf),
            Socket::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Socket::Unix(s) => s.flush(),
            Socket::Tcp(s) => s.flush(),
        }
    }
}

/// The largest message accepted (PostgreSQL's own limit for a CopyData frame is 1 GB).
const MAX_MESSAGE: usize = 1 << 30;

/// A socket with its read buffer.
pub(crate) struct Wire<S> {
    sock: S,
    buf: Vec<u8>,
    /// Bytes of `buf` already handed out as messages.
    start: usize,
    /// Bytes of `buf` received.
    end: usize,
    /// The message handed out last: consumed at the next read.
    pending: usize,
}

/// Socket timeouts, so a read can wait until a deadline (implemented for the sockets a
/// connection runs on).
pub trait Timeouts {
    /// Sets the read timeout (`None`: block).
    fn read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    /// Sets the write timeout.
    fn write_timeout(&self, t: Option<Duration>) -> io::Result<()>;
}

impl Timeouts for Socket {
    fn read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
    fn write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(t)
    }
}

impl Timeouts for UnixStream {
    fn read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
    fn write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(t)
    }
}

impl<S: Read + Write + Timeouts> Wire<S> {
    pub(crate) fn new(sock: S) -> Wire<S> {
        Wire { sock, buf: vec![0; 256 << 10], start: 0, end: 0, pending: 0 }
    }

    pub(crate) fn write_all(&mut self, bytes: &[u8], timeout: Duration) -> Result<(), Error> {
        self.sock.write_timeout(Some(timeout))?;
        self.sock.write_all(bytes)?;
        Ok(())
    }

    /// The next message, `(tag, body)`, waiting at most until `deadline` (`None`: wait as long as
    /// it takes). `Ok(None)` when the deadline passed first; a partly received message stays in
    /// the buffer for the next call.
    pub(crate) fn read(&mut self, deadline: Option<Instant>) -> Result<Option<(u8, &[u8])>, Error> {
        self.start += std::mem::take(&mut self.pending);
        loop {
            let avail = self.end - self.start;
            if avail >= 5 {
                let len = u32::from_be_bytes(self.buf[self.start + 1..self.start + 5].try_into().unwrap()) as usize;
                if !(4..=MAX_MESSAGE).contains(&len) {
                    return Err(Error::Protocol(format!("invalid message length {len}")));
                }
                if avail > len {
                    let tag = self.buf[self.start];
                    self.pending = len + 1;
                    return Ok(Some((tag, &self.buf[self.start + 5..self.start + 1 + len])));
                }
                if self.start + len + 1 > self.buf.len() {
                    self.compact(len + 1);
                }
            } else if self.start + 5 > self.buf.len() {
                self.compact(5);
            }
            let timeout = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(t) if !t.is_zero() => Some(t),
                    _ => return Ok(None),
                },
                None => None,
            };
            self.sock.read_timeout(timeout)?;
            match self.sock.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    return Err(Error::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    )))
                }
                Ok(n) => self.end += n,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Moves the unread bytes to the front and makes room for a message of `need` bytes.
    fn compact(&mut self, need: usize) {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        if self.buf.len() < need {
            self.buf.resize(need.next_power_of_two(), 0);
        }
    }
}

/// Appends a frontend message: tag, length, body.
pub(crate) fn message(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(body);
}

/// A simple-protocol query.
pub(crate) fn query(sql: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(sql.len() + 1);
    body.extend_from_slice(sql.as_bytes());
    body.push(0);
    let mut out = Vec::new();
    message(&mut out, b'Q', &body);
    out
}

/// The startup packet of protocol 3.0 with `params`.
pub(crate) fn startup(params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = 196_608u32.to_be_bytes().to_vec();
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut out = (body.len() as u32 + 4).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// Reads a NUL-terminated string at the front of `b`; returns it and the rest.
pub(crate) fn cstr(b: &[u8]) -> Result<(&str, &[u8]), Error> {
    let nul = b.iter().position(|&c| c == 0).ok_or_else(|| Error::Protocol("unterminated string".into()))?;
    let s = std::str::from_utf8(&b[..nul]).map_err(|_| Error::Protocol("string is not UTF-8".into()))?;
    Ok((s, &b[nul + 1..]))
}

/// A big-endian integer at the front of `b`.
pub(crate) fn be_u64(b: &[u8], at: usize) -> Result<u64, Error> {
    b.get(at..at + 8)
        .map(|s| u64::from_be_bytes(s.try_into().unwrap()))
        .ok_or_else(|| Error::Protocol("message too short".into()))
}

/// The fields of an ErrorResponse or NoticeResponse body.
pub(crate) fn fields(mut b: &[u8]) -> Vec<(u8, String)> {
    let mut out = Vec::new();
    while let Some((&code, rest)) = b.split_first() {
        if code == 0 {
            break;
        }
        match cstr(rest) {
            Ok((s, rest)) => {
                out.push((code, s.to_string()));
                b = rest;
            }
            Err(_) => break,
        }
    }
    out
}
