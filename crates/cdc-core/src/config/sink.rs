//! What every sink config shares, whatever its type: the tables it carries, whether events carry
//! the tables' transformations, how long one delivery unit may stay open, a sink-level partition
//! key and the event format. Each sink type parses its own keys (`cdc-sinks`, one folder per sink)
//! and these with [`parse_common`].
use serde_json::Value;

use super::CaptureConfig;
use crate::error::CdcResult;
use crate::object::{invalid, Obj};

/// The event encoding of a sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// pg_cdc's JSON event (metadata, before, after, diff).
    Json,
    /// The same event as an Avro record in Confluent's wire format (a magic byte and the schema
    /// id a schema registry gave, then the Avro binary), keys too.
    Avro,
    /// Debezium's change event (`before`, `after`, `source`, `op`, `ts_ms`) and key, as
    /// Debezium's PostgreSQL connector and Kafka Connect's JSON converter write them (see
    /// [`DebeziumOptions`]).
    Debezium,
    /// The event as a `pg_cdc.v1.Event` message of the published contract
    /// (`proto/pg_cdc/v1/event.proto`), its key a `pg_cdc.v1.Row`; in Confluent's wire format
    /// when a schema registry is set.
    Protobuf,
}

impl Format {
    /// The name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Avro => "avro",
            Format::Debezium => "debezium",
            Format::Protobuf => "protobuf",
        }
    }
}

/// How Debezium's connector writes decimals (`decimal.handling.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecimalHandling {
    /// Exact: Kafka Connect's `Decimal` (`numeric(p, s)`, `money`) or Debezium's
    /// `VariableScaleDecimal` (unconstrained `numeric`); NaN and the infinities are null.
    Precise,
    /// The exact decimal text; NaN and the infinities are `NAN`, `POSITIVE_INFINITY`,
    /// `NEGATIVE_INFINITY`.
    String,
    /// A double (rounded); NaN and the infinities as JSON writes doubles: `"NaN"`, `"Infinity"`.
    Double,
}

/// The `debezium` object of a sink config with `"format": "debezium"`: Debezium's settings of the
/// same names, with Debezium's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebeziumOptions {
    /// `topic_prefix` (Debezium's `topic.prefix`): `source.name` and the schemas' names
    /// (`<prefix>.<schema>.<table>.Value`); `None`: the database's name.
    pub topic_prefix: Option<String>,
    /// `schemas` (the JSON converter's `schemas.enable`, default true): each key and value is
    /// `{"schema": ..., "payload": ...}`; false: the payload alone.
    pub schemas: bool,
    /// `decimal_handling_mode` (default precise).
    pub decimal_handling_mode: DecimalHandling,
    /// `tombstones_on_delete` (default true): a record with the row's key and no value follows
    /// each DELETE event.
    pub tombstones_on_delete: bool,
    /// `converter` (default json): how keys and values are serialized, as Kafka Connect's
    /// converter setting chooses.
    pub converter: DebeziumConverter,
}

/// How the Debezium format serializes keys and values (Kafka Connect's `key.converter` and
/// `value.converter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebeziumConverter {
    /// Connect's JSON converter (`schemas` chooses the schema block).
    Json,
    /// Connect's Avro converter: the Avro schema Connect's AvroData makes of the Connect schema,
    /// registered with the schema registry, and Confluent's wire format.
    Avro,
}

impl Default for DebeziumOptions {
    fn default() -> Self {
        DebeziumOptions {
            topic_prefix: None,
            schemas: true,
            decimal_handling_mode: DecimalHandling::Precise,
            tombstones_on_delete: true,
            converter: DebeziumConverter::Json,
        }
    }
}

/// What a new sink delivers of the rows its tables hold already (`snapshot_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotMode {
    /// Every row of its tables as a READ event, then the changes (the default).
    Initial,
    /// Only changes made after its slot exists.
    Never,
    /// Every row of its tables as a READ event and the changes committed while they are read,
    /// then nothing more: the sink finishes and drops its slot (a one-off copy).
    InitialOnly,
}

impl SnapshotMode {
    /// The name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotMode::Initial => "initial",
            SnapshotMode::Never => "never",
            SnapshotMode::InitialOnly => "initial_only",
        }
    }

    /// Whether a new sink starts with the rows its tables hold.
    pub fn snapshots(self) -> bool {
        self != SnapshotMode::Never
    }
}

