//! `cdc_verify`: the accuracy verifier. A captured table's rows, encoded as the sink would write them
//! (the preview path: filter, columns, masks, tokens, computed columns, enrichment), against what the
//! sink's destination holds once the sink delivered past the position of that read: row counts,
//! checksums and the rows that differ.
use cdc_core::{CdcError, ErrorKind};
use pgrx::prelude::*;
use pgrx::JsonB;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::preview::{row_texts, TableEncoder};
use super::{required, schema};
use crate::catalog::{self, str_field};
use crate::errors::raise;

/// The source side: each published row's key and `after` image as JSON text, read under `snapshot`.
struct Source {
    /// The snapshot the rows were read under (`pg_current_snapshot()` as text).
    snapshot: String,
    keys: Vec<String>,
    afters: Vec<String>,
    /// Rows the filter leaves out (not published, so not expected at the destination).
    filtered: usize,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow)]
    after: Option<&'a RawValue>,
}

fn read_source(table: &mut TableEncoder) -> Source {
    let rows = row_texts(&table.qualified, &table.plan.relation.columns, None, None);
    let snapshot = catalog::select_one::<String>("SELECT pg_current_snapshot()::text", &[]).unwrap_or_default();
    let mut out =
        Source { snapshot, keys: Vec::with_capacity(rows.len()), afters: Vec::with_capacity(rows.len()), filtered: 0 };
    for texts in &rows {
        let p = table.preview(texts);
        if p.filtered {
            out.filtered += 1;
            continue;
        }
        if !p.published {
            // Not the filter: the row cannot be encoded (no tokenization key, say).
            raise(CdcError::new(
                ErrorKind::PrerequisiteState,
                format!(
                    "a row of {} cannot be encoded as the sink would: {}",
                    table.name,
                    p.reason.unwrap_or_default()
                ),
            ));
        }
        let text = p.event_text.as_deref().unwrap_or("{}");
        let after = serde_json::from_str::<Event<'_>>(text).ok().and_then(|e| e.after).map(|a| a.get().to_string());
        out.keys.push(p.key.as_ref().map_or_else(|| "null".to_string(), |k| k.get().to_string()));
        out.afters.push(after.unwrap_or_else(|| "null".to_string()));
    }
    out
}

