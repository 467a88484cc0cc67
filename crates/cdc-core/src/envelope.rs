//! Builds pg_cdc's JSON event for one row change.
//!
//! ```text
//! {"metadata": {"source","database","schema","table","operation","timestamp","lsn","commit_lsn",
//!               "transaction_id", ["transaction": {...}], ["unchanged_toast_columns": [...]]},
//!  "before": {...} | null, "after": {...} | null, ["diff": {"col": {"from": .., "to": ..}}]}
//! ```
//! The message key is the key columns as a JSON object (`{"order_id":1}`), or the `partition_key`
//! column when one is configured. Field order is fixed, so the same WAL always encodes to the same
//! bytes (P13).

use std::sync::Arc;

use crate::config::{CaptureConfig, CaptureMode};
use crate::context::UserContext;
use crate::decode::{OldKind, Relation, Tuple, TupleValue};
use crate::error::CdcError;
use crate::expr::{self, Bound, ColumnInfo};
use crate::json::{write_key, write_str, write_u64};
use crate::lookup::{LookupId, LookupRow, Lookups};
use crate::lsn::Lsn;
use crate::redact::{self, Method, TokenKey};
use crate::time::{format_pg_date_plus_days, write_pg_timestamp_ms};
use crate::types::TypeRegistry;
use crate::value::write_value;

/// Row operation of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A row was inserted.
    Insert,
    /// A row was updated.
    Update,
    /// A row was deleted.
    Delete,
    /// The table was truncated.
    Truncate,
    /// A row read by a snapshot (it existed before the sink, or a snapshot was asked for).
    Read,
}

impl Op {
    /// The name in `metadata.operation`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "INSERT",
            Op::Update => "UPDATE",
            Op::Delete => "DELETE",
            Op::Truncate => "TRUNCATE",
            Op::Read => "READ",
        }
    }
}

/// How one relation version maps onto events: which columns go into the images and the key.
#[derive(Debug)]
pub struct RelationPlan {
    /// The relation as described by the WAL at this point.
    pub relation: Relation,
    /// Each column's name as the capture config knows it: the name it has now (see
    /// [`RelationPlan::with_aliases`]), which is the relation's own unless it was renamed since.
    names: Vec<String>,
    /// The table's capture config.
    pub config: Arc<CaptureConfig>,
    /// Indexes of the columns in the images, in table order.
    pub included: Vec<usize>,
    /// Indexes of the key columns, in `key_columns` order; empty when the table has no key.
    pub key: Vec<usize>,
    /// Index of the `partition_key` column.
    pub partition: Option<usize>,
    /// The `partition_key` when it names an enriched column: (enrich index, column index).
    pub partition_enriched: Option<(usize, usize)>,
    /// The name of the column that keys events (the capture config's `partition_key`, or the
    /// sink's; see [`RelationPlan::override_partition_key`]).
    pub partition_key: Option<String>,
    /// The `enrich` transformations (empty when the sink leaves transformations out).
    pub enrich: Vec<EnrichPlan>,
    /// Per column, in relation order: how its values are hidden (compliance and mask).
    pub redact: Vec<Option<Method>>,
    /// The static part of the `compliance` object (the hidden columns by method), when the config
    /// has a compliance block.
    compliance: Option<Vec<u8>>,
    /// The row filter, bound to this relation version.
    pub filter: Option<Bound>,
    /// The filter's top-level OR branches (for `metadata.filter_matched`).
    pub branches: Vec<Arc<str>>,
    /// Computed columns, bound to this relation version (empty when the sink leaves
    /// transformations out).
    pub computed: Vec<(String, Bound)>,
    /// The number of the table's schema version in force (see [`crate::schema::History`]) and
    /// whether it was a forced break; `None` without a history.
    pub schema_version: Option<(i32, bool)>,
    /// The LSN the history recorded that version at: with its number, the version's identity (a
    /// history that starts over, the table disabled and enabled again, numbers from 1 again).
    pub schema_version_lsn: Option<Lsn>,
    /// The version whose topic of its own the relation's events go to
    /// ([`crate::schema::History::topic_version_at`]); `None`: the table's topic.
    pub topic_version: Option<i32>,
    /// Per column, in relation order: declared NOT NULL, as the table's schema history has it at
    /// the relation's position (typed formats mark the other columns optional); without a
    /// history, the key columns (pgoutput does not say which columns are NOT NULL).
    pub not_null: Vec<bool>,
    /// The table's `regional_routing` as this sink sees it (see [`crate::routing`]).
    pub route: Option<crate::routing::RoutePlan>,
    /// Each column's `"name":`, escaped once.
    col_keys: Vec<Vec<u8>>,
    /// Schema and table names, shared by every event of the relation.
    schema: Arc<str>,
    table: Arc<str>,
}

