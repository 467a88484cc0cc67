//! A table created again under the name of a dropped one, bound by `cdc_enable`.
//!
//! Sinks and enrich transformations keep tables by OID, so a RENAME changes nothing for them. When a
//! table they name is dropped, the `sql_drop` trigger (`_cdc_forget_dropped_tables`) keeps its
//! schema-qualified name (`_cdc_sinks.table_names`, `_cdc_publications.lookup_names`) and puts OID 0
//! in its place; `cdc_status().missing_tables` lists it. `cdc_enable` of a table of that name binds it
//! there again: a sink then carries it (its rows arrive as an `added` snapshot, like any table enabled
//! while a sink carries it), an enrich transformation reads it (its copies are made again, as of now).
use cdc_core::{CdcError, ErrorKind};
use pgrx::prelude::*;
use serde_json::Value;

use crate::catalog;

/// Binds the table `oid`, named `qualified` (as [`catalog::qualified_name`] writes it), wherever a
/// dropped table of that name waits for one. Runs before the caller's checks that need the sinks to
/// carry the table (regional routes), and before it puts the table in a publication (a lookup table
/// needs the one that publishes updates and deletes).
pub(crate) fn rebind(schema: &str, oid: pg_sys::Oid, qualified: &str) {
    if catalog::has_column(schema, "_cdc_sinks", "table_names") {
        rebind_sinks(schema, oid, qualified);
    }
    if catalog::has_column(schema, "_cdc_publications", "lookup_names") {
        rebind_lookups(schema, oid, qualified);
    }
}

/// The sinks whose `tables` named a dropped table called `qualified`.
fn rebind_sinks(schema: &str, oid: pg_sys::Oid, qualified: &str) {
    let bound = catalog::json_write(
        &format!(
            "WITH b AS (
                UPDATE {schema}._cdc_sinks s
                   SET table_oids = ARRAY(SELECT CASE WHEN u.o = 0 AND u.n = $2 THEN $1 ELSE u.o END
                                            FROM unnest(s.table_oids, s.table_names) WITH ORDINALITY u(o, n, i)
                                           ORDER BY u.i)
                 WHERE EXISTS (SELECT 1 FROM unnest(s.table_oids, s.table_names) u(o, n) WHERE u.o = 0 AND u.n = $2)
                   AND NOT $1 = ANY (s.table_oids)
                RETURNING s.sink_name)
             SELECT coalesce(jsonb_agg(sink_name ORDER BY sink_name), '[]') FROM b"
        ),
        &[oid.into(), qualified.into()],
    );
    for sink in bound.as_ref().and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        pgrx::notice!(
            "sink \"{sink}\" carries {qualified} again (a table of that name was dropped); it delivers the rows the table holds first"
        );
    }
}

/// The enrich transformations whose lookup table was a dropped table called `qualified`: checked
/// against the new table as `cdc_enable` checks a lookup table (one that does not fit stays missing,
/// with a WARNING), then their copies are made again for every sink of their table.
fn rebind_lookups(schema: &str, oid: pg_sys::Oid, qualified: &str) {
    let waiting = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_array(p.table_oid::bigint, u.i - 1, p.config, p.table_name)
                                       ORDER BY p.table_name, u.i), '[]')
               FROM {schema}._cdc_publications p, unnest(p.lookup_oids, p.lookup_names) WITH ORDINALITY u(o, n, i)
              WHERE u.o = 0 AND u.n = $1 AND p.table_oid <> $2"
        ),
        &[qualified.into(), oid.into()],
    )
    .unwrap_or_default();
    for w in waiting.as_array().into_iter().flatten() {
        let (table, position) = (w[0].as_u64().unwrap_or(0) as u32, w[1].as_u64().unwrap_or(0) as usize);
        let name = w[3].as_str().unwrap_or_default();
        let Ok(cfg) = cdc_core::config::parse_stored_capture_config(&w[2], Vec::new()) else { continue };
        let Some(e) = cfg.enrich.get(position) else { continue };
        let path = format!("the enrich transformation {position} of {name}");
        let fits = super::capture::check_lookup_table(&path, pg_sys::Oid::from(table), e, oid).and_then(|()| {
            let isolation = catalog::transaction_isolation();
            if isolation == "read committed" {
                Ok(())
            } else {
                Err(CdcError::new(
                    ErrorKind::PrerequisiteState,
                    format!("its copy needs a READ COMMITTED transaction, not {isolation}"),
                ))
            }
        });
        if let Err(why) = fits {
            pgrx::warning!(
                "{name} enriches from a dropped table named {qualified}, but this one cannot take its place ({}); it stays missing",
                why.message
            );
            continue;
        }
        catalog::run(
            &format!("UPDATE {schema}._cdc_publications SET lookup_oids[$2] = $3 WHERE table_oid = $1::bigint::oid"),
            &[i64::from(table).into(), (position as i32 + 1).into(), oid.into()],
        );
        let spec = crate::lookups::Spec {
            table_oid: table,
            position: position as u32,
            lookup_oid: oid.to_u32(),
            lookup_column: e.lookup_column.clone(),
            add_columns: e.add_columns.clone(),
        };
        for sink in crate::lookups::sinks_of_table(schema, table) {
            crate::lookups::seed(schema, &sink, &spec);
        }
        pgrx::notice!("{name} enriches from {qualified} again (a table of that name was dropped), as of now");
    }
}
