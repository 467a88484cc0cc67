//! The PostgreSQL apply sink (`postgres`): the stream applied to tables of another database (or
//! the same one) as upserts and deletes, through its own libpq connection.
//!
//! Idempotent by LSN: every row the sink writes has its version, the `(commit_lsn, lsn)` of the
//! change that wrote it, in a side table of the target (`<state_schema>.row_versions`); a change
//! is applied only when it is newer than the row's version, so a duplicate or a change delivered
//! late is a no-op. A delete keeps the row's version as a tombstone (for
//! `tombstone_retention_hours`), so a stale insert cannot bring the row back; a TRUNCATE keeps its
//! version for the table (`<state_schema>.tables`), so rows older than it stay gone. For one key,
//! commit order is the order its changes happened (a row's changes are serialized by its row lock),
//! so the newest version is the row as the source has it.
//!
//! ```text
//!  send: BEGIN (first send of a unit) ─▶ per table and schema version: follow the source's DDL,
//!        read the versions of the keys, keep per key the changes newer than them, merged in
//!        version order ─▶ DELETE / INSERT ... ON CONFLICT DO UPDATE ─▶ write the new versions
//!  flush: record the unit's end LSN (<state_schema>.pipelines) ─▶ COMMIT
//! ```
//!
//! A failure rolls the unit back; the worker reads it again and the versions make it exactly
//! once in effect. Target tables that are missing are created from the source table's schema
//! history (columns nullable, the key as the primary key); after an `ALTER TABLE` of the source
//! the target follows the history's diff (columns added, with the value earlier rows read,
//! dropped, renamed, retyped), and a renamed source table (known by its OID) renames its target
//! table; a change the target cannot take stops the sink with the reason.
pub mod config;
pub mod libpq;
#[cfg(test)]
mod tests;
pub mod values;

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use cdc_core::envelope::{Event, Op};
use cdc_core::schema::{diff, Change, Field, History};
use cdc_core::Lsn;
use serde_json::value::RawValue;

use self::config::PostgresSinkConfig;
use self::values::{text_array, to_text, ValueKind};
use crate::format::event::JsonEvent;
use crate::{ErrorClass, PublishStats, Sink, SinkError};

/// Rows of a result, every value as text (`None`: NULL).
pub type Rows = Vec<Vec<Option<String>>>;

/// A failed statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetError {
    /// Its SQLSTATE.
    pub sqlstate: String,
    /// The server's message (and detail).
    pub message: String,
    /// The connection is gone or unusable.
    pub connection: bool,
}

impl TargetError {
    /// A connection that failed or broke.
    pub fn connection(message: String) -> TargetError {
        TargetError { sqlstate: "08006".into(), message, connection: true }
    }

    /// Transient (connection, serialization failure, deadlock, resources, shutdown, lock not
    /// available) or for an operator (everything else: permissions, a type the target lacks, a
    /// value the column refuses).
    pub fn class(&self) -> ErrorClass {
        if self.connection {
            return ErrorClass::Retry;
        }
        match self.sqlstate.get(..2).unwrap_or("") {
            "08" | "40" | "53" | "55" | "57" | "58" => ErrorClass::Retry,
            _ => ErrorClass::Operator,
        }
    }
}

/// The target database: statements with text parameters (the adapter is [`libpq::Libpq`]).
pub trait Target: Send {
    /// Runs one statement; its parameters are text (`None`: NULL), their types inferred. Without
    /// parameters, `sql` may hold several statements.
    fn query(&mut self, sql: &str, params: &[Option<&str>]) -> Result<Rows, TargetError>;
}

/// A captured table as the sink needs it: its key and schema history (its names come with its
/// events, as the relation has them at the change).
#[derive(Debug, Clone)]
pub struct SourceTable {
    /// The key columns (primary key or replica identity index), in order.
    pub key_columns: Vec<String>,
    /// Its schema history (empty on a catalog without one: the target table must then exist).
    pub history: History,
}

/// A change's position in the source: `(commit LSN, LSN)`.
pub type Version = (u64, u64);

/// Columns of a row image: name and value (JSON text until converted; `None`: NULL).
pub type Image = Vec<(String, Option<String>)>;

/// A table's part of a segment: its row changes, its latest TRUNCATE, its schema version (number
/// and LSN) and its first event (for the relation's names).
type TablePart<'e> = (Vec<RowChange>, Option<Version>, Option<(i32, Lsn)>, &'e Event);

/// Quotes an identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a string literal.
fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn lsn_text(v: u64) -> String {
    Lsn(v).to_string()
}

fn parse_lsn(s: Option<&String>) -> u64 {
    s.and_then(|s| s.parse::<Lsn>().ok()).map_or(0, |l| l.0)
}

/// The advisory lock (one bigint key) apply sinks take in the target while they create tables.
const CREATE_LOCK: i64 = 0x7067_6364_6361_7031; // "pgcdcap1"

/// The bookkeeping tables, created when missing.
pub fn state_ddl(state_schema: &str) -> String {
    let s = quote_ident(state_schema);
    // One transaction, under an advisory lock: sinks opening at once would otherwise race to create
    // the schema (IF NOT EXISTS does not wait for a concurrent creator).
    format!(
        "BEGIN;
         SELECT pg_advisory_xact_lock({CREATE_LOCK});
         CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.pipelines (
             pipeline text PRIMARY KEY, sink text NOT NULL, source text NOT NULL,
             applied_lsn pg_lsn, applied_at timestamptz);
         CREATE TABLE IF NOT EXISTS {s}.tables (
             pipeline text NOT NULL, table_name text NOT NULL, source_table text NOT NULL,
             source_oid bigint, target_schema text, target_name text,
             schema_version integer, schema_lsn pg_lsn, truncated_commit_lsn pg_lsn, truncated_lsn pg_lsn,
             PRIMARY KEY (pipeline, table_name));
         CREATE TABLE IF NOT EXISTS {s}.row_versions (
             pipeline text NOT NULL, table_name text NOT NULL, key jsonb NOT NULL,
             commit_lsn pg_lsn NOT NULL, lsn pg_lsn NOT NULL, deleted_at timestamptz,
             PRIMARY KEY (pipeline, table_name, key));
         CREATE INDEX IF NOT EXISTS row_versions_tombstones ON {s}.row_versions (deleted_at)
             WHERE deleted_at IS NOT NULL;
         COMMIT"
    )
}

