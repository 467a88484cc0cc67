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

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cdc_core::deliver::port::ChangeSource;
use cdc_core::deliver::spool::Spool;
use cdc_core::fanout::feed::{Feed, Opened};
use cdc_core::fanout::log::{trimmed_under, LogWriter, SEGMENT_BYTES};
use cdc_core::pipeline::RawFrame;
use cdc_core::types::TypeRegistry;
use cdc_core::Lsn;
use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::prelude::*;

use super::group;
use super::source::{learn_types, recorded_offsets, release_read_turn, take_read_turn, ReadPool, SinkRow, TurnRequest};
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
    /// Set by [`page_read`] when the page asked for is not flushed yet (or past [`READ_BOUND`]).
    static END_OF_WAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// How far the read in progress may go besides the flushed WAL: what the standbys of
    /// `synchronized_standby_slots` confirmed ([`crate::pg_compat::standby_bound`]); `u64::MAX`
    /// for no bound.
    static READ_BOUND: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// Warns, at most once a minute per process, that a slot named in `synchronized_standby_slots` is
/// missing, logical, invalidated or has never held WAL: nothing is delivered until the setting or
/// the slot is fixed (PostgreSQL's walsenders wait the same way, with the same kind of warning).
fn warn_standby_slot_unusable() {
    thread_local! {
        static WARNED: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
    }
    if WARNED.get().is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(60)) {
        return;
    }
    WARNED.set(Some(std::time::Instant::now()));
    let setting = crate::pg_compat::standby_slots_setting().unwrap_or_default();
    pgrx::warning!(
        "pg_cdc: synchronized_standby_slots = '{}' names a slot that no standby confirms WAL through (missing, \
         logical, invalidated or never used): failover slots deliver nothing until it is fixed (create the \
         standby's physical slot and start the standby, or remove the slot from synchronized_standby_slots on \
         the primary)",
        setting
    );
}

