//! One read of one sink's slot, delivered into one unit of the sink: frames in pieces from the
//! [`ChangeSource`], whole transactions assembled and sent, a transaction too large to hold read in
//! pieces (two passes when its size or its lookup changes are needed first).
//!
//! ```text
//!  fetch FETCH_ROWS rows ──▶ buffer ──(whole transactions)──▶ Assembler::process ──▶ dedup ──▶ sink.send
//!          │
//!          ├─ the buffer holds BUFFER_FRAMES whole transactions: send them, empty it
//!          ├─ the open transaction passes BUFFER_FRAMES frames or LARGE_TRANSACTION_BYTES:
//!          │    seek back to its Begin ─▶ count_large (its size, for event_count) ─▶ seek back
//!          │    ─▶ encode_large in pieces ─▶ sink.send per piece (same delivery unit)
//!          └─ the unit has been open checkpoint_interval: stop at the next chunk; a trailing
//!               incomplete transaction is held back
//! ```
//! A read returns up to `cdc.batch_changes` changes (one delivery unit), but memory is bounded by
//! the buffer (`min(cdc.batch_changes, BUFFER_FRAMES)` frames, twice at most), one piece of a large
//! transaction and the sink's own queue. Nothing here commits: the caller flushes the sink with
//! the checkpoint [`super::protocol::plan_flush`] gives, then confirms the slot.
use std::collections::HashMap;
use std::sync::Arc;

use super::port::{ChangeSource, Checkpoint, ErrorClass, Sink, SinkError};
use crate::decode::{decode, Message};
use crate::envelope::Event;
use crate::frame::RawFrame;
use crate::pipeline::{Assembler, LargeTransaction, PipelineError, RouteCount, SinkTables};
use crate::state::SinkState;
use crate::stats::{DeliveryCounters, TableCounters};
use crate::time::pg_to_unix_micros;
use crate::types::TypeRegistry;
use crate::Lsn;

/// Rows fetched from the source at a time.
pub const FETCH_ROWS: usize = 1000;

/// Frames held decoded in memory at most (fewer when `cdc.batch_changes` is smaller): whole
/// transactions are sent once the buffer holds this many, and a transaction with more frames is
/// read in two passes.
pub const BUFFER_FRAMES: usize = 10_000;

/// A transaction whose frames pass this many bytes is read in two passes, whatever its change count.
pub const LARGE_TRANSACTION_BYTES: usize = 32 << 20;

/// Why a read (or a flush) stopped, and the state the sink goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// State to report: `error` or `retrying`.
    pub state: SinkState,
    /// What happened.
    pub message: String,
    /// Events are held back because they cannot be redacted as configured (`compliance_metrics`).
    pub compliance: bool,
    /// The read met a change its copy of the catalog does not show yet (a DDL, a capture or
    /// routing change committed after the copy was read): nothing is wrong with the destination;
    /// the worker reads the catalog and the changes again (see `Driver::fail`).
    pub reread: bool,
}

impl Failure {
    /// A failure of `state`.
    pub fn new(state: SinkState, message: impl Into<String>) -> Failure {
        Failure { state, message: message.into(), compliance: false, reread: false }
    }

    fn decode(e: impl std::fmt::Display) -> Failure {
        Failure::new(SinkState::Error, format!("cannot decode the change stream: {e}"))
    }

    fn pipeline(e: PipelineError) -> Failure {
        match e {
            PipelineError::Config { .. } => Failure::new(SinkState::Error, e.to_string()),
            PipelineError::SchemaBehind { .. }
            | PipelineError::HistoryBehind { .. }
            | PipelineError::RoutingBehind { .. }
            | PipelineError::CaptureBehind { .. } => {
                Failure { reread: true, ..Failure::new(SinkState::Retrying, e.to_string()) }
            }
            PipelineError::Format { ref error, .. } => {
                Failure::new(if error.retry { SinkState::Retrying } else { SinkState::Error }, e.to_string())
            }
            PipelineError::Compliance { .. } => {
                Failure { compliance: true, ..Failure::new(SinkState::Error, e.to_string()) }
            }
            e => Failure::decode(e),
        }
    }

