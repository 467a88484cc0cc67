//! `cdc_enable` and `cdc_disable`: which tables are captured, and how.
use cdc_core::config::{parse_capture_config, TableShape};
use cdc_core::{CdcError, ErrorKind};
use pgrx::prelude::*;
use pgrx::{JsonB, Uuid};
use serde_json::Value;

use super::{check_prerequisites, required, schema};
use crate::catalog::{self, str_field, strings_field, PUBLICATION, PUBLICATION_INSERTS};
use crate::errors::{raise, OrRaise};

/// Reads the shape of a table and refuses relations that cannot be captured.
pub(crate) fn table_shape(oid: pg_sys::Oid) -> (Value, TableShape) {
    let v = catalog::json(catalog::TABLE_SHAPE_SQL, &[oid.into()]).unwrap_or_else(|| {
        raise(CdcError::new(ErrorKind::UndefinedTable, format!("relation with OID {} does not exist", oid.to_u32())))
    });
    let display = str_field(&v, "display").to_string();
    let fail = |kind, msg: String, hint: &str| -> ! { raise(CdcError::new(kind, msg).hint(hint)) };
    match str_field(&v, "relkind") {
        "r" => {}
        "p" => fail(
            ErrorKind::FeatureNotSupported,
            format!("{display} is a partitioned table; capturing partitioned tables is not supported yet"),
            "Enable capture on each partition instead.",
        ),
        "v" => {
            fail(ErrorKind::WrongObjectType, format!("{display} is a view"), "Capture the tables the view reads from.")
        }
        "m" => fail(
            ErrorKind::WrongObjectType,
            format!("{display} is a materialized view; its refreshes are not logically decoded"),
            "Capture the tables it is built from.",
        ),
        "f" => fail(
            ErrorKind::WrongObjectType,
            format!("{display} is a foreign table; its rows live on another server"),
            "Capture the table on the server that stores it.",
        ),
        other => {
            let what = match other {
                "S" => "a sequence",
                "i" | "I" => "an index",
                "c" => "a composite type",
                "t" => "a TOAST table",
                _ => "not an ordinary table",
            };
            fail(ErrorKind::WrongObjectType, format!("{display} is {what}"), "cdc_enable takes an ordinary table.")
        }
    }
    match str_field(&v, "persistence") {
        "u" => fail(
            ErrorKind::PrerequisiteState,
            format!("{display} is an unlogged table; its changes are not written to the WAL"),
            "ALTER TABLE ... SET LOGGED first.",
        ),
        "t" => fail(
            ErrorKind::PrerequisiteState,
            format!("{display} is a temporary table; its changes are not written to the WAL"),
            "Capture a permanent table.",
        ),
        _ => {}
    }
    if matches!(str_field(&v, "schema"), "pg_catalog" | "information_schema")
        || v.get("is_extension_member") == Some(&Value::Bool(true))
    {
        fail(ErrorKind::WrongObjectType, format!("{display} is a system table"), "Capture your own tables.");
    }
    // Built-in types by OID; anything else (enums, composites, extension types) is text to
    // expressions, as it is to events.
    let builtin = cdc_core::types::TypeRegistry::new();
    let shape = TableShape {
        display_name: display,
        columns: strings_field(&v, "columns"),
        primary_key: strings_field(&v, "primary_key"),
        replica_identity_index: strings_field(&v, "ri_index"),
        replica_identity: str_field(&v, "replident").bytes().next().unwrap_or(b'd'),
        generated_columns: strings_field(&v, "generated"),
        column_kinds: v
            .get("column_types")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|o| match o.as_i64() {
                        // An array (the worker knows its element type; expressions only test it for NULL).
                        Some(-1) => cdc_core::types::TypeKind::Array { element: 0, delimiter: b',' },
                        o => builtin.kind(o.unwrap_or(0) as u32),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    };
    (v, shape)
}

/// Starts capturing a table. Returns the table's `publication_id`.
///
/// `config` is the capture config (see the SQL reference): `operations`, `include_columns`,
/// `exclude_columns`, `key_columns`, `include_before_image`, `include_transaction_info`,
/// `partition_key`, ... Calling it again for a captured table replaces its config.
///
/// ```sql
/// SELECT cdc_enable(table_name => 'orders', config => '{"include_before_image": true}');
/// ```
// Declared by hand so the argument is a plain regclass: pgrx's PgRelation would open the relation
// before our own checks run (an OID that names no relation would be XX000 instead of 42P01).
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_enable(table_name regclass, config jsonb DEFAULT '{}') RETURNS uuid
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_enable(table_name: Option<pg_sys::Oid>, config: Option<JsonB>) -> Uuid {
    let _quiet = super::quiet_statement();
    let oid = required(table_name, "table_name");
    let config = required(config, "config");
    enable(oid, config.0)
}

/// What `cdc_enable` does, for it and `cdc_enable_multicloud`: validates `config` against the
/// table, then records it (replacing an earlier one).
pub(crate) fn enable(oid: pg_sys::Oid, config: Value) -> Uuid {
    check_prerequisites();
    super::access::require_select(oid, "capture");
    let _entry = super::access::enter();
    let schema = schema();
    let (info, shape) = super::access::as_caller(|| table_shape(oid));
    let cfg = parse_capture_config(&config, &shape).or_raise();
    super::sinks::refuse_event_table(&schema, oid, &shape.display_name);
    if cfg.tokenizes() {
        crate::keys::require_token_key(&format!("the capture config of {}", shape.display_name));
    }
    let qualified = str_field(&info, "qualified").to_string();
    // A table created again under the name of a dropped one that sinks or lookups wait for: bound
    // to them first, so the checks below see it where it belongs.
    super::rebind::rebind(&schema, oid, &qualified);
    // Regional routing needs the 0.4.0 catalog; its sinks must exist and carry the table.
    let has_routing = catalog::has(&schema, "_cdc_route_offsets");
    if let Some(routing) = &cfg.routing {
        super::multicloud::check_routes(&schema, oid, &shape.display_name, routing, has_routing);
    }

    let routing_col = if has_routing { "routing_lsn::text" } else { "NULL::text" };
    let existing = catalog::json(
        &format!(
            "SELECT jsonb_build_object('id', publication_id, 'prev', previous_replica_identity::text, 'prev_index', previous_replica_identity_index::bigint, \
                    'routing_lsn', {routing_col}) \
             FROM {schema}._cdc_publications WHERE table_oid = $1"
        ),
        &[oid.into()],
    );
    let was_routed = existing.as_ref().is_some_and(|e| e.get("routing_lsn").is_some_and(|v| !v.is_null()));

    // Before images need REPLICA IDENTITY FULL; remember what it was so cdc_disable can restore it.
    let current_ri = shape.replica_identity;
    let (mut prev_ri, mut prev_index): (Option<String>, Option<i64>) = match &existing {
        Some(e) => {
            (e.get("prev").and_then(Value::as_str).map(str::to_string), e.get("prev_index").and_then(Value::as_i64))
        }
        None => (None, None),
    };
    if cfg.before_image && current_ri != b'f' {
        prev_ri = Some((current_ri as char).to_string());
        prev_index = info.get("ri_index_oid").and_then(Value::as_i64);
        catalog::run(&format!("ALTER TABLE {qualified} REPLICA IDENTITY FULL"), &[]);
        pgrx::notice!(
            "pg_cdc set REPLICA IDENTITY FULL on {} so updates and deletes carry the before image; cdc_disable restores the previous setting",
            shape.display_name
        );
    } else if !cfg.before_image && current_ri == b'f' && prev_ri.is_some() {
        // Re-enabled without before images: undo our own earlier change.
        restore_replica_identity(&qualified, prev_ri.as_deref(), prev_index);
        prev_ri = None;
        prev_index = None;
    }

    let lookup_oids = resolve_lookups(oid, &cfg, &config);
    // Insert-only tables go into the publication that publishes no updates or deletes, unless a
    // captured table enriches from them (its copy needs every change).
    let is_lookup = lookup_oids.contains(&oid.to_u32()) || used_as_lookup(&schema, oid.to_u32(), Some(oid.to_u32()));
    let target =
        if cfg.operations.update || cfg.operations.delete || is_lookup { PUBLICATION } else { PUBLICATION_INSERTS };
    set_publication(&info, &qualified, Some(target));
    super::context::set_trigger(&qualified, &schema, cfg.needs_context().then_some(cfg.query_text));

    let key_columns = cfg.key_columns.clone();
    let previous_lookups = previous_lookup_oids(&schema, oid.to_u32());
    let config_value = config.clone();
    // A routing that starts, changes or ends takes effect at a WAL position every sink sees.
    let routing_lsn = if cfg.routing.is_some() || was_routed {
        Some(super::multicloud::mark_routing_change(&qualified, oid))
    } else {
        None
    };
    crate::worker::launcher::catalog_changed();
    let id = Spi::get_one_with_args::<Uuid>(
        &format!(
            "INSERT INTO {schema}._cdc_publications AS p
                 (table_name, config, table_oid, key_columns, previous_replica_identity, previous_replica_identity_index,
                  lookup_oids)
             VALUES ($1, $2, $3, $4, $5::\"char\", $6::bigint::oid, $7::bigint[]::oid[])
             ON CONFLICT (table_oid) DO UPDATE
                SET table_name = EXCLUDED.table_name, config = EXCLUDED.config, key_columns = EXCLUDED.key_columns,
                    previous_replica_identity = EXCLUDED.previous_replica_identity,
                    previous_replica_identity_index = EXCLUDED.previous_replica_identity_index, status = 'active',
                    lookup_oids = EXCLUDED.lookup_oids
             RETURNING publication_id"
        ),
        &[
            shape.display_name.clone().into(),
            JsonB(config).into(),
            oid.into(),
            key_columns.into(),
            prev_ri.into(),
            prev_index.into(),
            lookup_oids.iter().map(|&o| i64::from(o)).collect::<Vec<i64>>().into(),
        ],
    )
    .unwrap_or_else(|e| pgrx::error!("pg_cdc: cannot record the captured table: {e}"))
    .unwrap_or_else(|| pgrx::error!("pg_cdc: INSERT returned no row"));
    if catalog::has_column(&schema, "_cdc_publications", "lookup_names") {
        // The lookup tables' names, kept to bind a table of that name created again after a DROP.
        let names: Vec<String> =
            lookup_oids.iter().map(|&o| catalog::qualified_name(pg_sys::Oid::from(o)).unwrap_or_default()).collect();
        catalog::run(
            &format!("UPDATE {schema}._cdc_publications SET lookup_names = $2 WHERE table_oid = $1"),
            &[oid.into(), names.into()],
        );
    }
    if let Some(lsn) = routing_lsn {
        catalog::run(
            &format!("UPDATE {schema}._cdc_publications SET routing_lsn = $2::pg_lsn WHERE table_oid = $1"),
            &[oid.into(), lsn.into()],
        );
    }
    super::schema::record_first_version(&schema, oid, cfg.schema_evolution.mode);
    // Sink workers whose catalog copy is older than this transaction read it again before they
    // decode anything after it (cdc_core::pipeline::CAPTURE_MESSAGE_PREFIX).
    catalog::emit_message(cdc_core::pipeline::CAPTURE_MESSAGE_PREFIX, &oid.to_u32().to_string());
    if existing.is_none() {
        // The sinks that carry it from now on deliver the rows it holds too.
        super::snapshots::snapshot_added_table(&schema, oid);
    }
    // Every sink that captures the table gets a fresh copy of each lookup table, as of now.
    catalog::run(&format!("DELETE FROM {schema}._cdc_lookups WHERE table_oid = $1"), &[oid.into()]);
    let specs = crate::lookups::specs_of_config(oid.to_u32(), &config_value, &lookup_oids);
    if !specs.is_empty() {
        for sink in crate::lookups::sinks_of_table(&schema, oid.to_u32()) {
            for spec in &specs {
                crate::lookups::seed(&schema, &sink, spec);
            }
        }
    }
    for l in previous_lookups.iter().chain(&lookup_oids) {
        sync_lookup_publication(&schema, *l);
    }
    if existing.is_some() {
        pgrx::notice!("capture config of {} replaced", shape.display_name);
    }
    if cfg.exactly_once_required {
        let weaker = at_least_once_sinks_of(&schema, oid.to_u32());
        if !weaker.is_empty() {
            pgrx::warning!(
                "the capture config of {} asks for exactly-once delivery, but these sinks deliver its changes at least once: {}",
                shape.display_name,
                weaker.join(", ")
            );
        }
    }
    id
}

/// The at-least-once sinks that carry a table (their names, sorted).
fn at_least_once_sinks_of(schema: &str, oid: u32) -> Vec<String> {
    catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(sink_name ORDER BY sink_name), '[]') FROM {schema}._cdc_sinks \
              WHERE delivery_mode <> 'exactly_once' AND (table_oids IS NULL OR $1::bigint::oid = ANY (table_oids))"
        ),
        &[i64::from(oid).into()],
    )
    .and_then(|v| serde_json::from_value(v).ok())
    .unwrap_or_default()
}

