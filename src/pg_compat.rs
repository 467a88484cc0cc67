//! What differs between the PostgreSQL major versions pg_cdc builds for (15 to 18; 15, 16 and 18
//! are built and tested, see the README's support table): every `cfg(feature = "pgNN")` of the
//! extension is in this file, behind functions that mean the same on each version.
//!
//! - `parseTypeString` reports its errors into a context from 16 on (`missing_ok` before).
//! - `pg_create_logical_replication_slot` and `ReplicationSlotCreate` take `failover` from 17 on,
//!   and `ReplicationSlotCreate` also `synced` from 18 on.
//! - `ReplicationSlotAcquire` takes `error_if_invalid` from 18 on.
//! - Failover slots and `synchronized_standby_slots` exist from 17 on: [`FAILOVER_SLOTS`],
//!   [`standby_bound`].
use pgrx::pg_sys;

/// Whether this build's PostgreSQL has failover slots (17 and later): slots a standby with
/// `sync_replication_slots` keeps in step, so decoding goes on from them after a promotion. Every
/// sink's slot and the shared decoding's are made failover slots there; the ephemeral slots of
/// keyless snapshots are not.
pub const FAILOVER_SLOTS: bool = cfg!(not(any(feature = "pg15", feature = "pg16")));

/// PostgreSQL's `parseTypeString` with an unknown type giving InvalidOid (a malformed one raises
/// PostgreSQL's syntax error, which is the answer).
#[cfg(feature = "pg15")]
pub fn parse_type_string(text: &std::ffi::CStr, oid: &mut pg_sys::Oid, typmod: &mut i32) {
    // SAFETY: a NUL-terminated string and two out-parameters; missing_ok.
    unsafe { pg_sys::parseTypeString(text.as_ptr(), oid, typmod, true) };
}

/// PostgreSQL's `parseTypeString` with an unknown type giving InvalidOid (a malformed one raises
/// PostgreSQL's syntax error, which is the answer). From PostgreSQL 16 it reports its errors
/// softly into a context instead of taking `missing_ok`: every error but "does not exist" is
/// raised again.
#[cfg(not(feature = "pg15"))]
pub fn parse_type_string(text: &std::ffi::CStr, oid: &mut pg_sys::Oid, typmod: &mut i32) {
    let mut context = pg_sys::ErrorSaveContext {
        type_: pg_sys::NodeTag::T_ErrorSaveContext,
        error_occurred: false,
        details_wanted: true,
        error_data: std::ptr::null_mut(),
    };
    // SAFETY: a NUL-terminated string, two out-parameters and an error context on this stack
    // frame, which PostgreSQL fills (its ErrorData palloc'd in the current memory context).
    unsafe {
        let context_node = (&mut context as *mut pg_sys::ErrorSaveContext).cast::<pg_sys::Node>();
        if !pg_sys::parseTypeString(text.as_ptr(), oid, typmod, context_node) {
            *oid = pg_sys::InvalidOid;
            let data = context.error_data;
            let missing = pgrx::PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT as i32;
            if !data.is_null() && (*data).sqlerrcode != missing {
                pg_sys::ThrowErrorData(data);
            }
        }
    }
}

/// The signature of `pg_create_logical_replication_slot` that [`call_create_logical_slot`] calls.
#[cfg(any(feature = "pg15", feature = "pg16"))]
pub const CREATE_LOGICAL_SLOT: &str = "pg_catalog.pg_create_logical_replication_slot(name, name, boolean, boolean)";
/// The signature of `pg_create_logical_replication_slot` that [`call_create_logical_slot`] calls.
#[cfg(not(any(feature = "pg15", feature = "pg16")))]
pub const CREATE_LOGICAL_SLOT: &str =
    "pg_catalog.pg_create_logical_replication_slot(name, name, boolean, boolean, boolean)";

/// Calls `function` ([`CREATE_LOGICAL_SLOT`]) for a persistent slot `name` of `plugin`, not
/// two-phase; a failover slot where PostgreSQL has them ([`FAILOVER_SLOTS`]).
///
/// # Safety
/// `name` and `plugin` are `Name` datums that live for the call; in a transaction.
pub unsafe fn call_create_logical_slot(function: pg_sys::Oid, name: pg_sys::Datum, plugin: pg_sys::Datum) {
    let (temporary, two_phase) = (pg_sys::Datum::from(false), pg_sys::Datum::from(false));
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    pg_sys::OidFunctionCall4Coll(function, pg_sys::InvalidOid, name, plugin, temporary, two_phase);
    #[cfg(not(any(feature = "pg15", feature = "pg16")))]
    pg_sys::OidFunctionCall5Coll(
        function,
        pg_sys::InvalidOid,
        name,
        plugin,
        temporary,
        two_phase,
        pg_sys::Datum::from(FAILOVER_SLOTS),
    );
}