    /// The failure of a sink error: transient ones are retried, the others need an operator.
    pub fn sink(e: SinkError) -> Failure {
        Failure::new(if e.class == ErrorClass::Retry { SinkState::Retrying } else { SinkState::Error }, e.message)
    }
}

/// Per-table delivery progress of one read (for `_cdc_offsets`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableProgress {
    /// Events delivered.
    pub events: u64,
    /// Commit LSN of the last delivered transaction touching the table.
    pub last_commit_lsn: u64,
    /// Its commit time, Unix microseconds.
    pub last_commit_unix_micros: i64,
}

/// Events per `regional_routing` route (table OID, route, routing LSN): count, and the commit
/// time of the last transaction with one (Unix microseconds).
pub type RouteProgress = HashMap<(u32, Arc<str>, Lsn), (u64, i64)>;

/// What one read did.
#[derive(Debug, Default)]
pub struct Batch {
    /// Rows read (a large transaction's rows count once per pass).
    pub rows: u64,
    /// The slot may be confirmed here once the sink flushed: the end of the last complete
    /// transaction or heartbeat read.
    pub target: Option<Lsn>,
    /// Something was sent (the sink has a delivery to flush).
    pub sent: bool,
    /// Per-table progress of what was sent.
    pub progress: HashMap<u32, TableProgress>,
    /// Per `regional_routing` route of a table (table OID, route, routing LSN): events sent, and
    /// the commit time (Unix microseconds) of the last transaction with one.
    pub routes: RouteProgress,
    /// Counter increments (events, bytes, duplicates, large transactions).
    pub counted: DeliveryCounters,
    /// Filter and transformation counts of what was sent, by table OID.
    pub tables: HashMap<u32, TableCounters>,
    /// What was handed to the producer and when, for the latency histograms once it is
    /// acknowledged.
    pub sent_log: Vec<Sent>,
    /// When the first event was handed over: the sink's delivery unit (a Kafka transaction) opened.
    pub opened_at: Option<std::time::Instant>,
    /// `_cdc_offsets.last_lsn` per table, read when the first duplicate is skipped.
    pub recorded: Option<HashMap<u32, u64>>,
}

/// Events of one transaction (or piece of one) handed to the producer.
#[derive(Debug, Default)]
pub struct Sent {
    /// The transaction's commit time, Unix microseconds.
    pub commit_unix_micros: i64,
    /// When its events were built and handed over, Unix microseconds.
    pub sent_unix_micros: i64,
    /// Its events per table OID.
    pub tables: Vec<(u32, u64)>,
}

/// Now, Unix microseconds.
pub fn unix_micros_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

/// The read's fixed inputs.
pub struct Inputs<'a> {
    /// Tables the sink captures.
    pub tables: &'a SinkTables,
    /// Transactions at or below this are already delivered (exactly-once); skip them.
    pub checkpoint: Option<Checkpoint>,
    /// Skip them (false only under the test switch `cdc.test_skip_dedup`).
    pub dedup: bool,
    /// Whole transactions are sent once the buffer holds this many frames; a transaction with more
    /// frames than this is read in two passes.
    pub large_frames: usize,
    /// The longest a delivery unit may stay open (`checkpoint_interval_ms`): once it has been open
    /// this long, no further transaction is read into it.
    pub checkpoint_interval: Option<std::time::Duration>,
    /// Called when the first event of the unit is handed to the sink (the unit is open).
    pub on_open: Option<&'a dyn Fn()>,
}

/// What one read works with: the sink's pipeline state, the sink, the source and the type
/// registry the source fills.
pub struct Unit<'a> {
    /// The sink's decoding state (relation plans, lookup copies).
    pub assembler: &'a mut Assembler,
    /// The destination.
    pub sink: &'a mut dyn Sink,
    /// The read of the slot.
    pub source: &'a mut dyn ChangeSource,
    /// Column types, learnt from the Relation messages the source returns.
    pub types: &'a mut TypeRegistry,
}

