//! Capture config (`cdc_enable`): parsing and validation. The keys every sink config shares are
//! in [`sink`]; each sink type's own keys are parsed in its folder of `cdc-sinks`.
//!
//! Every key of the product description is known here. Keys whose feature is built are parsed into
//! typed structs; keys whose feature is planned are refused with 0A000 (feature_not_supported) unless
//! they are set to their "off" value, so a config never silently does less than it says. Unknown keys
//! are 22023 with a "did you mean" hint; wrong types name the JSON path (`config.operations[1]`).
//! Validation needs no database: the caller passes what it knows about the table in [`TableShape`].

use std::sync::Arc;

use serde_json::Value;

pub mod sink;

pub use self::sink::{checkpoint_interval, is_qualified_name, SnapshotMode};
use crate::error::{did_you_mean, CdcError, CdcResult, ErrorKind};
use crate::expr::{self, ColumnInfo};
use crate::object::{invalid, wrong_type, Obj};
use crate::redact::{Method, METHODS};
use crate::types::TypeKind;

/// What the caller knows about the table being enabled.
#[derive(Debug, Clone, Default)]
pub struct TableShape {
    /// The table's name as `regclass::text` prints it (for messages).
    pub display_name: String,
    /// Names of the columns pgoutput publishes (not dropped, not generated), in order.
    pub columns: Vec<String>,
    /// Primary key columns, empty when there is none.
    pub primary_key: Vec<String>,
    /// Columns of the REPLICA IDENTITY USING INDEX index, empty when not set.
    pub replica_identity_index: Vec<String>,
    /// `relreplident`: b'd', b'n', b'f' or b'i'.
    pub replica_identity: u8,
    /// Generated columns: they exist, but PostgreSQL 15 does not publish them.
    pub generated_columns: Vec<String>,
    /// How each of `columns` converts (same order), for type-checking expressions; empty when
    /// unknown (then expressions are only parsed).
    pub column_kinds: Vec<TypeKind>,
}

/// The row operations a table can publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operations {
    /// INSERT events.
    pub insert: bool,
    /// UPDATE events.
    pub update: bool,
    /// DELETE events.
    pub delete: bool,
    /// TRUNCATE events.
    pub truncate: bool,
}

impl Operations {
    /// Every operation.
    pub const ALL: Operations = Operations { insert: true, update: true, delete: true, truncate: true };

    /// Only inserts: a table without a key can be captured this way.
    pub fn insert_only(&self) -> bool {
        self.insert && !self.update && !self.delete
    }
}

/// The validated capture config of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    /// Operations to emit.
    pub operations: Operations,
    /// Columns in the event images, in table order; `None` means every column.
    pub include_columns: Option<Vec<String>>,
    /// Columns never in the event images.
    pub exclude_columns: Vec<String>,
    /// Columns that form the message key (resolved: the given `key_columns`, else the primary key,
    /// else the replica identity index; empty when the table has none, which only insert-only or
    /// REPLICA IDENTITY FULL tables may have).
    pub key_columns: Vec<String>,
    /// Deliver the full before image of updates and deletes (sets REPLICA IDENTITY FULL).
    pub before_image: bool,
    /// Add `metadata.transaction` (id, commit LSN and time, position, size).
    pub include_transaction_info: bool,
    /// Column whose value keys the Kafka message instead of the key columns.
    pub partition_key: Option<String>,
    /// `capture_mode`.
    pub mode: CaptureMode,
    /// Columns whose values are hidden, with the method: the `compliance.pii_columns` (when
    /// `redact_pii` is on) and the `mask` transformations, in config order.
    pub redactions: Vec<(String, Method)>,
    /// The `compliance` block, when `redact_pii` is on: events then carry a `compliance` object.
    pub compliance: Option<Compliance>,
    /// `include_user_context`: `metadata` carries user, session_id, client_ip, application_name.
    pub user_context: bool,
    /// `include_query_text`: `metadata.query` carries the statement's text.
    pub query_text: bool,
    /// `filter` / `filter_expression`: a SQL boolean expression over the row; only changes for
    /// which it is TRUE are published (see the pipeline for updates that enter or leave it).
    pub filter: Option<String>,
    /// `compute` transformations, in config order: (field name, expression).
    pub computed: Vec<(String, String)>,
    /// `enrich` transformations, in config order.
    pub enrich: Vec<Enrich>,
    /// `exactly_once.checkpoint_interval_ms`: the longest a sink's delivery unit (a Kafka
    /// transaction) carrying this table's events stays open before it is committed.
    pub checkpoint_interval_ms: Option<u32>,
    /// `exactly_once.enabled: true`: the table asks for exactly-once delivery (`cdc_enable` and
    /// `cdc_add_sink` warn about sinks that deliver it at least once).
    pub exactly_once_required: bool,
    /// `schema_evolution`: how DDL on the table is checked (see [`crate::schema`]).
    pub schema_evolution: SchemaEvolution,
    /// The table's schema history, when the worker read one: the config's column names are those
    /// of its latest version, and a relation of an earlier version finds them through it.
    pub history: Option<Arc<crate::schema::History>>,
    /// `regional_routing`, when enabled (see [`crate::routing`]).
    pub routing: Option<crate::routing::Routing>,
    /// Where the table's routing last changed: the LSN of its routing message, from the catalog
    /// (`_cdc_publications.routing_lsn`); routing applies to changes after it.
    pub routing_lsn: Option<crate::Lsn>,
}

