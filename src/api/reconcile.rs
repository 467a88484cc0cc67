//! `cdc_reconcile` and `cdc_export_spec`: capture and sinks as a declared state. The spec's form
//! and the sinks' part of the plan are `cdc_sinks::spec`'s; this reads the live state, resolves the
//! tables, checks every config against its table, applies the drop guards and, unless it is a dry
//! run, applies the plan: the new sinks' slots first (PostgreSQL makes a logical slot only in a
//! transaction that has not written), then every change in one subtransaction, all or nothing.
use std::collections::{BTreeMap, BTreeSet};

use cdc_core::config::parse_capture_config;
use cdc_core::{CdcError, ErrorKind};
use cdc_sinks::spec::{self, SinkAction, Spec};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use pgrx::{JsonB, Uuid};
use serde_json::{json, Value};

use super::{check_prerequisites, required, schema};
use crate::catalog::{self, str_field};
use crate::errors::{raise, OrRaise};

/// A captured table as it is.
struct LiveTable {
    oid: pg_sys::Oid,
    name: String,
    config: Value,
}

/// A sink as it is.
struct LiveSink {
    name: String,
    sink_type: String,
    config: Value,
    state: String,
    /// The tables it carries (`None`: every captured table).
    oids: Option<BTreeSet<u32>>,
    /// Whether a snapshot of it is not delivered yet.
    snapshotting: bool,
    /// Its slot, when it exists.
    slot: Option<String>,
}

fn live_tables(schema: &str) -> Vec<LiveTable> {
    let rows = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('oid', p.table_oid::bigint, 'config', p.config,
                        'name', quote_ident(n.nspname::text) || '.' || quote_ident(c.relname::text))
                      ORDER BY n.nspname, c.relname), '[]')
               FROM {schema}._cdc_publications p JOIN pg_class c ON c.oid = p.table_oid
               JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.status = 'active'"
        ),
        &[],
    )
    .unwrap_or_default();
    rows.as_array()
        .into_iter()
        .flatten()
        .map(|r| LiveTable {
            oid: pg_sys::Oid::from(r["oid"].as_u64().unwrap_or(0) as u32),
            name: str_field(r, "name").to_string(),
            config: r["config"].clone(),
        })
        .collect()
}

fn live_sinks(schema: &str) -> Vec<LiveSink> {
    let rows = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('name', s.sink_name, 'type', s.sink_type, 'config', s.config,
                        'state', s.state, 'oids', s.table_oids::bigint[], 'slot', r.slot_name IS NOT NULL,
                        'slot_name', s.slot_name,
                        'snapshots', coalesce(n.open, 0))
                      ORDER BY s.sink_name), '[]')
               FROM {schema}._cdc_sinks s LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name
               LEFT JOIN (SELECT sink_id, count(*) AS open FROM {schema}._cdc_snapshots
                           WHERE state IN {open} GROUP BY sink_id) n ON n.sink_id = s.sink_id",
            open = cdc_core::state::SnapshotState::open_sql()
        ),
        &[],
    )
    .unwrap_or_default();
    rows.as_array()
        .into_iter()
        .flatten()
        .map(|r| LiveSink {
            name: str_field(r, "name").to_string(),
            sink_type: str_field(r, "type").to_string(),
            config: r["config"].clone(),
            state: str_field(r, "state").to_string(),
            oids: r["oids"].as_array().map(|a| a.iter().filter_map(Value::as_u64).map(|o| o as u32).collect()),
            snapshotting: r["snapshots"].as_i64().unwrap_or(0) > 0,
            slot: (r["slot"] == Value::Bool(true)).then(|| str_field(r, "slot_name").to_string()),
        })
        .collect()
}

/// Why dropping a sink whose slot is `slot` would lose a change, if it would (see
/// [`catalog::slot_holds_change`]).
fn undelivered(slot: &str) -> Option<String> {
    // SAFETY: reads the current transaction's state, on the backend's own thread.
    if unsafe { pg_sys::GetTopTransactionIdIfAny() } != pg_sys::InvalidTransactionId {
        // PostgreSQL makes no slot, the temporary copy included, in a transaction that wrote.
        return Some(format!(
            "its slot {slot} cannot be looked into from a transaction that has written (run cdc_reconcile on its own)"
        ));
    }
    catalog::slot_holds_change(slot, None).then(|| format!("its slot {slot} holds changes it has not delivered"))
}

