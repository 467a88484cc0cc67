//! The delivery protocol over the in-memory doubles: golden pgoutput frames from PostgreSQL 15 in,
//! units and checkpoints out, with crashes, re-reads and failures played out by hand.
use std::sync::Arc;
use std::time::Duration;

use super::memory::{MemorySink, MemorySource, SinkFault};
use super::port::{Checkpoint, DeliveryMode, ErrorClass, Sink};
use super::protocol::{backoff, check_checkpoint, plan_flush, slot_failure, SlotView};
use super::read::{read, Batch, Failure, Inputs, Unit, FETCH_ROWS};
use crate::config::CaptureConfig;
use crate::pipeline::{Assembler, RawFrame, SinkTables};
use crate::state::SinkState;
use crate::testutil::{config, frames, relation_oids, types};
use crate::Lsn;

fn orders_config() -> CaptureConfig {
    let mut c = config(&["order_id"]);
    c.before_image = true;
    c.include_transaction_info = true;
    c
}

fn basic_tables(fr: &[RawFrame]) -> SinkTables {
    let oids = relation_oids(fr);
    [(oids["orders"], Arc::new(orders_config())), (oids["plain"], Arc::new(config(&["id"])))].into_iter().collect()
}

fn inputs(tables: &SinkTables, checkpoint: Option<Checkpoint>) -> Inputs<'_> {
    Inputs { tables, checkpoint, dedup: true, large_frames: 10_000, checkpoint_interval: None, on_open: None }
}

/// One read of `source` into `sink`, as the worker runs it: open the sink (exactly-once: its last
/// checkpoint), read, plan, flush. Returns the batch and where the slot is confirmed.
fn deliver(
    assembler: &mut Assembler,
    sink: &mut MemorySink,
    source: &mut MemorySource,
    inputs: &Inputs<'_>,
    confirmed: Lsn,
) -> Result<(Batch, Lsn), Failure> {
    let mut types = types("basic");
    let first = {
        use super::port::ChangeSource;
        source.fetch(FETCH_ROWS, &mut types)
    };
    let last = inputs.checkpoint;
    let mut u = Unit { assembler, sink, source, types: &mut types };
    let batch = match read(&mut u, inputs, first) {
        Ok(b) => b,
        Err(f) => {
            u.sink.abort();
            return Err(f);
        }
    };
    let plan = plan_flush(sink.mode, &batch, confirmed, last, inputs.dedup);
    if let Some(cp) = plan.flush {
        sink.flush(cp).map_err(Failure::sink)?;
    }
    Ok((batch, plan.confirm.unwrap_or(confirmed)))
}

/// A first read of the whole capture by a fresh worker (new pipeline state, slot at the start).
fn fresh_read(sink: &mut MemorySink, fr: &[RawFrame], inputs: &Inputs<'_>) -> Result<(Batch, Lsn), Failure> {
    deliver(&mut Assembler::new("golden"), sink, &mut MemorySource::new(fr.to_vec()), inputs, Lsn(0))
}

/// What the pipeline alone makes of the frames: the events a sink must end up with, in order.
fn expected(fr: &[RawFrame], tables: &SinkTables) -> Vec<Vec<u8>> {
    let out = Assembler::new("golden").process(fr, tables, &types("basic")).unwrap();
    out.transactions.iter().flat_map(|t| t.events.iter().map(|e| e.payload.clone())).collect()
}

fn payloads(sink: &MemorySink) -> Vec<Vec<u8>> {
    sink.events().iter().map(|e| e.payload.clone()).collect()
}

#[test]
fn one_read_is_one_unit_with_every_transaction_once() {
    let fr = frames("basic");
    let tables = basic_tables(&fr);
    let mut sink = MemorySink::new(DeliveryMode::ExactlyOnce);
    let mut source = MemorySource::new(fr.clone());
    let (batch, confirmed) =
        deliver(&mut Assembler::new("golden"), &mut sink, &mut source, &inputs(&tables, None), Lsn(0)).unwrap();
    assert_eq!(sink.committed.len(), 1, "one unit");
    assert_eq!(payloads(&sink), expected(&fr, &tables), "byte for byte what the pipeline makes");
    assert_eq!(sink.committed[0].1, Checkpoint { end_lsn: confirmed }, "the checkpoint is where the slot goes");
    assert_eq!(batch.counted.events_delivered, sink.events().len() as u64);
    assert_eq!(batch.progress.values().map(|p| p.events).sum::<u64>(), sink.events().len() as u64);
}

