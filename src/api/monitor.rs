//! Monitoring: `cdc_metrics(table)`, `cdc_status()` (SQL, in `finalize.sql`, over
//! `_cdc_sink_latency`) and `cdc_prometheus_metrics()`. Every figure is measured: counters and
//! latency histograms the worker keeps in shared memory, `_cdc_offsets`, and the slots.
//!
//! These functions are SECURITY DEFINER and granted to `pg_monitor`: a monitoring role sees the
//! figures and states, never the sink configs (they may hold credentials).
use cdc_core::metrics::{Exposition, Histogram, Kind};
use cdc_core::state::SnapshotState;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::{json, Value};

use super::{required, schema};
use crate::catalog;

/// p50 / p99 / p999 of a histogram in milliseconds (null while empty).
fn quantiles(h: &Histogram) -> (Option<f64>, Option<f64>, Option<f64>) {
    (h.quantile_ms(0.5), h.quantile_ms(0.99), h.quantile_ms(0.999))
}

/// A sink's latencies for `cdc_status`: end to end and publish percentiles in milliseconds, and
/// how many events they are measured over. Internal.
#[pg_extern(sql = r#"
CREATE FUNCTION _cdc_sink_latency(sink_id text) RETURNS jsonb
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn _cdc_sink_latency(sink_id: Option<&str>) -> JsonB {
    let l = crate::stats::sink_latency(sink_id.unwrap_or_default());
    let (p50, p99, p999) = quantiles(&l.end_to_end);
    let (pub50, pub99, _) = quantiles(&l.publish);
    JsonB(json!({"p50_ms": p50, "p99_ms": p99, "p999_ms": p999, "publish_p50_ms": pub50, "publish_p99_ms": pub99,
                 "samples": l.end_to_end.count()}))
}

/// How capture of one table is doing, in the product description's shape: `source_metrics`
/// (transactions and events delivered, capture latency, WAL not yet confirmed by its slowest
/// sink), `sink_metrics` per sink (events published, publish and end-to-end latency, lag) and
/// `end_to_end_latency` (commit in PostgreSQL to the broker's acknowledgement, over every sink).
///
/// ```sql
/// SELECT cdc_metrics('orders');
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_metrics(table_name regclass) RETURNS jsonb
VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_metrics(table_name: Option<pg_sys::Oid>) -> JsonB {
    let oid = required(table_name, "table_name");
    let schema = schema();
    let name = super::captured_table_name(&schema, oid);
    // READ events of the table's snapshots since the counters started, for the lag_events estimate.
    let snapshot_rows = if crate::catalog::has_snapshots(&schema) {
        format!(
            "(SELECT coalesce(sum(x.rows_done), 0) FROM {schema}._cdc_snapshots x
               WHERE x.sink_id = s.sink_id AND x.table_oid = $1 AND x.started_at >= coalesce(to_timestamp($2::float8 / 1e6), 'infinity'))"
        )
    } else {
        "0".to_string()
    };
    let since = crate::stats::since_unix_micros().map(|us| us as f64);
    let sinks = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object(
                 'id', s.sink_id::text, 'name', s.sink_name, 'state', s.state,
                 'snapshot_rows', {snapshot_rows},
                 'lag_bytes', (pg_current_wal_lsn() - r.confirmed_flush_lsn)::bigint,
                 'events_published', coalesce(o.events_published, 0),
                 'last_delivered_at', to_char(o.last_timestamp AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))
               ORDER BY s.sink_name), '[]')
               FROM {schema}._cdc_sinks s
               LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name
               LEFT JOIN {schema}._cdc_offsets o ON o.sink_name = s.sink_name AND o.table_oid = $1
              WHERE s.table_oids IS NULL OR $1 = ANY (s.table_oids)"
        ),
        &[oid.into(), since.into()],
    )
    .unwrap_or_default();
    let counts = crate::stats::read_table(oid.to_u32());
    let mut sink_metrics = serde_json::Map::new();
    let (mut transactions, mut events, mut wal_lag) = (0u64, 0u64, None::<i64>);
    for s in sinks.as_array().into_iter().flatten() {
        let id = s["id"].as_str().unwrap_or_default();
        let c = crate::stats::sink_key(id)
            .and_then(|k| counts.iter().find(|(key, _)| *key == k))
            .map(|(_, c)| *c)
            .unwrap_or_default();
        transactions = transactions.max(c.transactions);
        events = events.max(c.events);
        let lag = s["lag_bytes"].as_i64();
        if let Some(l) = lag {
            wal_lag = Some(wal_lag.map_or(l, |w| w.max(l)));
        }
        let l = crate::stats::sink_latency(id);
        let (p50, p99, _) = quantiles(&l.publish);
        let (e50, e99, _) = quantiles(&l.end_to_end);
        sink_metrics.insert(
            s["name"].as_str().unwrap_or_default().to_string(),
            json!({
                "state": s["state"],
                "events_published": s["events_published"],
                "publish_latency_p50_ms": p50,
                "publish_latency_p99_ms": p99,
                "end_to_end_latency_p50_ms": e50,
                "end_to_end_latency_p99_ms": e99,
                // An estimate: counting the events still in the WAL would mean decoding them.
                "lag_events": cdc_core::stats::estimate_lag_events(
                    lag,
                    c.events,
                    s["snapshot_rows"].as_u64().unwrap_or(0),
                    // The WAL it read: decoded by its own sessions, or read as the shared log.
                    crate::stats::read(id).map_or(0, |d| d.wal_decoded_bytes + d.log_wal_bytes),
                ),
                "lag_bytes": lag,
                "last_delivered_at": s["last_delivered_at"],
            }),
        );
    }
    let t = crate::stats::table_latency(oid.to_u32());
    let (c50, c99, _) = quantiles(&t.capture);
    let (e50, e99, e999) = quantiles(&t.end_to_end);
    JsonB(json!({
        "table": name,
        "source_metrics": {
            "transactions_processed": transactions,
            "events_captured": events,
            "capture_latency_p50_ms": c50,
            "capture_latency_p99_ms": c99,
            "wal_lag_bytes": wal_lag,
        },
        "sink_metrics": sink_metrics,
        "end_to_end_latency": {
            "p50_ms": e50,
            "p99_ms": e99,
            "p999_ms": e999,
            "max_ms": (t.end_to_end.count() > 0).then(|| t.end_to_end.max_micros() as f64 / 1000.0),
            "samples": t.end_to_end.count(),
        },
        "counters_since": super::status::counters_since(),
    }))
}

