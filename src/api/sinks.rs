//! `cdc_add_sink` and `cdc_drop_sink`: where captured changes go.
use cdc_core::state::SinkState;
use cdc_core::{CdcError, ErrorKind};
use cdc_sinks::{parse_config, DeliveryMode, SinkConfig};
use pgrx::prelude::*;
use pgrx::{JsonB, Uuid};

use super::{check_prerequisites, required, schema};
use crate::catalog;
use crate::errors::{raise, OrRaise};

/// Slot name of a sink: `_cdc_` and the sink id without dashes (lowercase letters and digits, as
/// slot names require; 37 characters).
pub fn slot_name(id: &Uuid) -> String {
    let hex: String = id.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("_cdc_{hex}")
}

/// Resolves one name of `config.tables` to an ordinary table's OID and its schema-qualified name (as
/// `catalog::qualified_name` writes it), or raises an error naming the path.
pub(crate) fn resolve_table(path: &str, name: &str) -> (pg_sys::Oid, String) {
    let oid = table_oid(path, name);
    let info = crate::catalog::json(
        "SELECT jsonb_build_object('relkind', c.relkind::text, 'display', c.oid::regclass::text, \
         'qualified', (SELECT quote_ident(n.nspname::text) FROM pg_namespace n WHERE n.oid = c.relnamespace) \
                      || '.' || quote_ident(c.relname::text), \
         'system', c.relnamespace::regnamespace::text IN ('pg_catalog', 'information_schema', 'pg_toast'), \
         'captured', EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
                             WHERE p.pubname LIKE '\\_cdc\\_publication%' AND pr.prrelid = c.oid)) \
         FROM pg_class c WHERE c.oid = $1",
        &[oid.into()],
    )
    .unwrap_or_default();
    let display = crate::catalog::str_field(&info, "display");
    if crate::catalog::str_field(&info, "relkind") != "r" || info.get("system") == Some(&serde_json::Value::Bool(true))
    {
        raise(CdcError::new(ErrorKind::WrongObjectType, format!("{path}: {display} is not an ordinary table")));
    }
    if info.get("captured") != Some(&serde_json::Value::Bool(true)) {
        pgrx::notice!("{path}: table {display} is not captured yet; the sink receives its changes once cdc_enable('{display}') runs");
    }
    (oid, crate::catalog::str_field(&info, "qualified").to_string())
}

/// The OID of the relation a table name written as in SQL names (the current search_path resolves
/// it), or an error naming the path: 42602 for a name that is not SQL name syntax, 42P01 for one that
/// names nothing.
pub(crate) fn table_oid(path: &str, name: &str) -> pg_sys::Oid {
    if !cdc_core::config::is_qualified_name(name) {
        raise(
            CdcError::new(ErrorKind::InvalidName, format!("{path}: \"{name}\" is not a valid table name"))
                .hint("Write it as in SQL: orders, sales.orders, or \"Mixed Case\"."),
        );
    }
    crate::catalog::select_one::<pg_sys::Oid>("SELECT to_regclass($1)::oid", &[name.into()]).unwrap_or_else(|| {
        raise(CdcError::new(ErrorKind::UndefinedTable, format!("{path}: relation \"{name}\" does not exist")))
    })
}

/// Adds a destination. Returns its id. Each sink reads its own logical replication slot, so a
/// slow sink never holds back another. With `snapshot_mode` `initial` (the default) it first
/// delivers every row its captured tables hold as a READ event, consistent with the changes that
/// follow (no gap, no overlap). The slot is created right away when this is the first statement
/// of its transaction that writes (the usual autocommit call); inside a transaction that already
/// wrote, the worker creates it after COMMIT and the snapshot covers what committed in between,
/// which is why `snapshot_mode` `never` is refused there (55000). With `initial_only` it delivers
/// its snapshot (and the changes committed while it is read), then finishes: state `finished`, its
/// slot dropped, nothing more read.
///
/// ```sql
/// SELECT cdc_add_sink(sink_name => 'kafka_orders', sink_type => 'kafka',
///                     config => '{"bootstrap_servers": "127.0.0.1:9092", "topic": "orders-cdc"}');
/// ```
#[pg_extern(volatile)]
fn cdc_add_sink(sink_name: Option<&str>, sink_type: Option<&str>, config: Option<JsonB>) -> Uuid {
    let _quiet = super::quiet_statement();
    let sink_name = required(sink_name, "sink_name");
    let sink_type = required(sink_type, "sink_type");
    let config = required(config, "config");
    add_sink(sink_name, sink_type, config, None)
}

