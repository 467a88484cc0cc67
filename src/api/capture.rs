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
fn table_shape(oid: pg_sys::Oid) -> (Value, TableShape) {
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
    let oid = required(table_name, "table_name");
    let config = required(config, "config");
    check_prerequisites();
    let schema = schema();
    let (info, shape) = table_shape(oid);
    let cfg = parse_capture_config(&config.0, &shape).or_raise();
    let qualified = str_field(&info, "qualified").to_string();

    let existing = catalog::json(
        &format!(
            "SELECT jsonb_build_object('id', publication_id, 'prev', previous_replica_identity::text, 'prev_index', previous_replica_identity_index::bigint) \
             FROM {schema}._cdc_publications WHERE table_oid = $1"
        ),
        &[oid.into()],
    );

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

    // Insert-only tables go into the publication that publishes no updates or deletes.
    let target = if cfg.operations.update || cfg.operations.delete { PUBLICATION } else { PUBLICATION_INSERTS };
    set_publication(&info, &qualified, Some(target));
    super::context::set_trigger(&qualified, &schema, cfg.needs_context().then_some(cfg.query_text));

    let key_columns = cfg.key_columns.clone();
    let id = Spi::get_one_with_args::<Uuid>(
        &format!(
            "INSERT INTO {schema}._cdc_publications AS p
                 (table_name, config, table_oid, key_columns, previous_replica_identity, previous_replica_identity_index)
             VALUES ($1, $2, $3, $4, $5::\"char\", $6::bigint::oid)
             ON CONFLICT (table_oid) DO UPDATE
                SET table_name = EXCLUDED.table_name, config = EXCLUDED.config, key_columns = EXCLUDED.key_columns,
                    previous_replica_identity = EXCLUDED.previous_replica_identity,
                    previous_replica_identity_index = EXCLUDED.previous_replica_identity_index, status = 'active'
             RETURNING publication_id"
        ),
        &[
            shape.display_name.clone().into(),
            config.into(),
            oid.into(),
            key_columns.into(),
            prev_ri.into(),
            prev_index.into(),
        ],
    )
    .unwrap_or_else(|e| pgrx::error!("pg_cdc: cannot record the captured table: {e}"))
    .unwrap_or_else(|| pgrx::error!("pg_cdc: INSERT returned no row"));
    if existing.is_some() {
        pgrx::notice!("capture config of {} replaced", shape.display_name);
    }
    id
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
fn cdc_disable(table_name: Option<pg_sys::Oid>) {
    let oid = required(table_name, "table_name");
    let schema = schema();
    let Some(row) = catalog::json_write(
        &format!(
            "DELETE FROM {schema}._cdc_publications WHERE table_oid = $1 \
             RETURNING jsonb_build_object('prev', previous_replica_identity::text, 'prev_index', previous_replica_identity_index::bigint, 'name', table_name)"
        ),
        &[oid.into()],
    ) else {
        let name = crate::catalog::select_one::<String>("SELECT $1::regclass::text", &[oid.into()]).unwrap_or_default();
        raise(CdcError::new(ErrorKind::UndefinedObject, format!("table {name} is not captured")).hint("SELECT table_name FROM _cdc_publications lists the captured tables."));
    };
    let (info, _) = table_shape(oid);
    let qualified = str_field(&info, "qualified");
    set_publication(&info, qualified, None);
    super::context::set_trigger(qualified, &schema, None);
    if let Some(prev) = row.get("prev").and_then(Value::as_str) {
        if str_field(&info, "replident") == "f" {
            restore_replica_identity(qualified, Some(prev), row.get("prev_index").and_then(Value::as_i64));
        }
    }
    catalog::run(&format!("DELETE FROM {schema}._cdc_offsets WHERE table_oid = $1"), &[oid.into()]);
}
