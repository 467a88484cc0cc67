//! Shared decoding (`cdc.shared_decoding`): one decoder process decodes the WAL once for every
//! sink into the group's log (`cdc_core::fanout`), and each sink worker reads its tables from it
//! instead of decoding the WAL itself (ARCHITECTURE.md, "Many sinks, one decoding").
//!
//! ```text
//!  decoder ── session on slot _cdc_group ─▶ LogWriter (base/pgsql_tmp/pgsql_tmp_cdc_group.<epoch>/)
//!          └─ publishes (epoch, end, complete_to) here and wakes the members it concerns; confirms
//!             _cdc_group and trims the log at the slowest member's own slot (members more than
//!             cdc.shared_decoding_max_lag behind left out)
//!  member  ── Feed from its delivered position ─▶ its spool ─▶ the read as before
//!          └─ its own slot, held by a fast-forward session, confirmed after each delivery as before
//! ```
//! Shared memory holds what the decoder published and which sinks read it (the members): a
//! member registers when it starts reading the log and leaves when it stops; the decoder counts
//! only live members. A member also registers the tables it carries and its latch: the decoder
//! wakes a member when a publish holds something for it (a change of one of its tables, or a
//! message) and when pg_cdc's catalog changes, so a busy member reads at once and a member whose
//! tables are quiet sleeps through the others' changes (it still reads once a second, or once per
//! `cdc.naptime_ms` when that is longer, to move its position along).
use std::cell::Cell;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cdc_core::fanout::log::{LogEnd, Touched};
use cdc_core::Lsn;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock, PgLwLockExclusiveGuard};

use super::launcher::{alive_as, SINK_WORKER};
use crate::gucs;
use crate::stats::{sink_key, MAX_SINKS};

/// The group's slot.
pub const GROUP_SLOT: &str = "_cdc_group";

/// The decoder's `backend_type` (and the start of its process title).
pub const DECODER: &str = "pg_cdc decoder";

/// The most tables a member registers one by one; one that carries more is woken at every
/// publish, as one that carries every table.
const MEMBER_TABLES: usize = 32;

/// `Member::tables_len` of a member woken at every publish.
const EVERY_TABLE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Member {
    /// The sink id (uuid bytes); all zero when free.
    id: [u8; 16],
    /// The sink worker reading the log for it.
    pid: i32,
    /// Its process's latch (an address in shared memory, the same in every process).
    latch: usize,
    /// Bumped each time the decoder wakes it (it naps until this moves).
    wakes: u64,
    /// How many of `tables` it carries, or [`EVERY_TABLE`].
    tables_len: u32,
    tables: [u32; MEMBER_TABLES],
}

impl Default for Member {
    fn default() -> Self {
        Member { id: [0; 16], pid: 0, latch: 0, wakes: 0, tables_len: EVERY_TABLE, tables: [0; MEMBER_TABLES] }
    }
}

impl Member {
    fn carried(&self) -> Option<&[u32]> {
        (self.tables_len != EVERY_TABLE).then(|| &self.tables[..self.tables_len as usize])
    }
}

#[derive(Clone, Copy)]
struct Group {
    /// The decoder's process (0: none).
    decoder: i32,
    /// The log being written: its number (0: none yet), how far readers may read, and the
    /// position up to which every unit is in it.
    epoch: u64,
    /// The decoder has opened that log and writes it (false from the moment a decoder takes its
    /// place until it opens a log of its own, and after it leaves).
    writing: bool,
    end: LogEnd,
    complete_to: u64,
    /// Bumped at every change of the group (a publish, a new log or decoder, a catalog change):
    /// members looked at it before the decoder woke them (`cdc.test_members_poll_publishes`).
    publishes: u64,
    members: [Member; MAX_SINKS],
}

// SAFETY: plain old data (integers and byte arrays); the latches' addresses are in shared memory,
// mapped at the same address in every process.
unsafe impl PGRXSharedMemory for Group {}

static GROUP: PgLwLock<Group> = unsafe { PgLwLock::new(c"pg_cdc shared decoding") };

/// Reserves the shared memory (from `_PG_init` while preloading).
#[allow(unexpected_cfgs)]
pub fn init() {
    pg_shmem_init!(
        GROUP = Group {
            decoder: 0,
            epoch: 0,
            writing: false,
            end: LogEnd::default(),
            complete_to: 0,
            publishes: 0,
            members: [Member::default(); MAX_SINKS],
        }
    );
}