/// The validated `schema_evolution` block. Without one, a breaking DDL is checked against
/// `backward` and warned about; `"enabled": false` turns the check off (the history is kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaEvolution {
    /// `compatibility_mode` (`none` when `enabled` is false).
    pub mode: crate::schema::Mode,
    /// `enforce`: a breaking DDL raises an ERROR (rolled back) instead of a WARNING.
    pub enforce: bool,
    /// `schema_registry`: the registry URL for this table's Avro events.
    pub schema_registry: Option<String>,
    /// `auto_register` (default true): the worker registers new schema versions.
    pub auto_register: bool,
}

impl Default for SchemaEvolution {
    fn default() -> Self {
        SchemaEvolution {
            mode: crate::schema::Mode::Backward,
            enforce: false,
            schema_registry: None,
            auto_register: true,
        }
    }
}

/// One `enrich` transformation: columns added to the event from the row of a lookup table whose
/// `lookup_column` equals the change's `source_column`, as that row was when the change
/// committed (see [`crate::lookup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enrich {
    /// Column of the captured table holding the lookup key.
    pub source_column: String,
    /// The lookup table, as the config names it (resolved to an OID by `cdc_enable`).
    pub lookup_table: String,
    /// Column of the lookup table the key is matched against (its replica identity key).
    pub lookup_column: String,
    /// Columns of the lookup table added to the event, in this order.
    pub add_columns: Vec<String>,
}

/// Checks an `enrich` transformation against its lookup table: the lookup column exists and is
/// the table's whole replica identity key (so every update and delete of a lookup row names the
/// row it changes, and a key names at most one row), and the added columns exist and are
/// published. `path` is the transformation's config path.
pub fn check_lookup(path: &str, e: &Enrich, lookup: &TableShape) -> CdcResult<()> {
    check_column(lookup, &format!("{path}.lookup_column"), &e.lookup_column)?;
    for (i, c) in e.add_columns.iter().enumerate() {
        check_column(lookup, &format!("{path}.add_columns[{i}]"), c)?;
    }
    let key = std::slice::from_ref(&e.lookup_column);
    let identified = match lookup.replica_identity {
        b'd' | b'f' => lookup.primary_key == key,
        b'i' => lookup.replica_identity_index == key,
        _ => false,
    };
    if !identified {
        return Err(CdcError::new(
            ErrorKind::PrerequisiteState,
            format!(
                "{path}.lookup_column: \"{}\" is not the replica identity key of lookup table {}",
                e.lookup_column, lookup.display_name
            ),
        )
        .detail(
            "pg_cdc keeps its own copy of the lookup table from its changes in the WAL; that needs every update and \
             delete of a lookup row to name the row by this column alone.",
        )
        .hint(format!(
            "Make it the primary key (ALTER TABLE {0} ADD PRIMARY KEY ({1})), or the replica identity \
             (ALTER TABLE {0} REPLICA IDENTITY USING INDEX <unique index on {1}>).",
            lookup.display_name, e.lookup_column
        )));
    }
    Ok(())
}

