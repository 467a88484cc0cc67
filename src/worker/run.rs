//! One sink's runtime state in its worker: its driver (`cdc_core::driver`) and what only the worker
//! holds (its decoding session, a producer being opened, a keyless table's cursor).
use cdc_core::driver::Driver;
use cdc_core::failpoint::Armed;
use cdc_core::pipeline::Assembler;
use cdc_core::state::SinkState;
use cdc_core::Lsn;
use cdc_sinks::open::Opening;
use cdc_sinks::{parse_config, SinkConfig};

use super::configs::Keys;
use super::decoding::{Membership, Session};
use super::env::Host;
use super::keyless;
use super::source::SinkRow;
use crate::{gucs, lookups};

/// Runtime state of one sink.
pub struct SinkRun {
    /// Its catalog row.
    pub(super) row: SinkRow,
    /// Its config, or why it cannot be read.
    pub(super) config: Result<SinkConfig, String>,
    /// Its delivery: destination, units handed over and delivered, snapshot, failures, state.
    pub(super) driver: Driver,
    /// The producer being opened, when it is.
    pub(super) opening: Option<Opening>,
    /// Its decoding session (holds the slot), open from the first read until a failure: its own
    /// decoding, or a fast-forward one while it reads the shared decoding's log.
    pub(super) session: Option<Session>,
    /// Its reads of the shared decoding's log, when it reads it.
    pub(super) membership: Membership,
    /// The keyless table's snapshot whose pieces it is delivering (see [`super::keyless`]).
    pub(super) keyless: Option<keyless::Plan>,
}

impl SinkRun {
    /// A sink's runtime state from its catalog row: its config parsed, and an assembler for it
    /// (its format with the server's schema registry when its config names none, the keys, the
    /// lookup copies in the extension's `schema`).
    pub(super) fn new(
        row: &SinkRow,
        database: &str,
        registry: Option<&str>,
        keys: &Keys,
        schema: Option<&str>,
    ) -> SinkRun {
        let config = parse_config(&row.sink_type, &row.config).map_err(|e| e.to_string());
        let mut assembler = Assembler::new(database);
        assembler.set_sink_name(&row.name);
        if let Ok(c) = &config {
            assembler.set_transformations(c.common().include_transformations);
            assembler.set_partition_key(c.common().partition_key.clone());
            assembler.set_format(c.event_format(database, registry.map(str::to_string), env!("CARGO_PKG_VERSION")));
        }
        assembler.set_token_key(keys.token_key.clone());
        assembler.set_context_key(keys.context_key.clone());
        if let Some(schema) = schema {
            let copy = lookups::Copy { schema: schema.to_string(), sink_id: row.id.clone() };
            assembler.lookups_mut().set_source(Box::new(copy));
        }
        let driver = Driver::new(assembler, (SinkState::parse(&row.state), row.last_error.clone()));
        SinkRun {
            row: row.clone(),
            config,
            driver,
            opening: None,
            session: None,
            membership: Membership::default(),
            keyless: None,
        }
    }

    /// The driver and its host for one call: the port borrows the session, the driver the rest.
    pub(super) fn split<'a>(&'a mut self, schema: &'a str, failpoint: &'a Armed) -> (&'a mut Driver, Host<'a>) {
        let host = Host { schema, row: &self.row, session: self.session.as_mut(), failpoint };
        (&mut self.driver, host)
    }

    /// Its destination was opened: the first time in this run, where it stood then.
    pub(super) fn note_opened(&mut self, confirmed: Lsn) {
        self.driver.note_opened(confirmed, gucs::TEST_SNAPSHOT_IGNORE_CHECKPOINT.get());
    }
}

/// Confirms what a sink delivered since the last confirm (see `Driver::confirm_delivered`); a
/// failure is only logged (the next worker or session reads the unconfirmed tail again).
pub(super) fn confirm_or_warn(schema: Option<&str>, run: &mut SinkRun, failpoint: &Armed, confirmed: Lsn) {
    let Some(schema) = schema else { return };
    let (driver, mut host) = run.split(schema, failpoint);
    if let Err(e) = driver.confirm_delivered(&mut host, confirmed) {
        pgrx::warning!("pg_cdc sink \"{}\": cannot confirm replication slot {}: {e}", run.row.name, run.row.slot);
    }
}
