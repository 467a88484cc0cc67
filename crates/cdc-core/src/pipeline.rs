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
}

impl std::fmt::Display for PipelineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PipelineError::Decode { lsn, error } => write!(f, "at LSN {lsn}: {error}"),
            PipelineError::Protocol { lsn, reason } => write!(f, "at LSN {lsn}: {reason}"),
        }
    }
}

impl std::error::Error for PipelineError {}

/// The tables one sink captures: OID -> capture config.
pub type SinkTables = HashMap<u32, Arc<CaptureConfig>>;

/// A change waiting for its transaction's commit.
enum Pending<'a> {
    Row { plan: Arc<RelationPlan>, op: Op, lsn: Lsn, old: Option<(OldKind, Tuple<'a>)>, new: Option<Tuple<'a>> },
    Truncate { plans: Vec<Arc<RelationPlan>>, options: u8, lsn: Lsn },
}

impl Pending<'_> {
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
}

impl Assembler {
    /// A new assembler for events of `database`.
    pub fn new(database: &str) -> Self {
        Assembler { encoder: Encoder::new(database), relations: HashMap::new() }
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
                }
                Message::Commit { commit_lsn, end_lsn, commit_time, .. } => {
                    let Some((xid, _)) = open.take() else {
                        return Err(proto("Commit without Begin".into()));
                    };
                    let count: usize = pending.iter().map(Pending::event_count).sum();
                    let txn = TxnInfo { xid, commit_lsn, commit_time, event_count: count };
                    let events = self.encode_transaction(&pending, &txn, types);
                    debug_assert_eq!(events.len(), count);
                    pending.clear();
                    out.transactions.push(Transaction { xid, commit_lsn, end_lsn, commit_time, events });
                    out.confirm_lsn = Some(end_lsn);
                }
                Message::Relation(rel) => {
                    if let Some(cfg) = tables.get(&rel.oid) {
                        self.relations.insert(rel.oid, Arc::new(RelationPlan::new(rel, cfg.clone())));
                    } else {
                        self.relations.remove(&rel.oid);
                    }
                }
                Message::Type { .. } | Message::Origin { .. } => {}
                Message::Insert { relation, new } => {
                    if open.is_none() {
                        return Err(proto("Insert outside a transaction".into()));
                    }
                    if let Some(plan) = self.plan_for(relation, tables, |c| c.operations.insert) {
                        pending.push(Pending::Row { plan, op: Op::Insert, lsn: frame.lsn, old: None, new: Some(new) });
                    }
                }
                Message::Update { relation, old, new } => {
                    if open.is_none() {
                        return Err(proto("Update outside a transaction".into()));
                    }
                    if let Some(plan) = self.plan_for(relation, tables, |c| c.operations.update) {
                        pending.push(Pending::Row { plan, op: Op::Update, lsn: frame.lsn, old, new: Some(new) });
                    }
                }
                Message::Delete { relation, kind, old } => {
                    if open.is_none() {
                        return Err(proto("Delete outside a transaction".into()));
                    }
                    if let Some(plan) = self.plan_for(relation, tables, |c| c.operations.delete) {
                        pending.push(Pending::Row {
                            plan,
                            op: Op::Delete,
                            lsn: frame.lsn,
                            old: Some((kind, old)),
                            new: None,
                        });
                    }
                }
                Message::Truncate { options, relations } => {
                    if open.is_none() {
                        return Err(proto("Truncate outside a transaction".into()));
                    }
                    let plans: Vec<_> =
                        relations.iter().filter_map(|&r| self.plan_for(r, tables, |c| c.operations.truncate)).collect();
                    if !plans.is_empty() {
                        pending.push(Pending::Truncate { plans, options, lsn: frame.lsn });
                    }
                }
                Message::LogicalMessage { transactional, prefix, lsn, .. } => {
                    // A non-transactional heartbeat outside any transaction marks a point the slot may
                    // be confirmed to once everything before it is delivered.
                    if !transactional && open.is_none() && prefix == HEARTBEAT_PREFIX {
                        out.confirm_lsn = Some(lsn.max(frame.lsn));
                    }
                }
            }
        }
        if let Some((_, begin_idx)) = open {
            out.held_back_frames = frames.len() - begin_idx;
        }
        Ok(out)
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

    fn encode_transaction(&self, pending: &[Pending<'_>], txn: &TxnInfo, types: &TypeRegistry) -> Vec<Event> {
        let mut events = Vec::with_capacity(txn.event_count);
        for p in pending {
            match p {
                Pending::Row { plan, op, lsn, old, new } => {
                    let old_ref = old.as_ref().map(|(k, t)| (*k, t));
                    if let (Op::Update, Some((_, o)), Some(n)) = (op, old, new) {
                        if key_changed(plan, o, n) {
                            // The row left its old key: retract it first, so compacted topics and
                            // upserting consumers drop the old key.
                            let del = RowChange { plan, op: Op::Delete, lsn: *lsn, old: old_ref, new: None };
                            events.push(self.encoder.encode_row(types, &del, txn, events.len() + 1));
                        }
                    }
                    let ch = RowChange { plan, op: *op, lsn: *lsn, old: old_ref, new: new.as_ref() };
                    events.push(self.encoder.encode_row(types, &ch, txn, events.len() + 1));
                }
                Pending::Truncate { plans, options, lsn } => {
                    for plan in plans {
                        events.push(self.encoder.encode_truncate(plan, *options, *lsn, txn, events.len() + 1));
                    }
                }
            }
        }
        events
    }
}

#[cfg(test)]
mod tests;
