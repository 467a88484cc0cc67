//! Who may configure capture. Superusers may do everything. A role granted EXECUTE on the
//! functions (`pg_cdc_admin`, or `pg_monitor` for the monitoring ones) runs them without any
//! right of its own on pg_cdc's catalog, its publications or replication: [`enter`] makes the rest
//! of the call run as the bootstrap superuser, with `search_path` pinned to `pg_catalog, pg_temp`
//! (as a SECURITY DEFINER function's `SET` clause would), after the function checked what such a
//! role may configure:
//!
//! - only tables it may SELECT, whole and without row-level security hiding rows from it
//!   ([`require_select`]): captured, enriched from, carried by its sinks, previewed;
//! - only files inside `cdc.admin_file_dir`, and no librdkafka property that runs code, and a
//!   PostgreSQL sink with its own password file (see `cdc_sinks::delegation`);
//! - what it names (tables in configs, a table sink's event table) is looked up with its own
//!   rights and `search_path` ([`as_caller`]), and a table sink's event table is its own.
//!
//! Why not SECURITY DEFINER: inside one, PostgreSQL no longer tells who called (only the role of
//! the outermost caller, which is wrong when another SECURITY DEFINER function calls pg_cdc).
use std::cell::RefCell;

use cdc_core::{CdcError, ErrorKind};
use pgrx::pg_sys;

use crate::errors::raise;

/// The calling role, and what [`enter`] replaced.
#[derive(Clone)]
struct Entered {
    caller: pg_sys::Oid,
    sec_context: i32,
    search_path: String,
    nest_level: i32,
}

thread_local! {
    /// Set while a call runs as the bootstrap superuser on behalf of a role that is not one.
    static ENTERED: RefCell<Option<Entered>> = const { RefCell::new(None) };
}

/// The role calling pg_cdc: the one [`enter`] stood in for, else the current one.
pub(crate) fn caller() -> pg_sys::Oid {
    ENTERED.with(|e| e.borrow().as_ref().map(|e| e.caller)).unwrap_or_else(|| {
        // SAFETY: reads the current user id.
        unsafe { pg_sys::GetUserId() }
    })
}

/// Whether the calling role is a superuser.
pub(crate) fn caller_is_superuser() -> bool {
    // SAFETY: a catalog lookup of a role id.
    unsafe { pg_sys::superuser_arg(caller()) }
}

/// While alive, the call runs as the bootstrap superuser (see the module comment); dropped when
/// the function returns. After an ERROR, the transaction's (or subtransaction's) abort restores
/// the user and `search_path`, as it does for SECURITY DEFINER functions.
#[must_use = "the call runs as the superuser only while the guard lives"]
pub(crate) struct Entry {
    outermost: bool,
}

/// Lets the rest of the call use pg_cdc's catalog, publications and slots for a caller that is
/// not a superuser (a superuser's call is unchanged). Call it after the checks that need the
/// caller's own rights, or use [`as_caller`] for them.
pub(crate) fn enter() -> Entry {
    if caller_is_superuser() || ENTERED.with(|e| e.borrow().is_some()) {
        return Entry { outermost: false };
    }
    let mut user = pg_sys::InvalidOid;
    let mut sec_context = 0;
    // SAFETY: what fmgr_security_definer does: the user id and security context, then the
    // function's own `SET search_path` at a new GUC nesting level.
    let entered = unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut sec_context);
        let search_path = current_search_path();
        let nest_level = pg_sys::NewGUCNestLevel();
        crate::catalog::set_at_nest_level(c"search_path", c"pg_catalog, pg_temp");
        pg_sys::SetUserIdAndSecContext(
            pg_sys::Oid::from(pg_sys::BOOTSTRAP_SUPERUSERID),
            sec_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
        );
        Entered { caller: user, sec_context, search_path, nest_level }
    };
    ENTERED.with(|e| *e.borrow_mut() = Some(entered));
    Entry { outermost: true }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if !self.outermost {
            return;
        }
        let Some(entered) = ENTERED.with(|e| e.borrow_mut().take()) else { return };
        // While an ERROR unwinds, the abort restores both (and must log the ERROR first).
        if !std::thread::panicking() {
            // SAFETY: undoes what enter() did, in reverse order.
            unsafe {
                pg_sys::SetUserIdAndSecContext(entered.caller, entered.sec_context);
                pg_sys::AtEOXact_GUC(true, entered.nest_level);
            }
        }
    }
}

