//! Schema history and compatibility (issue 15): what a DDL on a captured table changed, and
//! whether consumers of its events can follow, by the rules of Avro's schema resolution.
//!
//! ```text
//!  version n fields ─┐
//!                    ├─ diff ─▶ changes (ADD_FIELD, DROP_FIELD, RENAME_FIELD, CHANGE_TYPE, ...)
//!  table's columns ──┘                     │
//!                                          ▼
//!                                 issues: backward (a reader of the new schema, data of the old)
//!                                         forward  (a reader of the old schema, data of the new)
//!                                          │
//!                        compatibility: FULL | BACKWARD | FORWARD | NONE; a mode's violations
//! ```
//!
//! A column is identified by its attribute number, so a rename is a rename, not a drop and an
//! add. How a column maps to an Avro field decides the rules: a nullable column is a union with
//! null and the default null; a NOT NULL column is its type alone, with a default only when the
//! column has a constant one (the value PostgreSQL gives the rows that existed before an
//! `ADD COLUMN ... DEFAULT`, or a literal default). The rules, field by field:
//!
//! | change | backward (new reads old) | forward (old reads new) |
//! |---|---|---|
//! | add a column | needs a default (nullable, or a constant default) | yes |
//! | drop a column | yes | needs the old field to have had a default |
//! | rename | yes (the old name is an alias) | no (an old reader loses the value) |
//! | widen a type (int4 → int8, float4 → float8, varchar(n) longer or text) | yes | no for numbers (Avro promotes one way); yes for text |
//! | narrow a type (the reverse) | no | yes |
//! | change the encoding (text → integer, numeric's scale, timestamp ↔ timestamptz) | no | no |
//! | SET NOT NULL | no (old data may hold nulls) | yes |
//! | DROP NOT NULL | yes | no (an old reader gets nulls it cannot hold) |
//! | change a default | yes | yes |
use serde_json::{json, Value};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, Tokenizer};

use crate::{CdcError, CdcResult, ErrorKind, Lsn};

/// One column of a captured table, as the schema history records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// `pg_attribute.attnum`: the column's identity across renames.
    pub attnum: i16,
    /// Its name.
    pub name: String,
    /// Its type as `format_type` prints it (`character varying(50)`).
    pub type_sql: String,
    /// The type's OID.
    pub type_oid: u32,
    /// The type modifier (`atttypmod`, -1 when none).
    pub typmod: i32,
    /// NOT NULL.
    pub not_null: bool,
    /// The default expression, as `pg_get_expr` prints it.
    pub default: Option<String>,
    /// The value the rows that existed before an `ADD COLUMN ... DEFAULT` read (`attmissingval`).
    pub missing: Option<String>,
}

impl Field {
    /// Reads a field as [`Field::to_json`] writes it (the history's `fields` array).
    pub fn from_json(v: &Value) -> Option<Field> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Some(Field {
            attnum: i16::try_from(v.get("attnum")?.as_i64()?).ok()?,
            name: s("name")?,
            type_sql: s("type")?,
            type_oid: u32::try_from(v.get("type_oid")?.as_i64()?).ok()?,
            typmod: i32::try_from(v.get("typmod")?.as_i64()?).ok()?,
            not_null: v.get("not_null")?.as_bool()?,
            default: s("default"),
            missing: s("missing"),
        })
    }

    /// The field as the history stores it.
    pub fn to_json(&self) -> Value {
        let mut v = json!({"attnum": self.attnum, "name": self.name, "type": self.type_sql,
                           "type_oid": self.type_oid, "typmod": self.typmod, "not_null": self.not_null});
        if let Some(d) = &self.default {
            v["default"] = Value::String(d.clone());
        }
        if let Some(m) = &self.missing {
            v["missing"] = Value::String(m.clone());
        }
        v
    }

    /// The constant the field's Avro schema would carry as its default, if any: the value of
    /// the rows older than the column, else a literal default expression (`'standard'::text`).
    pub fn default_value(&self) -> Option<String> {
        if let Some(m) = &self.missing {
            return Some(m.clone());
        }
        self.default.as_deref().and_then(literal)
    }

    /// Whether a reader that lacks the field's value in the data can fill it in: nullable
    /// columns default to null, others need a constant default.
    pub fn has_default(&self) -> bool {
        !self.not_null || self.default_value().is_some()
    }
}