impl Inputs<'_> {
    /// Whether a transaction that commits at `commit_lsn` is already delivered. The checkpoint
    /// is the end of a delivered transaction or heartbeat, never inside a commit record, so this
    /// is the same as "its end LSN is at or below the checkpoint".
    fn delivered(&self, commit_lsn: Lsn) -> bool {
        self.checkpoint.is_some_and(|cp| commit_lsn < cp.end_lsn)
    }

    /// Whether the delivery unit opened at `opened_at` is due to be committed.
    fn due(&self, opened_at: Option<std::time::Instant>) -> bool {
        matches!((self.checkpoint_interval, opened_at), (Some(i), Some(t)) if t.elapsed() >= i)
    }
}

/// Reads the rest of the source (`first` are rows already fetched) and sends every new event.
pub fn read(u: &mut Unit<'_>, inputs: &Inputs<'_>, first: Vec<RawFrame>) -> Result<Batch, Failure> {
    let mut b = Batch::default();
    let mut buf: Vec<RawFrame> = Vec::new();
    // The open transaction: index of its Begin in `buf`, its row position, its bytes so far.
    let mut open: Option<(usize, u64, usize)> = None;
    let mut chunk = first;
    let mut start = u.source.position() - chunk.len() as u64;
    // Bytes of the whole transactions (and messages) waiting in `buf`.
    let mut whole_bytes = 0usize;
    'rows: while !chunk.is_empty() {
        b.rows += chunk.len() as u64;
        for (i, frame) in chunk.into_iter().enumerate() {
            match frame.data.first() {
                Some(b'B') => open = Some((buf.len(), start + i as u64, 0)),
                Some(b'C') => open = None,
                _ => {}
            }
            if let Some(o) = open.as_mut() {
                o.2 += frame.data.len();
            }
            whole_bytes += frame.data.len();
            buf.push(frame);
            // Only whole transactions in the buffer: send them once it is full, so memory stays
            // bounded whatever the size of the read.
            if open.is_none() && (buf.len() >= inputs.large_frames || whole_bytes > LARGE_TRANSACTION_BYTES) {
                send_whole(u, inputs, &buf, &mut b)?;
                buf.clear();
                whole_bytes = 0;
                u.source.release_before(start + i as u64 + 1);
            }
            if let Some((begin, position, bytes)) = open {
                if buf.len() - begin > inputs.large_frames || bytes > LARGE_TRANSACTION_BYTES {
                    buf.truncate(begin);
                    send_whole(u, inputs, &buf, &mut b)?;
                    buf.clear();
                    whole_bytes = 0;
                    open = None;
                    u.source.release_before(position);
                    u.source.seek(position);
                    send_large(u, inputs, &mut b)?;
                    u.source.release_before(u.source.position());
                    if inputs.due(b.opened_at) {
                        break 'rows;
                    }
                    start = u.source.position();
                    chunk = u.source.fetch(FETCH_ROWS, u.types);
                    continue 'rows;
                }
            }
        }
        if inputs.due(b.opened_at) {
            // The delivery unit has been open long enough: send the whole transactions read so
            // far and stop; a trailing incomplete one is held back and read again next time.
            break;
        }
        start = u.source.position();
        chunk = u.source.fetch(FETCH_ROWS, u.types);
    }
    send_whole(u, inputs, &buf, &mut b)?;
    for c in b.tables.values() {
        b.counted.pii_redactions += c.pii_redactions;
        b.counted.audit_records += c.audit_records;
    }
    Ok(b)
}

fn add_counts(into: &mut HashMap<u32, TableCounters>, from: &HashMap<u32, TableCounters>) {
    for (oid, c) in from {
        into.entry(*oid).or_default().add(c);
    }
}

/// Sends the events of buffered whole transactions (a trailing incomplete one is held back: the
/// slot is not confirmed past it, so the next read returns it again).
fn send_whole(u: &mut Unit<'_>, inputs: &Inputs<'_>, frames: &[RawFrame], b: &mut Batch) -> Result<(), Failure> {
    if frames.is_empty() {
        return Ok(());
    }
    let out = u.assembler.process(frames, inputs.tables, u.types).map_err(Failure::pipeline)?;
    for t in out.transactions {
        if inputs.delivered(t.commit_lsn) {
            b.counted.duplicate_events_detected += t.events.len() as u64;
            if inputs.dedup {
                b.counted.duplicate_events_filtered += t.events.len() as u64;
                record_unrecorded(u, b, &per_table(&t.events), &per_route(&t.events), t.commit_lsn, t.commit_time);
                continue;
            }
        }
        if !t.events.is_empty() {
            b.counted.source_transactions_delivered += 1;
        }
        add_counts(&mut b.tables, &t.counters);
        let mut touched = Vec::new();
        add_tables(&mut touched, &t.events);
        send(u, inputs, t.events, t.commit_lsn, t.commit_time, b)?;
        count_transaction(b, &touched);
    }
    if out.confirm_lsn.is_some() {
        b.target = out.confirm_lsn;
    }
    Ok(())
}