/// Runs `f` with the caller's own rights and `search_path` (to look up the names it gave, and to
/// create what it owns); unchanged when the call did not [`enter`].
pub(crate) fn as_caller<R>(f: impl FnOnce() -> R) -> R {
    let Some(entered) = ENTERED.with(|e| e.borrow().clone()) else { return f() };
    let path = std::ffi::CString::new(entered.search_path).unwrap_or_default();
    // SAFETY: the caller's search_path at a nesting level of its own, popped after `f`.
    let nest_level = unsafe {
        let nest_level = pg_sys::NewGUCNestLevel();
        crate::catalog::set_at_nest_level(c"search_path", &path);
        nest_level
    };
    let out = crate::catalog::as_user(entered.caller, false, f);
    // SAFETY: back to the pinned search_path.
    unsafe { pg_sys::AtEOXact_GUC(true, nest_level) };
    out
}

/// The caller's name, for the `..._by` columns of the catalog (`current_user` would name the
/// bootstrap superuser inside [`enter`]).
pub(crate) fn caller_name() -> String {
    // SAFETY: a role id that exists (the caller's); noerr false raises otherwise.
    let name = unsafe { pg_sys::GetUserNameFromId(caller(), false) };
    // SAFETY: a palloc'd C string.
    unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// `search_path` as the session has it now.
unsafe fn current_search_path() -> String {
    // SAFETY: returns a palloc'd copy of the setting's value.
    let v = unsafe { pg_sys::GetConfigOptionByName(c"search_path".as_ptr(), std::ptr::null_mut(), false) };
    if v.is_null() {
        return String::new();
    }
    // SAFETY: a C string.
    unsafe { std::ffi::CStr::from_ptr(v) }.to_string_lossy().into_owned()
}

/// Refuses a table the caller may not read whole (42501): no SELECT on the table itself (column
/// privileges are not enough), or row-level security that hides rows from it. `what` says what it
/// wanted the table for. Nothing to check for a superuser.
pub(crate) fn require_select(oid: pg_sys::Oid, what: &str) {
    if caller_is_superuser() {
        return;
    }
    let role = caller();
    // SAFETY: privilege and policy checks of an existing relation (the caller resolved it).
    let (granted, rls) = unsafe {
        (
            pg_sys::pg_class_aclcheck(oid, role, pg_sys::ACL_SELECT as pg_sys::AclMode)
                == pg_sys::AclResult::ACLCHECK_OK,
            pg_sys::check_enable_rls(oid, role, true) as u32 == pg_sys::CheckEnableRlsResult::RLS_ENABLED,
        )
    };
    let shown = as_caller(|| super::table_display_name(oid));
    if !granted {
        raise(
            CdcError::new(
                ErrorKind::InsufficientPrivilege,
                format!("permission denied to {what} {shown}: role {} may not SELECT it", caller_name()),
            )
            .hint("A role that is not a superuser captures, enriches from and carries only tables it may read: GRANT SELECT on the table first."),
        );
    }
    if rls {
        raise(
            CdcError::new(
                ErrorKind::InsufficientPrivilege,
                format!(
                    "permission denied to {what} {shown}: its row-level security hides rows from role {}",
                    caller_name()
                ),
            )
            .hint(
                "Capture would stream every row: a superuser, the table's owner or a role with BYPASSRLS must do this.",
            ),
        );
    }
}

/// Refuses (42501) what a caller that is not a superuser may not put in a sink config: code-running
/// properties, files outside `cdc.admin_file_dir`, a PostgreSQL connection without its own password file.
pub(crate) fn check_sink_config(cfg: &cdc_sinks::registry::SinkConfig) {
    if caller_is_superuser() {
        return;
    }
    use crate::errors::OrRaise;
    cdc_sinks::delegation::check_config(cfg).or_raise();
    let dir = crate::gucs::string(&crate::gucs::ADMIN_FILE_DIR);
    for (path, file) in cdc_sinks::delegation::file_paths(cfg).or_raise() {
        cdc_sinks::delegation::confine(Some(&dir), &path, &file).or_raise();
    }
}
