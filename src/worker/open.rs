//! Opening a sink's destination from the worker: `cdc_sinks::open` with what the catalog and the
//! server settings say (an [`OpenContext`]), in the read's transaction for the sinks that open
//! quickly (the in-database sink over SPI, a webhook), else on a thread of its own that the
//! worker's steps wait for without blocking; a producer that finished opening is installed on a
//! delivery thread.
use std::collections::HashMap;
use std::time::Duration;

use cdc_core::deliver::handoff::{join_within, DeliveryThread};
use cdc_core::deliver::protocol::{self, SlotView};
use cdc_core::deliver::read::Failure;
use cdc_core::driver::Producer;
use cdc_core::state::SinkState;
use cdc_core::Lsn;
use cdc_sinks::kinesis::aws::Defaults;
use cdc_sinks::open::{with_signals_blocked, OpenContext, Opening, ServerSettings};
use cdc_sinks::postgres::SourceTable;
use cdc_sinks::table::EventStore;
use cdc_sinks::{ErrorClass, SinkConfig, SinkError};

use super::run::SinkRun;
use super::source::{self, Catalog};
use super::stop_requested;
use super::table_sink::SpiStore;
use crate::gucs;

/// Opens a sink that opens quickly in the read's transaction (see `cdc_sinks::open`; an
/// in-database sink writes through SPI) and installs it. Returns true when the sink has a
/// snapshot to deliver and was opened for the first time in this run: where it stands decides
/// whether a chunk in flight was delivered, so it reads the next chunk before delivering anything.
/// A sink that opens on its own thread is left alone here.
pub(super) fn open_in_place(
    run: &mut SinkRun,
    schema: &str,
    config: &SinkConfig,
    confirmed: Lsn,
) -> Result<bool, Failure> {
    let row = &run.row;
    let opened = cdc_sinks::open::open_in_place(config, |cfg| {
        SpiStore::open(schema, &row.id, cfg).map(|s| Box::new(s) as Box<dyn EventStore>)
    })
    .map_err(Failure::sink)?;
    let Some((sink, checkpoint)) = opened else { return Ok(false) };
    run.driver.checkpoint = checkpoint;
    run.driver.producer = Some(Producer::InPlace(sink));
    let first_open = run.driver.opened_at.is_none();
    run.note_opened(confirmed);
    Ok(run.driver.snapshotting == Some(true) && first_open)
}

/// What opening a sink needs besides its config, from the catalog and the server settings.
fn open_context(run: &SinkRun, cat: &Catalog) -> OpenContext {
    let setting = |g| Some(gucs::string(g)).filter(|s| !s.trim().is_empty());
    // The sink's tables: their keys, and their schema histories (an apply sink creates and
    // alters its target tables from them).
    let source_tables: HashMap<u32, SourceTable> = cat
        .tables
        .iter()
        .filter(|t| run.row.carries(t.oid))
        .map(|t| {
            let history = t.history.as_ref().map(source::history).unwrap_or_default();
            (t.oid, SourceTable { key_columns: t.key_columns.clone(), history })
        })
        .collect();
    OpenContext {
        sink_id: run.row.id.clone(),
        sink_name: run.row.name.clone(),
        slot: run.row.slot.clone(),
        system_identifier: cat.system_identifier.clone(),
        database: cat.database.clone(),
        database_oid: cat.database_oid,
        settings: ServerSettings {
            kafka_bootstrap_servers: gucs::string(&gucs::KAFKA_BOOTSTRAP_SERVERS),
            kinesis: Defaults { region: setting(&gucs::AWS_REGION), endpoint: setting(&gucs::KINESIS_ENDPOINT) },
            pubsub_endpoint: setting(&gucs::PUBSUB_ENDPOINT),
            pulsar_reuse_producer_name: gucs::TEST_PULSAR_REUSE_PRODUCER_NAME.get(),
            apply_shuffle: i64::from(gucs::TEST_APPLY_SHUFFLE.get()),
        },
        delegated: run.row.delegated,
        source_tables,
        interrupt: Some(stop_requested),
    }
}

/// Starts opening a sink on its own thread (see `cdc_sinks::open::start_open`): a slow or
/// unreachable destination stalls no other sink.
pub(super) fn start_open(run: &SinkRun, config: &SinkConfig, cat: &Catalog) -> Result<Opening, SinkError> {
    cdc_sinks::open::start_open(config, &open_context(run, cat))
}

/// Installs a producer that finished opening, refusing a slot ahead of its checkpoint.
pub(super) fn finish_open(run: &mut SinkRun, opening: Opening, slot: &SlotView) -> Result<(), Failure> {
    let opened = opening.join().unwrap_or_else(|_| {
        Err(SinkError { class: ErrorClass::Retry, message: "opening the sink failed unexpectedly".into() })
    });
    let (opened, checkpoint) = opened.map_err(Failure::sink)?;
    protocol::check_checkpoint(slot, checkpoint, false)?;
    run.driver.checkpoint = checkpoint;
    run.note_opened(slot.confirmed);
    // The delivery thread touches nothing of PostgreSQL and starts with every signal blocked.
    let mut thread = with_signals_blocked(|| DeliveryThread::start(opened))
        .map_err(|e| Failure::new(SinkState::Retrying, format!("cannot start the sink's delivery thread: {e}")))?;
    thread.set_interrupt(stop_requested);
    run.driver.producer = Some(Producer::Threaded(thread));
    Ok(())
}

/// Waits, at most `limit`, for `threads` still opening a sink, and closes what they opened. A
/// process that exits while such a thread runs inside librdkafka or a cloud client crashes in
/// exit()'s cleanup (SIGSEGV), and the postmaster then restarts every backend: a sink dropped
/// right after it was added did that.
pub(super) fn wait_for(threads: Vec<Opening>, limit: Duration, who: &str) {
    // What the finished ones opened (a producer, a client) is dropped, so closed, on this thread.
    let (done, running) = join_within(threads, limit);
    drop(done);
    if !running.is_empty() {
        pgrx::warning!("{who}: {} sink(s) still opening after {} s; exiting anyway", running.len(), limit.as_secs());
    }
}