/// One column of a target table.
#[derive(Debug, Clone)]
struct Column {
    name: String,
    type_sql: String,
    kind: ValueKind,
}

/// A target table as the sink found it.
#[derive(Debug, Clone)]
struct TargetTable {
    /// `"schema"."name"`.
    quoted: String,
    /// `schema.name`, its name in the bookkeeping tables.
    label: String,
    columns: Vec<Column>,
    /// The key columns' indexes in `columns`, in the source key's order.
    key: Vec<usize>,
    /// The source schema version it has, by number and the LSN the history recorded it at (`None`:
    /// not recorded yet).
    synced: Option<(i32, u64)>,
    /// The version of the last TRUNCATE applied.
    truncated: Version,
}

impl TargetTable {
    fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

/// What one change does to its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowOp {
    /// Insert or update these columns (name, text; `None`: NULL). Columns left out keep their
    /// value (unchanged TOAST) or take their default.
    Upsert(Image),
    /// Delete the row.
    Delete,
}

/// One change of one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowChange {
    /// The key: a JSON object of the key columns' event values, in key order.
    pub key: String,
    /// Its position in the source.
    pub version: Version,
    /// What it does.
    pub op: RowOp,
}

/// The changes of one key folded into what is left to do, given the version the target has:
/// changes at or below `stored` are dropped (duplicates, late ones); the others are merged in
/// version order (an upsert's columns over the earlier upsert's, a delete clearing them). `None`:
/// nothing newer. Returns the action and its version.
pub fn fold(changes: &[&RowChange], stored: Version) -> Option<(RowOp, Version)> {
    let mut newer: Vec<&RowChange> = changes.iter().copied().filter(|c| c.version > stored).collect();
    newer.sort_by_key(|c| c.version);
    newer.dedup_by_key(|c| c.version);
    let last = newer.last()?.version;
    let mut state: Option<RowOp> = None;
    for c in newer {
        state = Some(match (&c.op, state) {
            (RowOp::Delete, _) => RowOp::Delete,
            (RowOp::Upsert(cols), Some(RowOp::Upsert(mut prev))) => {
                for (name, v) in cols {
                    match prev.iter_mut().find(|(n, _)| n == name) {
                        Some(slot) => slot.1 = v.clone(),
                        None => prev.push((name.clone(), v.clone())),
                    }
                }
                RowOp::Upsert(prev)
            }
            (RowOp::Upsert(cols), _) => RowOp::Upsert(cols.clone()),
        });
    }
    state.map(|s| (s, last))
}

/// The key object of a row image: `{"k1":v1,...}` from the event's own value texts, so the same
/// key always gives the same text. `None` when a key column is missing from the image.
fn key_of(fields: &[(crate::format::event::Name<'_>, &RawValue)], key_columns: &[String]) -> Option<String> {
    let mut out = String::from("{");
    for (i, k) in key_columns.iter().enumerate() {
        let (_, v) = fields.iter().find(|(n, _)| n.0 == k.as_str())?;
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(k).ok()?);
        out.push(':');
        out.push_str(v.get());
    }
    out.push('}');
    Some(out)
}

/// An event of the sink's unit, read for applying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Row changes (an UPDATE of the key gives a delete of the old key and an upsert of the new).
    Rows(Vec<RowChange>),
    /// A TRUNCATE at this version.
    Truncate(Version),
}

/// Reads one event into its row changes. Values stay JSON text here; they are converted when the
/// target column's type is known.
pub fn read_event(event: &Event, key_columns: &[String]) -> Result<Applied, String> {
    let version = (event.commit_lsn.0, event.lsn.0);
    if event.op == Op::Truncate {
        return Ok(Applied::Truncate(version));
    }
    let parsed: JsonEvent<'_> =
        serde_json::from_slice(&event.payload).map_err(|e| format!("cannot read the event: {e}"))?;
    let table = format!("{}.{}", event.schema, event.table);
    if key_columns.is_empty() {
        return Err(format!(
            "table {table} has no key: the postgres sink applies rows by their key (give it a primary key, \
             or REPLICA IDENTITY USING INDEX on a unique index)"
        ));
    }
    let skip = parsed.metadata.unchanged_toast_columns.unwrap_or_default();
    let image = |f: &crate::format::event::Fields<'_>| -> Image {
        f.0.iter()
            .filter(|(n, _)| !skip.iter().any(|s| s == n.0.as_ref()))
            .map(|(n, v)| (n.0.to_string(), Some(v.get().to_string())))
            .collect()
    };
    let missing_key = || format!("an event of {table} lacks its key columns ({})", key_columns.join(", "));
    let mut out = Vec::new();
    match event.op {
        Op::Delete => {
            let before = parsed.before.as_ref().ok_or_else(missing_key)?;
            let key = key_of(&before.0, key_columns).ok_or_else(missing_key)?;
            out.push(RowChange { key, version, op: RowOp::Delete });
        }
        Op::Insert | Op::Update | Op::Read => {
            let after = parsed.after.as_ref().ok_or_else(missing_key)?;
            let key = key_of(&after.0, key_columns).ok_or_else(missing_key)?;
            if let Some(old) = parsed.before.as_ref().and_then(|b| key_of(&b.0, key_columns)) {
                if old != key {
                    out.push(RowChange { key: old, version, op: RowOp::Delete });
                }
            }
            out.push(RowChange { key, version, op: RowOp::Upsert(image(after)) });
        }
        Op::Truncate => unreachable!(),
    }
    Ok(Applied::Rows(out))
}