/// Runs `f`; an ERROR it raises is raised again with the spec element's path and name in front.
fn at_element<R>(path: &str, name: &str, f: impl FnOnce() -> R) -> R {
    match PgTryBuilder::new(std::panic::AssertUnwindSafe(|| Ok(f()))).catch_others(|e| Err(Box::new(e))).execute() {
        Ok(r) => r,
        Err(e) => reraise_at(path, name, *e),
    }
}

fn reraise_at(path: &str, name: &str, e: CaughtError) -> ! {
    match e {
        CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => {
            let mut report = pgrx::pg_sys::panic::ErrorReport::new(
                r.sql_error_code(),
                format!("{path} (\"{name}\"): {}", r.message()),
                "",
            );
            if let Some(d) = r.detail() {
                report = report.set_detail(d);
            }
            if let Some(h) = r.hint() {
                report = report.set_hint(h);
            }
            report.report(PgLogLevel::ERROR);
            unreachable!("ERROR does not return")
        }
        other => other.rethrow(),
    }
}

/// Runs `f` in a subtransaction: released when it returns, rolled back (with what it wrote) when it
/// raises, the error handed back.
fn in_subtransaction<R>(f: impl FnOnce() -> R) -> Result<R, Box<CaughtError>> {
    // SAFETY: what PL/pgSQL does around a block with an EXCEPTION clause: the subtransaction starts
    // and ends in the caller's memory context and resource owner, which are restored after.
    unsafe {
        let context = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
        let result =
            PgTryBuilder::new(std::panic::AssertUnwindSafe(|| Ok(f()))).catch_others(|e| Err(Box::new(e))).execute();
        if result.is_ok() {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::MemoryContextSwitchTo(context);
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
        result
    }
}

/// The OID of a table the spec names, as the caller's search_path resolves it, or 42602 / 42P01.
fn resolve(path: &str, name: &str) -> pg_sys::Oid {
    super::access::as_caller(|| super::sinks::table_oid(path, name))
}

/// One declared table, resolved.
struct PlannedTable {
    oid: pg_sys::Oid,
    /// create, alter or nothing.
    action: &'static str,
    entry: Value,
}

/// One declared sink, planned.
struct PlannedSink {
    action: SinkAction,
    /// What it carries once reconciled (`None`: every captured table).
    carries: Option<BTreeSet<u32>>,
    entry: Value,
}

/// The whole plan: what each object becomes, and the drops with their guards.
struct Plan {
    tables: Vec<PlannedTable>,
    sinks: Vec<PlannedSink>,
    /// Live tables the spec leaves out: (oid, name, blocked by).
    drop_tables: Vec<(pg_sys::Oid, String, Option<String>)>,
    /// Live sinks the spec leaves out: (name, type, blocked by).
    drop_sinks: Vec<(String, String, Option<String>)>,
    snapshots: Vec<Value>,
}

impl Plan {
    fn changes(&self) -> usize {
        self.tables.iter().filter(|t| t.action != "nothing").count()
            + self.sinks.iter().filter(|s| !matches!(s.action, SinkAction::Nothing { .. })).count()
            + self.drop_tables.len()
            + self.drop_sinks.len()
    }

    fn blocked(&self) -> Option<CdcError> {
        if let Some((name, _, Some(why))) = self.drop_sinks.iter().find(|d| d.2.is_some()) {
            return Some(
                CdcError::new(
                    ErrorKind::PrerequisiteState,
                    format!("the spec leaves out sink \"{name}\", but it holds changes not yet delivered: {why}"),
                )
                .detail("Dropping it would drop its slot, and the changes it holds would never be delivered.")
                .hint(format!(
                    "Declare it, wait until it has delivered them, or list it in spec.force_drop.sinks: [\"{name}\"]."
                )),
            );
        }
        if let Some((_, name, Some(why))) = self.drop_tables.iter().find(|d| d.2.is_some()) {
            return Some(
                CdcError::new(
                    ErrorKind::PrerequisiteState,
                    format!("the spec leaves out captured table {name}, but {why}"),
                )
                .hint(format!("Declare it, or list it in spec.force_drop.tables: [\"{name}\"].")),
            );
        }
        None
    }

    fn to_json(&self, dry_run: bool, applied: bool) -> Value {
        let mut tables: Vec<Value> = self.tables.iter().map(|t| t.entry.clone()).collect();
        tables.extend(self.drop_tables.iter().map(|(_, name, blocked)| {
            let mut e = json!({"table": name, "action": "drop"});
            if let Some(b) = blocked {
                e["blocked"] = json!(b);
            }
            e
        }));
        let mut sinks: Vec<Value> = self.sinks.iter().map(|s| s.entry.clone()).collect();
        sinks.extend(self.drop_sinks.iter().map(|(name, sink_type, blocked)| {
            let mut e = json!({"sink": name, "type": sink_type, "action": "drop"});
            if let Some(b) = blocked {
                e["blocked"] = json!(b);
            }
            e
        }));
        json!({
            "dry_run": dry_run,
            "applied": applied,
            "changes": self.changes(),
            "tables": tables,
            "sinks": sinks,
            "snapshots": self.snapshots,
        })
    }
}

fn carries(set: &Option<BTreeSet<u32>>, oid: u32) -> bool {
    set.as_ref().is_none_or(|s| s.contains(&oid))
}

/// Plans a spec against the live state: every check that needs no write.
fn plan(schema: &str, spec: &Spec) -> Plan {
    let live_tables = live_tables(schema);
    let live_sinks = live_sinks(schema);
    // Tables: resolved, each once, their configs checked against them.
    let mut tables = Vec::new();
    let mut seen: BTreeMap<u32, &str> = BTreeMap::new();
    for t in &spec.tables {
        let oid = resolve(&format!("{}.name", t.path), &t.name);
        if let Some(first) = seen.insert(oid.to_u32(), &t.path) {
            raise(
                CdcError::new(
                    ErrorKind::DuplicateObject,
                    format!(
                        "{}: table \"{}\" is declared twice (first at {first}, under another name)",
                        t.path, t.name
                    ),
                )
                .hint("Declare each table once."),
            );
        }
        let shown = at_element(&t.path, &t.name, || {
            let (_, shape) = super::access::as_caller(|| super::capture::table_shape(oid));
            let cfg = parse_capture_config(&t.config, &shape).or_raise();
            super::sinks::refuse_event_table(schema, oid, &shape.display_name);
            if cfg.tokenizes() {
                crate::keys::require_token_key(&format!("the capture config of {}", shape.display_name));
            }
            catalog::qualified_name(oid).unwrap_or_else(|| t.name.clone())
        });
        let live = live_tables.iter().find(|l| l.oid == oid);
        let (action, diff) = match live {
            None => ("create", None),
            Some(l) if l.config == t.config => ("nothing", None),
            Some(l) => ("alter", Some(spec::config_diff(&l.config, &t.config))),
        };
        let mut entry = json!({"table": shown, "action": action});
        if let Some(d) = diff {
            entry["diff"] = d;
        }
        tables.push(PlannedTable { oid, action, entry });
    }
    let declared: BTreeSet<u32> = tables.iter().map(|t| t.oid.to_u32()).collect();
    // Sinks.
    let mut sinks = Vec::new();
    for s in &spec.sinks {
        let live = live_sinks.iter().find(|l| l.name == s.name);
        let action = spec::plan_sink(s, live.map(|l| (l.sink_type.as_str(), &l.config))).or_raise();
        if let (Some(l), SinkAction::Alter { .. }) = (live, &action) {
            if l.state == "finished" {
                raise(spec::at(
                    &s.path,
                    &s.name,
                    CdcError::new(
                        ErrorKind::PrerequisiteState,
                        "the sink is finished: it delivered its initial_only snapshot and reads nothing more, so its config cannot change",
                    )
                    .hint("Declare a new sink under another name; leave this one out to drop it."),
                ));
            }
        }
        let carries = action.parsed().common().tables.as_ref().map(|names| {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| resolve(&format!("{}.config.tables[{i}]", s.path), n).to_u32())
                .collect::<BTreeSet<u32>>()
        });
        let mut entry = json!({"sink": s.name, "type": s.sink_type});
        match &action {
            SinkAction::Create { .. } => entry["action"] = json!("create"),
            SinkAction::Alter { plan, .. } => {
                entry["action"] = json!("alter");
                entry["diff"] = plan.diff(&live.map(|l| l.config.clone()).unwrap_or_default());
            }
            SinkAction::Nothing { .. } => entry["action"] = json!("nothing"),
        }
        sinks.push(PlannedSink { action, carries, entry });
    }
    // Snapshots: each pair (sink, captured table) that is new, for a sink that snapshots.
    let names: BTreeMap<u32, String> =
        tables.iter().map(|t| (t.oid.to_u32(), str_field(&t.entry, "table").to_string())).collect();
    let mut snapshots = Vec::new();
    for (s, p) in spec.sinks.iter().zip(&sinks) {
        if !p.action.parsed().common().snapshot_mode.snapshots() {
            continue;
        }
        let live = live_sinks.iter().find(|l| l.name == s.name);
        for (oid, name) in &names {
            if !carries(&p.carries, *oid) {
                continue;
            }
            let kind = match live {
                None => "initial",
                Some(l) if l.state == "finished" => continue,
                Some(l) => {
                    let was_captured = live_tables.iter().any(|t| t.oid.to_u32() == *oid);
                    if was_captured && carries(&l.oids, *oid) {
                        continue;
                    }
                    "added"
                }
            };
            snapshots.push(json!({"sink": s.name, "table": name, "kind": kind}));
        }
    }
    // Drops, behind their guards.
    let force_sinks: BTreeSet<&str> = spec.force_drop_sinks.iter().map(String::as_str).collect();
    let drop_sinks = live_sinks
        .iter()
        .filter(|l| !spec.sinks.iter().any(|s| s.name == l.name))
        .map(|l| {
            let blocked = if force_sinks.contains(l.name.as_str()) {
                None
            } else {
                match &l.slot {
                    _ if l.snapshotting => Some("its snapshot is not delivered yet".to_string()),
                    Some(slot) if l.state != "finished" => undelivered(slot),
                    _ => None,
                }
            };
            (l.name.clone(), l.sink_type.clone(), blocked)
        })
        .collect();
    let forced_tables: BTreeSet<u32> = spec
        .force_drop_tables
        .iter()
        .filter_map(|n| {
            super::access::as_caller(|| {
                catalog::select_one::<pg_sys::Oid>("SELECT to_regclass($1)::oid", &[n.as_str().into()])
            })
            .map(|o| o.to_u32())
        })
        .collect();
    let drop_tables = live_tables
        .iter()
        .filter(|l| !declared.contains(&l.oid.to_u32()))
        .map(|l| {
            let carriers: Vec<&str> = spec
                .sinks
                .iter()
                .zip(&sinks)
                .filter(|(_, p)| carries(&p.carries, l.oid.to_u32()))
                .map(|(s, _)| s.name.as_str())
                .collect();
            let blocked = (!carriers.is_empty() && !forced_tables.contains(&l.oid.to_u32()))
                .then(|| format!("sinks of the spec carry it: {}", carriers.join(", ")));
            (l.oid, l.name.clone(), blocked)
        })
        .collect();
    Plan { tables, sinks, drop_tables, drop_sinks, snapshots }
}

