//! Schema history (issue 15): `_cdc_schema_versions` kept by `cdc_enable` (version 1) and the
//! `_cdc_schema_changes` event trigger (one version per DDL that changes a captured table's
//! columns, carrying the capture config along a rename), `cdc_schema_history`,
//! `cdc_force_schema_break` and `cdc_check_compatibility`. The rules are
//! [`cdc_core::schema`]'s; the check is local (our history and the table's mode), so a DDL never
//! waits on the network while it holds its lock.
use cdc_core::config::sink::Format;
use cdc_core::schema::{self as rules, Field, Mode};
use cdc_core::{CdcError, ErrorKind};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::{JsonB, PgLogLevel, PgSqlErrorCode};
use serde_json::{json, Value};

use super::{required, schema, table_display_name};
use crate::catalog;
use crate::errors::{raise, OrRaise};

/// The table's columns now, as a version records them.
fn current_fields(schema: &str, oid: pg_sys::Oid) -> Vec<Field> {
    let v = catalog::json(&format!("SELECT {schema}._cdc_table_fields($1)"), &[oid.into()]).unwrap_or(Value::Null);
    fields_of(&v)
}

fn fields_of(v: &Value) -> Vec<Field> {
    v.as_array().map(|a| a.iter().filter_map(Field::from_json).collect()).unwrap_or_default()
}

/// The table's capture config; `None` when it is not captured.
fn config_of(schema: &str, oid: pg_sys::Oid) -> Option<Value> {
    catalog::json(&format!("SELECT config FROM {schema}._cdc_publications WHERE table_oid = $1"), &[oid.into()])
}

/// The `schema_evolution` settings of a capture config.
fn evolution(config: &Value) -> cdc_core::config::SchemaEvolution {
    cdc_core::config::schema_evolution_of(config).or_raise()
}

/// The capture config of a table the history functions were called for, and its
/// `schema_evolution` settings; the "not captured" error (42704, with `hint`) otherwise.
fn captured(schema: &str, oid: pg_sys::Oid, hint: &str) -> (Value, cdc_core::config::SchemaEvolution) {
    require_history(schema);
    let config = config_of(schema, oid).unwrap_or_else(|| super::not_captured(oid, hint));
    let evolution = evolution(&config);
    (config, evolution)
}

/// Whether the catalog has the schema history: not before `ALTER EXTENSION pg_cdc UPDATE` brought
/// an older catalog to 0.4.0 (the library is new as soon as it is installed; `cdc_enable` and
/// `cdc_disable` work on the older catalog meanwhile, without a history).
fn has_history(schema: &str) -> bool {
    catalog::has(schema, "_cdc_schema_versions")
}

/// Refuses (55000) the history functions on an older catalog.
fn require_history(schema: &str) {
    if !has_history(schema) {
        raise(
            CdcError::new(ErrorKind::PrerequisiteState, "this catalog predates the schema history")
                .hint("Run ALTER EXTENSION pg_cdc UPDATE."),
        );
    }
}

/// Records version 1 of a table that has none (`cdc_enable`).
pub(crate) fn record_first_version(schema: &str, oid: pg_sys::Oid, mode: Mode) {
    if !has_history(schema) {
        return;
    }
    catalog::run(
        &format!(
            "INSERT INTO {schema}._cdc_schema_versions (table_oid, version, lsn, fields, mode)
             SELECT $1, 1, pg_current_wal_insert_lsn(), {schema}._cdc_table_fields($1), $2
              WHERE NOT EXISTS (SELECT 1 FROM {schema}._cdc_schema_versions WHERE table_oid = $1)"
        ),
        &[oid.into(), mode.as_str().into()],
    );
}

/// Forgets a table's history (`cdc_disable`).
pub(crate) fn forget(schema: &str, oid: pg_sys::Oid) {
    if !has_history(schema) {
        return;
    }
    catalog::run(&format!("DELETE FROM {schema}._cdc_schema_versions WHERE table_oid = $1"), &[oid.into()]);
    catalog::run(&format!("DELETE FROM {schema}._cdc_schema_breaks WHERE table_oid = $1"), &[oid.into()]);
    if has_version_topics(schema) {
        catalog::run(&format!("DELETE FROM {schema}._cdc_version_topics WHERE table_oid = $1"), &[oid.into()]);
    }
}

/// SQL for "version `v` has a topic of its own" over `_cdc_schema_versions v`.
fn own_topic_sql(schema: &str) -> String {
    if has_version_topics(schema) {
        format!("EXISTS (SELECT 1 FROM {schema}._cdc_version_topics t WHERE t.table_oid = v.table_oid AND t.version = v.version)")
    } else {
        "false".to_string()
    }
}