/// Test-only: the sink reorders and repeats what it is sent (`cdc.test_apply_shuffle`), as a
/// transport that delivers late and twice would, to prove the versions make that harmless. What
/// it holds back is lost if the worker stops.
struct Shuffle {
    state: u64,
    held: Vec<Event>,
    /// The negative control: apply in arrival order, the versions ignored (the target must then
    /// differ from the source).
    ignore_versions: bool,
}

impl Shuffle {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// What to apply now in place of `events`.
    fn mix(&mut self, events: &[Event], drain: bool) -> Vec<Event> {
        let mut now = Vec::with_capacity(events.len());
        for e in events {
            match self.next() % 6 {
                0 | 1 => self.held.push(e.clone()),
                2 => {
                    now.push(e.clone());
                    self.held.push(e.clone());
                }
                _ => now.push(e.clone()),
            }
        }
        let release_all = drain || self.held.len() > 4000;
        let mut kept = Vec::new();
        for e in std::mem::take(&mut self.held) {
            if release_all || self.next().is_multiple_of(2) {
                now.push(e);
            } else {
                kept.push(e);
            }
        }
        self.held = kept;
        for i in (1..now.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            now.swap(i, j);
        }
        now
    }
}

/// The apply sink over its target connection.
pub struct PostgresSink<T> {
    target: T,
    cfg: PostgresSinkConfig,
    /// The pipeline's name in the bookkeeping tables (stable for the sink's life).
    pipeline: String,
    /// The sink's name (shown in `pipelines`).
    sink_name: String,
    /// The source database (shown in `pipelines`).
    source: String,
    sources: HashMap<u32, SourceTable>,
    tables: HashMap<u32, TargetTable>,
    in_unit: bool,
    last_expiry: Option<Instant>,
    shuffle: Option<Shuffle>,
}

fn operator(message: String) -> SinkError {
    SinkError { class: ErrorClass::Operator, message }
}

fn target_error(what: &str, e: TargetError) -> SinkError {
    SinkError { class: e.class(), message: format!("{what}: {} (SQLSTATE {})", e.message, e.sqlstate) }
}

impl<T: Target> PostgresSink<T> {
    /// A sink over an open connection, for the tables in `sources` (by OID).
    pub fn new(
        target: T,
        cfg: &PostgresSinkConfig,
        pipeline: String,
        sink_name: String,
        source: String,
        sources: HashMap<u32, SourceTable>,
    ) -> Self {
        PostgresSink {
            target,
            cfg: cfg.clone(),
            pipeline,
            sink_name,
            source,
            sources,
            tables: HashMap::new(),
            in_unit: false,
            last_expiry: None,
            shuffle: None,
        }
    }

    /// Test-only: reorder and repeat what is sent (see `cdc.test_apply_shuffle`); a negative seed
    /// also ignores the row versions, applying changes in the order they arrive (the negative
    /// control of the apply tests).
    pub fn set_shuffle(&mut self, seed: i64) {
        self.shuffle =
            (seed != 0).then_some(Shuffle { state: seed.unsigned_abs(), held: Vec::new(), ignore_versions: seed < 0 });
    }

    fn q(&mut self, what: &str, sql: &str, params: &[Option<&str>]) -> Result<Rows, SinkError> {
        self.target.query(sql, params).map_err(|e| target_error(what, e))
    }

    fn state(&self) -> String {
        quote_ident(&self.cfg.state_schema)
    }