impl RelationPlan {
    /// Plans a relation version under a capture config. Configured columns missing from this
    /// version (dropped since `cdc_enable`) are skipped; a filter or computed column that no longer
    /// fits the table (a column it reads was dropped) is an error.
    pub fn new(
        relation: Relation,
        config: Arc<CaptureConfig>,
        types: &TypeRegistry,
        transformations: bool,
    ) -> Result<Self, CdcError> {
        Self::with_aliases(relation, config, types, transformations, Vec::new())
    }

    /// [`RelationPlan::new`] for a relation of an earlier version of the table: `aliases` gives,
    /// per column, the name it has now when it had another then (see
    /// [`crate::schema::History::aliases`]). The config names columns as they are now, so it is
    /// matched through these; the events keep the names of their version.
    pub fn with_aliases(
        relation: Relation,
        config: Arc<CaptureConfig>,
        types: &TypeRegistry,
        transformations: bool,
        aliases: Vec<Option<String>>,
    ) -> Result<Self, CdcError> {
        let names: Vec<String> = relation
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| aliases.get(i).cloned().flatten().unwrap_or_else(|| c.name.clone()))
            .collect();
        let cols: Vec<ColumnInfo> = relation
            .columns
            .iter()
            .zip(&names)
            .map(|(c, name)| ColumnInfo::new(name.clone(), types.kind(c.type_oid)))
            .collect();
        let (filter, branches) = match &config.filter {
            Some(text) => {
                let parsed = expr::parse(text)?;
                let branches = parsed.branches().into_iter().map(Arc::from).collect();
                (Some(parsed.bind(&cols)?), branches)
            }
            None => (None, Vec::new()),
        };
        let computed = if transformations {
            config
                .computed
                .iter()
                .map(|(name, text)| Ok((name.clone(), expr::parse_computed(text)?.bind(&cols)?)))
                .collect::<Result<Vec<_>, CdcError>>()?
        } else {
            Vec::new()
        };
        let index = |name: &str| names.iter().position(|c| c == name);
        let included = (0..relation.columns.len()).filter(|&i| config.includes(&names[i])).collect();
        let key = config.key_columns.iter().filter_map(|k| index(k)).collect();
        let partition = config.partition_key.as_deref().and_then(index);
        let partition_key = config.partition_key.clone();
        let redact: Vec<Option<Method>> = names.iter().map(|c| config.redaction(c)).collect();
        let compliance = config.compliance.as_ref().map(|_| {
            let mut out = Vec::new();
            for (field, method) in [
                ("pii_tokenized", Method::Tokenize),
                ("pii_hashed", Method::Hash),
                ("pii_redacted", Method::Redact),
                ("pii_removed", Method::Remove),
            ] {
                let cols: Vec<&str> = (0..relation.columns.len())
                    .filter(|&i| redact[i] == Some(method))
                    .map(|i| relation.columns[i].name.as_str())
                    .collect();
                if cols.is_empty() {
                    continue;
                }
                out.push(b',');
                write_key(&mut out, field);
                out.push(b'[');
                for (n, c) in cols.iter().enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    write_str(&mut out, c.as_bytes());
                }
                out.push(b']');
            }
            out
        });
        let col_keys = relation
            .columns
            .iter()
            .map(|c| {
                let mut k = Vec::with_capacity(c.name.len() + 3);
                write_key(&mut k, &c.name);
                k
            })
            .collect();
        let (schema, table) = (Arc::from(relation.namespace.as_str()), Arc::from(relation.name.as_str()));
        Ok(RelationPlan {
            relation,
            names,
            config,
            included,
            key,
            partition,
            partition_enriched: None,
            partition_key,
            enrich: Vec::new(),
            redact,
            compliance,
            filter,
            branches,
            computed,
            schema_version: None,
            schema_version_lsn: None,
            topic_version: None,
            not_null: Vec::new(),
            route: None,
            col_keys,
            schema,
            table,
        })
    }

    /// The index of a column, by the name the capture config knows it by.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|c| c == name)
    }

    /// The branch of the filter a row matched (for `metadata.filter_matched`).
    pub fn matched_branch(&self, row: &[TupleValue<'_>]) -> Option<Arc<str>> {
        let text = self.filter.as_ref()?.matched_branch(row)?;
        self.branches.iter().find(|b| &***b == text).cloned().or_else(|| Some(Arc::from(text)))
    }

    /// Keys this relation's events by `column` (a sink-level `partition_key`) when the table has
    /// it in its events: a column of the images, or an enriched column (resolved by
    /// [`RelationPlan::bind_lookups`]). Otherwise the table keeps its own key: a column left out of
    /// the events must not show in their keys, and one hidden with `remove` or `redact` would give
    /// every row the same key.
    pub fn override_partition_key(&mut self, column: &str) {
        if let Some(i) = self.names.iter().position(|c| c == column) {
            if self.included.contains(&i) && !matches!(self.redact[i], Some(Method::Remove | Method::Redact)) {
                self.partition = Some(i);
                self.partition_key = Some(column.to_string());
            }
        } else if self.config.enrich.iter().any(|e| e.add_columns.iter().any(|c| c == column)) {
            self.partition = None;
            self.partition_key = Some(column.to_string());
        }
    }

    /// Whether encoding this relation needs the tokenization key.
    pub fn needs_token_key(&self) -> bool {
        self.redact.contains(&Some(Method::Tokenize))
    }
}

