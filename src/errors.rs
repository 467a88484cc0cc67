//! The one place a core error becomes a PostgreSQL ERROR.
use cdc_core::{CdcError, ErrorKind};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

/// The error code of a core error kind, from its SQLSTATE (the core is the one list of them):
/// PostgreSQL packs the five characters six bits each (`MAKE_SQLSTATE`).
fn code(kind: ErrorKind) -> PgSqlErrorCode {
    let packed = kind
        .sqlstate()
        .bytes()
        .enumerate()
        .fold(0i32, |acc, (i, c)| acc | ((i32::from(c.wrapping_sub(b'0')) & 0x3F) << (6 * i)));
    PgSqlErrorCode::from(packed)
}

/// Raises `e` as an ERROR with its SQLSTATE, DETAIL and HINT.
pub fn raise(e: CdcError) -> ! {
    let mut report = ErrorReport::new(code(e.kind), e.message, "");
    if let Some(d) = e.detail {
        report = report.set_detail(d);
    }
    if let Some(h) = e.hint {
        report = report.set_hint(h);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

/// Unwraps a core result or raises its error.
pub trait OrRaise<T> {
    /// The value, or an ERROR.
    fn or_raise(self) -> T;
}

impl<T> OrRaise<T> for Result<T, CdcError> {
    fn or_raise(self) -> T {
        match self {
            Ok(v) => v,
            Err(e) => raise(e),
        }
    }
}