/// Whether the catalog has `cdc_create_version_topic`'s table.
fn has_version_topics(schema: &str) -> bool {
    catalog::has(schema, "_cdc_version_topics")
}

/// Whether version `version` of a table has (or, not recorded yet, is to get) a topic of its own.
fn version_topic_requested(schema: &str, oid: pg_sys::Oid, version: i32) -> bool {
    has_version_topics(schema)
        && catalog::select_one::<bool>(
            &format!("SELECT true FROM {schema}._cdc_version_topics WHERE table_oid = $1 AND version = $2"),
            &[oid.into(), version.into()],
        )
        .unwrap_or(false)
}

/// The sinks carrying a table, each with its type and, for the sinks that write to topics (Kafka,
/// Event Hubs), the table's topic.
fn sink_topics(schema: &str, oid: pg_sys::Oid) -> Vec<(String, String, Option<String>)> {
    let sinks = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('name', sink_name, 'type', sink_type, 'config', config) ORDER BY sink_name), '[]')
               FROM {schema}._cdc_sinks WHERE table_oids IS NULL OR $1 = ANY (table_oids)"
        ),
        &[oid.into()],
    )
    .unwrap_or(json!([]));
    let names = catalog::json(
        "SELECT jsonb_build_object('db', current_database(), 'schema', n.nspname, 'table', c.relname)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
        &[oid.into()],
    )
    .unwrap_or(json!({}));
    let (db, nsp, rel) =
        (catalog::str_field(&names, "db"), catalog::str_field(&names, "schema"), catalog::str_field(&names, "table"));
    sinks
        .as_array()
        .into_iter()
        .flatten()
        .map(|sink| {
            let (name, kind) =
                (catalog::str_field(sink, "name").to_string(), catalog::str_field(sink, "type").to_string());
            let template = match kind.as_str() {
                "kafka" => cdc_sinks::kafka::config::parse(&sink["config"]).ok().map(|c| c.topic),
                "eventhub" => cdc_sinks::eventhub::config::parse(&sink["config"]).ok().map(|c| c.eventhub),
                _ => None,
            };
            let topic = template.map(|t| cdc_sinks::kafka::config::expand_topic(&t, db, nsp, rel));
            (name, kind, topic)
        })
        .collect()
}

/// How long reading a sink's consumer groups may take.
const CONSUMERS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How many of a cluster's consumer groups are asked about a sink's topic.
const CONSUMERS_MAX_GROUPS: usize = 5_000;