/// The value of a literal default expression as `pg_get_expr` prints it: `'text'::type`,
/// a number, `true`/`false`; `None` for anything computed (`now()`, `nextval(...)`).
fn literal(expr: &str) -> Option<String> {
    let e = expr.trim();
    // Strip one trailing cast (`::character varying`, `::numeric`), then parentheses.
    let e = match e.rfind("::") {
        Some(i) if e.starts_with('\'') || e.starts_with('(') || e[..i].parse::<f64>().is_ok() => &e[..i],
        _ => e,
    };
    let e = e.trim_start_matches('(').trim_end_matches(')');
    if let Some(body) = e.strip_prefix('\'').and_then(|b| b.strip_suffix('\'')) {
        // A quote inside is doubled; any other lone quote means this was not one literal.
        let mut out = String::with_capacity(body.len());
        let mut chars = body.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\'' && chars.next() != Some('\'') {
                return None;
            }
            out.push(c);
        }
        return Some(out);
    }
    if e == "true" || e == "false" || e.parse::<f64>().is_ok() {
        return Some(e.to_string());
    }
    None
}

/// One difference between two versions of a table's columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A column added.
    AddField {
        /// The column.
        field: Field,
    },
    /// A column dropped.
    DropField {
        /// The column as it was.
        field: Field,
    },
    /// A column renamed.
    RenameField {
        /// The column before.
        from: Field,
        /// After.
        to: Field,
    },
    /// A column's type changed.
    ChangeType {
        /// The column before.
        from: Field,
        /// After.
        to: Field,
    },
    /// NOT NULL set.
    SetRequired {
        /// The column after.
        field: Field,
    },
    /// NOT NULL dropped.
    SetOptional {
        /// The column after.
        field: Field,
    },
    /// The default changed (set, dropped or replaced).
    ChangeDefault {
        /// The column before.
        from: Field,
        /// After.
        to: Field,
    },
}

impl Change {
    /// The change as `cdc_schema_history` shows it.
    pub fn to_json(&self) -> Value {
        match self {
            Change::AddField { field } => {
                let mut v = json!({"type": "ADD_FIELD", "field": field.name, "field_type": field.type_sql,
                                   "required": field.not_null});
                if let Some(d) = field.default_value().or_else(|| field.default.clone()) {
                    v["default"] = Value::String(d);
                }
                v
            }
            Change::DropField { field } => json!({"type": "DROP_FIELD", "field": field.name}),
            Change::RenameField { from, to } => json!({"type": "RENAME_FIELD", "field": to.name, "from": from.name}),
            Change::ChangeType { from, to } => {
                json!({"type": "CHANGE_TYPE", "field": to.name, "from": from.type_sql, "to": to.type_sql})
            }
            Change::SetRequired { field } => json!({"type": "SET_REQUIRED", "field": field.name}),
            Change::SetOptional { field } => json!({"type": "SET_OPTIONAL", "field": field.name}),
            Change::ChangeDefault { from, to } => {
                json!({"type": "CHANGE_DEFAULT", "field": to.name, "from": from.default, "to": to.default})
            }
        }
    }
}

/// The changes from `old` to `new` (columns matched by attribute number), in column order:
/// drops first, then the columns that are in both, then additions.
pub fn diff(old: &[Field], new: &[Field]) -> Vec<Change> {
    let mut out = Vec::new();
    for o in old {
        if !new.iter().any(|n| n.attnum == o.attnum) {
            out.push(Change::DropField { field: o.clone() });
        }
    }
    for n in new {
        let Some(o) = old.iter().find(|o| o.attnum == n.attnum) else { continue };
        if o.name != n.name {
            out.push(Change::RenameField { from: o.clone(), to: n.clone() });
        }
        if o.type_oid != n.type_oid || o.typmod != n.typmod {
            out.push(Change::ChangeType { from: o.clone(), to: n.clone() });
        }
        if !o.not_null && n.not_null {
            out.push(Change::SetRequired { field: n.clone() });
        }
        if o.not_null && !n.not_null {
            out.push(Change::SetOptional { field: n.clone() });
        }
        if o.default != n.default {
            out.push(Change::ChangeDefault { from: o.clone(), to: n.clone() });
        }
    }
    for n in new {
        if !old.iter().any(|o| o.attnum == n.attnum) {
            out.push(Change::AddField { field: n.clone() });
        }
    }
    out
}

/// Which readers an issue breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A consumer on the new schema reading events written with the old one.
    Backward,
    /// A consumer still on the old schema reading events written with the new one.
    Forward,
}