/// Applies a plan whose new sinks' slots are made (`slots`: their ids, in the spec's order).
fn apply(spec: &Spec, plan: &Plan, slots: &[Uuid]) {
    let mut new_ids = slots.iter();
    for (t, p) in spec.tables.iter().zip(&plan.tables) {
        if p.action != "nothing" {
            at_element(&t.path, &t.name, || super::capture::enable(p.oid, t.config.clone()));
        }
    }
    for (s, p) in spec.sinks.iter().zip(&plan.sinks) {
        match &p.action {
            SinkAction::Create { config, .. } => {
                let id = *new_ids.next().expect("a slot for every new sink");
                at_element(&s.path, &s.name, || {
                    super::sinks::add_sink(&s.name, &s.sink_type, JsonB(config.clone()), Some(id))
                });
            }
            SinkAction::Alter { patch, .. } => {
                at_element(&s.path, &s.name, || {
                    super::alter::cdc_alter_sink(Some(s.name.as_str()), Some(JsonB(patch.clone())))
                });
            }
            SinkAction::Nothing { .. } => {}
        }
    }
    for (name, _, _) in &plan.drop_sinks {
        at_element("spec.sinks", name, || super::sinks::cdc_drop_sink(Some(name.as_str())));
    }
    for (oid, name, _) in &plan.drop_tables {
        at_element("spec.tables", name, || super::capture::cdc_disable(Some(*oid)));
    }
}