/// The captured tables a sink carries (`oids`, or every captured table when `None`), with their
/// parsed capture configs: (table name, config).
pub(crate) fn captured_configs(
    schema: &str,
    oids: Option<&[pg_sys::Oid]>,
) -> Vec<(String, cdc_core::config::CaptureConfig)> {
    let rows = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_array(table_name, config, key_columns) ORDER BY table_name), '[]') \
               FROM {schema}._cdc_publications WHERE $1::oid[] IS NULL OR table_oid = ANY ($1::oid[])"
        ),
        &[oids.map(|o| o.to_vec()).into()],
    )
    .unwrap_or_default();
    let mut out = Vec::new();
    for row in rows.as_array().into_iter().flatten() {
        let name = row[0].as_str().unwrap_or_default().to_string();
        let keys: Vec<String> = serde_json::from_value(row[2].clone()).unwrap_or_default();
        if let Ok(cfg) = cdc_core::config::parse_stored_capture_config(&row[1], keys) {
            out.push((name, cfg));
        }
    }
    out
}

/// Creates a random tokenization key (32 bytes as 64 hex digits) in the file `pg_cdc_token.key`
/// in the data directory, readable by the server's OS user only. pg_cdc uses that file whenever
/// `cdc.tokenization_key_file` is not set, so `tokenize` works with no further setting. Refuses
/// (42710) when the file exists: a new key changes every token. The key is never shown; back the
/// file up with the data directory (tokens made with a lost key can never be recomputed).
///
/// ```sql
/// SELECT cdc_create_tokenization_key();
/// ```
#[pg_extern(volatile)]
fn cdc_create_tokenization_key() -> String {
    let set = crate::gucs::string(&crate::gucs::TOKENIZATION_KEY_FILE);
    if !set.is_empty() {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                "cdc.tokenization_key_file is set, so pg_cdc uses that file and would ignore a new default key",
            )
            .hint("Put the key in that file, or RESET cdc.tokenization_key_file (ALTER SYSTEM) and reload first."),
        );
    }
    match crate::keys::create_token_key() {
        Ok(()) => {}
        Err(e) if e.contains("already exists") => raise(
            CdcError::new(ErrorKind::DuplicateObject, e)
                .hint("pg_cdc already has a tokenization key; a new one would change every token. Remove the file by hand to replace it."),
        ),
        Err(e) => raise(CdcError::new(ErrorKind::Internal, e)),
    }
    let dir = catalog::select_one::<String>("SELECT current_setting('data_directory')", &[]).unwrap_or_default();
    format!("{dir}/{}", crate::keys::DEFAULT_TOKEN_KEY_FILE)
}

