//! Each sink's copies of the lookup tables its `enrich` transformations read (`_cdc_lookups`,
//! `_cdc_lookup_rows`; the design is in [`cdc_core::lookup`]).
//!
//! - [`seed`] copies a lookup table for one sink under a SHARE lock, as of the WAL insert position
//!   (called by `cdc_enable`, `cdc_add_sink`, and the worker for a sink whose slot it created);
//! - [`bindings`] / [`Copy`] / [`write`] are the worker's side: what it has, where its misses go,
//!   and how its changes are written before the slot moves.
use cdc_core::deliver::read::Failure;
use cdc_core::lookup::{LookupBinding, LookupFlush, LookupId, LookupRow, LookupSource};
use cdc_core::pipeline::{Assembler, SinkTables};
use cdc_core::state::SinkState;
use cdc_core::Lsn;
use pgrx::JsonB;
use serde_json::{json, Value};

use crate::catalog;
use crate::gucs;
use crate::worker::run_tx;
use crate::worker::source::{SinkRow, TEXT_FORMAT_SETTINGS};

/// One `enrich` transformation as resolved by `cdc_enable`.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The captured table.
    pub table_oid: u32,
    /// Which of its enrich transformations (config order).
    pub position: u32,
    /// The lookup table.
    pub lookup_oid: u32,
    /// Its key column.
    pub lookup_column: String,
    /// Its columns added to events.
    pub add_columns: Vec<String>,
}

/// `name` quoted as an SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// SQL for the text the type's output function gives a column of `t` (what pgoutput sends), or NULL:
/// a cast to text is not always that (`true::text` is `true` where pgoutput sends `t`; `inet`'s cast
/// always shows the netmask).
pub fn output_text(column: &str) -> String {
    let c = format!("t.{}", quote_ident(column));
    format!("CASE WHEN {c}::text IS NULL THEN NULL ELSE format('%s', {c}) END")
}

/// Runs `f` with the worker's text format for values (dates, floats, bytea) in force for this
/// transaction's statements, then puts the caller's settings back: copies and previews must show
/// values exactly as pgoutput sends them to the worker.
pub fn with_text_format<T>(f: impl FnOnce() -> T) -> T {
    let saved: Vec<(String, String)> = TEXT_FORMAT_SETTINGS
        .iter()
        .map(|(n, _)| {
            let v = catalog::select_one::<String>("SELECT current_setting($1)", &[(*n).into()]).unwrap_or_default();
            (n.to_string(), v)
        })
        .collect();
    for (n, v) in TEXT_FORMAT_SETTINGS {
        catalog::select_one::<String>("SELECT set_config($1, $2, true)", &[(*n).into(), (*v).into()]);
    }
    let out = f();
    for (n, v) in &saved {
        catalog::select_one::<String>("SELECT set_config($1, $2, true)", &[n.as_str().into(), v.as_str().into()]);
    }
    out
}

/// The type OIDs of a table's columns `cols`, in that order.
pub fn column_types(table_oid: u32, cols: &[String]) -> Vec<u32> {
    catalog::json(
        "SELECT coalesce(jsonb_agg(a.atttypid::bigint ORDER BY u.ord), '[]')
           FROM unnest($2::text[]) WITH ORDINALITY u(name, ord)
           JOIN pg_attribute a ON a.attrelid = $1::bigint::oid AND a.attname = u.name",
        &[i64::from(table_oid).into(), cols.to_vec().into()],
    )
    .and_then(|v| serde_json::from_value(v).ok())
    .unwrap_or_default()
}

