//! Delivery counters of one sink and the `cdc_delivery_status` document built from them.
//!
//! The extension keeps one [`DeliveryCounters`] per sink in shared memory; the worker adds to it
//! as it reads, deduplicates and commits, and any session reads it. Counting starts when the
//! shared memory is created (server start, or the restart after a database crash); a worker
//! restart keeps the counts.
use serde_json::{json, Value};

use crate::Lsn;

/// Cumulative counts of one sink. Plain data, so it can live in shared memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct DeliveryCounters {
    /// Delivery transactions open now (0 or 1): a Kafka transaction, or the database transaction
    /// of a table sink (exactly-once sinks only).
    pub open_transactions: u64,
    /// Delivery transactions committed (each carries whole PostgreSQL transactions and a checkpoint).
    pub committed_transactions: u64,
    /// Delivery transactions aborted (a failed or interrupted delivery; re-sent later).
    pub aborted_transactions: u64,
    /// End LSN of the last change read from the slot.
    pub read_lsn: u64,
    /// End LSN covered by the last delivery (exactly-once: the last checkpoint the sink committed).
    pub committed_lsn: u64,
    /// Events read again after a restart that a committed delivery already holds.
    pub duplicate_events_detected: u64,
    /// Of those, events not published again.
    pub duplicate_events_filtered: u64,
    /// Events delivered (acknowledged, and committed when exactly-once) for the first time.
    pub events_delivered: u64,
    /// Key + value bytes of those events.
    pub bytes_delivered: u64,
    /// PostgreSQL transactions delivered (with at least one event for this sink).
    pub source_transactions_delivered: u64,
    /// PostgreSQL transactions too large to hold in memory, read in two passes.
    pub large_transactions: u64,
    /// Column values hidden (PII columns and masks) in the events delivered: per event, the hidden
    /// columns that hold a value in its image.
    pub pii_redactions: u64,
    /// Events delivered that carried a `compliance` block (tables with `compliance.redact_pii`).
    pub audit_records: u64,
    /// 1 while the sink holds events back for a compliance reason (a table's events cannot be
    /// redacted as configured: the tokenization key is missing); the reason is its `last_error`.
    pub compliance_hold: u64,
    /// WAL its decoding sessions decoded, bytes (each session from the slot's restart position).
    pub wal_decoded_bytes: u64,
    /// Decoding sessions started (one per worker start, and one after each failure).
    pub decoding_sessions: u64,
    /// 1 while the sink reads the shared decoding's log instead of decoding its slot.
    pub shared_decoding: u64,
    /// Times it started reading the shared decoding's log.
    pub shared_joins: u64,
    /// Frames it read from the shared decoding's log (before its table filter).
    pub log_frames_read: u64,
    /// WAL those frames moved it over (from its position to the furthest frame read): the WAL a
    /// session of its own would have decoded for them, about.
    pub log_wal_bytes: u64,
    /// Reads of the shared decoding's log (one when the decoder wakes it for a change of one of
    /// its tables or a message, and one per `cdc.naptime_ms` otherwise).
    pub log_reads: u64,
    /// Row changes (and TRUNCATEs) of tables the sink does not carry (`tables`), dropped in
    /// decoding before the output plugin formatted them.
    pub changes_skipped: u64,
    /// Reads that ran while the unit before was still being committed on the sink's delivery
    /// thread (decoding and delivery overlapping).
    pub reads_overlapped: u64,
    /// Reads given up at a change newer than the worker's copy of the catalog (a DDL, a capture
    /// or routing change committed just after the copy was read) and read again at once, the
    /// destination kept.
    pub catalog_rereads: u64,
    /// Snapshot rows delivered as READ events (before the sink's filters: rows a filter dropped
    /// count in `cdc_filter_metrics`).
    pub snapshot_rows_delivered: u64,
}