/// What `cdc_add_sink` does, for it and `cdc_reconcile`: `slot_made` is the id of a sink whose slot
/// `_cdc_<id>` the caller made already (before its transaction wrote), else the slot is made here
/// when the transaction has not written yet, or by the worker after COMMIT.
pub(crate) fn add_sink(sink_name: &str, sink_type: &str, config: JsonB, slot_made: Option<Uuid>) -> Uuid {
    check_prerequisites();
    let schema = schema();
    if sink_name.is_empty() || sink_name.len() > 200 {
        raise(CdcError::new(ErrorKind::InvalidParameter, "sink_name must be 1 to 200 characters long"));
    }
    let cfg = parse_config(sink_type, &config.0).or_raise();
    let _entry = super::access::enter();
    let exists = crate::catalog::select_one::<bool>(
        &format!("SELECT EXISTS (SELECT 1 FROM {schema}._cdc_sinks WHERE sink_name = $1)"),
        &[sink_name.into()],
    )
    .unwrap_or(false);
    if exists {
        raise(
            CdcError::new(ErrorKind::DuplicateObject, format!("sink \"{sink_name}\" already exists"))
                .hint("Choose another name, or cdc_drop_sink it first."),
        );
    }
    let (table_oids, table_names) = check_sink(&schema, sink_name, &cfg, Tables::Resolve);
    if let SinkConfig::Table(t) = &cfg {
        if !has_table_sinks(&schema) {
            raise(
                CdcError::new(ErrorKind::PrerequisiteState, "table sinks need the catalog of pg_cdc 0.3.0")
                    .hint("Run ALTER EXTENSION pg_cdc UPDATE first."),
            );
        }
        let taken = super::access::as_caller(|| {
            catalog::select_one::<bool>("SELECT to_regclass($1) IS NOT NULL", &[t.table.as_str().into()])
        });
        if taken == Some(true) {
            raise(
                CdcError::new(
                    ErrorKind::DuplicateTable,
                    format!("config.table: relation \"{}\" already exists", t.table),
                )
                .hint("A table sink creates its own event table: name one that does not exist."),
            );
        }
    }

    let id = slot_made.unwrap_or_else(new_sink_id);
    let slot = slot_name(&id);
    // SAFETY: reads the current transaction's top-level xid, set once it has written.
    let wrote = unsafe { pg_sys::GetTopTransactionIdIfAny() } != pg_sys::InvalidTransactionId;
    let snapshots = catalog::has_snapshots(&schema);
    let snapshot = snapshots && cfg.common().snapshot_mode.snapshots();
    if !snapshots {
        pgrx::notice!(
            "this catalog predates snapshots, so sink \"{sink_name}\" delivers only changes made after its slot exists: \
             run ALTER EXTENSION pg_cdc UPDATE for snapshot_mode initial"
        );
    }
    let slot_created = if slot_made.is_some() {
        true
    } else if wrote && !snapshot {
        // Without a snapshot, the changes committed between this COMMIT and the slot the worker
        // would make after it would never be delivered: no silent gap.
        raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!(
                    "sink \"{sink_name}\" has no snapshot, and this transaction already wrote: its slot could only be \
                     created after COMMIT, and changes committed in between would never be delivered"
                ),
            )
            .hint("Run cdc_add_sink in its own transaction, or leave snapshot_mode at initial."),
        );
    } else if wrote {
        // The snapshot starts once the worker made the slot: what commits before then arrives as
        // READ events, what commits after as changes.
        false
    } else {
        // Waits for transactions that are writing right now to finish, so the slot starts after them.
        // Nothing before this wrote (a writing statement would assign an xid, and PostgreSQL
        // refuses to create a logical slot in a transaction that has one).
        catalog::create_logical_slot(&slot);
        true
    };
    crate::worker::launcher::catalog_changed();
    let names_column = if catalog::has_column(&schema, "_cdc_sinks", "table_names") { ", table_names" } else { "" };
    let names_value = if names_column.is_empty() { "" } else { ", $9" };
    catalog::run(
        &format!(
            "INSERT INTO {schema}._cdc_sinks (sink_id, sink_name, sink_type, config, slot_name, table_oids, delivery_mode, state{names_column})
             VALUES ($1, $2, $3, $4, $5, $6, $8, $7{names_value})"
        ),
        &[
            id.into(),
            sink_name.into(),
            sink_type.into(),
            config.into(),
            slot.as_str().into(),
            table_oids.clone().into(),
            (if slot_created { SinkState::Starting } else { SinkState::CreatingSlot }).label().into(),
            cfg.delivery_mode().as_str().into(),
            table_names.into(),
        ],
    );
    if catalog::has_column(&schema, "_cdc_sinks", "added_by") {
        catalog::run(
            &format!("UPDATE {schema}._cdc_sinks SET added_by = $2 WHERE sink_id = $1"),
            &[id.into(), super::access::caller().into()],
        );
    }
    if let SinkConfig::Table(t) = &cfg {
        // The event table, owned by the caller (created with its rights, where its search_path
        // says); the worker writes into it.
        let table_oid = super::access::as_caller(|| {
            catalog::run(&cdc_sinks::table::create_sql(&t.table), &[]);
            catalog::select_one::<pg_sys::Oid>("SELECT to_regclass($1)::oid", &[t.table.as_str().into()])
        });
        catalog::run(
            &format!("INSERT INTO {schema}._cdc_table_sinks (sink_id, event_table) VALUES ($1, $2)"),
            &[id.into(), table_oid.into()],
        );
    }
    if snapshot {
        // Every table it carries that is captured now: its rows as READ events (see
        // cdc_core::snapshot); the worker reads them in chunks once the slot exists.
        catalog::run(
            &format!(
                "INSERT INTO {schema}._cdc_snapshots (sink_id, table_oid, kind)
                 SELECT $1, p.table_oid, 'initial' FROM {schema}._cdc_publications p
                  WHERE p.status = 'active' AND ($2::oid[] IS NULL OR p.table_oid = ANY ($2::oid[]))
                  ORDER BY p.table_oid"
            ),
            &[id.into(), table_oids.clone().into()],
        );
    }
    if slot_created {
        // Copies of the lookup tables its captured tables enrich from, as of now (the slot starts
        // just before: changes committed in between are in both, and the copy's position says so).
        // A slot the worker creates later gets its copies from the worker.
        let oids: Option<Vec<u32>> = table_oids.as_ref().map(|v| v.iter().map(|o| o.to_u32()).collect());
        let sink = id.to_string();
        for spec in crate::lookups::specs_for_sink(&schema, oids.as_deref()) {
            crate::lookups::seed(&schema, &sink, &spec);
        }
    }
    if catalog::json(&format!("SELECT to_jsonb(count(*)) FROM {schema}._cdc_publications"), &[])
        == Some(serde_json::json!(0))
    {
        pgrx::notice!("no table is captured yet: SELECT cdc_enable('<table>') to start");
    } else {
        pgrx::notice!("{}", carried_tables_notice(&schema, sink_name, table_oids.as_deref(), snapshot));
    }
    id
}