#[test]
fn after_a_crash_between_commit_and_confirm_nothing_is_sent_twice() {
    let fr = frames("basic");
    let tables = basic_tables(&fr);
    let mut sink = MemorySink::new(DeliveryMode::ExactlyOnce);
    let (_, end) = fresh_read(&mut sink, &fr, &inputs(&tables, None)).unwrap();
    // The worker died before it confirmed the slot: a new one opens the sink (its checkpoint) and
    // reads the same changes again. Nothing is sent; the slot moves; no checkpoint is written.
    let checkpoint = sink.open().unwrap();
    assert_eq!(checkpoint, Some(Checkpoint { end_lsn: end }));
    let mut again = MemorySource::new(fr.clone());
    let (batch, confirmed) =
        deliver(&mut Assembler::new("golden"), &mut sink, &mut again, &inputs(&tables, checkpoint), Lsn(0)).unwrap();
    assert_eq!(sink.committed.len(), 1, "no second unit, not even an empty one");
    assert!(sink.open_unit.is_empty() && !batch.sent);
    assert_eq!(confirmed, end);
    let total = expected(&fr, &tables).len() as u64;
    assert_eq!((batch.counted.duplicate_events_detected, batch.counted.duplicate_events_filtered), (total, total));
    // The progress store never recorded them (it is written with the confirm): they count now.
    assert_eq!(batch.progress.values().map(|p| p.events).sum::<u64>(), total);

    // Had it recorded them (the slot went back after a database crash, the offsets did not), they
    // are not counted twice.
    let mut recorded = MemorySource::new(fr.clone());
    recorded.recorded = batch.progress.iter().map(|(oid, p)| (*oid, p.last_commit_lsn)).collect();
    let (batch, _) =
        deliver(&mut Assembler::new("golden"), &mut sink, &mut recorded, &inputs(&tables, checkpoint), Lsn(0)).unwrap();
    assert!(batch.progress.is_empty(), "{:?}", batch.progress);
}

#[test]
fn the_control_without_dedup_sends_the_re_read_again() {
    let fr = frames("basic");
    let tables = basic_tables(&fr);
    let mut sink = MemorySink::new(DeliveryMode::ExactlyOnce);
    fresh_read(&mut sink, &fr, &inputs(&tables, None)).unwrap();
    let checkpoint = sink.open().unwrap();
    let no_dedup = Inputs { dedup: false, ..inputs(&tables, checkpoint) };
    fresh_read(&mut sink, &fr, &no_dedup).unwrap();
    assert_eq!(sink.events().len(), 2 * expected(&fr, &tables).len(), "every event twice: the oracle must see it");
}

#[test]
fn a_large_transaction_is_sent_in_pieces_inside_one_unit() {
    let fr = frames("basic");
    let tables = basic_tables(&fr);
    let mut sink = MemorySink::new(DeliveryMode::ExactlyOnce);
    let mut source = MemorySource::new(fr.clone());
    source.chunk = 3;
    // Any transaction of more than 2 frames is too large to hold: counted, then encoded in pieces.
    let small = Inputs { large_frames: 2, ..inputs(&tables, None) };
    let (batch, _) = deliver(&mut Assembler::new("golden"), &mut sink, &mut source, &small, Lsn(0)).unwrap();
    assert_eq!(sink.committed.len(), 1, "one unit");
    assert!(sink.sends.len() > 3, "sent in pieces: {:?}", sink.sends);
    assert_eq!(payloads(&sink), expected(&fr, &tables), "the same bytes as the buffered path, event_count included");
    assert!(batch.counted.large_transactions >= 2);
    assert!(source.fetched > fr.len() as u64, "two passes over the large transactions");
}

