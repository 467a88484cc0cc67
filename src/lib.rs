//! pg_cdc: change data capture inside PostgreSQL.
//!
//! This crate is the thin PostgreSQL shell around the pure core (`cdc-core`) and the sinks
//! (`cdc-sinks`):
//! - [`api`]: the SQL functions (`cdc_enable`, `cdc_add_sink`, ...) and their validation;
//! - [`catalog`]: reading table shapes and the extension's catalog through SPI;
//! - [`worker`]: the background worker that reads each sink's slot and publishes;
//! - [`gucs`]: every `cdc.*` setting;
//! - [`stats`]: per-sink delivery counters in shared memory;
//! - [`keys`]: the tokenization key and the context key, both in files;
//! - [`lookups`]: each sink's copies of the lookup tables `enrich` reads;
//! - [`errors`]: `CdcError` to `ereport(ERROR)` with its SQLSTATE.
use pgrx::prelude::*;

pub mod api;
pub mod catalog;
pub mod errors;
pub mod gucs;
pub mod keys;
pub mod lookups;
pub mod pg_compat;
pub mod stats;
pub mod worker;

::pgrx::pg_module_magic!();

extension_sql_file!("../sql/bootstrap.sql", name = "bootstrap", bootstrap);
extension_sql_file!("../sql/finalize.sql", name = "finalize", finalize);

/// Set when the library was loaded by `shared_preload_libraries` (inherited by every backend
/// forked from the postmaster); the SQL functions refuse to configure capture without it,
/// because no worker would run.
static PRELOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether pg_cdc was preloaded, so its background worker runs.
pub fn preloaded() -> bool {
    PRELOADED.load(std::sync::atomic::Ordering::Relaxed)
}

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: plain globals the postmaster sets before it loads shared_preload_libraries (and that
    // every backend forked from it inherits).
    let (preloading, binary_upgrade) =
        unsafe { (pg_sys::process_shared_preload_libraries_in_progress, pg_sys::IsBinaryUpgrade) };
    gucs::init(preloading);
    if preloading {
        PRELOADED.store(true, std::sync::atomic::Ordering::Relaxed);
        stats::init();
        worker::launcher::init();
        worker::group::init();
        // A server pg_upgrade runs (binary-upgrade mode, old or new) must not deliver, nor hold a
        // connection to a database pg_upgrade restores (it would fail "being accessed by other
        // users"): no worker there. The server started afterwards runs them.
        if !binary_upgrade {
            worker::register();
        }
    }
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["wal_level = 'logical'", "shared_preload_libraries = 'pg_cdc'"]
    }
}