/// Resolves and checks the lookup table of each `enrich` transformation: an ordinary table whose
/// replica identity key is the lookup column, of the source column's type, whose updates and
/// deletes can be published. Returns their OIDs in config order.
fn resolve_lookups(table: pg_sys::Oid, cfg: &cdc_core::config::CaptureConfig, raw: &Value) -> Vec<u32> {
    if cfg.enrich.is_empty() {
        return Vec::new();
    }
    let isolation = catalog::transaction_isolation();
    if isolation != "read committed" {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!(
                    "an enrich transformation copies its lookup table, which needs READ COMMITTED, not {isolation}"
                ),
            )
            .detail("The copy must hold every change committed before it, and this transaction's snapshot is older.")
            .hint("Run cdc_enable in its own READ COMMITTED transaction."),
        );
    }
    // Each enrich transformation's index in the config, for messages.
    let at: Vec<usize> = raw["transformations"]
        .as_array()
        .map(|a| (0..a.len()).filter(|&i| a[i]["type"] == "enrich").collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (i, e) in cfg.enrich.iter().enumerate() {
        let path = format!("config.transformations[{}]", at.get(i).copied().unwrap_or(i));
        let loid = super::access::as_caller(|| {
            catalog::select_one::<pg_sys::Oid>("SELECT to_regclass($1)::oid", &[e.lookup_table.as_str().into()])
        })
        .unwrap_or_else(|| {
            raise(CdcError::new(
                ErrorKind::UndefinedTable,
                format!("{path}.lookup_table: relation \"{}\" does not exist", e.lookup_table),
            ))
        });
        super::access::require_select(loid, "enrich from");
        check_lookup_table(&path, table, e, loid).or_raise();
        out.push(loid.to_u32());
    }
    out
}