/// Creates an ephemeral logical slot `name` in this database for this process: not two-phase, not
/// a failover slot (PostgreSQL 17's `failover`), not a synchronized one (PostgreSQL 18's `synced`).
///
/// # Safety
/// In a transaction on the main thread, holding no slot; the slot goes when it is released.
pub unsafe fn create_ephemeral_slot(name: &std::ffi::CStr) {
    let ephemeral = pg_sys::ReplicationSlotPersistency::RS_EPHEMERAL;
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    pg_sys::ReplicationSlotCreate(name.as_ptr(), true, ephemeral, false);
    #[cfg(feature = "pg17")]
    pg_sys::ReplicationSlotCreate(name.as_ptr(), true, ephemeral, false, false);
    #[cfg(feature = "pg18")]
    pg_sys::ReplicationSlotCreate(name.as_ptr(), true, ephemeral, false, false, false);
}

/// Acquires replication slot `name` for this process without waiting for it; an invalidated slot
/// is acquired too (PostgreSQL 18 can refuse it instead), and its decoding context says why it
/// cannot be read, as on earlier versions.
///
/// # Safety
/// In a transaction on the main thread, holding no slot.
pub unsafe fn acquire_slot(name: &std::ffi::CStr) {
    #[cfg(not(feature = "pg18"))]
    pg_sys::ReplicationSlotAcquire(name.as_ptr(), true);
    #[cfg(feature = "pg18")]
    pg_sys::ReplicationSlotAcquire(name.as_ptr(), true, false);
}

/// How far the slot this process holds may decode, by `synchronized_standby_slots` (PostgreSQL
/// 17+): for a failover slot while that setting names the physical slots of standbys, the least
/// position those slots confirmed (their restart position, as PostgreSQL reads it); 0 when one of
/// them is missing, logical or invalidated (nothing may be delivered until it is fixed, as
/// PostgreSQL's walsenders wait). `None`: no bound but the flushed WAL.
///
/// PostgreSQL's walsenders and `pg_logical_slot_get_changes` wait for those standbys before they
/// hand out a failover slot's changes, so that a promoted standby never lacks a change a consumer
/// already has. pg_cdc decodes in its own process, past that wait: its reads stop at this bound.
///
/// # Safety
/// On the main thread; reads the slots' shared memory under their locks.
pub unsafe fn standby_bound() -> Option<u64> {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    {
        None
    }
    #[cfg(not(any(feature = "pg15", feature = "pg16")))]
    {
        let mine = pg_sys::MyReplicationSlot;
        if mine.is_null() || !(*mine).data.failover {
            return None;
        }
        let names = standby_slots_setting()?;
        let mut bound: Option<u64> = None;
        for name in standby_slot_names(&names) {
            let confirmed = physical_slot_confirmed(&name).unwrap_or(0);
            bound = Some(bound.map_or(confirmed, |b| b.min(confirmed)));
        }
        bound
    }
}

/// `synchronized_standby_slots` (PostgreSQL 17+) as this process has it; `None` before 17.
pub fn standby_slots_setting() -> Option<String> {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    {
        None
    }
    #[cfg(not(any(feature = "pg15", feature = "pg16")))]
    {
        // SAFETY: a setting of this process (a string PostgreSQL keeps; changed only at reloads,
        // on this thread).
        let setting = unsafe { pg_sys::synchronized_standby_slots };
        if setting.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated string, see above.
        Some(unsafe { std::ffi::CStr::from_ptr(setting) }.to_string_lossy().into_owned())
    }
}

/// The slot names of a `synchronized_standby_slots` value: a comma-separated list, each name
/// possibly double-quoted.
pub fn standby_slot_names(setting: &str) -> Vec<String> {
    setting.split(',').map(|n| n.trim().trim_matches('"').to_string()).filter(|n| !n.is_empty()).collect()
}

/// The restart position of the valid physical slot `name`, if there is one.
///
/// # Safety
/// On the main thread; reads the slot's shared memory under its lock.
#[cfg(not(any(feature = "pg15", feature = "pg16")))]
unsafe fn physical_slot_confirmed(name: &str) -> Option<u64> {
    let c_name = std::ffi::CString::new(name).ok()?;
    let found = pg_sys::SearchNamedReplicationSlot(c_name.as_ptr(), true);
    if found.is_null() {
        return None;
    }
    // The entry may have been dropped (or made again) since the search: its name is read with the
    // rest, under its lock.
    let (in_use, slot_name, database, invalidated, restart) = crate::worker::decoding::with_slot_lock(found, |s| {
        (s.in_use, s.data.name.data, s.data.database, s.data.invalidated, s.data.restart_lsn)
    });
    let same = std::ffi::CStr::from_ptr(slot_name.as_ptr()).to_bytes() == name.as_bytes();
    let valid = invalidated == pg_sys::ReplicationSlotInvalidationCause::RS_INVAL_NONE;
    (in_use && same && database == pg_sys::InvalidOid && valid && restart != 0).then_some(restart)
}