impl CaptureConfig {
    /// What `{}` gives for a table keyed by `key_columns`: every column and operation, nothing
    /// filtered, hidden or added.
    pub fn with_key(key_columns: Vec<String>) -> Self {
        CaptureConfig {
            operations: Operations::ALL,
            include_columns: None,
            exclude_columns: vec![],
            key_columns,
            before_image: false,
            include_transaction_info: false,
            partition_key: None,
            mode: CaptureMode::AllChanges,
            redactions: vec![],
            compliance: None,
            user_context: false,
            query_text: false,
            filter: None,
            computed: vec![],
            enrich: vec![],
            checkpoint_interval_ms: None,
            exactly_once_required: false,
            schema_evolution: SchemaEvolution::default(),
            history: None,
            routing: None,
            routing_lsn: None,
        }
    }

    /// Whether events of the table need the tokenization key (a PII column or a mask tokenizes).
    pub fn tokenizes(&self) -> bool {
        self.redactions.iter().any(|(_, m)| *m == Method::Tokenize)
    }

    /// Whether changes of the table need the context trigger.
    pub fn needs_context(&self) -> bool {
        self.user_context || self.query_text
    }
}

/// `capture_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureMode {
    /// Every change of the captured operations (a `filter`, if given, still applies).
    #[default]
    AllChanges,
    /// Only changes that pass the `filter` (required); events name the matched branch.
    Filtered,
    /// An audit trail: before images and transaction info on by default; filters, `operations`
    /// without INSERT, UPDATE and DELETE, and `include_columns` / `exclude_columns` are refused,
    /// because an audit may not have holes (PII is hidden with `compliance` instead).
    FullAudit,
}

/// The validated `compliance` block (with `redact_pii` on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compliance {
    /// Method applied to `pii_columns`.
    pub method: Method,
    /// `audit_retention_days`: events carry `retention_until` = commit date + this many days.
    pub audit_retention_days: Option<u32>,
}

impl CaptureConfig {
    /// Whether a column appears in the event images (a column masked with `remove` does not).
    pub fn includes(&self, column: &str) -> bool {
        let included = match &self.include_columns {
            Some(cols) => cols.iter().any(|c| c == column),
            None => true,
        };
        included && !self.exclude_columns.iter().any(|c| c == column) && self.redaction(column) != Some(Method::Remove)
    }

    /// How a column's values are hidden, if they are.
    pub fn redaction(&self, column: &str) -> Option<Method> {
        self.redactions.iter().find(|(c, _)| c == column).map(|(_, m)| *m)
    }
}

/// Keys `cdc_enable` accepts, as in the product description.
pub const CAPTURE_KEYS: &[&str] = &[
    "capture_mode",
    "operations",
    "include_columns",
    "exclude_columns",
    "filter",
    "filter_expression",
    "key_columns",
    "before_image",
    "include_before_image",
    "include_transaction_info",
    "include_user_context",
    "include_query_text",
    "partition_key",
    "compliance",
    "exactly_once",
    "schema_evolution",
    "transformations",
    "regional_routing",
];

fn check_column(shape: &TableShape, path: &str, col: &str) -> CdcResult<()> {
    if shape.columns.iter().any(|c| c == col) {
        return Ok(());
    }
    if shape.generated_columns.iter().any(|c| c == col) {
        return Err(CdcError::new(
            ErrorKind::FeatureNotSupported,
            format!(
                "{path}: column \"{col}\" of table {} is a generated column, which PostgreSQL 15 does not publish",
                shape.display_name
            ),
        )
        .hint("Leave it out; consumers can compute it from the published columns."));
    }
    let e = CdcError::new(
        ErrorKind::UndefinedColumn,
        format!("{path}: column \"{col}\" of table {} does not exist", shape.display_name),
    );
    Err(match did_you_mean(col, shape.columns.iter().map(String::as_str)) {
        Some(s) => e.hint(format!("Did you mean \"{s}\"?")),
        None => e.hint(format!("Columns: {}.", shape.columns.join(", "))),
    })
}

/// Parses and validates a `cdc_enable` config against the table.
pub fn parse_capture_config(config: &Value, shape: &TableShape) -> CdcResult<CaptureConfig> {
    parse_capture(config, Some(shape))
}

/// Re-reads a config that `cdc_enable` already validated (the worker's view): the table's columns
/// are not checked again, since later DDL may have changed them; the key columns come from the
/// catalog, where `cdc_enable` stored them resolved.
pub fn parse_stored_capture_config(config: &Value, key_columns: Vec<String>) -> CdcResult<CaptureConfig> {
    let mut cfg = parse_capture(config, None)?;
    cfg.key_columns = key_columns;
    Ok(cfg)
}