/// The consumers of a table's events: every consumer group that committed offsets on the topic
/// of a Kafka sink carrying the table, with the version in force at the last event it consumed
/// (from the event's LSN and the history; on a partition it has read to the end, the version in
/// force now), the oldest over its partitions, and whether it can read the versions after it. Read
/// from the brokers with each sink's connection settings, at most 10 s a sink; what could not be
/// read is said in the second value, and nothing is guessed.
///
/// Every group is asked (over one connection, many requests in flight), not only the first few:
/// a cluster with hundreds of unrelated groups must not hide the ones that read this topic.
fn consumers(schema: &str, oid: pg_sys::Oid, versions: &[Value]) -> (Value, Option<String>) {
    let sinks = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('name', sink_name, 'config', config) ORDER BY sink_name), '[]')
               FROM {schema}._cdc_sinks WHERE sink_type = 'kafka' AND (table_oids IS NULL OR $1 = ANY (table_oids))"
        ),
        &[oid.into()],
    )
    .unwrap_or(json!([]));
    let meta: Vec<(i32, cdc_core::Lsn, Option<&str>)> = versions
        .iter()
        .filter_map(|v| {
            let lsn = v["lsn"].as_str()?.parse().ok()?;
            Some((v["version"].as_i64()? as i32, lsn, v["compatibility"].as_str()))
        })
        .collect();
    // Each topic the table's events went to, with the versions it carries: a version with a
    // topic of its own (cdc_create_version_topic) starts one; its consumers never read the
    // versions before it, nor those of the topic before it the versions after.
    let numbered: Vec<(i32, bool)> = versions
        .iter()
        .filter_map(|v| Some((v["version"].as_i64()? as i32, v["own_topic"].as_bool().unwrap_or(false))))
        .collect();
    let segments = rules::topic_segments(&numbered);
    let topics: std::collections::HashMap<String, Option<String>> =
        sink_topics(schema, oid).into_iter().map(|(name, _, topic)| (name, topic)).collect();
    let bootstrap = crate::gucs::string(&crate::gucs::KAFKA_BOOTSTRAP_SERVERS);
    let table_registry = config_of(schema, oid).and_then(|c| evolution(&c).schema_registry);
    let mut groups = serde_json::Map::new();
    let mut problems = Vec::new();
    let reads = sinks.as_array().into_iter().flatten().flat_map(|sink| {
        let name = sink["name"].as_str().unwrap_or_default().to_string();
        let base = topics.get(&name).cloned().flatten();
        segments.iter().filter_map(move |(own, numbers)| {
            let base = base.clone()?;
            let topic = own.map_or(base.clone(), |v| rules::version_topic(&base, v));
            Some((sink.clone(), name.clone(), topic, numbers.clone()))
        })
    });
    for (sink, name, topic, numbers) in reads {
        let Ok(cfg) = cdc_sinks::kafka::config::parse(&sink["config"]) else { continue };
        let format = cfg.common.format;
        // Debezium's records over Avro: read with their writer schema, from the sink's registry.
        let avro_debezium = format == Format::Debezium
            && cfg.common.debezium.converter == cdc_core::config::sink::DebeziumConverter::Avro;
        let registry = cfg
            .common
            .schema_registry
            .clone()
            .or_else(|| table_registry.clone())
            .or_else(|| Some(crate::gucs::string(&crate::gucs::SCHEMA_REGISTRY)).filter(|r| !r.is_empty()))
            .map(|url| cdc_sinks::format::schema_registry::SchemaRegistry::new(&url));
        let mut schemas: std::collections::HashMap<u32, Option<String>> = std::collections::HashMap::new();
        let meta: Vec<(i32, cdc_core::Lsn, Option<&str>)> =
            meta.iter().filter(|(n, _, _)| numbers.contains(n)).cloned().collect();
        let (b, t) = (bootstrap.clone(), topic.clone());
        let read = cdc_sinks::kafka::with_signals_blocked(move || {
            std::thread::spawn(move || {
                cdc_sinks::kafka::groups::positions(&cfg, &b, &t, CONSUMERS_TIMEOUT, CONSUMERS_MAX_GROUPS)
            })
        })
        .join()
        .unwrap_or_else(|_| Err("the Kafka client failed".into()));
        let (positions, skipped) = match read {
            Ok(p) => p,
            Err(e) => {
                problems.push(format!("sink {name}: {e}"));
                continue;
            }
        };
        if skipped > 0 {
            problems.push(format!(
                "sink {name}: {skipped} consumer groups could not be read (at most {CONSUMERS_MAX_GROUPS} groups, \
                 answered within {} s)",
                CONSUMERS_TIMEOUT.as_secs()
            ));
        }
        for p in positions {
            let lsn = p.last.as_deref().and_then(|v| match format {
                Format::Avro => cdc_sinks::format::avro::event_lsn(v),
                Format::Protobuf => cdc_sinks::format::protobuf::event_lsn(v),
                Format::Debezium if avro_debezium => cdc_sinks::format::connect_avro::debezium_lsn(v, |id| {
                    schemas.entry(id).or_insert_with(|| registry.as_ref().and_then(|r| r.schema_text(id).ok())).clone()
                }),
                Format::Json | Format::Debezium => {
                    // pg_cdc's JSON event, or Debezium's (with or without its schema block).
                    let e = serde_json::from_slice::<Value>(v).ok()?;
                    let debezium = e.get("payload").unwrap_or(&e);
                    e["metadata"]["lsn"].as_u64().or_else(|| debezium["source"]["lsn"].as_u64())
                }
            });
            let entry = groups
                .entry(p.group.clone())
                .or_insert_with(|| json!({"sinks": [], "lag_offsets": 0, "caught_up": true}));
            entry["lag_offsets"] = json!(entry["lag_offsets"].as_i64().unwrap_or(0) + (p.end - p.committed).max(0));
            if !p.caught_up {
                entry["caught_up"] = json!(false);
            }
            if !entry["sinks"].as_array().is_some_and(|a| a.contains(&json!({"sink": name, "topic": topic}))) {
                entry["sinks"].as_array_mut().expect("an array").push(json!({"sink": name, "topic": topic}));
            }
            // Caught up on the partition: its next event there is of the version in force now.
            let at = if p.caught_up { Some(u64::MAX) } else { lsn };
            let Some((using, reads_newer)) = at.and_then(|l| rules::reader_status(&meta, cdc_core::Lsn(l))) else {
                entry["unknown_partitions"] = json!(entry["unknown_partitions"].as_i64().unwrap_or(0) + 1);
                continue;
            };
            // A group on several partitions (or topics) is as far behind as its oldest position.
            let current = entry["using_version"].as_i64();
            if current.is_none_or(|c| i64::from(using) < c) {
                entry["using_version"] = json!(using);
                entry["status"] = json!(if reads_newer { "compatible" } else { "incompatible" });
            } else if current == Some(i64::from(using)) && !reads_newer {
                entry["status"] = json!("incompatible");
            }
        }
    }
    (Value::Object(groups), (!problems.is_empty()).then(|| problems.join("; ")))
}

