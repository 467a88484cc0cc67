//! The SQL surface. Every function validates its whole input before it changes anything, and
//! answers a mistake with a SQLSTATE, the JSON path and a HINT (see `errors`).
pub mod access;
pub mod alter;
pub mod capture;
pub mod context;
pub mod monitor;
pub mod multicloud;
pub mod pause;
pub mod preview;
pub mod rebind;
pub mod reconcile;
pub mod schema;
pub mod sinks;
pub mod snapshots;
pub mod status;
pub mod verify;

use cdc_core::{CdcError, ErrorKind};

use crate::errors::raise;

/// Keeps the calling statement's text out of the server log until the function that asked
/// returns (see [`quiet_statement`]).
#[must_use = "the statement is kept out of the log only while the guard lives"]
pub(crate) struct QuietStatement {
    nest_level: i32,
}

/// Keeps the calling statement out of the server log for the rest of a function that takes a
/// config: its text may hold a secret written inline (a `connection_string`, a password in
/// `properties`). PostgreSQL attaches the client's whole statement to every message at or above
/// `log_min_error_statement` (`error` by default, and LOG ranks above it for the server log), so
/// the LOG line of a slot's consistent point, or the ERROR of a refused config, would write it in
/// clear. This sets `log_min_error_statement = panic` as a function's own `SET` clause does
/// (restored when the guard is dropped on return); after an ERROR it stays in force until the
/// transaction is rolled back, which happens after the ERROR was logged. Call it first, before
/// anything can log or raise.
pub(crate) fn quiet_statement() -> QuietStatement {
    // SAFETY: what fmgr_security_definer does for a function's SET clause: a GUC nesting level,
    // then the setting saved at it (superuser context: pg_cdc sets it, not the caller).
    unsafe {
        let nest_level = pgrx::pg_sys::NewGUCNestLevel();
        crate::catalog::set_at_nest_level(c"log_min_error_statement", c"panic");
        QuietStatement { nest_level }
    }
}

impl Drop for QuietStatement {
    fn drop(&mut self) {
        // While an ERROR unwinds, the setting must stay until PostgreSQL has logged the ERROR
        // (the transaction's rollback restores it afterwards).
        if !std::thread::panicking() {
            // SAFETY: pops the nesting level quiet_statement pushed, as a function's SET clause
            // is undone on return.
            unsafe { pgrx::pg_sys::AtEOXact_GUC(true, self.nest_level) };
        }
    }
}

/// Refuses to configure capture on a server where it could not run.
pub(crate) fn check_prerequisites() {
    let wal_level =
        crate::catalog::select_one::<String>("SELECT current_setting('wal_level')", &[]).unwrap_or_default();
    if wal_level != "logical" {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!("wal_level is \"{wal_level}\", pg_cdc needs \"logical\""),
            )
            .hint("Set wal_level = logical in postgresql.conf and restart PostgreSQL."),
        );
    }
    if !crate::preloaded() {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                "pg_cdc is not loaded through shared_preload_libraries, so its worker is not running",
            )
            .hint("Add pg_cdc to shared_preload_libraries in postgresql.conf and restart PostgreSQL."),
        );
    }
    let encoding = crate::catalog::select_one::<String>(
        "SELECT pg_encoding_to_char(encoding)::text FROM pg_database WHERE datname = current_database()",
        &[],
    )
    .unwrap_or_default();
    if encoding != "UTF8" {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!("database encoding is {encoding}; pg_cdc emits JSON and needs UTF8"),
            )
            .hint("Create the database WITH ENCODING 'UTF8'."),
        );
    }
    let database = crate::catalog::select_one::<String>("SELECT current_database()::text", &[]).unwrap_or_default();
    let worker_db = crate::gucs::string(&crate::gucs::DATABASE);
    if database != worker_db {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!("the pg_cdc worker runs in database \"{worker_db}\", not in \"{database}\""),
            )
            .hint(format!(
                "Use pg_cdc in database \"{worker_db}\", or set cdc.database = '{database}' and restart PostgreSQL."
            )),
        );
    }
}

/// Refuses a NULL argument (the functions are not STRICT, so NULL is an error instead of a silent no-op).
pub(crate) fn required<T>(value: Option<T>, name: &str) -> T {
    value.unwrap_or_else(|| raise(CdcError::new(ErrorKind::NullValue, format!("{name} must not be NULL"))))
}

/// The error for a sink name that names no sink (42704).
pub(crate) fn no_such_sink(name: &str) -> ! {
    raise(
        CdcError::new(ErrorKind::UndefinedObject, format!("sink \"{name}\" does not exist"))
            .hint("SELECT sink_name FROM _cdc_sinks lists the sinks."),
    )
}

/// A table's name as `regclass::text` shows it (schema-qualified when not on the search path).
pub(crate) fn table_display_name(oid: pgrx::pg_sys::Oid) -> String {
    crate::catalog::select_one::<String>("SELECT $1::regclass::text", &[oid.into()]).unwrap_or_default()
}

/// The error for a table that is not captured (42704), naming it as `regclass::text` does.
pub(crate) fn not_captured(oid: pgrx::pg_sys::Oid, hint: &str) -> ! {
    let shown = table_display_name(oid);
    raise(CdcError::new(ErrorKind::UndefinedObject, format!("table {shown} is not captured")).hint(hint))
}

/// The hint of [`not_captured`] for the monitoring functions.
pub(crate) const LIST_CAPTURED: &str = "SELECT table_name FROM _cdc_publications lists the captured tables.";

/// The `_cdc_publications.table_name` of a captured table, or the [`not_captured`] error.
pub(crate) fn captured_table_name(schema: &str, oid: pgrx::pg_sys::Oid) -> String {
    crate::catalog::select_one::<String>(
        &format!("SELECT table_name FROM {schema}._cdc_publications WHERE table_oid = $1"),
        &[oid.into()],
    )
    .unwrap_or_else(|| not_captured(oid, LIST_CAPTURED))
}

/// The catalog schema, or an error when the extension is not installed here.
pub(crate) fn schema() -> String {
    crate::catalog::extension_schema().unwrap_or_else(|| {
        raise(CdcError::new(ErrorKind::PrerequisiteState, "extension pg_cdc is not installed in this database"))
    })
}

/// Runs `f` (read-only SPI) under a new snapshot: in READ COMMITTED it sees what other
/// transactions committed up to now, where the statement's own snapshot is frozen at its start.
pub(crate) fn fresh<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: pushes a snapshot the read-only SPI calls in `f` use and pops it after them; on an
    // ERROR inside `f` the transaction's abort clears the active-snapshot stack.
    unsafe { pgrx::pg_sys::PushActiveSnapshot(pgrx::pg_sys::GetTransactionSnapshot()) };
    let r = f();
    // SAFETY: the snapshot pushed above is still the active one.
    unsafe { pgrx::pg_sys::PopActiveSnapshot() };
    r
}