/// Where the log of `epoch` is written: a directory in PostgreSQL's temporary directory of the
/// default tablespace, which PostgreSQL empties at startup (relative to the data directory).
pub fn log_dir(epoch: u64) -> PathBuf {
    PathBuf::from(format!("base/pgsql_tmp/pgsql_tmp_cdc_group.{epoch}"))
}

/// The log a member may read now.
#[derive(Debug, Clone)]
pub struct Published {
    /// Its number: a new decoder writes a new log.
    pub epoch: u64,
    /// How far it may be read.
    pub end: LogEnd,
    /// Where it is.
    pub dir: PathBuf,
}

/// The group's log, when shared decoding is on and a live decoder has one.
pub fn published() -> Option<Published> {
    if !crate::preloaded() || !gucs::shared_decoding_allowed() {
        return None;
    }
    let (decoder, epoch, writing, end) = {
        let g = GROUP.share();
        (g.decoder, g.epoch, g.writing, g.end)
    };
    (writing && decoder_alive(decoder)).then(|| Published { epoch, end, dir: log_dir(epoch) })
}

/// The decoder process this one last found alive, and when its title was last read.
static SEEN_DECODER: std::sync::Mutex<Option<(i32, Instant)>> = std::sync::Mutex::new(None);

/// How long a decoder found alive is known by its pid alone (a signal 0) before its title is
/// read again (against a pid reused by another process).
const TITLE_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Whether `pid` is a live decoder: [`alive_as`], without reading the process title at every
/// pass of a member.
fn decoder_alive(pid: i32) -> bool {
    let mut seen = SEEN_DECODER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, at)) = *seen {
        // SAFETY: signal 0 only checks that the process exists.
        if p == pid && at.elapsed() < TITLE_CHECK_EVERY && unsafe { libc::kill(pid, 0) } == 0 {
            return true;
        }
    }
    let alive = alive_as(pid, DECODER);
    *seen = alive.then(|| (pid, Instant::now()));
    alive
}

/// How far the log of `epoch` may be read now (`None`: that log is no longer written).
pub fn end_of(epoch: u64) -> Option<LogEnd> {
    let g = GROUP.share();
    (g.writing && g.epoch == epoch).then_some(g.end)
}

/// Changes at every publish of the decoder (see [`Group::publishes`]).
pub fn publishes() -> u64 {
    if !crate::preloaded() {
        return 0;
    }
    GROUP.share().publishes
}

