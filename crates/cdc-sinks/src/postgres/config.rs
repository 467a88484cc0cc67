//! The PostgreSQL apply sink's config.
use cdc_core::config::sink::{parse_common, sink_object, Format, SinkCommon};
use cdc_core::object::invalid;
use cdc_core::CdcResult;
use serde_json::Value;

use super::libpq::conninfo_options;

/// A validated apply sink config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresSinkConfig {
    /// The keys every sink takes (tables, checkpoint interval, snapshot mode, ...).
    pub common: SinkCommon,
    /// A libpq connection string or URI. It holds no password: libpq reads it from the password
    /// file (`passfile=`, else `~/.pgpass` of the server's operating system user) or takes the
    /// whole connection from a service file (`service=`).
    pub connection: String,
    /// The schema of the target tables; `None`: the source table's own schema.
    pub schema: Option<String>,
    /// Create a missing target table from the source's schema (else the sink stops with an
    /// error naming it).
    pub create_tables: bool,
    /// How long the memory of a deleted row is kept, in hours: within it, a stale insert or
    /// update of the row (delivered late, or again) cannot bring it back.
    pub tombstone_retention_hours: u32,
    /// The schema of the sink's bookkeeping tables in the target.
    pub state_schema: String,
}

/// The apply sink's own keys (besides [`COMMON_KEYS`](cdc_core::config::sink::COMMON_KEYS)).
pub const KEYS: &[&str] = &["connection", "schema", "create_tables", "tombstone_retention_hours", "state_schema"];

/// Whether `name` is a plain SQL identifier for a schema (letters, digits, `_`, `$`; not starting
/// with a digit; at most 63 bytes; not `pg_...`, which PostgreSQL reserves). It is always quoted in
/// statements.
fn is_identifier(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && !name.to_ascii_lowercase().starts_with("pg_")
        && !name.starts_with(|c: char| c.is_ascii_digit() || c == '$')
        && name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '$')
}

/// Parses and validates an apply sink config.
pub fn parse(config: &Value) -> CdcResult<PostgresSinkConfig> {
    let o = sink_object(config, KEYS)?;
    let connection = o
        .string("connection")?
        .ok_or_else(|| {
            invalid("config.connection is required for a postgres sink").hint(
                "A libpq connection string, e.g. \"host=replica.internal dbname=analytics user=cdc_apply\" \
                 (the password in ~/.pgpass or passfile=...), or \"service=analytics\".",
            )
        })?
        .to_string();
    let options = conninfo_options(&connection, &["password"]).map_err(|e| {
        // libpq's message names the part it could not read; it never repeats a password.
        invalid(format!("config.connection is not a valid connection string: {e}"))
            .hint("Use key=value pairs (host=... dbname=... user=...) or a postgresql:// URI.")
    })?;
    if options.iter().any(|(k, v)| k == "password" && !v.is_empty()) {
        return Err(invalid("config.connection must not hold a password").hint(
            "Put the password in a password file (passfile=/path/to/pgpass, or ~/.pgpass of the server's \
             operating system user), or the whole connection in a service file (service=name).",
        ));
    }
    let common = parse_common(&o)?;
    if common.format != Format::Json {
        return Err(invalid("config.format: a postgres sink applies pg_cdc's JSON events")
            .hint("Remove \"format\": the sink writes rows, not encoded events."));
    }
    if common.partition_key.is_some() {
        return Err(invalid("config.partition_key: a postgres sink applies each row by its table's key")
            .hint("Remove \"partition_key\"; the target table's primary key is the source table's key."));
    }
    let schema = o.string("schema")?.map(str::to_string);
    if let Some(s) = &schema {
        if !is_identifier(s) {
            return Err(invalid(format!("config.schema \"{s}\" is not a plain schema name"))
                .hint("Letters, digits and '_', at most 63 characters, not starting with pg_, as in \"analytics\"."));
        }
    }
    let state_schema = o.string("state_schema")?.unwrap_or("cdc_apply").to_string();
    if !is_identifier(&state_schema) {
        return Err(invalid(format!("config.state_schema \"{state_schema}\" is not a plain schema name"))
            .hint("Letters, digits and '_', at most 63 characters, not starting with pg_; the default is cdc_apply."));
    }
    let create_tables = o.bool("create_tables")?.unwrap_or(true);
    let tombstone_retention_hours = o.int("tombstone_retention_hours", 1, 87_600)?.unwrap_or(168) as u32;
    Ok(PostgresSinkConfig { common, connection, schema, create_tables, tombstone_retention_hours, state_schema })
}
