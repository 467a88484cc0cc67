//! Decoding and delivery in parallel: a sink driven by a thread of its own, fed through a queue
//! bounded in bytes.
//!
//! ```text
//!  reading thread (the worker: decode, encode)          delivery thread (the sink's I/O)
//!  ───────────────────────────────────────────          ─────────────────────────────────
//!  send_owned(events) ──Send──▶ queue (≤ QUEUE_BYTES) ──▶ sink.send_owned   (Kafka: produce)
//!  start_flush(cp)    ──Flush─▶                       ──▶ sink.flush(cp)    (Kafka: commit)
//!  ...reads the next unit meanwhile...                          │
//!  try_flushed / wait_flushed ◀──────── Flushed { checkpoint, result, when } ┘
//! ```
//! The caller reads the next unit while the last one commits; units go to the sink in order, and
//! each flush is reported in order, so the caller confirms the slot only up to a checkpoint the
//! sink reported committed — the same "ack before advance" as a sink called directly.
//!
//! After a failure the thread takes nothing more: every later send fails at once with the same
//! error (so the reader stops early), every later flush reports it. The caller then drops the
//! `DeliveryThread`; the thread aborts the unit it holds open (on its own thread: a Kafka abort
//! can wait for the broker) and ends. Nothing in the thread may touch PostgreSQL: the sinks it
//! drives are plain Rust, and the caller starts it with every signal blocked.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::port::{Checkpoint, DeliveryMode, ErrorClass, PublishStats, Sink, SinkError};
use super::read::unix_micros_now;
use crate::envelope::Event;

/// Bytes of events (keys and payloads) handed to the thread and not yet taken by its sink, at
/// most: the reading thread waits beyond it, so memory stays bounded when the destination is
/// slower than decoding. 8 MiB is a few hundred milliseconds of the fastest workload measured.
pub const QUEUE_BYTES: usize = 8 << 20;

/// How long the reading thread sleeps while the queue is full.
const ROOM_WAIT: Duration = Duration::from_micros(200);

enum Command {
    Send(Vec<Event>, usize),
    Flush(Checkpoint),
}

/// A flush the thread finished.
#[derive(Debug)]
pub struct Flushed {
    /// The checkpoint it was given.
    pub checkpoint: Checkpoint,
    /// Committed (acknowledged), or why not.
    pub result: Result<(), SinkError>,
    /// When the sink's flush returned, Unix microseconds (the acknowledgement, for latencies).
    pub at_unix_micros: i64,
}

#[derive(Default)]
struct Shared {
    queued_bytes: AtomicUsize,
    /// The first failure: later sends and flushes fail with it.
    failed: Mutex<Option<SinkError>>,
    /// The caller gave up on what is queued: skip it, abort the open unit.
    abandoned: AtomicBool,
    /// The sink's `hold_until` after its last flush.
    hold_until: Mutex<Option<Instant>>,
}

impl Shared {
    fn failure(&self) -> Option<SinkError> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }

    fn fail(&self, e: &SinkError) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert_with(|| e.clone());
        }
    }
}

/// A sink on a thread of its own (see the module documentation). It is a [`Sink`] too: `flush`
/// then waits for its own flush, as a sink called directly would.
pub struct DeliveryThread {
    commands: mpsc::Sender<Command>,
    done: mpsc::Receiver<Flushed>,
    /// Events the sink took, coming back to be freed here (see [`serve`]).
    sent: mpsc::Receiver<Vec<Event>>,
    shared: Arc<Shared>,
    mode: DeliveryMode,
    /// Flushes handed over and not reported yet.
    in_flight: usize,
    queue_bytes: usize,
    interrupt: Option<Box<dyn Fn() -> bool>>,
}

fn event_bytes(events: &[Event]) -> usize {
    events.iter().map(|e| e.payload.len() + e.key.as_ref().map_or(0, Vec::len)).sum()
}

