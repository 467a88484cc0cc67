//! User context capture (`include_user_context`, `include_query_text`): a statement trigger on
//! the tables that ask for it emits a sealed logical message with the session's user, session id,
//! client address, application name and (opt-in) statement text, inside the writing transaction
//! and before the statement's rows (see `cdc_core::context`). Tables that do not ask for it get no
//! trigger, so they pay nothing.
use std::ffi::CStr;

use cdc_core::context::{seal, UserContext};
use pgrx::prelude::*;

use crate::catalog;
use crate::keys;

/// Name of the trigger pg_cdc puts on tables that capture user context.
pub const TRIGGER: &str = "_cdc_context";

fn c_string(p: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: PostgreSQL's globals are NULL or point to NUL-terminated strings owned by the backend.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The sealed context message of the current statement (for the `_cdc_context` trigger; not for
/// direct use). `include_query` adds the statement text.
#[pg_extern(volatile, parallel_unsafe)]
fn _cdc_context_message(include_query: bool) -> Vec<u8> {
    let key = keys::context_key().unwrap_or_else(|e| pgrx::error!("pg_cdc: {e}"));
    // NULL over a Unix socket and outside client sessions.
    let client_ip = catalog::select_one::<String>("SELECT host(inet_client_addr())", &[]);
    // SAFETY: backend globals, read on the backend's own thread.
    let ctx = unsafe {
        let user = pg_sys::GetUserNameFromId(pg_sys::GetSessionUserId(), true);
        UserContext {
            user: c_string(user),
            // As log_line_prefix's %c prints it: start time and PID in hex.
            session_id: Some(format!("{:x}.{:x}", { pg_sys::MyStartTime }, { pg_sys::MyProcPid })),
            client_ip,
            application_name: c_string(pg_sys::application_name).filter(|a| !a.is_empty()),
            query: if include_query { c_string(pg_sys::debug_query_string) } else { None },
        }
    };
    // SAFETY: inside the writing statement; assigns the transaction id if it has none yet.
    let xid = unsafe { pg_sys::GetTopTransactionId() };
    seal(&key, u32::from(xid), &ctx)
}

/// Puts the context trigger on a table, or takes it off (`None`).
pub fn set_trigger(qualified: &str, schema: &str, include_query: Option<bool>) {
    let exists = catalog::select_one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2)",
        &[qualified.into(), TRIGGER.into()],
    )
    .unwrap_or(false);
    if exists {
        catalog::run(&format!("DROP TRIGGER {TRIGGER} ON {qualified}"), &[]);
    }
    if let Some(q) = include_query {
        catalog::run(
            &format!(
                "CREATE TRIGGER {TRIGGER} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {qualified} \
                 FOR EACH STATEMENT EXECUTE FUNCTION {schema}._cdc_context_trigger('{q}')"
            ),
            &[],
        );
    }
}
