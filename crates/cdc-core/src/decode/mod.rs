//! pgoutput (protocol version 1) decoding.
//!
//! Input: the `data` column of `pg_logical_slot_peek_binary_changes(..., 'proto_version', '1', ...)`,
//! one logical replication message per row. Output: [`Message`], which borrows the tuple values from
//! the input buffer, so decoding allocates only for relation descriptions and the column vector.
//!
//! Format reference: PostgreSQL 15 documentation, "Logical Replication Message Formats". All integers
//! are big-endian; strings are NUL-terminated; timestamps are microseconds since 2000-01-01 UTC.
//!
//! The decoder never panics on malformed input: every read is bounds-checked and returns
//! [`DecodeError`], because a corrupt frame must stop the pipeline with a message, not crash the worker.

use std::fmt;

use crate::lsn::Lsn;

/// A value of one column inside a tuple of an Insert, Update or Delete message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TupleValue<'a> {
    /// SQL NULL (`'n'`).
    Null,
    /// An unchanged TOASTed value that the WAL did not carry (`'u'`); the new tuple of an UPDATE only.
    UnchangedToast,
    /// The value in the type's text output format (`'t'`).
    Text(&'a [u8]),
}

/// The columns of one row image, in the relation's attribute order.
pub type Tuple<'a> = Vec<TupleValue<'a>>;

/// Which old image an Update or Delete carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldKind {
    /// `'K'`: only the replica identity key columns are set; the others are NULL.
    Key,
    /// `'O'`: the whole old row (REPLICA IDENTITY FULL).
    Full,
}

/// One column of a relation description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Part of the replica identity (with REPLICA IDENTITY FULL every column is flagged).
    pub is_key: bool,
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// Type modifier (`atttypmod`).
    pub type_mod: i32,
}

/// A relation description ('R'): the schema of the rows that follow, as of this point in the WAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The table's OID.
    pub oid: u32,
    /// Schema name.
    pub namespace: String,
    /// Table name.
    pub name: String,
    /// `relreplident`: b'd' default, b'n' nothing, b'f' full, b'i' index.
    pub replica_identity: u8,
    /// Published columns in attribute order.
    pub columns: Vec<RelationColumn>,
}

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// 'B': a transaction starts.
    Begin {
        /// LSN of the commit record (the transaction's final LSN).
        final_lsn: Lsn,
        /// Commit time, microseconds since 2000-01-01 UTC.
        commit_time: i64,
        /// Transaction id.
        xid: u32,
    },
    /// 'C': the transaction committed.
    Commit {
        /// Flags (unused, 0).
        flags: u8,
        /// LSN of the commit record.
        commit_lsn: Lsn,
        /// LSN just past the commit record: the position to confirm once the transaction is delivered.
        end_lsn: Lsn,
        /// Commit time, microseconds since 2000-01-01 UTC.
        commit_time: i64,
    },
    /// 'O': the transaction came from a replication origin.
    Origin {
        /// Commit LSN on the origin server.
        lsn: Lsn,
        /// Origin name.
        name: &'a str,
    },
    /// 'R': relation description.
    Relation(Relation),
    /// 'Y': a non-built-in type's name, sent before its first use.
    Type {
        /// Type OID.
        oid: u32,
        /// Schema name.
        namespace: &'a str,
        /// Type name.
        name: &'a str,
    },
    /// 'I': a row was inserted.
    Insert {
        /// Relation OID.
        relation: u32,
        /// The new row.
        new: Tuple<'a>,
    },
    /// 'U': a row was updated.
    Update {
        /// Relation OID.
        relation: u32,
        /// The old image, present with REPLICA IDENTITY FULL or when a key column changed.
        old: Option<(OldKind, Tuple<'a>)>,
        /// The new row; unchanged TOAST values are [`TupleValue::UnchangedToast`].
        new: Tuple<'a>,
    },
    /// 'D': a row was deleted.
    Delete {
        /// Relation OID.
        relation: u32,
        /// Which image `old` is.
        kind: OldKind,
        /// The key (or the whole row with REPLICA IDENTITY FULL).
        old: Tuple<'a>,
    },
    /// 'T': tables were truncated.
    Truncate {
        /// Bit 1: CASCADE, bit 2: RESTART IDENTITY.
        options: u8,
        /// The truncated relations.
        relations: Vec<u32>,
    },
    /// 'Z': a chunk of a snapshot, pg_cdc's own message (never sent by pgoutput; see
    /// [`crate::snapshot`]): rows read from a table, delivered as one transaction of READ events
    /// at the stream position of the chunk's high watermark.
    SnapshotChunk {
        /// Where the chunk sits in the stream: its events' `commit_lsn`.
        commit_lsn: Lsn,
        /// The position to confirm once the chunk is delivered (its high watermark).
        end_lsn: Lsn,
        /// When the chunk was read, microseconds since 2000-01-01 UTC.
        commit_time: i64,
        /// The table as the chunk's rows lay it out.
        relation: Relation,
        /// The rows, in the relation's column order.
        rows: Vec<Tuple<'a>>,
    },
    /// 'M': a logical decoding message (`pg_logical_emit_message`).
    LogicalMessage {
        /// Emitted with `transactional => true`.
        transactional: bool,
        /// LSN of the message.
        lsn: Lsn,
        /// Prefix chosen by the emitter.
        prefix: &'a str,
        /// Payload.
        content: &'a [u8],
    },
}

