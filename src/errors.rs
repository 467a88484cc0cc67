//! The one place a core error becomes a PostgreSQL ERROR.
use cdc_core::{CdcError, ErrorKind};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

fn code(kind: ErrorKind) -> PgSqlErrorCode {
    use PgSqlErrorCode::*;
    match kind {
        ErrorKind::InvalidParameter => ERRCODE_INVALID_PARAMETER_VALUE,
        ErrorKind::FeatureNotSupported => ERRCODE_FEATURE_NOT_SUPPORTED,
        ErrorKind::UndefinedColumn => ERRCODE_UNDEFINED_COLUMN,
        ErrorKind::UndefinedTable => ERRCODE_UNDEFINED_TABLE,
        ErrorKind::UndefinedObject => ERRCODE_UNDEFINED_OBJECT,
        ErrorKind::DuplicateObject => ERRCODE_DUPLICATE_OBJECT,
        ErrorKind::PrerequisiteState => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        ErrorKind::WrongObjectType => ERRCODE_WRONG_OBJECT_TYPE,
        ErrorKind::SyntaxError => ERRCODE_SYNTAX_ERROR,
        ErrorKind::NullValue => ERRCODE_NULL_VALUE_NOT_ALLOWED,
        ErrorKind::InvalidName => ERRCODE_INVALID_NAME,
        ErrorKind::Internal => ERRCODE_INTERNAL_ERROR,
    }
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
