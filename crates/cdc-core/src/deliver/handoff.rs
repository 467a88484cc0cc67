//! Decoding and delivery in parallel: a sink that commits on a thread of its own while the
//! worker reads the next unit, fed through a queue bounded in bytes.
//!
//! ```text
//!  reading thread (the worker: decode, encode)          delivery thread (the sink's I/O)
//!  ───────────────────────────────────────────          ─────────────────────────────────
//!  unit N:   send ──▶ sink directly (nothing in flight)
//!            start_flush(cp) ──Flush──────────────────▶ sink.flush(cp)   (Kafka: commit)
//!  unit N+1: send ──Send──▶ queue (≤ QUEUE_BYTES) ─────▶ sink.send        (after N's commit)
//!            ...reads and encodes meanwhile...                 │
//!  try_flushed / wait_flushed ◀──── Flushed { checkpoint, result, when } ┘
//! ```
//! A unit begun while nothing is in flight goes to the sink directly, on the reading thread, and
//! so does its flush when the caller waits for it ([`Sink::flush`]): at a low rate a unit costs
//! no hop between threads (each is a wake-up, milliseconds on a saturated machine). Only
//! [`DeliveryThread::start_flush`] hands a flush to the thread, and the units read while one is
//! in flight queue behind it, in order. Each flush is reported in order, so the caller confirms
//! the slot only up to a checkpoint the sink reported committed — "ack before advance" as before.
//!
//! After a failure the sink takes nothing more: every later send fails at once with the same
//! error (so the reader stops early), every later flush reports it. The caller then drops the
//! `DeliveryThread`, and the thread aborts the open unit (on its own thread: a Kafka abort can wait
//! for the broker) and ends. Nothing in the thread may touch PostgreSQL: the sinks it drives are
//! plain Rust, and the caller starts it with every signal blocked.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::port::{Checkpoint, DeliveryMode, ErrorClass, PublishStats, Sink, SinkError};
use super::read::unix_micros_now;
use crate::envelope::Event;

/// Bytes of events (keys and payloads) handed to the thread and not yet taken by its sink, at
/// most: the reading thread waits beyond it, so memory stays bounded when the destination is
/// slower than decoding.
pub const QUEUE_BYTES: usize = 8 << 20;

/// How long the reading thread sleeps while the queue is full.
const ROOM_WAIT: Duration = Duration::from_micros(200);

/// How long dropping a [`DeliveryThread`] waits for its thread to end (abort the open unit and
/// close the sink) before it leaves the thread behind.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);

enum Command {
    Send(Vec<Event>, usize),
    Flush(Checkpoint),
    /// Abort the open unit (best effort).
    Abort,
    /// Abort the open unit and keep going; say so when done.
    Discard(mpsc::Sender<()>),
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

struct State {
    queued_bytes: AtomicUsize,
    /// The first failure (or the caller's abort): later sends and flushes fail with it, and the
    /// thread skips what is queued.
    failed: Mutex<Option<SinkError>>,
    /// The sink, shared by both threads: the reading thread uses it only while nothing is queued
    /// or in flight, so the two never wait for each other.
    sink: Mutex<Box<dyn Sink + Send>>,
}

impl State {
    fn failure(&self) -> Option<SinkError> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }

    fn fail(&self, e: &SinkError) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert_with(|| e.clone());
        }
    }

    fn sink(&self) -> MutexGuard<'_, Box<dyn Sink + Send>> {
        // A panic in the sink poisons the lock; the sink is failed by then (the thread is gone).
        self.sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Where the open unit's events went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// To the sink on the reading thread (nothing was in flight when it began).
    Direct,
    /// Through the queue, behind a flush in flight.
    Queued,
}

/// A sink with a delivery thread (see the module documentation). It is a [`Sink`] too: `flush`
/// waits for the unit's commit, as a sink called directly would.
pub struct DeliveryThread {
    commands: mpsc::Sender<Command>,
    done: mpsc::Receiver<Flushed>,
    /// Events the sink took on the thread, coming back to be freed here (see [`serve`]).
    sent: mpsc::Receiver<Vec<Event>>,
    state: Arc<State>,
    mode: DeliveryMode,
    /// Flushes handed over and not reported yet.
    in_flight: usize,
    /// The open unit (events sent since the last flush), and where it goes.
    unit: Option<Route>,
    queue_bytes: usize,
    interrupt: Option<Box<dyn Fn() -> bool>>,
    /// The thread, joined when this is dropped (see the `Drop` impl).
    thread: Option<std::thread::JoinHandle<()>>,
}

