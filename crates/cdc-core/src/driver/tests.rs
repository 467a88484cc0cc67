//! The driver over in-memory doubles: a host that keeps what it is asked ([`MemoryPort`]) and a
//! destination the test holds a handle on ([`SharedSink`]), on a delivery thread or in place.
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::memory::{MemoryPort, SharedSink};
use super::snapshot::{Next, OpenSnapshots, Previous};
use super::{latch_wait, Driver, Producer, Settings, CONFIRM_INTERVAL, MAX_REREADS, RESTART_POINT_BYTES};
use crate::config::CaptureConfig;
use crate::deliver::handoff::DeliveryThread;
use crate::deliver::memory::{MemorySource, SinkFault};
use crate::deliver::port::{DeliveryMode, ErrorClass, Sink, SinkError};
use crate::deliver::protocol::plan_flush;
use crate::deliver::read::{Batch, Failure, Sent, TableProgress};
use crate::envelope::Op;
use crate::pipeline::{Assembler, RawFrame, SinkTables};
use crate::snapshot::Chunk;
use crate::state::SinkState;
use crate::testutil::wal::{begin, commit, delete, insert, relation, relation_frame, version_message, watermark};
use crate::testutil::{config, frames, relation_oids, types};
use crate::Lsn;

fn settings() -> Settings {
    Settings { max_backoff: Duration::from_secs(8), heartbeat_interval: Duration::from_secs(10) }
}

fn driver() -> Driver {
    Driver::new(Assembler::new("golden"), (Some(SinkState::Starting), None))
}

/// A driver whose destination runs on a delivery thread.
fn threaded(sink: &SharedSink) -> Driver {
    let mut d = driver();
    d.producer = Some(Producer::Threaded(DeliveryThread::start(Box::new(sink.clone())).expect("thread")));
    d
}

/// What a read that reached `target` with `events` events of table 1 returns.
fn batch(target: u64, events: u64) -> Batch {
    let mut b = Batch { rows: events.max(1), target: Some(Lsn(target)), sent: events > 0, ..Batch::default() };
    b.progress.insert(1, TableProgress { events, last_commit_lsn: target, last_commit_unix_micros: 7 });
    b.counted.events_delivered = events;
    b.sent_log = vec![Sent { commit_unix_micros: 0, sent_unix_micros: 0, tables: vec![(1, events)] }];
    b
}

/// Hands `b` over as the worker does: the flush and confirm the protocol plans from `confirmed`.
fn hand(d: &mut Driver, port: &mut MemoryPort, b: Batch, confirmed: Lsn, overlap: bool) -> Result<(), Failure> {
    let mode = d.producer.as_mut().map_or(DeliveryMode::AtLeastOnce, |p| p.sink().delivery_mode());
    let plan = plan_flush(mode, &b, d.position(confirmed), d.checkpoint, true);
    d.hand_over(port, b, plan, false, overlap, mode)
}

fn retry_failure() -> Failure {
    Failure::sink(SinkError { class: ErrorClass::Retry, message: "broker away".into() })
}

// --- retry and backoff ---

#[test]
fn a_failure_backs_off_doubling_per_failure_up_to_the_cap() {
    let (mut d, mut port) = (driver(), MemoryPort::new("s"));
    let now = Instant::now();
    let mut waits = Vec::new();
    for _ in 0..6 {
        d.fail(&mut port, retry_failure(), &settings(), now);
        waits.push(d.retry_at.expect("backing off") - now);
        assert!(d.backing_off(now) && !d.backing_off(now + waits[waits.len() - 1]));
    }
    let secs: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
    assert_eq!(secs, [1, 2, 4, 8, 8, 8], "1 s after the first failure, doubled, capped by max_backoff");
}

#[test]
fn a_step_that_succeeds_ends_the_backoff_and_the_next_failure_starts_over() {
    let (mut d, mut port) = (driver(), MemoryPort::new("s"));
    let now = Instant::now();
    for _ in 0..3 {
        d.fail(&mut port, retry_failure(), &settings(), now);
    }
    assert_eq!(d.failures(), 3);
    d.succeeded(&mut port);
    assert_eq!((d.failures(), d.retry_at), (0, None));
    assert!(!d.backing_off(now));
    d.fail(&mut port, retry_failure(), &settings(), now);
    assert_eq!(d.retry_at.map(|t| (t - now).as_secs()), Some(1));
}