/// Copies a lookup table for a sink, replacing any earlier copy. The SHARE lock waits for the
/// table's writers and holds new ones off until the calling transaction ends, so the copy holds
/// exactly the changes committed before its position and the slot delivers exactly those after.
pub fn seed(schema: &str, sink_id: &str, spec: &Spec) {
    if spec.lookup_oid == 0 {
        seed_missing(schema, sink_id, spec);
        return;
    }
    let lookup = catalog::select_one::<String>(
        "SELECT oid::regclass::text FROM pg_class WHERE oid = $1::bigint::oid",
        &[i64::from(spec.lookup_oid).into()],
    )
    .unwrap_or_else(|| {
        crate::errors::raise(
            cdc_core::CdcError::new(cdc_core::ErrorKind::PrerequisiteState, dropped_message(spec))
                .hint("cdc_enable the captured table again with a config that fits (without that enrich, or naming a table that exists)."),
        )
    });
    catalog::run(&format!("LOCK TABLE {lookup} IN SHARE MODE"), &[]);
    let (sink, table, position) = forget_copy(schema, sink_id, spec);
    catalog::run(
        &format!(
            "INSERT INTO {schema}._cdc_lookups
                 (sink_id, table_oid, position, lookup_oid, lookup_column, add_columns, add_types, as_of_lsn)
             SELECT $1::uuid, $2::bigint::oid, $3, $4::bigint::oid, $5, $6, $7::bigint[]::oid[],
                    pg_current_wal_insert_lsn()"
        ),
        &[
            sink.into(),
            table.into(),
            position.into(),
            i64::from(spec.lookup_oid).into(),
            spec.lookup_column.as_str().into(),
            spec.add_columns.clone().into(),
            column_types(spec.lookup_oid, &spec.add_columns).into_iter().map(i64::from).collect::<Vec<_>>().into(),
        ],
    );
    let values: Vec<String> = spec.add_columns.iter().map(|c| output_text(c)).collect();
    let key = quote_ident(&spec.lookup_column);
    let key_text = output_text(&spec.lookup_column);
    with_text_format(|| {
        catalog::run(
            &format!(
                "INSERT INTO {schema}._cdc_lookup_rows (sink_id, table_oid, position, lookup_key, vals)
                 SELECT $1::uuid, $2::bigint::oid, $3, {key_text}, ARRAY[{}]::text[] FROM {lookup} t
                  WHERE t.{key} IS NOT NULL",
                values.join(", ")
            ),
            &[sink.into(), table.into(), position.into()],
        )
    });
}

/// Deletes a sink's copy of a lookup (its rows go with it), before [`seed`] makes it again; returns
/// the copy's key as the statements bind it: (sink id, table OID, position).
fn forget_copy<'a>(schema: &str, sink_id: &'a str, spec: &Spec) -> (&'a str, i64, i32) {
    let (sink, table, position) = (sink_id, i64::from(spec.table_oid), spec.position as i32);
    catalog::run(
        &format!(
            "DELETE FROM {schema}._cdc_lookups
              WHERE sink_id = $1::uuid AND table_oid = $2::bigint::oid AND position = $3"
        ),
        &[sink.into(), table.into(), position.into()],
    );
    (sink, table, position)
}

/// The copy of a lookup table that was dropped (OID 0, see `_cdc_forget_dropped_tables`): no rows,
/// so the events that enrich from it find none, as of their commit, until `cdc_enable` of its name
/// binds a new table and makes the copy again.
fn seed_missing(schema: &str, sink_id: &str, spec: &Spec) {
    let (sink, table, position) = forget_copy(schema, sink_id, spec);
    catalog::run(
        &format!(
            "INSERT INTO {schema}._cdc_lookups
                 (sink_id, table_oid, position, lookup_oid, lookup_column, add_columns, add_types, as_of_lsn)
             VALUES ($1::uuid, $2::bigint::oid, $3, 0, $4, $5,
                     -- The types the copies of other sinks had, else text: the values are all null.
                     coalesce((SELECT l.add_types FROM {schema}._cdc_lookups l
                                WHERE l.table_oid = $2::bigint::oid AND l.position = $3
                                  AND cardinality(l.add_types) = cardinality($5::text[]) LIMIT 1),
                              array_fill(25::oid, ARRAY[cardinality($5::text[])])),
                     pg_current_wal_insert_lsn())"
        ),
        &[
            sink.into(),
            table.into(),
            position.into(),
            spec.lookup_column.as_str().into(),
            spec.add_columns.clone().into(),
        ],
    );
}

/// The sinks that capture a table (their ids).
pub fn sinks_of_table(schema: &str, table_oid: u32) -> Vec<String> {
    let v = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(sink_id::text ORDER BY created_at), '[]') FROM {schema}._cdc_sinks
              WHERE table_oids IS NULL OR $1::bigint::oid = ANY (table_oids)"
        ),
        &[i64::from(table_oid).into()],
    );
    v.and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default()
}

/// Why a lookup copy cannot be made when its lookup table was dropped (`None`: it exists).
pub fn dropped(spec: &Spec) -> Option<String> {
    if spec.lookup_oid == 0 {
        // Dropped and known to be: its copy is empty until a new table of its name is bound.
        return None;
    }
    let exists = catalog::select_one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_class WHERE oid = $1::bigint::oid)",
        &[i64::from(spec.lookup_oid).into()],
    )
    .unwrap_or(false);
    (!exists).then(|| dropped_message(spec))
}