/// Checks that `loid` can be the lookup table of enrich transformation `e` of `table` (`path` names
/// it in messages): an ordinary table whose replica identity key is the lookup column, of the source
/// column's type, whose updates and deletes can be published.
pub(crate) fn check_lookup_table(
    path: &str,
    table: pg_sys::Oid,
    e: &cdc_core::config::Enrich,
    loid: pg_sys::Oid,
) -> Result<(), CdcError> {
    let (linfo, lshape) = table_shape(loid);
    cdc_core::config::check_lookup(path, e, &lshape)?;
    if strings_field(&linfo, "publications").iter().any(|p| p == PUBLICATION_INSERTS) {
        return Err(CdcError::new(
            ErrorKind::PrerequisiteState,
            format!(
                "{path}.lookup_table: {} is captured for inserts only, so its updates and deletes are not in the WAL stream",
                lshape.display_name
            ),
        )
        .hint("Capture it with updates and deletes too, or not at all, to use it as a lookup table."));
    }
    let types = catalog::json(
        "SELECT jsonb_build_array(format_type(s.atttypid, NULL), format_type(l.atttypid, NULL), s.atttypid = l.atttypid)
           FROM pg_attribute s, pg_attribute l
          WHERE s.attrelid = $1 AND s.attname = $2 AND l.attrelid = $3 AND l.attname = $4",
        &[table.into(), e.source_column.as_str().into(), loid.into(), e.lookup_column.as_str().into()],
    )
    .unwrap_or_default();
    if types.get(2) == Some(&Value::Bool(false)) {
        return Err(CdcError::new(
            ErrorKind::DatatypeMismatch,
            format!(
                "{path}: source_column \"{}\" is {} but lookup_column \"{}\" is {}",
                e.source_column,
                types[0].as_str().unwrap_or("?"),
                e.lookup_column,
                types[1].as_str().unwrap_or("?")
            ),
        )
        .hint("Keys are matched by their text; use columns of the same type."));
    }
    Ok(())
}