#[test]
fn a_destination_that_asked_to_wait_is_not_tried_again_before_then() {
    let sink = SharedSink::new(DeliveryMode::AtLeastOnce);
    let now = Instant::now();
    sink.set_hold_until(Some(now + Duration::from_secs(30)));
    let (mut d, mut port) = (driver(), MemoryPort::new("s"));
    d.producer = Some(Producer::InPlace(Box::new(sink.clone())));
    d.fail(&mut port, retry_failure(), &settings(), now);
    assert_eq!(d.retry_at, Some(now + Duration::from_secs(30)), "Retry-After beats a 1 s backoff");
    // Control: without it, the backoff alone.
    sink.set_hold_until(None);
    let mut d = driver();
    d.producer = Some(Producer::InPlace(Box::new(sink.clone())));
    d.fail(&mut port, retry_failure(), &settings(), now);
    assert_eq!(d.retry_at, Some(now + Duration::from_secs(1)));
}

/// Two transactions on table 7; a DDL in the second recorded version 2 of the table.
fn insert_then_ddl() -> Vec<RawFrame> {
    vec![
        relation_frame(&relation(7), 5),
        begin(900, 100),
        insert(7, 1, 92),
        commit(100),
        begin(901, 200),
        version_message(7, 2, 190),
        insert(7, 2, 192),
        commit(200),
    ]
}

/// Table 7 with a schema history holding `versions` (as a catalog copy read then would).
fn t_with_versions(versions: &[i32]) -> SinkTables {
    let field = |attnum: i16, name: &str, type_oid: u32| crate::schema::Field {
        attnum,
        name: name.into(),
        type_sql: String::new(),
        type_oid,
        typmod: -1,
        not_null: false,
        default: None,
        missing: None,
    };
    let history = crate::schema::History::from_versions(
        versions
            .iter()
            .map(|&number| crate::schema::Version {
                lsn: Lsn(if number == 1 { 1 } else { 189 }),
                number,
                forced: false,
                own_topic: false,
                fields: vec![field(1, "id", 23), field(2, "v", 25)],
            })
            .collect(),
    );
    let mut c = config(&["id"]);
    c.history = Some(Arc::new(history));
    [(7, Arc::new(c))].into_iter().collect()
}

#[test]
fn a_read_that_meets_a_ddl_its_catalog_copy_missed_keeps_its_producer_and_reads_again_at_once() {
    let sink = SharedSink::new(DeliveryMode::ExactlyOnce);
    let (mut d, mut port) = (threaded(&sink), MemoryPort::new("s"));
    let now = Instant::now();
    let behind = t_with_versions(&[1]);
    let read_behind = |d: &mut Driver| {
        let mut source = MemorySource::new(insert_then_ddl());
        // Whole transactions are sent once 4 frames are buffered: the first goes before the DDL.
        let settings = super::ReadSettings { large_frames: 4, ..read_settings() };
        d.read(&mut source, &mut types("basic"), &behind, &settings, Lsn(0), None).unwrap_err()
    };
    let f = read_behind(&mut d);
    assert!(f.reread && f.message.contains("version 2"), "{f:?}");
    assert_eq!(sink.sink().open_unit.len(), 1, "the transaction before the DDL was sent");
    assert!(d.keeps_producer(&f));
    d.fail(&mut port, f, &settings(), now);
    assert!(d.producer.is_some(), "the destination is kept");
    assert_eq!((d.failures(), d.retry_at), (0, None), "no backoff");
    assert_eq!(port.counters.catalog_rereads, 1);
    assert_ne!(port.state(), Some(SinkState::Retrying), "nothing for a DBA to look at");
    let held = sink.sink();
    assert_eq!((held.aborted, held.open_unit.len()), (1, 0), "its unit was aborted");
    drop(held);

    // Read again with the copy the catalog holds now: both transactions commit, once.
    let mut source = MemorySource::new(insert_then_ddl());
    read_and_hand(&mut d, &mut port, &mut source, &t_with_versions(&[1, 2]), Lsn(0), false);
    d.succeeded(&mut port);
    let committed: Vec<usize> = sink.sink().committed.iter().map(|(e, _)| e.len()).collect();
    assert_eq!(committed, [2]);

    // A copy that never catches up: MAX_REREADS reads in a row keep the producer, the next one
    // is a failure that backs off.
    for i in 0..=MAX_REREADS {
        let f = read_behind(&mut d);
        let keeps = d.keeps_producer(&f);
        d.fail(&mut port, f, &settings(), now);
        assert_eq!((keeps, d.producer.is_some()), (i < MAX_REREADS, i < MAX_REREADS), "read {i}");
    }
    assert_eq!(d.failures(), 1);
    assert!(d.backing_off(now));
    assert_eq!(port.state(), Some(SinkState::Retrying));
    assert_eq!(sink.sink().committed.len(), 1, "nothing more committed");
}