/// Compares the source rows with a table sink's event table folded by key as of the source's
/// snapshot: the events of the transactions that snapshot sees (and the snapshot's READ events,
/// transaction 0), each key's last one since the table's last TRUNCATE, a DELETE removing it. The
/// events carry 32-bit transaction ids; each is taken in the epoch of the snapshot's xmax (or the
/// one before, for an id above it), which holds for every transaction younger than two billion ids.
fn compare_table_sink(event_table: &str, table_name: &str, src: &Source, max: i32) -> Value {
    catalog::json(
        &format!(
            "WITH src AS (SELECT k::jsonb AS key, a::jsonb AS after FROM unnest($1::text[], $2::text[]) AS u(k, a)),
                  snap AS (SELECT $5::pg_snapshot AS s, pg_snapshot_xmax($5::pg_snapshot)::text::numeric AS top),
                  seen AS (SELECT e.* FROM {event_table} e, snap
                            WHERE e.table_name = $3
                              AND ((e.event #>> '{{metadata,transaction_id}}')::numeric = 0
                                   OR pg_visible_in_snapshot(
                                        (snap.top - mod(snap.top, 4294967296) + (e.event #>> '{{metadata,transaction_id}}')::numeric
                                         - CASE WHEN (e.event #>> '{{metadata,transaction_id}}')::numeric > mod(snap.top, 4294967296)
                                                THEN 4294967296 ELSE 0 END)::text::xid8, snap.s))),
                  ev AS (SELECT event_id, event_key, operation, event -> 'after' AS after FROM seen
                          WHERE event_id > coalesce((SELECT max(event_id) FROM seen WHERE operation = 'TRUNCATE'), 0)),
                  last AS (SELECT DISTINCT ON (event_key) event_key AS key, operation, after FROM ev
                            WHERE operation <> 'TRUNCATE' ORDER BY event_key, event_id DESC),
                  dst AS (SELECT key, after FROM last WHERE operation <> 'DELETE'),
                  diff AS (SELECT coalesce(s.key, d.key) AS key, s.after AS source, d.after AS destination
                             FROM src s FULL JOIN dst d ON d.key = s.key
                            WHERE s.after IS DISTINCT FROM d.after)
             SELECT jsonb_build_object(
                 'source', jsonb_build_object('rows', (SELECT count(*) FROM src),
                     'checksum', (SELECT md5(coalesce(string_agg(key::text || ' ' || after::text, E'\\n' ORDER BY key::text), '')) FROM src)),
                 'destination', jsonb_build_object('rows', (SELECT count(*) FROM dst),
                     'checksum', (SELECT md5(coalesce(string_agg(key::text || ' ' || after::text, E'\\n' ORDER BY key::text), '')) FROM dst)),
                 'differing_rows', (SELECT count(*) FROM diff),
                 'differences', (SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY x.key::text), '[]')
                                   FROM (SELECT * FROM diff ORDER BY key::text LIMIT $4) x))"
        ),
        &[src.keys.clone().into(), src.afters.clone().into(), table_name.into(), max.into(), src.snapshot.as_str().into()],
    )
    .unwrap_or_default()
}

/// Waits until the sink delivered every change committed before `lsn`, or raises 55000 after
/// `timeout_ms`: its slot holds none before it, and the transactions pg_cdc's workers had open then
/// have ended (a worker confirms its slot inside a transaction of its own, whose writes are visible
/// only once it commits).
fn wait_delivered(sink: &str, slot: &str, lsn: &str, timeout_ms: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms as u64);
    loop {
        if !catalog::slot_holds_change(slot, Some(lsn)) && workers_transactions_end(deadline) {
            return;
        }
        if std::time::Instant::now() > deadline {
            let state = catalog::select_one::<String>(
                &format!("SELECT state FROM {}._cdc_sinks WHERE sink_name = $1", schema()),
                &[sink.into()],
            )
            .unwrap_or_default();
            raise(
                CdcError::new(
                    ErrorKind::PrerequisiteState,
                    format!("sink \"{sink}\" ({state}) has not delivered the changes committed before {lsn} within {timeout_ms} ms"),
                )
                .hint("cdc_status() says why it is behind; call cdc_verify again once it caught up, or with a larger timeout_ms."),
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        pgrx::check_for_interrupts!();
    }
}

/// Whether the transactions pg_cdc's workers have open now end before `deadline` (waits for them).
fn workers_transactions_end(deadline: std::time::Instant) -> bool {
    // pg_stat_activity is read once per transaction unless its snapshot is cleared.
    let clear = || catalog::select_one::<bool>("SELECT pg_stat_clear_snapshot() IS NULL", &[]);
    clear();
    let open = catalog::select_one::<Vec<String>>(
        "SELECT coalesce(array_agg(backend_xid::text), '{}') FROM pg_stat_activity
          WHERE backend_type = 'pg_cdc worker' AND backend_xid IS NOT NULL",
        &[],
    )
    .unwrap_or_default();
    while !open.is_empty()
        && catalog::select_one::<bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_xid::text = ANY ($1))",
            &[open.clone().into()],
        ) == Some(true)
    {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        pgrx::check_for_interrupts!();
        clear();
    }
    true
}