fn parse_capture(config: &Value, shape: Option<&TableShape>) -> CdcResult<CaptureConfig> {
    let check_column = |path: &str, col: &str| match shape {
        Some(shape) => check_column(shape, path, col),
        None => Ok(()),
    };
    let o = Obj::root("config", config)?;
    o.check_keys(CAPTURE_KEYS)?;

    for (a, b) in [("before_image", "include_before_image"), ("filter", "filter_expression")] {
        if o.get(a).is_some() && o.get(b).is_some() {
            return Err(invalid(format!("config.{a} and config.{b} are the same setting; give only one")));
        }
    }

    let mode = match o.string("capture_mode")? {
        None | Some("all_changes") => CaptureMode::AllChanges,
        Some("filtered") => CaptureMode::Filtered,
        Some("full_audit") => CaptureMode::FullAudit,
        Some(other) => {
            return Err(invalid(format!("config.capture_mode: unknown mode \"{other}\""))
                .hint("Valid modes: all_changes, filtered, full_audit."))
        }
    };
    let audit = mode == CaptureMode::FullAudit;
    let audit_refuses = |path: &str, why: &str| {
        invalid(format!("{path} cannot be used with capture_mode \"full_audit\": {why}"))
            .hint("An audit trail records every change of every column; use capture_mode \"all_changes\" to select.")
    };

    let operations = match o.strings("operations")? {
        None => Operations::ALL,
        Some(list) => {
            if list.is_empty() {
                return Err(invalid("config.operations must list at least one operation"));
            }
            let mut ops = Operations { insert: false, update: false, delete: false, truncate: false };
            for (i, op) in list.iter().enumerate() {
                match op.to_ascii_uppercase().as_str() {
                    "INSERT" => ops.insert = true,
                    "UPDATE" => ops.update = true,
                    "DELETE" => ops.delete = true,
                    "TRUNCATE" => ops.truncate = true,
                    _ => {
                        return Err(invalid(format!("config.operations[{i}]: unknown operation \"{op}\""))
                            .hint("Valid operations: INSERT, UPDATE, DELETE, TRUNCATE."))
                    }
                }
            }
            // Judged on the set, not the list's length: ["INSERT", "insert", "UPDATE"] has no DELETE.
            if audit && !(ops.insert && ops.update && ops.delete) {
                return Err(audit_refuses("config.operations", "it must include INSERT, UPDATE and DELETE"));
            }
            ops
        }
    };

    let include_columns = o.strings("include_columns")?;
    if audit {
        for key in ["include_columns", "exclude_columns"] {
            if o.get(key).is_some() {
                return Err(audit_refuses(&format!("config.{key}"), "it leaves columns out"));
            }
        }
    }
    if let Some(cols) = &include_columns {
        if cols.is_empty() {
            return Err(invalid("config.include_columns must list at least one column"));
        }
        for (i, c) in cols.iter().enumerate() {
            check_column(&format!("config.include_columns[{i}]"), c)?;
        }
    }
    let exclude_columns = o.strings("exclude_columns")?.unwrap_or_default();
    for (i, c) in exclude_columns.iter().enumerate() {
        check_column(&format!("config.exclude_columns[{i}]"), c)?;
    }

    let mut filter = None;
    for key in ["filter", "filter_expression"] {
        if let Some(f) = o.get(key) {
            let path = format!("config.{key}");
            if !f.is_string() {
                return Err(wrong_type(&path, "a string", f));
            }
            if audit {
                return Err(audit_refuses(&path, "a filter drops changes"));
            }
            let text = f.as_str().unwrap_or_default();
            check_expression(shape, &path, &expr::parse(text), &[])?;
            filter = Some(text.trim().to_string());
        }
    }
    if mode == CaptureMode::Filtered && filter.is_none() {
        return Err(invalid("capture_mode \"filtered\" needs a filter")
            .hint("Give the row filter as \"filter_expression\": \"status <> 'draft'\"."));
    }

    let routing = crate::routing::parse(o.object("regional_routing")?, check_column)?;
    let before_image = match o.bool("before_image")? {
        Some(b) => b,
        None => o.bool("include_before_image")?.unwrap_or(audit || routing.is_some()),
    };
    if routing.is_some() && !before_image {
        return Err(invalid(
            "config.regional_routing needs before images: a row whose routing value changes is a DELETE for its old \
             route's sinks, which only its before image tells",
        )
        .hint("Leave include_before_image out (routing turns it on) or set it to true."));
    }
    let include_transaction_info = o.bool("include_transaction_info")?.unwrap_or(audit);
    if audit && !before_image {
        return Err(audit_refuses(
            "config.include_before_image = false",
            "updates and deletes need their before image",
        ));
    }
    let user_context = o.bool("include_user_context")?.unwrap_or(false);
    let query_text = o.bool("include_query_text")?.unwrap_or(false);

    // Checked once the transformations are known: it may name an enriched column.
    let partition_key = o.string("partition_key")?.map(str::to_string);

    let key_columns = match o.strings("key_columns")? {
        Some(cols) => {
            if cols.is_empty() {
                return Err(invalid("config.key_columns must list at least one column"));
            }
            for (i, c) in cols.iter().enumerate() {
                check_column(&format!("config.key_columns[{i}]"), c)?;
            }
            cols
        }
        None => match shape {
            Some(s) if !s.primary_key.is_empty() => s.primary_key.clone(),
            Some(s) => s.replica_identity_index.clone(),
            None => Vec::new(),
        },
    };

    // A table whose updates and deletes cannot be identified breaks the application's own UPDATEs
    // once it is in a publication that publishes them.
    let unidentified = shape.filter(|shape| {
        // REPLICA IDENTITY DEFAULT uses the primary key; NOTHING has no identity even with one.
        let identified = (shape.replica_identity == b'd' && !shape.primary_key.is_empty())
            || shape.replica_identity == b'f'
            || (shape.replica_identity == b'i' && !shape.replica_identity_index.is_empty())
            || before_image;
        !identified
    });
    if let Some(shape) = unidentified.filter(|_| operations.update || operations.delete) {
        return Err(CdcError::new(
            ErrorKind::PrerequisiteState,
            format!("table {} has no replica identity, so its updates and deletes cannot be captured", shape.display_name),
        )
        .detail("PostgreSQL refuses UPDATE and DELETE on a published table without a replica identity (a primary key with REPLICA IDENTITY DEFAULT, an index, or FULL).")
        .hint(
            "Capture inserts only with \"operations\": [\"INSERT\"], or give the table an identity: \
             \"include_before_image\": true (REPLICA IDENTITY FULL), or ALTER TABLE ... REPLICA IDENTITY USING INDEX <unique index>.",
        ));
    }

    // Deletes (and key changes) carry only the replica identity columns without a before image: a
    // key column outside them would key those events by null.
    if let Some(shape) = shape.filter(|s| s.replica_identity != b'f' && !before_image) {
        let identity = if shape.replica_identity == b'i' { &shape.replica_identity_index } else { &shape.primary_key };
        let outside = key_columns.iter().find(|c| !identity.contains(c));
        if let Some(c) = outside.filter(|_| operations.update || operations.delete) {
            return Err(CdcError::new(
                ErrorKind::PrerequisiteState,
                format!(
                    "config.key_columns: column \"{c}\" is not part of the replica identity of {}, so deletes and key \
                     changes would not carry it",
                    shape.display_name
                ),
            )
            .hint(
                "Add \"include_before_image\": true (deletes then carry the whole row), pick key columns of the primary \
                 key or replica identity index, or capture inserts only.",
            ));
        }
    }

    let mut redactions: Vec<(String, Method)> = Vec::new();
    let mut compliance = None;
    if let Some(c) = o.object("compliance")? {
        c.check_keys(&["redact_pii", "pii_columns", "redaction_method", "audit_retention_days"])?;
        let given = c.bool("redact_pii")?;
        let on = given.unwrap_or(false);
        let pii = c.strings("pii_columns")?.unwrap_or_default();
        // Listed PII columns without a word on redact_pii are ambiguous: refused for new configs
        // (a config recorded by an earlier version keeps its meaning: listed, not hidden).
        if shape.is_some() && given.is_none() && !pii.is_empty() {
            return Err(invalid("config.compliance.pii_columns is set but config.compliance.redact_pii is not")
                .hint("Add \"redact_pii\": true to hide them (or false to publish them as they are)."));
        }
        for (i, col) in pii.iter().enumerate() {
            check_column(&format!("config.compliance.pii_columns[{i}]"), col)?;
        }
        let method = match c.string("redaction_method")? {
            None => Method::Tokenize,
            Some(w) => method(w, "config.compliance.redaction_method")?,
        };
        let days = c.int("audit_retention_days", 1, 36_500)?.map(|d| d as u32);
        if on && pii.is_empty() {
            return Err(invalid(
                "config.compliance.redact_pii is true but config.compliance.pii_columns lists no column",
            )
            .hint("List the columns that hold personal data, e.g. \"pii_columns\": [\"ssn\", \"account_number\"]."));
        }
        if on {
            redactions.extend(pii.into_iter().map(|col| (col, method)));
        }
        if on || days.is_some() {
            compliance = Some(Compliance { method, audit_retention_days: days });
        }
    }
    // Delivery is a property of each sink (Kafka sinks are exactly-once by default), and one
    // Kafka transaction carries the changes of every table of the sink, so a table cannot turn it
    // off; it can bound how long a delivery unit carrying its events stays open.
    let mut checkpoint_interval_ms = None;
    let mut exactly_once_required = false;
    if let Some(e) = o.object("exactly_once")? {
        e.check_keys(&["enabled", "checkpoint_interval_ms"])?;
        checkpoint_interval_ms = e.int("checkpoint_interval_ms", 1, 3_600_000)?.map(|v| v as u32);
        match e.bool("enabled")? {
            Some(false) => {
                return Err(invalid(
                    "config.exactly_once.enabled = false cannot take effect on a table: delivery is a property of each sink, \
                     and one delivery carries the changes of all of its tables",
                )
                .hint(
                    "Add the sink with \"exactly_once\": false in its config (cdc_add_sink) for at-least-once delivery, \
                     and leave exactly_once.enabled out of the capture config.",
                ))
            }
            Some(true) => exactly_once_required = true,
            None => {}
        }
    }
    let schema_evolution = parse_schema_evolution(o.object("schema_evolution")?)?;
    let mut computed: Vec<(String, String)> = Vec::new();
    let mut computed_at = Vec::new();
    let mut enrich: Vec<Enrich> = Vec::new();
    // Names the event already has: the table's columns, then the added ones.
    let taken = |name: &str, computed: &[(String, String)], enrich: &[Enrich]| {
        shape.is_some_and(|s| s.columns.iter().any(|c| c == name))
            || computed.iter().any(|(n, _)| n == name)
            || enrich.iter().any(|e| e.add_columns.iter().any(|c| c == name))
    };
    match o.get("transformations") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let t = Obj::root(&format!("config.transformations[{i}]"), item)?;
                match t.string("type")? {
                    Some("mask") => {
                        t.check_keys(&["type", "column", "method"])?;
                        let col =
                            t.string("column")?.ok_or_else(|| invalid(format!("{}.column is required", t.path)))?;
                        check_column(&t.child_path("column"), col)?;
                        let m = t.string("method")?.ok_or_else(|| {
                            invalid(format!("{}.method is required", t.path))
                                .hint(format!("Methods: {}.", METHODS.join(", ")))
                        })?;
                        let m = method(m, &t.child_path("method"))?;
                        if let Some((_, earlier)) = redactions.iter().find(|(c, _)| c == col) {
                            return Err(invalid(format!(
                                "{}: column \"{col}\" is already hidden with \"{}\"; give one method per column",
                                t.path,
                                earlier.as_str()
                            )));
                        }
                        redactions.push((col.to_string(), m));
                    }
                    Some("compute") => {
                        t.check_keys(&["type", "name", "expression"])?;
                        let name = t.string("name")?.ok_or_else(|| invalid(format!("{}.name is required", t.path)))?;
                        let text = t
                            .string("expression")?
                            .ok_or_else(|| invalid(format!("{}.expression is required", t.path)))?;
                        if taken(name, &computed, &enrich) {
                            return Err(invalid(format!(
                                "{}.name: \"{name}\" is already a column of the event",
                                t.path
                            ))
                            .hint("Give the computed column a name of its own."));
                        }
                        computed_at.push((t.child_path("expression"), expr::parse_computed(text)));
                        computed.push((name.to_string(), text.trim().to_string()));
                    }
                    Some("enrich") => {
                        t.check_keys(&["type", "source_column", "lookup_table", "lookup_column", "add_columns"])?;
                        let required = |key: &str| {
                            t.string(key)?
                                .map(str::to_string)
                                .ok_or_else(|| invalid(format!("{}.{key} is required", t.path)))
                        };
                        let source_column = required("source_column")?;
                        check_column(&t.child_path("source_column"), &source_column)?;
                        let lookup_table = required("lookup_table")?;
                        if !is_qualified_name(&lookup_table) {
                            return Err(CdcError::new(
                                ErrorKind::InvalidName,
                                format!("{}.lookup_table: \"{lookup_table}\" is not a valid table name", t.path),
                            )
                            .hint("Write it as in SQL: sensors, iot.sensors, or \"Mixed Case\"."));
                        }
                        let lookup_column = required("lookup_column")?;
                        let add_columns = t.strings("add_columns")?.unwrap_or_default();
                        if add_columns.is_empty() {
                            return Err(invalid(format!("{}.add_columns must list at least one column", t.path))
                                .hint("Name the lookup table's columns to add, e.g. [\"location\", \"owner\"]."));
                        }
                        for (j, c) in add_columns.iter().enumerate() {
                            if taken(c, &computed, &enrich) || add_columns[..j].contains(c) {
                                return Err(invalid(format!(
                                    "{}.add_columns[{j}]: \"{c}\" is already a column of the event",
                                    t.path
                                ))
                                .hint("Each added column needs a name the event does not have yet."));
                            }
                        }
                        enrich.push(Enrich { source_column, lookup_table, lookup_column, add_columns });
                    }
                    Some(other) => {
                        return Err(invalid(format!("{}.type: unknown transformation \"{other}\"", t.path))
                            .hint("Valid types: enrich, compute, mask."))
                    }
                    None => return Err(invalid(format!("{}.type is required", t.path))),
                }
            }
        }
        Some(v) => return Err(wrong_type("config.transformations", "an array", v)),
    }
    if let Some(p) = &partition_key {
        if !enrich.iter().any(|e| e.add_columns.contains(p)) {
            check_column("config.partition_key", p)?;
        }
    }
    // A computed column over a hidden one would publish what the config hides: masked and PII
    // columns, and (for new configs: the table's columns are known) the columns left out of the images.
    let mut hidden: Vec<&str> = redactions.iter().map(|(c, _)| c.as_str()).collect();
    if let Some(shape) = shape {
        let left_out =
            |c: &&String| include_columns.as_ref().is_some_and(|i| !i.contains(c)) || exclude_columns.contains(c);
        hidden.extend(shape.columns.iter().filter(left_out).map(String::as_str));
    }
    for (path, parsed) in &computed_at {
        check_expression(shape, path, parsed, &hidden)?;
    }
    // The key must stay a usable key: present, and different for different rows.
    for (col, m) in &redactions {
        let is_key = key_columns.contains(col) || partition_key.as_ref() == Some(col);
        if is_key && matches!(m, Method::Remove | Method::Redact) {
            return Err(invalid(format!(
                "column \"{col}\" is part of the message key and cannot be hidden with \"{}\": every row would get the same key",
                m.as_str()
            ))
            .hint("Use \"tokenize\" (or \"hash\"): the key stays distinct per row and the value stays hidden."));
        }
    }

    Ok(CaptureConfig {
        operations,
        include_columns,
        exclude_columns,
        key_columns,
        before_image,
        include_transaction_info,
        partition_key,
        mode,
        redactions,
        compliance,
        user_context,
        query_text,
        filter,
        computed,
        enrich,
        checkpoint_interval_ms,
        exactly_once_required,
        schema_evolution,
        history: None,
        routing,
        routing_lsn: None,
    })
}

