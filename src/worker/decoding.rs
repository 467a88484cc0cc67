//! A logical decoding session kept open across reads: the sink worker holds its slot and one
//! pgoutput decoding context for as long as it runs, so each WAL record is decoded once, however
//! many reads and confirms go by (ARCHITECTURE.md, "The read path").
//!
//! ```text
//!  WAL ──XLogReadRecord──▶ LogicalDecodingProcessRecord ──pgoutput──▶ write callback ──▶ Spool
//!   (up to the flushed position; never waits)     (whole transactions at their commit)   │
//!                                                                  SessionRead (a ChangeSource)
//!                                                                   fetch / seek / release
//! ```
//! This is what `pg_logical_slot_peek_binary_changes` does inside, without tearing the context
//! down after each call: the same options, the same cache invalidations around decoding, the same
//! WAL page reader (a no-wait wrapper around it), the same confirm (`LogicalConfirmReceivedLocation`,
//! then the slot marked dirty so a checkpoint saves it). A session is dropped after any failure of
//! its read or of its sink (the next read starts a new one at the slot's confirmed position).
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr::null_mut;

use cdc_core::deliver::port::ChangeSource;
use cdc_core::deliver::spool::Spool;
use cdc_core::pipeline::RawFrame;
use cdc_core::types::TypeRegistry;
use cdc_core::Lsn;
use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::prelude::*;

use super::source::{learn_types, recorded_offsets, take_read_turn, ReadPool, SinkRow};
use crate::catalog::PUBLICATION_NAMES;
use crate::gucs;

/// Decoded messages a session keeps in memory before it spills them to a file: a transaction's
/// messages all come out when its commit record is decoded, whatever its size.
const SPOOL_MEMORY: usize = 8 << 20;

/// Messages a session decodes ahead at least when a read wants more (fewer calls, so fewer cache
/// invalidations, per read of a backlog).
const DECODE_AHEAD: u64 = 8192;

/// Where spill files go: PostgreSQL's temporary directory of the default tablespace (relative
/// to the data directory, the worker's working directory), whose `pgsql_tmp*` files it removes
/// at startup.
const SPOOL_DIR: &str = "base/pgsql_tmp";

// PostgreSQL functions the session needs as C function pointers (the WAL reader's routine), or
// that pgrx does not bind (LogicalDecodingProcessRecord, replication/decode.h).
extern "C-unwind" {
    fn wal_segment_open(state: *mut pg_sys::XLogReaderState, seg: pg_sys::XLogSegNo, tli: *mut pg_sys::TimeLineID);
    fn wal_segment_close(state: *mut pg_sys::XLogReaderState);
    fn LogicalDecodingProcessRecord(ctx: *mut pg_sys::LogicalDecodingContext, record: *mut pg_sys::XLogReaderState);
}