/// Called by the `_cdc_schema_changes` event trigger after an ALTER TABLE of captured tables:
/// records a version for each whose columns changed, and warns about (or, enforced, refuses) a
/// change its compatibility mode forbids.
#[pg_extern(sql = r#"
CREATE FUNCTION _cdc_schema_changed(table_oids oid[]) RETURNS void
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn _cdc_schema_changed(table_oids: Option<Vec<Option<pg_sys::Oid>>>) {
    let schema = schema();
    for oid in table_oids.unwrap_or_default().into_iter().flatten() {
        record_change(&schema, oid);
    }
}

fn record_change(schema: &str, oid: pg_sys::Oid) {
    // The name as the DBA's session prints it (the catalog's; this runs with search_path pg_catalog).
    let Some(row) = catalog::json(
        &format!("SELECT jsonb_build_object('name', table_name, 'config', config) FROM {schema}._cdc_publications WHERE table_oid = $1"),
        &[oid.into()],
    ) else {
        return;
    };
    let config = row.get("config").cloned().unwrap_or(Value::Null);
    let evolution = evolution(&config);
    // Lock the table's history: two DDLs on one table are serialized by the table lock already;
    // this keeps the version numbers dense whatever happens.
    let last = catalog::json_write(
        &format!(
            "SELECT jsonb_build_object('version', version, 'fields', fields) FROM {schema}._cdc_schema_versions
              WHERE table_oid = $1 ORDER BY version DESC LIMIT 1 FOR UPDATE"
        ),
        &[oid.into()],
    );
    let new = current_fields(schema, oid);
    let Some(last) = last else {
        record_first_version(schema, oid, evolution.mode);
        return;
    };
    let version = last["version"].as_i64().unwrap_or(1) as i32;
    let old = fields_of(&last["fields"]);
    let changes = rules::diff(&old, &new);
    if changes.is_empty() {
        return;
    }
    let table = catalog::str_field(&row, "name").to_string();
    // Columns the events never carry do not concern consumers.
    let found = relevant_issues(&config, &changes, rules::issues(&table, &changes));
    let violated = rules::violations(evolution.mode, &found);
    let mut forced = false;
    // cdc_create_version_topic armed this version: its events go to topics of their own, which
    // no consumer of the table's topics reads, so whatever it breaks, it breaks nobody.
    let own_topic = version_topic_requested(schema, oid, version + 1);
    if own_topic {
        let topics: Vec<String> = sink_topics(schema, oid)
            .into_iter()
            .filter_map(|(_, _, t)| t.map(|t| rules::version_topic(&t, version + 1)))
            .collect();
        let what = if violated.is_empty() {
            "version".to_string()
        } else {
            format!("{}; version", rules::break_report(&table, version, &violated).0)
        };
        pgrx::notice!(
            "pg_cdc: {what} {} of {table} goes to topics of its own (cdc_create_version_topic){}",
            version + 1,
            if topics.is_empty() { String::new() } else { format!(": {}", topics.join(", ")) }
        );
    } else if !violated.is_empty() {
        let permit = catalog::select_one_write::<bool>(
            &format!("DELETE FROM {schema}._cdc_schema_breaks WHERE table_oid = $1 RETURNING true"),
            &[oid.into()],
        )
        .unwrap_or(false);
        let (message, detail, hint) = rules::break_report(&table, version, &violated);
        if permit {
            forced = true;
            pgrx::notice!("pg_cdc: {message} ({}); let through by cdc_force_schema_break", evolution.mode.as_str());
        } else if evolution.enforce {
            raise(
                CdcError::new(
                    ErrorKind::PrerequisiteState,
                    format!("{message}: table {table} has compatibility_mode {}, enforced", evolution.mode.as_str()),
                )
                .detail(detail)
                .hint(hint),
            );
        } else {
            ErrorReport::new(PgSqlErrorCode::ERRCODE_WARNING, message, "")
                .set_detail(detail)
                .set_hint(hint)
                .report(PgLogLevel::WARNING);
        }
    }
    carry_config_along(schema, oid, &table, &config, &changes);
    crate::worker::launcher::catalog_changed();
    catalog::run(
        &format!(
            "INSERT INTO {schema}._cdc_schema_versions (table_oid, version, lsn, fields, changes, compatibility, mode, forced)
             VALUES ($1, $2, pg_current_wal_insert_lsn(), $3, $4, $5, $6, $7)"
        ),
        &[
            oid.into(),
            (version + 1).into(),
            JsonB(Value::Array(new.iter().map(Field::to_json).collect())).into(),
            JsonB(Value::Array(changes.iter().map(rules::Change::to_json).collect())).into(),
            rules::compatibility(&found).into(),
            evolution.mode.as_str().into(),
            forced.into(),
        ],
    );
    announce_version(oid, version + 1);
}