// --- settle and confirm ---

#[test]
fn the_slot_is_never_confirmed_past_a_unit_its_destination_has_not_acknowledged() {
    let sink = SharedSink::new(DeliveryMode::AtLeastOnce);
    let (mut d, mut port) = (threaded(&sink), MemoryPort::new("s"));
    sink.hold_flushes();
    hand(&mut d, &mut port, batch(100, 3), Lsn(0), true).unwrap();
    // The unit commits on the delivery thread: the next read goes on from its end, the slot stays.
    assert_eq!(d.position(Lsn(0)), Lsn(100));
    d.settle(&mut port, 1).unwrap();
    assert_eq!(d.handed.len(), 1, "still awaited");
    d.confirm_delivered(&mut port, Lsn(0)).unwrap();
    assert!(port.confirms.is_empty(), "confirmed before the destination acknowledged: {:?}", port.confirms);
    assert_eq!(port.counters.events_delivered, 0);
    // Control: once acknowledged, the same call confirms (the oracle above can see a confirm).
    sink.release_flushes();
    d.settle(&mut port, 0).unwrap();
    d.confirm_delivered(&mut port, Lsn(0)).unwrap();
    assert_eq!(port.confirmed(), Lsn(100));
    assert_eq!(port.counters.events_delivered, 3);
    assert_eq!(port.latencies, 3);
}

#[test]
fn units_in_flight_are_delivered_in_the_order_they_were_handed_and_confirmed_together() {
    let sink = SharedSink::new(DeliveryMode::AtLeastOnce);
    let (mut d, mut port) = (threaded(&sink), MemoryPort::new("s"));
    sink.hold_flushes();
    hand(&mut d, &mut port, batch(100, 2), Lsn(0), true).unwrap();
    hand(&mut d, &mut port, batch(200, 5), Lsn(0), true).unwrap();
    assert_eq!(d.position(Lsn(0)), Lsn(200));
    sink.release_flushes();
    d.settle(&mut port, 0).unwrap();
    assert_eq!(d.delivered, Some(Lsn(200)));
    let checkpoints: Vec<Lsn> = sink.sink().committed.iter().map(|(_, cp)| cp.end_lsn).collect();
    assert_eq!(checkpoints, [Lsn(100), Lsn(200)]);
    d.confirm_delivered(&mut port, Lsn(0)).unwrap();
    let (lsn, progress) = &port.confirms[0];
    assert_eq!(*lsn, Lsn(200));
    assert_eq!(progress[&1], TableProgress { events: 7, last_commit_lsn: 200, last_commit_unix_micros: 7 });
    // What was confirmed is not written again.
    d.confirm_delivered(&mut port, Lsn(200)).unwrap();
    assert_eq!(port.confirms.len(), 1);
}

#[test]
fn a_unit_whose_flush_fails_is_not_confirmed_and_is_read_again_from_the_slot() {
    let sink = SharedSink::new(DeliveryMode::AtLeastOnce);
    sink.sink().fault = Some(SinkFault::Flush(ErrorClass::Retry));
    let (mut d, mut port) = (threaded(&sink), MemoryPort::new("s"));
    hand(&mut d, &mut port, batch(100, 3), Lsn(0), true).unwrap();
    let f = d.settle(&mut port, 0).expect_err("the flush failed");
    assert_eq!(f.state, SinkState::Retrying);
    d.fail(&mut port, f, &settings(), Instant::now());
    d.confirm_delivered(&mut port, Lsn(0)).unwrap();
    assert!(port.confirms.is_empty());
    assert_eq!(d.position(Lsn(0)), Lsn(0), "the next session reads from the confirmed position");
    assert!(d.producer.is_none() && d.handed.is_empty());
    assert_eq!(port.state(), Some(SinkState::Retrying));
    assert!(sink.sink().aborted >= 1, "its open unit was aborted");
    assert_eq!(port.counters.events_delivered, 0, "nothing committed, nothing counted");
}