/// One reason a change is not compatible in one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Which readers it breaks.
    pub direction: Direction,
    /// The column (its new name, or its old one when dropped).
    pub field: String,
    /// A short title, e.g. "Required field without default".
    pub title: &'static str,
    /// The sentence a WARNING shows: "Field 'x' is required but has no default".
    pub detail: String,
    /// How to avoid it.
    pub fix: String,
    /// The statement that avoids it, when one does.
    pub statement: Option<String>,
}

/// How a type's values are encoded for a consumer: types in one family share an encoding and
/// may only widen or narrow within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// int2 < int4 < int8 < float4 < float8: Avro's int, long, float, double promotions.
    Number(u8),
    /// text, varchar, bpchar: Avro string; the rank is the length limit (`u32::MAX` = none).
    Text(u32),
    /// numeric(p, s): Avro decimal with that scale; `None` when unconstrained.
    Decimal { precision: Option<u16>, scale: Option<u16> },
    /// Anything else: only the very same type is compatible.
    Other(u32, i32),
}

fn family(type_oid: u32, typmod: i32) -> Family {
    match type_oid {
        21 => Family::Number(1),
        23 => Family::Number(2),
        20 => Family::Number(3),
        700 => Family::Number(4),
        701 => Family::Number(5),
        25 => Family::Text(u32::MAX),
        1043 | 1042 => Family::Text(if typmod >= 4 { (typmod - 4) as u32 } else { u32::MAX }),
        1700 if typmod >= 4 => {
            let t = typmod - 4;
            Family::Decimal { precision: Some(((t >> 16) & 0xffff) as u16), scale: Some((t & 0xffff) as u16) }
        }
        1700 => Family::Decimal { precision: None, scale: None },
        _ => Family::Other(type_oid, typmod),
    }
}

/// How a type change moves values: within an encoding, wider or narrower; else a new encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TypeMove {
    /// Every old value fits the new type, and readers of either decode both (text lengths,
    /// decimal precision at the same scale).
    Relaxed,
    /// Every old value fits the new type; an old reader cannot decode new values (numbers).
    Widened,
    /// New values fit the old type; old values may not fit the new one.
    Narrowed,
    /// The encoding changes.
    Incompatible,
}

fn type_move(from: &Field, to: &Field) -> TypeMove {
    match (family(from.type_oid, from.typmod), family(to.type_oid, to.typmod)) {
        (Family::Number(a), Family::Number(b)) => match a.cmp(&b) {
            std::cmp::Ordering::Less => TypeMove::Widened,
            std::cmp::Ordering::Greater => TypeMove::Narrowed,
            std::cmp::Ordering::Equal => TypeMove::Relaxed,
        },
        (Family::Text(a), Family::Text(b)) => {
            if b >= a {
                TypeMove::Relaxed
            } else {
                TypeMove::Narrowed
            }
        }
        (Family::Decimal { precision: pa, scale: sa }, Family::Decimal { precision: pb, scale: sb }) if sa == sb => {
            if pb >= pa {
                TypeMove::Relaxed
            } else {
                TypeMove::Narrowed
            }
        }
        (a, b) if a == b => TypeMove::Relaxed,
        _ => TypeMove::Incompatible,
    }
}

/// A placeholder default for a type in a suggested statement.
fn sample_default(f: &Field) -> &'static str {
    match family(f.type_oid, f.typmod) {
        Family::Number(_) | Family::Decimal { .. } => "0",
        Family::Text(_) => "'unknown'",
        Family::Other(16, _) => "false",
        Family::Other(..) => "...",
    }
}

