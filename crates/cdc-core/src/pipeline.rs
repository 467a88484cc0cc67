//! Turns a stream of pgoutput frames into committed transactions of encoded events, for one sink.
//!
//! ```text
//!  frames (lsn, bytes) ──decode──▶ Begin / Relation / Insert|Update|Delete|Truncate / Commit
//!        │                               │ relation ─▶ RelationPlan (columns, key, config)
//!        │                               ▼
//!        │                 pending changes of the open transaction
//!        │                               │ Commit: count, then encode each change
//!        ▼                               ▼
//!  heartbeat messages ─▶ confirm LSN   Transaction { xid, commit_lsn, end_lsn, events }
//! ```
//! Only whole transactions come out: a transaction whose Commit is not in the batch is held back
//! and its frames are re-read with the next read (the slot is never advanced past it).

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::CaptureConfig;
use crate::context::{self, UserContext};
use crate::decode::TupleValue;
use crate::decode::{decode, DecodeError, Message, OldKind, Tuple};
use crate::envelope::{Encoder, Event, FilterMark, Op, RelationPlan, RowChange, TxnInfo};
use crate::format::EventFormat;
use crate::frame::MvccSnapshot;
use crate::lookup::{Answer, LookupChange, LookupRow, Lookups};
use crate::lsn::Lsn;
use crate::stats::TableCounters;
use crate::types::TypeRegistry;

/// Prefix of the logical messages pg_cdc emits to move idle slots forward.
pub const HEARTBEAT_PREFIX: &str = "pg_cdc.heartbeat";

/// The prefix of the transactional logical message `cdc_enable` writes (content: `<table oid>`):
/// the table is captured, with that config, from its transaction on. A worker whose catalog copy
/// was read before that transaction committed reads the catalog again before it decodes anything
/// after the message: no change of a table enabled (or enabled again) since is decoded with a copy
/// that does not carry it, or carries its older config and schema history.
pub const CAPTURE_MESSAGE_PREFIX: &str = "pg_cdc.capture";

pub use crate::frame::{RawFrame, Transaction};

/// What one batch of frames produced.
#[derive(Debug, Default)]
pub struct BatchOutput {
    /// Committed transactions in commit order (including those with no event for this sink).
    pub transactions: Vec<Transaction>,
    /// The LSN the slot may be confirmed to once everything in `transactions` is delivered:
    /// the end of the last complete transaction or the last heartbeat after it.
    pub confirm_lsn: Option<Lsn>,
    /// Number of frames that were part of an incomplete trailing transaction.
    pub held_back_frames: usize,
}

/// Why a batch could not be processed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PipelineError {
    /// A frame is not valid pgoutput.
    Decode {
        /// LSN of the frame.
        lsn: Lsn,
        /// What was wrong.
        error: DecodeError,
    },
    /// The frames are out of protocol order (a change outside a transaction, a change for an
    /// unknown relation).
    Protocol {
        /// LSN of the frame.
        lsn: Lsn,
        /// What was wrong.
        reason: String,
    },
    /// A table's capture config cannot be applied (it no longer fits the table, a lookup copy is
    /// missing): the sink stops rather than publish events the config does not describe.
    Config {
        /// The table, `schema.name`.
        table: String,
        /// What is missing.
        reason: String,
    },
    /// A table's events cannot be redacted as its config says (the tokenization key is missing
    /// or unreadable): the sink holds them back rather than publish what the config says to hide.
    Compliance {
        /// The table, `schema.name`.
        table: String,
        /// What is missing.
        reason: String,
    },
    /// A relation names a column the table's schema history, as the worker read it, does not have
    /// at that position: a DDL committed after the history was read. The sink reads the catalog
    /// again and retries; nothing is published with a config it cannot match.
    SchemaBehind {
        /// The table, `schema.name`.
        table: String,
        /// LSN of the relation.
        lsn: Lsn,
        /// The column.
        column: String,
    },
    /// A DDL recorded a version of a table the sink carries that the schema history, as the
    /// worker read it, does not hold: it was read before that DDL committed. The sink reads the
    /// catalog again and retries; nothing after the DDL is encoded with the older history.
    HistoryBehind {
        /// The table, `schema.name`.
        table: String,
        /// LSN of the DDL's message.
        lsn: Lsn,
        /// The version the DDL recorded.
        version: i32,
    },
    /// A table's `regional_routing` changed at a position after the catalog copy the worker read
    /// (see [`crate::routing`]): it reads the catalog again and retries, so nothing after the change
    /// is routed by the older routing.
    RoutingBehind {
        /// The table, `schema.name`.
        table: String,
        /// LSN of the routing message.
        lsn: Lsn,
    },
    /// A table was enabled for capture (or its capture config replaced) by a transaction that
    /// committed after the catalog copy the worker read ([`CAPTURE_MESSAGE_PREFIX`]): it reads the
    /// catalog again and retries, so nothing after it is decoded without the table or with its
    /// older config.
    CaptureBehind {
        /// The table, `schema.name`.
        table: String,
        /// LSN of the capture message.
        lsn: Lsn,
    },
    /// The sink's event format could not encode a change (see [`crate::format`]): a schema
    /// registry that is down (retried) or that refuses the schema, a value the format cannot
    /// carry (an operator must act). Nothing of the transaction is published.
    Format {
        /// The table, `schema.name`.
        table: String,
        /// LSN of the change.
        lsn: Lsn,
        /// What happened.
        error: crate::format::FormatError,
    },
}

impl std::fmt::Display for PipelineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PipelineError::Decode { lsn, error } => write!(f, "at LSN {lsn}: {error}"),
            PipelineError::Protocol { lsn, reason } => write!(f, "at LSN {lsn}: {reason}"),
            PipelineError::SchemaBehind { table, lsn, column } => write!(
                f,
                "table {table}: column \"{column}\" at LSN {lsn} is not in the schema history read so far; reading it again"
            ),
            PipelineError::HistoryBehind { table, lsn, version } => write!(
                f,
                "table {table}: version {version} of its schema, recorded at LSN {lsn}, is not in the schema history read so far; reading it again"
            ),
            PipelineError::RoutingBehind { table, lsn } => write!(
                f,
                "table {table}: its regional_routing changed at LSN {lsn}, after the catalog was read; reading it again"
            ),
            PipelineError::CaptureBehind { table, lsn } => write!(
                f,
                "table {table}: its capture was enabled or its capture config replaced at LSN {lsn}, after the catalog was read; reading it again"
            ),
            PipelineError::Format { table, lsn, error } => write!(f, "table {table}, change at LSN {lsn}: {error}"),
            PipelineError::Config { table, reason } | PipelineError::Compliance { table, reason } => {
                write!(f, "table {table}: {reason}")
            }
        }
    }
}