/// Every pg_cdc figure in the Prometheus text exposition format (version 0.0.4): sink states,
/// sink types, events, bytes and transactions delivered, duplicates filtered, delivery transactions
/// committed and aborted, snapshot rows delivered and the progress of running snapshots,
/// retained WAL and lag per slot, filter and enrichment counts, and latency histograms (publish
/// and end to end per sink, capture and end to end per table). Serve it over HTTP for Prometheus
/// (`monitoring/scrape.py` in the repository); postgres_exporter reads `cdc_status()` instead.
///
/// ```sql
/// SELECT cdc_prometheus_metrics();
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_prometheus_metrics() RETURNS text
VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_prometheus_metrics() -> String {
    let open = SnapshotState::open_sql();
    let schema = schema();
    let sinks = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('id', s.sink_id::text, 'name', s.sink_name, 'state', s.state,
                 'type', s.sink_type, 'mode', s.delivery_mode, 'retained', (pg_current_wal_lsn() - r.restart_lsn)::bigint, 'safe', r.safe_wal_size,
                 'lag', (pg_current_wal_lsn() - r.confirmed_flush_lsn)::bigint) ORDER BY s.sink_name), '[]')
               FROM {schema}._cdc_sinks s LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name"
        ),
        &[],
    )
    .unwrap_or_default();
    let offsets = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('sink', o.sink_name, 'table', p.table_name, 'n', o.events_published,
                 'oid', o.table_oid::bigint) ORDER BY o.sink_name, p.table_name), '[]')
               FROM {schema}._cdc_offsets o JOIN {schema}._cdc_publications p USING (table_oid)"
        ),
        &[],
    )
    .unwrap_or_default();
    let tables = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('oid', table_oid::bigint, 'name', table_name) ORDER BY table_name), '[]')
               FROM {schema}._cdc_publications"
        ),
        &[],
    )
    .unwrap_or_default();
    // A dropped table's snapshot keeps its names from 0.6.0 on.
    let dropped = if catalog::has_column(&schema, "_cdc_snapshots", "dropped_name") {
        "quote_ident(s.dropped_schema) || '.' || quote_ident(s.dropped_name), "
    } else {
        ""
    };
    let snapshots = crate::catalog::has_snapshots(&schema)
        .then(|| {
            catalog::json(
                &format!(
                    "SELECT coalesce(jsonb_agg(jsonb_build_object('sink', k.sink_name,
                         'table', coalesce(p.table_name, {dropped}s.table_oid::regclass::text), 'done', s.rows_done,
                         'estimate', s.rows_estimate) ORDER BY k.sink_name, s.snapshot_id), '[]')
                       FROM {schema}._cdc_snapshots s JOIN {schema}._cdc_sinks k USING (sink_id)
                       LEFT JOIN {schema}._cdc_publications p ON p.table_oid = s.table_oid
                      WHERE s.state IN {open}"
                ),
                &[],
            )
        })
        .flatten()
        .unwrap_or_default();
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let (sinks, offsets, tables, snapshots) = (list(&sinks), list(&offsets), list(&tables), list(&snapshots));
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();

    let mut x = Exposition::new();
    x.family("pg_cdc_sink_state", Kind::Gauge, "1 for the state each sink is in.");
    for s in &sinks {
        let (name, state) = (text(s, "name"), text(s, "state"));
        for st in cdc_core::state::SinkState::ALL.map(|s| s.label()) {
            x.sample("pg_cdc_sink_state", &[("sink", &name), ("state", st)], f64::from(u8::from(state == st)));
        }
    }
    // Readiness as cdc_ready() answers it with cdc.ready_max_lag (from catalog 0.9.0 on).
    let readiness = catalog::select_one::<bool>(
        "SELECT to_regprocedure($1) IS NOT NULL",
        &[format!("{schema}._cdc_sink_readiness(bigint)").as_str().into()],
    )
    .unwrap_or(false)
    .then(|| {
        catalog::json(
            &format!(
                "SELECT coalesce(jsonb_object_agg(sink_name, reason IS NULL), '{{}}')
                   FROM {schema}._cdc_sink_readiness($1)"
            ),
            &[(i64::from(crate::gucs::READY_MAX_LAG.get()) << 20).into()],
        )
    })
    .flatten();
    if let Some(ready) = readiness.as_ref().and_then(Value::as_object) {
        x.family(
            "pg_cdc_ready",
            Kind::Gauge,
            "1 when every sink is ready as cdc_ready() says (running within cdc.ready_max_lag, paused or finished).",
        );
        x.sample("pg_cdc_ready", &[], f64::from(u8::from(ready.values().all(|r| r == &Value::Bool(true)))));
        x.family("pg_cdc_sink_ready", Kind::Gauge, "1 when the sink is ready as cdc_ready() says.");
        for s in &sinks {
            let name = text(s, "name");
            let r = ready.get(&name).and_then(Value::as_bool).unwrap_or(false);
            x.sample("pg_cdc_sink_ready", &[("sink", &name)], f64::from(u8::from(r)));
        }
    }
    x.family("pg_cdc_sink_info", Kind::Gauge, "1 for each sink, with its type and delivery mode.");
    for s in &sinks {
        let labels = [("sink", text(s, "name")), ("type", text(s, "type")), ("delivery_mode", text(s, "mode"))];
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        x.sample("pg_cdc_sink_info", &labels, 1.0);
    }
    let gauges = [
        (
            "pg_cdc_slot_retained_wal_bytes",
            "retained",
            "WAL the sink's slot keeps (current WAL position - restart_lsn).",
        ),
        (
            "pg_cdc_slot_safe_wal_size_bytes",
            "safe",
            "WAL that can still be written before the slot is invalidated (null: no limit).",
        ),
        ("pg_cdc_lag_bytes", "lag", "WAL not yet confirmed by the sink (current WAL position - confirmed_flush_lsn)."),
    ];
    for (metric, key, help) in gauges {
        x.family(metric, Kind::Gauge, help);
        for s in sinks.iter().filter(|s| s[key].is_number()) {
            x.sample(metric, &[("sink", &text(s, "name"))], s[key].as_f64().unwrap_or(0.0));
        }
    }
    x.family(
        "pg_cdc_events_published_total",
        Kind::Counter,
        "Events the sink's destination acknowledged, per sink and table.",
    );
    for o in &offsets {
        x.sample(
            "pg_cdc_events_published_total",
            &[("sink", &text(o, "sink")), ("table", &text(o, "table"))],
            o["n"].as_f64().unwrap_or(0.0),
        );
    }
    let snapshot_gauges = [
        (
            "pg_cdc_snapshot_rows_done",
            "done",
            "Rows of a table's snapshot delivered, while it runs (trails by one chunk).",
        ),
        (
            "pg_cdc_snapshot_rows_estimate",
            "estimate",
            "Rows the table held when its snapshot started (pg_class.reltuples).",
        ),
    ];
    for (metric, key, help) in snapshot_gauges {
        x.family(metric, Kind::Gauge, help);
        for o in snapshots.iter().filter(|o| o[key].is_number()) {
            x.sample(
                metric,
                &[("sink", &text(o, "sink")), ("table", &text(o, "table"))],
                o[key].as_f64().unwrap_or(0.0),
            );
        }
    }
    type Counter = (&'static str, &'static str, fn(&cdc_core::stats::DeliveryCounters) -> u64);
    let counters: [Counter; 10] = [
        ("pg_cdc_snapshot_rows_delivered_total", "Snapshot rows delivered as READ events.", |c| {
            c.snapshot_rows_delivered
        }),
        ("pg_cdc_bytes_published_total", "Key and value bytes of the events delivered.", |c| c.bytes_delivered),
        ("pg_cdc_source_transactions_total", "PostgreSQL transactions delivered.", |c| c.source_transactions_delivered),
        ("pg_cdc_duplicates_filtered_total", "Events read again after a restart and not published again.", |c| {
            c.duplicate_events_filtered
        }),
        (
            "pg_cdc_sink_transactions_committed_total",
            "Delivery transactions committed (Kafka transactions; a table sink's database transactions).",
            |c| c.committed_transactions,
        ),
        ("pg_cdc_sink_transactions_aborted_total", "Delivery transactions aborted (re-sent later).", |c| {
            c.aborted_transactions
        }),
        ("pg_cdc_wal_decoded_bytes_total", "WAL the sink's decoding sessions decoded.", |c| c.wal_decoded_bytes),
        (
            "pg_cdc_decoded_changes_skipped_total",
            "Row changes of tables the sink does not carry, dropped in decoding.",
            |c| c.changes_skipped,
        ),
        (
            "pg_cdc_reads_overlapped_total",
            "Reads made while the sink's previous unit was still being committed.",
            |c| c.reads_overlapped,
        ),
        (
            "pg_cdc_catalog_rereads_total",
            "Reads given up at a change newer than the worker's catalog copy and read again.",
            |c| c.catalog_rereads,
        ),
    ];
    for (metric, help, get) in counters {
        x.family(metric, Kind::Counter, help);
        for s in &sinks {
            let c = crate::stats::read(&text(s, "id")).unwrap_or_default();
            x.sample(metric, &[("sink", &text(s, "name"))], get(&c) as f64);
        }
    }
    type TableCounter = (&'static str, &'static str, fn(&cdc_core::stats::TableCounters) -> u64);
    let table_counters: [TableCounter; 4] = [
        ("pg_cdc_filter_matched_total", "Changes the row filter published.", |c| c.matched),
        ("pg_cdc_filter_excluded_total", "Changes the row filter dropped.", |c| c.excluded),
        ("pg_cdc_enrichment_lookups_total", "Lookups for enrich transformations.", |c| c.lookups),
        ("pg_cdc_enrichment_cache_hits_total", "Of those, answered from the worker's memory.", |c| c.lookup_hits),
    ];
    let per_table: Vec<(String, String, cdc_core::stats::TableCounters)> = tables
        .iter()
        .flat_map(|t| {
            let oid = t["oid"].as_u64().unwrap_or(0) as u32;
            let counts = crate::stats::read_table(oid);
            sinks
                .iter()
                .filter_map(move |s| {
                    let key = crate::stats::sink_key(s["id"].as_str().unwrap_or_default())?;
                    let c = counts.iter().find(|(k, _)| *k == key)?.1;
                    Some((text(s, "name"), text(t, "name"), c))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    for (metric, help, get) in table_counters {
        x.family(metric, Kind::Counter, help);
        for (sink, table, c) in &per_table {
            x.sample(metric, &[("sink", sink), ("table", table)], get(c) as f64);
        }
    }
    // A family's lines must be contiguous: one histogram family at a time.
    let sink_latencies: Vec<(String, crate::stats::SinkLatency)> =
        sinks.iter().map(|s| (text(s, "name"), crate::stats::sink_latency(&text(s, "id")))).collect();
    let table_latencies: Vec<(String, crate::stats::TableLatency)> = tables
        .iter()
        .map(|t| (text(t, "name"), crate::stats::table_latency(t["oid"].as_u64().unwrap_or(0) as u32)))
        .collect();
    type SinkHist = fn(&crate::stats::SinkLatency) -> &Histogram;
    let sink_hists: [(&str, &str, SinkHist); 2] = [
        ("pg_cdc_publish_latency_seconds", "Events handed to the sink until its destination acknowledged them.", |l| {
            &l.publish
        }),
        (
            "pg_cdc_end_to_end_latency_seconds",
            "Events from their commit in PostgreSQL until the sink's destination acknowledged them.",
            |l| &l.end_to_end,
        ),
    ];
    for (metric, help, get) in sink_hists {
        x.family(metric, Kind::Histogram, help);
        for (name, l) in &sink_latencies {
            x.histogram(metric, &[("sink", name)], get(l), true);
        }
    }
    type TableHist = fn(&crate::stats::TableLatency) -> &Histogram;
    let table_hists: [(&str, &str, TableHist); 2] = [
        ("pg_cdc_capture_latency_seconds", "Events from their commit until the worker built them, per table.", |l| {
            &l.capture
        }),
        (
            "pg_cdc_table_end_to_end_latency_seconds",
            "Events from their commit until acknowledged, per table over every sink.",
            |l| &l.end_to_end,
        ),
    ];
    for (metric, help, get) in table_hists {
        x.family(metric, Kind::Histogram, help);
        for (name, l) in &table_latencies {
            x.histogram(metric, &[("table", name)], get(l), true);
        }
    }
    x.finish()
}