/// Rows one snapshot chunk reads when the config does not say (`snapshot_chunk_size`). Measured
/// (`make bench-snapshot`, 1M rows of about 200 bytes to Kafka, same session): 4096 rows 114-122k
/// rows/s, 8192 145k, 16384 136-158k with the worker's memory peaking at 18, 28 and 43 MiB.
pub const DEFAULT_SNAPSHOT_CHUNK_SIZE: u32 = 8192;

/// The keys every sink type takes.
pub const COMMON_KEYS: &[&str] = &[
    "tables",
    "include_transformations",
    "checkpoint_interval_ms",
    "partition_key",
    "format",
    "schema_registry",
    "debezium",
    "snapshot_mode",
    "snapshot_chunk_size",
];

/// The keys every sink type takes, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkCommon {
    /// Table names this sink is limited to (`None`: every captured table); the caller resolves them.
    pub tables: Option<Vec<String>>,
    /// Events carry the tables' computed and enriched columns (default true). Masks and PII
    /// redaction apply whatever this says.
    pub include_transformations: bool,
    /// `checkpoint_interval_ms`: the longest one delivery unit stays open (see
    /// [`checkpoint_interval`]).
    pub checkpoint_interval_ms: Option<u32>,
    /// `partition_key`: the column that keys this sink's events, instead of the capture config's
    /// `partition_key` or key columns, in every table that has it (the others keep their own key).
    pub partition_key: Option<String>,
    /// Event encoding.
    pub format: Format,
    /// `schema_registry`: the registry the Avro format registers its schemas with (see
    /// [`crate::config::registry_url`]); `None`: the table's `schema_evolution.schema_registry`,
    /// then the server setting.
    pub schema_registry: Option<String>,
    /// `debezium`: the Debezium format's settings (defaults when the format is another).
    pub debezium: DebeziumOptions,
    /// `snapshot_mode`: whether a new sink starts with the rows its tables hold.
    pub snapshot_mode: SnapshotMode,
    /// `snapshot_chunk_size`: rows per snapshot chunk (each is read in one query, held in memory
    /// until the stream reaches its watermark, and delivered as one transaction).
    pub snapshot_chunk_size: u32,
}

/// A sink config's object, its keys checked against the type's own keys and [`COMMON_KEYS`]
/// (an unknown key is 22023 with a "did you mean" hint).
pub fn sink_object<'a>(config: &'a Value, own_keys: &[&str]) -> CdcResult<Obj<'a>> {
    let o = Obj::root("config", config)?;
    let known: Vec<&str> = own_keys.iter().chain(COMMON_KEYS).copied().collect();
    o.check_keys(&known)?;
    Ok(o)
}

/// Parses the keys of [`COMMON_KEYS`] in a sink config (the caller checks for unknown keys).
pub fn parse_common(o: &Obj<'_>) -> CdcResult<SinkCommon> {
    let format = match o.string("format")?.unwrap_or("json") {
        "json" => Format::Json,
        "avro" => Format::Avro,
        "debezium" => Format::Debezium,
        "protobuf" => Format::Protobuf,
        other => {
            return Err(invalid(format!("config.format: unknown format \"{other}\""))
                .hint("Valid formats: json, debezium, avro, protobuf."))
        }
    };
    let schema_registry =
        o.string("schema_registry")?.map(|url| super::registry_url("config.schema_registry", url)).transpose()?;
    let debezium = match o.object("debezium")? {
        None => DebeziumOptions::default(),
        Some(_) if format != Format::Debezium => {
            return Err(invalid(format!(
                "config.debezium sets the debezium format, and this sink's format is {}",
                format.as_str()
            ))
            .hint("Add \"format\": \"debezium\", or leave \"debezium\" out."))
        }
        Some(d) => parse_debezium(&d)?,
    };
    let registered = matches!(format, Format::Avro | Format::Protobuf)
        || (format == Format::Debezium && debezium.converter == DebeziumConverter::Avro);
    if schema_registry.is_some() && !registered {
        return Err(invalid(format!(
            "config.schema_registry is used by the avro and protobuf formats (and debezium's avro converter) only, \
             and this sink's format is {}",
            format.as_str()
        ))
        .hint("Add \"format\": \"avro\" (or \"protobuf\"), or leave \"schema_registry\" out."));
    }
    let partition_key = o.string("partition_key")?.map(str::to_string);
    let include_transformations = o.bool("include_transformations")?.unwrap_or(true);
    let checkpoint_interval_ms = o.int("checkpoint_interval_ms", 1, 3_600_000)?.map(|v| v as u32);
    let tables = o.strings("tables")?;
    if tables.as_ref().is_some_and(Vec::is_empty) {
        return Err(invalid("config.tables must list at least one table")
            .hint("Leave \"tables\" out to deliver every captured table."));
    }
    let snapshot_mode = match o.string("snapshot_mode")?.unwrap_or("initial") {
        "initial" => SnapshotMode::Initial,
        "never" => SnapshotMode::Never,
        "initial_only" => SnapshotMode::InitialOnly,
        other => {
            return Err(invalid(format!("config.snapshot_mode: unknown mode \"{other}\""))
                .hint("Valid modes: initial (the default), initial_only, never."))
        }
    };
    let snapshot_chunk_size =
        o.int("snapshot_chunk_size", 1, 1_000_000)?.map_or(DEFAULT_SNAPSHOT_CHUNK_SIZE, |v| v as u32);
    Ok(SinkCommon {
        tables,
        include_transformations,
        checkpoint_interval_ms,
        partition_key,
        format,
        schema_registry,
        debezium,
        snapshot_mode,
        snapshot_chunk_size,
    })
}