/// One `enrich` transformation bound to a relation version and the sink's lookup copy.
#[derive(Debug)]
pub struct EnrichPlan {
    /// Which lookup.
    pub id: LookupId,
    /// Index of the source column in the relation (`None`: dropped since `cdc_enable`; nothing
    /// is looked up and the added columns are null).
    pub source: Option<usize>,
    /// Each added column's `"name":`, escaped once.
    keys: Vec<Vec<u8>>,
    /// Their type OIDs.
    types: Vec<u32>,
}

impl EnrichPlan {
    /// The type OIDs of the columns it adds, in `add_columns` order.
    pub fn added_types(&self) -> &[u32] {
        &self.types
    }
}

impl RelationPlan {
    /// Binds the config's `enrich` transformations to the sink's lookups (their column types);
    /// an error when a lookup is not set up for the sink.
    pub fn bind_lookups(&mut self, lookups: &Lookups) -> Result<(), CdcError> {
        let oid = self.relation.oid;
        let mut plans = Vec::with_capacity(self.config.enrich.len());
        for (i, e) in self.config.enrich.iter().enumerate() {
            let id = LookupId { table_oid: oid, position: i as u32 };
            let b = lookups.binding(id).ok_or_else(|| {
                CdcError::new(
                    crate::ErrorKind::PrerequisiteState,
                    format!("the copy of lookup table {} for enrich transformation {i} is not set up", e.lookup_table),
                )
            })?;
            let keys = b
                .add_columns
                .iter()
                .map(|c| {
                    let mut k = Vec::with_capacity(c.len() + 3);
                    write_key(&mut k, c);
                    k
                })
                .collect();
            let source = self.names.iter().position(|c| *c == e.source_column);
            plans.push(EnrichPlan { id, source, keys, types: b.add_types.clone() });
        }
        self.partition_enriched = match (&self.partition_key, self.partition) {
            (Some(p), None) => self
                .config
                .enrich
                .iter()
                .enumerate()
                .find_map(|(i, e)| e.add_columns.iter().position(|c| c == p).map(|j| (i, j))),
            _ => None,
        };
        self.enrich = plans;
        Ok(())
    }