/// Writes the transactional message that tells sink workers a DDL recorded `version` of a table
/// ([`rules::VERSION_MESSAGE_PREFIX`]): one that decodes it with a history read before the DDL
/// committed reads the history again before it encodes anything after it (or routes it to a
/// version's topic of its own).
fn announce_version(oid: pg_sys::Oid, version: i32) {
    catalog::emit_message(rules::VERSION_MESSAGE_PREFIX, &format!("{} {version}", oid.to_u32()));
}

/// A RENAME COLUMN of a column the capture config names: the config (and the resolved key)
/// follows it to the new name, in the DDL's transaction. The worker matches the config with the
/// columns of every version by attribute number through the history, so changes written before
/// the rename (named the old way) are redacted, excluded and keyed as the config says too.
fn carry_config_along(schema: &str, oid: pg_sys::Oid, table: &str, config: &Value, changes: &[rules::Change]) {
    let mut config = config.clone();
    let mut moved = Vec::new();
    for c in changes {
        if let rules::Change::RenameField { from, to } = c {
            if let Some(next) = rules::rename_in_config(&config, &from.name, &to.name) {
                config = next;
                moved.push(format!("{} to {}", from.name, to.name));
            }
            catalog::run(
                &format!(
                    "UPDATE {schema}._cdc_publications SET key_columns = array_replace(key_columns, $2, $3)
                      WHERE table_oid = $1 AND $2 = ANY (key_columns)"
                ),
                &[oid.into(), from.name.as_str().into(), to.name.as_str().into()],
            );
        }
    }
    if moved.is_empty() {
        return;
    }
    catalog::run(
        &format!("UPDATE {schema}._cdc_publications SET config = $2 WHERE table_oid = $1"),
        &[oid.into(), JsonB(config).into()],
    );
    pgrx::notice!("pg_cdc: the capture config of {table} follows the rename of {}", moved.join(", "));
}

/// The issues that concern consumers: those of columns the events carry (not in
/// `exclude_columns`, and in `include_columns` when it is set), by the name the consumers knew.
fn relevant_issues(config: &Value, changes: &[rules::Change], issues: Vec<rules::Issue>) -> Vec<rules::Issue> {
    let excluded = catalog::strings_field(config, "exclude_columns");
    let included = config.get("include_columns").map(|_| catalog::strings_field(config, "include_columns"));
    let carried = |name: &str| {
        !excluded.iter().any(|c| c == name) && included.as_ref().is_none_or(|i| i.iter().any(|c| c == name))
    };
    issues
        .into_iter()
        .filter(|i| {
            let then = changes.iter().find_map(|c| renamed_from(c, &i.field)).unwrap_or(&i.field);
            carried(then)
        })
        .collect()
}

/// The old name of a renamed column, when `c` renames to `name`.
fn renamed_from<'a>(c: &'a rules::Change, name: &str) -> Option<&'a str> {
    match c {
        rules::Change::RenameField { from, to } if to.name == name => Some(&from.name),
        _ => None,
    }
}