/// Filter and transformation counts of one table in one sink's pipeline (`cdc_filter_metrics`).
/// Plain data, so it can live in shared memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct TableCounters {
    /// Row changes the filter looked at.
    pub changes: u64,
    /// Of those, published (the row matched, entered or left the filter).
    pub matched: u64,
    /// Of those, dropped by the filter.
    pub excluded: u64,
    /// Encoded size (key + value) of the events the filter dropped: what was not sent.
    pub excluded_bytes: u64,
    /// UPDATEs that moved a row into the filter.
    pub entered: u64,
    /// UPDATEs that moved a row out of it (published as DELETE).
    pub left: u64,
    /// Filter or computed-column evaluations that failed (division by zero, overflow, a bad
    /// cast): the row counts as not matching, the computed value as null.
    pub expression_errors: u64,
    /// Events that carried computed columns.
    pub computations: u64,
    /// Events with hidden (masked or PII) columns.
    pub masks: u64,
    /// Events that carried enriched columns.
    pub enrichments: u64,
    /// Lookups made for them (one per `enrich` transformation and event with a key).
    pub lookups: u64,
    /// Of those, answered from the worker's memory (the rest read its persisted copy).
    pub lookup_hits: u64,
    /// Source transactions delivered with at least one event of the table.
    pub transactions: u64,
    /// Events of the table delivered.
    pub events: u64,
    /// Column values hidden in the published events (see [`DeliveryCounters::pii_redactions`]).
    pub pii_redactions: u64,
    /// Published events that carried a `compliance` block.
    pub audit_records: u64,
}

impl TableCounters {
    /// Adds `d` to these counts.
    pub fn add(&mut self, d: &TableCounters) {
        self.changes += d.changes;
        self.matched += d.matched;
        self.excluded += d.excluded;
        self.excluded_bytes += d.excluded_bytes;
        self.entered += d.entered;
        self.left += d.left;
        self.expression_errors += d.expression_errors;
        self.computations += d.computations;
        self.masks += d.masks;
        self.enrichments += d.enrichments;
        self.lookups += d.lookups;
        self.lookup_hits += d.lookup_hits;
        self.transactions += d.transactions;
        self.events += d.events;
        self.pii_redactions += d.pii_redactions;
        self.audit_records += d.audit_records;
    }
}

/// `cdc_filter_metrics(table_name)`: the seed's shape (`filtering`, `transformations`), plus the
/// counts of each sink. Each sink filters the same changes on its own, so the top level reports
/// the sink that has gone furthest (most changes seen), not a sum.
pub fn filter_metrics_json(table: &str, per_sink: &[(String, TableCounters)], counters_since: &str) -> Value {
    let block = |c: &TableCounters| {
        let ratio = if c.changes > 0 { Some(c.matched as f64 / c.changes as f64) } else { None };
        let hit_rate = if c.lookups > 0 { Some(c.lookup_hits as f64 / c.lookups as f64) } else { None };
        json!({
            "filtering": {
                "total_changes": c.changes,
                "filter_matched": c.matched,
                "filter_excluded": c.excluded,
                "filter_ratio": ratio,
                "entered_filter": c.entered,
                "left_filter": c.left,
                "bandwidth_saved_bytes": c.excluded_bytes,
                "bandwidth_saved_gb": c.excluded_bytes as f64 / 1e9,
            },
            "transformations": {
                "enrichments_applied": c.enrichments,
                // Lookups answered from the worker's memory / all lookups (null before the first).
                "enrichment_cache_hit_rate": hit_rate,
                "enrichment_lookups": c.lookups,
                "enrichment_cache_hits": c.lookup_hits,
                "computations_performed": c.computations,
                "masks_applied": c.masks,
                "expression_errors": c.expression_errors,
            },
        })
    };
    let top = per_sink.iter().max_by_key(|(_, c)| c.changes).map(|(_, c)| *c).unwrap_or_default();
    let mut out = block(&top);
    out["table"] = json!(table);
    out["sinks"] = per_sink.iter().map(|(name, c)| (name.clone(), block(c))).collect::<serde_json::Map<_, _>>().into();
    out["counters_since"] = json!(counters_since);
    out
}

/// Everything `cdc_delivery_status(sink_name)` reports.
#[derive(Debug, Clone)]
pub struct DeliveryStatus<'a> {
    /// Sink name.
    pub sink: &'a str,
    /// Sink type (`kafka`, `table`, `webhook`).
    pub sink_type: &'a str,
    /// `exactly_once` or `at_least_once`.
    pub delivery_mode: &'a str,
    /// Pipeline state (running, retrying, error, ...).
    pub state: &'a str,
    /// Last error, when the state is not running.
    pub last_error: Option<&'a str>,
    /// When the state last changed (ISO 8601).
    pub since: &'a str,
    /// The counters, `None` when this server has not counted for the sink yet.
    pub counters: Option<DeliveryCounters>,
    /// When counting started (ISO 8601).
    pub counters_since: &'a str,
}