/// A frame that is not valid pgoutput v1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// Byte offset inside the frame where decoding failed.
    pub offset: usize,
    /// What was wrong.
    pub reason: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid pgoutput message at byte {}: {}", self.offset, self.reason)
    }
}

impl std::error::Error for DecodeError {}

/// A bounds-checked big-endian reader over one frame.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn err<T>(&self, reason: impl Into<String>) -> Result<T, DecodeError> {
        Err(DecodeError { offset: self.pos, reason: reason.into() })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => self.err(format!("need {n} more bytes, frame has {}", self.buf.len() - self.pos)),
        }
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(self.u32()? as i32)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(self.u64()? as i64)
    }

    fn cstr(&mut self) -> Result<&'a str, DecodeError> {
        let rest = &self.buf[self.pos..];
        let Some(nul) = rest.iter().position(|&b| b == 0) else {
            return self.err("string without NUL terminator");
        };
        let s = std::str::from_utf8(&rest[..nul]).or_else(|_| self.err("string is not valid UTF-8"))?;
        self.pos += nul + 1;
        Ok(s)
    }

    fn tuple(&mut self) -> Result<Tuple<'a>, DecodeError> {
        let n = self.u16()? as usize;
        // Each column takes at least one byte: refuse absurd counts before allocating.
        if n > self.buf.len() - self.pos {
            return self.err(format!("tuple claims {n} columns"));
        }
        let mut cols = Vec::with_capacity(n);
        for _ in 0..n {
            cols.push(match self.u8()? {
                b'n' => TupleValue::Null,
                b'u' => TupleValue::UnchangedToast,
                b't' => {
                    let len = self.u32()? as usize;
                    TupleValue::Text(self.take(len)?)
                }
                b'b' => return self.err("binary tuple values are not requested and not supported"),
                other => return self.err(format!("unknown tuple value kind {:?}", other as char)),
            });
        }
        Ok(cols)
    }

    /// A relation description after its 'R' tag; `limit` bounds the column count.
    fn relation(&mut self, limit: usize) -> Result<Relation, DecodeError> {
        let oid = self.u32()?;
        let namespace = self.cstr()?.to_owned();
        let name = self.cstr()?.to_owned();
        let replica_identity = self.u8()?;
        let n = self.u16()? as usize;
        if n > limit {
            return self.err(format!("relation claims {n} columns"));
        }
        let mut columns = Vec::with_capacity(n);
        for _ in 0..n {
            let flags = self.u8()?;
            columns.push(RelationColumn {
                is_key: flags & 1 == 1,
                name: self.cstr()?.to_owned(),
                type_oid: self.u32()?,
                type_mod: self.i32()?,
            });
        }
        Ok(Relation { oid, namespace, name, replica_identity, columns })
    }

    fn done(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            self.err(format!("{} trailing bytes", self.buf.len() - self.pos))
        }
    }
}