#[test]
fn units_committed_on_the_thread_when_a_later_read_fails_are_counted_as_delivered() {
    // A read fails while units handed over commit on the delivery thread, unreported: the failure
    // forgets them (they are read again, found at the destination and skipped as duplicates), so
    // their events count as delivered now or never. The failure lands at a different point of
    // the two commits each round; whatever the destination committed by then is counted, and
    // nothing else. Regression: a 5M-row backlog read by a sink that failed a few dozen times
    // showed 103,000 fewer events delivered than its topic held.
    let mut seen = std::collections::HashSet::new();
    for round in 0..40u64 {
        let mode = if round % 2 == 0 { DeliveryMode::ExactlyOnce } else { DeliveryMode::AtLeastOnce };
        let sink = SharedSink::new(mode);
        let (mut d, mut port) = (threaded(&sink), MemoryPort::new("s"));
        sink.hold_flushes();
        hand(&mut d, &mut port, batch(100, 3), Lsn(0), true).unwrap();
        hand(&mut d, &mut port, batch(200, 4), Lsn(0), true).unwrap();
        sink.release_flushes();
        if round >= 20 {
            // The first commit is through: the failure finds one, or both, committed.
            while sink.sink().committed.is_empty() {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        d.fail(&mut port, retry_failure(), &settings(), Instant::now());
        // The oracle is the destination: what it committed.
        let committed = sink.sink().committed.len();
        seen.insert(committed);
        // The units' counts say 3 events, then 4.
        assert_eq!(port.counters.events_delivered, [0, 3, 7][committed], "round {round}: {committed} units committed");
        let transactions = if mode == DeliveryMode::ExactlyOnce { committed as u64 } else { 0 };
        assert_eq!(port.counters.committed_transactions, transactions, "round {round}");
        assert!(d.producer.is_none() && d.handed.is_empty());
    }
    assert!(seen.iter().any(|&c| c > 0), "no round failed after a commit: {seen:?}");
}

#[test]
fn a_failed_confirm_keeps_the_progress_for_the_next_one() {
    let sink = SharedSink::new(DeliveryMode::AtLeastOnce);
    let (mut d, mut port) = (threaded(&sink), MemoryPort::new("s"));
    hand(&mut d, &mut port, batch(100, 3), Lsn(0), false).unwrap();
    d.settle(&mut port, 0).unwrap();
    port.confirms_fail = true;
    assert!(d.confirm_delivered(&mut port, Lsn(0)).is_err());
    port.confirms_fail = false;
    d.confirm_delivered(&mut port, Lsn(0)).unwrap();
    assert_eq!(port.confirms[0].1[&1].events, 3);
}

#[test]
fn the_slot_is_confirmed_at_once_when_idle_and_at_most_every_interval_while_busy() {
    let sink = SharedSink::new(DeliveryMode::AtLeastOnce);
    let (mut d, mut port) = (threaded(&sink), MemoryPort::new("s"));
    let now = Instant::now();
    assert!(d.confirm_due(10, false, now), "the first delivery after a quiet spell");
    hand(&mut d, &mut port, batch(100, 3), Lsn(0), false).unwrap();
    d.settle(&mut port, 0).unwrap();
    d.confirm_delivered(&mut port, Lsn(0)).unwrap();
    let now = Instant::now();
    assert!(!d.confirm_due(10, false, now));
    assert!(d.confirm_due(0, false, now), "a pass that read nothing");
    assert!(d.confirm_due(10, true, now), "stopping");
    assert!(d.confirm_due(10, false, now + CONFIRM_INTERVAL));
}

// --- the lifecycle (cdc_core::state) ---

#[test]
fn a_state_is_written_once_per_change_and_a_failed_write_is_tried_again() {
    let (mut d, mut port) = (driver(), MemoryPort::new("s"));
    d.set_state(&mut port, SinkState::Running, None);
    d.set_state(&mut port, SinkState::Running, None);
    assert_eq!(port.states.len(), 1);
    d.set_state(&mut port, SinkState::Error, Some("a".into()));
    d.set_state(&mut port, SinkState::Error, Some("b".into()));
    assert_eq!(port.states.len(), 3, "a new message is a new state");
    port.state_writes_fail = true;
    d.set_state(&mut port, SinkState::Running, None);
    port.state_writes_fail = false;
    d.set_state(&mut port, SinkState::Running, None);
    assert_eq!(port.states.len(), 4);
    assert_eq!(port.state(), Some(SinkState::Running));
    assert!(port.log.iter().any(|l| l == "pg_cdc sink \"s\": error: b"), "{:?}", port.log);
}

#[test]
fn starting_goes_to_running_with_nothing_to_snapshot_and_to_snapshotting_with_a_snapshot() {
    let (mut d, mut port) = (driver(), MemoryPort::new("s"));
    d.snapshotting = Some(false);
    d.set_state(&mut port, d.delivering_state(false), None);
    assert_eq!(port.state(), Some(SinkState::Running));
    let (mut d, mut port) = (driver(), MemoryPort::new("s"));
    d.snapshotting = Some(true);
    d.set_state(&mut port, d.delivering_state(false), None);
    assert_eq!(port.state(), Some(SinkState::Snapshotting));
    // An initial_only sink shows snapshotting until it finishes.
    d.snapshotting = Some(false);
    assert_eq!(d.delivering_state(true), SinkState::Snapshotting);
    assert_eq!(d.delivering_state(false), SinkState::Running, "snapshotting -> running once its rows are delivered");
}

#[test]
fn a_transient_failure_goes_to_retrying_one_needing_an_operator_to_error_and_both_back_to_running() {
    for (class, state) in [(ErrorClass::Retry, SinkState::Retrying), (ErrorClass::Operator, SinkState::Error)] {
        let (mut d, mut port) = (driver(), MemoryPort::new("s"));
        d.set_state(&mut port, SinkState::Running, None);
        let f = Failure::sink(SinkError { class, message: "no".into() });
        d.fail(&mut port, f, &settings(), Instant::now());
        assert_eq!(port.states.last(), Some(&(state, Some("no".to_string()))));
        d.succeeded(&mut port);
        d.set_state(&mut port, d.delivering_state(false), None);
        assert_eq!(port.state(), Some(SinkState::Running));
    }
}

#[test]
fn a_compliance_hold_shows_in_the_counters_until_a_step_succeeds() {
    let (mut d, mut port) = (driver(), MemoryPort::new("s"));
    d.succeeded(&mut port);
    assert_eq!(port.counters.compliance_hold, 0);
    let f = Failure { compliance: true, ..Failure::new(SinkState::Error, "no tokenization key") };
    d.fail(&mut port, f, &settings(), Instant::now());
    assert_eq!(port.counters.compliance_hold, 1);
    d.succeeded(&mut port);
    assert_eq!(port.counters.compliance_hold, 0);
}

// --- a crash between commit and confirm ---

fn basic_tables(fr: &[RawFrame]) -> SinkTables {
    let oids = relation_oids(fr);
    let tables: [(&str, CaptureConfig); 2] = [("orders", config(&["order_id"])), ("plain", config(&["id"]))];
    tables.into_iter().map(|(t, c)| (oids[t], Arc::new(c))).collect()
}

/// One read of `source` by the driver from where the sink stands, handed over as the worker
/// hands it (see [`hand`]).
fn read_and_hand(
    d: &mut Driver,
    port: &mut MemoryPort,
    source: &mut MemorySource,
    tables: &SinkTables,
    confirmed: Lsn,
    overlap: bool,
) {
    let mut types = types("basic");
    let position = d.position(confirmed);
    let r = d.read(source, &mut types, tables, &read_settings(), position, None).expect("read");
    let super::Read::Sent(b, _) = r else { panic!("nothing sent: {r:?}") };
    hand(d, port, *b, confirmed, overlap).expect("hand over");
}

/// A driver for a new worker over `sink`: it opens it (an exactly-once one gives its checkpoint).
fn opened(sink: &SharedSink) -> Driver {
    let mut d = driver();
    let mut s = sink.clone();
    d.checkpoint = s.open().unwrap();
    d.producer = Some(Producer::InPlace(Box::new(s)));
    d
}

/// Delivers the golden capture, crashes after the destination committed and before the slot was
/// confirmed, and delivers again from the slot with a new driver (a new worker).
fn crash_after_commit(mode: DeliveryMode) -> (SharedSink, MemoryPort) {
    let fr = frames("basic");
    let tables = basic_tables(&fr);
    let sink = SharedSink::new(mode);
    let mut port = MemoryPort::new("s");
    let mut d = opened(&sink);
    // The failpoint's moment: the unit is committed; the process ends before it confirms.
    read_and_hand(&mut d, &mut port, &mut MemorySource::new(fr.clone()), &tables, Lsn(0), false);
    d.settle(&mut port, 0).unwrap();
    assert_eq!(port.commits_seen, 1);
    drop(d);
    assert!(port.confirms.is_empty());
    // The next worker: the slot is where it was.
    let mut d = opened(&sink);
    let confirmed = port.confirmed();
    read_and_hand(&mut d, &mut port, &mut MemorySource::after(&fr, confirmed), &tables, confirmed, false);
    d.settle(&mut port, 0).unwrap();
    d.confirm_delivered(&mut port, confirmed).unwrap();
    (sink, port)
}

#[test]
fn a_crash_between_the_destinations_commit_and_the_confirm_delivers_each_event_once() {
    let (sink, port) = crash_after_commit(DeliveryMode::ExactlyOnce);
    let committed: Vec<Vec<u8>> = sink.sink().events().iter().map(|e| e.payload.clone()).collect();
    let mut unique = committed.clone();
    unique.sort();
    unique.dedup();
    assert!(!committed.is_empty());
    assert_eq!(committed.len(), unique.len(), "an event was delivered twice");
    assert!(port.confirmed() > Lsn(0), "the slot moves past what the checkpoint covers");
    assert!(port.counters.duplicate_events_filtered > 0, "the re-read met the delivered events and skipped them");
}

#[test]
fn control_an_at_least_once_destination_gets_the_unconfirmed_events_again_after_such_a_crash() {
    // The oracle above would pass if nothing were read again; here the same crash sends twice.
    let (sink, _) = crash_after_commit(DeliveryMode::AtLeastOnce);
    let committed = sink.sink().events().len();
    let once = sink.sink().committed[0].0.len();
    assert!(once > 0);
    assert_eq!(committed, 2 * once, "every event twice");
}

// --- a stop request ---

#[test]
fn a_stop_request_ends_the_wait_for_a_unit_and_leaves_it_to_be_read_again() {
    let sink = SharedSink::new(DeliveryMode::ExactlyOnce);
    let (mut d, mut port) = (threaded(&sink), MemoryPort::new("s"));
    sink.hold_flushes();
    hand(&mut d, &mut port, batch(100, 3), Lsn(0), true).unwrap();
    port.stopping = true;
    let started = Instant::now();
    d.settle(&mut port, 0).unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(10), "{waited:?}");
    assert_eq!(d.handed.len(), 1);
    d.confirm_delivered(&mut port, Lsn(0)).unwrap();
    assert!(port.confirms.is_empty(), "a unit not acknowledged is read again, never confirmed");
    // Aborting while stopping drops the producer (the next one fences it) instead of waiting.
    d.abort(&mut port);
    assert!(d.producer.is_none());
    sink.release_flushes();
}

// --- heartbeats ---

#[test]
fn a_heartbeat_is_due_once_the_interval_passed_and_other_wal_was_written() {
    let mut d = driver();
    let now = Instant::now();
    assert!(!d.heartbeat_due(Lsn(1000), Lsn(1000), &settings(), now), "nothing written since the slot");
    assert!(d.heartbeat_due(Lsn(2000), Lsn(1000), &settings(), now));
    d.heartbeat_written(Lsn(2100));
    assert!(
        !d.heartbeat_due(Lsn(2150), Lsn(1000), &settings(), now + Duration::from_secs(60)),
        "only its own heartbeat"
    );
    assert!(!d.heartbeat_due(Lsn(5000), Lsn(1000), &settings(), now + Duration::from_secs(1)), "interval not over");
    assert!(d.heartbeat_due(Lsn(5000), Lsn(1000), &settings(), now + Duration::from_secs(10)));
}

#[test]
fn a_slot_far_behind_gets_its_heartbeat_before_the_interval_once_the_last_one_was_read() {
    let mut d = driver();
    let now = Instant::now();
    let far = Lsn(1000 + RESTART_POINT_BYTES + 1);
    assert!(d.heartbeat_due(far, Lsn(1000), &settings(), now));
    d.heartbeat_written(Lsn(far.0 + 50));
    assert!(!d.heartbeat_due(Lsn(far.0 + 500), Lsn(1000), &settings(), now), "its last heartbeat is not read yet");
    let farther = Lsn(far.0 + 50 + RESTART_POINT_BYTES + 1);
    assert!(d.heartbeat_due(farther, Lsn(far.0 + 50), &settings(), now), "read: the next one at once");
}

// --- a snapshot interleaved with changes ---

/// The snapshot of table 7 (keyed by `id`) is open.
fn snapshot_of_t() -> OpenSnapshots {
    OpenSnapshots { any: true, keyed: vec![(7, vec!["id".into()], vec!["id".into(), "v".into()])], keyless: vec![] }
}

/// The first chunk of table 7, read with rows `ids`.
fn chunk_of_t(ids: impl IntoIterator<Item = u32>) -> Chunk {
    let mut c = Chunk::new("sink-a 1".into(), relation(7), &["id".into()], 42).unwrap();
    for id in ids {
        c.push_row(&[Some(id.to_string().as_bytes()), Some(b"old")]).unwrap();
    }
    c
}

/// One read of `frames` through the driver's snapshot reader into its destination, handed over.
fn read_spliced(d: &mut Driver, port: &mut MemoryPort, frames: Vec<RawFrame>, overlap: bool) {
    read_and_hand(d, port, &mut MemorySource::new(frames), &t_tables(), Lsn(0), overlap);
}

/// (operation, id) of each event the destination committed.
fn ops(sink: &SharedSink) -> Vec<(Op, i64)> {
    let id = |e: &crate::envelope::Event| {
        let v: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
        let image = if v["after"].is_null() { &v["before"] } else { &v["after"] };
        image["id"].as_i64().unwrap_or(-1)
    };
    sink.sink().events().iter().map(|e| (e.op, id(e))).collect()
}

#[test]
fn a_snapshot_chunk_among_changes_is_delivered_at_its_watermark_without_the_rows_changed_meanwhile() {
    let sink = SharedSink::new(DeliveryMode::AtLeastOnce);
    let (mut d, mut port) = (threaded(&sink), MemoryPort::new("s"));
    d.open_windows(snapshot_of_t(), None);
    assert_eq!(d.delivering_state(false), SinkState::Snapshotting);
    assert_eq!(d.chunk_wanted(), None, "not before its destination is open (it does not know where it stands)");
    d.note_opened(Lsn(0), false);
    assert_eq!(d.chunk_wanted(), Some((Previous::OpenedAt(Lsn(0)), 1)));
    d.chunk_taken(Next::Chunk(Box::new(chunk_of_t([1, 2, 3]))), &[7], None);
    assert_eq!(d.chunk_wanted(), None, "one chunk at a time");
    // Row 2 is deleted after the chunk was read and before its watermark; row 9 comes after.
    let frames = vec![
        relation_frame(&relation(7), 5),
        begin(900, 100),
        delete(7, 2, 92),
        commit(100),
        watermark("sink-a 1", 200),
        begin(901, 300),
        insert(7, 9, 292),
        commit(300),
    ];
    sink.hold_flushes();
    read_spliced(&mut d, &mut port, frames, true);
    assert_eq!(d.chunk_delivered(), None, "read, handed over, not acknowledged: the chunk is not delivered");
    sink.release_flushes();
    d.settle(&mut port, 0).unwrap();
    assert_eq!(d.chunk_delivered(), Some(2), "rows 1 and 3; row 2's delete stands for it");
    assert_eq!(ops(&sink), [(Op::Delete, 2), (Op::Read, 1), (Op::Read, 3), (Op::Insert, 9)]);
    // The next chunk settles this one; the catalog says the table is done: its window closes.
    assert_eq!(d.chunk_wanted(), Some((Previous::Delivered, 2)));
    assert_eq!(d.chunk_taken(Next::Done, &[], None), Default::default());
    assert!(!d.snap.tracks(7));
    assert_eq!(d.delivering_state(false), SinkState::Running);
}

#[test]
fn control_a_chunk_whose_watermark_was_not_read_is_not_delivered_by_a_later_delivery() {
    // The oracle above would pass if any delivery settled the chunk: here none reaches its watermark.
    let sink = SharedSink::new(DeliveryMode::AtLeastOnce);
    let (mut d, mut port) = (threaded(&sink), MemoryPort::new("s"));
    d.open_windows(snapshot_of_t(), None);
    d.note_opened(Lsn(0), false);
    d.chunk_wanted();
    d.chunk_taken(Next::Chunk(Box::new(chunk_of_t([1, 2, 3]))), &[7], None);
    let frames = vec![relation_frame(&relation(7), 5), begin(900, 100), delete(7, 2, 92), commit(100)];
    read_spliced(&mut d, &mut port, frames, false);
    d.settle(&mut port, 0).unwrap();
    assert_eq!(d.delivered, Some(Lsn(116)));
    assert_eq!(d.chunk_delivered(), None);
    assert_eq!(ops(&sink), [(Op::Delete, 2)]);
    assert_eq!(d.chunk_wanted(), None, "still holding its chunk");
}

#[test]
fn a_keyless_table_waits_for_its_plan_and_a_cancelled_plan_is_given_up() {
    let mut d = driver();
    let open = OpenSnapshots { any: true, keyed: vec![], keyless: vec![(8, None)] };
    d.open_windows(open, None);
    assert_eq!(d.snap.held(), [8], "its changes wait for its plan");
    // Following its plan already (a worker that read the catalog again): not held again.
    let mut e = driver();
    e.open_windows(OpenSnapshots { any: true, keyed: vec![], keyless: vec![(8, None)] }, Some(8));
    assert!(e.snap.held().is_empty());
    // The catalog names another snapshot next: the plan (snapshot 41) is given up, the hold let go.
    d.note_opened(Lsn(0), false);
    d.chunk_wanted();
    let taken = d.chunk_taken(Next::Keyless { snapshot_id: 42, table_oid: 9 }, &[9], Some(41));
    assert_eq!(taken, super::snapshot::Taken { give_up_plan: true, keyless: Some((42, 9)) });
    assert!(d.snap.held().is_empty());
    // Its own snapshot next: kept.
    let taken = d.chunk_taken(Next::Keyless { snapshot_id: 42, table_oid: 9 }, &[9], Some(42));
    assert!(!taken.give_up_plan);
}

// --- one read ---

fn read_settings() -> super::ReadSettings {
    super::ReadSettings { large_frames: 10_000, dedup: true, skip_window: false, checkpoint_interval: None }
}

fn t_tables() -> SinkTables {
    [(7, Arc::new(config(&["id"])))].into_iter().collect()
}

fn one_insert() -> Vec<RawFrame> {
    vec![relation_frame(&relation(7), 5), begin(900, 100), insert(7, 1, 92), commit(100)]
}

#[test]
fn a_read_that_finds_nothing_sends_nothing_and_a_change_without_a_destination_asks_for_one() {
    let mut d = driver();
    let mut types = crate::types::TypeRegistry::new();
    let r = d.read(&mut MemorySource::new(vec![]), &mut types, &t_tables(), &read_settings(), Lsn(0), None).unwrap();
    assert!(matches!(r, super::Read::Nothing), "{r:?}");
    let r =
        d.read(&mut MemorySource::new(one_insert()), &mut types, &t_tables(), &read_settings(), Lsn(0), None).unwrap();
    assert!(matches!(r, super::Read::Open), "{r:?}");
    // With a snapshot to deliver, it asks for its destination even with no change to send.
    d.open_windows(snapshot_of_t(), None);
    let r = d.read(&mut MemorySource::new(vec![]), &mut types, &t_tables(), &read_settings(), Lsn(0), None).unwrap();
    assert!(matches!(r, super::Read::Open), "{r:?}");
}

#[test]
fn an_in_database_sink_is_flushed_inside_the_read_and_a_failed_flush_aborts_its_unit() {
    let sink = SharedSink::new(DeliveryMode::ExactlyOnce).in_source_database();
    let mut d = driver();
    d.producer = Some(Producer::InPlace(Box::new(sink.clone())));
    let mut types = crate::types::TypeRegistry::new();
    let r = d.read(&mut MemorySource::new(one_insert()), &mut types, &t_tables(), &read_settings(), Lsn(0), None);
    let Ok(super::Read::Sent(b, Some(plan))) = r else { panic!("{r:?}") };
    assert_eq!(plan.flush.map(|c| c.end_lsn), Some(Lsn(116)));
    assert_eq!(b.target, Some(Lsn(116)));
    assert_eq!(sink.sink().committed.len(), 1, "flushed in the read");
    // Its flush fails: the unit is aborted, and the failure comes back for the caller to roll back.
    let sink = SharedSink::new(DeliveryMode::ExactlyOnce).in_source_database();
    sink.sink().fault = Some(SinkFault::Flush(ErrorClass::Retry));
    let mut d = driver();
    d.producer = Some(Producer::InPlace(Box::new(sink.clone())));
    let r = d.read(&mut MemorySource::new(one_insert()), &mut types, &t_tables(), &read_settings(), Lsn(0), None);
    assert_eq!(r.map(|_| ()).unwrap_err().state, SinkState::Retrying);
    let held = sink.sink();
    assert_eq!((held.committed.len(), held.aborted), (0, 1));
    drop(held);
    // Control: a sink elsewhere is not flushed in the read (the caller hands it over).
    let sink = SharedSink::new(DeliveryMode::ExactlyOnce);
    let mut d = driver();
    d.producer = Some(Producer::InPlace(Box::new(sink.clone())));
    let r = d.read(&mut MemorySource::new(one_insert()), &mut types, &t_tables(), &read_settings(), Lsn(0), None);
    assert!(matches!(r, Ok(super::Read::Sent(_, None))), "{r:?}");
    assert!(sink.sink().committed.is_empty());
}

#[test]
fn a_nap_waits_whole_milliseconds_rounded_up_never_zero_before_it_ends() {
    let ms = Duration::from_millis;
    assert_eq!(latch_wait(ms(200), ms(5)), ms(5));
    assert_eq!(latch_wait(ms(3), ms(200)), ms(3));
    // The last fraction of a millisecond: one wait of a millisecond, not a spin of zero-length ones.
    assert_eq!(latch_wait(Duration::from_micros(300), ms(200)), ms(1));
    assert_eq!(latch_wait(Duration::from_micros(1_001), ms(200)), ms(2));
    assert_eq!(latch_wait(Duration::ZERO, ms(200)), Duration::ZERO);
}