#[test]
fn the_checkpoint_interval_ends_a_unit_at_a_whole_transaction_and_the_next_read_goes_on() {
    let fr = frames("basic");
    let tables = basic_tables(&fr);
    let mut sink = MemorySink::new(DeliveryMode::ExactlyOnce);
    let mut confirmed = Lsn(0);
    let mut stopped_early = Vec::new();
    let mut assembler = Assembler::new("golden");
    loop {
        let mut source = MemorySource::after(&fr, confirmed);
        source.chunk = 5;
        if source.frames.is_empty() {
            break;
        }
        let due = Inputs {
            large_frames: 4,
            checkpoint_interval: Some(Duration::ZERO),
            ..inputs(&tables, sink.committed.last().map(|(_, cp)| *cp))
        };
        let (_, next) = deliver(&mut assembler, &mut sink, &mut source, &due, confirmed).unwrap();
        assert!(next > confirmed, "each read moves on");
        stopped_early.push(source.fetched < source.frames.len() as u64);
        confirmed = next;
    }
    assert_eq!(stopped_early.first(), Some(&true), "the first unit was due before the read's end");
    assert!(sink.committed.len() >= 2, "{} units", sink.committed.len());
    assert_eq!(payloads(&sink), expected(&fr, &tables), "every event once, in order, across the units");
}

#[test]
fn a_failed_send_abandons_the_unit_and_the_next_read_delivers_it_whole() {
    let fr = frames("basic");
    let tables = basic_tables(&fr);
    let mut sink = MemorySink::new(DeliveryMode::ExactlyOnce);
    sink.fault = Some(SinkFault::Send(1, ErrorClass::Retry));
    let mut source = MemorySource::new(fr.clone());
    source.chunk = 4;
    let small = Inputs { large_frames: 4, ..inputs(&tables, None) };
    let f = deliver(&mut Assembler::new("golden"), &mut sink, &mut source, &small, Lsn(0)).unwrap_err();
    assert_eq!(f.state, SinkState::Retrying);
    assert!(sink.committed.is_empty() && sink.open_unit.is_empty() && sink.aborted == 1);
    // The worker resets the sink's pipeline state and reads again from the confirmed position.
    sink.fault = None;
    let checkpoint = sink.open().unwrap();
    fresh_read(&mut sink, &fr, &inputs(&tables, checkpoint)).unwrap();
    assert_eq!(payloads(&sink), expected(&fr, &tables));
}

#[test]
fn sink_errors_map_to_states_and_a_failed_flush_commits_nothing() {
    let fr = frames("basic");
    let tables = basic_tables(&fr);
    let mut sink = MemorySink::new(DeliveryMode::ExactlyOnce);
    sink.fault = Some(SinkFault::Send(1, ErrorClass::Operator));
    let f = fresh_read(&mut sink, &fr, &inputs(&tables, None)).unwrap_err();
    assert_eq!(f.state, SinkState::Error, "authorization, record too large, ...: an operator must look");
    let mut sink = MemorySink::new(DeliveryMode::ExactlyOnce);
    sink.fault = Some(SinkFault::Flush(ErrorClass::Retry));
    let f = fresh_read(&mut sink, &fr, &inputs(&tables, None)).unwrap_err();
    assert_eq!(f.state, SinkState::Retrying);
    assert!(sink.committed.is_empty(), "nothing counts as delivered before the flush returns Ok");
}

#[test]
fn events_that_cannot_be_redacted_are_held_back_for_a_compliance_reason() {
    use crate::redact::Method;
    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let mut c = orders_config();
    c.redactions = vec![("status".into(), Method::Tokenize)];
    let tables: SinkTables = [(oids["orders"], Arc::new(c))].into_iter().collect();
    let mut sink = MemorySink::new(DeliveryMode::ExactlyOnce);
    let f = fresh_read(&mut sink, &fr, &inputs(&tables, None)).unwrap_err();
    assert!(f.compliance && f.state == SinkState::Error, "{f:?}");
    assert!(f.message.contains("public.orders"), "{}", f.message);
    assert!(sink.sends.is_empty(), "nothing sent in the clear");
}