/// Whether a captured table other than `except` enriches from `oid`.
fn used_as_lookup(schema: &str, oid: u32, except: Option<u32>) -> bool {
    catalog::select_one::<bool>(
        &format!(
            "SELECT EXISTS (SELECT 1 FROM {schema}._cdc_publications
                             WHERE $1::bigint::oid = ANY (lookup_oids) AND table_oid IS DISTINCT FROM $2::bigint::oid)"
        ),
        &[i64::from(oid).into(), except.map(i64::from).into()],
    )
    .unwrap_or(false)
}

/// The lookup tables of a table's current config (before it is replaced or removed).
fn previous_lookup_oids(schema: &str, oid: u32) -> Vec<u32> {
    catalog::json(
        &format!(
            "SELECT to_jsonb(lookup_oids::bigint[]) FROM {schema}._cdc_publications WHERE table_oid = $1::bigint::oid"
        ),
        &[i64::from(oid).into()],
    )
    .and_then(|v| serde_json::from_value(v).ok())
    .unwrap_or_default()
}

/// Puts a lookup table in the publication that publishes every change while a captured table
/// enriches from it, and takes it out once none does (unless it is captured itself).
fn sync_lookup_publication(schema: &str, oid: u32) {
    let Some(info) = catalog::json(catalog::TABLE_SHAPE_SQL, &[pg_sys::Oid::from(oid).into()]) else {
        return; // dropped
    };
    let qualified = str_field(&info, "qualified").to_string();
    let captured = catalog::select_one::<bool>(
        &format!("SELECT EXISTS (SELECT 1 FROM {schema}._cdc_publications WHERE table_oid = $1::bigint::oid)"),
        &[i64::from(oid).into()],
    )
    .unwrap_or(false);
    if used_as_lookup(schema, oid, None) {
        set_publication(&info, &qualified, Some(PUBLICATION));
    } else if !captured {
        set_publication(&info, &qualified, None);
    }
}