    /// Reads a target table (`None`: it does not exist).
    fn load_table(
        &mut self,
        schema: &str,
        name: &str,
        key_columns: &[String],
    ) -> Result<Option<TargetTable>, SinkError> {
        let quoted = format!("{}.{}", quote_ident(schema), quote_ident(name));
        let label = format!("{schema}.{name}");
        let rows = self.q(
            "cannot read the target table",
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), b.oid::int8, b.typcategory::text,
                    CASE WHEN b.typcategory = 'A' THEN coalesce(nullif(e.typbasetype, 0), e.oid) ELSE 0 END::int8
               FROM pg_attribute a
               JOIN pg_type t ON t.oid = a.atttypid
               JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
               LEFT JOIN pg_type e ON e.oid = b.typelem
              WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
              ORDER BY a.attnum",
            &[Some(&quoted)],
        )?;
        if rows.is_empty() {
            return Ok(None);
        }
        let text = |r: &Vec<Option<String>>, i: usize| r.get(i).cloned().flatten().unwrap_or_default();
        let columns: Vec<Column> = rows
            .iter()
            .map(|r| Column {
                name: text(r, 0),
                type_sql: text(r, 1),
                kind: ValueKind::of(text(r, 2).parse().unwrap_or(0), &text(r, 3), text(r, 4).parse().unwrap_or(0)),
            })
            .collect();
        let mut key = Vec::new();
        for k in key_columns {
            match columns.iter().position(|c| &c.name == k) {
                Some(i) => key.push(i),
                None => {
                    return Err(operator(format!(
                        "target table {label} has no column \"{k}\" (a key column of the source table)"
                    )))
                }
            }
        }
        let mut sorted: Vec<&str> = key_columns.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        let unique = self.q(
            "cannot read the target table's indexes",
            "SELECT 1 FROM pg_index i
              WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
                AND (SELECT array_agg(a.attname::text ORDER BY a.attname::text) FROM pg_attribute a
                      WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)) = $2::text[]",
            &[Some(&quoted), Some(&text_array(sorted.iter().map(|s| Some(*s))))],
        )?;
        if unique.is_empty() {
            return Err(operator(format!(
                "target table {label} has no primary key or unique index on ({}), the source table's key",
                key_columns.join(", ")
            )));
        }
        let st = self.state();
        let info = self.q(
            "cannot read the sink's bookkeeping",
            &format!(
                "SELECT schema_version::text, truncated_commit_lsn::text, truncated_lsn::text, schema_lsn::text
                   FROM {st}.tables
                  WHERE pipeline = $1 AND table_name = $2"
            ),
            &[Some(&self.pipeline.clone()), Some(&label)],
        )?;
        let (synced, truncated) = match info.first() {
            Some(r) => (
                r.first()
                    .cloned()
                    .flatten()
                    .and_then(|v| v.parse().ok())
                    .map(|n| (n, parse_lsn(r.get(3).and_then(Option::as_ref)))),
                (parse_lsn(r.get(1).and_then(Option::as_ref)), parse_lsn(r.get(2).and_then(Option::as_ref))),
            ),
            None => (None, (0, 0)),
        };
        Ok(Some(TargetTable { quoted, label, columns, key, synced, truncated }))
    }

    /// The target table of source table `oid`, its schema at least at `version` (read, created
    /// or altered as needed).
    fn table_for(
        &mut self,
        oid: u32,
        number: Option<(i32, Lsn)>,
        src_schema: &str,
        src_name: &str,
    ) -> Result<(), SinkError> {
        let Some(src) = self.sources.get(&oid).cloned() else {
            // A table added to the sink since it opened: the worker opens it again with the table.
            return Err(SinkError {
                class: ErrorClass::Retry,
                message: format!("table {oid} is new to the sink; it is opened again to learn it"),
            });
        };
        let version = match number {
            // The version itself (a history that started over since the sink read it, the table
            // disabled and enabled again, numbers from 1 again at other LSNs).
            Some((n, at)) => match src.history.versions().iter().find(|v| v.number == n && v.lsn == at) {
                Some(v) => Some(v.clone()),
                None => {
                    // A DDL since the sink opened: opened again, it reads the history with it.
                    return Err(SinkError {
                        class: ErrorClass::Retry,
                        message: format!(
                            "table {src_schema}.{src_name} is at schema version {n}, which the history the sink \
                             read does not have there (a DDL, or the table enabled again, since it opened); it is \
                             opened again to read it"
                        ),
                    });
                }
            },
            None => None,
        };
        let schema = self.cfg.schema.clone().unwrap_or_else(|| src_schema.to_string());
        let name = src_name.to_string();
        let source_table = format!("{src_schema}.{src_name}");
        // The relation's names come with each event: one renamed since is looked up (and followed) again.
        let label = format!("{schema}.{name}");
        if self.tables.get(&oid).is_some_and(|t| t.label != label) {
            self.tables.remove(&oid);
        }
        if !self.tables.contains_key(&oid) {
            let table = match self.load_table(&schema, &name, &src.key_columns)? {
                Some(t) => t,
                None if self.follow_rename(oid, &schema, &name)? => self
                    .load_table(&schema, &name, &src.key_columns)?
                    .ok_or_else(|| operator(format!("target table {schema}.{name} cannot be read after its rename")))?,
                None => {
                    let Some(v) = &version else {
                        return Err(operator(format!(
                            "target table {schema}.{} does not exist, and the source table has no schema history \
                             to create it from",
                            name
                        )));
                    };
                    if !self.cfg.create_tables {
                        return Err(operator(format!(
                            "target table {schema}.{} does not exist (create_tables is false)",
                            name
                        )));
                    }
                    // Held to the unit's commit: another sink creating the same table waits.
                    self.q("cannot lock in the target", &format!("SELECT pg_advisory_xact_lock({CREATE_LOCK})"), &[])?;
                    if let Some(t) = self.load_table(&schema, &name, &src.key_columns)? {
                        self.tables.insert(oid, t);
                        return self.table_for(oid, number, src_schema, src_name);
                    }
                    let sql = create_table_sql(&schema, &name, &v.fields, &src.key_columns);
                    self.q(&format!("cannot create target table {schema}.{}", name), &sql, &[])?;
                    self.record_version(oid, (&schema, &name), &source_table, v)?;
                    let mut t = self.load_table(&schema, &name, &src.key_columns)?.ok_or_else(|| {
                        operator(format!("target table {schema}.{} was created but cannot be read", name))
                    })?;
                    t.synced = Some((v.number, v.lsn.0));
                    t
                }
            };
            self.tables.insert(oid, table);
        }
        // Follow the source's DDL: the target moves forward to the version of the change.
        let (Some(v), Some(t)) = (version, self.tables.get(&oid)) else { return Ok(()) };
        // A version the history does not have (the table was disabled and enabled again: its history
        // started over) is as good as none.
        let synced = t
            .synced
            .filter(|(n, l)| src.history.versions().iter().any(|x| x.number == *n && x.lsn.0 == *l))
            .map(|(n, _)| n);
        let (quoted, label) = (t.quoted.clone(), t.label.clone());
        match synced {
            None => {
                // No version recorded (a table the sink did not create, or a history that started
                // over): the columns of the version in force that the target lacks are added; what
                // else differs is left as it is.
                let missing: Vec<Change> = v
                    .fields
                    .iter()
                    .filter(|f| t.column(&f.name).is_none())
                    .map(|f| Change::AddField { field: f.clone() })
                    .collect();
                for stmt in alter_statements(&quoted, &missing) {
                    self.q(&format!("cannot add the source's columns to {label}"), &stmt, &[])?;
                }
            }
            Some(n) if n < v.number => {
                // One version at a time: each step's diff is what that DDL did (an ADD COLUMN's
                // missing value is known only in its own version; a later rewrite forgets it).
                let steps: Vec<&cdc_core::schema::Version> =
                    src.history.versions().iter().filter(|x| x.number >= n && x.number <= v.number).collect();
                if steps.first().is_none_or(|x| x.number != n) {
                    return Err(operator(format!(
                        "target table {} is at version {n} of the source's schema, which the history no longer \
                         has; recreate the target table",
                        t.label
                    )));
                }
                for pair in steps.windows(2) {
                    for stmt in alter_statements(&quoted, &diff(&pair[0].fields, &pair[1].fields)) {
                        self.q(
                            &format!("cannot follow the source's schema version {} on {label}", pair[1].number),
                            &stmt,
                            &[],
                        )?;
                    }
                }
            }
            Some(_) => return Ok(()),
        }
        // Read again as altered, at the version recorded.
        self.record_version(oid, (&schema, &name), &source_table, &v)?;
        let mut fresh = self
            .load_table(&schema, &name, &src.key_columns)?
            .ok_or_else(|| operator(format!("target table {label} disappeared")))?;
        fresh.synced = Some((v.number, v.lsn.0));
        self.tables.insert(oid, fresh);
        Ok(())
    }

    fn record_version(
        &mut self,
        oid: u32,
        target: (&str, &str),
        source_table: &str,
        version: &cdc_core::schema::Version,
    ) -> Result<(), SinkError> {
        let st = self.state();
        let n = version.number.to_string();
        let at = version.lsn.to_string();
        let p = self.pipeline.clone();
        let label = format!("{}.{}", target.0, target.1);
        self.q(
            "cannot write the sink's bookkeeping",
            &format!(
                "INSERT INTO {st}.tables (pipeline, table_name, source_table, source_oid, target_schema, target_name,
                                          schema_version, schema_lsn)
                 VALUES ($1, $2, $3, $4::int8, $5, $6, $7, $8::pg_lsn)
                 ON CONFLICT (pipeline, table_name) DO UPDATE SET schema_version = EXCLUDED.schema_version,
                        schema_lsn = EXCLUDED.schema_lsn,
                        source_table = EXCLUDED.source_table, source_oid = EXCLUDED.source_oid,
                        target_schema = EXCLUDED.target_schema, target_name = EXCLUDED.target_name"
            ),
            &[
                Some(&p),
                Some(&label),
                Some(source_table),
                Some(&oid.to_string()),
                Some(target.0),
                Some(target.1),
                Some(&n),
                Some(&at),
            ],
        )?;
        Ok(())
    }

    /// The source table was renamed (or moved to another schema) since its target table was made:
    /// the target table of the same source table (by OID) is renamed to match, with its
    /// bookkeeping. Returns whether it did.
    fn follow_rename(&mut self, oid: u32, schema: &str, name: &str) -> Result<bool, SinkError> {
        let st = self.state();
        let p = self.pipeline.clone();
        let label = format!("{schema}.{name}");
        let found = self.q(
            "cannot read the sink's bookkeeping",
            &format!(
                "SELECT table_name, target_schema, target_name FROM {st}.tables
                  WHERE pipeline = $1 AND source_oid = $2::int8 AND table_name <> $3
                    AND to_regclass(format('%I.%I', target_schema, target_name)) IS NOT NULL"
            ),
            &[Some(&p), Some(&oid.to_string()), Some(&label)],
        )?;
        let Some(row) = found.first() else { return Ok(false) };
        let get = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
        let (old_label, old_schema, old_name) = (get(0), get(1), get(2));
        let what = format!("cannot follow the rename of {old_label} to {label}");
        if old_schema != schema {
            let sql = format!(
                "CREATE SCHEMA IF NOT EXISTS {s}; ALTER TABLE {}.{} SET SCHEMA {s}",
                quote_ident(&old_schema),
                quote_ident(&old_name),
                s = quote_ident(schema)
            );
            self.q(&what, &sql, &[])?;
        }
        if old_name != name {
            let sql = format!(
                "ALTER TABLE {}.{} RENAME TO {}",
                quote_ident(schema),
                quote_ident(&old_name),
                quote_ident(name)
            );
            self.q(&what, &sql, &[])?;
        }
        for table in ["tables", "row_versions"] {
            self.q(
                &what,
                &format!("UPDATE {st}.{table} SET table_name = $3 WHERE pipeline = $1 AND table_name = $2"),
                &[Some(&p), Some(&old_label), Some(&label)],
            )?;
        }
        self.q(
            &what,
            &format!(
                "UPDATE {st}.tables SET target_schema = $3, target_name = $4 WHERE pipeline = $1 AND table_name = $2"
            ),
            &[Some(&p), Some(&label), Some(schema), Some(name)],
        )?;
        Ok(true)
    }

    /// The schema version an event was written under, by number and the LSN the history recorded
    /// it at: the event says (the pipeline's history), else the sink's history at the change.
    fn schema_version(&self, e: &Event) -> Option<(i32, Lsn)> {
        e.schema_version.or_else(|| {
            self.sources.get(&e.table_oid).and_then(|s| s.history.version_at(e.lsn)).map(|v| (v.number, v.lsn))
        })
    }

    /// Applies a run of events (stream order, or any order in the shuffle test).
    fn apply(&mut self, events: &[Event]) -> Result<(), SinkError> {
        // Split where a table's schema version moves forward: the changes before a DDL are applied
        // before the target follows it.
        let mut start = 0;
        let mut seen: HashMap<u32, Option<Lsn>> = HashMap::new();
        for (i, e) in events.iter().enumerate() {
            // Versions follow each other in LSN order (a history that started over numbers from 1 again).
            let v = self.schema_version(e).map(|(_, at)| at);
            match seen.get(&e.table_oid) {
                Some(prev) if *prev < v => {
                    self.apply_segment(&events[start..i])?;
                    start = i;
                    seen.clear();
                    seen.insert(e.table_oid, v);
                }
                Some(_) => {}
                None => {
                    seen.insert(e.table_oid, v);
                }
            }
        }
        self.apply_segment(&events[start..])
    }

    /// Applies events in which each table has one schema version.
    fn apply_segment(&mut self, events: &[Event]) -> Result<(), SinkError> {
        // Per table, in order of first appearance: its changes per key, and its latest TRUNCATE.
        let mut order: Vec<u32> = Vec::new();
        let mut per_table: HashMap<u32, TablePart<'_>> = HashMap::new();
        for e in events {
            let schema_version = self.schema_version(e);
            let src = self.sources.get(&e.table_oid);
            let entry = per_table.entry(e.table_oid).or_insert_with(|| {
                order.push(e.table_oid);
                (Vec::new(), None, None, e)
            });
            if schema_version.map(|(_, at)| at) > entry.2.map(|(_, at)| at) {
                entry.2 = schema_version;
            }
            let Some(src) = src else { continue };
            match read_event(e, &src.key_columns).map_err(operator)? {
                Applied::Rows(rows) => entry.0.extend(rows),
                Applied::Truncate(v) => entry.1 = entry.1.max(Some(v)),
            }
        }
        for oid in order {
            let (changes, truncate, number, first) = per_table.remove(&oid).expect("listed");
            if !self.sources.contains_key(&oid) {
                // A table added to the sink since it opened: the worker opens it again with the table.
                return Err(SinkError {
                    class: ErrorClass::Retry,
                    message: format!(
                        "table {}.{} is new to the sink; it is opened again to learn it",
                        first.schema, first.table
                    ),
                });
            }
            let source_table = format!("{}.{}", first.schema, first.table);
            self.table_for(oid, number, &first.schema, &first.table)?;
            self.apply_table(oid, changes, truncate, &source_table)?;
        }
        Ok(())
    }

    fn apply_table(
        &mut self,
        oid: u32,
        changes: Vec<RowChange>,
        truncate: Option<Version>,
        source_table: &str,
    ) -> Result<(), SinkError> {
        let t = self.tables.get(&oid).expect("loaded").clone();
        let st = self.state();
        let pipeline = self.pipeline.clone();
        let mut watermark = t.truncated;
        if let Some(tv) = truncate.filter(|tv| *tv > t.truncated) {
            // Every row older than the TRUNCATE goes; rows written after it stay.
            let gone = self.q(
                &format!("cannot apply a TRUNCATE to {}", t.label),
                &format!(
                    "DELETE FROM {st}.row_versions WHERE pipeline = $1 AND table_name = $2 AND deleted_at IS NULL
                       AND (commit_lsn, lsn) < ($3::pg_lsn, $4::pg_lsn) RETURNING key::text"
                ),
                &[Some(&pipeline), Some(&t.label), Some(&lsn_text(tv.0)), Some(&lsn_text(tv.1))],
            )?;
            let keys: Vec<String> = gone.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect();
            self.delete_keys(&t, &keys)?;
            self.q(
                "cannot write the sink's bookkeeping",
                &format!(
                    "INSERT INTO {st}.tables (pipeline, table_name, source_table, truncated_commit_lsn, truncated_lsn)
                     VALUES ($1, $2, $5, $3::pg_lsn, $4::pg_lsn)
                     ON CONFLICT (pipeline, table_name) DO UPDATE
                        SET truncated_commit_lsn = EXCLUDED.truncated_commit_lsn, truncated_lsn = EXCLUDED.truncated_lsn"
                ),
                &[
                    Some(&pipeline),
                    Some(&t.label),
                    Some(&lsn_text(tv.0)),
                    Some(&lsn_text(tv.1)),
                    Some(source_table),
                ],
            )?;
            watermark = tv;
            self.tables.get_mut(&oid).expect("loaded").truncated = tv;
        }
        if changes.is_empty() {
            return Ok(());
        }
        // The versions the target has for these keys.
        let mut by_key: BTreeMap<&str, Vec<&RowChange>> = BTreeMap::new();
        for c in &changes {
            by_key.entry(c.key.as_str()).or_default().push(c);
        }
        let keys: Vec<&str> = by_key.keys().copied().collect();
        let stored_rows = self.q(
            &format!("cannot read the row versions of {}", t.label),
            &format!(
                "SELECT u.i::int4, r.commit_lsn::text, r.lsn::text
                   FROM unnest($3::text[]) WITH ORDINALITY AS u(k, i)
                   JOIN {st}.row_versions r ON r.pipeline = $1 AND r.table_name = $2 AND r.key = u.k::jsonb"
            ),
            &[Some(&pipeline), Some(&t.label), Some(&text_array(keys.iter().map(|k| Some(*k))))],
        )?;
        let mut stored: HashMap<usize, Version> = HashMap::new();
        for r in &stored_rows {
            let i: usize = r.first().cloned().flatten().and_then(|v| v.parse().ok()).unwrap_or(0);
            stored.insert(
                i.saturating_sub(1),
                (parse_lsn(r.get(1).and_then(Option::as_ref)), parse_lsn(r.get(2).and_then(Option::as_ref))),
            );
        }
        let mut deletes: Vec<String> = Vec::new();
        let mut upserts: Vec<(String, Image)> = Vec::new();
        let mut written: Vec<(String, Version, bool)> = Vec::new();
        let ignore_versions = self.shuffle.as_ref().is_some_and(|s| s.ignore_versions);
        for (i, (key, list)) in by_key.iter().enumerate() {
            let floor = stored.get(&i).copied().unwrap_or((0, 0)).max(watermark);
            let folded = match list.last() {
                Some(last) if ignore_versions => Some((last.op.clone(), last.version)),
                _ => fold(list, floor),
            };
            let Some((op, version)) = folded else { continue };
            match op {
                RowOp::Delete => {
                    deletes.push(key.to_string());
                    written.push((key.to_string(), version, true));
                }
                RowOp::Upsert(cols) => {
                    upserts.push((key.to_string(), cols));
                    written.push((key.to_string(), version, false));
                }
            }
        }
        self.delete_keys(&t, &deletes)?;
        self.upsert_rows(&t, upserts)?;
        for chunk in written.chunks(5000) {
            let k = text_array(chunk.iter().map(|w| Some(w.0.as_str())));
            let c: Vec<String> = chunk.iter().map(|w| lsn_text(w.1 .0)).collect();
            let l: Vec<String> = chunk.iter().map(|w| lsn_text(w.1 .1)).collect();
            let d: Vec<&str> = chunk.iter().map(|w| if w.2 { "t" } else { "f" }).collect();
            self.q(
                &format!("cannot write the row versions of {}", t.label),
                &format!(
                    "INSERT INTO {st}.row_versions AS r (pipeline, table_name, key, commit_lsn, lsn, deleted_at)
                     SELECT $1, $2, u.k::jsonb, u.c::pg_lsn, u.l::pg_lsn, CASE WHEN u.d THEN now() END
                       FROM unnest($3::text[], $4::text[], $5::text[], $6::bool[]) AS u(k, c, l, d)
                     ON CONFLICT (pipeline, table_name, key) DO UPDATE
                        SET commit_lsn = EXCLUDED.commit_lsn, lsn = EXCLUDED.lsn, deleted_at = EXCLUDED.deleted_at"
                ),
                &[
                    Some(&pipeline),
                    Some(&t.label),
                    Some(&k),
                    Some(&text_array(c.iter().map(|s| Some(s.as_str())))),
                    Some(&text_array(l.iter().map(|s| Some(s.as_str())))),
                    Some(&text_array(d.iter().map(|s| Some(*s)))),
                ],
            )?;
        }
        Ok(())
    }

    /// The key columns' values of a key object, converted for the target.
    fn key_values(t: &TargetTable, key: &str) -> Result<Vec<Option<String>>, SinkError> {
        let fields: crate::format::event::Fields<'_> =
            serde_json::from_str(key).map_err(|e| operator(format!("bad key {key}: {e}")))?;
        t.key
            .iter()
            .map(|&ci| {
                let c = &t.columns[ci];
                let raw = fields
                    .0
                    .iter()
                    .find(|(n, _)| n.0 == c.name.as_str())
                    .map(|(_, v)| *v)
                    .ok_or_else(|| operator(format!("key {key} lacks column {}", c.name)))?;
                to_text(&c.kind, raw).map_err(|e| operator(format!("{}.{}: {e}", t.label, c.name)))
            })
            .collect()
    }

    fn delete_keys(&mut self, t: &TargetTable, keys: &[String]) -> Result<(), SinkError> {
        let per = t.key.len().max(1);
        for chunk in keys.chunks(30_000 / per) {
            let mut params: Vec<Option<String>> = Vec::with_capacity(chunk.len() * per);
            let mut tuples = Vec::with_capacity(chunk.len());
            for key in chunk {
                let vals = Self::key_values(t, key)?;
                let mut tuple = Vec::with_capacity(per);
                for (j, v) in vals.into_iter().enumerate() {
                    params.push(v);
                    tuple.push(format!("${}::{}", params.len(), t.columns[t.key[j]].type_sql));
                }
                tuples.push(format!("({})", tuple.join(", ")));
            }
            let cols: Vec<String> = t.key.iter().map(|&i| quote_ident(&t.columns[i].name)).collect();
            let sql = format!("DELETE FROM {} WHERE ({}) IN ({})", t.quoted, cols.join(", "), tuples.join(", "));
            let p: Vec<Option<&str>> = params.iter().map(Option::as_deref).collect();
            self.q(&format!("cannot delete from {}", t.label), &sql, &p)?;
        }
        Ok(())
    }

    fn upsert_rows(&mut self, t: &TargetTable, rows: Vec<(String, Image)>) -> Result<(), SinkError> {
        // Rows with the same columns go in one statement.
        let mut groups: BTreeMap<Vec<usize>, Vec<Vec<Option<String>>>> = BTreeMap::new();
        for (key, cols) in rows {
            let mut idx = Vec::new();
            let mut vals = Vec::new();
            for (name, raw) in &cols {
                let Some(ci) = t.column(name) else {
                    // A column the target does not have: a computed or enriched one, or one the
                    // source dropped since (an older change applied late). Not written.
                    continue;
                };
                let c = &t.columns[ci];
                let v = match raw {
                    None => None,
                    Some(json) => {
                        let raw: &RawValue = serde_json::from_str(json)
                            .map_err(|e| operator(format!("{}.{}: bad value: {e}", t.label, c.name)))?;
                        to_text(&c.kind, raw).map_err(|e| operator(format!("{}.{}: {e}", t.label, c.name)))?
                    }
                };
                idx.push(ci);
                vals.push(v);
            }
            if t.key.iter().any(|k| !idx.contains(k)) {
                return Err(operator(format!("a row of {} lacks its key: {key}", t.label)));
            }
            let mut order: Vec<usize> = (0..idx.len()).collect();
            order.sort_by_key(|&i| idx[i]);
            let sorted_idx: Vec<usize> = order.iter().map(|&i| idx[i]).collect();
            let sorted_vals: Vec<Option<String>> = order.iter().map(|&i| vals[i].clone()).collect();
            groups.entry(sorted_idx).or_default().push(sorted_vals);
        }
        let key_cols: Vec<String> = t.key.iter().map(|&i| quote_ident(&t.columns[i].name)).collect();
        for (idx, rows) in groups {
            let names: Vec<String> = idx.iter().map(|&i| quote_ident(&t.columns[i].name)).collect();
            let updates: Vec<String> = idx
                .iter()
                .filter(|i| !t.key.contains(i))
                .map(|&i| {
                    let n = quote_ident(&t.columns[i].name);
                    format!("{n} = EXCLUDED.{n}")
                })
                .collect();
            let conflict = if updates.is_empty() {
                "DO NOTHING".to_string()
            } else {
                format!("DO UPDATE SET {}", updates.join(", "))
            };
            for chunk in rows.chunks((30_000 / idx.len().max(1)).max(1)) {
                let mut params: Vec<Option<&str>> = Vec::with_capacity(chunk.len() * idx.len());
                let mut tuples = Vec::with_capacity(chunk.len());
                for row in chunk {
                    let mut tuple = Vec::with_capacity(idx.len());
                    for (j, v) in row.iter().enumerate() {
                        params.push(v.as_deref());
                        tuple.push(format!("${}::{}", params.len(), t.columns[idx[j]].type_sql));
                    }
                    tuples.push(format!("({})", tuple.join(", ")));
                }
                let sql = format!(
                    "INSERT INTO {} ({}) VALUES {} ON CONFLICT ({}) {conflict}",
                    t.quoted,
                    names.join(", "),
                    tuples.join(", "),
                    key_cols.join(", ")
                );
                self.q(&format!("cannot write to {}", t.label), &sql, &params)?;
            }
        }
        Ok(())
    }

    fn begin(&mut self) -> Result<(), SinkError> {
        if !self.in_unit {
            self.q("cannot begin a transaction in the target", "BEGIN", &[])?;
            self.in_unit = true;
        }
        Ok(())
    }
}