/// Every compatibility issue of `changes` (from [`diff`]) on the table `table`.
pub fn issues(table: &str, changes: &[Change]) -> Vec<Issue> {
    let mut out = Vec::new();
    let mut push = |direction, field: &str, title, detail: String, fix: String| {
        // A fix that is a statement: "<what>: ALTER TABLE ...".
        let statement = fix.find("ALTER TABLE").map(|i| fix[i..].to_string());
        out.push(Issue { direction, field: field.to_string(), title, detail, fix, statement })
    };
    for c in changes {
        match c {
            Change::AddField { field } if !field.has_default() => push(
                Direction::Backward,
                &field.name,
                "Required field without default",
                format!("Field '{}' is required but has no default", field.name),
                format!(
                    "Add default value: ALTER TABLE {table} ADD COLUMN {} {} DEFAULT {}",
                    field.name,
                    field.type_sql,
                    sample_default(field)
                ),
            ),
            Change::DropField { field } if !field.has_default() => push(
                Direction::Forward,
                &field.name,
                "Required field removed",
                format!("Field '{}' is removed but is required and has no default", field.name),
                format!(
                    "Make it optional first and let consumers move on: ALTER TABLE {table} ALTER COLUMN {} DROP NOT NULL",
                    field.name
                ),
            ),
            Change::RenameField { from, to } => push(
                Direction::Forward,
                &to.name,
                "Field renamed",
                format!("Field '{}' is renamed to '{}': consumers on the old schema lose its value", from.name, to.name),
                format!("Add a column '{}' and keep '{}' until consumers have moved", to.name, from.name),
            ),
            Change::ChangeType { from, to } => match type_move(from, to) {
                TypeMove::Relaxed => {}
                TypeMove::Widened => push(
                    Direction::Forward,
                    &to.name,
                    "Type widened",
                    format!(
                        "Field '{}' changes from {} to {}: consumers on the old schema cannot read the new values",
                        to.name, from.type_sql, to.type_sql
                    ),
                    "Upgrade consumers to the new schema before producers write wider values".to_string(),
                ),
                TypeMove::Narrowed => push(
                    Direction::Backward,
                    &to.name,
                    "Type narrowed",
                    format!(
                        "Field '{}' narrows from {} to {}: events already written may not fit it",
                        to.name, from.type_sql, to.type_sql
                    ),
                    format!("Keep the type {}", from.type_sql),
                ),
                TypeMove::Incompatible => {
                    for direction in [Direction::Backward, Direction::Forward] {
                        push(
                            direction,
                            &to.name,
                            "Type changed",
                            format!(
                                "Field '{}' changes from {} to {}: its encoding changes",
                                to.name, from.type_sql, to.type_sql
                            ),
                            format!("Add a new column of type {} instead of changing '{}'", to.type_sql, to.name),
                        )
                    }
                }
            },
            Change::SetRequired { field } => push(
                Direction::Backward,
                &field.name,
                "Field made required",
                format!("Field '{}' becomes required: events already written may hold null", field.name),
                format!("Keep '{}' nullable", field.name),
            ),
            Change::SetOptional { field } => push(
                Direction::Forward,
                &field.name,
                "Field made optional",
                format!("Field '{}' becomes optional: consumers on the old schema cannot read null", field.name),
                "Upgrade consumers to the new schema first".to_string(),
            ),
            _ => {}
        }
    }
    out
}

/// `schema_evolution.compatibility_mode`: which readers a change must not break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Consumers on a new schema read events of the previous one (Avro's and Confluent's default).
    #[default]
    Backward,
    /// Consumers on the previous schema read events of the new one.
    Forward,
    /// Both.
    Full,
    /// No check.
    None,
}

impl Mode {
    /// Parses the config word.
    pub fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "backward" => Mode::Backward,
            "forward" => Mode::Forward,
            "full" => Mode::Full,
            "none" => Mode::None,
            _ => return None,
        })
    }

    /// The config word.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Backward => "backward",
            Mode::Forward => "forward",
            Mode::Full => "full",
            Mode::None => "none",
        }
    }

    /// Whether the mode forbids issues in `d`.
    pub fn forbids(self, d: Direction) -> bool {
        matches!(
            (self, d),
            (Mode::Full, _) | (Mode::Backward, Direction::Backward) | (Mode::Forward, Direction::Forward)
        )
    }
}

/// The compatibility a set of issues leaves: `FULL` (none), `BACKWARD` (only forward issues),
/// `FORWARD` (only backward issues), `NONE`.
pub fn compatibility(issues: &[Issue]) -> &'static str {
    let back = issues.iter().any(|i| i.direction == Direction::Backward);
    let fwd = issues.iter().any(|i| i.direction == Direction::Forward);
    match (back, fwd) {
        (false, false) => "FULL",
        (false, true) => "BACKWARD",
        (true, false) => "FORWARD",
        (true, true) => "NONE",
    }
}

/// The issues a mode forbids.
pub fn violations(mode: Mode, issues: &[Issue]) -> Vec<&Issue> {
    issues.iter().filter(|i| mode.forbids(i.direction)).collect()
}