    /// The lookup key of enrich transformation `i` in a row image (`None`: null or not there).
    pub fn lookup_key<'t>(&self, i: usize, image: &'t [TupleValue<'_>]) -> Option<&'t [u8]> {
        match image.get(self.enrich[i].source?) {
            Some(TupleValue::Text(t)) => Some(t),
            _ => None,
        }
    }
}

/// Transaction-level facts every event of the transaction carries.
#[derive(Debug, Clone)]
pub struct TxnInfo {
    /// Transaction id.
    pub xid: u32,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// Commit time, PostgreSQL microseconds.
    pub commit_time: i64,
    /// Number of events of this transaction delivered to this sink.
    pub event_count: usize,
}

/// One encoded event, ready for a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Table OID.
    pub table_oid: u32,
    /// Schema name (for topic templates).
    pub schema: Arc<str>,
    /// Table name (for topic templates).
    pub table: Arc<str>,
    /// Operation.
    pub op: Op,
    /// LSN of the change.
    pub lsn: Lsn,
    /// Commit LSN of its transaction.
    pub commit_lsn: Lsn,
    /// Its 1-based position among the sink's events of the transaction: with `commit_lsn`, the
    /// event's identity (an UPDATE that moves a row to another key gives two events at one LSN).
    pub index: u32,
    /// Message key (JSON), `None` when the table has no key or for TRUNCATE.
    pub key: Option<Vec<u8>>,
    /// Message value (JSON).
    pub payload: Vec<u8>,
    /// A Kafka tombstone follows the message: a record with the same key and no value, so log
    /// compaction can drop the row's records (the Debezium format sets it after a DELETE).
    pub tombstone: bool,
    /// The table version whose topic of its own the event goes to (`<topic>.v<N>`, see
    /// [`crate::schema::version_topic`]); `None`: the table's topic.
    pub topic_version: Option<i32>,
    /// The table's schema version the event was written under: its number and the LSN the history
    /// recorded it at (see [`RelationPlan::schema_version`]); `None` without a history.
    pub schema_version: Option<(i32, Lsn)>,
    /// The `regional_routing` routes of this sink the event is a change of, with the routing's LSN
    /// (see [`crate::routing`]): the route of its row, and for an UPDATE that moved the row between
    /// two routes of the sink, both; empty when the table is not routed or the change came before.
    pub routes: Vec<(Arc<str>, Lsn)>,
}

/// The images of one row change, after TOAST resolution.
pub struct RowChange<'a, 'p> {
    /// Relation plan in force at the change.
    pub plan: &'p RelationPlan,
    /// Operation.
    pub op: Op,
    /// LSN of the change.
    pub lsn: Lsn,
    /// Old image and which kind it is.
    pub old: Option<(OldKind, &'p Tuple<'a>)>,
    /// New image.
    pub new: Option<&'p Tuple<'a>>,
    /// Context of the statement that made the change (when the table asks for it).
    pub ctx: Option<&'p UserContext>,
    /// What the row filter said.
    pub mark: &'p FilterMark,
    /// Per `enrich` transformation of the plan, the lookup row for the enriched image (`after`,
    /// or `before` for a DELETE); empty when the plan has none or they are left out.
    pub enriched: &'p [Option<LookupRow>],
}