/// The `schema_evolution` block of a capture config (already validated by `cdc_enable`, or not:
/// errors say what is wrong), as the DDL check and the history read it.
pub fn schema_evolution_of(config: &Value) -> CdcResult<SchemaEvolution> {
    let o = Obj::root("config", config)?;
    parse_schema_evolution(o.object("schema_evolution")?)
}

fn parse_schema_evolution(s: Option<Obj<'_>>) -> CdcResult<SchemaEvolution> {
    let mut schema_evolution = SchemaEvolution::default();
    let Some(s) = s else { return Ok(schema_evolution) };
    s.check_keys(&["enabled", "compatibility_mode", "enforce", "schema_registry", "auto_register"])?;
    if let Some(m) = s.string("compatibility_mode")? {
        schema_evolution.mode = crate::schema::Mode::parse(m).ok_or_else(|| {
            invalid(format!(
                "{} must be backward, forward, full or none, not \"{m}\"",
                s.child_path("compatibility_mode")
            ))
        })?;
    }
    schema_evolution.enforce = s.bool("enforce")?.unwrap_or(false);
    if let Some(url) = s.string("schema_registry")? {
        schema_evolution.schema_registry = Some(registry_url(&s.child_path("schema_registry"), url)?);
    }
    schema_evolution.auto_register = s.bool("auto_register")?.unwrap_or(true);
    if s.bool("enabled")? == Some(false) {
        if schema_evolution.enforce {
            return Err(invalid(format!(
                "{} is true but {} is false",
                s.child_path("enforce"),
                s.child_path("enabled")
            )));
        }
        schema_evolution.mode = crate::schema::Mode::None;
    }
    if schema_evolution.enforce && schema_evolution.mode == crate::schema::Mode::None {
        return Err(invalid(format!(
            "{} is true but compatibility_mode is none: nothing to enforce",
            s.child_path("enforce")
        )));
    }
    Ok(schema_evolution)
}