thread_local! {
    /// This process's place among the members, while it is one.
    static MY_PLACE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Changes each time the decoder wakes this process's member (see [`publish`]); 0 when it is none.
pub fn my_wakes() -> u64 {
    let Some(i) = MY_PLACE.get() else { return 0 };
    GROUP.share().members[i].wakes
}

/// Registers this process as reading the log for `sink_id` (`on`), or no longer. A new member
/// is woken at every publish until it says which tables it carries ([`set_member_tables`]).
pub fn set_member(sink_id: &str, on: bool) {
    let Some(key) = sink_key(sink_id) else { return };
    // SAFETY: this process's pid and latch, set at its start: a background worker's latch is its
    // PGPROC's, in shared memory at the same address in every process (a walsender's is
    // published the same way).
    let (me, latch) = unsafe { (pg_sys::MyProcPid, pg_sys::MyLatch as usize) };
    let mut g = GROUP.exclusive();
    for m in g.members.iter_mut().filter(|m| m.id == key) {
        *m = Member::default();
    }
    MY_PLACE.set(None);
    if on {
        if let Some(i) = g.members.iter().position(|m| m.id == [0; 16] || !alive_as(m.pid, SINK_WORKER)) {
            g.members[i] = Member { id: key, pid: me, latch, ..Member::default() };
            MY_PLACE.set(Some(i));
        }
    }
}

/// Registers the tables this process's member carries (`None`: every table): the decoder wakes
/// it for changes of those (and messages) only.
pub fn set_member_tables(carried: Option<&HashSet<u32>>) {
    let Some(i) = MY_PLACE.get() else { return };
    let mut g = GROUP.exclusive();
    let m = &mut g.members[i];
    match carried {
        Some(c) if c.len() <= MEMBER_TABLES => {
            let mut tables: Vec<u32> = c.iter().copied().collect();
            tables.sort_unstable();
            m.tables[..tables.len()].copy_from_slice(&tables);
            m.tables_len = tables.len() as u32;
        }
        _ => m.tables_len = EVERY_TABLE,
    }
}

/// Wakes every member (pg_cdc's catalog changed: a sink added, altered or dropped, a table
/// captured, a snapshot asked for), so that a member whose tables are quiet sees it at once
/// instead of at its next read.
pub fn wake_every_member() {
    if !crate::preloaded() {
        return;
    }
    announce(GROUP.exclusive(), |_| true);
}

/// Ends a change of the group made under its lock (`g`): counts it as a publish, bumps the
/// counters of the members `concerned` picks, and sets their latches once the lock is released.
fn announce(mut g: PgLwLockExclusiveGuard<'_, Group>, concerned: impl Fn(&Member) -> bool) {
    g.publishes += 1;
    let mut latches = Vec::new();
    for m in g.members.iter_mut().filter(|m| m.id != [0; 16]) {
        if concerned(m) {
            m.wakes += 1;
            latches.push(m.latch);
        }
    }
    drop(g);
    for latch in latches.into_iter().filter(|&l| l != 0) {
        // SAFETY: the latch of a PGPROC, in shared memory; a member that exited meanwhile leaves
        // the latch of whichever process has its PGPROC now, which then wakes once for nothing.
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
}

/// The slots of the sinks a live worker reads the log for.
pub fn member_slots() -> Vec<String> {
    let members: Vec<Member> = GROUP.share().members.iter().copied().filter(|m| m.id != [0; 16]).collect();
    members
        .into_iter()
        .filter(|m| alive_as(m.pid, SINK_WORKER))
        .map(|m| crate::api::sinks::slot_name(&pgrx::Uuid::from_bytes(m.id)))
        .collect()
}

/// Claims the decoder's place for this process: false when a live decoder has it.
pub fn claim_decoder() -> bool {
    // SAFETY: this process's pid.
    let me = unsafe { pg_sys::MyProcPid };
    let mut g = GROUP.exclusive();
    if g.decoder != me && alive_as(g.decoder, DECODER) {
        return false;
    }
    g.decoder = me;
    // The log of the decoder before is no longer written; none is until this one opens its own
    // (it may fail to, and members must not take the old one for a live log meanwhile).
    g.writing = false;
    announce(g, |_| true);
    true
}

/// Whether a live decoder runs.
pub fn decoder_running() -> bool {
    if !crate::preloaded() {
        return false;
    }
    let pid = GROUP.share().decoder;
    alive_as(pid, DECODER)
}

/// Starts a new log: its number (members drop the old one at their next read).
pub fn new_epoch() -> u64 {
    let mut g = GROUP.exclusive();
    g.epoch += 1;
    g.writing = true;
    g.end = LogEnd::default();
    g.complete_to = 0;
    let epoch = g.epoch;
    announce(g, |_| true);
    epoch
}

/// Publishes how far the log of `epoch` may be read, and wakes the members whose tables
/// `touched` changed (every member for a message). A member whose tables are quiet is not woken:
/// it reads the log once a second (see `worker::nap`).
pub fn publish(epoch: u64, end: LogEnd, complete_to: Lsn, touched: &Touched) {
    let mut g = GROUP.exclusive();
    if g.epoch != epoch || (g.end == end && g.complete_to == complete_to.0) {
        return;
    }
    g.end = end;
    g.complete_to = complete_to.0;
    announce(g, |m| !touched.is_empty() && touched.concerns(m.carried()));
}

/// The decoder's log is no longer written (its session failed; a new one writes a new log):
/// members leave it and decode their own slots meanwhile.
pub fn close_log() {
    let mut g = GROUP.exclusive();
    if g.writing {
        g.writing = false;
        announce(g, |_| true);
    }
}

/// Gives the decoder's place up (its log is no longer written).
pub fn release_decoder() {
    // SAFETY: this process's pid.
    let me = unsafe { pg_sys::MyProcPid };
    let mut g = GROUP.exclusive();
    if g.decoder == me {
        g.decoder = 0;
        g.writing = false;
        announce(g, |_| true);
    }
}