/// What the row filter said about a change that is published.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum FilterMark {
    /// No filter, or nothing to say (a DELETE without a full before image).
    #[default]
    None,
    /// The row matches; the branch of the filter it matched.
    Matched(Arc<str>),
    /// An UPDATE moved the row into the filter (its before image did not match).
    Entered(Arc<str>),
    /// An UPDATE moved the row out of the filter: published as a DELETE of the old image.
    Left,
}

/// Writes events; holds the per-database constants.
#[derive(Debug, Clone)]
pub struct Encoder {
    /// `metadata.source`.
    pub source: String,
    /// `metadata.database`.
    pub database: String,
    /// The key `tokenize` uses; relations that need it are refused without it (see
    /// [`RelationPlan::needs_token_key`]), so no value is ever sent in the clear.
    pub token_key: Option<TokenKey>,
}

impl Encoder {
    /// An encoder for events from `database`.
    pub fn new(database: &str) -> Self {
        Encoder { source: "pg_cdc".to_string(), database: database.to_string(), token_key: None }
    }

    #[allow(clippy::too_many_arguments)]
    fn write_metadata(
        &self,
        out: &mut Vec<u8>,
        plan: &RelationPlan,
        op: Op,
        lsn: Lsn,
        txn: &TxnInfo,
        index: usize,
        ctx: Option<&UserContext>,
        mark: &FilterMark,
    ) {
        let (rel, cfg) = (&plan.relation, &plan.config);
        out.extend_from_slice(b"{\"metadata\":{");
        write_key(out, "source");
        write_str(out, self.source.as_bytes());
        out.push(b',');
        write_key(out, "database");
        write_str(out, self.database.as_bytes());
        out.push(b',');
        write_key(out, "schema");
        write_str(out, rel.namespace.as_bytes());
        out.push(b',');
        write_key(out, "table");
        write_str(out, rel.name.as_bytes());
        out.push(b',');
        write_key(out, "operation");
        write_str(out, op.as_str().as_bytes());
        out.push(b',');
        write_key(out, "timestamp");
        out.push(b'"');
        write_pg_timestamp_ms(out, txn.commit_time);
        out.push(b'"');
        out.push(b',');
        write_key(out, "lsn");
        write_u64(out, lsn.0);
        out.push(b',');
        write_key(out, "commit_lsn");
        write_u64(out, txn.commit_lsn.0);
        out.push(b',');
        write_key(out, "transaction_id");
        write_u64(out, u64::from(txn.xid));
        if cfg.user_context {
            let c = ctx.cloned().unwrap_or_default();
            for (k, v) in [
                ("user", &c.user),
                ("session_id", &c.session_id),
                ("client_ip", &c.client_ip),
                ("application_name", &c.application_name),
            ] {
                out.push(b',');
                write_key(out, k);
                write_opt_str(out, v.as_deref());
            }
        }
        if cfg.query_text {
            out.push(b',');
            write_key(out, "query");
            write_opt_str(out, ctx.and_then(|c| c.query.as_deref()));
        }
        let matched = match mark {
            FilterMark::Matched(b) | FilterMark::Entered(b) => Some(b),
            _ => None,
        };
        if let Some(b) = matched.filter(|_| cfg.mode == CaptureMode::Filtered) {
            out.push(b',');
            write_key(out, "filter_matched");
            write_str(out, b.as_bytes());
        }
        let transition = match mark {
            FilterMark::Entered(_) => Some("entered"),
            FilterMark::Left => Some("left"),
            _ => None,
        };
        if let Some(t) = transition {
            out.push(b',');
            write_key(out, "filter_transition");
            write_str(out, t.as_bytes());
        }
        if cfg.include_transaction_info {
            out.extend_from_slice(b",\"transaction\":{");
            write_key(out, "id");
            write_u64(out, u64::from(txn.xid));
            out.push(b',');
            write_key(out, "commit_lsn");
            write_u64(out, txn.commit_lsn.0);
            out.push(b',');
            write_key(out, "event_index");
            write_u64(out, index as u64);
            out.push(b',');
            write_key(out, "event_count");
            write_u64(out, txn.event_count as u64);
            out.push(b'}');
        }
    }

