//! Capture config (`cdc_enable`) and sink config (`cdc_add_sink`): parsing and validation.
//!
//! Every key of the product description is known here. Keys whose feature is built are parsed into
//! typed structs; keys whose feature is planned are refused with 0A000 (feature_not_supported) unless
//! they are set to their "off" value, so a config never silently does less than it says. Unknown keys
//! are 22023 with a "did you mean" hint; wrong types name the JSON path (`config.operations[1]`).
//! Validation needs no database: the caller passes what it knows about the table in [`TableShape`].

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::error::{did_you_mean, CdcError, CdcResult, ErrorKind};
use crate::expr::{self, ColumnInfo};
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
];

/// A JSON object being read, with the path for messages and the keys already used.
struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn invalid(msg: impl Into<String>) -> CdcError {
    CdcError::new(ErrorKind::InvalidParameter, msg)
}

fn wrong_type(path: &str, expected: &str, got: &Value) -> CdcError {
    invalid(format!("{path} must be {expected}, not {}", type_name(got)))
}

impl<'a> Obj<'a> {
    fn root(name: &str, v: &'a Value) -> CdcResult<Self> {
        match v {
            Value::Object(map) => Ok(Obj { path: name.to_string(), map }),
            other => Err(wrong_type(name, "a JSON object", other)),
        }
    }

    fn child_path(&self, key: &str) -> String {
        format!("{}.{}", self.path, key)
    }

    fn check_keys(&self, known: &[&str]) -> CdcResult<()> {
        for k in self.map.keys() {
            if !known.contains(&k.as_str()) {
                let mut e = invalid(format!("unknown key \"{k}\" in {}", self.path));
                e = match did_you_mean(k, known.iter().copied()) {
                    Some(s) => e.hint(format!("Did you mean \"{s}\"?")),
                    None => e.hint(format!("Valid keys: {}.", known.join(", "))),
                };
                return Err(e);
            }
        }
        Ok(())
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn bool(&self, key: &str) -> CdcResult<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(&self.child_path(key), "true or false", v)),
        }
    }

    fn string(&self, key: &str) -> CdcResult<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
            Some(Value::String(_)) => Err(invalid(format!("{} must not be empty", self.child_path(key)))),
            Some(v) => Err(wrong_type(&self.child_path(key), "a string", v)),
        }
    }

    fn int(&self, key: &str, min: i64, max: i64) -> CdcResult<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(i) if (min..=max).contains(&i) => Ok(Some(i)),
                _ => Err(invalid(format!(
                    "{} must be an integer between {min} and {max}, not {n}",
                    self.child_path(key)
                ))),
            },
            Some(v) => Err(wrong_type(&self.child_path(key), "an integer", v)),
        }
    }

    fn strings(&self, key: &str) -> CdcResult<Option<Vec<String>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) if !s.is_empty() => {
                            if out.contains(s) {
                                return Err(invalid(format!("{}[{i}]: \"{s}\" is listed twice", self.child_path(key))));
                            }
                            out.push(s.clone())
                        }
                        Value::String(_) => {
                            return Err(invalid(format!("{}[{i}] must not be an empty string", self.child_path(key))))
                        }
                        other => return Err(wrong_type(&format!("{}[{i}]", self.child_path(key)), "a string", other)),
                    }
                }
                Ok(Some(out))
            }
            Some(v) => Err(wrong_type(&self.child_path(key), "an array of strings", v)),
        }
    }

    fn object(&self, key: &str) -> CdcResult<Option<Obj<'a>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Obj { path: self.child_path(key), map })),
            Some(v) => Err(wrong_type(&self.child_path(key), "a JSON object", v)),
        }
    }
}

fn planned(path: &str, what: &str) -> CdcError {
    CdcError::new(ErrorKind::FeatureNotSupported, format!("{path} is not supported yet: {what} is planned"))
        .hint("See the README's configuration table for what works in this version.")
}

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

    let before_image = match o.bool("before_image")? {
        Some(b) => b,
        None => o.bool("include_before_image")?.unwrap_or(audit),
    };
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
    if let Some(s) = o.object("schema_evolution")? {
        s.check_keys(&["enabled", "compatibility_mode", "schema_registry", "auto_register"])?;
        // Off when "enabled" is false, or when the object is empty.
        let on = match s.bool("enabled")? {
            Some(enabled) => enabled,
            None => !s.map.is_empty(),
        };
        if on {
            return Err(planned("config.schema_evolution", "schema evolution"));
        }
    }
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
    })
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

/// Sink types known to pg_cdc; only `kafka` is built so far.
pub const SINK_TYPES: &[&str] = &["kafka", "kinesis", "eventhub", "pubsub", "pulsar", "webhook", "postgres", "table"];

/// The event encoding of a sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// pg_cdc's JSON event (metadata, before, after, diff).
    Json,
}