/// The message, detail and hint of the WARNING (or, enforced, the ERROR) for a change that
/// breaks `mode`, in the shape of the product description: the issues, who fails, and the ways out.
pub fn break_report(table: &str, version: i32, violated: &[&Issue]) -> (String, String, String) {
    let back = violated.iter().any(|i| i.direction == Direction::Backward);
    let fwd = violated.iter().any(|i| i.direction == Direction::Forward);
    let which = match (back, fwd) {
        (true, true) => "backward or forward",
        (true, false) => "backward",
        _ => "forward",
    };
    let message = format!("Schema change is not {which} compatible");
    let mut detail: Vec<String> = Vec::new();
    for i in violated {
        let line = format!("- {}", i.detail);
        if !detail.contains(&line) {
            detail.push(line);
        }
    }
    detail.push(format!("- Existing consumers using schema v{version} will fail"));
    let mut hint = vec!["Options:".to_string()];
    let fix = violated.first().map(|i| i.fix.clone()).unwrap_or_default();
    hint.push(format!("1. {fix}"));
    hint.push(format!("2. Force break: SELECT cdc_force_schema_break('{table}')"));
    hint.push(format!("3. Create new topic: SELECT cdc_create_version_topic('{table}', {})", version + 1));
    (message, detail.join("\n"), hint.join("\n"))
}

/// A table's schema history as the worker reads it: each version's columns from the WAL
/// position it was recorded at. It lets the capture config, which names columns as the table has
/// them now, find them in a relation of any earlier version (by attribute number), so a column
/// renamed after its change was written is still redacted, excluded or keyed as the config says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct History {
    /// Ascending by LSN.
    versions: Vec<Version>,
}

/// One version of a table's schema, as the history holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// The WAL position it was recorded at (its DDL's, before that DDL committed).
    pub lsn: Lsn,
    /// Its number (1 at `cdc_enable`).
    pub number: i32,
    /// It was recorded under `cdc_force_schema_break`: a break its compatibility mode allowed
    /// once (a schema registry is told to accept it).
    pub forced: bool,
    /// Its events, and those of the versions after it, go to a topic of their own
    /// ([`version_topic`]; `cdc_create_version_topic`): its consumers start afresh there, and
    /// the consumers of the topic before never see it.
    pub own_topic: bool,
    /// Its columns.
    pub fields: Vec<Field>,
}

/// The topic a version with a topic of its own writes to: the table's topic with `.v<version>`
/// appended (a Kafka topic name may hold dots; the Avro and Protobuf subjects follow it).
pub fn version_topic(topic: &str, version: i32) -> String {
    format!("{topic}.v{version}")
}

/// The prefix of the transactional logical message a DDL that records a version writes (content:
/// `<table oid> <version>`): a worker that decodes it and whose history lacks that version read
/// the history before the DDL committed, and reads it again before it encodes anything after.
pub const VERSION_MESSAGE_PREFIX: &str = "pg_cdc.schema_version";

/// The table OID and version a [`VERSION_MESSAGE_PREFIX`] message names.
pub fn parse_version_message(content: &[u8]) -> Option<(u32, i32)> {
    let text = std::str::from_utf8(content).ok()?;
    let (oid, version) = text.split_once(' ')?;
    Some((oid.parse().ok()?, version.parse().ok()?))
}

/// A relation whose columns the history does not know at its position: a version recorded
/// after the history was read (read it again), or a history that does not fit the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    /// The column the history lacks.
    pub column: String,
}

impl History {
    /// A history from its versions, in any order.
    pub fn new(versions: Vec<(Lsn, Vec<Field>)>) -> History {
        let mut versions: Vec<(Lsn, Vec<Field>)> = versions;
        versions.sort_by_key(|(lsn, _)| *lsn);
        let numbered = versions
            .into_iter()
            .enumerate()
            .map(|(i, (lsn, fields))| Version { lsn, number: i as i32 + 1, forced: false, own_topic: false, fields })
            .collect();
        History { versions: numbered }
    }

    /// A history from versions as the catalog holds them, in any order.
    pub fn from_versions(mut versions: Vec<Version>) -> History {
        versions.sort_by_key(|v| v.lsn);
        History { versions }
    }

    /// Its versions, ascending by LSN.
    pub fn versions(&self) -> &[Version] {
        &self.versions
    }

    /// The version in force for a change at `lsn`: the last one recorded before it (a DDL
    /// records its version before it commits, holding the table's lock, so no change of another
    /// transaction falls between the two). `None` for a change older than the history.
    pub fn version_at(&self, lsn: Lsn) -> Option<&Version> {
        self.versions.iter().rev().find(|v| v.lsn < lsn)
    }