fn interrupted() -> SinkError {
    SinkError { class: ErrorClass::Retry, message: "publish interrupted".into() }
}

impl DeliveryThread {
    /// Starts the thread with an opened sink. The thread inherits the caller's signal mask: a
    /// PostgreSQL process starts it with every signal blocked.
    pub fn start(sink: Box<dyn Sink + Send>) -> std::io::Result<DeliveryThread> {
        Self::with_queue(sink, QUEUE_BYTES)
    }

    /// [`DeliveryThread::start`] with a queue of `queue_bytes`.
    pub fn with_queue(sink: Box<dyn Sink + Send>, queue_bytes: usize) -> std::io::Result<DeliveryThread> {
        let (commands, rx) = mpsc::channel();
        let (tx, done) = mpsc::channel();
        let (back, sent) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let mode = sink.delivery_mode();
        let theirs = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("pg_cdc delivery".into())
            .spawn(move || serve(sink, &rx, &tx, &back, &theirs))?;
        Ok(DeliveryThread { commands, done, sent, shared, mode, in_flight: 0, queue_bytes, interrupt: None })
    }

    /// Installs a check polled while the reading thread waits for room in the queue or for a
    /// flush; when it returns true, the wait gives up with a retryable error.
    pub fn set_interrupt(&mut self, f: impl Fn() -> bool + 'static) {
        self.interrupt = Some(Box::new(f));
    }

    fn is_interrupted(&self) -> bool {
        self.interrupt.as_ref().is_some_and(|f| f())
    }

    /// Flushes handed over and not reported yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Hands the unit sent since the last flush over to be committed with `checkpoint`; its
    /// result comes back from [`DeliveryThread::try_flushed`] or [`DeliveryThread::wait_flushed`].
    pub fn start_flush(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        if let Some(e) = self.shared.failure() {
            return Err(e);
        }
        self.commands.send(Command::Flush(checkpoint)).map_err(|_| ended())?;
        self.in_flight += 1;
        Ok(())
    }

    /// The oldest flush not reported yet, if it finished.
    pub fn try_flushed(&mut self) -> Option<Flushed> {
        if self.in_flight == 0 {
            return None;
        }
        let got = match self.done.try_recv() {
            Ok(f) => Some(f),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(self.lost()),
        };
        self.in_flight -= usize::from(got.is_some());
        got
    }

    /// The oldest flush not reported yet, waiting for it up to `timeout` (the sink's own timeouts
    /// bound it, and its interrupt check cuts it short).
    pub fn wait_flushed(&mut self, timeout: Duration) -> Option<Flushed> {
        if self.in_flight == 0 {
            return None;
        }
        let got = match self.done.recv_timeout(timeout) {
            Ok(f) => Some(f),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(self.lost()),
        };
        self.in_flight -= usize::from(got.is_some());
        got
    }

    /// What a flush reports when the thread is gone (a panic in the sink).
    fn lost(&self) -> Flushed {
        let e = ended();
        self.shared.fail(&e);
        Flushed { checkpoint: Checkpoint { end_lsn: crate::Lsn(0) }, result: Err(e), at_unix_micros: unix_micros_now() }
    }
}

fn ended() -> SinkError {
    SinkError { class: ErrorClass::Retry, message: "the sink's delivery thread ended unexpectedly".into() }
}