/// A validated Kafka sink config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSinkConfig {
    /// `bootstrap.servers`; `None` means the server setting `cdc.kafka_bootstrap_servers`.
    pub bootstrap_servers: Option<String>,
    /// Topic name or template over `{database}`, `{schema}`, `{table}`.
    pub topic: String,
    /// Event encoding.
    pub format: Format,
    /// `acks`: "all" or "1" (0 cannot confirm delivery and is refused).
    pub acks: String,
    /// `compression.type`.
    pub compression: Option<String>,
    /// `batch.size` in bytes.
    pub batch_size: Option<i64>,
    /// `linger.ms`.
    pub linger_ms: Option<i64>,
    /// Table names this sink is limited to (`None`: every captured table); the caller resolves them.
    pub tables: Option<Vec<String>>,
    /// librdkafka properties passed through (TLS, SASL, ...). Values may be secrets: never echoed.
    pub properties: BTreeMap<String, String>,
    /// Transactional delivery with a progress topic (default true).
    pub exactly_once: bool,
    /// `transactional.id` override; `None` derives one from the system identifier, database and sink.
    pub transactional_id: Option<String>,
    /// Events carry the tables' computed and enriched columns (default true). Masks and PII
    /// redaction apply whatever this says.
    pub include_transformations: bool,
    /// `checkpoint_interval_ms`: the longest one Kafka transaction stays open (see
    /// [`checkpoint_interval`]).
    pub checkpoint_interval_ms: Option<u32>,
}

/// How long one delivery unit of a sink (a Kafka transaction) may stay open: the smallest
/// `checkpoint_interval_ms` of the sink's config and of the capture configs of its tables, or
/// `None` when none sets one (a unit then carries one whole read of the slot).
pub fn checkpoint_interval<'a>(sink: Option<u32>, tables: impl IntoIterator<Item = &'a CaptureConfig>) -> Option<u32> {
    tables.into_iter().filter_map(|c| c.checkpoint_interval_ms).chain(sink).min()
}

/// Kafka sink keys, as in the product description.
pub const KAFKA_KEYS: &[&str] = &[
    "bootstrap_servers",
    "topic",
    "format",
    "schema_registry",
    "acks",
    "compression",
    "batch_size",
    "linger_ms",
    "exactly_once",
    "transactional_id",
    "partition_key",
    "include_transformations",
    "checkpoint_interval_ms",
    "tables",
    "properties",
];

/// librdkafka settings pg_cdc sets itself; `properties` may not override them.
const RESERVED_PROPERTIES: &[&str] = &["bootstrap.servers", "acks", "enable.idempotence", "transactional.id"];

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

/// Validates a topic name or template: Kafka's legal characters plus `{database}`, `{schema}`, `{table}`.
pub fn validate_topic_template(path: &str, topic: &str) -> CdcResult<()> {
    let mut rest = topic;
    let mut literal = String::new();
    while let Some(open) = rest.find('{') {
        literal.push_str(&rest[..open]);
        let close =
            rest[open..].find('}').ok_or_else(|| invalid(format!("{path}: unclosed '{{' in topic template")))?;
        let name = &rest[open + 1..open + close];
        if !["database", "schema", "table"].contains(&name) {
            return Err(invalid(format!("{path}: unknown placeholder {{{name}}}"))
                .hint("Topic templates may use {database}, {schema} and {table}."));
        }
        rest = &rest[open + close + 1..];
    }
    literal.push_str(rest);
    if let Some(bad) = literal.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(invalid(format!("{path}: character {bad:?} is not allowed in a Kafka topic name"))
            .hint("Kafka topic names use letters, digits, '.', '_' and '-' only."));
    }
    if topic == "." || topic == ".." {
        return Err(invalid(format!("{path}: Kafka does not allow the topic names \".\" and \"..\"")));
    }
    if topic.len() > 249 {
        return Err(invalid(format!("{path}: a Kafka topic name has at most 249 characters")));
    }
    Ok(())
}

/// Expands a topic template for one table; characters Kafka does not allow become '_'.
pub fn expand_topic(template: &str, database: &str, schema: &str, table: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect()
    };
    template
        .replace("{database}", &clean(database))
        .replace("{schema}", &clean(schema))
        .replace("{table}", &clean(table))
}

/// Validates a sink type and returns its config (only Kafka so far).
pub fn parse_sink_config(sink_type: &str, config: &Value) -> CdcResult<KafkaSinkConfig> {
    match sink_type {
        "kafka" => parse_kafka_config(config),
        t if SINK_TYPES.contains(&t) => {
            Err(CdcError::new(ErrorKind::FeatureNotSupported, format!("sink type \"{t}\" is not supported yet"))
                .hint("Sink types available in this version: kafka."))
        }
        t => {
            let e = invalid(format!("unknown sink type \"{t}\""));
            Err(match did_you_mean(t, SINK_TYPES.iter().copied()) {
                Some(s) => e.hint(format!("Did you mean \"{s}\"? Valid sink types: {}.", SINK_TYPES.join(", "))),
                None => e.hint(format!("Valid sink types: {}.", SINK_TYPES.join(", "))),
            })
        }
    }
}

