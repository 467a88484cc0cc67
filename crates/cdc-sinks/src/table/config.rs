//! The in-database sink's config.
use cdc_core::config::is_qualified_name;
use cdc_core::config::sink::{parse_common, sink_object, SinkCommon};
use cdc_core::object::invalid;
use cdc_core::{CdcError, CdcResult, ErrorKind};
use serde_json::Value;

/// A validated in-database sink config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSinkConfig {
    /// The keys every sink takes (tables, format, partition key, ...).
    pub common: SinkCommon,
    /// The event table, as SQL writes it (`cdc_events`, `app."Events"`); `cdc_add_sink` creates it.
    pub table: String,
    /// Events older than this many hours are removed (default 168, a week).
    pub retention_hours: u32,
    /// At most this many events are kept: the oldest beyond it are removed (default: no limit).
    pub retention_events: Option<u64>,
}

/// The in-database sink's own keys (besides [`COMMON_KEYS`]).
pub const KEYS: &[&str] = &["table", "retention_hours", "retention_events", "exactly_once"];

/// Default `retention_hours`.
pub const DEFAULT_RETENTION_HOURS: u32 = 168;

/// Parses and validates an in-database sink config.
pub fn parse(config: &Value) -> CdcResult<TableSinkConfig> {
    let o = sink_object(config, KEYS)?;
    let table = o
        .string("table")?
        .ok_or_else(|| {
            invalid("config.table is required for a table sink")
                .hint("Add \"table\": \"cdc_events\": pg_cdc creates that table and writes the events into it.")
        })?
        .to_string();
    if !is_qualified_name(&table) {
        return Err(CdcError::new(
            ErrorKind::InvalidName,
            format!("config.table: \"{table}\" is not a valid table name"),
        )
        .hint("Write it as in SQL: cdc_events, app.cdc_events, or \"Mixed Case\"."));
    }
    if o.bool("exactly_once")? == Some(false) {
        return Err(invalid("config.exactly_once: a table sink is always exactly-once")
            .hint("Its events and its progress are written in one transaction; leave \"exactly_once\" out."));
    }
    let common = parse_common(&o)?;
    let retention_hours = o.int("retention_hours", 1, 87_600)?.map_or(DEFAULT_RETENTION_HOURS, |h| h as u32);
    let retention_events = o.int("retention_events", 1, i64::MAX)?.map(|n| n as u64);
    Ok(TableSinkConfig { common, table, retention_hours, retention_events })
}