/// The statement that creates a target table from a source schema version: the same columns and
/// types, nullable, the source's key as its primary key.
pub fn create_table_sql(schema: &str, name: &str, fields: &[Field], key_columns: &[String]) -> String {
    let cols: Vec<String> = fields.iter().map(|f| format!("{} {}", quote_ident(&f.name), f.type_sql)).collect();
    let key: Vec<String> = key_columns.iter().map(|k| quote_ident(k)).collect();
    format!(
        "CREATE SCHEMA IF NOT EXISTS {s}; CREATE TABLE {s}.{t} ({}, PRIMARY KEY ({}))",
        cols.join(", "),
        key.join(", "),
        s = quote_ident(schema),
        t = quote_ident(name)
    )
}

/// The statements that take a target table from one source schema version to the next: added
/// columns (rows already there read the value the source's rows read, its `attmissingval`),
/// dropped, renamed and retyped columns. NOT NULL and defaults are the source's business: the
/// target's columns stay nullable, without defaults.
pub fn alter_statements(table: &str, changes: &[Change]) -> Vec<String> {
    let mut out = Vec::new();
    for c in changes {
        match c {
            Change::DropField { field } => {
                out.push(format!("ALTER TABLE {table} DROP COLUMN IF EXISTS {}", quote_ident(&field.name)))
            }
            Change::RenameField { from, to } => out.push(format!(
                "ALTER TABLE {table} RENAME COLUMN {} TO {}",
                quote_ident(&from.name),
                quote_ident(&to.name)
            )),
            Change::ChangeType { to, .. } => {
                let n = quote_ident(&to.name);
                out.push(format!("ALTER TABLE {table} ALTER COLUMN {n} TYPE {t} USING {n}::{t}", t = to.type_sql))
            }
            Change::AddField { field } => {
                let n = quote_ident(&field.name);
                match &field.missing {
                    Some(m) => {
                        out.push(format!(
                            "ALTER TABLE {table} ADD COLUMN {n} {t} DEFAULT {}::{t}",
                            quote_literal(m),
                            t = field.type_sql
                        ));
                        out.push(format!("ALTER TABLE {table} ALTER COLUMN {n} DROP DEFAULT"));
                    }
                    None => out.push(format!("ALTER TABLE {table} ADD COLUMN {n} {}", field.type_sql)),
                }
            }
            Change::SetRequired { .. } | Change::SetOptional { .. } | Change::ChangeDefault { .. } => {}
        }
    }
    out
}