thread_local! {
    /// Set by [`page_read`] when the page asked for is not flushed yet.
    static END_OF_WAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The WAL reader's page callback: PostgreSQL's own local reader, except that it never waits for
/// WAL that is not flushed yet (that one sleeps until it is): it reports the end instead, and the
/// session reads on from the same record next time.
#[pg_guard]
extern "C-unwind" fn page_read(
    state: *mut pg_sys::XLogReaderState,
    target_page: pg_sys::XLogRecPtr,
    req_len: c_int,
    target_rec: pg_sys::XLogRecPtr,
    buf: *mut c_char,
) -> c_int {
    // SAFETY: called by the WAL reader on the worker's main thread with its own arguments, which
    // are handed on unchanged; GetFlushRecPtr reads shared memory under its spinlock.
    unsafe {
        if !pg_sys::RecoveryInProgress() && target_page + req_len as u64 > pg_sys::GetFlushRecPtr(null_mut()) {
            END_OF_WAL.set(true);
            return -1;
        }
        pg_sys::read_local_xlog_page(state, target_page, req_len, target_rec, buf)
    }
}

/// The output plugin's prepare-write callback: empties the output buffer.
#[pg_guard]
extern "C-unwind" fn prepare_write(
    ctx: *mut pg_sys::LogicalDecodingContext,
    _lsn: pg_sys::XLogRecPtr,
    _xid: pg_sys::TransactionId,
    _last_write: bool,
) {
    // SAFETY: `ctx` is the session's live decoding context; `out` is its StringInfo.
    unsafe { pg_sys::resetStringInfo((*ctx).out) };
}

/// What a session's decoding context writes to, and which tables it hands to pgoutput: reached
/// from the context's `output_writer_private` by the callbacks below.
struct Output {
    /// What was decoded and not confirmed yet.
    spool: Spool,
    /// The tables whose changes go on to pgoutput; `None`: all it publishes.
    carried: Option<HashSet<u32>>,
    /// Changes of other tables dropped before pgoutput saw them, not counted yet.
    skipped: u64,
    /// pgoutput's own change and truncate callbacks, which the filters below call.
    change: pg_sys::LogicalDecodeChangeCB,
    truncate: pg_sys::LogicalDecodeTruncateCB,
}

/// The session's output of a decoding context.
///
/// # Safety
/// `ctx` is a live context a [`Session`] created: its `output_writer_private` points to the
/// session's boxed [`Output`], which outlives the context (Session::drop frees the context first).
unsafe fn output<'a>(ctx: *mut pg_sys::LogicalDecodingContext) -> &'a mut Output {
    &mut *((*ctx).output_writer_private as *mut Output)
}

/// The output plugin's write callback: one pgoutput message into the session's spool.
#[pg_guard]
extern "C-unwind" fn write(
    ctx: *mut pg_sys::LogicalDecodingContext,
    lsn: pg_sys::XLogRecPtr,
    _xid: pg_sys::TransactionId,
    _last_write: bool,
) {
    // SAFETY: `ctx` is the session's live decoding context: `out` holds `len` bytes written by
    // pgoutput; see `output`.
    let (data, out) = unsafe {
        let buf = &*(*ctx).out;
        (std::slice::from_raw_parts(buf.data as *const u8, buf.len as usize).to_vec(), output(ctx))
    };
    if let Err(e) = out.spool.push(RawFrame { lsn: Lsn(lsn), data }) {
        pgrx::error!("pg_cdc: cannot write decoded changes to a spill file in {SPOOL_DIR}: {e}");
    }
}

impl Output {
    /// Whether changes of table `oid` go on to pgoutput.
    fn carries(&self, oid: pg_sys::Oid) -> bool {
        self.carried.as_ref().is_none_or(|c| c.contains(&oid.to_u32()))
    }
}

/// In front of pgoutput's change callback: a change of a table the sink does not carry goes no
/// further. pgoutput publishes every captured table to every sink (they share the publications); without
/// this, each sink's pgoutput would write out every row of every table (every column through its
/// type's output function) for the worker to drop. pgoutput sends a transaction's BEGIN with its
/// first change and skips the COMMIT of one that sent none, so a transaction with nothing for the
/// sink leaves nothing in its spool.
#[pg_guard]
extern "C-unwind" fn change_filter(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    relation: pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    // SAFETY: called by the reorder buffer with the session's context and an open relation; see
    // `output`. pgoutput's callback gets the arguments unchanged, through pgrx's FFI guard.
    unsafe {
        let out = output(ctx);
        if !out.carries((*relation).rd_id) {
            out.skipped += 1;
            return;
        }
        if let Some(next) = out.change {
            pg_guard_ffi_boundary(|| next(ctx, txn, relation, change));
        }
    }
}

/// In front of pgoutput's truncate callback: a TRUNCATE that names no table the sink carries
/// goes no further (one that names one goes on whole; the worker drops the others).
#[pg_guard]
extern "C-unwind" fn truncate_filter(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    nrelations: c_int,
    relations: *mut pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    // SAFETY: as in `change_filter`; `relations` holds `nrelations` open relations.
    unsafe {
        let out = output(ctx);
        let rels = std::slice::from_raw_parts(relations, nrelations.max(0) as usize);
        if !rels.iter().any(|r| out.carries((**r).rd_id)) {
            out.skipped += 1;
            return;
        }
        if let Some(next) = out.truncate {
            pg_guard_ffi_boundary(|| next(ctx, txn, nrelations, relations, change));
        }
    }
}

/// An open decoding session of one slot.
pub struct Session {
    ctx: *mut pg_sys::LogicalDecodingContext,
    /// The memory context the decoding context and its options live in.
    memory: pg_sys::MemoryContext,
    /// The spool of what was decoded and not confirmed yet, and the table filter (boxed: the
    /// context's callbacks hold its address).
    out: Box<Output>,
    /// The last read stopped inside a record that was not flushed yet: read it from its start.
    reread: bool,
    /// WAL decoded and not counted yet, bytes.
    decoded: u64,
}

impl Session {
    /// Acquires the slot and starts decoding at its restart position (emitting what commits at
    /// or after its confirmed position). Runs in a transaction; on an ERROR the caller calls
    /// [`release_slot`].
    pub fn open(slot: &str) -> Session {
        let Ok(name) = CString::new(slot) else {
            pgrx::error!("invalid replication slot name {slot}");
        };
        let mut out = Box::new(Output {
            spool: Spool::new(SPOOL_MEMORY, SPOOL_DIR),
            carried: None,
            skipped: 0,
            change: None,
            truncate: None,
        });
        // SAFETY: the sequence of pg_logical_slot_get_changes (logicalfuncs.c), in a transaction
        // on the main thread: acquire the slot, create the context in a memory context of its own
        // that outlives transactions, start reading at restart_lsn. Errors raise (the caller
        // releases the slot).
        unsafe {
            pg_sys::CheckLogicalDecodingRequirements();
            pg_sys::ReplicationSlotAcquire(name.as_ptr(), true);
            let memory = pg_sys::AllocSetContextCreateInternal(
                pg_sys::TopMemoryContext,
                c"pg_cdc decoding session".as_ptr(),
                0,
                8 << 10,
                8 << 20,
            );
            let old = pg_sys::MemoryContextSwitchTo(memory);
            let mut options: *mut pg_sys::List = null_mut();
            for (k, v) in [("proto_version", "1"), ("publication_names", PUBLICATION_NAMES), ("messages", "true")] {
                let (k, v) = (pg_sys::pstrdup(cstr(k).as_ptr()), pg_sys::pstrdup(cstr(v).as_ptr()));
                let elem = pg_sys::makeDefElem(k, pg_sys::makeString(v) as *mut pg_sys::Node, -1);
                options = pg_sys::lappend(options, elem as *mut c_void);
            }
            let mut routine = pg_sys::XLogReaderRoutine {
                page_read: Some(page_read),
                segment_open: Some(wal_segment_open),
                segment_close: Some(wal_segment_close),
            };
            let ctx =
                pg_sys::CreateDecodingContext(0, options, false, &mut routine, Some(prepare_write), Some(write), None);
            pg_sys::MemoryContextSwitchTo(old);
            (*ctx).output_writer_private = &mut *out as *mut Output as *mut c_void;
            // The table filter goes in front of pgoutput's change and truncate callbacks (the
            // reorder buffer calls them through the context at each change).
            out.change = (*ctx).callbacks.change_cb.replace(change_filter);
            out.truncate = (*ctx).callbacks.truncate_cb.replace(truncate_filter);
            pg_sys::XLogBeginRead((*ctx).reader, (*pg_sys::MyReplicationSlot).data.restart_lsn);
            Session { ctx, memory, out, reread: false, decoded: 0 }
        }
    }

    /// WAL decoded and changes of tables the sink does not carry skipped, since the last call.
    pub fn take_counts(&mut self) -> (u64, u64) {
        (std::mem::take(&mut self.decoded), std::mem::take(&mut self.out.skipped))
    }

    /// The tables whose changes pgoutput gets from now on (`None`: every table it publishes). The
    /// rest are dropped before pgoutput formats them; what is in the spool already stays.
    pub fn carry_only(&mut self, tables: Option<HashSet<u32>>) {
        self.out.carried = tables;
    }

    /// Starts a read: drops what `confirmed` covers (the slot's confirmed position, or what the
    /// sink delivered past it and has not confirmed yet; see [`Spool::begin_read`]) and reads the
    /// rest again from its first message.
    pub fn begin_read(&mut self, confirmed: Lsn) {
        if let Err(e) = self.out.spool.begin_read(confirmed) {
            pgrx::error!("pg_cdc: cannot read decoded changes back from their spill file: {e}");
        }
    }

    /// Decodes flushed WAL until `want` messages wait in the spool, the read holds `most`, or no
    /// flushed WAL is left. Invalidates the backend's catalog caches before and after, as
    /// `pg_logical_slot_peek_binary_changes` does: entries the worker's own queries built must not
    /// serve a decoding that runs at an earlier point in time, nor the other way round.
    fn decode(&mut self, want: u64, most: u64) {
        // SAFETY: the context is live (the session owns it) and is used on the main thread in a
        // transaction; the reader and the slot are the context's. LogicalDecodingProcessRecord is
        // called through pgrx's FFI guard, so an ERROR in it becomes a Rust panic caught by the
        // caller's transaction (the session is then dropped).
        unsafe {
            let reader = (*self.ctx).reader;
            let owner = pg_sys::CurrentResourceOwner;
            // The WAL reader allocates its decode and record buffers in the current memory context
            // when it first needs them (and an oversized record's), and keeps them: they must
            // outlive the read's transaction. A walsender decodes in long-lived contexts too.
            let old = pg_sys::CurrentMemoryContext;
            let mut invalidated = false;
            while self.out.spool.available() < want && self.out.spool.read_len() < most && !super::stop_requested() {
                if (*reader).EndRecPtr >= pg_sys::GetFlushRecPtr(null_mut()) {
                    break;
                }
                if !invalidated {
                    pg_sys::InvalidateSystemCaches();
                    invalidated = true;
                }
                if self.reread {
                    pg_sys::XLogBeginRead(reader, (*reader).EndRecPtr);
                    self.reread = false;
                }
                END_OF_WAL.set(false);
                // Again before every record: decoding a commit ends a subtransaction of the read's
                // transaction, which leaves that transaction's context current, and a buffer the
                // reader grew there would be freed under it at commit.
                pg_sys::MemoryContextSwitchTo(self.memory);
                let mut errm: *mut c_char = null_mut();
                let start = (*reader).EndRecPtr;
                let record = pg_sys::XLogReadRecord(reader, &mut errm);
                if !errm.is_null() {
                    let msg = std::ffi::CStr::from_ptr(errm).to_string_lossy();
                    pgrx::error!("pg_cdc: could not read WAL for logical decoding: {msg}");
                }
                if record.is_null() {
                    if END_OF_WAL.get() {
                        // The record goes on past the flushed WAL: read it again from its start.
                        self.reread = true;
                        break;
                    }
                    pgrx::error!("pg_cdc: could not read the WAL record at {}", Lsn(start));
                }
                pg_guard_ffi_boundary(|| LogicalDecodingProcessRecord(self.ctx, reader));
                self.decoded += (*reader).EndRecPtr.saturating_sub(start);
                pgrx::check_for_interrupts!();
            }
            pg_sys::MemoryContextSwitchTo(old);
            // Transaction handling inside decoding may have changed it (logicalfuncs.c does this too).
            pg_sys::CurrentResourceOwner = owner;
            if invalidated {
                pg_sys::InvalidateSystemCaches();
            }
        }
    }

    /// Confirms the slot up to `lsn` (everything before it is delivered); a checkpoint saves it.
    pub fn confirm(&mut self, lsn: Lsn) {
        // SAFETY: the session holds the slot (MyReplicationSlot); this is what
        // pg_logical_slot_get_changes does once it has returned the changes.
        unsafe {
            pg_sys::LogicalConfirmReceivedLocation(lsn.0);
            pg_sys::ReplicationSlotMarkDirty();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: frees the context the session created (its shutdown callback, reorder buffer and
        // its spill files, WAL reader), then the memory context it lived in, then gives the slot
        // back; the spool is freed after, once nothing can write to it.
        unsafe {
            pg_sys::FreeDecodingContext(self.ctx);
            pg_sys::MemoryContextDelete(self.memory);
        }
        release_slot();
    }
}

/// Gives the slot this process holds back, if it holds one (after a session failed to open).
pub fn release_slot() {
    // SAFETY: MyReplicationSlot is this process's own; releasing it is what PostgreSQL's error
    // recovery does for a backend.
    unsafe {
        if !pg_sys::MyReplicationSlot.is_null() {
            pg_sys::ReplicationSlotRelease();
        }
    }
}

/// The confirmed position of the slot this process holds, if it holds one.
pub fn held_slot_confirmed() -> Option<Lsn> {
    // SAFETY: MyReplicationSlot is this process's own slot; only the process holding a slot
    // writes its confirmed position, so reading it here races with nothing.
    unsafe {
        let slot = pg_sys::MyReplicationSlot;
        (!slot.is_null()).then(|| Lsn((*slot).data.confirmed_flush))
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

/// One read of a session: the core's [`ChangeSource`], up to `most` messages (ending with a whole
/// transaction), and where the sink's progress is recorded.
pub struct SessionRead<'a> {
    /// The session.
    pub session: &'a mut Session,
    /// The most messages the read decodes (`cdc.batch_changes`); it may end past it by the rest
    /// of the transaction it reached.
    pub most: u64,
    /// The extension's schema (for `_cdc_offsets`).
    pub schema: &'a str,
    /// The sink (its `_cdc_offsets` rows).
    pub sink_name: &'a str,
}

impl ChangeSource for SessionRead<'_> {
    fn fetch(&mut self, count: usize, types: &mut TypeRegistry) -> Vec<RawFrame> {
        if self.session.out.spool.available() < count as u64 {
            self.session.decode((count as u64).max(DECODE_AHEAD), self.most);
        }
        let frames =
            self.session.out.spool.fetch(count).unwrap_or_else(|e| {
                pgrx::error!("pg_cdc: cannot read decoded changes back from their spill file: {e}")
            });
        learn_types(&frames, types);
        frames
    }

    fn position(&self) -> u64 {
        self.session.out.spool.position()
    }

    fn seek(&mut self, position: u64) {
        self.session.out.spool.seek(position);
    }

    fn release_before(&mut self, position: u64) {
        if let Err(e) = self.session.out.spool.release_before(position) {
            pgrx::error!("pg_cdc: cannot read decoded changes back from their spill file: {e}");
        }
    }

    fn recorded_offsets(&mut self) -> HashMap<u32, u64> {
        recorded_offsets(self.schema, self.sink_name)
    }
}

/// The sink's decoding session made ready to read from `position`: opened when it has none (and
/// counted), its read turn taken, and only the `carried` tables (all when `None`) reaching
/// pgoutput. Reading (decoding) takes a turn: with many sinks, parallel reads would take the
/// primary's CPU (each slot decodes all WAL); flushing to the destination holds none. A sink that
/// is `delivering` takes its turn apart from those that had nothing to deliver, so idle sinks'
/// reads never queue ahead of it.
pub fn ready<'a>(
    session: &'a mut Option<Session>,
    row: &SinkRow,
    carried: Option<HashSet<u32>>,
    position: Lsn,
    delivering: bool,
) -> &'a mut Session {
    let pool = if delivering { ReadPool::Delivering } else { ReadPool::Idle };
    take_read_turn(gucs::MAX_CONCURRENT_READS.get(), read_turn_hint(&row.id), pool);
    let session = match session {
        Some(s) => s,
        None => {
            crate::stats::update(&row.id, |c| c.decoding_sessions += 1);
            session.insert(Session::open(&row.slot))
        }
    };
    session.carry_only(carried);
    session.begin_read(position);
    session
}

/// Which read turn a sink waits for when every turn is taken: spreads the waiters over the turns.
fn read_turn_hint(id: &str) -> u32 {
    id.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
}
