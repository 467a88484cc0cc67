//! One error type for everything the core rejects, with its SQLSTATE.
//!
//! The extension turns a [`CdcError`] into `ereport(ERROR)` with `kind.sqlstate()`, the message, the
//! detail and the hint. Messages never contain configuration values that may be secrets: they name
//! the JSON path instead.

use std::fmt;

/// The class of an error; each has one SQLSTATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 22023 invalid_parameter_value: bad config (unknown key, wrong type, bad value).
    InvalidParameter,
    /// 0A000 feature_not_supported: a config key or sink type that is planned but not built yet.
    FeatureNotSupported,
    /// 42703 undefined_column.
    UndefinedColumn,
    /// 42P01 undefined_table.
    UndefinedTable,
    /// 42704 undefined_object (a sink that does not exist).
    UndefinedObject,
    /// 42710 duplicate_object (a sink name already taken).
    DuplicateObject,
    /// 42P07 duplicate_table (a table sink's event table exists already).
    DuplicateTable,
    /// 55000 object_not_in_prerequisite_state (server settings, table shape).
    PrerequisiteState,
    /// 42809 wrong_object_type (a view, a foreign table, ...).
    WrongObjectType,
    /// 42601 syntax_error.
    SyntaxError,
    /// 42602 invalid_name.
    InvalidName,
    /// 22004 null_value_not_allowed.
    NullValue,
    /// XX000 internal_error.
    Internal,
    /// 42883 undefined_function: a function or operator that does not exist for the argument types.
    UndefinedFunction,
    /// 42803 grouping_error: an aggregate function where only row-level expressions are allowed.
    GroupingError,
    /// 42P20 windowing_error: a window function where only row-level expressions are allowed.
    WindowingError,
    /// 42P17 invalid_object_definition: a volatile or stable function in an expression that must be
    /// immutable.
    InvalidObjectDefinition,
    /// 42804 datatype_mismatch: an expression of the wrong type (a filter that is not boolean).
    DatatypeMismatch,
    /// 42846 cannot_coerce: a cast between types that have none.
    CannotCoerce,
    /// 42P02 undefined_parameter: `$1` in an expression that takes no parameters.
    UndefinedParameter,
    /// 54001 statement_too_complex: an expression too long or too deeply nested.
    StatementTooComplex,
    /// 22012 division_by_zero.
    DivisionByZero,
    /// 22003 numeric_value_out_of_range.
    NumericOutOfRange,
    /// 22P02 invalid_text_representation: text that is not a valid value of the type.
    InvalidTextRepresentation,
    /// 22007 invalid_datetime_format.
    InvalidDatetimeFormat,
    /// 22008 datetime_field_overflow: a date or time field out of range.
    DatetimeFieldOverflow,
    /// 22025 invalid_escape_sequence: a bad LIKE escape.
    InvalidEscapeSequence,
    /// 22011 substring_error: a negative substring length.
    SubstringError,
    /// 25001 active_sql_transaction: a call that cannot run inside a transaction block.
    ActiveSqlTransaction,
    /// 42501 insufficient_privilege: what a role that is not a superuser may not configure (a
    /// table it may not read, a file outside `cdc.admin_file_dir`, a setting that runs code).
    InsufficientPrivilege,
}

impl ErrorKind {
    /// The five-character SQLSTATE.
    pub fn sqlstate(self) -> &'static str {
        match self {
            ErrorKind::InvalidParameter => "22023",
            ErrorKind::FeatureNotSupported => "0A000",
            ErrorKind::UndefinedColumn => "42703",
            ErrorKind::UndefinedTable => "42P01",
            ErrorKind::UndefinedObject => "42704",
            ErrorKind::DuplicateObject => "42710",
            ErrorKind::DuplicateTable => "42P07",
            ErrorKind::PrerequisiteState => "55000",
            ErrorKind::WrongObjectType => "42809",
            ErrorKind::SyntaxError => "42601",
            ErrorKind::NullValue => "22004",
            ErrorKind::InvalidName => "42602",
            ErrorKind::Internal => "XX000",
            ErrorKind::UndefinedFunction => "42883",
            ErrorKind::GroupingError => "42803",
            ErrorKind::WindowingError => "42P20",
            ErrorKind::InvalidObjectDefinition => "42P17",
            ErrorKind::ActiveSqlTransaction => "25001",
            ErrorKind::InsufficientPrivilege => "42501",
            ErrorKind::DatatypeMismatch => "42804",
            ErrorKind::CannotCoerce => "42846",
            ErrorKind::UndefinedParameter => "42P02",
            ErrorKind::StatementTooComplex => "54001",
            ErrorKind::DivisionByZero => "22012",
            ErrorKind::NumericOutOfRange => "22003",
            ErrorKind::InvalidTextRepresentation => "22P02",
            ErrorKind::InvalidDatetimeFormat => "22007",
            ErrorKind::DatetimeFieldOverflow => "22008",
            ErrorKind::InvalidEscapeSequence => "22025",
            ErrorKind::SubstringError => "22011",
        }
    }
}

/// An error with what a DBA needs to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcError {
    /// Class and SQLSTATE.
    pub kind: ErrorKind,
    /// Primary message.
    pub message: String,
    /// Optional DETAIL.
    pub detail: Option<String>,
    /// Optional HINT.
    pub hint: Option<String>,
}

impl CdcError {
    /// A new error without detail or hint.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        CdcError { kind, message: message.into(), detail: None, hint: None }
    }

    /// Adds a HINT.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Adds a DETAIL.
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

impl fmt::Display for CdcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(d) = &self.detail {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

impl std::error::Error for CdcError {}

/// Result alias.
pub type CdcResult<T> = Result<T, CdcError>;

/// The candidate closest to `word` by edit distance, if it is close enough to be a likely typo.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let w = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (levenshtein(&w, &c.to_ascii_lowercase()), c))
        .filter(|(d, c)| *d <= (c.len().max(w.len()) / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_words_only() {
        let keys = ["include_columns", "exclude_columns", "key_columns"];
        assert_eq!(did_you_mean("include_colums", keys), Some("include_columns"));
        assert_eq!(did_you_mean("KEY_COLUMNS", keys), Some("key_columns"));
        assert_eq!(did_you_mean("banana", keys), None);
    }
}