impl<T: Target> Sink for PostgresSink<T> {
    fn open(&mut self) -> Result<Option<crate::Checkpoint>, SinkError> {
        let ddl = state_ddl(&self.cfg.state_schema);
        self.q("cannot create the sink's bookkeeping tables in the target", &ddl, &[])?;
        let st = self.state();
        let (p, s, src) = (self.pipeline.clone(), self.sink_name.clone(), self.source.clone());
        self.q(
            "cannot write the sink's bookkeeping",
            &format!(
                "INSERT INTO {st}.pipelines (pipeline, sink, source) VALUES ($1, $2, $3)
                 ON CONFLICT (pipeline) DO UPDATE SET sink = EXCLUDED.sink, source = EXCLUDED.source"
            ),
            &[Some(&p), Some(&s), Some(&src)],
        )?;
        // The versions make a unit delivered again a no-op, so there is no checkpoint to skip by.
        Ok(None)
    }

    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        self.begin()?;
        let stats = PublishStats {
            events: events.len() as u64,
            bytes: events.iter().map(|e| (e.payload.len() + e.key.as_ref().map_or(0, Vec::len)) as u64).sum(),
        };
        match self.shuffle.as_mut() {
            Some(s) => {
                let mixed = s.mix(events, false);
                self.apply(&mixed)?;
            }
            None => self.apply(events)?,
        }
        Ok(stats)
    }

    fn flush(&mut self, checkpoint: crate::Checkpoint) -> Result<(), SinkError> {
        if !self.in_unit {
            return Ok(());
        }
        if let Some(s) = self.shuffle.as_mut() {
            // Now and then everything held back is let go (the test's end waits for it).
            if s.next().is_multiple_of(3) {
                let rest = s.mix(&[], true);
                self.apply(&rest)?;
            }
        }
        let st = self.state();
        let p = self.pipeline.clone();
        self.q(
            "cannot write the sink's bookkeeping",
            &format!("UPDATE {st}.pipelines SET applied_lsn = $2::pg_lsn, applied_at = now() WHERE pipeline = $1"),
            &[Some(&p), Some(&lsn_text(checkpoint.end_lsn.0))],
        )?;
        if self.last_expiry.is_none_or(|t| t.elapsed().as_secs() >= 60) {
            let hours = self.cfg.tombstone_retention_hours.to_string();
            self.q(
                "cannot expire tombstones",
                &format!(
                    "DELETE FROM {st}.row_versions WHERE pipeline = $1 AND deleted_at IS NOT NULL
                       AND deleted_at < now() - make_interval(hours => $2::int)"
                ),
                &[Some(&p), Some(&hours)],
            )?;
            self.last_expiry = Some(Instant::now());
        }
        self.q("cannot commit in the target", "COMMIT", &[])?;
        self.in_unit = false;
        Ok(())
    }

    fn abort(&mut self) {
        if self.in_unit {
            // A connection that cannot roll back is dropped with the sink by the caller.
            let _ = self.target.query("ROLLBACK", &[]);
            self.in_unit = false;
        }
        // What was read of the target may be stale after a rollback (a table created in it).
        self.tables.clear();
    }
}