/// The end of the WAL a session may read now: the flushed WAL, or less while standbys named in
/// `synchronized_standby_slots` have not confirmed it.
///
/// # Safety
/// On the main thread (GetFlushRecPtr reads shared memory under its spinlock).
unsafe fn readable_end() -> u64 {
    pg_sys::GetFlushRecPtr(null_mut()).min(READ_BOUND.get())
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
        if !pg_sys::RecoveryInProgress() && target_page + req_len as u64 > readable_end() {
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
    /// Where decoded messages go.
    target: Target,
    /// The tables whose changes go on to pgoutput; `None`: all it publishes.
    carried: Option<HashSet<u32>>,
    /// Changes of other tables dropped before pgoutput saw them, not counted yet.
    skipped: u64,
    /// pgoutput's own change and truncate callbacks, which the filters below call.
    change: pg_sys::LogicalDecodeChangeCB,
    truncate: pg_sys::LogicalDecodeTruncateCB,
}

/// Where a session's decoded messages go.
enum Target {
    /// A sink's own session: its spool, what was decoded and not confirmed yet.
    Spool(Spool),
    /// The group's decoder: the group's log.
    Log(LogWriter),
    /// A fast-forward session (a member's own slot, moved without decoding): nothing is written.
    Nowhere,
}

/// What a session decodes for.
pub enum Kind {
    /// A sink's own reads (into its spool).
    Sink,
    /// The group's log, written in this directory.
    Group(PathBuf),
    /// Moving a member's own slot: WAL read without decoding changes (PostgreSQL's fast-forward
    /// mode, what `pg_replication_slot_advance` uses: no output plugin, no reorder buffer of
    /// changes), so the slot's restart position and catalog horizon follow its confirms.
    FastForward,
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
    let frame = RawFrame { lsn: Lsn(lsn), data };
    match &mut out.target {
        Target::Spool(spool) => {
            if let Err(e) = spool.push(frame) {
                pgrx::error!("pg_cdc: cannot write decoded changes to a spill file in {SPOOL_DIR}: {e}");
            }
        }
        Target::Log(log) => {
            if let Err(e) = log.append(&frame) {
                pgrx::error!("pg_cdc: cannot write the shared decoding's log: {e}");
            }
        }
        Target::Nowhere => {}
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
    /// A fast-forward session ([`Kind::FastForward`]).
    fast_forward: bool,
    /// Its slot was moved to the group's position without reading the WAL ([`follow_group`]):
    /// its WAL reader is behind the slot since, and reads nothing more.
    followed: bool,
    /// The read turn a read of a sink's own session takes while it decodes (set by [`ready`]).
    turn: Option<TurnRequest>,
}

impl Session {
    /// Acquires the slot and starts decoding at its restart position (emitting what commits at
    /// or after its confirmed position) for `kind`. Runs in a transaction; on an ERROR the caller
    /// calls [`release_slot`].
    pub fn open(slot: &str, kind: Kind) -> Session {
        let Ok(name) = CString::new(slot) else {
            pgrx::error!("invalid replication slot name {slot}");
        };
        let fast_forward = matches!(kind, Kind::FastForward);
        // Opening the context looks the output plugin and the slot's database up.
        crate::catalog::present_catalog();
        let mut out = Box::new(Output {
            target: match kind {
                Kind::Sink => Target::Spool(Spool::new(SPOOL_MEMORY, SPOOL_DIR)),
                // The log is made once the slot is held (it starts at the slot's position).
                Kind::Group(_) | Kind::FastForward => Target::Nowhere,
            },
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
            crate::pg_compat::acquire_slot(&name);
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
            let ctx = pg_sys::CreateDecodingContext(
                0,
                options,
                fast_forward,
                &mut routine,
                Some(prepare_write),
                Some(write),
                None,
            );
            pg_sys::MemoryContextSwitchTo(old);
            (*ctx).output_writer_private = &mut *out as *mut Output as *mut c_void;
            // The table filter goes in front of pgoutput's change and truncate callbacks (the
            // reorder buffer calls them through the context at each change).
            out.change = (*ctx).callbacks.change_cb.replace(change_filter);
            out.truncate = (*ctx).callbacks.truncate_cb.replace(truncate_filter);
            let slot = pg_sys::MyReplicationSlot;
            pg_sys::XLogBeginRead((*ctx).reader, (*slot).data.restart_lsn);
            if let Kind::Group(dir) = kind {
                match LogWriter::create(&dir, Lsn((*slot).data.confirmed_flush), SEGMENT_BYTES) {
                    Ok(log) => out.target = Target::Log(log),
                    Err(e) => pgrx::error!("pg_cdc: cannot make the shared decoding's log in {}: {e}", dir.display()),
                }
            }
            Session { ctx, memory, out, reread: false, decoded: 0, fast_forward, followed: false, turn: None }
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

    /// Starts a read of a sink's own session: drops what `confirmed` covers (the slot's confirmed
    /// position, or what the sink delivered past it and has not confirmed yet; see
    /// [`Spool::begin_read`]) and reads the rest again from its first message.
    pub fn begin_read(&mut self, confirmed: Lsn) {
        if let Err(e) = self.spool().begin_read(confirmed) {
            pgrx::error!("pg_cdc: cannot read decoded changes back from their spill file: {e}");
        }
    }

    /// The group's log this session writes (the decoder's session).
    pub fn log(&mut self) -> Option<&mut LogWriter> {
        match &mut self.out.target {
            Target::Log(log) => Some(log),
            _ => None,
        }
    }

    /// Decodes flushed WAL into the group's log until `most` bytes of WAL were decoded or none
    /// is left; whether it decoded any.
    pub fn decode_log(&mut self, most: u64) -> bool {
        let before = self.decoded;
        self.decode_while(|_, _, decoded| decoded < most);
        self.decoded > before
    }

    /// Decodes flushed WAL while `more` (the output, the position after the last record read, the
    /// WAL decoded by this call) says so and flushed WAL is left. The backend's catalog caches are
    /// dropped first if ordinary catalog access may have filled them, and are left as decoding
    /// leaves them: the next ordinary access drops them (see `catalog::present_catalog`).
    fn decode_while(&mut self, more: impl Fn(&Output, u64, u64) -> bool) {
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
            let mut decoded = 0;
            let bound =
                if crate::gucs::TEST_IGNORE_STANDBY_SLOTS.get() { None } else { crate::pg_compat::standby_bound() };
            READ_BOUND.set(bound.unwrap_or(u64::MAX));
            if bound == Some(0) {
                warn_standby_slot_unusable();
            }
            while more(&self.out, (*reader).EndRecPtr, decoded) && !super::stop_requested() {
                if (*reader).EndRecPtr >= readable_end() {
                    break;
                }
                crate::catalog::historic_catalog();
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
                decoded += (*reader).EndRecPtr.saturating_sub(start);
                pgrx::check_for_interrupts!();
            }
            pg_sys::MemoryContextSwitchTo(old);
            // Transaction handling inside decoding may have changed it (logicalfuncs.c does this too).
            pg_sys::CurrentResourceOwner = owner;
            if decoded > 0 && crate::gucs::TEST_RESET_CACHES_EACH_READ.get() {
                crate::catalog::present_catalog();
            }
            self.decoded += decoded;
        }
    }

    /// Confirms the slot up to `lsn` (everything before it is delivered); a checkpoint saves it.
    /// A fast-forward session (a member's own slot) takes the group slot's restart position and
    /// catalog horizon when it may ([`follow_group`]); until it first could, it reads the WAL up
    /// to `lsn` (at most to the flushed WAL), as `pg_replication_slot_advance` does. Once it
    /// followed, it reads no more: its slot's restart position waits for the next follow.
    pub fn confirm(&mut self, lsn: Lsn) {
        if self.fast_forward {
            // SAFETY: the session holds its slot (MyReplicationSlot), in a transaction on the
            // main thread.
            self.followed |= unsafe { follow_group(lsn) };
            if !self.followed {
                self.decode_while(|_, read_to, _| read_to < lsn.0);
            }
        }
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

/// Runs `f` on a slot under its spinlock (PostgreSQL's SpinLockAcquire/SpinLockRelease: `s_lock`
/// takes the test-and-set byte, a store of 0 with release ordering gives it back, as `S_UNLOCK`
/// does with GCC's atomics).
/// `f` must only copy fields: nothing may fail while the lock is held.
///
/// # Safety
/// `slot` points into PostgreSQL's array of replication slots.
pub(crate) unsafe fn with_slot_lock<T>(
    slot: *mut pg_sys::ReplicationSlot,
    f: impl FnOnce(&mut pg_sys::ReplicationSlot) -> T,
) -> T {
    let lock = &raw mut (*slot).mutex;
    pg_sys::s_lock(lock, c"pg_cdc decoding.rs".as_ptr(), line!() as c_int, c"with_slot_lock".as_ptr());
    let out = f(&mut *slot);
    std::sync::atomic::AtomicU8::from_ptr(lock).store(0, std::sync::atomic::Ordering::Release);
    out
}

/// Moves this process's slot (a member's own, held by its fast-forward session, about to be
/// confirmed at `lsn`) to the group slot's restart position and catalog horizon, without reading
/// the WAL: what `pg_copy_logical_replication_slot` copies. Decoding from the group's restart
/// position is sound for every transaction committing after the group's confirmed position, so
/// for a slot confirmed at or past it. Only forward: the group's slot must be confirmed at or
/// before `lsn`, its restart position past this slot's and its catalog horizon not behind this
/// slot's; a slot ahead of the group's stays where it is. As PostgreSQL does when a confirm moves a
/// slot, the slot is saved before its catalog horizon takes effect (a crash must not leave a slot
/// on disk older than catalog rows vacuum removed). Returns whether the slot follows the group's
/// now (moved, or ahead and waiting for it): false when the group's slot is missing or confirmed
/// past `lsn` (the member is behind the group).
///
/// Before, each member's slot was moved by reading all the WAL again in fast-forward mode: about
/// a quarter of an idle member's CPU under another table's steady load (measured with perf).
///
/// # Safety
/// The caller holds its slot (MyReplicationSlot), in a transaction on the main thread.
unsafe fn follow_group(lsn: Lsn) -> bool {
    let mine = pg_sys::MyReplicationSlot;
    if mine.is_null() {
        return false;
    }
    let Ok(name) = CString::new(group::GROUP_SLOT) else { return false };
    let found = pg_sys::SearchNamedReplicationSlot(name.as_ptr(), true);
    if found.is_null() || found == mine {
        return false;
    }
    // The entry may have been dropped (or made again) since the search: its name is read with
    // the positions, under its lock.
    let (in_use, slot_name, restart, xmin, confirmed) = with_slot_lock(found, |g| {
        (g.in_use, g.data.name.data, g.data.restart_lsn, g.data.catalog_xmin, g.data.confirmed_flush)
    });
    let is_group = std::ffi::CStr::from_ptr(slot_name.as_ptr()).to_bytes() == group::GROUP_SLOT.as_bytes();
    let usable = in_use
        && is_group
        && confirmed != 0
        && confirmed <= lsn.0
        && restart <= confirmed
        && xmin >= pg_sys::FirstNormalTransactionId;
    if !usable {
        return false;
    }
    // Only this process writes its slot's persistent data: read without the lock.
    let (my_restart, my_xmin) = ((*mine).data.restart_lsn, (*mine).data.catalog_xmin);
    let forward = restart > my_restart
        && (my_xmin == pg_sys::InvalidTransactionId || pg_sys::TransactionIdPrecedesOrEquals(my_xmin, xmin));
    if !forward {
        // Its slot is ahead of the group's already (its own reads moved it): it stays where it
        // is until the group's passes it.
        return true;
    }
    with_slot_lock(mine, |s| {
        s.data.restart_lsn = restart;
        s.data.catalog_xmin = xmin;
        // Candidates its decoding found earlier would move the slot back at the next confirm.
        s.candidate_catalog_xmin = pg_sys::InvalidTransactionId;
        s.candidate_xmin_lsn = 0;
        s.candidate_restart_valid = 0;
        s.candidate_restart_lsn = 0;
    });
    pg_sys::ReplicationSlotMarkDirty();
    pg_sys::ReplicationSlotSave();
    with_slot_lock(mine, |s| s.effective_catalog_xmin = xmin);
    pg_sys::ReplicationSlotsComputeRequiredXmin(false);
    pg_sys::ReplicationSlotsComputeRequiredLSN();
    true
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

/// What a read fetches frames from: a spool, and a way to get more into it.
pub trait Frames {
    /// The spool the read goes through.
    fn spool(&mut self) -> &mut Spool;

    /// The same, to look at.
    fn spool_ref(&self) -> &Spool;

    /// Gets frames into the spool until `want` wait there, the read holds `most`, or there are
    /// no more for now.
    fn produce(&mut self, want: u64, most: u64);
}

impl Frames for Session {
    fn spool(&mut self) -> &mut Spool {
        match &mut self.out.target {
            Target::Spool(spool) => spool,
            _ => pgrx::error!("pg_cdc: a sink read a decoding session that is not its own"),
        }
    }

    fn spool_ref(&self) -> &Spool {
        match &self.out.target {
            Target::Spool(spool) => spool,
            _ => pgrx::error!("pg_cdc: a sink read a decoding session that is not its own"),
        }
    }

    fn produce(&mut self, want: u64, most: u64) {
        // The turn is held while this decodes, and given back before the frames go on to the
        // sink (which may wait on its destination).
        let turn = self.turn.map(take_read_turn);
        self.decode_while(|out, _, _| match &out.target {
            Target::Spool(spool) => spool.available() < want && spool.read_len() < most,
            _ => false,
        });
        if let Some(turn) = turn {
            release_read_turn(turn);
        }
    }
}

/// A member's reads of the group's log: its feed into a spool of its own.
pub struct Shared {
    /// The log's number.
    epoch: u64,
    feed: Box<Feed>,
    spool: Spool,
    /// Log frames read and not counted yet.
    read: u64,
    /// Reads of the log not counted yet.
    reads: u64,
    /// The log no longer holds what this member reads next (it lagged past the bound and the
    /// decoder trimmed a segment it had not reached): the member leaves the log at its next read.
    trimmed: bool,
}

impl Shared {
    /// Changes of tables the sink does not carry dropped, log frames read, reads of the log, and
    /// the WAL the frames read moved it over, since the last call.
    pub fn take_counts(&mut self) -> LogCounts {
        LogCounts {
            skipped: self.feed.take_skipped(),
            frames: std::mem::take(&mut self.read),
            reads: std::mem::take(&mut self.reads),
            wal_bytes: self.feed.take_wal_passed(),
        }
    }
}

/// A member's counts of its reads of the log (see [`Shared::take_counts`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct LogCounts {
    /// Changes of tables the sink does not carry, dropped.
    pub skipped: u64,
    /// Log frames read.
    pub frames: u64,
    /// Reads of the log.
    pub reads: u64,
    /// WAL the frames read moved the sink over.
    pub wal_bytes: u64,
}

/// Frames a member pulls from the log at a time.
const PULL_FRAMES: usize = 4096;

impl Frames for Shared {
    fn spool(&mut self) -> &mut Spool {
        &mut self.spool
    }

    fn spool_ref(&self) -> &Spool {
        &self.spool
    }

    fn produce(&mut self, want: u64, most: u64) {
        // A log no longer written, or trimmed past this member, has nothing more for it; the
        // next read leaves it.
        if self.trimmed {
            return;
        }
        let Some(end) = group::end_of(self.epoch) else { return };
        // Like a session, which emits a transaction whole at its commit, a read holds a transaction
        // it started whole, past `most` if need be (the spool spills what memory does not hold).
        while !self.feed.caught_up(end) {
            let frames = if self.spool.available() < want && self.spool.read_len() < most {
                self.feed.pull(end, PULL_FRAMES)
            } else if self.feed.mid_transaction() {
                // Up to its Commit and no further, however many transactions the log holds after.
                self.feed.finish_transaction(end, PULL_FRAMES)
            } else {
                break;
            };
            let frames = match frames {
                Ok(frames) => frames,
                // The read ends here: its whole transactions go on, a trailing incomplete one is
                // held back and read again from the sink's own slot (the core's read does that
                // whenever a read ends inside a transaction).
                Err(e) if trimmed_under(&e) => {
                    self.trimmed = true;
                    return;
                }
                Err(e) => pgrx::error!("pg_cdc: cannot read the shared decoding's log: {e}"),
            };
            for frame in frames {
                self.read += 1;
                if let Err(e) = self.spool.push(frame) {
                    pgrx::error!("pg_cdc: cannot write decoded changes to a spill file in {SPOOL_DIR}: {e}");
                }
            }
        }
    }
}

/// One read of a session: the core's [`ChangeSource`], up to `most` messages (ending with a whole
/// transaction), and where the sink's progress is recorded.
pub struct SessionRead<'a> {
    /// Where the frames come from.
    pub frames: &'a mut dyn Frames,
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
        if self.frames.spool().available() < count as u64 {
            self.frames.produce((count as u64).max(DECODE_AHEAD), self.most);
        }
        let frames =
            self.frames.spool().fetch(count).unwrap_or_else(|e| {
                pgrx::error!("pg_cdc: cannot read decoded changes back from their spill file: {e}")
            });
        learn_types(&frames, types);
        frames
    }

    fn position(&self) -> u64 {
        self.frames.spool_ref().position()
    }

    fn seek(&mut self, position: u64) {
        self.frames.spool().seek(position);
    }

    fn release_before(&mut self, position: u64) {
        if let Err(e) = self.frames.spool().release_before(position) {
            pgrx::error!("pg_cdc: cannot read decoded changes back from their spill file: {e}");
        }
    }

    fn recorded_offsets(&mut self) -> HashMap<u32, u64> {
        recorded_offsets(self.schema, self.sink_name)
    }
}

/// Whether this process's sink reads the shared decoding's log (its worker naps on the log's
/// publishes instead of the WAL's flushes), registered as a member in shared memory. A worker
/// serves one sink, so this is its [`Membership`]'s too.
static READS_LOG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process's sink reads the shared decoding's log.
pub fn reads_log() -> bool {
    READS_LOG.load(std::sync::atomic::Ordering::Relaxed)
}

/// How long a sink the group's log could not serve waits before it looks again.
const JOIN_RETRY: Duration = Duration::from_secs(1);

/// A sink's part in shared decoding: the log it reads, if it reads one.
#[derive(Default)]
pub struct Membership {
    /// Its reads of the group's log.
    shared: Option<Shared>,
    /// When it last found that the log could not serve it.
    refused: Option<Instant>,
    /// The tables it registered as carried (the decoder wakes it for those), since it joined.
    registered: Option<Option<HashSet<u32>>>,
}

impl Membership {
    /// Stops reading the log (after a failure: the next read opens the feed again from the
    /// delivered position).
    pub fn reset(&mut self) {
        self.shared = None;
    }

    /// Counts of its reads of the log since the last call.
    pub fn take_counts(&mut self) -> LogCounts {
        self.shared.as_mut().map_or_else(LogCounts::default, Shared::take_counts)
    }

    /// Joins the group's log when it can serve `position`, leaves it when it no longer can (or
    /// shared decoding is off, or its decoder gone). Joining gives the sink's own decoding session
    /// up for a fast-forward one on the same slot; leaving drops that, and the sink's next read
    /// decodes its slot again.
    fn update(&mut self, session: &mut Option<Session>, row: &SinkRow, carried: &Option<HashSet<u32>>, position: Lsn) {
        let published = group::published();
        if let (Some(s), Some(p)) = (&self.shared, &published) {
            if s.epoch == p.epoch && !s.trimmed {
                // Its slot may have been given up meanwhile (a keyless table's snapshot).
                if session.is_none() {
                    *session = Some(Session::open(&row.slot, Kind::FastForward));
                }
                return;
            }
        }
        if let Some(left) = self.shared.take() {
            if left.trimmed {
                pgrx::log!(
                    "pg_cdc sink \"{}\": the shared decoding's log no longer holds what it reads next (it lagged more \
                     than cdc.shared_decoding_max_lag behind and the log was trimmed past it): it decodes its own slot \
                     until it can read the log again",
                    row.name
                );
            }
            // Its fast-forward session goes with the log it read.
            *session = None;
            self.refused = None;
        }
        let due = self.refused.is_none_or(|t| t.elapsed() >= JOIN_RETRY);
        let joined = match &published {
            Some(p) if due => match Feed::open(&p.dir, position, p.end, carried.clone()) {
                Ok(Opened::Feed(feed)) => Some((p.epoch, feed)),
                Ok(Opened::Behind | Opened::Missing) => None,
                Err(e) => {
                    pgrx::log!("pg_cdc sink \"{}\": cannot open the shared decoding's log: {e}", row.name);
                    None
                }
            },
            _ => None,
        };
        let Some((epoch, feed)) = joined else {
            if published.is_some() && due {
                self.refused = Some(Instant::now());
            }
            // Registered as a member until now: no longer.
            if READS_LOG.swap(false, std::sync::atomic::Ordering::Relaxed) {
                group::set_member(&row.id, false);
                crate::stats::update(&row.id, |c| c.shared_decoding = 0);
            }
            return;
        };
        // The slot changes hands within this process: its own session first gives it up.
        *session = None;
        *session = Some(Session::open(&row.slot, Kind::FastForward));
        self.shared =
            Some(Shared { epoch, feed, spool: Spool::new(SPOOL_MEMORY, SPOOL_DIR), read: 0, reads: 0, trimmed: false });
        self.refused = None;
        READS_LOG.store(true, std::sync::atomic::Ordering::Relaxed);
        group::set_member(&row.id, true);
        self.registered = None;
        crate::stats::update(&row.id, |c| {
            c.shared_decoding = 1;
            c.shared_joins += 1;
        });
    }
}

/// The sink's source of frames made ready to read from `position`: the group's log when shared
/// decoding serves it (see [`Membership::update`]), else its own decoding session — opened when
/// it has none (and counted), its read turn taken, and only the `carried` tables (all when
/// `None`) reaching pgoutput. Reading (decoding) takes a turn: with many sinks, parallel reads
/// would take the primary's CPU (each slot decodes all WAL); flushing to the destination holds
/// none. A sink that is `delivering` takes its turn apart from those that had nothing to
/// deliver, so idle sinks' reads never queue ahead of it. Reading the log takes none.
pub fn ready<'a>(
    session: &'a mut Option<Session>,
    membership: &'a mut Membership,
    row: &SinkRow,
    carried: Option<HashSet<u32>>,
    position: Lsn,
    delivering: bool,
) -> &'a mut dyn Frames {
    membership.update(session, row, &carried, position);
    if let Some(shared) = membership.shared.as_mut() {
        if membership.registered.as_ref() != Some(&carried) {
            group::set_member_tables(carried.as_ref());
            membership.registered = Some(carried.clone());
        }
        shared.feed.carry_only(carried);
        if let Err(e) = shared.spool.begin_read(position) {
            pgrx::error!("pg_cdc: cannot read decoded changes back from their spill file: {e}");
        }
        shared.reads += 1;
        return shared;
    }
    if session.as_ref().is_some_and(|s| s.fast_forward) {
        *session = None;
    }
    let pool = if delivering { ReadPool::Delivering } else { ReadPool::Idle };
    let turn = TurnRequest { turns: gucs::MAX_CONCURRENT_READS.get(), preferred: read_turn_hint(&row.id), pool };
    let session = match session {
        Some(s) => s,
        None => {
            crate::stats::update(&row.id, |c| c.decoding_sessions += 1);
            session.insert(Session::open(&row.slot, Kind::Sink))
        }
    };
    session.turn = Some(turn);
    session.carry_only(carried);
    session.begin_read(position);
    session
}

/// Which read turn a sink waits for when every turn is taken: spreads the waiters over the turns.
fn read_turn_hint(id: &str) -> u32 {
    id.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
}