/// The schema history of a captured table: each version with its time, fields, the changes
/// from the version before and their compatibility, in the shape of the product description.
///
/// ```sql
/// SELECT cdc_schema_history('orders');
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_schema_history(table_name regclass) RETURNS jsonb
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_schema_history(table_name: Option<pg_sys::Oid>) -> JsonB {
    let oid = required(table_name, "table_name");
    let _entry = super::access::enter();
    let schema = schema();
    let (_, evolution) = captured(&schema, oid, "Enable capture with cdc_enable; its history starts then.");
    let own_topic = own_topic_sql(&schema);
    let versions = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'version', version, 'timestamp', recorded_at, 'lsn', lsn::text, 'fields', fields,
                        'changes', changes, 'compatibility', compatibility, 'mode', mode, 'forced', forced,
                        'recorded_by', recorded_by, 'schema_ids', schema_ids, 'own_topic', {own_topic}) ORDER BY version), '[]')
               FROM {schema}._cdc_schema_versions v WHERE table_oid = $1"
        ),
        &[oid.into()],
    )
    .unwrap_or(json!([]));
    let versions: Vec<Value> = versions
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            let fields = fields_of(&v["fields"]);
            let mut out = json!({
                "version": v["version"],
                "timestamp": v["timestamp"],
                "lsn": v["lsn"],
                "fields": fields.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
                "columns": fields.iter().map(|f| {
                    let mut c = json!({"name": f.name, "type": f.type_sql, "nullable": !f.not_null});
                    if let Some(d) = &f.default { c["default"] = json!(d); }
                    c
                }).collect::<Vec<_>>(),
                "recorded_by": v["recorded_by"],
            });
            // The ids registries gave its Avro schema (the Avro sinks register it when they first
            // write an event of it); `schema_id` when they all gave the same one, as one registry does.
            let ids = v["schema_ids"].as_array().cloned().unwrap_or_default();
            if let Some(first) = ids.first().map(|r| &r["schema_id"]) {
                if ids.iter().all(|r| &r["schema_id"] == first) {
                    out["schema_id"] = first.clone();
                }
            }
            if !ids.is_empty() {
                out["registered"] = Value::Array(ids.clone());
            }
            if v["version"].as_i64() != Some(1) {
                out["changes"] = v["changes"].clone();
                out["compatibility"] = v["compatibility"].clone();
                out["checked_against"] = v["mode"].clone();
                if v["forced"].as_bool() == Some(true) {
                    out["forced"] = json!(true);
                }
            }
            if v["own_topic"].as_bool() == Some(true) {
                out["own_topic"] = json!(true);
            }
            out
        })
        .collect();
    let (consumers, unavailable) = consumers(&schema, oid, &versions);
    let armed = if has_version_topics(&schema) {
        catalog::select_one::<i32>(
            &format!(
                "SELECT t.version FROM {schema}._cdc_version_topics t WHERE t.table_oid = $1
                    AND t.version > (SELECT max(version) FROM {schema}._cdc_schema_versions WHERE table_oid = $1)"
            ),
            &[oid.into()],
        )
    } else {
        None
    };
    let pending_break = catalog::select_one::<bool>(
        &format!("SELECT true FROM {schema}._cdc_schema_breaks WHERE table_oid = $1"),
        &[oid.into()],
    )
    .unwrap_or(false);
    let mut out = json!({
        "table": table_display_name(oid),
        "compatibility_mode": evolution.mode.as_str(),
        "enforce": evolution.enforce,
        "schema_versions": versions,
        "consumers": consumers,
    });
    if let Some(why) = unavailable {
        out["consumers_unavailable"] = json!(why);
    }
    if pending_break {
        out["next_break_allowed"] = json!(true);
    }
    if let Some(v) = armed {
        out["next_version_topic"] = json!(v);
    }
    JsonB(out)
}

/// Lets the next change of the table that breaks its `compatibility_mode` through (a DDL under
/// `"enforce": true` then commits, with a NOTICE, and its version is marked `forced`). Returns
/// the table's history as `cdc_schema_history` does, with `next_break_allowed`.
///
/// ```sql
/// SELECT cdc_force_schema_break('orders');
/// ALTER TABLE orders ADD COLUMN required_field varchar(50) NOT NULL;  -- let through once
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_force_schema_break(table_name regclass) RETURNS jsonb
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_force_schema_break(table_name: Option<pg_sys::Oid>) -> JsonB {
    let oid = required(table_name, "table_name");
    super::access::require_select(oid, "let a schema change through on");
    let _entry = super::access::enter();
    let schema = schema();
    let (_, evolution) = captured(&schema, oid, "Only captured tables have a compatibility mode to break.");
    if evolution.mode == Mode::None {
        pgrx::notice!(
            "table {} has compatibility_mode none: no change is checked, so there is nothing to let through",
            table_display_name(oid)
        );
    }
    catalog::run(
        &format!(
            "INSERT INTO {schema}._cdc_schema_breaks (table_oid, allowed_by) VALUES ($1, $2)
             ON CONFLICT (table_oid) DO UPDATE SET allowed_by = EXCLUDED.allowed_by, allowed_at = now()"
        ),
        &[oid.into(), super::access::caller_name().into()],
    );
    cdc_schema_history(Some(oid))
}