/// Puts the table in exactly the `target` pg_cdc publication (or in none). ONLY: inheritance
/// children are captured (or not) on their own.
fn set_publication(info: &Value, qualified: &str, target: Option<&str>) {
    let current = strings_field(info, "publications");
    for publication in [PUBLICATION, PUBLICATION_INSERTS] {
        let member = current.iter().any(|p| p == publication);
        let wanted = target == Some(publication);
        if member && !wanted {
            catalog::run(&format!("ALTER PUBLICATION {publication} DROP TABLE ONLY {qualified}"), &[]);
        } else if wanted && !member {
            catalog::run(&format!("ALTER PUBLICATION {publication} ADD TABLE ONLY {qualified}"), &[]);
        }
    }
}

fn restore_replica_identity(qualified: &str, prev: Option<&str>, prev_index: Option<i64>) {
    let clause = match (prev, prev_index) {
        (Some("n"), _) => "NOTHING".to_string(),
        (Some("i"), Some(idx)) => {
            let name = crate::catalog::select_one::<String>(
                "SELECT quote_ident(relname::text) FROM pg_class WHERE oid = $1::bigint::oid",
                &[idx.into()],
            );
            match name {
                Some(n) => format!("USING INDEX {n}"),
                None => "DEFAULT".to_string(), // the index is gone
            }
        }
        _ => "DEFAULT".to_string(),
    };
    catalog::run(&format!("ALTER TABLE {qualified} REPLICA IDENTITY {clause}"), &[]);
}

/// Stops capturing a table: removes it from the publication, restores the REPLICA IDENTITY that
/// `cdc_enable` changed, and forgets its config and delivery progress. Changes not yet delivered
/// when this commits are not delivered.
///
/// ```sql
/// SELECT cdc_disable('orders');
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_disable(table_name regclass) RETURNS void
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
pub(crate) fn cdc_disable(table_name: Option<pg_sys::Oid>) {
    let oid = required(table_name, "table_name");
    super::access::require_select(oid, "stop capturing");
    let _entry = super::access::enter();
    let schema = schema();
    let previous_lookups = previous_lookup_oids(&schema, oid.to_u32());
    crate::worker::launcher::catalog_changed();
    let Some(row) = catalog::json_write(
        &format!(
            "DELETE FROM {schema}._cdc_publications WHERE table_oid = $1 \
             RETURNING jsonb_build_object('prev', previous_replica_identity::text, 'prev_index', previous_replica_identity_index::bigint, 'name', table_name)"
        ),
        &[oid.into()],
    ) else {
        super::not_captured(oid, super::LIST_CAPTURED);
    };
    let (info, _) = table_shape(oid);
    let qualified = str_field(&info, "qualified");
    // A table another captured table enriches from stays where its copies see every change.
    let target = used_as_lookup(&schema, oid.to_u32(), None).then_some(PUBLICATION);
    set_publication(&info, qualified, target);
    super::context::set_trigger(qualified, &schema, None);
    if let Some(prev) = row.get("prev").and_then(Value::as_str) {
        if str_field(&info, "replident") == "f" {
            restore_replica_identity(qualified, Some(prev), row.get("prev_index").and_then(Value::as_i64));
        }
    }
    catalog::run(&format!("DELETE FROM {schema}._cdc_offsets WHERE table_oid = $1"), &[oid.into()]);
    if catalog::has(&schema, "_cdc_route_offsets") {
        // Its regional_routing goes with its config; so do the counts of its routes.
        catalog::run(&format!("DELETE FROM {schema}._cdc_route_offsets WHERE table_oid = $1"), &[oid.into()]);
    }
    catalog::run(&format!("DELETE FROM {schema}._cdc_lookups WHERE table_oid = $1"), &[oid.into()]);
    super::schema::forget(&schema, oid);
    for l in previous_lookups {
        sync_lookup_publication(&schema, l);
    }
}
