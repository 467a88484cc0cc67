//! The worker's side of a sink's driver ([`cdc_core::driver::DriverPort`]): the catalog through
//! SPI, the slot through the sink's decoding session, the counters and latencies in shared memory,
//! the log, the test failpoint and the stop request.
use std::collections::HashMap;
use std::time::Duration;

use cdc_core::deliver::read::{Sent, TableProgress};
use cdc_core::driver::{DriverPort, RouteProgress, Settings};
use cdc_core::failpoint::{Armed, Failpoint};
use cdc_core::format::Registration;
use cdc_core::lookup::LookupFlush;
use cdc_core::state::SinkState;
use cdc_core::stats::{DeliveryCounters, TableCounters};
use cdc_core::Lsn;
use pgrx::pg_sys;

use super::decoding::Session;
use super::source::{self, SinkRow};
use super::{run_tx, stop_requested};
use crate::{gucs, lookups};

/// The settings a driver step runs with, as the server has them now.
pub fn settings() -> Settings {
    Settings {
        max_backoff: Duration::from_millis(gucs::MAX_RETRY_BACKOFF_MS.get().max(100) as u64),
        heartbeat_interval: Duration::from_millis(gucs::HEARTBEAT_INTERVAL_MS.get().max(100) as u64),
    }
}

/// One sink's host, for one call of its driver.
pub struct Host<'a> {
    /// The extension's schema.
    pub schema: &'a str,
    /// The sink.
    pub row: &'a SinkRow,
    /// Its decoding session, which holds the slot (the slot is confirmed through it).
    pub session: Option<&'a mut Session>,
    /// The armed test failpoint.
    pub failpoint: &'a Armed,
}

impl DriverPort for Host<'_> {
    fn sink_name(&self) -> &str {
        &self.row.name
    }

    fn log(&mut self, message: &str) {
        pgrx::log!("{message}");
    }

    fn write_state(&mut self, state: SinkState, error: Option<&str>) -> Result<(), String> {
        if self.schema.is_empty() {
            return Err("the extension's schema is not known yet".into());
        }
        let (schema, id) = (self.schema, self.row.id.as_str());
        run_tx(|| source::set_state(schema, id, state.label(), error))
    }

    fn counters(&mut self, f: &mut dyn FnMut(&mut DeliveryCounters)) {
        crate::stats::update(&self.row.id, |c| f(c));
    }

    fn add_tables(&mut self, counts: &HashMap<u32, TableCounters>) {
        crate::stats::add_tables(&self.row.id, counts);
    }

    fn record_latencies(&mut self, sent: &[Sent], acked: i64) {
        record_latencies(&self.row.id, sent, acked);
    }

    fn save_lookups(&mut self, flush: &[LookupFlush]) -> Result<(), String> {
        let (schema, id) = (self.schema, self.row.id.as_str());
        run_tx(|| lookups::write(schema, id, flush))
    }

    fn confirm(
        &mut self,
        lsn: Lsn,
        progress: &HashMap<u32, TableProgress>,
        routes: &RouteProgress,
        registrations: &[Registration],
    ) -> Result<(), String> {
        let Some(session) = self.session.as_deref_mut() else {
            return Err("the slot's decoding session is gone".into());
        };
        let (schema, name) = (self.schema, self.row.name.as_str());
        run_tx(|| {
            source::record_progress(schema, name, progress);
            source::record_route_progress(schema, name, routes);
            source::record_registrations(schema, registrations);
            session.confirm(lsn);
        })
    }

    fn committed_at_destination(&mut self) {
        if self.failpoint.fires(Failpoint::AfterSinkCommit, &self.row.name) && still_armed(&self.row.name) {
            pgrx::log!(
                "pg_cdc worker: failpoint after_sink_commit of sink \"{}\": exiting before the slot is confirmed",
                self.row.name
            );
            // SAFETY: ends this process on purpose (test failpoint); the postmaster restarts it.
            unsafe { pg_sys::proc_exit(1) };
        }
    }

    fn stop_requested(&self) -> bool {
        stop_requested()
    }
}

/// Records the latencies of a delivery acknowledged at `acked` (Unix microseconds): per event,
/// publish (handed over -> acknowledged) and end to end (committed -> acknowledged) for the sink,
/// capture (committed -> handed over) and end to end for each table. Clock differences between
/// the commit and the worker (none: same server) never make a latency negative.
fn record_latencies(sink_id: &str, sent: &[Sent], acked: i64) {
    if sent.is_empty() {
        return;
    }
    let since = |from: i64, to: i64| (to - from).max(0) as u64;
    let mut sink = crate::stats::SinkLatency::default();
    let mut tables: HashMap<u32, crate::stats::TableLatency> = HashMap::new();
    for s in sent {
        let (capture, publish, end_to_end) = (
            since(s.commit_unix_micros, s.sent_unix_micros),
            since(s.sent_unix_micros, acked),
            since(s.commit_unix_micros, acked),
        );
        for &(oid, n) in &s.tables {
            sink.publish.record_n(publish, n);
            sink.end_to_end.record_n(end_to_end, n);
            let t = tables.entry(oid).or_default();
            t.capture.record_n(capture, n);
            t.end_to_end.record_n(end_to_end, n);
        }
    }
    crate::stats::add_latencies(sink_id, &sink, &tables);
}

/// Reads `cdc.test_failpoint` again when it changed from `current` (its text, and what it arms):
/// a refused value arms nothing and is logged once. Arming is logged, so a test knows when the
/// worker has it.
/// Whether `after_sink_commit` of `sink` is still armed now: a reload the postmaster signalled since
/// the worker last read its settings (it reads them at the top of its loop) may have disarmed it.
/// The settings are read again first, so a test that saw the reload reach new sessions knows no
/// worker fires after it.
fn still_armed(sink: &str) -> bool {
    if pgrx::bgworkers::BackgroundWorker::sighup_received() {
        // SAFETY: the documented way for a background worker to reload postgresql.conf (on its
        // main thread, between transactions of the delivery); a sink worker's loop does nothing
        // else on a reload.
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
    Armed::parse(&gucs::string(&gucs::TEST_FAILPOINT)).is_ok_and(|a| a.fires(Failpoint::AfterSinkCommit, sink))
}

pub fn refresh_failpoint(current: &mut (String, Armed), who: &str) {
    let text = gucs::string(&gucs::TEST_FAILPOINT);
    if text == current.0 {
        return;
    }
    let armed = Armed::parse(&text).unwrap_or_else(|e| {
        pgrx::warning!("{who}: {e}; no failpoint is armed");
        Armed::default()
    });
    if armed != Armed::default() {
        pgrx::log!("{who}: test failpoint {} armed", text.trim());
    }
    *current = (text, armed);
}