fn dropped_message(spec: &Spec) -> String {
    let table =
        catalog::select_one::<String>("SELECT $1::bigint::oid::regclass::text", &[i64::from(spec.table_oid).into()])
            .unwrap_or_default();
    format!(
        "the lookup table (OID {}) of enrich transformation {} of table {table} was dropped, so its events cannot be enriched",
        spec.lookup_oid, spec.position
    )
}

/// The enrich transformations of the captured tables a sink covers (`tables`: its table OIDs,
/// `None` for all), resolved as `cdc_enable` stored them.
pub fn specs_for_sink(schema: &str, tables: Option<&[u32]>) -> Vec<Spec> {
    let rows = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('oid', table_oid::bigint, 'config', config,
                                                          'lookup_oids', lookup_oids::bigint[])), '[]')
               FROM {schema}._cdc_publications WHERE cardinality(lookup_oids) > 0"
        ),
        &[],
    )
    .unwrap_or_default();
    let mut out = Vec::new();
    for r in rows.as_array().into_iter().flatten() {
        let oid = r["oid"].as_u64().unwrap_or(0) as u32;
        if tables.is_some_and(|t| !t.contains(&oid)) {
            continue;
        }
        let lookup_oids: Vec<u32> = serde_json::from_value(r["lookup_oids"].clone()).unwrap_or_default();
        out.extend(specs_of_config(oid, &r["config"], &lookup_oids));
    }
    out
}

/// The enrich transformations of one stored capture config, with their resolved lookup tables.
pub fn specs_of_config(table_oid: u32, config: &Value, lookup_oids: &[u32]) -> Vec<Spec> {
    let Ok(cfg) = cdc_core::config::parse_stored_capture_config(config, Vec::new()) else {
        return Vec::new();
    };
    cfg.enrich
        .iter()
        .zip(lookup_oids)
        .enumerate()
        .map(|(i, (e, &lookup_oid))| Spec {
            table_oid,
            position: i as u32,
            lookup_oid,
            lookup_column: e.lookup_column.clone(),
            add_columns: e.add_columns.clone(),
        })
        .collect()
}

/// The copies a sink has, as the worker binds them.
pub fn bindings(schema: &str, sink_id: &str) -> Vec<LookupBinding> {
    let rows = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('table_oid', table_oid::bigint, 'position', position,
                        'lookup_oid', lookup_oid::bigint, 'lookup_column', lookup_column, 'add_columns', add_columns,
                        'add_types', add_types::bigint[], 'as_of', as_of_lsn::text)), '[]')
               FROM {schema}._cdc_lookups WHERE sink_id = $1::uuid"
        ),
        &[sink_id.into()],
    )
    .unwrap_or_default();
    rows.as_array()
        .into_iter()
        .flatten()
        .map(|r| LookupBinding {
            id: LookupId {
                table_oid: r["table_oid"].as_u64().unwrap_or(0) as u32,
                position: r["position"].as_u64().unwrap_or(0) as u32,
            },
            lookup_oid: r["lookup_oid"].as_u64().unwrap_or(0) as u32,
            lookup_column: r["lookup_column"].as_str().unwrap_or_default().to_string(),
            add_columns: serde_json::from_value(r["add_columns"].clone()).unwrap_or_default(),
            add_types: serde_json::from_value(r["add_types"].clone()).unwrap_or_default(),
            as_of: r["as_of"].as_str().and_then(|s| s.parse().ok()).unwrap_or(Lsn(0)),
        })
        .collect()
}

/// A sink's persisted copies, where the worker's cache misses go (inside the read transaction).
pub struct Copy {
    /// The extension's schema, quoted.
    pub schema: String,
    /// The sink (uuid text).
    pub sink_id: String,
}

impl LookupSource for Copy {
    fn fetch(&mut self, id: LookupId, key: &str) -> Result<Option<LookupRow>, String> {
        let vals = catalog::select_one::<Vec<Option<String>>>(
            &format!(
                "SELECT vals FROM {}._cdc_lookup_rows
                  WHERE sink_id = $1::uuid AND table_oid = $2::bigint::oid AND position = $3 AND lookup_key = $4",
                self.schema
            ),
            &[self.sink_id.as_str().into(), i64::from(id.table_oid).into(), (id.position as i32).into(), key.into()],
        );
        Ok(vals.map(|v| v.into_iter().map(|s| s.map(Box::from)).collect()))
    }
}