/// Gives version `version` of a captured table, and the versions after it, topics of their own:
/// every Kafka and Event Hubs sink carrying the table writes its events from that version on to
/// `<topic>.v<version>` (created with as many partitions as the table's topic), and Avro and
/// Protobuf subjects follow the topic. Consumers of the table's topic keep reading the versions
/// they know; new consumers read the new topic. A change that breaks the table's
/// `compatibility_mode` is then let through, also under `"enforce": true`: it breaks nobody.
///
/// `version` is the table's next version (recorded by its next column change), or its current
/// one when that was recorded in the calling transaction (`BEGIN; ALTER TABLE ...; SELECT
/// cdc_create_version_topic(...); COMMIT`): a committed version's events may be on the table's
/// topic already. Sinks of other types keep writing where they write. Returns the table, the
/// version, whether it is `armed` or `recorded`, and the topics.
///
/// ```sql
/// SELECT cdc_create_version_topic('orders', 3);
/// ALTER TABLE orders ADD COLUMN required_field varchar(50) NOT NULL;  -- version 3, on cdc.public.orders.v3
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_create_version_topic(table_name regclass, version integer) RETURNS jsonb
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_create_version_topic(table_name: Option<pg_sys::Oid>, version: Option<i32>) -> JsonB {
    let oid = required(table_name, "table_name");
    let version = required(version, "version");
    super::access::require_select(oid, "give version topics to");
    let _entry = super::access::enter();
    let schema = schema();
    captured(&schema, oid, "Only captured tables have versions to give a topic.");
    if !has_version_topics(&schema) {
        raise(
            CdcError::new(ErrorKind::PrerequisiteState, "this catalog predates version topics")
                .hint("Run ALTER EXTENSION pg_cdc UPDATE."),
        );
    }
    let table = table_display_name(oid);
    let current = catalog::json_write(
        &format!(
            "SELECT jsonb_build_object('version', version, 'xmin', xmin::text) FROM {schema}._cdc_schema_versions
              WHERE table_oid = $1 ORDER BY version DESC LIMIT 1 FOR UPDATE"
        ),
        &[oid.into()],
    )
    .unwrap_or(Value::Null);
    let latest = current["version"].as_i64().unwrap_or(1) as i32;
    // The version row was written by this transaction (or one of its subtransactions): no sink
    // can have read an event of it yet.
    let ours = current["xmin"].as_str().and_then(|x| x.parse::<u32>().ok()).is_some_and(|x| {
        // SAFETY: a plain lookup in this backend's transaction state.
        unsafe { pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(x)) }
    });
    let next = latest + 1;
    let hint = format!(
        "Name the next version, {next}, before the ALTER TABLE that records it: SELECT cdc_create_version_topic('{table}', {next}); \
         or call it in the ALTER TABLE's transaction."
    );
    if version < 2 || version > next {
        raise(
            CdcError::new(
                ErrorKind::InvalidParameter,
                format!("version {version} of {table} cannot get a topic of its own: its current version is {latest}"),
            )
            .hint(if version < 2 { "Version 1 is the table's topic itself.".to_string() } else { hint }),
        );
    }
    if version < latest || (version == latest && !ours) {
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!(
                    "version {version} of {table} is committed already: its events may be on the table's topic, \
                     and a consumer there would see the rest of them go elsewhere"
                ),
            )
            .hint(hint),
        );
    }
    catalog::run(
        &format!(
            "INSERT INTO {schema}._cdc_version_topics (table_oid, version, requested_by) VALUES ($1, $2, $3)
             ON CONFLICT (table_oid, version) DO UPDATE SET requested_by = EXCLUDED.requested_by, requested_at = now()"
        ),
        &[oid.into(), version.into(), super::access::caller_name().into()],
    );
    crate::worker::launcher::catalog_changed();
    let mut topics = Vec::new();
    let mut elsewhere = Vec::new();
    for (sink, kind, topic) in sink_topics(&schema, oid) {
        match topic {
            Some(t) => topics.push(json!({"sink": sink, "topic": rules::version_topic(&t, version)})),
            None => elsewhere.push(json!({"sink": sink, "type": kind})),
        }
    }
    if !elsewhere.is_empty() {
        let names: Vec<&str> = elsewhere.iter().filter_map(|s| s["sink"].as_str()).collect();
        pgrx::notice!(
            "pg_cdc: sinks {} do not write to topics: they carry version {version} of {table} where they carry the others",
            names.join(", ")
        );
    }
    let mut out = json!({
        "table": table,
        "version": version,
        "status": if version == latest { "recorded" } else { "armed" },
        "topics": topics,
    });
    if !elsewhere.is_empty() {
        out["unaffected_sinks"] = Value::Array(elsewhere);
    }
    JsonB(out)
}