    /// Encodes one row change. `index` is the event's 1-based position in its transaction.
    pub fn encode_row(&self, types: &TypeRegistry, ch: &RowChange<'_, '_>, txn: &TxnInfo, index: usize) -> Event {
        let plan = ch.plan;
        let rel = &plan.relation;
        let cols = &rel.columns;
        let full_old = match ch.old {
            Some((OldKind::Full, t)) => Some(t),
            _ => None,
        };
        // The value of column i in the new image, with unchanged TOAST filled from a full old image.
        let new_value = |i: usize| -> TupleValue<'_> {
            let v = ch.new.and_then(|t| t.get(i).copied()).unwrap_or(TupleValue::Null);
            match (v, full_old) {
                (TupleValue::UnchangedToast, Some(old)) => old.get(i).copied().unwrap_or(TupleValue::Null),
                _ => v,
            }
        };
        let old_value =
            |i: usize| -> TupleValue<'_> { ch.old.and_then(|(_, t)| t.get(i).copied()).unwrap_or(TupleValue::Null) };

        // Sized for the values' text as well, so a row of long values is not copied as it grows.
        let text_len = |t: Option<&[TupleValue<'_>]>| -> usize {
            t.map_or(0, |t| t.iter().map(|v| if let TupleValue::Text(b) = v { b.len() } else { 0 }).sum())
        };
        let values = text_len(ch.new.map(Vec::as_slice)) + text_len(ch.old.map(|(_, t)| t.as_slice()));
        let mut out = Vec::with_capacity(256 + 32 * plan.included.len() + values);
        self.write_metadata(&mut out, plan, ch.op, ch.lsn, txn, index, ch.ctx, ch.mark);
        let mut unchanged: Vec<usize> = Vec::new();
        if ch.new.is_some() {
            for &i in &plan.included {
                if new_value(i) == TupleValue::UnchangedToast {
                    unchanged.push(i);
                }
            }
        }
        if !unchanged.is_empty() {
            out.extend_from_slice(b",\"unchanged_toast_columns\":[");
            for (n, &i) in unchanged.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_str(&mut out, cols[i].name.as_bytes());
            }
            out.push(b']');
        }
        out.extend_from_slice(b"},\"before\":");
        // A row that entered the filter: its earlier version did not match, so it is not shown.
        let entered = matches!(ch.mark, FilterMark::Entered(_));
        match ch.old {
            None => out.extend_from_slice(b"null"),
            Some(_) if entered => out.extend_from_slice(b"null"),
            Some((OldKind::Full, _)) => self.write_image(&mut out, types, plan, &plan.included, old_value),
            // Key-only old image: the key columns are the only ones it holds.
            Some((OldKind::Key, _)) => {
                let key_cols: Vec<usize> = plan.included.iter().copied().filter(|&i| cols[i].is_key).collect();
                self.write_image(&mut out, types, plan, &key_cols, old_value)
            }
        }
        if ch.new.is_none() && ch.old.is_some() && !entered {
            write_enriched(&mut out, types, plan, ch.enriched);
        }
        out.extend_from_slice(b",\"after\":");
        if let Some(new) = ch.new {
            let present: Vec<usize> = plan.included.iter().copied().filter(|i| !unchanged.contains(i)).collect();
            self.write_image(&mut out, types, plan, &present, new_value);
            write_enriched(&mut out, types, plan, ch.enriched);
            if !plan.computed.is_empty() {
                // Computed columns read the row with unchanged TOAST filled in where it is known.
                let filled: Vec<TupleValue<'_>>;
                let row: &[TupleValue<'_>] = if full_old.is_some() && new.contains(&TupleValue::UnchangedToast) {
                    filled = (0..new.len()).map(new_value).collect();
                    &filled
                } else {
                    new
                };
                out.pop(); // the image's closing brace
                for (name, bound) in &plan.computed {
                    if out.last() != Some(&b'{') {
                        out.push(b',');
                    }
                    write_key(&mut out, name);
                    bound.eval(row).write_json(&mut out);
                }
                out.push(b'}');
            }
        } else {
            out.extend_from_slice(b"null");
        }
        if ch.op == Op::Update && full_old.is_some() && !entered {
            out.extend_from_slice(b",\"diff\":{");
            let mut first = true;
            for &i in &plan.included {
                let (o, n) = (old_value(i), new_value(i));
                if o == n || n == TupleValue::UnchangedToast {
                    continue;
                }
                if !first {
                    out.push(b',');
                }
                first = false;
                out.extend_from_slice(&plan.col_keys[i]);
                out.extend_from_slice(b"{\"from\":");
                self.write_cell(&mut out, types, plan, i, o);
                out.extend_from_slice(b",\"to\":");
                self.write_cell(&mut out, types, plan, i, n);
                out.push(b'}');
            }
            out.push(b'}');
        }
        if let (Some(fragment), Some(c)) = (&plan.compliance, &plan.config.compliance) {
            out.extend_from_slice(b",\"compliance\":{\"audit_id\":\"AUD-");
            write_u64(&mut out, txn.commit_lsn.0);
            out.push(b'-');
            write_u64(&mut out, index as u64);
            out.push(b'"');
            if let Some(days) = c.audit_retention_days {
                out.push(b',');
                write_key(&mut out, "retention_until");
                write_str(&mut out, format_pg_date_plus_days(txn.commit_time, days).as_bytes());
            }
            if let Some(k) = self.token_key.as_ref().filter(|_| plan.needs_token_key()) {
                out.push(b',');
                write_key(&mut out, "key_version");
                write_u64(&mut out, u64::from(k.version()));
            }
            out.extend_from_slice(fragment);
            out.push(b'}');
        }
        out.push(b'}');

        // Key: partition_key column, else key columns, taken from the new image (old for deletes).
        let key_source = |i: usize| {
            if ch.new.is_some() {
                new_value(i)
            } else {
                old_value(i)
            }
        };
        let key_cols: Vec<usize> = match plan.partition {
            Some(p) => vec![p],
            None => plan.key.clone(),
        };
        let enriched_key = plan.partition_enriched.filter(|(i, _)| *i < ch.enriched.len());
        let key = if let Some((i, j)) = enriched_key {
            let mut k = Vec::with_capacity(32);
            k.push(b'{');
            k.extend_from_slice(&plan.enrich[i].keys[j]);
            write_lookup_value(
                &mut k,
                types,
                plan.enrich[i].types[j],
                ch.enriched[i].as_ref().and_then(|r| r[j].as_deref()),
            );
            k.push(b'}');
            Some(k)
        } else if key_cols.is_empty() {
            None
        } else {
            let mut k = Vec::with_capacity(32);
            self.write_image(&mut k, types, plan, &key_cols, key_source);
            Some(k)
        };
        Event {
            table_oid: rel.oid,
            schema: plan.schema.clone(),
            table: plan.table.clone(),
            op: ch.op,
            lsn: ch.lsn,
            commit_lsn: txn.commit_lsn,
            index: index as u32,
            key,
            payload: out,
            tombstone: false,
            topic_version: plan.topic_version,
            schema_version: plan.schema_version.zip(plan.schema_version_lsn).map(|((n, _), at)| (n, at)),
            routes: Vec::new(),
        }
    }

    fn write_image<'v>(
        &self,
        out: &mut Vec<u8>,
        types: &TypeRegistry,
        plan: &RelationPlan,
        cols: &[usize],
        value: impl Fn(usize) -> TupleValue<'v>,
    ) {
        out.push(b'{');
        for (n, &i) in cols.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&plan.col_keys[i]);
            self.write_cell(out, types, plan, i, value(i));
        }
        out.push(b'}');
    }

    /// Writes column `i`'s value, hidden as the plan says.
    fn write_cell(&self, out: &mut Vec<u8>, types: &TypeRegistry, plan: &RelationPlan, i: usize, v: TupleValue<'_>) {
        match (plan.redact[i], v) {
            (Some(method), TupleValue::Text(text)) => match redact::replace(method, self.token_key.as_ref(), text) {
                Ok(Some(s)) => write_str(out, s.as_bytes()),
                // `remove` columns are not in images; a missing key is refused before encoding.
                Ok(None) | Err(_) => out.extend_from_slice(b"null"),
            },
            _ => write_tuple_value(out, types, plan.relation.columns[i].type_oid, v),
        }
    }

    /// Encodes a TRUNCATE of one table: no key, no images, the options in `metadata.truncate`.
    pub fn encode_truncate(
        &self,
        plan: &RelationPlan,
        options: u8,
        lsn: Lsn,
        txn: &TxnInfo,
        index: usize,
        ctx: Option<&UserContext>,
    ) -> Event {
        let rel = &plan.relation;
        let mut out = Vec::with_capacity(320);
        self.write_metadata(&mut out, plan, Op::Truncate, lsn, txn, index, ctx, &FilterMark::None);
        out.extend_from_slice(b",\"truncate\":{\"cascade\":");
        out.extend_from_slice(if options & 1 != 0 { b"true" } else { b"false" });
        out.extend_from_slice(b",\"restart_identity\":");
        out.extend_from_slice(if options & 2 != 0 { b"true" } else { b"false" });
        out.extend_from_slice(b"}},\"before\":null,\"after\":null}");
        Event {
            table_oid: rel.oid,
            schema: plan.schema.clone(),
            table: plan.table.clone(),
            op: Op::Truncate,
            lsn,
            commit_lsn: txn.commit_lsn,
            index: index as u32,
            key: None,
            payload: out,
            tombstone: false,
            topic_version: plan.topic_version,
            schema_version: plan.schema_version.zip(plan.schema_version_lsn).map(|((n, _), at)| (n, at)),
            routes: Vec::new(),
        }
    }
}