/// Writes what the worker's copies changed (call before confirming the slot, in a transaction of
/// its own, so the persisted copy is never behind the slot).
pub fn write(schema: &str, sink_id: &str, flushes: &[LookupFlush]) {
    for f in flushes {
        let (table, position) = (i64::from(f.id.table_oid), f.id.position as i32);
        let ids = || vec![sink_id.into(), table.into(), position.into()];
        let which = "sink_id = $1::uuid AND table_oid = $2::bigint::oid AND position = $3";
        if f.truncate {
            catalog::run(&format!("DELETE FROM {schema}._cdc_lookup_rows WHERE {which}"), &ids());
        }
        let (set, gone): (Vec<_>, Vec<_>) = f.rows.iter().partition(|(_, row)| row.is_some());
        if !gone.is_empty() {
            let keys: Vec<String> = gone.iter().map(|(k, _)| k.clone()).collect();
            let mut args = ids();
            args.push(keys.into());
            catalog::run(
                &format!("DELETE FROM {schema}._cdc_lookup_rows WHERE {which} AND lookup_key = ANY ($4::text[])"),
                &args,
            );
        }
        if !set.is_empty() {
            let rows: Value = set
                .iter()
                .map(|(k, row)| json!([k, row.as_ref().map(|r| r.iter().map(|v| v.as_deref()).collect::<Vec<_>>())]))
                .collect();
            let mut args = ids();
            args.push(JsonB(rows).into());
            catalog::run(
                &format!(
                    "INSERT INTO {schema}._cdc_lookup_rows AS r (sink_id, table_oid, position, lookup_key, vals)
                     SELECT $1::uuid, $2::bigint::oid, $3, e->>0, ARRAY(SELECT jsonb_array_elements_text(e->1))
                       FROM jsonb_array_elements($4) e
                     ON CONFLICT (sink_id, table_oid, position, lookup_key) DO UPDATE SET vals = EXCLUDED.vals"
                ),
                &args,
            );
        }
        let mut args = ids();
        args.push(f.as_of.to_string().into());
        catalog::run(&format!("UPDATE {schema}._cdc_lookups SET as_of_lsn = $4::pg_lsn WHERE {which}"), &args);
    }
}

/// Gives a sink's assembler the lookup copies its tables' `enrich` transformations read, copying
/// the lookup tables it has none of yet (a sink whose slot the worker created). A lookup table
/// dropped since its table was enabled needs an operator (`error`); the rest is retried.
pub fn bind(schema: &str, row: &SinkRow, assembler: &mut Assembler, tables: &SinkTables) -> Result<(), Failure> {
    let id = row.id.as_str();
    if tables.values().all(|c| c.enrich.is_empty()) {
        if assembler.has_lookups() {
            assembler.lookups_mut().set_bindings(&[]);
        }
        return Ok(());
    }
    let mut bound = run_tx(|| bindings(schema, id))
        .map_err(|e| Failure::new(SinkState::Retrying, format!("cannot read the lookup copies: {e}")))?;
    let has = |b: &[LookupBinding], oid: u32, i: usize| {
        b.iter().any(|b| b.id.table_oid == oid && b.id.position as usize == i)
    };
    let missing = tables.iter().any(|(oid, c)| (0..c.enrich.len()).any(|i| !has(&bound, *oid, i)));
    if missing {
        let seeded = run_tx(|| {
            let current = bindings(schema, id);
            for spec in specs_for_sink(schema, row.tables.as_deref()) {
                if !has(&current, spec.table_oid, spec.position as usize) {
                    if let Some(why) = dropped(&spec) {
                        return Err(why);
                    }
                    seed(schema, id, &spec);
                }
            }
            Ok(bindings(schema, id))
        });
        bound = match seeded {
            Ok(Ok(b)) => {
                pgrx::log!("pg_cdc sink \"{}\": copied its lookup tables", row.name);
                b
            }
            // Retrying cannot bring a dropped table back: an operator must re-enable.
            Ok(Err(why)) => {
                let message = format!("{why}; cdc_enable the table again with a config that fits");
                return Err(Failure::new(SinkState::Error, message));
            }
            Err(e) => return Err(Failure::new(SinkState::Retrying, format!("cannot copy the lookup tables: {e}"))),
        };
    }
    let l = assembler.lookups_mut();
    l.set_capacity(gucs::ENRICH_CACHE_ROWS.get().max(1) as usize);
    l.set_bindings(&bound);
    Ok(())
}