/// Decodes one pgoutput v1 message.
pub fn decode(frame: &[u8]) -> Result<Message<'_>, DecodeError> {
    let mut r = Reader { buf: frame, pos: 0 };
    let tag = r.u8()?;
    let msg = match tag {
        b'B' => Message::Begin { final_lsn: Lsn(r.u64()?), commit_time: r.i64()?, xid: r.u32()? },
        b'C' => {
            Message::Commit { flags: r.u8()?, commit_lsn: Lsn(r.u64()?), end_lsn: Lsn(r.u64()?), commit_time: r.i64()? }
        }
        b'O' => Message::Origin { lsn: Lsn(r.u64()?), name: r.cstr()? },
        b'R' => Message::Relation(r.relation(frame.len())?),
        b'Z' => {
            let (commit_lsn, end_lsn, commit_time) = (Lsn(r.u64()?), Lsn(r.u64()?), r.i64()?);
            let relation = r.relation(frame.len())?;
            let n = r.u32()? as usize;
            if n > frame.len() {
                return r.err(format!("snapshot chunk claims {n} rows"));
            }
            let mut rows = Vec::with_capacity(n);
            for _ in 0..n {
                rows.push(r.tuple()?);
            }
            Message::SnapshotChunk { commit_lsn, end_lsn, commit_time, relation, rows }
        }
        b'Y' => Message::Type { oid: r.u32()?, namespace: r.cstr()?, name: r.cstr()? },
        b'I' => {
            let relation = r.u32()?;
            match r.u8()? {
                b'N' => Message::Insert { relation, new: r.tuple()? },
                other => return r.err(format!("insert: expected 'N', got {:?}", other as char)),
            }
        }
        b'U' => {
            let relation = r.u32()?;
            let mut old = None;
            let mut marker = r.u8()?;
            if marker == b'K' || marker == b'O' {
                let kind = if marker == b'K' { OldKind::Key } else { OldKind::Full };
                old = Some((kind, r.tuple()?));
                marker = r.u8()?;
            }
            if marker != b'N' {
                return r.err(format!("update: expected 'N', got {:?}", marker as char));
            }
            Message::Update { relation, old, new: r.tuple()? }
        }
        b'D' => {
            let relation = r.u32()?;
            let kind = match r.u8()? {
                b'K' => OldKind::Key,
                b'O' => OldKind::Full,
                other => return r.err(format!("delete: expected 'K' or 'O', got {:?}", other as char)),
            };
            Message::Delete { relation, kind, old: r.tuple()? }
        }
        b'T' => {
            let n = r.u32()? as usize;
            let options = r.u8()?;
            if n > frame.len() {
                return r.err(format!("truncate claims {n} relations"));
            }
            let mut relations = Vec::with_capacity(n);
            for _ in 0..n {
                relations.push(r.u32()?);
            }
            Message::Truncate { options, relations }
        }
        b'M' => {
            let flags = r.u8()?;
            let lsn = Lsn(r.u64()?);
            let prefix = r.cstr()?;
            let len = r.u32()? as usize;
            Message::LogicalMessage { transactional: flags & 1 == 1, lsn, prefix, content: r.take(len)? }
        }
        other => return r.err(format!("unknown message type {:?}", other as char)),
    };
    r.done()?;
    Ok(msg)
}

#[cfg(test)]
mod tests;
