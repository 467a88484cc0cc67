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
//! and its frames are re-read with the next peek (the slot is never advanced past it).

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::CaptureConfig;
use crate::context::{self, UserContext};
use crate::decode::{decode, DecodeError, Message, OldKind, Tuple};
use crate::envelope::{Encoder, Event, Op, RelationPlan, RowChange, TxnInfo};
use crate::lsn::Lsn;
use crate::types::TypeRegistry;

/// Prefix of the logical messages pg_cdc emits to move idle slots forward.
pub const HEARTBEAT_PREFIX: &str = "pg_cdc.heartbeat";

/// One row of `pg_logical_slot_peek_binary_changes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// The row's `lsn`.
    pub lsn: Lsn,
    /// The row's `data`: one pgoutput message.
    pub data: Vec<u8>,
}

/// A committed transaction, ready to publish.
#[derive(Debug, Clone)]
pub struct Transaction {
    /// Transaction id.
    pub xid: u32,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// LSN just past the commit record: confirm the slot to this once the events are delivered.
    pub end_lsn: Lsn,
    /// Commit time, PostgreSQL microseconds.
    pub commit_time: i64,
    /// Events for this sink, in commit order.
    pub events: Vec<Event>,
}

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
    /// A table's capture config cannot be applied (the tokenization key is missing, ...): the
    /// sink stops rather than publish what the config says to hide.
    Config {
        /// The table, `schema.name`.
        table: String,
        /// What is missing.
        reason: String,
    },
}

impl std::fmt::Display for PipelineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PipelineError::Decode { lsn, error } => write!(f, "at LSN {lsn}: {error}"),
            PipelineError::Protocol { lsn, reason } => write!(f, "at LSN {lsn}: {reason}"),
            PipelineError::Config { table, reason } => write!(f, "table {table}: {reason}"),
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
            Pending::Row { plan, op: Op::Update, old: Some((_, old)), new: Some(new), .. } => {
                1 + usize::from(key_changed(plan, old, new))
            }
            Pending::Row { .. } => 1,
            Pending::Truncate { plans, .. } => plans.len(),
        }
    }
}

fn key_changed(plan: &RelationPlan, old: &Tuple<'_>, new: &Tuple<'_>) -> bool {
    use crate::decode::TupleValue::UnchangedToast;
    plan.key.iter().any(|&i| {
        let n = new.get(i).copied();
        n != Some(UnchangedToast) && old.get(i).copied() != n
    })
}

/// Per-sink decoding state that outlives one batch (relation descriptions).
pub struct Assembler {
    encoder: Encoder,
    relations: HashMap<u32, Arc<RelationPlan>>,
    /// The key that seals user context messages (see [`crate::context`]).
    context_key: Option<Vec<u8>>,
}

impl Assembler {
    /// A new assembler for events of `database`.
    pub fn new(database: &str) -> Self {
        Assembler { encoder: Encoder::new(database), relations: HashMap::new(), context_key: None }
    }

    /// Sets the key user context messages are sealed with (`None`: contexts are dropped).
    pub fn set_context_key(&mut self, key: Option<Vec<u8>>) {
        self.context_key = key;
    }

    /// The user context a transactional message carries, if it is pg_cdc's and genuine.
    fn context_of(&self, xid: u32, prefix: &str, content: &[u8]) -> Option<Arc<UserContext>> {
        if prefix != context::PREFIX {
            return None;
        }
        context::open(self.context_key.as_deref()?, xid, content).map(Arc::new)
    }

    /// Sets the key `tokenize` uses (`None`: tables that tokenize stop the sink with an error).
    pub fn set_token_key(&mut self, key: Option<crate::redact::TokenKey>) {
        self.encoder.token_key = key;
    }

