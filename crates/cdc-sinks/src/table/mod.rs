//! The in-database sink (`table`): events written to a table of the source database, read with
//! SELECT and consumed in order with `cdc_consume`, which returns a batch and acknowledges it in
//! the caller's transaction.
//!
//! Exactly-once: the events of a delivery unit and the sink's checkpoint are written in the
//! read's own transaction ([`Sink::in_source_database`]), so they commit together or not at all;
//! after a crash the checkpoint tells which transactions are in the table already. The worker
//! stores them through the [`EventStore`] port (SPI, in the extension); the SQL it runs is here.
//!
//! ```text
//!  read (one PostgreSQL transaction): decode ─▶ send: INSERT events ─▶ flush: UPDATE checkpoint ─▶ COMMIT
//!  then: confirm the slot (a crash before it re-reads; the checkpoint skips what is stored)
//! ```
pub mod config;

use cdc_core::envelope::Event;

use crate::{Checkpoint, DeliveryMode, PublishStats, Sink, SinkError};

/// The columns of an event table, as `cdc_add_sink` creates it. `event_id` orders the events in
/// commit order (one writer, one transaction per delivery unit); `(commit_lsn, event_index)` is the
/// event's identity in the source.
pub const TABLE_COLUMNS: &str = "event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    commit_lsn pg_lsn NOT NULL,
    event_index integer NOT NULL,
    lsn pg_lsn NOT NULL,
    table_name text NOT NULL,
    operation text NOT NULL,
    event_key jsonb,
    event jsonb NOT NULL,
    delivered_at timestamptz NOT NULL DEFAULT now()";

/// The statement that creates an event table (`table` as the config wrote it, checked by
/// [`config::parse`]). A BRIN index on `delivered_at` keeps the retention's age cut cheap.
pub fn create_sql(table: &str) -> String {
    format!("CREATE TABLE {table} ({TABLE_COLUMNS});\nCREATE INDEX ON {table} USING brin (delivered_at)")
}

/// The statement that appends events: one row per array element of `$1` commit LSNs (int8),
/// `$2` indexes (int4), `$3` LSNs (int8), `$4` table names, `$5` operations, `$6` keys and `$7`
/// events (JSON text), in order.
pub fn insert_sql(event_table: &str) -> String {
    format!(
        "INSERT INTO {event_table} (commit_lsn, event_index, lsn, table_name, operation, event_key, event)
         SELECT '0/0'::pg_lsn + c::numeric, i, '0/0'::pg_lsn + l::numeric, t, o, k::jsonb, e::jsonb
           FROM unnest($1::int8[], $2::int4[], $3::int8[], $4::text[], $5::text[], $6::text[], $7::text[])
                WITH ORDINALITY AS u(c, i, l, t, o, k, e, n)
          ORDER BY n"
    )
}

/// The statement that removes events past the retention: older than `$1` hours, or beyond the
/// newest `$2` events (`$2` NULL: no count limit). Returns the highest event_id removed (NULL:
/// none), which the caller records as `trimmed_upto` so consumers learn what they missed.
pub fn trim_sql(event_table: &str) -> String {
    format!(
        "WITH cut AS (
             SELECT greatest((SELECT max(event_id) FROM {event_table}
                               WHERE delivered_at < now() - make_interval(hours => $1)),
                             (SELECT max(event_id) - $2 FROM {event_table})) AS upto),
         gone AS (DELETE FROM {event_table} e USING cut WHERE e.event_id <= cut.upto RETURNING e.event_id)
         SELECT max(event_id) FROM gone"
    )
}

/// Where an in-database sink keeps its events and its checkpoint: the worker's SPI adapter, or a
/// double in the tests. Every call runs in the read's transaction.
pub trait EventStore {
    /// Appends `events` to the event table, in order.
    fn insert(&mut self, events: &[Event]) -> Result<(), SinkError>;
    /// Stores the sink's checkpoint.
    fn save_checkpoint(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError>;
    /// The checkpoint stored last.
    fn load_checkpoint(&mut self) -> Result<Option<Checkpoint>, SinkError>;
    /// Housekeeping before a read (the worker's store trims the event table when due).
    fn maintain(&mut self) {}
}

impl<S: EventStore + ?Sized> EventStore for Box<S> {
    fn insert(&mut self, events: &[Event]) -> Result<(), SinkError> {
        (**self).insert(events)
    }
    fn save_checkpoint(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        (**self).save_checkpoint(checkpoint)
    }
    fn load_checkpoint(&mut self) -> Result<Option<Checkpoint>, SinkError> {
        (**self).load_checkpoint()
    }
    fn maintain(&mut self) {
        (**self).maintain()
    }
}

/// The in-database sink over its store.
pub struct TableSink<S> {
    store: S,
    /// Events sent since the last flush.
    sent: u64,
}

impl<S: EventStore> TableSink<S> {
    /// A sink writing through `store`.
    pub fn new(store: S) -> Self {
        TableSink { store, sent: 0 }
    }

    /// Its store.
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }
}

impl<S: EventStore> Sink for TableSink<S> {
    fn open(&mut self) -> Result<Option<Checkpoint>, SinkError> {
        self.store.load_checkpoint()
    }

    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        if events.is_empty() {
            return Ok(PublishStats::default());
        }
        self.store.insert(events)?;
        self.sent += events.len() as u64;
        let bytes = events.iter().map(|e| (e.payload.len() + e.key.as_ref().map_or(0, Vec::len)) as u64).sum();
        Ok(PublishStats { events: events.len() as u64, bytes })
    }

    fn flush(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        // Nothing sent: no checkpoint either (see Sink::in_source_database).
        if std::mem::take(&mut self.sent) > 0 {
            self.store.save_checkpoint(checkpoint)?;
        }
        Ok(())
    }

    fn abort(&mut self) {
        // The caller rolls the read's transaction back, and the inserts with it.
        self.sent = 0;
    }

    fn delivery_mode(&self) -> DeliveryMode {
        DeliveryMode::ExactlyOnce
    }

    fn in_source_database(&self) -> bool {
        true
    }

    fn maintain(&mut self) {
        self.store.maintain();
    }
}

#[cfg(test)]
mod tests;