/// Appends the enriched columns to the image just written (its closing brace is at the end).
fn write_enriched(out: &mut Vec<u8>, types: &TypeRegistry, plan: &RelationPlan, enriched: &[Option<LookupRow>]) {
    if enriched.is_empty() || out.last() != Some(&b'}') {
        return;
    }
    out.pop();
    for (e, row) in plan.enrich.iter().zip(enriched) {
        for (j, key) in e.keys.iter().enumerate() {
            if out.last() != Some(&b'{') {
                out.push(b',');
            }
            out.extend_from_slice(key);
            write_lookup_value(out, types, e.types[j], row.as_ref().and_then(|r| r[j].as_deref()));
        }
    }
    out.push(b'}');
}

fn write_lookup_value(out: &mut Vec<u8>, types: &TypeRegistry, type_oid: u32, v: Option<&str>) {
    match v {
        Some(t) => write_value(out, types, type_oid, t.as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_opt_str(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(s) => write_str(out, s.as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_tuple_value(out: &mut Vec<u8>, types: &TypeRegistry, type_oid: u32, v: TupleValue<'_>) {
    match v {
        TupleValue::Text(t) => write_value(out, types, type_oid, t),
        // UnchangedToast never reaches here for images (listed in unchanged_toast_columns instead).
        TupleValue::Null | TupleValue::UnchangedToast => out.extend_from_slice(b"null"),
    }
}