fn parse_debezium(d: &Obj<'_>) -> CdcResult<DebeziumOptions> {
    d.check_keys(&["topic_prefix", "schemas", "decimal_handling_mode", "tombstones_on_delete", "converter"])?;
    let converter = match d.string("converter")?.unwrap_or("json") {
        "json" => DebeziumConverter::Json,
        "avro" => DebeziumConverter::Avro,
        other => {
            return Err(invalid(format!("{}: unknown converter \"{other}\"", d.child_path("converter")))
                .hint("Valid converters: json (the default), avro."))
        }
    };
    if converter == DebeziumConverter::Avro && d.bool("schemas")?.is_some() {
        return Err(invalid(format!(
            "{} is the JSON converter's setting: the avro converter's schemas are in the registry",
            d.child_path("schemas")
        ))
        .hint("Leave \"schemas\" out with \"converter\": \"avro\"."));
    }
    let topic_prefix = match d.string("topic_prefix")? {
        Some(p) if p.is_empty() || !p.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) => {
            return Err(invalid(format!("{}: \"{p}\" is not a topic prefix", d.child_path("topic_prefix")))
                .hint("Use letters, digits, '.', '_' and '-', as Debezium's topic.prefix does."))
        }
        p => p.map(str::to_string),
    };
    let decimal_handling_mode = match d.string("decimal_handling_mode")?.unwrap_or("precise") {
        "precise" => DecimalHandling::Precise,
        "string" => DecimalHandling::String,
        "double" => DecimalHandling::Double,
        other => {
            return Err(invalid(format!("{}: unknown mode \"{other}\"", d.child_path("decimal_handling_mode")))
                .hint("Valid modes: precise (the default), string, double."))
        }
    };
    Ok(DebeziumOptions {
        topic_prefix,
        schemas: d.bool("schemas")?.unwrap_or(true),
        decimal_handling_mode,
        tombstones_on_delete: d.bool("tombstones_on_delete")?.unwrap_or(true),
        converter,
    })
}

/// How long one delivery unit of a sink (a Kafka transaction, a database transaction) may stay open: the smallest
/// `checkpoint_interval_ms` of the sink's config and of the capture configs of its tables, or
/// `None` when none sets one (a unit then carries one whole read of the slot).
pub fn checkpoint_interval<'a>(sink: Option<u32>, tables: impl IntoIterator<Item = &'a CaptureConfig>) -> Option<u32> {
    tables.into_iter().filter_map(|c| c.checkpoint_interval_ms).chain(sink).min()
}

/// Whether `name` is a table name as SQL writes it: one to three dot-separated identifiers, each
/// unquoted (a letter or `_`, then letters, digits, `_` or `$`) or double-quoted (`""` inside).
pub fn is_qualified_name(name: &str) -> bool {
    let mut parts = 0;
    let mut chars = name.chars().peekable();
    loop {
        parts += 1;
        match chars.next() {
            Some('"') => {
                let mut len = 0;
                loop {
                    match chars.next() {
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            len += 1;
                        }
                        Some('"') => break,
                        Some(_) => len += 1,
                        None => return false,
                    }
                }
                if len == 0 {
                    return false;
                }
            }
            Some(c) if c.is_alphabetic() || c == '_' => {
                while let Some(&c) = chars.peek() {
                    if c.is_alphanumeric() || c == '_' || c == '$' {
                        chars.next();
                    } else {
                        break;
                    }
                }
            }
            _ => return false,
        }
        match chars.next() {
            None => return parts <= 3,
            Some('.') => continue,
            Some(_) => return false,
        }
    }
}