/// Sends one transaction too large to hold, the cursor at its Begin; leaves the cursor just
/// after its Commit.
fn send_large(u: &mut Unit<'_>, inputs: &Inputs<'_>, b: &mut Batch) -> Result<(), Failure> {
    let begin = u.source.position();
    let first = u.source.fetch(1, u.types);
    let commit_lsn = match first.first().map(|f| decode(&f.data)) {
        Some(Ok(Message::Begin { final_lsn, .. })) => final_lsn,
        _ => return Err(Failure::decode(format!("row {begin} of the read is not a Begin message"))),
    };
    u.source.seek(begin);
    let duplicate = inputs.delivered(commit_lsn);
    // Lookup changes are applied in the counting pass, so the encode pass sees the lookup rows as
    // of the commit (see `Assembler::count_large`).
    let needs_count = inputs.tables.values().any(|c| c.include_transaction_info) || u.assembler.has_lookups();
    let mut lt = LargeTransaction::default();
    if needs_count || duplicate {
        loop {
            let at = u.source.position();
            let chunk = fetch_inside(u, begin, b)?;
            if let Some(n) =
                u.assembler.count_large(&chunk, inputs.tables, u.types, &mut lt).map_err(Failure::pipeline)?
            {
                u.source.seek(at + n as u64);
                break;
            }
        }
        if duplicate {
            b.counted.duplicate_events_detected += lt.event_count() as u64;
            if inputs.dedup {
                b.counted.duplicate_events_filtered += lt.event_count() as u64;
                record_unrecorded(u, b, lt.table_counts(), lt.route_counts(), lt.commit_lsn(), lt.commit_time());
                b.target = lt.end_lsn();
                return Ok(());
            }
        }
        u.source.seek(begin);
    }
    b.counted.large_transactions += 1;
    let mut first_piece = true;
    let mut touched: Vec<u32> = Vec::new();
    loop {
        let at = u.source.position();
        let chunk = fetch_inside(u, begin, b)?;
        let mut events = Vec::new();
        let done = u
            .assembler
            .encode_large(&chunk, inputs.tables, u.types, &mut lt, &mut events)
            .map_err(Failure::pipeline)?;
        if first_piece && !events.is_empty() {
            b.counted.source_transactions_delivered += 1;
            first_piece = false;
        }
        add_tables(&mut touched, &events);
        send(u, inputs, events, lt.commit_lsn(), lt.commit_time(), b)?;
        if let Some(n) = done {
            u.source.seek(at + n as u64);
            break;
        }
    }
    add_counts(&mut b.tables, &u.assembler.take_counters());
    count_transaction(b, &touched);
    b.target = lt.end_lsn();
    Ok(())
}

/// A transaction skipped because the sink already holds it may still be missing from
/// `_cdc_offsets`: the worker that delivered it died between the commit and the slot confirm (the
/// one transaction that writes both). Its events are counted now for each table whose recorded
/// position is before it; a transaction re-read because the slot went back after a crash was
/// recorded already (its position is at or past it) and is not counted twice.
fn record_unrecorded(
    u: &mut Unit<'_>,
    b: &mut Batch,
    per_table: &[(u32, u64)],
    per_route: &[RouteCount],
    commit_lsn: Lsn,
    commit_time: i64,
) {
    if per_table.is_empty() {
        return;
    }
    // Taken out while `b` is written, and put back: read once per read, never copied.
    let recorded = b.recorded.take().unwrap_or_else(|| u.source.recorded_offsets());
    let unrecorded = |oid: &u32| recorded.get(oid).is_none_or(|&at| at < commit_lsn.0);
    for &(oid, n) in per_table.iter().filter(|(oid, _)| unrecorded(oid)) {
        let p = b.progress.entry(oid).or_default();
        p.events += n;
        p.last_commit_lsn = p.last_commit_lsn.max(commit_lsn.0);
        p.last_commit_unix_micros = pg_to_unix_micros(commit_time);
    }
    for (key, n) in per_route.iter().filter(|((oid, _, _), _)| unrecorded(oid)) {
        add_route(b, key, *n, pg_to_unix_micros(commit_time));
    }
    b.recorded = Some(recorded);
}