impl DeliveryStatus<'_> {
    /// The document, in the shape of the product description (numbers where it has numbers;
    /// offsets are WAL positions as numbers and as `X/Y` text).
    pub fn to_json(&self) -> Value {
        let c = self.counters.unwrap_or_default();
        let exactly_once = self.delivery_mode == "exactly_once";
        // Held back for a compliance reason only while the sink is not delivering.
        let held = c.compliance_hold != 0 && self.state != "running";
        // Delivery transactions and deduplication exist only in exactly-once mode.
        let eo = |v: u64| if exactly_once { json!(v) } else { Value::Null };
        json!({
            "sink": self.sink,
            "sink_type": self.sink_type,
            "delivery_mode": self.delivery_mode,
            "state": self.state,
            "last_error": self.last_error,
            "since": self.since,
            "transaction_status": {
                "open_transactions": eo(c.open_transactions),
                "committed_transactions": eo(c.committed_transactions),
                "aborted_transactions": eo(c.aborted_transactions),
            },
            "offset_tracking": {
                "current_offset": c.read_lsn,
                "committed_offset": c.committed_lsn,
                "pending_offset": c.read_lsn.saturating_sub(c.committed_lsn),
                "current_lsn": Lsn(c.read_lsn).to_string(),
                "committed_lsn": Lsn(c.committed_lsn).to_string(),
            },
            "deduplication": {
                "duplicate_events_detected": eo(c.duplicate_events_detected),
                "duplicate_events_filtered": eo(c.duplicate_events_filtered),
                "unique_events_delivered": c.events_delivered,
            },
            "delivered": {
                "events": c.events_delivered,
                "bytes": c.bytes_delivered,
                "source_transactions": c.source_transactions_delivered,
                "large_transactions": c.large_transactions,
                "snapshot_rows": c.snapshot_rows_delivered,
            },
            "decoding": {
                "wal_decoded_bytes": c.wal_decoded_bytes,
                "sessions_started": c.decoding_sessions,
                "shared": c.shared_decoding == 1,
                "shared_joins": c.shared_joins,
                "log_frames_read": c.log_frames_read,
                "log_wal_bytes": c.log_wal_bytes,
                "log_reads": c.log_reads,
                "changes_skipped": c.changes_skipped,
                "reads_overlapped": c.reads_overlapped,
                "catalog_rereads": c.catalog_rereads,
            },
            "compliance_metrics": {
                "pii_redactions": c.pii_redactions,
                "audit_records_created": c.audit_records,
                "compliance_status": if held { "NON_COMPLIANT" } else { "COMPLIANT" },
                "compliance_issue": if held { self.last_error.map(Value::from).unwrap_or(Value::Null) } else { Value::Null },
            },
            "counters_since": self.counters_since,
        })
    }
}

/// An estimate of the events of one table a sink has still to deliver (`cdc_metrics`' `lag_events`):
/// the WAL its slot has not confirmed (`lag_bytes`) times the events of the table per byte of WAL the
/// sink decoded since its counters started (`table_events`, less the `snapshot_events` its snapshots
/// delivered, which came from no WAL, over `wal_decoded_bytes`). None without a slot, or while the sink
/// has decoded no WAL since the counters started (no rate yet); 0 when nothing is left.
pub fn estimate_lag_events(
    lag_bytes: Option<i64>,
    table_events: u64,
    snapshot_events: u64,
    wal_decoded_bytes: u64,
) -> Option<u64> {
    let lag = lag_bytes?;
    if lag <= 0 {
        return Some(0);
    }
    if wal_decoded_bytes == 0 {
        return None;
    }
    let per_byte = table_events.saturating_sub(snapshot_events) as f64 / wal_decoded_bytes as f64;
    Some((lag as f64 * per_byte).round() as u64)
}