impl std::error::Error for PipelineError {}

/// The tables one sink captures: OID -> capture config.
pub type SinkTables = HashMap<u32, Arc<CaptureConfig>>;

/// A change waiting for its transaction's commit.
enum Pending<'a> {
    Row {
        plan: Arc<RelationPlan>,
        op: Op,
        lsn: Lsn,
        old: Option<(OldKind, Tuple<'a>)>,
        new: Option<Tuple<'a>>,
        ctx: Option<Arc<UserContext>>,
        mark: FilterMark,
    },
    Truncate {
        plans: Vec<Arc<RelationPlan>>,
        options: u8,
        lsn: Lsn,
        ctx: Option<Arc<UserContext>>,
    },
}

impl Pending<'_> {
    /// Attaches the context of the statement that made the change, if its table asks for it.
    fn with_context(mut self, current: &Option<Arc<UserContext>>) -> Self {
        if current.is_some() {
            match &mut self {
                Pending::Row { plan, ctx, .. } if plan.config.needs_context() => ctx.clone_from(current),
                Pending::Truncate { plans, ctx, .. } if plans.iter().any(|p| p.config.needs_context()) => {
                    ctx.clone_from(current)
                }
                _ => {}
            }
        }
        self
    }

    /// Events this change produces: an UPDATE that changes the key also retracts the old key.
    fn event_count(&self) -> usize {
        match self {
            Pending::Row { plan, op: Op::Update, old: Some((kind, old)), new: Some(new), mark, .. } => {
                1 + usize::from(retracts(plan, *kind, old, new, mark))
            }
            Pending::Row { .. } => 1,
            Pending::Truncate { plans, .. } => plans.len(),
        }
    }
}

/// The routes of this sink an event is a change of (see [`Event::routes`]): the route of `row`,
/// the image the event carries, and the route of `left`, the image the row had before when the
/// event also stands for its leaving that route (an UPDATE without a retraction).
fn route_tags(
    plan: &RelationPlan,
    lsn: Lsn,
    row: Option<&Tuple<'_>>,
    left: Option<&Tuple<'_>>,
) -> Vec<(Arc<str>, Lsn)> {
    let Some(r) = plan.route.as_ref().filter(|r| r.applies(lsn)) else { return Vec::new() };
    let mut out: Vec<(Arc<str>, Lsn)> = Vec::new();
    let fallback = left.map(Vec::as_slice);
    let candidates = [row.and_then(|t| r.route_of(t, fallback)), left.and_then(|t| r.route_of(t, None))];
    for route in candidates.into_iter().flatten() {
        let name = r.name(route);
        if r.carries(Some(route)) && !out.iter().any(|(n, _)| *n == name) {
            out.push((name, r.since));
        }
    }
    out
}

/// Whether an UPDATE retracts its old key first: the key changed, and the consumer has the old
/// row (not when the row just entered the filter: its old version was never published).
fn retracts(plan: &RelationPlan, kind: OldKind, old: &Tuple<'_>, new: &Tuple<'_>, mark: &FilterMark) -> bool {
    !matches!(mark, FilterMark::Entered(_)) && key_changed(plan, kind, old, new)
}

/// Whether the message key of a row changed. Only the key columns are a row's identity: a
/// `partition_key` groups rows (its value changing retracts nothing). A key-only old image holds
/// the replica identity columns and nulls for the rest, so a key column outside the replica
/// identity (never null there: key columns identify rows) cannot be compared without a before image.
fn key_changed(plan: &RelationPlan, kind: OldKind, old: &Tuple<'_>, new: &Tuple<'_>) -> bool {
    use crate::decode::TupleValue::{Null, UnchangedToast};
    if plan.partition.is_some() || plan.partition_enriched.is_some() {
        return false;
    }
    if kind == OldKind::Key && plan.key.iter().any(|&i| old.get(i).copied() == Some(Null)) {
        return false;
    }
    plan.key.iter().any(|&i| {
        let n = new.get(i).copied();
        n != Some(UnchangedToast) && old.get(i).copied() != n
    })
}

/// Per-sink decoding state that outlives one batch (relation descriptions).
pub struct Assembler {
    encoder: Encoder,
    relations: HashMap<u32, Arc<RelationPlan>>,
    /// Whether events carry computed columns (a sink's `include_transformations`).
    transformations: bool,
    /// The sink's `partition_key`, which keys its events instead of the tables' own keys.
    partition_key: Option<String>,
    /// Filter and transformation counts per table OID since the last [`Assembler::take_counters`].
    counters: HashMap<u32, TableCounters>,
    /// The key that seals user context messages (see [`crate::context`]).
    context_key: Option<Vec<u8>>,
    /// The sink's copies of the lookup tables `enrich` reads.
    lookups: Lookups,
    /// The sink's event format, when it is not JSON.
    format: Option<Box<dyn EventFormat>>,
    /// The sink's name (the routes of `regional_routing` name sinks).
    sink: String,
    /// The MVCC snapshot the catalog copy (the `tables` of each call) was read in: which
    /// transactions it reflects. `None`: unknown (the capture and version messages then fall back
    /// to what the copy itself says).
    catalog_snapshot: Option<MvccSnapshot>,
}

impl Assembler {
    /// A new assembler for events of `database`.
    pub fn new(database: &str) -> Self {
        Assembler {
            encoder: Encoder::new(database),
            relations: HashMap::new(),
            transformations: true,
            partition_key: None,
            counters: HashMap::new(),
            context_key: None,
            lookups: Lookups::default(),
            format: None,
            sink: String::new(),
            catalog_snapshot: None,
        }
    }

    /// Sets the MVCC snapshot the catalog copy passed to the next calls was read in
    /// (`pg_current_snapshot()` of the catalog query): a capture or version message of a
    /// transaction it does not see committed means the copy is older than that transaction.
    pub fn set_catalog_snapshot(&mut self, snapshot: Option<MvccSnapshot>) {
        self.catalog_snapshot = snapshot;
    }

    /// Sets the sink's name, which `regional_routing` routes name.
    pub fn set_sink_name(&mut self, name: &str) {
        if self.sink != name {
            self.sink = name.to_string();
            self.relations.clear();
        }
    }

    /// Sets the sink's event format (`None`: pg_cdc's JSON).
    pub fn set_format(&mut self, format: Option<Box<dyn EventFormat>>) {
        self.format = format;
    }

    /// The schema registrations its format made since the last call (see
    /// [`EventFormat::take_registrations`]).
    pub fn take_registrations(&mut self) -> Vec<crate::format::Registration> {
        self.format.as_mut().map(|f| f.take_registrations()).unwrap_or_default()
    }