/// Adds `n` events of a route to what a read sent.
fn add_route(b: &mut Batch, key: &(u32, Arc<str>, Lsn), n: u64, commit_unix_micros: i64) {
    let r = b.routes.entry(key.clone()).or_default();
    r.0 += n;
    r.1 = r.1.max(commit_unix_micros);
}

/// The events of each `regional_routing` route among `events`.
fn per_route(events: &[Event]) -> Vec<RouteCount> {
    let mut out: Vec<RouteCount> = Vec::new();
    for ev in events {
        for (route, at) in &ev.routes {
            match out.iter_mut().find(|((oid, r, a), _)| *oid == ev.table_oid && r == route && a == at) {
                Some((_, n)) => *n += 1,
                None => out.push(((ev.table_oid, route.clone(), *at), 1)),
            }
        }
    }
    out
}

/// Adds the tables of `events` to `touched` (once each).
fn add_tables(touched: &mut Vec<u32>, events: &[Event]) {
    for ev in events {
        if !touched.contains(&ev.table_oid) {
            touched.push(ev.table_oid);
        }
    }
}

/// Counts one delivered source transaction for each table it had events of.
fn count_transaction(b: &mut Batch, touched: &[u32]) {
    for oid in touched {
        b.tables.entry(*oid).or_default().transactions += 1;
    }
}

/// Fetches the next rows of a large transaction that started at row `begin`.
fn fetch_inside(u: &mut Unit<'_>, begin: u64, b: &mut Batch) -> Result<Vec<RawFrame>, Failure> {
    let chunk = u.source.fetch(FETCH_ROWS, u.types);
    if chunk.is_empty() {
        return Err(Failure::decode(format!("the transaction starting at row {begin} of the read has no Commit")));
    }
    b.rows += chunk.len() as u64;
    Ok(chunk)
}

/// Sends events of a transaction and counts them.
fn send(
    u: &mut Unit<'_>,
    inputs: &Inputs<'_>,
    events: Vec<Event>,
    commit_lsn: Lsn,
    commit_time: i64,
    b: &mut Batch,
) -> Result<(), Failure> {
    if events.is_empty() {
        return Ok(());
    }
    let tables = per_table(&events);
    let routes = per_route(&events);
    if !b.sent {
        if let Some(f) = inputs.on_open {
            f();
        }
        b.opened_at = Some(std::time::Instant::now());
    }
    b.sent = true;
    let stats = u.sink.send_owned(events).map_err(Failure::sink)?;
    b.counted.events_delivered += stats.events;
    b.counted.bytes_delivered += stats.bytes;
    let sent = Sent { commit_unix_micros: pg_to_unix_micros(commit_time), sent_unix_micros: unix_micros_now(), tables };
    for &(oid, n) in &sent.tables {
        let p = b.progress.entry(oid).or_default();
        p.events += n;
        p.last_commit_lsn = commit_lsn.0;
        p.last_commit_unix_micros = sent.commit_unix_micros;
        b.tables.entry(oid).or_default().events += n;
    }
    for (key, n) in &routes {
        add_route(b, key, *n, sent.commit_unix_micros);
    }
    b.sent_log.push(sent);
    Ok(())
}

/// The events of each table among `events`, in order of first appearance.
fn per_table(events: &[Event]) -> Vec<(u32, u64)> {
    let mut out: Vec<(u32, u64)> = Vec::new();
    for ev in events {
        match out.iter_mut().find(|(oid, _)| *oid == ev.table_oid) {
            Some((_, n)) => *n += 1,
            None => out.push((ev.table_oid, 1)),
        }
    }
    out
}