/// Checks that a sink's destination holds what the captured table holds: the table's rows, encoded
/// as the sink writes them (filter, columns, masks, tokens, computed columns and enrichment applied,
/// by `cdc_preview`'s path), against the destination once the sink delivered every change committed
/// before the read. For a table sink the destination is its event table folded by key (each key's
/// last event since the table's last TRUNCATE; a DELETE removes it). Returns the row count and an md5
/// checksum of each side, whether they match, and up to `max_differences` rows that differ (key, the
/// source's value, the destination's; null where one side has none). The destination is folded as
/// of the source read's snapshot (the events of the transactions it sees), so writes going on during
/// the call are no difference. Runs outside a transaction block.
///
/// ```sql
/// SELECT cdc_verify('orders_log', 'orders');
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_verify(sink_name text, table_name regclass, max_differences integer DEFAULT 10,
                           timeout_ms integer DEFAULT 60000) RETURNS jsonb
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_verify(
    sink_name: Option<&str>,
    table_name: Option<pg_sys::Oid>,
    max_differences: Option<i32>,
    timeout_ms: Option<i32>,
) -> JsonB {
    let sink_name = required(sink_name, "sink_name");
    let oid = required(table_name, "table_name");
    let max = required(max_differences, "max_differences");
    let timeout_ms = required(timeout_ms, "timeout_ms");
    if !(0..=10_000).contains(&max) {
        raise(CdcError::new(
            ErrorKind::InvalidParameter,
            format!("max_differences must be between 0 and 10000, not {max}"),
        ));
    }
    if timeout_ms < 0 {
        raise(CdcError::new(ErrorKind::InvalidParameter, format!("timeout_ms must not be negative, not {timeout_ms}")));
    }
    // SAFETY: reads the current transaction's state, on the backend's own thread.
    if unsafe { pg_sys::IsTransactionBlock() } {
        raise(
            CdcError::new(ErrorKind::ActiveSqlTransaction, "cdc_verify cannot run inside a transaction block")
                .detail("It waits for the sink to deliver what committed before its read, which it sees only statement by statement.")
                .hint("Run it on its own (autocommit)."),
        );
    }
    super::access::require_select(oid, "verify");
    let _entry = super::access::enter();
    let schema = schema();
    let sink = catalog::json(
        &format!(
            "SELECT jsonb_build_object('type', s.sink_type, 'config', s.config, 'slot', s.slot_name, 'state', s.state,
                        'carries', s.table_oids IS NULL OR $2 = ANY (s.table_oids),
                        'slot_exists', EXISTS (SELECT 1 FROM pg_replication_slots r WHERE r.slot_name = s.slot_name),
                        'event_table', t.event_table::regclass::text, 'event_table_oid', t.event_table::bigint,
                        'trimmed_upto', t.trimmed_upto,
                        'snapshotting', EXISTS (SELECT 1 FROM {schema}._cdc_snapshots n WHERE n.sink_id = s.sink_id
                                                   AND n.table_oid = $2 AND n.state IN {open}))
               FROM {schema}._cdc_sinks s LEFT JOIN {schema}._cdc_table_sinks t USING (sink_id)
              WHERE s.sink_name = $1",
            open = cdc_core::state::SnapshotState::open_sql()
        ),
        &[sink_name.into(), oid.into()],
    )
    .unwrap_or_else(|| super::no_such_sink(sink_name));
    let sink_type = str_field(&sink, "type").to_string();
    if sink_type != "table" {
        raise(
            CdcError::new(
                ErrorKind::FeatureNotSupported,
                format!("cdc_verify reads back table sinks; sink \"{sink_name}\" is a {sink_type} sink"),
            )
            .hint("Its destination cannot be read back from here; count the rows there with that system's tools."),
        );
    }
    let mut table = TableEncoder::new(oid, "cdc_verify compares captured tables; cdc_enable it first.");
    if sink["carries"] != Value::Bool(true) {
        raise(CdcError::new(ErrorKind::UndefinedObject, format!("sink \"{sink_name}\" does not carry {}", table.name)));
    }
    if sink["config"].get("partition_key").is_some_and(|v| !v.is_null()) || table.plan.config.partition_key.is_some() {
        raise(
            CdcError::new(
                ErrorKind::FeatureNotSupported,
                format!(
                    "the events of {} for sink \"{sink_name}\" are keyed by a partition_key, which several rows share",
                    table.name
                ),
            )
            .hint("cdc_verify folds the events by key: it needs the table's own key."),
        );
    }
    if table.plan.relation.columns.iter().all(|c| !c.is_key) {
        raise(
            CdcError::new(ErrorKind::FeatureNotSupported, format!("{} has no key to fold its events by", table.name))
                .hint("cdc_verify compares tables with a primary key, a replica identity index or key_columns."),
        );
    }
    let event_table = str_field(&sink, "event_table").to_string();
    super::access::require_select(
        pg_sys::Oid::from(sink["event_table_oid"].as_u64().unwrap_or(0) as u32),
        "verify against",
    );
    let slot = str_field(&sink, "slot").to_string();
    let finished = str_field(&sink, "state") == "finished";
    if !finished && sink["slot_exists"] != Value::Bool(true) {
        raise(CdcError::new(
            ErrorKind::PrerequisiteState,
            format!("sink \"{sink_name}\" has no slot yet (it is {})", str_field(&sink, "state")),
        ));
    }
    if sink["snapshotting"] == Value::Bool(true) {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!("the snapshot of {} for sink \"{sink_name}\" is not delivered yet", table.name),
            )
            .detail("Its READ events show rows as they are when each chunk is read, not as of one snapshot.")
            .hint("Call cdc_verify once cdc_snapshots shows it done."),
        );
    }
    // As the event table writes it: the schema and the name, unquoted.
    let logged_name = format!("{}.{}", table.plan.relation.namespace, table.plan.relation.name);

    let src = super::fresh(|| read_source(&mut table));
    // Every transaction the read saw committed before this position.
    let position = catalog::select_one::<String>("SELECT pg_current_wal_insert_lsn()::text", &[]).unwrap_or_default();
    if !finished {
        wait_delivered(sink_name, &slot, &position, timeout_ms);
    }
    let result = super::fresh(|| compare_table_sink(&event_table, &logged_name, &src, max));
    let matches = result["differing_rows"].as_i64() == Some(0);
    let mut out = json!({
        "sink": sink_name,
        "table": table.name,
        "matches": matches,
        "position": position,
        "filtered_rows": src.filtered,
    });
    for key in ["source", "destination", "differing_rows", "differences"] {
        out[key] = result[key].clone();
    }
    let trimmed = sink["trimmed_upto"].as_i64().unwrap_or(0);
    if trimmed > 0 && !matches {
        out["note"] = json!(format!(
            "the sink's retention removed its events up to event_id {trimmed}: a row whose last change is older is missing from the destination's fold"
        ));
    }
    JsonB(out)
}