impl Sink for DeliveryThread {
    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        self.send_owned(events.to_vec())
    }

    fn send_owned(&mut self, events: Vec<Event>) -> Result<PublishStats, SinkError> {
        // Free what the sink took since the last send, on this thread (see `serve`).
        while self.sent.try_recv().is_ok() {}
        let bytes = event_bytes(&events);
        // Room first (a unit larger than the whole queue still goes, once the queue is empty).
        while self.shared.queued_bytes.load(Ordering::Acquire) > 0
            && self.shared.queued_bytes.load(Ordering::Acquire) + bytes > self.queue_bytes
        {
            if let Some(e) = self.shared.failure() {
                return Err(e);
            }
            if self.is_interrupted() {
                return Err(interrupted());
            }
            std::thread::sleep(ROOM_WAIT);
            while self.sent.try_recv().is_ok() {}
        }
        if let Some(e) = self.shared.failure() {
            return Err(e);
        }
        let stats = PublishStats { events: events.len() as u64, bytes: bytes as u64 };
        self.shared.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.commands.send(Command::Send(events, bytes)).map_err(|_| ended())?;
        Ok(stats)
    }

    /// Hands the flush over and waits for it (and for every earlier one): the blocking contract
    /// of [`Sink::flush`].
    fn flush(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        self.start_flush(checkpoint)?;
        let mut result = Ok(());
        while self.in_flight > 0 {
            match self.wait_flushed(Duration::from_millis(100)) {
                Some(f) => result = result.and(f.result),
                None if self.is_interrupted() => return Err(interrupted()),
                None => {}
            }
        }
        result
    }

    /// Gives up on everything queued: the thread skips it and aborts the open unit. The caller
    /// drops the thread next.
    fn abort(&mut self) {
        self.shared.abandoned.store(true, Ordering::Release);
    }

    fn delivery_mode(&self) -> DeliveryMode {
        self.mode
    }

    fn hold_until(&self) -> Option<Instant> {
        self.shared.hold_until.lock().ok().and_then(|h| *h)
    }
}