#[test]
fn what_a_read_may_flush_and_confirm() {
    let read = |rows: u64, target: Option<u64>, sent: bool| Batch {
        rows,
        target: target.map(Lsn),
        sent,
        ..Default::default()
    };
    let eo = DeliveryMode::ExactlyOnce;
    let alo = DeliveryMode::AtLeastOnce;
    // Events read and sent: flush with the read's end, then confirm there.
    let p = plan_flush(eo, &read(10, Some(500), true), Lsn(100), None, true);
    assert_eq!((p.flush, p.confirm), (Some(Checkpoint { end_lsn: Lsn(500) }), Some(Lsn(500))));
    // Nothing for this sink (other tables, a heartbeat): exactly-once still writes the checkpoint
    // before the slot moves, so the slot never passes what the sink holds.
    let p = plan_flush(eo, &read(3, Some(500), false), Lsn(100), None, true);
    assert_eq!((p.flush, p.confirm), (Some(Checkpoint { end_lsn: Lsn(500) }), Some(Lsn(500))));
    // At-least-once flushes only what it sent, and confirms either way.
    let p = plan_flush(alo, &read(3, Some(500), false), Lsn(100), None, true);
    assert_eq!((p.flush, p.confirm), (None, Some(Lsn(500))));
    // A re-read at or below the last checkpoint: only the slot moves; the checkpoint never goes back.
    let p = plan_flush(eo, &read(3, Some(400), false), Lsn(100), Some(Checkpoint { end_lsn: Lsn(500) }), true);
    assert_eq!((p.flush, p.confirm), (None, Some(Lsn(400))));
    // Nothing read, or nothing past the slot: nothing at all.
    assert_eq!(plan_flush(eo, &read(0, None, false), Lsn(100), None, true).confirm, None);
    assert_eq!(plan_flush(eo, &read(2, Some(100), false), Lsn(100), None, true).flush, None);
}

#[test]
fn a_sink_reads_only_from_a_healthy_slot_never_past_its_checkpoint() {
    let ok = SlotView { name: "_cdc_x".into(), exists: true, confirmed: Lsn(100), ..Default::default() };
    assert_eq!(slot_failure(None, &ok), None);
    let state = |f: Option<Failure>| f.map(|f| f.state);
    assert_eq!(state(slot_failure(Some("_cdc_publication"), &ok)), Some(SinkState::Error));
    assert_eq!(state(slot_failure(None, &SlotView { exists: false, ..ok.clone() })), Some(SinkState::Error));
    // A missing slot names itself, a failover as a cause, and the steps.
    let missing = slot_failure(None, &SlotView { exists: false, ..ok.clone() }).unwrap().message;
    assert!(
        missing.contains(&ok.name) && missing.contains("promoted") && missing.contains("cdc_add_sink"),
        "{missing}"
    );
    let lost = SlotView { wal_status: Some("lost".into()), ..ok.clone() };
    assert!(slot_failure(None, &lost).unwrap().message.contains("max_slot_wal_keep_size"));
    // PostgreSQL 18's idle timeout is named as the cause, with the setting to change (regression:
    // every invalidation was put down to max_slot_wal_keep_size).
    let idle = SlotView { invalidation_reason: Some("idle_timeout".into()), ..lost.clone() };
    let idle = slot_failure(None, &idle).unwrap();
    assert!(idle.state == SinkState::Error && idle.message.contains("idle_replication_slot_timeout"), "{idle:?}");
    assert!(!idle.message.contains("max_slot_wal_keep_size"), "{}", idle.message);
    let rows = SlotView { invalidation_reason: Some("rows_removed".into()), ..ok.clone() };
    assert!(slot_failure(None, &rows).unwrap().message.contains("hot_standby_feedback"));
    assert_eq!(state(slot_failure(None, &SlotView { active_pid: Some(7), ..ok.clone() })), Some(SinkState::Retrying));
    assert!(check_checkpoint(&ok, Some(Checkpoint { end_lsn: Lsn(100) }), false).is_ok());
    let moved = check_checkpoint(&ok, Some(Checkpoint { end_lsn: Lsn(50) }), false).unwrap_err();
    assert!(moved.state == SinkState::Error && moved.message.contains("past the last checkpoint"), "{moved:?}");
    // An in-database sink writes no checkpoint for heartbeats: its slot may pass it.
    assert!(check_checkpoint(&ok, Some(Checkpoint { end_lsn: Lsn(50) }), true).is_ok());
}

#[test]
fn backoff_doubles_from_one_second_up_to_its_cap() {
    let cap = Duration::from_secs(30);
    let waits: Vec<u64> = (1..=7).map(|n| backoff(n, cap).as_millis() as u64).collect();
    assert_eq!(waits, [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
    assert_eq!(backoff(100, Duration::from_millis(300)), Duration::from_millis(300));
}