    /// The sink's lookup copies (the worker sets their bindings, source and capacity, and
    /// flushes them before confirming the slot).
    pub fn lookups_mut(&mut self) -> &mut Lookups {
        &mut self.lookups
    }

    /// The sink's lookup tables (see `lookups_mut`).
    pub fn lookups(&self) -> &Lookups {
        &self.lookups
    }

    /// Whether the sink enriches from any lookup table.
    pub fn has_lookups(&self) -> bool {
        !self.lookups.is_empty()
    }

    /// The change a lookup table's message makes to the sink's copies, if it is one.
    fn lookup_change<'a>(&self, msg: &Message<'a>) -> Option<LookupChange<'a>> {
        match msg {
            Message::Insert { relation, new } if self.lookups.is_lookup_table(*relation) => {
                Some(LookupChange::Upsert { oid: *relation, old: None, new: new.clone() })
            }
            Message::Update { relation, old, new } if self.lookups.is_lookup_table(*relation) => {
                Some(LookupChange::Upsert {
                    oid: *relation,
                    old: old.as_ref().map(|(_, t)| t.clone()),
                    new: new.clone(),
                })
            }
            Message::Delete { relation, old, .. } if self.lookups.is_lookup_table(*relation) => {
                Some(LookupChange::Delete { oid: *relation, old: old.clone() })
            }
            Message::Truncate { relations, .. } if relations.iter().any(|r| self.lookups.is_lookup_table(*r)) => {
                Some(LookupChange::Truncate(relations.clone()))
            }
            _ => None,
        }
    }

    /// Looks up the rows a change's image is enriched with (one per `enrich` transformation),
    /// counting lookups and hits for the table.
    fn enrich_rows(
        &mut self,
        plan: &RelationPlan,
        image: Option<&Tuple<'_>>,
        lsn: Lsn,
    ) -> Result<Vec<Option<LookupRow>>, PipelineError> {
        let mut rows = Vec::with_capacity(plan.enrich.len());
        for (i, e) in plan.enrich.iter().enumerate() {
            let Some(key) = image.and_then(|t| plan.lookup_key(i, t)) else {
                rows.push(None);
                continue;
            };
            let key = std::str::from_utf8(key)
                .map_err(|_| PipelineError::Protocol { lsn, reason: "a lookup key is not UTF-8".into() })?;
            let (row, answer) = self
                .lookups
                .lookup(e.id, key)
                .map_err(|reason| PipelineError::Protocol { lsn, reason: format!("enrich: {reason}") })?;
            let c = self.counters.entry(plan.relation.oid).or_default();
            c.lookups += 1;
            c.lookup_hits += u64::from(answer == Answer::Hit);
            rows.push(row);
        }
        Ok(rows)
    }

    /// Sets the key user context messages are sealed with (`None`: contexts are dropped).
    pub fn set_context_key(&mut self, key: Option<Vec<u8>>) {
        self.context_key = key;
    }

    /// The user context a transactional message carries, if it is pg_cdc's and genuine.
    /// A DDL recorded a version of a table the sink carries (its transactional message,
    /// [`crate::schema::VERSION_MESSAGE_PREFIX`]): when the history the worker read is behind it
    /// ([`crate::schema::History::behind`]), it was read before the DDL committed, and what follows
    /// must not be encoded (nor routed to a topic) with it. The sink reads the catalog again and
    /// retries.
    fn check_version_message(
        &self,
        prefix: &str,
        content: &[u8],
        lsn: Lsn,
        xid: u32,
        tables: &SinkTables,
    ) -> Result<(), PipelineError> {
        if prefix != crate::schema::VERSION_MESSAGE_PREFIX {
            return Ok(());
        }
        let Some((oid, version)) = crate::schema::parse_version_message(content) else { return Ok(()) };
        let Some(history) = tables.get(&oid).and_then(|c| c.history.as_ref()) else { return Ok(()) };
        // With the catalog's snapshot known, exactly: the copy holds the DDL's version iff it was
        // read after the DDL committed. (A history of the same table from before a cdc_disable
        // and cdc_enable may hold another version of the same number.)
        let behind = match &self.catalog_snapshot {
            Some(seen) => !seen.sees_committed(xid),
            None => history.behind(version, lsn),
        };
        if !behind {
            return Ok(());
        }
        Err(PipelineError::HistoryBehind { table: self.table_name(oid), lsn, version })
    }

    /// A table was enabled for capture, or its capture config replaced
    /// ([`CAPTURE_MESSAGE_PREFIX`]), by transaction `xid`: when the catalog copy was read before
    /// it committed, the sink reads the catalog again.
    fn check_capture_message(&self, prefix: &str, content: &[u8], lsn: Lsn, xid: u32) -> Result<(), PipelineError> {
        if prefix != CAPTURE_MESSAGE_PREFIX {
            return Ok(());
        }
        let Some(seen) = &self.catalog_snapshot else { return Ok(()) };
        if seen.sees_committed(xid) {
            return Ok(());
        }
        let oid = std::str::from_utf8(content).ok().and_then(|t| t.trim().parse::<u32>().ok());
        let table = oid.map(|o| self.table_name(o)).unwrap_or_else(|| "(unnamed)".into());
        Err(PipelineError::CaptureBehind { table, lsn })
    }

    /// A table's routing changed (its transactional message, [`crate::routing::ROUTING_MESSAGE_PREFIX`]):
    /// when the sink's copy of its config is from before, the sink reads the catalog again.
    fn check_routing_message(
        &self,
        prefix: &str,
        content: &[u8],
        lsn: Lsn,
        tables: &SinkTables,
    ) -> Result<(), PipelineError> {
        if prefix != crate::routing::ROUTING_MESSAGE_PREFIX {
            return Ok(());
        }
        let Some(oid) = crate::routing::parse_message(content) else { return Ok(()) };
        let Some(cfg) = tables.get(&oid) else { return Ok(()) };
        if cfg.routing_lsn.is_some_and(|at| at >= lsn) {
            return Ok(());
        }
        Err(PipelineError::RoutingBehind { table: self.table_name(oid), lsn })
    }

    /// A table's `schema.name` as its relation says, for messages (`with OID <oid>` before one).
    fn table_name(&self, oid: u32) -> String {
        match self.relations.get(&oid) {
            Some(p) => format!("{}.{}", p.relation.namespace, p.relation.name),
            None => format!("with OID {oid}"),
        }
    }

    fn context_of(&self, xid: u32, prefix: &str, content: &[u8]) -> Option<Arc<UserContext>> {
        if prefix != context::PREFIX {
            return None;
        }
        context::open(self.context_key.as_deref()?, xid, content).map(Arc::new)
    }

    /// Whether events carry computed columns (default true; a sink's `include_transformations`).
    /// Masks and PII redaction apply either way.
    pub fn set_transformations(&mut self, on: bool) {
        if self.transformations != on {
            self.transformations = on;
            self.relations.clear();
        }
    }

    /// Sets the sink's `partition_key` (see [`RelationPlan::override_partition_key`]).
    pub fn set_partition_key(&mut self, column: Option<String>) {
        if self.partition_key != column {
            self.partition_key = column;
            self.relations.clear();
        }
    }

    /// The filter and transformation counts gathered since the last call, by table OID (the
    /// encode pass of a large transaction; [`Assembler::process`] hands each transaction's counts
    /// over in [`Transaction::counters`]).
    pub fn take_counters(&mut self) -> HashMap<u32, TableCounters> {
        std::mem::take(&mut self.counters)
    }

    /// Applies the table's `regional_routing` to a change for this sink (see [`crate::routing`]):
    /// `None` when the sink gets nothing of it, else the change as the sink gets it (an UPDATE that
    /// moved the row out of the sink's routes becomes the DELETE of its before image, one that
    /// moved it in the INSERT of its after image). Before the filter: the filter then judges what
    /// the sink gets.
    fn route<'a>(&self, p: Pending<'a>) -> Option<Pending<'a>> {
        let (plan, op, lsn, old, new, ctx, mark) = match p {
            Pending::Row { plan, op, lsn, old, new, ctx, mark } => (plan, op, lsn, old, new, ctx, mark),
            Pending::Truncate { plans, options, lsn, ctx } => {
                // A TRUNCATE empties every route: it goes to the sinks of any route.
                let plans: Vec<_> = plans
                    .into_iter()
                    .filter(|p| p.route.as_ref().is_none_or(|r| !r.applies(lsn) || r.in_any()))
                    .collect();
                return (!plans.is_empty()).then_some(Pending::Truncate { plans, options, lsn, ctx });
            }
        };
        let Some(r) = plan.route.as_ref().filter(|r| r.applies(lsn)) else {
            return Some(Pending::Row { plan, op, lsn, old, new, ctx, mark });
        };
        let full_old = match &old {
            Some((OldKind::Full, t)) => Some(t.as_slice()),
            _ => None,
        };
        let old_in = full_old.map(|o| r.carries(r.route_of(o, None)));
        let new_in = new.as_ref().map(|n| r.carries(r.route_of(n, full_old)));
        let keep = |op, old, new| {
            Some(Pending::Row { plan: plan.clone(), op, lsn, old, new, ctx: ctx.clone(), mark: mark.clone() })
        };
        match op {
            Op::Insert | Op::Read => (new_in == Some(true)).then(|| keep(op, old, new)).flatten(),
            // Without a full before image the route is unknown: the sinks get the DELETE.
            Op::Delete => (old_in != Some(false)).then(|| keep(op, old, new)).flatten(),
            Op::Update => match (old_in, new_in) {
                (Some(true) | None, Some(true)) => keep(op, old, new),
                (Some(true), _) => keep(Op::Delete, old, None),
                (Some(false), Some(true)) => {
                    // The row entered the sink's routes: an INSERT of its whole after image (a
                    // value the UPDATE left unchanged in TOAST is the before image's).
                    let new = match (new, full_old) {
                        (Some(n), Some(o)) => Some(
                            n.iter()
                                .zip(o)
                                .map(|(v, ov)| if *v == TupleValue::UnchangedToast { *ov } else { *v })
                                .collect(),
                        ),
                        (n, _) => n,
                    };
                    keep(Op::Insert, None, new)
                }
                _ => None,
            },
            Op::Truncate => keep(op, old, new),
        }
    }

    /// Applies the table's row filter to a change: `Ok` with the change as published (marked, or
    /// turned into the DELETE of a row that left the filter), `Err` with it when the filter drops
    /// it. `count` adds to the table's counters.
    ///
    /// INSERT: published when the new row matches. UPDATE: published when the new row matches
    /// (marked "entered" when the full before image did not); when it does not, published as a
    /// DELETE of the before image if that one matched ("left"), else dropped — without a full
    /// before image a row that leaves the filter cannot be told from one that never was in it, so
    /// it is dropped. DELETE: judged on the full before image; with only the key it is published.
    fn apply_filter<'a>(&mut self, p: Pending<'a>, count: bool) -> Result<Pending<'a>, Pending<'a>> {
        let Pending::Row { plan, op, lsn, old, new, ctx, .. } = p else {
            return Ok(p);
        };
        let Some(filter) = plan.filter.as_ref() else {
            return Ok(Pending::Row { plan, op, lsn, old, new, ctx, mark: FilterMark::None });
        };
        let errors_before = filter.errors();
        let full_old = match &old {
            Some((OldKind::Full, t)) => Some(t),
            _ => None,
        };
        let new_branch = new.as_ref().and_then(|n| match full_old {
            // Unchanged TOAST values are only known from a full before image.
            Some(o) if n.contains(&TupleValue::UnchangedToast) => {
                let filled: Vec<TupleValue<'_>> = n
                    .iter()
                    .zip(o.iter())
                    .map(|(v, ov)| if *v == TupleValue::UnchangedToast { *ov } else { *v })
                    .collect();
                plan.matched_branch(&filled)
            }
            _ => plan.matched_branch(n),
        });
        let old_matches = full_old.map(|o| filter.filter(o));
        let (outcome, entered, left) = match (op, new_branch) {
            (Op::Delete, _) => match full_old {
                Some(o) => match plan.matched_branch(o) {
                    Some(b) => (Some(FilterMark::Matched(b)), false, false),
                    None => (None, false, false),
                },
                None => (Some(FilterMark::None), false, false),
            },
            (Op::Update, Some(b)) if old_matches == Some(false) => (Some(FilterMark::Entered(b)), true, false),
            (_, Some(b)) => (Some(FilterMark::Matched(b)), false, false),
            (Op::Update, None) if old_matches == Some(true) => (Some(FilterMark::Left), false, true),
            (_, None) => (None, false, false),
        };
        if count {
            let c = self.counters.entry(plan.relation.oid).or_default();
            c.changes += 1;
            c.expression_errors += filter.errors() - errors_before;
            if outcome.is_some() {
                c.matched += 1;
            } else {
                c.excluded += 1;
            }
            c.entered += u64::from(entered);
            c.left += u64::from(left);
        }
        match outcome {
            Some(FilterMark::Left) => {
                Ok(Pending::Row { plan, op: Op::Delete, lsn, old, new: None, ctx, mark: FilterMark::Left })
            }
            Some(mark) => Ok(Pending::Row { plan, op, lsn, old, new, ctx, mark }),
            None => Err(Pending::Row { plan, op, lsn, old, new, ctx, mark: FilterMark::None }),
        }
    }

    /// Counts what the filter saved: the encoded size of a dropped change (without its enriched
    /// columns: looking them up only to count them would cost lookups nobody needs).
    fn count_dropped(&mut self, p: &Pending<'_>, txn: &TxnInfo, types: &TypeRegistry) -> Result<(), PipelineError> {
        let Pending::Row { plan, .. } = p else { return Ok(()) };
        let oid = plan.relation.oid;
        let mut scratch = Vec::new();
        self.encode_pending_at(p, txn, types, 0, false, &mut scratch)?;
        let bytes: usize = scratch.iter().map(|e| e.payload.len() + e.key.as_ref().map_or(0, Vec::len)).sum();
        self.counters.entry(oid).or_default().excluded_bytes += bytes as u64;
        Ok(())
    }

    /// Evaluation errors of a change's computed columns so far (see [`Self::count_published`]).
    fn computed_errors(p: &Pending<'_>) -> u64 {
        match p {
            Pending::Row { plan, .. } => plan.computed.iter().map(|(_, b)| b.errors()).sum(),
            Pending::Truncate { .. } => 0,
        }
    }

    /// Counts the transformations of a published change, once encoded; `errors_before` is
    /// [`Self::computed_errors`] from before it was encoded.
    fn count_published(&mut self, p: &Pending<'_>, errors_before: u64) {
        if let Pending::Row { plan, new, old, .. } = p {
            let computed = new.is_some() && !plan.computed.is_empty();
            let masked = plan.redact.iter().any(Option::is_some);
            let audited = plan.config.compliance.is_some();
            if computed || masked || audited {
                let errors = Self::computed_errors(p) - errors_before;
                let events = p.event_count() as u64;
                // Values hidden: the redacted columns that hold a value in the event's image (the
                // new row, or the old one of a DELETE), once per event.
                let image = new.as_ref().or(old.as_ref().map(|(_, t)| t));
                let hidden = image.map_or(0, |row| {
                    plan.redact.iter().zip(row).filter(|(m, v)| m.is_some() && **v != TupleValue::Null).count()
                });
                let c = self.counters.entry(plan.relation.oid).or_default();
                c.computations += u64::from(computed);
                c.masks += u64::from(masked);
                c.expression_errors += errors;
                c.pii_redactions += hidden as u64 * events;
                c.audit_records += if audited { events } else { 0 };
            }
        }
    }

    /// Sets the key `tokenize` uses (`None`: tables that tokenize stop the sink with an error).
    pub fn set_token_key(&mut self, key: Option<crate::redact::TokenKey>) {
        self.encoder.token_key = key;
    }

    /// Forgets relation descriptions and the lookup copies in memory, after a failed delivery:
    /// the slot is read again from where it was confirmed (pgoutput describes each relation again
    /// before its first change in every read, and the lookups start again from their persisted
    /// copies).
    pub fn reset(&mut self) {
        self.relations.clear();
        self.lookups.reset();
    }

    /// Processes one batch of frames in LSN order.
    pub fn process(
        &mut self,
        frames: &[RawFrame],
        tables: &SinkTables,
        types: &TypeRegistry,
    ) -> Result<BatchOutput, PipelineError> {
        let mut out = BatchOutput::default();
        let mut open: Option<(u32, usize)> = None; // (xid, index of its Begin frame)
        let mut pending: Vec<Pending<'_>> = Vec::new();
        let mut dropped: Vec<Pending<'_>> = Vec::new();
        let mut lookup_changes: Vec<LookupChange<'_>> = Vec::new();
        let mut ctx: Option<Arc<UserContext>> = None;
        for (idx, frame) in frames.iter().enumerate() {
            let msg = decode(&frame.data).map_err(|error| PipelineError::Decode { lsn: frame.lsn, error })?;
            let proto = |reason: String| PipelineError::Protocol { lsn: frame.lsn, reason };
            match msg {
                Message::Begin { xid, .. } => {
                    if open.is_some() {
                        return Err(proto("Begin inside an open transaction".into()));
                    }
                    open = Some((xid, idx));
                    pending.clear();
                    dropped.clear();
                    lookup_changes.clear();
                    ctx = None;
                }
                Message::Commit { commit_lsn, end_lsn, commit_time, .. } => {
                    let Some((xid, _)) = open.take() else {
                        return Err(proto("Commit without Begin".into()));
                    };
                    if !self.lookups.is_empty() {
                        // The transaction's own lookup changes first: its events see the lookup
                        // rows as they were when it committed.
                        self.lookups
                            .commit(commit_lsn, end_lsn, &lookup_changes)
                            .map_err(|r| proto(format!("enrich: {r}")))?;
                        lookup_changes.clear();
                    }
                    let txn = TxnInfo { xid, commit_lsn, commit_time, event_count: 0 };
                    let t = self.finish(&mut pending, &mut dropped, txn, end_lsn, types)?;
                    out.transactions.push(t);
                    out.confirm_lsn = Some(end_lsn);
                }
                Message::SnapshotChunk { commit_lsn, end_lsn, commit_time, relation, rows } => {
                    if open.is_some() {
                        return Err(proto("a snapshot chunk inside a transaction".into()));
                    }
                    // The chunk's rows are laid out as the chunk read them; the stream's own
                    // description of the table (if any) is put back after them.
                    let oid = relation.oid;
                    let stream_plan = self.relations.get(&oid).cloned();
                    self.change(Message::Relation(relation), frame.lsn, false, tables, types)?;
                    pending.clear();
                    dropped.clear();
                    if let Some(plan) = self.relations.get(&oid).cloned() {
                        // Each row's own position inside the watermark record (see
                        // `snapshot::watermark_content`).
                        let n = rows.len() as u64;
                        for (i, new) in rows.into_iter().enumerate() {
                            let p = Pending::Row {
                                plan: plan.clone(),
                                op: Op::Read,
                                lsn: Lsn(commit_lsn.0.saturating_sub(n - i as u64)),
                                old: None,
                                new: Some(new),
                                ctx: None,
                                mark: FilterMark::None,
                            };
                            match self.route(p).map(|p| self.apply_filter(p, true)) {
                                Some(Ok(p)) => pending.push(p),
                                Some(Err(p)) => dropped.push(p),
                                None => {}
                            }
                        }
                    }
                    match stream_plan {
                        Some(p) => self.relations.insert(oid, p),
                        None => self.relations.remove(&oid),
                    };
                    let txn = TxnInfo { xid: 0, commit_lsn, commit_time, event_count: 0 };
                    let t = self.finish(&mut pending, &mut dropped, txn, end_lsn, types)?;
                    out.transactions.push(t);
                    out.confirm_lsn = Some(end_lsn);
                }
                Message::LogicalMessage { transactional, prefix, lsn, content } => {
                    // A non-transactional heartbeat outside any transaction marks a point the slot may
                    // be confirmed to once everything before it is delivered.
                    if !transactional && open.is_none() && prefix == HEARTBEAT_PREFIX {
                        out.confirm_lsn = Some(lsn.max(frame.lsn));
                    }
                    if let (true, Some((xid, _))) = (transactional, open) {
                        self.check_capture_message(prefix, content, lsn, xid)?;
                        self.check_version_message(prefix, content, lsn, xid, tables)?;
                        self.check_routing_message(prefix, content, lsn, tables)?;
                        if let Some(c) = self.context_of(xid, prefix, content) {
                            ctx = Some(c);
                        }
                    }
                }
                msg => {
                    if let Some(lc) = self.lookup_change(&msg) {
                        lookup_changes.push(lc);
                    }
                    if let Some(p) = self.change(msg, frame.lsn, open.is_some(), tables, types)? {
                        match self.route(p).map(|p| self.apply_filter(p.with_context(&ctx), true)) {
                            Some(Ok(p)) => pending.push(p),
                            Some(Err(p)) => dropped.push(p),
                            None => {}
                        }
                    }
                }
            }
        }
        if let Some((_, begin_idx)) = open {
            out.held_back_frames = frames.len() - begin_idx;
        }
        Ok(out)
    }

    /// Encodes a whole transaction's changes into its events (and counts the dropped ones).
    fn finish(
        &mut self,
        pending: &mut Vec<Pending<'_>>,
        dropped: &mut Vec<Pending<'_>>,
        mut txn: TxnInfo,
        end_lsn: Lsn,
        types: &TypeRegistry,
    ) -> Result<Transaction, PipelineError> {
        let count: usize = pending.iter().map(Pending::event_count).sum();
        txn.event_count = count;
        let mut events = Vec::with_capacity(count);
        for p in pending.iter() {
            let errors = Self::computed_errors(p);
            let done = events.len();
            self.encode_pending_at(p, &txn, types, done, true, &mut events)?;
            self.count_published(p, errors);
        }
        debug_assert_eq!(events.len(), count);
        for p in dropped.iter() {
            self.count_dropped(p, &txn, types)?;
        }
        pending.clear();
        dropped.clear();
        let counters = std::mem::take(&mut self.counters);
        let TxnInfo { xid, commit_lsn, commit_time, .. } = txn;
        Ok(Transaction { xid, commit_lsn, end_lsn, commit_time, events, counters })
    }

    /// First pass over a transaction too large to hold in memory: feed its frames in order, the
    /// Begin first, in chunks of any size. Counts its events (and applies Relation messages);
    /// returns `Some(n)` once the Commit was the `n`-th frame of `frames`.
    pub fn count_large(
        &mut self,
        frames: &[RawFrame],
        tables: &SinkTables,
        types: &TypeRegistry,
        txn: &mut LargeTransaction,
    ) -> Result<Option<usize>, PipelineError> {
        self.large_pass(frames, tables, types, txn, None)
    }

    /// Second pass over the same frames (after [`Assembler::count_large`], or alone when no
    /// event needs the transaction's size): appends the encoded events of `frames` to `out`;
    /// returns `Some(n)` once the Commit was the `n`-th frame. Events come out exactly as
    /// [`Assembler::process`] would encode them.
    pub fn encode_large(
        &mut self,
        frames: &[RawFrame],
        tables: &SinkTables,
        types: &TypeRegistry,
        txn: &mut LargeTransaction,
        out: &mut Vec<Event>,
    ) -> Result<Option<usize>, PipelineError> {
        self.large_pass(frames, tables, types, txn, Some(out))
    }

    fn large_pass(
        &mut self,
        frames: &[RawFrame],
        tables: &SinkTables,
        types: &TypeRegistry,
        txn: &mut LargeTransaction,
        mut encode: Option<&mut Vec<Event>>,
    ) -> Result<Option<usize>, PipelineError> {
        for (idx, frame) in frames.iter().enumerate() {
            let msg = decode(&frame.data).map_err(|error| PipelineError::Decode { lsn: frame.lsn, error })?;
            let proto = |reason: String| PipelineError::Protocol { lsn: frame.lsn, reason };
            match msg {
                Message::Begin { xid, final_lsn, commit_time } => {
                    if txn.begun {
                        return Err(proto("Begin inside an open transaction".into()));
                    }
                    let event_count = if encode.is_some() { txn.counted } else { 0 };
                    txn.info = TxnInfo { xid, commit_lsn: final_lsn, commit_time, event_count };
                    txn.begun = true;
                    txn.seen = 0;
                    txn.ctx = None;
                }
                Message::Commit { commit_lsn, end_lsn, commit_time, .. } => {
                    if !txn.begun {
                        return Err(proto("Commit without Begin".into()));
                    }
                    txn.info.commit_lsn = commit_lsn;
                    txn.info.commit_time = commit_time;
                    txn.end_lsn = Some(end_lsn);
                    txn.begun = false;
                    // Its lookup changes were applied as they came (see below); from now on
                    // they are part of the copy, so the encode pass does not apply them again.
                    self.lookups.advance(commit_lsn, end_lsn);
                    if encode.is_none() {
                        txn.counted = txn.seen;
                    }
                    return Ok(Some(idx + 1));
                }
                Message::LogicalMessage { transactional: true, prefix, content, lsn } if txn.begun => {
                    self.check_capture_message(prefix, content, lsn, txn.info.xid)?;
                    self.check_version_message(prefix, content, lsn, txn.info.xid, tables)?;
                    self.check_routing_message(prefix, content, lsn, tables)?;
                    if let Some(c) = self.context_of(txn.info.xid, prefix, content) {
                        txn.ctx = Some(c);
                    }
                }
                Message::LogicalMessage { .. } => {}
                msg => {
                    // A sink with lookups always counts first (see `needs_count_pass`), so by
                    // the time the encode pass runs, the whole transaction's lookup changes are in.
                    if let Some(lc) = self.lookup_change(&msg) {
                        let at = txn.info.commit_lsn;
                        self.lookups.apply(at, &[lc]).map_err(|r| proto(format!("enrich: {r}")))?;
                    }
                    if let Some(p) = self.change(msg, frame.lsn, txn.begun, tables, types)?.and_then(|p| self.route(p))
                    {
                        // Counted once, in the pass that encodes.
                        let filtered = self.apply_filter(p.with_context(&txn.ctx), encode.is_some());
                        match (filtered, encode.as_mut()) {
                            (Ok(p), Some(out)) => {
                                let (before, errors) = (out.len(), Self::computed_errors(&p));
                                self.encode_pending_at(&p, &txn.info, types, txn.seen, true, out)?;
                                txn.seen += out.len() - before;
                                self.count_published(&p, errors);
                            }
                            (Ok(p), None) => {
                                txn.seen += p.event_count();
                                txn.count_tables(&p);
                            }
                            (Err(p), Some(_)) => self.count_dropped(&p, &txn.info, types)?,
                            (Err(_), None) => {}
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    /// The change a Relation, Type, Origin, Insert, Update, Delete or Truncate message makes for
    /// this sink, if any.
    fn change<'a>(
        &mut self,
        msg: Message<'a>,
        lsn: Lsn,
        in_transaction: bool,
        tables: &SinkTables,
        types: &TypeRegistry,
    ) -> Result<Option<Pending<'a>>, PipelineError> {
        let outside = |what: &str| PipelineError::Protocol { lsn, reason: format!("{what} outside a transaction") };
        Ok(match msg {
            Message::Relation(rel) => {
                self.lookups.relation(&rel);
                if let Some(cfg) = tables.get(&rel.oid) {
                    let table = format!("{}.{}", rel.namespace, rel.name);
                    let aliases = match &cfg.history {
                        Some(h) => {
                            let names: Vec<&str> = rel.columns.iter().map(|c| c.name.as_str()).collect();
                            h.aliases(lsn, &names).map_err(|b| PipelineError::SchemaBehind {
                                table: table.clone(),
                                lsn,
                                column: b.column,
                            })?
                        }
                        None => Vec::new(),
                    };
                    let mut plan = RelationPlan::with_aliases(rel, cfg.clone(), types, self.transformations, aliases)
                        .map_err(|e| PipelineError::Config {
                        table: table.clone(),
                        reason: format!("from LSN {lsn} on, its capture config no longer fits it: {e}"),
                    })?;
                    let version = cfg.history.as_ref().and_then(|h| h.version_at(lsn));
                    plan.schema_version = version.map(|v| (v.number, v.forced));
                    plan.schema_version_lsn = version.map(|v| v.lsn);
                    plan.topic_version = cfg.history.as_ref().and_then(|h| h.topic_version_at(lsn));
                    plan.not_null = (0..plan.relation.columns.len())
                        .map(|i| {
                            let name = &plan.relation.columns[i].name;
                            match version.and_then(|v| v.fields.iter().find(|f| &f.name == name)) {
                                Some(f) => f.not_null,
                                None => plan.key.contains(&i),
                            }
                        })
                        .collect();
                    if let Some(column) = &self.partition_key {
                        plan.override_partition_key(column);
                    }
                    if let Some(routing) = cfg.routing.as_ref().filter(|_| !self.sink.is_empty()) {
                        let column = plan.column_index(&routing.column).ok_or_else(|| PipelineError::Config {
                            table: table.clone(),
                            reason: format!(
                                "from LSN {lsn} on, its routing column \"{}\" does not exist",
                                routing.column
                            ),
                        })?;
                        let since = cfg.routing_lsn.unwrap_or_default();
                        plan.route = Some(crate::routing::RoutePlan::new(routing, &self.sink, column, since));
                    }
                    if self.transformations && !cfg.enrich.is_empty() {
                        plan.bind_lookups(&self.lookups)
                            .map_err(|e| PipelineError::Config { table: table.clone(), reason: e.message })?;
                    }
                    if plan.needs_token_key() && self.encoder.token_key.is_none() {
                        return Err(PipelineError::Compliance {
                            table,
                            reason: format!("its config tokenizes columns, but {}", crate::redact::MissingKey),
                        });
                    }
                    self.relations.insert(plan.relation.oid, Arc::new(plan));
                } else {
                    self.relations.remove(&rel.oid);
                }
                None
            }
            Message::Insert { relation, new } => {
                if !in_transaction {
                    return Err(outside("Insert"));
                }
                self.plan_for(relation, tables, |c| c.operations.insert).map(|plan| Pending::Row {
                    plan,
                    op: Op::Insert,
                    lsn,
                    old: None,
                    new: Some(new),
                    ctx: None,
                    mark: FilterMark::None,
                })
            }
            Message::Update { relation, old, new } => {
                if !in_transaction {
                    return Err(outside("Update"));
                }
                self.plan_for(relation, tables, |c| c.operations.update).map(|plan| Pending::Row {
                    plan,
                    op: Op::Update,
                    lsn,
                    old,
                    new: Some(new),
                    ctx: None,
                    mark: FilterMark::None,
                })
            }
            Message::Delete { relation, kind, old } => {
                if !in_transaction {
                    return Err(outside("Delete"));
                }
                self.plan_for(relation, tables, |c| c.operations.delete).map(|plan| Pending::Row {
                    plan,
                    op: Op::Delete,
                    lsn,
                    old: Some((kind, old)),
                    new: None,
                    ctx: None,
                    mark: FilterMark::None,
                })
            }
            Message::Truncate { options, relations } => {
                if !in_transaction {
                    return Err(outside("Truncate"));
                }
                let plans: Vec<_> =
                    relations.iter().filter_map(|&r| self.plan_for(r, tables, |c| c.operations.truncate)).collect();
                (!plans.is_empty()).then_some(Pending::Truncate { plans, options, lsn, ctx: None })
            }
            Message::Type { .. }
            | Message::Origin { .. }
            | Message::Begin { .. }
            | Message::Commit { .. }
            | Message::LogicalMessage { .. } => None,
            Message::SnapshotChunk { .. } => {
                return Err(PipelineError::Protocol { lsn, reason: "a snapshot chunk inside a transaction".into() })
            }
        })
    }

    /// The plan of a relation if this sink captures it and the operation is wanted.
    fn plan_for(
        &self,
        oid: u32,
        tables: &SinkTables,
        wanted: impl Fn(&CaptureConfig) -> bool,
    ) -> Option<Arc<RelationPlan>> {
        let cfg = tables.get(&oid)?;
        if !wanted(cfg) {
            return None;
        }
        // pgoutput always describes a relation before its first change, so a captured table
        // without a plan here is one whose config was added mid-batch: it starts with the next read.
        self.relations.get(&oid).cloned()
    }

    /// Encodes one change (an UPDATE that changes the key also retracts the old key) after the
    /// first `done` events of its transaction and appends its events; `enrich` looks up its
    /// enriched columns (else they are left out).
    fn encode_pending_at(
        &mut self,
        p: &Pending<'_>,
        txn: &TxnInfo,
        types: &TypeRegistry,
        done: usize,
        enrich: bool,
        out: &mut Vec<Event>,
    ) -> Result<(), PipelineError> {
        let mut index = done;
        match p {
            Pending::Row { plan, op, lsn, old, new, ctx, mark } => {
                let ctx = ctx.as_deref();
                let old_ref = old.as_ref().map(|(k, t)| (*k, t));
                let enrich = enrich && !plan.enrich.is_empty();
                if let (Op::Update, Some((kind, o)), Some(n)) = (op, old, new) {
                    if retracts(plan, *kind, o, n, mark) {
                        // The row left its old key: retract it first, so compacted topics and
                        // upserting consumers drop the old key.
                        let enriched = if enrich { self.enrich_rows(plan, Some(o), *lsn)? } else { Vec::new() };
                        let del = RowChange {
                            plan,
                            op: Op::Delete,
                            lsn: *lsn,
                            old: old_ref,
                            new: None,
                            ctx,
                            mark: &FilterMark::None,
                            enriched: &enriched,
                        };
                        index += 1;
                        let mut ev = self.encoder.encode_row(types, &del, txn, index);
                        ev.routes = route_tags(plan, *lsn, Some(o), None);
                        self.emit(plan, types, ev, out)?;
                    }
                }
                // The image that carries the enriched columns: after, or before for a DELETE.
                let image = new.as_ref().or(old.as_ref().map(|(_, t)| t));
                let enriched = if enrich { self.enrich_rows(plan, image, *lsn)? } else { Vec::new() };
                if !enriched.is_empty() {
                    self.counters.entry(plan.relation.oid).or_default().enrichments += 1;
                }
                let ch = RowChange {
                    plan,
                    op: *op,
                    lsn: *lsn,
                    old: old_ref,
                    new: new.as_ref(),
                    ctx,
                    mark,
                    enriched: &enriched,
                };
                index += 1;
                let mut ev = self.encoder.encode_row(types, &ch, txn, index);
                // An UPDATE that retracted its old key counted the route it left with the retraction;
                // one that entered the filter was never published in the route it left.
                let left = match (op, old) {
                    (Op::Update, Some((OldKind::Full, o)))
                        if index == done + 1 && !matches!(mark, FilterMark::Entered(_)) =>
                    {
                        Some(o)
                    }
                    _ => None,
                };
                ev.routes = route_tags(plan, *lsn, image, left);
                self.emit(plan, types, ev, out)?;
            }
            Pending::Truncate { plans, options, lsn, ctx } => {
                for plan in plans {
                    index += 1;
                    let ev = self.encoder.encode_truncate(plan, *options, *lsn, txn, index, ctx.as_deref());
                    self.emit(plan, types, ev, out)?;
                }
            }
        }
        Ok(())
    }
}

impl Assembler {
    /// Appends an encoded event, re-encoded by the sink's format when it has one.
    fn emit(
        &mut self,
        plan: &Arc<RelationPlan>,
        types: &TypeRegistry,
        mut event: Event,
        out: &mut Vec<Event>,
    ) -> Result<(), PipelineError> {
        if let Some(f) = self.format.as_mut() {
            f.encode(plan, types, &mut event).map_err(|error| PipelineError::Format {
                table: format!("{}.{}", plan.relation.namespace, plan.relation.name),
                lsn: event.lsn,
                error,
            })?;
        }
        out.push(event);
        Ok(())
    }
}

/// A transaction decoded in two passes because it is too large to hold in memory (see
/// [`Assembler::count_large`] and [`Assembler::encode_large`]). Reuse one value for both passes.
#[derive(Debug, Clone)]
pub struct LargeTransaction {
    info: TxnInfo,
    begun: bool,
    seen: usize,
    counted: usize,
    end_lsn: Option<Lsn>,
    ctx: Option<Arc<UserContext>>,
    /// Events per table OID, as the counting pass found them.
    per_table: Vec<(u32, u64)>,
    /// Events per route, as the counting pass found them.
    per_route: Vec<RouteCount>,
}

/// Events of one `regional_routing` route: ((table OID, route, routing LSN), events).
pub type RouteCount = ((u32, Arc<str>, Lsn), u64);

impl Default for LargeTransaction {
    fn default() -> Self {
        LargeTransaction {
            info: TxnInfo { xid: 0, commit_lsn: Lsn(0), commit_time: 0, event_count: 0 },
            begun: false,
            seen: 0,
            counted: 0,
            end_lsn: None,
            ctx: None,
            per_table: Vec::new(),
            per_route: Vec::new(),
        }
    }
}

impl LargeTransaction {
    fn count_tables(&mut self, p: &Pending<'_>) {
        let mut add = |oid: u32, n: usize| match self.per_table.iter_mut().find(|(o, _)| *o == oid) {
            Some((_, c)) => *c += n as u64,
            None => self.per_table.push((oid, n as u64)),
        };
        match p {
            Pending::Row { plan, .. } => add(plan.relation.oid, p.event_count()),
            Pending::Truncate { plans, .. } => plans.iter().for_each(|plan| add(plan.relation.oid, 1)),
        }
        if let Pending::Row { plan, op, lsn, old, new, mark, .. } = p {
            let old_t = old.as_ref().map(|(_, t)| t);
            let mut tags = Vec::with_capacity(2);
            let mut left = match (op, old) {
                (Op::Update, Some((OldKind::Full, o))) if !matches!(mark, FilterMark::Entered(_)) => Some(o),
                _ => None,
            };
            if let (Op::Update, Some((kind, o)), Some(n)) = (op, old, new) {
                if retracts(plan, *kind, o, n, mark) {
                    tags.extend(route_tags(plan, *lsn, Some(o), None));
                    left = None;
                }
            }
            tags.extend(route_tags(plan, *lsn, new.as_ref().or(old_t), left));
            for (route, at) in tags {
                let key = (plan.relation.oid, route, at);
                match self.per_route.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, c)) => *c += 1,
                    None => self.per_route.push((key, 1)),
                }
            }
        }
    }

    /// Events per table OID found by the counting pass ([`Assembler::count_large`]).
    pub fn table_counts(&self) -> &[(u32, u64)] {
        &self.per_table
    }

    /// Events per table OID, `regional_routing` route and routing LSN found by the counting pass.
    pub fn route_counts(&self) -> &[RouteCount] {
        &self.per_route
    }

    /// Transaction id (once the Begin was seen).
    pub fn xid(&self) -> u32 {
        self.info.xid
    }

    /// Commit LSN (known from the Begin on).
    pub fn commit_lsn(&self) -> Lsn {
        self.info.commit_lsn
    }

    /// Commit time, PostgreSQL microseconds (known from the Begin on).
    pub fn commit_time(&self) -> i64 {
        self.info.commit_time
    }

    /// Events counted by the first pass.
    pub fn event_count(&self) -> usize {
        self.counted
    }

    /// LSN just past the commit record, once the Commit was seen.
    pub fn end_lsn(&self) -> Option<Lsn> {
        self.end_lsn
    }
}

#[cfg(test)]
mod tests;