    /// Forgets relation descriptions (after the capture config changed, they are re-planned when
    /// the next Relation message arrives; pgoutput sends one before the first change of each
    /// relation in every peek).
    pub fn reset(&mut self) {
        self.relations.clear();
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
                    ctx = None;
                }
                Message::Commit { commit_lsn, end_lsn, commit_time, .. } => {
                    let Some((xid, _)) = open.take() else {
                        return Err(proto("Commit without Begin".into()));
                    };
                    let count: usize = pending.iter().map(Pending::event_count).sum();
                    let txn = TxnInfo { xid, commit_lsn, commit_time, event_count: count };
                    let mut events = Vec::with_capacity(count);
                    for p in &pending {
                        self.encode_pending(p, &txn, types, &mut events);
                    }
                    debug_assert_eq!(events.len(), count);
                    pending.clear();
                    out.transactions.push(Transaction { xid, commit_lsn, end_lsn, commit_time, events });
                    out.confirm_lsn = Some(end_lsn);
                }
                Message::LogicalMessage { transactional, prefix, lsn, content } => {
                    // A non-transactional heartbeat outside any transaction marks a point the slot may
                    // be confirmed to once everything before it is delivered.
                    if !transactional && open.is_none() && prefix == HEARTBEAT_PREFIX {
                        out.confirm_lsn = Some(lsn.max(frame.lsn));
                    }
                    if let (true, Some((xid, _))) = (transactional, open) {
                        if let Some(c) = self.context_of(xid, prefix, content) {
                            ctx = Some(c);
                        }
                    }
                }
                msg => {
                    if let Some(p) = self.change(msg, frame.lsn, open.is_some(), tables)? {
                        pending.push(p.with_context(&ctx));
                    }
                }
            }
        }
        if let Some((_, begin_idx)) = open {
            out.held_back_frames = frames.len() - begin_idx;
        }
        Ok(out)
    }

    /// First pass over a transaction too large to hold in memory: feed its frames in order, the
    /// Begin first, in chunks of any size. Counts its events (and applies Relation messages);
    /// returns `Some(n)` once the Commit was the `n`-th frame of `frames`.
    pub fn count_large(
        &mut self,
        frames: &[RawFrame],
        tables: &SinkTables,
        txn: &mut LargeTransaction,
    ) -> Result<Option<usize>, PipelineError> {
        self.large_pass(frames, tables, txn, None)
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
        self.large_pass(frames, tables, txn, Some((types, out)))
    }

    fn large_pass(
        &mut self,
        frames: &[RawFrame],
        tables: &SinkTables,
        txn: &mut LargeTransaction,
        mut encode: Option<(&TypeRegistry, &mut Vec<Event>)>,
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
                    if encode.is_none() {
                        txn.counted = txn.seen;
                    }
                    return Ok(Some(idx + 1));
                }
                Message::LogicalMessage { transactional: true, prefix, content, .. } if txn.begun => {
                    if let Some(c) = self.context_of(txn.info.xid, prefix, content) {
                        txn.ctx = Some(c);
                    }
                }
                Message::LogicalMessage { .. } => {}
                msg => {
                    if let Some(p) = self.change(msg, frame.lsn, txn.begun, tables)? {
                        let p = p.with_context(&txn.ctx);
                        match encode.as_mut() {
                            Some((types, out)) => {
                                let before = out.len();
                                self.encode_pending_at(&p, &txn.info, types, txn.seen, out);
                                txn.seen += out.len() - before;
                            }
                            None => txn.seen += p.event_count(),
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
    ) -> Result<Option<Pending<'a>>, PipelineError> {
        let outside = |what: &str| PipelineError::Protocol { lsn, reason: format!("{what} outside a transaction") };
        Ok(match msg {
            Message::Relation(rel) => {
                if let Some(cfg) = tables.get(&rel.oid) {
                    let plan = RelationPlan::new(rel, cfg.clone());
                    if plan.needs_token_key() && self.encoder.token_key.is_none() {
                        return Err(PipelineError::Config {
                            table: format!("{}.{}", plan.relation.namespace, plan.relation.name),
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
        // without a plan here is one whose config was added mid-batch: it starts with the next peek.
        self.relations.get(&oid).cloned()
    }

    /// Encodes one change (an UPDATE that changes the key also retracts the old key) and appends
    /// its events; positions continue from `out`'s length.
    fn encode_pending(&self, p: &Pending<'_>, txn: &TxnInfo, types: &TypeRegistry, out: &mut Vec<Event>) {
        self.encode_pending_at(p, txn, types, out.len(), out);
    }

    /// Like [`Self::encode_pending`], for a change after the first `done` events of its transaction.
    fn encode_pending_at(
        &self,
        p: &Pending<'_>,
        txn: &TxnInfo,
        types: &TypeRegistry,
        done: usize,
        out: &mut Vec<Event>,
    ) {
        let mut index = done;
        let mut push = |ev: Event| out.push(ev);
        match p {
            Pending::Row { plan, op, lsn, old, new, ctx } => {
                let ctx = ctx.as_deref();
                let old_ref = old.as_ref().map(|(k, t)| (*k, t));
                if let (Op::Update, Some((_, o)), Some(n)) = (op, old, new) {
                    if key_changed(plan, o, n) {
                        // The row left its old key: retract it first, so compacted topics and
                        // upserting consumers drop the old key.
                        let del = RowChange { plan, op: Op::Delete, lsn: *lsn, old: old_ref, new: None, ctx };
                        index += 1;
                        push(self.encoder.encode_row(types, &del, txn, index));
                    }
                }
                let ch = RowChange { plan, op: *op, lsn: *lsn, old: old_ref, new: new.as_ref(), ctx };
                index += 1;
                push(self.encoder.encode_row(types, &ch, txn, index));
            }
            Pending::Truncate { plans, options, lsn, ctx } => {
                for plan in plans {
                    index += 1;
                    push(self.encoder.encode_truncate(plan, *options, *lsn, txn, index, ctx.as_deref()));
                }
            }
        }
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
}

impl Default for LargeTransaction {
    fn default() -> Self {
        LargeTransaction {
            info: TxnInfo { xid: 0, commit_lsn: Lsn(0), commit_time: 0, event_count: 0 },
            begun: false,
            seen: 0,
            counted: 0,
            end_lsn: None,
            ctx: None,
        }
    }
}

impl LargeTransaction {
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