/// A new sink's id (its slot is `_cdc_<id>`).
pub(crate) fn new_sink_id() -> Uuid {
    crate::catalog::select_one::<Uuid>("SELECT gen_random_uuid()", &[])
        .unwrap_or_else(|| pgrx::error!("gen_random_uuid failed"))
}

/// Which tables [`check_sink`] checks a sink config with.
pub(crate) enum Tables {
    /// Its `tables`, resolved now (a new sink, or a changed `tables`).
    Resolve,
    /// The ones the sink carries already (`_cdc_sinks.table_oids`, 0 for a dropped one; `None`:
    /// every captured table): `tables` did not change, and a table dropped since stays listed.
    Kept(Option<Vec<pg_sys::Oid>>),
}

/// Checks a sink config as `cdc_add_sink` and `cdc_alter_sink` do, for the calling role: a role
/// that is not a superuser names the tables its sink carries and may read them, and its config
/// names no file outside `cdc.admin_file_dir` and no setting that runs code; `tables` resolve (a
/// typo fails here, not in the worker), none is a table sink's event table; a carried table that
/// tokenizes has its key; the secret files the config names are readable. Returns `tables` as
/// OIDs and schema-qualified names (`None`: every captured table). Warns when the sink delivers at
/// least once while a table it carries asks for exactly-once.
pub(crate) fn check_sink(
    schema: &str,
    sink_name: &str,
    cfg: &SinkConfig,
    tables: Tables,
) -> (Option<Vec<pg_sys::Oid>>, Option<Vec<String>>) {
    if cfg.common().tables.is_none() && !super::access::caller_is_superuser() {
        raise(
            CdcError::new(
                ErrorKind::InsufficientPrivilege,
                "config.tables is required when the sink is not added by a superuser: a sink without it carries every captured table",
            )
            .hint("List the tables the sink carries, e.g. \"tables\": [\"orders\"]."),
        );
    }
    super::access::check_sink_config(cfg);
    // With their schema-qualified names, kept to bind a table of that name created again after a DROP.
    let (table_oids, table_names): (Option<Vec<pg_sys::Oid>>, Option<Vec<String>>) =
        match (tables, &cfg.common().tables) {
            (Tables::Kept(oids), _) => (oids, None),
            (Tables::Resolve, Some(names)) => {
                let (oids, qualified): (Vec<pg_sys::Oid>, Vec<String>) = names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| super::access::as_caller(|| resolve_table(&format!("config.tables[{i}]"), n)))
                    .unzip();
                for (oid, name) in oids.iter().zip(names) {
                    super::access::require_select(*oid, "carry");
                    refuse_event_table(schema, *oid, name);
                }
                (Some(oids), Some(qualified))
            }
            (Tables::Resolve, None) => (None, None),
        };
    // A table it carries that tokenizes needs the key, or the sink would stop at once.
    let carried = super::capture::captured_configs(schema, table_oids.as_deref());
    if let Some((table, _)) = carried.iter().find(|(_, c)| c.tokenizes()) {
        crate::keys::require_token_key(&format!("sink \"{sink_name}\" carries {table}, whose capture config"));
    }
    if let Err(e) = cdc_sinks::secrets::check_files(cfg) {
        raise(CdcError::new(ErrorKind::PrerequisiteState, format!("config.{}: {}", e.key, e.error)).hint(format!(
            "Write {} to a file in (or relative to) the data directory, owned by the server's user, mode 0600.",
            e.what
        )));
    }
    if cfg.delivery_mode() != DeliveryMode::ExactlyOnce {
        let wanting: Vec<&str> =
            carried.iter().filter(|(_, c)| c.exactly_once_required).map(|(t, _)| t.as_str()).collect();
        if !wanting.is_empty() {
            pgrx::warning!(
                "sink \"{sink_name}\" delivers at least once, but the capture configs of these tables ask for exactly-once: {}",
                wanting.join(", ")
            );
        }
    }
    (table_oids, table_names)
}