    /// The version whose topic a change at `lsn` goes to: the last version with a topic of its
    /// own up to the one in force; `None` for the table's topic.
    pub fn topic_version_at(&self, lsn: Lsn) -> Option<i32> {
        let at = self.version_at(lsn)?.number;
        self.versions.iter().rev().find(|v| v.own_topic && v.number <= at).map(|v| v.number)
    }

    /// Whether it was read before the DDL that recorded version `number` committed: it lacks that
    /// version, and holds nothing recorded after `at` (the position of the DDL's version message,
    /// written after the version). A history holding a later version was read after that DDL, and
    /// lacks the version because the table's history started again since (cdc_disable, then
    /// cdc_enable): not behind.
    pub fn behind(&self, number: i32, at: Lsn) -> bool {
        match self.versions.last() {
            Some(last) => last.lsn < at && !self.versions.iter().any(|v| v.number == number),
            None => false,
        }
    }

    /// The number of versions.
    pub fn len(&self) -> usize {
        self.versions.len()
    }

    /// Whether it has no version.
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty()
    }

    /// For each column of a relation pgoutput sent at `lsn` (a change of a transaction), the
    /// name the column has now, when it had another one then; empty when no column was renamed
    /// since. A relation older than the history (its backlog from before the upgrade that added
    /// it) is taken as it is.
    pub fn aliases(&self, lsn: Lsn, columns: &[&str]) -> Result<Vec<Option<String>>, Behind> {
        let Some(latest) = self.versions.last().map(|v| &v.fields) else { return Ok(Vec::new()) };
        let Some(then) = self.version_at(lsn).map(|v| &v.fields) else { return Ok(Vec::new()) };
        let mut out = Vec::with_capacity(columns.len());
        let mut renamed = false;
        for &name in columns {
            let Some(field) = then.iter().find(|f| f.name == name) else {
                return Err(Behind { column: name.to_string() });
            };
            let now = latest.iter().find(|f| f.attnum == field.attnum).map(|f| &f.name);
            match now {
                Some(n) if n != name => {
                    renamed = true;
                    out.push(Some(n.clone()));
                }
                _ => out.push(None),
            }
        }
        Ok(if renamed { out } else { Vec::new() })
    }
}

/// What a consumer can read next, by the last event it consumed: the version in force at that
/// event's position (the first version when the event is older than the history), and whether
/// it can read every later version's events (each later version is FORWARD or FULL compatible
/// with the one before: an old schema reads newer events). `versions` are (number, recorded at,
/// compatibility), ascending.
pub fn reader_status(versions: &[(i32, Lsn, Option<&str>)], at: Lsn) -> Option<(i32, bool)> {
    let first = versions.first()?;
    let using = versions.iter().rev().find(|(_, lsn, _)| *lsn < at).unwrap_or(first).0;
    let reads_newer =
        versions.iter().filter(|(n, _, _)| *n > using).all(|(_, _, c)| matches!(c, Some("FORWARD") | Some("FULL")));
    Some((using, reads_newer))
}

/// The versions each topic of a table carries, from `versions` (number, has a topic of its own),
/// ascending: the table's topic (`None`) up to the first version with a topic of its own, then
/// each such version's topic up to the next one.
pub fn topic_segments(versions: &[(i32, bool)]) -> Vec<(Option<i32>, Vec<i32>)> {
    let mut out: Vec<(Option<i32>, Vec<i32>)> = vec![(None, Vec::new())];
    for &(number, own_topic) in versions {
        if own_topic {
            out.push((Some(number), Vec::new()));
        }
        out.last_mut().expect("one segment at least").1.push(number);
    }
    out
}