/// Brings capture and sinks to the state a spec declares, and returns the plan: per table and per
/// sink the action (`create`, `alter` with the diff, `drop`, `nothing`) and the snapshots it starts.
/// A dry run (the default) changes nothing. Otherwise the spec is checked whole first, then applied
/// all or nothing, outside a transaction block (25001 inside one: the new sinks' slots are made
/// before anything is written, which PostgreSQL allows only then). What the spec leaves out is
/// dropped, unless a guard stops it (55000): a sink whose slot holds changes not yet delivered, a
/// captured table a sink of the spec carries; `force_drop` lifts the guard for the objects it
/// names. A secret given as `"(unchanged)"` (as `cdc_export_spec` writes it) keeps the live value.
///
/// ```sql
/// SELECT cdc_reconcile('{"tables": [{"name": "orders"}],
///                        "sinks": [{"name": "log", "type": "table", "config": {"table": "orders_log"}}]}',
///                      dry_run => false);
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_reconcile(spec jsonb, dry_run boolean DEFAULT true) RETURNS jsonb
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_reconcile(spec: Option<JsonB>, dry_run: Option<bool>) -> JsonB {
    let _quiet = super::quiet_statement();
    let spec = required(spec, "spec");
    let dry_run = required(dry_run, "dry_run");
    // SAFETY: reads the current transaction's state, on the backend's own thread.
    if !dry_run && unsafe { pg_sys::IsTransactionBlock() } {
        raise(
            CdcError::new(ErrorKind::ActiveSqlTransaction, "cdc_reconcile(..., dry_run => false) cannot run inside a transaction block")
                .detail("It makes the new sinks' replication slots before it writes anything, which PostgreSQL allows only in a transaction that has not written.")
                .hint("Run it on its own (autocommit)."),
        );
    }
    check_prerequisites();
    let schema = schema();
    let parsed = spec::parse(&spec.0).or_raise();
    let _entry = super::access::enter();
    let plan = plan(&schema, &parsed);
    if dry_run || plan.changes() == 0 {
        return JsonB(plan.to_json(dry_run, false));
    }
    if let Some(e) = plan.blocked() {
        raise(e);
    }
    // SAFETY: as above.
    if unsafe { pg_sys::GetTopTransactionIdIfAny() } != pg_sys::InvalidTransactionId {
        raise(CdcError::new(
            ErrorKind::ActiveSqlTransaction,
            "cdc_reconcile(..., dry_run => false) must be the first statement of its transaction that writes",
        ));
    }
    let new_sinks = plan.sinks.iter().filter(|s| matches!(s.action, SinkAction::Create { .. })).count();
    let mut slots = Vec::with_capacity(new_sinks);
    for _ in 0..new_sinks {
        let id = super::sinks::new_sink_id();
        catalog::create_logical_slot(&super::sinks::slot_name(&id));
        slots.push(id);
    }
    if let Err(e) = in_subtransaction(|| apply(&parsed, &plan, &slots)) {
        // The slots are not transactional: the ones made for sinks that are not added go now.
        for id in &slots {
            catalog::run("SELECT pg_drop_replication_slot($1)", &[super::sinks::slot_name(id).as_str().into()]);
        }
        e.rethrow();
    }
    JsonB(plan.to_json(false, true))
}

/// The live state as a spec for `cdc_reconcile`: every captured table with its config and every
/// sink with its type and config, sorted by name; a key that may hold a secret (`properties`,
/// `connection`, `connection_string`, `headers`) is `"(unchanged)"`, which `cdc_reconcile` reads as
/// "keep the live value", so reconciling an export changes nothing.
///
/// ```sql
/// SELECT jsonb_pretty(cdc_export_spec());
/// ```
#[pg_extern(volatile)]
fn cdc_export_spec() -> JsonB {
    let schema = schema();
    let _entry = super::access::enter();
    let tables: Vec<Value> =
        live_tables(&schema).into_iter().map(|t| json!({"name": t.name, "config": t.config})).collect();
    let sinks: Vec<Value> = live_sinks(&schema)
        .into_iter()
        .map(|s| json!({"name": s.name, "type": s.sink_type, "config": spec::export_config(&s.config)}))
        .collect();
    JsonB(json!({"tables": tables, "sinks": sinks}))
}
