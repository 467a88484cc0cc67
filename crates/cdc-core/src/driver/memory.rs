//! In-memory doubles for the driver: a [`DriverPort`] that keeps what it was asked to do, and a
//! sink shared with the test ([`SharedSink`]) whose flushes can be held back, so a test sees what
//! its destination committed while the driver (or its delivery thread) owns it.
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::{DriverPort, RouteProgress};
use crate::deliver::memory::MemorySink;
use crate::deliver::port::{Checkpoint, DeliveryMode, PublishStats, Sink, SinkError};
use crate::deliver::read::{Sent, TableProgress};
use crate::envelope::Event;
use crate::format::Registration;
use crate::lookup::LookupFlush;
use crate::state::SinkState;
use crate::stats::{DeliveryCounters, TableCounters};
use crate::Lsn;

/// A host in memory: the states it wrote, the confirms, the counters, the log.
#[derive(Debug, Default)]
pub struct MemoryPort {
    /// The sink's name.
    pub name: String,
    /// Every state written, in order.
    pub states: Vec<(SinkState, Option<String>)>,
    /// Every confirm: the LSN and the per-table progress written with it.
    pub confirms: Vec<(Lsn, HashMap<u32, TableProgress>)>,
    /// The shared counters.
    pub counters: DeliveryCounters,
    /// Events whose latencies were recorded.
    pub latencies: u64,
    /// Log lines.
    pub log: Vec<String>,
    /// Units committed at the destination (the failpoint's moment).
    pub commits_seen: usize,
    /// Set: the process is asked to stop.
    pub stopping: bool,
    /// Set: writing the state fails (the catalog is unreachable).
    pub state_writes_fail: bool,
    /// Set: confirming fails.
    pub confirms_fail: bool,
}

impl MemoryPort {
    /// A port for the sink `name`.
    pub fn new(name: &str) -> Self {
        MemoryPort { name: name.into(), ..Default::default() }
    }

    /// The last state written.
    pub fn state(&self) -> Option<SinkState> {
        self.states.last().map(|(s, _)| *s)
    }

    /// Where the slot was last confirmed.
    pub fn confirmed(&self) -> Lsn {
        self.confirms.last().map(|(l, _)| *l).unwrap_or_default()
    }
}

impl DriverPort for MemoryPort {
    fn sink_name(&self) -> &str {
        &self.name
    }

    fn log(&mut self, message: &str) {
        self.log.push(message.to_string());
    }

    fn write_state(&mut self, state: SinkState, error: Option<&str>) -> Result<(), String> {
        if self.state_writes_fail {
            return Err("the catalog is unreachable (planned)".into());
        }
        self.states.push((state, error.map(str::to_string)));
        Ok(())
    }

    fn counters(&mut self, f: &mut dyn FnMut(&mut DeliveryCounters)) {
        f(&mut self.counters);
    }

    fn add_tables(&mut self, _counts: &HashMap<u32, TableCounters>) {}

    fn record_latencies(&mut self, sent: &[Sent], _acked: i64) {
        self.latencies += sent.iter().flat_map(|s| &s.tables).map(|(_, n)| n).sum::<u64>();
    }

    fn save_lookups(&mut self, _flush: &[LookupFlush]) -> Result<(), String> {
        Ok(())
    }

    fn confirm(
        &mut self,
        lsn: Lsn,
        progress: &HashMap<u32, TableProgress>,
        _routes: &RouteProgress,
        _registrations: &[Registration],
    ) -> Result<(), String> {
        if self.confirms_fail {
            return Err("the slot cannot be confirmed (planned)".into());
        }
        self.confirms.push((lsn, progress.clone()));
        Ok(())
    }

    fn committed_at_destination(&mut self) {
        self.commits_seen += 1;
    }

    fn stop_requested(&self) -> bool {
        self.stopping
    }
}

/// What a [`SharedSink`] shares with the test.
#[derive(Default)]
struct Gate {
    /// Flushes wait while this is set.
    held: bool,
    /// Flushes waiting now.
    waiting: usize,
}

/// A [`MemorySink`] the test keeps a handle on while the driver (or a delivery thread) owns a
/// clone: its flushes can be held back ([`SharedSink::hold_flushes`]), and it can ask not to be
/// sent to before an instant (a webhook's `Retry-After`).
#[derive(Clone)]
pub struct SharedSink {
    inner: Arc<Mutex<MemorySink>>,
    gate: Arc<(Mutex<Gate>, Condvar)>,
    hold_until: Arc<Mutex<Option<Instant>>>,
    in_source: bool,
}

impl SharedSink {
    /// An empty sink.
    pub fn new(mode: DeliveryMode) -> Self {
        SharedSink {
            inner: Arc::new(Mutex::new(MemorySink::new(mode))),
            gate: Arc::default(),
            hold_until: Arc::default(),
            in_source: false,
        }
    }

    /// The same sink, as one that writes into the source database (flushed inside the read).
    pub fn in_source_database(mut self) -> Self {
        self.in_source = true;
        self
    }

    /// The sink itself (what it committed, what it holds open, its planned fault).
    pub fn sink(&self) -> MutexGuard<'_, MemorySink> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn gate(&self) -> MutexGuard<'_, Gate> {
        self.gate.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Flushes wait from now on until [`SharedSink::release_flushes`].
    pub fn hold_flushes(&self) {
        self.gate().held = true;
    }

    /// Lets the waiting flushes (and the next ones) through.
    pub fn release_flushes(&self) {
        self.gate().held = false;
        self.gate.1.notify_all();
    }

    /// Flushes waiting at the gate now.
    pub fn flushes_waiting(&self) -> usize {
        self.gate().waiting
    }

    /// The destination asks not to be sent to before `at`.
    pub fn set_hold_until(&self, at: Option<Instant>) {
        *self.hold_until.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }
}

impl Sink for SharedSink {
    fn open(&mut self) -> Result<Option<Checkpoint>, SinkError> {
        self.sink().open()
    }

    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        self.sink().send(events)
    }

    fn flush(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        {
            let mut gate = self.gate();
            gate.waiting += 1;
            while gate.held {
                gate = self.gate.1.wait(gate).unwrap_or_else(|e| e.into_inner());
            }
            gate.waiting -= 1;
        }
        self.sink().flush(checkpoint)
    }

    fn abort(&mut self) {
        self.sink().abort()
    }

    fn delivery_mode(&self) -> DeliveryMode {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).mode
    }

    fn hold_until(&self) -> Option<Instant> {
        *self.hold_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn in_source_database(&self) -> bool {
        self.in_source
    }
}