/// The delivery thread: takes commands in order until the reading side hangs up. The events it
/// sent go back to the reading thread to be freed there: they were allocated there, and glibc
/// frees a block in the arena of the thread that allocated it, under that arena's lock, so freeing
/// them here made the two threads contend for the reading thread's arena.
fn serve(
    mut sink: Box<dyn Sink + Send>,
    commands: &mpsc::Receiver<Command>,
    done: &mpsc::Sender<Flushed>,
    back: &mpsc::Sender<Vec<Event>>,
    shared: &Shared,
) {
    // Sent since the last flush: a unit is open in the sink.
    let mut open = false;
    while let Ok(command) = commands.recv() {
        let skip = shared.abandoned.load(Ordering::Acquire) || shared.failure().is_some();
        match command {
            Command::Send(events, bytes) => {
                if !skip {
                    open = true;
                    if let Err(e) = sink.send(&events) {
                        shared.fail(&e);
                        sink.abort();
                        open = false;
                    }
                }
                shared.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
                let _ = back.send(events);
            }
            Command::Flush(checkpoint) => {
                let result = match shared.failure() {
                    Some(e) => Err(e),
                    None if skip => Err(SinkError { class: ErrorClass::Retry, message: "delivery abandoned".into() }),
                    None => {
                        let r = sink.flush(checkpoint);
                        if let Err(e) = &r {
                            shared.fail(e);
                        }
                        r
                    }
                };
                // A failed flush leaves its unit open (a Kafka transaction): abort it here, not
                // on the reading thread, since a Kafka abort may wait for the broker.
                if result.is_err() && (open || !skip) {
                    sink.abort();
                }
                open = false;
                if let Ok(mut h) = shared.hold_until.lock() {
                    *h = sink.hold_until();
                }
                let flushed = Flushed { checkpoint, result, at_unix_micros: unix_micros_now() };
                if done.send(flushed).is_err() {
                    break;
                }
            }
        }
    }
    if open {
        sink.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{Receiver, SyncSender};

    use super::*;
    use crate::deliver::memory::{MemorySink, SinkFault};
    use crate::envelope::Op;
    use crate::Lsn;

    /// A memory sink shared with the test, whose flushes wait for the test's go.
    struct Gated {
        inner: Arc<Mutex<MemorySink>>,
        go: Option<Receiver<()>>,
        flushing: SyncSender<Checkpoint>,
    }

    impl Sink for Gated {
        fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
            self.inner.lock().unwrap().send(events)
        }
        fn flush(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
            let _ = self.flushing.send(checkpoint);
            if let Some(go) = &self.go {
                let _ = go.recv();
            }
            self.inner.lock().unwrap().flush(checkpoint)
        }
        fn abort(&mut self) {
            self.inner.lock().unwrap().abort();
        }
        fn delivery_mode(&self) -> DeliveryMode {
            DeliveryMode::ExactlyOnce
        }
    }

    fn event(lsn: u64, bytes: usize) -> Event {
        Event {
            table_oid: 1,
            schema: "public".into(),
            table: "t".into(),
            op: Op::Insert,
            lsn: Lsn(lsn),
            commit_lsn: Lsn(lsn),
            index: 1,
            key: None,
            payload: vec![b'x'; bytes],
        }
    }

    fn cp(lsn: u64) -> Checkpoint {
        Checkpoint { end_lsn: Lsn(lsn) }
    }

    struct Rig {
        sink: Arc<Mutex<MemorySink>>,
        go: SyncSender<()>,
        flushing: Receiver<Checkpoint>,
        thread: DeliveryThread,
    }

    fn rig(gated: bool, queue: usize) -> Rig {
        let sink = Arc::new(Mutex::new(MemorySink::new(DeliveryMode::ExactlyOnce)));
        let (go, go_rx) = mpsc::sync_channel(16);
        let (flushing_tx, flushing) = mpsc::sync_channel(16);
        let gate = Gated { inner: Arc::clone(&sink), go: gated.then_some(go_rx), flushing: flushing_tx };
        let thread = DeliveryThread::with_queue(Box::new(gate), queue).unwrap();
        Rig { sink, go, flushing, thread }
    }

    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn the_next_unit_is_sent_while_the_last_one_commits() {
        let mut r = rig(true, QUEUE_BYTES);
        r.thread.send_owned(vec![event(10, 100)]).unwrap();
        r.thread.start_flush(cp(20)).unwrap();
        // The sink is inside the first flush (held there) ...
        assert_eq!(r.flushing.recv_timeout(WAIT).unwrap(), cp(20));
        // ... and the reader goes on: the next unit's events are taken meanwhile.
        r.thread.send_owned(vec![event(30, 100), event(31, 100)]).unwrap();
        r.thread.start_flush(cp(40)).unwrap();
        assert_eq!(r.thread.in_flight(), 2);
        assert!(r.thread.try_flushed().is_none(), "nothing committed before the sink's flush returns");
        assert!(r.sink.lock().unwrap().committed.is_empty());
        r.go.send(()).unwrap();
        let first = r.thread.wait_flushed(WAIT).unwrap();
        assert_eq!((first.checkpoint, first.result), (cp(20), Ok(())));
        r.go.send(()).unwrap();
        let second = r.thread.wait_flushed(WAIT).unwrap();
        assert_eq!((second.checkpoint, second.result), (cp(40), Ok(())));
        let sink = r.sink.lock().unwrap();
        let units: Vec<(Vec<u64>, Checkpoint)> =
            sink.committed.iter().map(|(e, c)| (e.iter().map(|e| e.lsn.0).collect(), *c)).collect();
        assert_eq!(units, vec![(vec![10], cp(20)), (vec![30, 31], cp(40))], "units in order, each whole");
    }

    #[test]
    fn a_full_queue_makes_the_reader_wait_and_an_interrupt_ends_the_wait() {
        let mut r = rig(true, 1000);
        r.thread.send_owned(vec![event(1, 600)]).unwrap();
        r.thread.start_flush(cp(2)).unwrap();
        r.flushing.recv_timeout(WAIT).unwrap();
        // The thread is held in the flush: 600 bytes queued behind it fill the 1,000-byte queue.
        r.thread.send_owned(vec![event(3, 600)]).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let theirs = Arc::clone(&stop);
        r.thread.set_interrupt(move || theirs.load(Ordering::Relaxed));
        let stopper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            stop.store(true, Ordering::Relaxed);
        });
        let started = Instant::now();
        let e = r.thread.send_owned(vec![event(4, 600)]).unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(150), "waited for room");
        assert_eq!(e.message, "publish interrupted");
        stopper.join().unwrap();
        // With the flush done, the queue empties and there is room again.
        r.thread.set_interrupt(|| false);
        r.go.send(()).unwrap();
        assert_eq!(r.thread.wait_flushed(WAIT).unwrap().result, Ok(()));
        r.thread.send_owned(vec![event(4, 600)]).unwrap();
    }

    #[test]
    fn a_failed_flush_fails_what_follows_and_nothing_of_it_is_committed() {
        let mut r = rig(false, QUEUE_BYTES);
        r.sink.lock().unwrap().fault = Some(SinkFault::Flush(ErrorClass::Retry));
        r.thread.send_owned(vec![event(10, 10)]).unwrap();
        r.thread.start_flush(cp(20)).unwrap();
        let failed = r.thread.wait_flushed(WAIT).unwrap();
        assert_eq!(failed.result.unwrap_err().message, "flush failed (planned)");
        // Later sends and flushes fail with the same error; the reader stops early.
        assert_eq!(r.thread.send_owned(vec![event(30, 10)]).unwrap_err().message, "flush failed (planned)");
        assert!(r.thread.start_flush(cp(40)).is_err());
        let sink = r.sink.lock().unwrap();
        assert!(sink.committed.is_empty());
        assert_eq!(sink.aborted, 1, "the failed unit was aborted on the delivery thread");
    }

    #[test]
    fn a_failed_send_is_reported_by_its_flush_and_the_unit_is_aborted() {
        let mut r = rig(false, QUEUE_BYTES);
        r.sink.lock().unwrap().fault = Some(SinkFault::Send(2, ErrorClass::Operator));
        r.thread.send_owned(vec![event(10, 10)]).unwrap();
        r.thread.send_owned(vec![event(11, 10)]).unwrap();
        r.thread.start_flush(cp(20)).unwrap();
        let f = r.thread.wait_flushed(WAIT).unwrap();
        assert_eq!(f.result.unwrap_err().class, ErrorClass::Operator);
        assert!(r.sink.lock().unwrap().committed.is_empty());
        assert_eq!(r.sink.lock().unwrap().aborted, 1);
    }

    #[test]
    fn dropping_the_thread_aborts_the_open_unit_and_abandoned_sends_are_skipped() {
        let r = rig(false, QUEUE_BYTES);
        let mut thread = r.thread;
        thread.send_owned(vec![event(10, 10)]).unwrap();
        let deadline = Instant::now() + WAIT;
        while r.sink.lock().unwrap().sends.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        thread.abort();
        thread.send_owned(vec![event(11, 10)]).unwrap();
        thread.start_flush(cp(20)).unwrap();
        assert_eq!(thread.wait_flushed(WAIT).unwrap().result.unwrap_err().message, "delivery abandoned");
        drop(thread);
        let deadline = Instant::now() + WAIT;
        while r.sink.lock().unwrap().aborted == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let sink = r.sink.lock().unwrap();
        assert!(sink.committed.is_empty());
        assert_eq!(sink.sends, vec![1], "the send after the abort never reached the sink");
        assert_eq!(sink.aborted, 1);
    }

    #[test]
    fn flush_as_a_sink_waits_for_its_own_commit() {
        let mut r = rig(false, QUEUE_BYTES);
        let tx = vec![crate::pipeline::Transaction {
            xid: 1,
            commit_lsn: Lsn(5),
            end_lsn: Lsn(6),
            commit_time: 0,
            events: vec![event(5, 10)],
            counters: Default::default(),
        }];
        let stats = r.thread.publish(&tx, cp(6)).unwrap();
        assert_eq!(stats.events, 1);
        assert_eq!(r.sink.lock().unwrap().committed.len(), 1, "committed when publish returned");
    }
}