/// `name` as an identifier in an expression: bare when PostgreSQL would read it back unchanged.
fn quote_ident(name: &str) -> String {
    let simple = name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let keyword = Tokenizer::new(&PostgreSqlDialect {}, name)
        .tokenize()
        .ok()
        .and_then(|t| t.into_iter().next())
        .is_some_and(|t| matches!(t, Token::Word(w) if w.keyword != Keyword::NoKeyword));
    if simple && !keyword {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// A filter or computed-column expression with the column `from` renamed to `to`: every
/// identifier that names it (unquoted ones fold to lower case, as PostgreSQL reads them), not a
/// function's name; the rest of the text stays as the user wrote it. `None` when it does not
/// name the column (or does not tokenize: it was validated when stored, so that does not happen).
pub fn rename_in_expression(text: &str, from: &str, to: &str) -> Option<String> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, text).tokenize_with_location().ok()?;
    // Byte offset of each line's start (locations are 1-based lines and characters).
    let starts: Vec<usize> =
        std::iter::once(0).chain(text.char_indices().filter(|(_, c)| *c == '\n').map(|(i, _)| i + 1)).collect();
    let offset = |line: u64, column: u64| -> Option<usize> {
        let start = *starts.get(usize::try_from(line).ok()?.checked_sub(1)?)?;
        let col = usize::try_from(column).ok()?.checked_sub(1)?;
        Some(text[start..].char_indices().nth(col).map_or(text.len(), |(i, _)| start + i))
    };
    let significant = |i: usize, step: isize| {
        let mut j = i as isize + step;
        while j >= 0 && (j as usize) < tokens.len() {
            if !matches!(tokens[j as usize].token, Token::Whitespace(_)) {
                return Some(&tokens[j as usize].token);
            }
            j += step;
        }
        None
    };
    let mut spans = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let Token::Word(w) = &t.token else { continue };
        let names_it = match w.quote_style {
            Some('"') => w.value == from,
            None => w.value.to_lowercase() == from,
            Some(_) => false,
        };
        if !names_it
            || matches!(significant(i, 1), Some(Token::LParen))
            || matches!(significant(i, -1), Some(Token::Period))
        {
            continue;
        }
        spans.push((offset(t.span.start.line, t.span.start.column)?, offset(t.span.end.line, t.span.end.column)?));
    }
    if spans.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(text.len() + 8);
    let mut at = 0;
    for (a, b) in spans {
        out.push_str(&text[at..a]);
        out.push_str(&quote_ident(to));
        at = b;
    }
    out.push_str(&text[at..]);
    Some(out)
}

/// A capture config (as `cdc_enable` stored it) with the column `from` renamed to `to` wherever
/// it names it: the column lists, `key_columns`, `partition_key`, `pii_columns`, each
/// transformation's column and source column, the filter and the computed columns' expressions.
/// `None` when it names the column nowhere.
pub fn rename_in_config(config: &Value, from: &str, to: &str) -> Option<Value> {
    let mut out = config.clone();
    let mut changed = false;
    let mut rename_list = |v: Option<&mut Value>| {
        if let Some(Value::Array(items)) = v {
            for item in items.iter_mut() {
                if item.as_str() == Some(from) {
                    *item = Value::String(to.to_string());
                    changed = true;
                }
            }
        }
    };
    rename_list(out.get_mut("include_columns"));
    rename_list(out.get_mut("exclude_columns"));
    rename_list(out.get_mut("key_columns"));
    rename_list(out.pointer_mut("/compliance/pii_columns"));
    let mut rename_str = |v: Option<&mut Value>| {
        if let Some(v) = v.filter(|v| v.as_str() == Some(from)) {
            *v = Value::String(to.to_string());
            changed = true;
        }
    };
    rename_str(out.get_mut("partition_key"));
    rename_str(out.pointer_mut("/regional_routing/routing_column"));
    if let Some(Value::Array(ts)) = out.get_mut("transformations") {
        for t in ts.iter_mut() {
            rename_str(t.get_mut("column"));
            rename_str(t.get_mut("source_column"));
        }
    }
    let mut rename_expr = |v: Option<&mut Value>| {
        if let Some(v) = v {
            if let Some(new) = v.as_str().and_then(|t| rename_in_expression(t, from, to)) {
                *v = Value::String(new);
                changed = true;
            }
        }
    };
    rename_expr(out.get_mut("filter"));
    rename_expr(out.get_mut("filter_expression"));
    if let Some(Value::Array(ts)) = out.get_mut("transformations") {
        for t in ts.iter_mut() {
            rename_expr(t.get_mut("expression"));
        }
    }
    changed.then_some(out)
}

/// Resolves a type as SQL writes it (`VARCHAR(10)`) to its OID, type modifier and the name
/// `format_type` prints: PostgreSQL's own parser, which the caller has.
pub type ResolveType<'a> = dyn Fn(&str) -> Option<(u32, i32, String)> + 'a;