fn event_bytes(events: &[Event]) -> usize {
    events.iter().map(|e| e.payload.len() + e.key.as_ref().map_or(0, Vec::len)).sum()
}

fn interrupted() -> SinkError {
    SinkError { class: ErrorClass::Retry, message: "publish interrupted".into() }
}

fn ended() -> SinkError {
    SinkError { class: ErrorClass::Retry, message: "the sink's delivery thread ended unexpectedly".into() }
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
        let mode = sink.delivery_mode();
        let state =
            Arc::new(State { queued_bytes: AtomicUsize::new(0), failed: Mutex::new(None), sink: Mutex::new(sink) });
        let theirs = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("pg_cdc delivery".into())
            .spawn(move || serve(&theirs, &rx, &tx, &back))?;
        Ok(DeliveryThread {
            commands,
            done,
            sent,
            state,
            mode,
            in_flight: 0,
            unit: None,
            queue_bytes,
            interrupt: None,
            thread: Some(thread),
        })
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

    /// Hands the open unit over to be committed with `checkpoint` on the thread; its result comes
    /// back from [`DeliveryThread::try_flushed`] or [`DeliveryThread::wait_flushed`].
    pub fn start_flush(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        if let Some(e) = self.state.failure() {
            return Err(e);
        }
        self.commands.send(Command::Flush(checkpoint)).map_err(|_| ended())?;
        self.unit = None;
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
        self.state.fail(&e);
        Flushed { checkpoint: Checkpoint { end_lsn: crate::Lsn(0) }, result: Err(e), at_unix_micros: unix_micros_now() }
    }

    /// Gives up the open unit and keeps the sink for the next one: what a read that must be read
    /// again does (its destination is fine). Every flush handed over must be reported first. A
    /// unit sent directly is aborted here; one sent through the queue is aborted on the thread,
    /// after what was queued, and this waits until it is (a later send may go directly).
    pub fn discard(&mut self) -> Result<(), SinkError> {
        if let Some(e) = self.state.failure() {
            return Err(e);
        }
        if self.in_flight > 0 {
            let e =
                SinkError { class: ErrorClass::Retry, message: "a unit was given up with a flush in flight".into() };
            self.abort();
            return Err(e);
        }
        match self.unit.take() {
            None => {}
            Some(Route::Direct) => self.state.sink().abort(),
            Some(Route::Queued) => {
                let (tx, rx) = mpsc::channel();
                self.commands.send(Command::Discard(tx)).map_err(|_| ended())?;
                loop {
                    match rx.recv_timeout(Duration::from_millis(100)) {
                        Ok(()) => break,
                        Err(mpsc::RecvTimeoutError::Timeout) if self.is_interrupted() => {
                            self.abort();
                            return Err(interrupted());
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => {
                            self.state.fail(&ended());
                            return Err(ended());
                        }
                    }
                }
                self.free_sent();
            }
        }
        self.state.failure().map_or(Ok(()), Err)
    }

    /// Frees the events the thread sent back.
    fn free_sent(&self) {
        while self.sent.try_recv().is_ok() {}
    }
}

impl Sink for DeliveryThread {
    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        self.send_owned(events.to_vec())
    }

    fn send_owned(&mut self, events: Vec<Event>) -> Result<PublishStats, SinkError> {
        if let Some(e) = self.state.failure() {
            return Err(e);
        }
        let route = *self.unit.get_or_insert(if self.in_flight == 0 { Route::Direct } else { Route::Queued });
        if route == Route::Direct {
            let sent = self.state.sink().send(&events);
            if let Err(e) = &sent {
                self.state.fail(e);
            }
            return sent;
        }
        self.free_sent();
        let bytes = event_bytes(&events);
        // Room first (a unit larger than the whole queue still goes, once the queue is empty).
        while self.state.queued_bytes.load(Ordering::Acquire) > 0
            && self.state.queued_bytes.load(Ordering::Acquire) + bytes > self.queue_bytes
        {
            if let Some(e) = self.state.failure() {
                return Err(e);
            }
            if self.is_interrupted() {
                return Err(interrupted());
            }
            std::thread::sleep(ROOM_WAIT);
            self.free_sent();
        }
        let stats = PublishStats { events: events.len() as u64, bytes: bytes as u64 };
        self.state.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.commands.send(Command::Send(events, bytes)).map_err(|_| ended())?;
        Ok(stats)
    }

    /// Commits the open unit and returns once it is: on this thread when nothing is in flight,
    /// else on the delivery thread after every earlier flush (whose reports this takes).
    fn flush(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        if let Some(e) = self.state.failure() {
            return Err(e);
        }
        if self.in_flight == 0 && self.unit != Some(Route::Queued) {
            self.unit = None;
            let flushed = self.state.sink().flush(checkpoint);
            if let Err(e) = &flushed {
                self.state.fail(e);
                // Not here: a Kafka abort may wait for the broker.
                let _ = self.commands.send(Command::Abort);
            }
            return flushed;
        }
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

    /// Gives up on the open unit and everything queued: the thread skips what is queued and
    /// aborts the unit; every later send and flush fails. The caller drops the `DeliveryThread`
    /// next.
    fn abort(&mut self) {
        self.state.fail(&SinkError { class: ErrorClass::Retry, message: "delivery abandoned".into() });
        self.unit = None;
        let _ = self.commands.send(Command::Abort);
    }

    fn delivery_mode(&self) -> DeliveryMode {
        self.mode
    }

    fn hold_until(&self) -> Option<Instant> {
        match self.state.sink.try_lock() {
            Ok(sink) => sink.hold_until(),
            Err(_) => None,
        }
    }
}

/// Dropping it ends the thread and closes the sink before it returns, waiting at most
/// [`CLOSE_GRACE`]: what is still queued is skipped, the open unit aborted. A process must not
/// exit while the thread is inside the sink: a Kafka producer over TLS that was still being torn
/// down on the thread when the worker exited crashed in exit()'s cleanup (SIGSEGV), and the
/// postmaster then restarted every backend. A thread still busy after the grace (a sink stuck in
/// a call it cannot interrupt) is left behind, as before this wait existed.
impl Drop for DeliveryThread {
    fn drop(&mut self) {
        self.shut();
    }
}

impl DeliveryThread {
    /// Closes the thread as dropping it does, and returns the reports of the flushes it finished
    /// and nobody took, in the order they were started: a unit whose report says it committed is
    /// at the destination, though the caller gives up on what it handed over (its counts must
    /// not be lost with the reports).
    pub fn close(mut self) -> Vec<Flushed> {
        self.shut();
        std::iter::from_fn(|| self.done.try_recv().ok()).collect()
    }

    /// See the Drop impl; a second call does nothing more.
    fn shut(&mut self) {
        self.state.fail(&SinkError { class: ErrorClass::Retry, message: "the sink is closing".into() });
        if self.unit.take().is_some() {
            // A unit sent directly is open in the sink: the thread aborts it before it ends.
            let _ = self.commands.send(Command::Abort);
        }
        // Hang up: the thread ends once it has taken what is queued.
        drop(std::mem::replace(&mut self.commands, mpsc::channel().0));
        let Some(thread) = self.thread.take() else { return };
        drop(join_within(vec![thread], CLOSE_GRACE));
    }
}

/// Waits at most `limit` for `threads` to end and joins those that did (what they return is
/// dropped, so closed, on the caller's thread); returns their results, and the threads still
/// running, left behind. A process must not exit while a thread of its runs inside librdkafka,
/// OpenSSL or a cloud client: exit()'s cleanup then crashes it (SIGSEGV), and the postmaster
/// restarts every backend.
pub fn join_within<T>(
    threads: Vec<std::thread::JoinHandle<T>>,
    limit: Duration,
) -> (Vec<std::thread::Result<T>>, Vec<std::thread::JoinHandle<T>>) {
    let deadline = Instant::now() + limit;
    while threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let (done, running): (Vec<_>, Vec<_>) = threads.into_iter().partition(|t| t.is_finished());
    (done.into_iter().map(std::thread::JoinHandle::join).collect(), running)
}

/// The delivery thread: takes commands in order until the reading side hangs up. The events it
/// sent go back to the reading thread to be freed there: they were allocated there, and glibc
/// frees a block in the arena of the thread that allocated it, under that arena's lock, so freeing
/// them here made the two threads contend for the reading thread's arena (measured: a backlog
/// drained at 86k events/s and 1.31 CPU s per 100k, 130k and 0.90 with them freed there).
fn serve(
    state: &State,
    commands: &mpsc::Receiver<Command>,
    done: &mpsc::Sender<Flushed>,
    back: &mpsc::Sender<Vec<Event>>,
) {
    // Sent through the queue since the last flush: a unit is open in the sink.
    let mut open = false;
    while let Ok(command) = commands.recv() {
        let skip = state.failure().is_some();
        match command {
            Command::Send(events, bytes) => {
                if !skip {
                    open = true;
                    let mut sink = state.sink();
                    if let Err(e) = sink.send(&events) {
                        state.fail(&e);
                        sink.abort();
                        open = false;
                    }
                }
                state.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
                let _ = back.send(events);
            }
            Command::Flush(checkpoint) => {
                let result = match state.failure() {
                    Some(e) => Err(e),
                    None => {
                        let mut sink = state.sink();
                        let r = sink.flush(checkpoint);
                        if let Err(e) = &r {
                            state.fail(e);
                            // A failed flush leaves its unit open (a Kafka transaction).
                            sink.abort();
                        }
                        r
                    }
                };
                open = false;
                // The reading side may be gone; what is left (an abort) is still done.
                let _ = done.send(Flushed { checkpoint, result, at_unix_micros: unix_micros_now() });
            }
            Command::Abort => {
                state.sink().abort();
                open = false;
            }
            Command::Discard(done) => {
                if open && !skip {
                    state.sink().abort();
                }
                open = false;
                let _ = done.send(());
            }
        }
    }
    if open {
        state.sink().abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
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
            tombstone: false,
            topic_version: None,
            schema_version: None,
            routes: Vec::new(),
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
    fn a_failed_send_behind_a_flush_is_reported_by_its_own_flush_and_the_unit_is_aborted() {
        let mut r = rig(false, QUEUE_BYTES);
        r.sink.lock().unwrap().fault = Some(SinkFault::Send(3, ErrorClass::Operator));
        r.thread.send_owned(vec![event(1, 10)]).unwrap();
        r.thread.start_flush(cp(2)).unwrap();
        // Queued behind the flush in flight: the failure comes back with the unit's flush.
        r.thread.send_owned(vec![event(10, 10)]).unwrap();
        r.thread.send_owned(vec![event(11, 10)]).unwrap();
        r.thread.start_flush(cp(20)).unwrap();
        assert_eq!(r.thread.wait_flushed(WAIT).unwrap().result, Ok(()));
        let f = r.thread.wait_flushed(WAIT).unwrap();
        assert_eq!(f.result.unwrap_err().class, ErrorClass::Operator);
        assert_eq!(r.sink.lock().unwrap().committed.len(), 1, "only the unit before");
        assert_eq!(r.sink.lock().unwrap().aborted, 1);
    }

    #[test]
    fn with_nothing_in_flight_a_unit_goes_to_the_sink_directly() {
        let mut r = rig(false, QUEUE_BYTES);
        r.sink.lock().unwrap().fault = Some(SinkFault::Send(2, ErrorClass::Operator));
        r.thread.send_owned(vec![event(1, 10)]).unwrap();
        // Sent on this thread: in the sink when send returns, and a failure comes back at once.
        assert_eq!(r.sink.lock().unwrap().open_unit.len(), 1);
        assert_eq!(r.thread.send_owned(vec![event(2, 10)]).unwrap_err().class, ErrorClass::Operator);
        assert!(r.thread.flush(cp(3)).is_err());
        r.thread.abort();
        let deadline = Instant::now() + WAIT;
        while r.sink.lock().unwrap().aborted == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(r.sink.lock().unwrap().aborted, 1, "aborted on the delivery thread");
        assert!(r.sink.lock().unwrap().committed.is_empty());
    }

    #[test]
    fn a_discarded_unit_is_aborted_in_order_and_the_sink_takes_the_next_one() {
        let mut r = rig(true, QUEUE_BYTES);
        r.thread.send_owned(vec![event(1, 10)]).unwrap();
        r.thread.start_flush(cp(2)).unwrap();
        r.flushing.recv_timeout(WAIT).unwrap();
        // Queued behind the flush held in the sink: giving it up waits for the flush's report.
        r.thread.send_owned(vec![event(10, 10)]).unwrap();
        assert!(r.thread.discard().is_err(), "a flush is in flight");
        assert_eq!(r.thread.send_owned(vec![event(11, 10)]).unwrap_err().message, "delivery abandoned");

        // The same once the flush is reported: the queued unit is aborted, the sink stays.
        let mut r = rig(true, QUEUE_BYTES);
        r.thread.send_owned(vec![event(1, 10)]).unwrap();
        r.thread.start_flush(cp(2)).unwrap();
        r.flushing.recv_timeout(WAIT).unwrap();
        r.thread.send_owned(vec![event(10, 10)]).unwrap();
        r.go.send(()).unwrap();
        assert_eq!(r.thread.wait_flushed(WAIT).unwrap().result, Ok(()));
        r.thread.discard().unwrap();
        assert_eq!(r.sink.lock().unwrap().aborted, 1, "aborted on the thread before discard returned");
        assert!(r.sink.lock().unwrap().open_unit.is_empty());
        // The next unit goes directly (nothing in flight), then a directly sent unit is discarded.
        r.thread.send_owned(vec![event(20, 10)]).unwrap();
        r.thread.discard().unwrap();
        assert_eq!(r.sink.lock().unwrap().aborted, 2);
        r.thread.send_owned(vec![event(30, 10)]).unwrap();
        r.go.send(()).unwrap();
        r.thread.flush(cp(31)).unwrap();
        let sink = r.sink.lock().unwrap();
        let lsns: Vec<Vec<u64>> = sink.committed.iter().map(|(e, _)| e.iter().map(|e| e.lsn.0).collect()).collect();
        assert_eq!(lsns, [vec![1], vec![30]], "what was discarded never commits");
    }

    /// A rig whose sink is held inside the flush of a unit of event 1, with a unit of event 10
    /// queued behind it.
    fn held_flush_and_one_queued() -> Rig {
        let mut r = rig(true, QUEUE_BYTES);
        r.thread.send_owned(vec![event(1, 10)]).unwrap();
        r.thread.start_flush(cp(2)).unwrap();
        r.flushing.recv_timeout(WAIT).unwrap();
        r.thread.send_owned(vec![event(10, 10)]).unwrap();
        r
    }

    #[test]
    fn after_an_abort_what_is_queued_is_skipped_and_nothing_more_is_taken() {
        let r = held_flush_and_one_queued();
        let mut thread = r.thread;
        // What is queued behind the flush held in the sink is abandoned.
        thread.abort();
        assert_eq!(thread.send_owned(vec![event(11, 10)]).unwrap_err().message, "delivery abandoned");
        assert!(thread.start_flush(cp(20)).is_err());
        r.go.send(()).unwrap();
        drop(thread);
        let deadline = Instant::now() + WAIT;
        while r.sink.lock().unwrap().aborted == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let sink = r.sink.lock().unwrap();
        assert_eq!(sink.sends, vec![1], "what was queued after the flush never reached the sink");
        assert_eq!(sink.aborted, 1);
    }

    /// The threads that end within the limit are joined (their results handed back), the one
    /// that does not is left running and handed back as is, once the limit passed.
    #[test]
    fn join_within_joins_what_ended_and_leaves_what_did_not() {
        let (release, held) = mpsc::channel::<()>();
        let threads = vec![
            std::thread::spawn(|| 1),
            std::thread::spawn(move || held.recv().map_or(0, |()| 2)),
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                3
            }),
        ];
        let started = Instant::now();
        let (done, running) = join_within(threads, Duration::from_millis(300));
        assert!(started.elapsed() >= Duration::from_millis(300), "waited the limit for the held one");
        let mut got: Vec<i32> = done.into_iter().map(|r| r.expect("no panic")).collect();
        got.sort_unstable();
        assert_eq!(got, [1, 3]);
        assert_eq!(running.len(), 1);
        release.send(()).expect("the held thread listens");
        let (done, running) = join_within(running, Duration::from_secs(10));
        assert_eq!(done.into_iter().map(|r| r.expect("no panic")).collect::<Vec<_>>(), [2]);
        assert!(running.is_empty());
    }

    /// Dropping it returns only once the thread ended and the sink was closed: a worker that
    /// exits right after must not leave the sink's client running on the thread (a Kafka producer
    /// over TLS torn down there while the process exited crashed the worker). Deterministic: the
    /// sink is held inside a flush until after `drop` was called, so without the wait `drop`
    /// returns while the thread still holds the sink.
    #[test]
    fn dropping_it_waits_for_the_thread_and_closes_the_sink() {
        let r = held_flush_and_one_queued();
        let thread = r.thread;
        // What is queued behind the flush is skipped, never sent, once the thread is told to close.
        let go = r.go.clone();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            go.send(()).unwrap();
        });
        let started = Instant::now();
        drop(thread);
        assert!(started.elapsed() >= Duration::from_millis(150), "drop waited for the flush held in the sink");
        assert_eq!(Arc::strong_count(&r.sink), 1, "the sink was closed (dropped) before drop returned");
        let sink = r.sink.lock().unwrap();
        assert_eq!(sink.sends, vec![1], "what was queued when it was dropped never reached the sink");
        release.join().unwrap();
    }

    #[test]
    fn flush_as_a_sink_waits_for_its_own_commit() {
        let mut r = rig(false, QUEUE_BYTES);
        let tx = vec![crate::frame::Transaction {
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