/// A schema registry URL, checked: `http://` or `https://`, a host, an optional port, an optional
/// path (a trailing `/` is dropped); credentials in it (`https://user:secret@host`) are allowed
/// and never echoed. 22023 otherwise.
pub fn registry_url(path: &str, url: &str) -> CdcResult<String> {
    let bad = |why: &str| {
        let shown = match url.split_once('@') {
            Some((_, host)) if url.contains("://") => format!("{}://***@{host}", url.split("://").next().unwrap_or("")),
            _ => url.to_string(),
        };
        invalid(format!("{path} is not a schema registry URL ({why}): \"{shown}\""))
            .hint("Write it as http://host:port or https://host:port, e.g. \"http://schema-registry:8081\".")
    };
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| bad("it must start with http:// or https://"))?;
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("it contains white space"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match host_port.strip_prefix('[') {
        // An IPv6 literal: [::1]:8081
        Some(v6) => {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("an unclosed '[' in the host"))?;
            (h, after.strip_prefix(':'))
        }
        None => match host_port.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        },
    };
    if host.is_empty() {
        return Err(bad("it has no host"));
    }
    if !host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':')) {
        return Err(bad("the host has characters a host name cannot have"));
    }
    if let Some(p) = port {
        if p.parse::<u16>().ok().filter(|&n| n > 0).is_none() {
            return Err(bad("the port is not a number from 1 to 65535"));
        }
    }
    if rest.contains(['?', '#']) {
        return Err(bad("a registry URL has no query or fragment"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// Checks a parsed expression against the table (columns exist, types fit) and refuses columns
/// in `hidden`. Messages start with the config path.
fn check_expression(
    shape: Option<&TableShape>,
    path: &str,
    parsed: &CdcResult<expr::Parsed>,
    hidden: &[&str],
) -> CdcResult<()> {
    let at = |mut e: CdcError| {
        e.message = format!("{path}: {}", e.message);
        e
    };
    let parsed = parsed.as_ref().map_err(|e| at(e.clone()))?;
    if let Some(c) = parsed.columns().iter().find(|c| hidden.contains(&c.as_str())) {
        return Err(invalid(format!(
            "{path}: column \"{c}\" is hidden by the config, so a computed column may not read it"
        ))
        .hint("Compute only from columns the events may show."));
    }
    if let Some(s) = shape.filter(|s| s.column_kinds.len() == s.columns.len()) {
        let cols: Vec<ColumnInfo> =
            s.columns.iter().zip(&s.column_kinds).map(|(n, k)| ColumnInfo::new(n.clone(), *k)).collect();
        parsed.bind(&cols).map_err(at)?;
    }
    Ok(())
}

fn method(word: &str, path: &str) -> CdcResult<Method> {
    Method::parse(word).ok_or_else(|| {
        invalid(format!("{path}: unknown method \"{word}\"")).hint(format!("Methods: {}.", METHODS.join(", ")))
    })
}

#[cfg(test)]
mod tests;