/// The columns a table would have after `change`, the column part of an ALTER TABLE
/// (`ADD COLUMN priority varchar(10) NOT NULL`, several separated by commas), applied to its
/// columns now. Parses with the SQL parser the filters use; runs nothing. Refuses what is not a
/// column change (22023), a column that does not exist (42703), a type that does not (42704).
pub fn propose(current: &[Field], change: &str, resolve: &ResolveType) -> CdcResult<Vec<Field>> {
    use sqlparser::ast::{AlterColumnOperation, AlterTableOperation, ColumnOption, Ident, Statement};
    use sqlparser::parser::Parser;

    let not_a_column_change = |what: &str| {
        CdcError::new(ErrorKind::InvalidParameter, format!("proposed_change is not a column change: {what}")).hint(
            "Give the column part of an ALTER TABLE: ADD COLUMN, DROP COLUMN, RENAME COLUMN, or ALTER COLUMN with \
             TYPE, SET NOT NULL, DROP NOT NULL, SET DEFAULT or DROP DEFAULT; several separated by commas.",
        )
    };
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, &format!("ALTER TABLE pg_cdc_proposed {change}"))
        .map_err(|e| {
            // Its position is in the statement wrapped around the change: leave it out.
            let e = e.to_string();
            let e = e.split(" at Line: ").next().unwrap_or(&e).trim_start_matches("sql parser error: ");
            CdcError::new(ErrorKind::SyntaxError, format!("proposed_change does not parse: {e}"))
        })?;
    let [Statement::AlterTable(alter)] = statements.as_slice() else {
        return Err(not_a_column_change("it is more than one statement"));
    };
    // Unquoted names fold to lower case, as PostgreSQL reads them.
    let name = |i: &Ident| if i.quote_style.is_some() { i.value.clone() } else { i.value.to_lowercase() };
    let mut fields = current.to_vec();
    // A new column gets the next attribute number, never a dropped one's.
    let mut next_attnum = current.iter().map(|f| f.attnum).max().unwrap_or(0).saturating_add(1);
    let find = |fields: &[Field], column: &str| {
        fields
            .iter()
            .position(|f| f.name == column)
            .ok_or_else(|| CdcError::new(ErrorKind::UndefinedColumn, format!("column \"{column}\" does not exist")))
    };
    let type_of = |data_type: &str| {
        resolve(data_type)
            .ok_or_else(|| CdcError::new(ErrorKind::UndefinedObject, format!("type \"{data_type}\" does not exist")))
    };
    for op in &alter.operations {
        match op {
            AlterTableOperation::AddColumn { column_def, .. } => {
                let column = name(&column_def.name);
                if fields.iter().any(|f| f.name == column) {
                    return Err(CdcError::new(
                        ErrorKind::InvalidParameter,
                        format!("column \"{column}\" exists already"),
                    ));
                }
                let (type_oid, typmod, type_sql) = type_of(&column_def.data_type.to_string())?;
                let mut field = Field {
                    attnum: next_attnum,
                    name: column,
                    type_sql,
                    type_oid,
                    typmod,
                    not_null: false,
                    default: None,
                    missing: None,
                };
                for o in &column_def.options {
                    match &o.option {
                        ColumnOption::NotNull | ColumnOption::PrimaryKey(_) => field.not_null = true,
                        ColumnOption::Null => field.not_null = false,
                        ColumnOption::Default(e) => {
                            let text = e.to_string();
                            field.missing = literal(&text);
                            field.default = Some(text);
                        }
                        ColumnOption::Generated { .. } => {
                            return Err(not_a_column_change("a generated column is not published"))
                        }
                        _ => {}
                    }
                }
                fields.push(field);
                next_attnum = next_attnum.saturating_add(1);
            }
            AlterTableOperation::DropColumn { column_names, .. } => {
                for c in column_names {
                    let i = find(&fields, &name(c))?;
                    fields.remove(i);
                }
            }
            AlterTableOperation::RenameColumn { old_column_name, new_column_name } => {
                let i = find(&fields, &name(old_column_name))?;
                fields[i].name = name(new_column_name);
            }
            AlterTableOperation::AlterColumn { column_name, op } => {
                let i = find(&fields, &name(column_name))?;
                let f = &mut fields[i];
                match op {
                    AlterColumnOperation::SetNotNull => f.not_null = true,
                    AlterColumnOperation::DropNotNull => f.not_null = false,
                    AlterColumnOperation::SetDefault { value } => f.default = Some(value.to_string()),
                    AlterColumnOperation::DropDefault => f.default = None,
                    AlterColumnOperation::SetDataType { data_type, .. } => {
                        let (type_oid, typmod, type_sql) = type_of(&data_type.to_string())?;
                        (f.type_oid, f.typmod, f.type_sql) = (type_oid, typmod, type_sql);
                    }
                    other => return Err(not_a_column_change(&other.to_string())),
                }
            }
            other => return Err(not_a_column_change(&other.to_string())),
        }
    }
    Ok(fields)
}

#[cfg(test)]
mod tests;