/// Resolves a type as SQL writes it with PostgreSQL's own parser: (OID, typmod, format_type).
fn resolve_type(text: &str) -> Option<(u32, i32, String)> {
    let c = std::ffi::CString::new(text).ok()?;
    let mut oid = pg_sys::InvalidOid;
    let mut typmod: i32 = -1;
    crate::pg_compat::parse_type_string(&c, &mut oid, &mut typmod);
    if oid == pg_sys::InvalidOid {
        return None;
    }
    let name = catalog::select_one::<String>("SELECT format_type($1, $2)", &[oid.into(), typmod.into()])?;
    Some((oid.to_u32(), typmod, name))
}

/// Checks a proposed column change against a captured table's schema history and its
/// `compatibility_mode`, and changes nothing: whether it would pass, the changes it makes, the
/// issues with what breaks and how to avoid it, and a recommendation. `proposed_change` is the
/// column part of an ALTER TABLE (several separated by commas), parsed with the SQL parser
/// pg_cdc's filters use; it is never run.
///
/// ```sql
/// SELECT cdc_check_compatibility('orders', 'ADD COLUMN priority VARCHAR(10) NOT NULL');
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_check_compatibility(table_name regclass, proposed_change text) RETURNS jsonb
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_check_compatibility(table_name: Option<pg_sys::Oid>, proposed_change: Option<&str>) -> JsonB {
    let oid = required(table_name, "table_name");
    let proposed = required(proposed_change, "proposed_change");
    let _entry = super::access::enter();
    let schema = schema();
    let (config, evolution) = captured(&schema, oid, "Only captured tables have consumers to keep compatible.");
    let table = table_display_name(oid);
    let version = catalog::select_one::<i32>(
        &format!("SELECT max(version) FROM {schema}._cdc_schema_versions WHERE table_oid = $1"),
        &[oid.into()],
    );
    let now = current_fields(&schema, oid);
    let after = rules::propose(&now, proposed, &resolve_type).or_raise();
    let changes = rules::diff(&now, &after);
    let found = relevant_issues(&config, &changes, rules::issues(&table, &changes));
    let violated = rules::violations(evolution.mode, &found);
    // The consumers a break would hit (read from the brokers only when there is one): a change old
    // readers cannot read hits every group, one that new readers cannot read over older events
    // hits the groups that still have older events to read.
    let (groups, unavailable) = if violated.is_empty() {
        (json!({}), None)
    } else {
        let versions = catalog::json(
            &format!(
                "SELECT coalesce(jsonb_agg(jsonb_build_object('version', version, 'lsn', lsn::text,
                        'compatibility', compatibility, 'own_topic', {}) ORDER BY version), '[]')
                   FROM {schema}._cdc_schema_versions v WHERE table_oid = $1",
                own_topic_sql(&schema)
            ),
            &[oid.into()],
        )
        .unwrap_or(json!([]));
        consumers(&schema, oid, versions.as_array().map(Vec::as_slice).unwrap_or_default())
    };
    let affected = |d: rules::Direction| -> Vec<String> {
        groups
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, g)| d == rules::Direction::Forward || g["caught_up"] != json!(true))
            .map(|(name, _)| name.clone())
            .collect()
    };
    let issues: Vec<Value> = violated
        .iter()
        .map(|i| {
            json!({
                "issue": i.title,
                "detail": i.detail,
                "breaks": match i.direction { rules::Direction::Backward => "backward", rules::Direction::Forward => "forward" },
                "affected_consumers": affected(i.direction),
                "fix": i.fix,
            })
        })
        .collect();
    let recommendation = violated.iter().find_map(|i| i.statement.clone());
    let mut out = json!({
        "compatibility_check": if violated.is_empty() { "PASSED" } else { "FAILED" },
        "proposed_change": proposed,
        "table": table,
        "compatibility_mode": evolution.mode.as_str(),
        "enforce": evolution.enforce,
        "current_version": version,
        "changes": changes.iter().map(rules::Change::to_json).collect::<Vec<_>>(),
        "compatibility": rules::compatibility(&found),
        "issues": issues,
        "recommendation": recommendation,
    });
    if let Some(why) = unavailable {
        out["consumers_unavailable"] = json!(why);
    }
    JsonB(out)
}