/// Tables up to this size are counted for the NOTICE of `cdc_add_sink`; larger ones are estimated.
const COUNT_BELOW_BYTES: i64 = 8 << 20;

/// What a new sink carries, for the NOTICE of `cdc_add_sink`: its captured tables with their rows
/// (counted in a small table, the planner's `reltuples` estimate in a larger one) and what its
/// snapshot reads first, so a sink without `tables` is never a surprise.
fn carried_tables_notice(schema: &str, sink_name: &str, table_oids: Option<&[pg_sys::Oid]>, snapshot: bool) -> String {
    let tables = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'name', quote_ident(n.nspname::text) || '.' || quote_ident(c.relname::text),
                        'bytes', pg_relation_size(c.oid), 'estimate', c.reltuples::bigint,
                        'readable', has_table_privilege(c.oid, 'SELECT'))
                      ORDER BY n.nspname, c.relname), '[]')
               FROM {schema}._cdc_publications p JOIN pg_class c ON c.oid = p.table_oid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE p.status = 'active' AND ($1::oid[] IS NULL OR p.table_oid = ANY ($1::oid[]))"
        ),
        &[table_oids.map(<[pg_sys::Oid]>::to_vec).into()],
    )
    .unwrap_or_default();
    let tables = tables.as_array().cloned().unwrap_or_default();
    let scope = if table_oids.is_some() {
        "the captured tables of its config.tables"
    } else {
        "every captured table (config.tables unset), and those captured later"
    };
    if tables.is_empty() {
        return format!("sink \"{sink_name}\" carries {scope}: none is captured yet");
    }
    let (mut total, mut estimated) = (0i64, false);
    let mut listed = Vec::new();
    for t in &tables {
        let name = catalog::str_field(t, "name");
        let small = t["bytes"].as_i64().unwrap_or(0) < COUNT_BELOW_BYTES;
        let rows = if small && t["readable"] == serde_json::Value::Bool(true) {
            catalog::select_one::<i64>(&format!("SELECT count(*) FROM {name}"), &[]).map(|n| (n, false))
        } else {
            t["estimate"].as_i64().filter(|e| *e >= 0).map(|e| (e, true))
        };
        let shown = match rows {
            Some((n, about)) => {
                total += n;
                estimated |= about;
                format!("{name} ({}{} rows)", if about { "about " } else { "" }, cdc_core::stats::thousands(n))
            }
            None => {
                estimated = true;
                format!("{name} (not analyzed yet: rows unknown)")
            }
        };
        listed.push(shown);
    }
    const SHOWN: usize = 10;
    let more = listed.len().saturating_sub(SHOWN);
    listed.truncate(SHOWN);
    let mut text = format!("sink \"{sink_name}\" carries {scope}: {}", listed.join(", "));
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    if snapshot {
        let about = if estimated { "about " } else { "" };
        text.push_str(&format!(
            "; its snapshot first reads {about}{} rows as READ events",
            cdc_core::stats::thousands(total)
        ));
    } else {
        text.push_str("; no snapshot: it delivers the changes committed from now on");
    }
    text
}

