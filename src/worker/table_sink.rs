//! The in-database sink's store (`cdc_sinks::table::EventStore`) over SPI: its events and its
//! checkpoint are written in the read's own transaction, so they commit together. The sink's
//! logic and its SQL live in `crates/cdc-sinks/src/table/`.
use std::time::{Duration, Instant};

use cdc_core::envelope::Event;
use cdc_sinks::table::config::TableSinkConfig;
use cdc_sinks::table::{insert_sql, trim_sql, EventStore};
use cdc_sinks::{Checkpoint, ErrorClass, SinkError};
use pgrx::{pg_sys, JsonB};

use crate::catalog;

/// How often a sink's retention runs.
const TRIM_EVERY: Duration = Duration::from_secs(60);

/// One in-database sink's event table and checkpoint row.
pub struct SpiStore {
    schema: String,
    sink_id: String,
    /// `INSERT` into the event table (its name as regclass prints it, resolved from its OID).
    insert: String,
    /// The retention's `DELETE`.
    trim: String,
    retention_hours: i32,
    retention_events: Option<i64>,
    last_trim: Option<Instant>,
    /// The event table's owner when it is not a superuser (a `cdc_admin` member added the sink):
    /// the worker writes and trims the table as that role, so a trigger its owner puts on it runs
    /// with the owner's rights, never the worker's.
    owner: Option<pg_sys::Oid>,
}

impl SpiStore {
    /// Finds the sink's event table (by OID: a rename is harmless). Runs SPI: call it inside a
    /// transaction.
    pub fn open(schema: &str, sink_id: &str, cfg: &TableSinkConfig) -> Result<SpiStore, SinkError> {
        let found = catalog::json(
            &format!(
                "SELECT jsonb_build_object('table', c.oid::regclass::text,
                        'owner', CASE WHEN NOT r.rolsuper THEN c.relowner::bigint END)
                   FROM {schema}._cdc_table_sinks t JOIN pg_class c ON c.oid = t.event_table
                   JOIN pg_roles r ON r.oid = c.relowner
                  WHERE t.sink_id = $1::uuid"
            ),
            &[sink_id.into()],
        );
        let table = found.as_ref().map(|f| catalog::str_field(f, "table").to_string()).ok_or_else(|| SinkError {
            class: ErrorClass::Operator,
            message: format!(
                "the event table of this sink ({}) was dropped: drop and re-add the sink to create it again",
                cfg.table
            ),
        })?;
        Ok(SpiStore {
            schema: schema.to_string(),
            sink_id: sink_id.to_string(),
            insert: insert_sql(&table),
            trim: trim_sql(&table),
            retention_hours: cfg.retention_hours as i32,
            retention_events: cfg.retention_events.map(|n| n.min(i64::MAX as u64) as i64),
            last_trim: None,
            owner: found
                .as_ref()
                .and_then(|f| f.get("owner"))
                .and_then(serde_json::Value::as_u64)
                .map(|o| pg_sys::Oid::from(o as u32)),
        })
    }

    /// Runs `f` (a statement on the event table) as the table's owner when that is not a
    /// superuser, as a restricted operation (no SET ROLE, no temporary objects), the way
    /// PostgreSQL runs a table owner's code in maintenance; else as the worker.
    fn as_owner<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.owner {
            Some(owner) => catalog::as_user(owner, true, f),
            None => f(),
        }
    }

    /// Removes the events past the retention, at most every minute; records how far in
    /// `_cdc_table_sinks.trimmed_upto` (so `cdc_consume` can warn a consumer that missed some).
    /// Runs SPI: call it inside a transaction.
    pub fn trim_if_due(&mut self) {
        if self.last_trim.is_some_and(|t| t.elapsed() < TRIM_EVERY) {
            return;
        }
        self.last_trim = Some(Instant::now());
        let upto = self.as_owner(|| {
            catalog::select_one_write::<i64>(&self.trim, &[self.retention_hours.into(), self.retention_events.into()])
        });
        if let Some(upto) = upto {
            catalog::run(
                &format!(
                    "UPDATE {}._cdc_table_sinks SET trimmed_upto = greatest(trimmed_upto, $2) WHERE sink_id = $1::uuid",
                    self.schema
                ),
                &[self.sink_id.as_str().into(), upto.into()],
            );
        }
    }
}

impl EventStore for SpiStore {
    fn maintain(&mut self) {
        self.trim_if_due();
    }

    fn insert(&mut self, events: &[Event]) -> Result<(), SinkError> {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let commit: Vec<i64> = events.iter().map(|e| e.commit_lsn.0 as i64).collect();
        let index: Vec<i32> = events.iter().map(|e| e.index as i32).collect();
        let lsn: Vec<i64> = events.iter().map(|e| e.lsn.0 as i64).collect();
        let table: Vec<String> = events.iter().map(|e| format!("{}.{}", e.schema, e.table)).collect();
        let op: Vec<&str> = events.iter().map(|e| e.op.as_str()).collect();
        let key: Vec<Option<String>> = events.iter().map(|e| e.key.as_deref().map(text)).collect();
        let payload: Vec<String> = events.iter().map(|e| text(&e.payload)).collect();
        self.as_owner(|| {
            catalog::run(
                &self.insert,
                &[commit.into(), index.into(), lsn.into(), table.into(), op.into(), key.into(), payload.into()],
            )
        });
        Ok(())
    }

    fn save_checkpoint(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        let value: serde_json::Value = serde_json::from_slice(&checkpoint.encode()).unwrap_or_default();
        catalog::run(
            &format!("UPDATE {}._cdc_table_sinks SET checkpoint = $2 WHERE sink_id = $1::uuid", self.schema),
            &[self.sink_id.as_str().into(), JsonB(value).into()],
        );
        Ok(())
    }

    fn load_checkpoint(&mut self) -> Result<Option<Checkpoint>, SinkError> {
        let stored = catalog::json(
            &format!("SELECT checkpoint FROM {}._cdc_table_sinks WHERE sink_id = $1::uuid", self.schema),
            &[self.sink_id.as_str().into()],
        );
        Ok(stored.and_then(|v| Checkpoint::decode(v.to_string().as_bytes())))
    }
}