/// A count with thousands separators, for messages: 2002 as 2,002.
pub fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits_by_three() {
        let shown: Vec<String> = [0, 7, 999, 1_000, 2_002, 1_234_567, -45_000].map(thousands).to_vec();
        assert_eq!(shown, ["0", "7", "999", "1,000", "2,002", "1,234,567", "-45,000"]);
    }

    #[test]
    fn lag_events_scale_the_unconfirmed_wal_by_the_table_s_events_per_decoded_byte() {
        // 1,000 events of the table in 1 MB of WAL: 2 kB left is about 2 events.
        assert_eq!(estimate_lag_events(Some(2_000), 1_000, 0, 1_000_000), Some(2));
        // Snapshot rows came from no WAL: they do not raise the rate.
        assert_eq!(estimate_lag_events(Some(2_000), 51_000, 50_000, 1_000_000), Some(2));
        assert_eq!(estimate_lag_events(Some(2_000), 10, 50, 1_000_000), Some(0));
        // Caught up, or behind with no rate measured yet, or no slot.
        assert_eq!(estimate_lag_events(Some(0), 1_000, 0, 1_000_000), Some(0));
        assert_eq!(estimate_lag_events(Some(-5), 1_000, 0, 0), Some(0));
        assert_eq!(estimate_lag_events(Some(2_000), 0, 0, 0), None);
        assert_eq!(estimate_lag_events(None, 1_000, 0, 1_000_000), None);
        // A table with no events in the WAL the sink decoded: none expected.
        assert_eq!(estimate_lag_events(Some(1 << 30), 0, 0, 1_000_000), Some(0));
    }

    fn status(mode: &str, counters: Option<DeliveryCounters>) -> Value {
        DeliveryStatus {
            sink: "kafka_compliance",
            sink_type: "kafka",
            delivery_mode: mode,
            state: "running",
            last_error: None,
            since: "2026-11-30T00:00:00Z",
            counters,
            counters_since: "2026-11-30T00:00:00Z",
        }
        .to_json()
    }

    #[test]
    fn exactly_once_status_has_the_product_shape() {
        let c = DeliveryCounters {
            committed_transactions: 7,
            read_lsn: 0x1_0000_0100,
            committed_lsn: 0x1_0000_0000,
            duplicate_events_detected: 12,
            duplicate_events_filtered: 12,
            events_delivered: 900,
            ..Default::default()
        };
        let v = status("exactly_once", Some(c));
        assert_eq!(
            v["transaction_status"],
            json!({"open_transactions": 0, "committed_transactions": 7, "aborted_transactions": 0})
        );
        assert_eq!(v["offset_tracking"]["current_offset"], 0x1_0000_0100u64);
        assert_eq!(v["offset_tracking"]["pending_offset"], 0x100);
        assert_eq!(v["offset_tracking"]["committed_lsn"], "1/0");
        assert_eq!(
            v["deduplication"],
            json!({"duplicate_events_detected": 12, "duplicate_events_filtered": 12, "unique_events_delivered": 900})
        );
        assert_eq!(v["last_error"], Value::Null);
        assert_eq!(
            v["compliance_metrics"],
            json!({"pii_redactions": 0, "audit_records_created": 0, "compliance_status": "COMPLIANT",
                   "compliance_issue": null})
        );
    }

    #[test]
    fn a_sink_holding_back_events_for_a_compliance_reason_is_non_compliant() {
        let c = DeliveryCounters { pii_redactions: 10, audit_records: 5, compliance_hold: 1, ..Default::default() };
        let v = DeliveryStatus {
            sink: "s",
            sink_type: "table",
            delivery_mode: "exactly_once",
            state: "error",
            last_error: Some("table public.accounts: its config tokenizes columns, but no key"),
            since: "",
            counters: Some(c),
            counters_since: "",
        }
        .to_json();
        assert_eq!(v["compliance_metrics"]["compliance_status"], "NON_COMPLIANT");
        assert_eq!(v["compliance_metrics"]["pii_redactions"], 10);
        assert_eq!(v["compliance_metrics"]["audit_records_created"], 5);
        assert!(v["compliance_metrics"]["compliance_issue"].as_str().unwrap_or_default().contains("accounts"));
    }

    #[test]
    fn at_least_once_has_no_delivery_transactions_or_dedup() {
        let v = status("at_least_once", None);
        assert_eq!(v["transaction_status"]["committed_transactions"], Value::Null);
        assert_eq!(v["deduplication"]["duplicate_events_detected"], Value::Null);
        assert_eq!(v["deduplication"]["unique_events_delivered"], 0);
    }
}