/// Whether the catalog has the in-database sinks' table: not before `ALTER EXTENSION pg_cdc UPDATE`
/// brought a 0.2.0 catalog to 0.3.0 (the library is new as soon as it is installed, the catalog only
/// after the update; everything else works on the older catalog meanwhile).
fn has_table_sinks(schema: &str) -> bool {
    catalog::has(schema, "_cdc_table_sinks")
}

/// Refuses to capture the event table of a table sink (or to limit a sink to it): its own events
/// would be captured again, without end.
pub fn refuse_event_table(schema: &str, oid: pg_sys::Oid, display: &str) {
    if !has_table_sinks(schema) {
        return;
    }
    let sink = catalog::select_one::<String>(
        &format!(
            "SELECT s.sink_name FROM {schema}._cdc_table_sinks t JOIN {schema}._cdc_sinks s USING (sink_id) \
              WHERE t.event_table = $1"
        ),
        &[oid.into()],
    );
    if let Some(sink) = sink {
        raise(
            CdcError::new(
                ErrorKind::WrongObjectType,
                format!("{display} is the event table of sink \"{sink}\" and cannot be captured"),
            )
            .hint("Its events would be captured again without end; read it with cdc_consume or SELECT."),
        );
    }
}

/// Drops a destination. The worker drops its replication slot after this commits (a slot drop
/// cannot be rolled back, so it waits for the commit), and the launcher deletes an exactly-once
/// Kafka or Event Hubs sink's progress topic once the sink's worker stopped (`_cdc_cleanups` holds
/// it until then, and while the broker is down). The event table of a table sink is kept (a NOTICE
/// names it): drop it yourself once its events are no longer needed.
///
/// ```sql
/// SELECT cdc_drop_sink('kafka_orders');
/// ```
#[pg_extern(volatile)]
pub(crate) fn cdc_drop_sink(sink_name: Option<&str>) {
    let sink_name = required(sink_name, "sink_name");
    let _entry = super::access::enter();
    let schema = schema();
    let event_table = has_table_sinks(&schema).then(|| {
        catalog::select_one::<String>(
            &format!(
            "SELECT c.oid::regclass::text FROM {schema}._cdc_sinks s JOIN {schema}._cdc_table_sinks t USING (sink_id) \
               JOIN pg_class c ON c.oid = t.event_table WHERE s.sink_name = $1"
        ),
            &[sink_name.into()],
        )
    });
    crate::worker::launcher::catalog_changed();
    let deleted = catalog::json_write(
        &format!(
            "WITH d AS (DELETE FROM {schema}._cdc_sinks WHERE sink_name = $1
                        RETURNING sink_id, sink_type, config, slot_name, delivery_mode)
             SELECT to_jsonb(d) FROM d"
        ),
        &[sink_name.into()],
    )
    .unwrap_or_else(|| super::no_such_sink(sink_name));
    let kafka_like = matches!(catalog::str_field(&deleted, "sink_type"), "kafka" | "eventhub");
    if kafka_like && catalog::str_field(&deleted, "delivery_mode") == "exactly_once" {
        let topic = cdc_sinks::kafka::progress_topic(catalog::str_field(&deleted, "slot_name"));
        if catalog::has(&schema, "_cdc_cleanups") {
            // After COMMIT, and once the sink's worker stopped: deleting it now could not be rolled back.
            catalog::run(
                &format!(
                    "INSERT INTO {schema}._cdc_cleanups (sink_id, sink_name, sink_type, config, kind, target)
                     VALUES ($1::uuid, $2, $3, $4, 'progress_topic', $5)"
                ),
                &[
                    catalog::str_field(&deleted, "sink_id").into(),
                    sink_name.into(),
                    catalog::str_field(&deleted, "sink_type").into(),
                    JsonB(deleted["config"].clone()).into(),
                    topic.as_str().into(),
                ],
            );
        } else {
            pgrx::notice!(
                "the progress topic {topic} of sink \"{sink_name}\" stays at the broker: this catalog predates its \
                 deletion (ALTER EXTENSION pg_cdc UPDATE); delete it with your Kafka tools"
            );
        }
    }
    if let Some(table) = event_table.flatten() {
        pgrx::notice!(
            "the events of sink \"{sink_name}\" stay in table {table}: DROP TABLE it when they are no longer needed"
        );
    }
}