fn parse_kafka_config(config: &Value) -> CdcResult<KafkaSinkConfig> {
    let o = Obj::root("config", config)?;
    o.check_keys(KAFKA_KEYS)?;
    let topic = o
        .string("topic")?
        .ok_or_else(|| invalid("config.topic is required for a kafka sink").hint("Add \"topic\": \"orders-cdc\"."))?
        .to_string();
    validate_topic_template("config.topic", &topic)?;
    let bootstrap_servers = o.string("bootstrap_servers")?.map(str::to_string);
    let format = match o.string("format")?.unwrap_or("json") {
        "json" => Format::Json,
        f @ ("debezium" | "avro" | "protobuf") => return Err(planned("config.format", &format!("format \"{f}\""))),
        other => {
            return Err(invalid(format!("config.format: unknown format \"{other}\""))
                .hint("Valid formats: json, debezium, avro, protobuf."))
        }
    };
    if o.get("schema_registry").is_some() {
        o.string("schema_registry")?;
        return Err(planned("config.schema_registry", "schema registry support (with format avro)"));
    }
    let acks = match o.get("acks") {
        None => "all".to_string(),
        Some(Value::String(s)) if s == "all" || s == "-1" => "all".to_string(),
        Some(Value::String(s)) if s == "1" => "1".to_string(),
        Some(Value::Number(n)) if n.as_i64() == Some(-1) => "all".to_string(),
        Some(Value::Number(n)) if n.as_i64() == Some(1) => "1".to_string(),
        Some(Value::String(s)) if s == "0" => return Err(acks_zero()),
        Some(Value::Number(n)) if n.as_i64() == Some(0) => return Err(acks_zero()),
        Some(v) => return Err(invalid(format!("config.acks must be \"all\" or \"1\", not {v}"))),
    };
    let compression = match o.string("compression")? {
        None => None,
        Some(c @ ("none" | "gzip" | "snappy" | "lz4" | "zstd")) => Some(c.to_string()),
        Some(other) => {
            return Err(invalid(format!("config.compression: unknown codec \"{other}\""))
                .hint("Valid codecs: none, gzip, snappy, lz4, zstd."))
        }
    };
    let batch_size = o.int("batch_size", 1, 2_147_483_647)?;
    let linger_ms = o.int("linger_ms", 0, 900_000)?;
    let exactly_once = o.bool("exactly_once")?.unwrap_or(true);
    let transactional_id = o.string("transactional_id")?.map(str::to_string);
    if transactional_id.is_some() && !exactly_once {
        return Err(invalid("config.transactional_id is only used with \"exactly_once\": true"));
    }
    if exactly_once && acks != "all" {
        return Err(invalid("config.acks must be \"all\" with exactly-once delivery")
            .hint("Kafka transactions need acks=all; set \"exactly_once\": false to use acks=1."));
    }
    if o.get("partition_key").is_some() {
        o.string("partition_key")?;
        return Err(planned(
            "config.partition_key",
            "a sink-level partition key (use the capture config's partition_key)",
        ));
    }
    let include_transformations = o.bool("include_transformations")?.unwrap_or(true);
    let checkpoint_interval_ms = o.int("checkpoint_interval_ms", 1, 3_600_000)?.map(|v| v as u32);
    let tables = o.strings("tables")?;
    if tables.as_ref().is_some_and(Vec::is_empty) {
        return Err(invalid("config.tables must list at least one table")
            .hint("Leave \"tables\" out to deliver every captured table."));
    }
    let mut properties = BTreeMap::new();
    if let Some(p) = o.object("properties")? {
        for (k, v) in p.map {
            let path = format!("config.properties.\"{k}\"");
            let value = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => return Err(wrong_type(&path, "a string, number or boolean", other)),
            };
            if RESERVED_PROPERTIES.contains(&k.as_str()) {
                return Err(invalid(format!("{path} is set by pg_cdc and cannot be overridden"))
                    .hint("Use the sink's own keys (bootstrap_servers, acks) instead."));
            }
            properties.insert(k.clone(), value);
        }
    }
    Ok(KafkaSinkConfig {
        exactly_once,
        transactional_id,
        include_transformations,
        checkpoint_interval_ms,
        bootstrap_servers,
        topic,
        format,
        acks,
        compression,
        batch_size,
        linger_ms,
        tables,
        properties,
    })
}

fn acks_zero() -> CdcError {
    invalid("config.acks = 0 cannot be used: pg_cdc advances its slot only after the broker acknowledges")
        .hint("Use \"all\" (the default) or \"1\".")
}

#[cfg(test)]
mod tests;
