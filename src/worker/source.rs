//! The worker's SPI calls: catalog, slots, progress, types. Each function runs inside `run_tx` and
//! returns owned Rust data. (Reading the slot is `decoding.rs`.)
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use cdc_core::deliver::protocol::SlotView;
use cdc_core::pipeline::RawFrame;
use cdc_core::state::{SinkState, SnapshotState};
use cdc_core::types::{PgTypeRow, TypeRegistry};
use cdc_core::Lsn;
use pgrx::prelude::*;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::catalog::{self, PUBLICATION_NAMES};

/// The settings that fix the text format of every value pgoutput sends (see `cdc_core::types`).
pub const TEXT_FORMAT_SETTINGS: &[(&str, &str)] = &[
    ("DateStyle", "ISO, YMD"),
    ("IntervalStyle", "iso_8601"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "1"),
    ("bytea_output", "hex"),
];

/// Memory the decoding session may hold before it spills a transaction's changes to disk
/// (`logical_decoding_work_mem`, 64 MB by default). The session decodes inside the worker, so this is
/// the worker's own memory: measured, a 1,000,000-row transaction grew the worker by 86 MB with
/// the default, most of it this buffer. Transactions smaller than it (nearly all) never spill.
pub const DECODING_WORK_MEM: &str = "16MB";

/// How long a worker's statement waits for a lock (a read turn excepted).
const LOCK_TIMEOUT: &str = "10s";

/// The worker's session settings: the text format, no statement timeout, the decoding memory, and
/// `search_path = pg_catalog, pg_temp`. The worker runs as a superuser and names every table and
/// pg_cdc object by its schema; with the default path ("$user", public) a role allowed to create in
/// public could shadow a function the worker's statements call (`jsonb_build_object(text, ...)`) and
/// have it run as the superuser.
pub fn set_session_settings(application_name: &str) {
    catalog::run("SET search_path = pg_catalog, pg_temp", &[]);
    for (name, value) in TEXT_FORMAT_SETTINGS {
        catalog::run(&format!("SET {name} = '{value}'"), &[]);
    }
    catalog::run("SET statement_timeout = 0", &[]);
    catalog::run(&format!("SET lock_timeout = '{LOCK_TIMEOUT}'"), &[]);
    set_application_name(application_name);
    catalog::run(&format!("SET logical_decoding_work_mem = '{DECODING_WORK_MEM}'"), &[]);
}

/// Which read turns a sink takes (`cdc.max_concurrent_reads` of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPool {
    /// It sent nothing in the last second (or has not read yet): advisory-lock class 6513763,
    /// "cdc" in ASCII.
    Idle,
    /// It sent something in the last second: class 6513764. Without a pool of their own, a busy
    /// sink queued behind every idle sink's read (each slot decodes all WAL, so an idle sink next
    /// to a busy table reads as often as the busy one): sampled every 10 ms next to 20 idle sinks
    /// at 2,000 tx/s, the busy worker was waiting for a turn in 17-32 % of the samples.
    Delivering,
}

impl ReadPool {
    fn class(self) -> i32 {
        match self {
            ReadPool::Idle => 0x0063_6463,
            ReadPool::Delivering => 0x0063_6464,
        }
    }
}

/// Which read turns a read waits for: `turns` of them in `pool`, `preferred` spreading the
/// waiters over them (see [`take_read_turn`]).
#[derive(Debug, Clone, Copy)]
pub struct TurnRequest {
    /// `cdc.max_concurrent_reads`.
    pub turns: i32,
    /// The turn waited for when all are taken.
    pub preferred: u32,
    /// The pool.
    pub pool: ReadPool,
}

/// A read turn held: release it with [`release_read_turn`] (the end of the transaction releases
/// it too).
#[derive(Debug, Clone, Copy)]
pub struct ReadTurn {
    class: i32,
    k: i32,
}

/// Takes one of the read turns `req` names (a transaction-level advisory lock), waiting for one
/// if all are taken. Shows in pg_locks as an advisory lock with the pool's classid. A turn is held
/// while the WAL is decoded, not while the events go to the destination: a sink whose
/// destination is slow (a Kinesis stream taking a few hundred records a second, a webhook that
/// takes seconds to answer) sends from inside its read, and with the turn held for the whole read
/// every other sink of its pool waited for it (the busy sink of seed example 1 waited up to a
/// minute behind its Kinesis sink).
pub fn take_read_turn(req: TurnRequest) -> ReadTurn {
    let turns = req.turns.max(1);
    let class = req.pool.class();
    for k in 0..turns {
        if try_read_turn(class, k) {
            return ReadTurn { class, k };
        }
    }
    let k = (req.preferred % turns as u32) as i32;
    // A turn can be held for as long as a decoding takes (a large transaction): wait without the
    // session's lock_timeout, then put it back for the rest of the read's transaction.
    catalog::run("SELECT set_config('lock_timeout', '0', true)", &[]);
    catalog::json("SELECT to_jsonb(pg_advisory_xact_lock($1, $2)::text)", &[class.into(), k.into()]);
    catalog::run("SELECT set_config('lock_timeout', $1, true)", &[LOCK_TIMEOUT.into()]);
    ReadTurn { class, k }
}

/// Gives a read turn back before the read's transaction ends.
pub fn release_read_turn(turn: ReadTurn) {
    // SAFETY: the tag the turn was taken with, held by this transaction (LockRelease of a
    // transaction-level lock, as UnlockRelationOid does); a lock not held only logs a WARNING.
    unsafe {
        pg_sys::LockRelease(&read_turn_tag(turn.class, turn.k), pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false);
    }
}

/// The lock tag pg_advisory_xact_lock(int4, int4) builds (SET_LOCKTAG_INT32: the database, both
/// keys, field4 = 2).
fn read_turn_tag(class: i32, k: i32) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set once the worker is connected to its database.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: class as u32,
        locktag_field3: k as u32,
        locktag_field4: 2,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// `pg_try_advisory_xact_lock(class, k)` without a query (one at every decoding: a query would
/// drop the catalog caches the decoding keeps, see `catalog::present_catalog`).
fn try_read_turn(class: i32, k: i32) -> bool {
    // SAFETY: taken for the transaction without waiting, inside the read's transaction.
    unsafe {
        pg_sys::LockAcquire(&read_turn_tag(class, k), pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, true)
            != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
    }
}

/// Sets this session's `application_name` (for the rest of the session).
pub fn set_application_name(name: &str) {
    catalog::run("SELECT set_config('application_name', $1, false)", &[name.into()]);
}

/// A sink as the catalog has it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SinkRow {
    /// Sink id (uuid text).
    pub id: String,
    /// Sink name.
    pub name: String,
    /// Sink type.
    #[serde(rename = "type")]
    pub sink_type: String,
    /// Sink config.
    pub config: Value,
    /// Slot name.
    pub slot: String,
    /// Tables the sink is limited to.
    pub tables: Option<Vec<u32>>,
    /// State last written.
    pub state: String,
    /// Error last written.
    pub last_error: Option<String>,
    /// Added by a role that is not a superuser (see `cdc_sinks::delegation`).
    #[serde(default)]
    pub delegated: bool,
}

impl SinkRow {
    /// Whether the sink carries the table (`config.tables` lists it, or lists none).
    pub fn carries(&self, oid: u32) -> bool {
        self.tables.as_ref().is_none_or(|t| t.contains(&oid))
    }

    /// A finished `initial_only` sink: no worker, no slot, nothing more read.
    pub fn finished(&self) -> bool {
        self.state == cdc_core::state::SinkState::Finished.label()
    }

    /// Whether a worker delivers it: not when finished, nor while paused (`cdc_pause_sink`).
    pub fn has_worker(&self) -> bool {
        cdc_core::state::SinkState::parse(&self.state).is_none_or(|s| s.has_worker())
    }

    /// Paused by `cdc_pause_sink`: no worker; its slot keeps its position.
    pub fn paused(&self) -> bool {
        self.state == cdc_core::state::SinkState::Paused.label()
    }
}

/// A captured table as the catalog has it.
#[derive(Debug, Clone, Deserialize)]
pub struct TableRow {
    /// Table OID.
    pub oid: u32,
    /// Capture config.
    pub config: Value,
    /// Resolved key columns.
    pub key_columns: Vec<String>,
    /// The table as `_cdc_publications.table_name` has it.
    pub name: String,
    /// Its schema history: `[{"lsn": "0/16B3748", "fields": [...]}, ...]` (absent on a catalog
    /// older than 0.4.0).
    #[serde(default)]
    pub history: Option<Value>,
    /// Where its `regional_routing` last changed (absent on a catalog older than 0.4.0).
    #[serde(default)]
    pub routing_lsn: Option<String>,
}

/// A replication slot of this database.
#[derive(Debug, Clone, Deserialize)]
pub struct SlotRow {
    /// Slot name.
    pub name: String,
    /// confirmed_flush_lsn as text.
    pub confirmed: Option<String>,
    /// wal_status (reserved, extended, unreserved, lost).
    pub wal_status: Option<String>,
    /// PID of the process using it, if any.
    pub active_pid: Option<i32>,
    /// Why PostgreSQL invalidated it (PostgreSQL 17+; absent before).
    #[serde(default)]
    pub invalidation_reason: Option<String>,
    /// WAL it retains: current WAL position - restart_lsn (bytes).
    #[serde(default)]
    pub retained: Option<i64>,
}

/// Everything the worker reads at the start of a tick.
#[derive(Debug, Clone, Deserialize)]
pub struct Catalog {
    /// Whether the extension is installed in this database.
    pub installed: bool,
    /// pg_control_system().system_identifier (for transactional ids).
    #[serde(default)]
    pub system_identifier: String,
    /// OID of the worker's database.
    #[serde(default)]
    pub database_oid: u64,
    /// The extension's schema, quoted (set when installed).
    #[serde(skip)]
    pub schema: Option<String>,
    /// Current database.
    pub database: String,
    /// Database clock (for orphan-slot sightings).
    pub now: String,
    /// pg_current_wal_insert_lsn() as text.
    pub wal_insert_lsn: String,
    /// pg_current_snapshot() of the catalog query as text: the transactions the copy reflects.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Sinks.
    pub sinks: Vec<SinkRow>,
    /// Captured tables.
    pub tables: Vec<TableRow>,
    /// Slots named like pg_cdc's in this database.
    pub slots: Vec<SlotRow>,
    /// pg_cdc's publications that exist (both, unless someone dropped one by hand).
    #[serde(default)]
    pub publications: Vec<String>,
}

/// A table's schema history as the catalog query returns it (see [`TableRow::history`]).
pub fn history(v: &Value) -> cdc_core::schema::History {
    let versions = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|version| {
            let lsn: cdc_core::Lsn = version.get("lsn")?.as_str()?.parse().ok()?;
            let fields =
                version.get("fields")?.as_array()?.iter().filter_map(cdc_core::schema::Field::from_json).collect();
            let number = i32::try_from(version.get("version")?.as_i64()?).ok()?;
            let forced = version.get("forced").and_then(Value::as_bool).unwrap_or(false);
            let own_topic = version.get("own_topic").and_then(Value::as_bool).unwrap_or(false);
            Some(cdc_core::schema::Version { lsn, number, forced, own_topic, fields })
        })
        .collect();
    cdc_core::schema::History::from_versions(versions)
}

thread_local! {
    /// The catalog query of [`load_catalog`] and the schema and version it was made for. Which of
    /// the catalog's tables and columns exist depends on the installed version only, so it is made
    /// again only when that changes (`ALTER EXTENSION pg_cdc UPDATE`); making it took six queries,
    /// each parsed and planned at every read: by a profile of idle sinks sharing a decoding, about
    /// a fifth of their CPU with the read itself.
    static CATALOG_QUERY: std::cell::RefCell<Option<(String, String, std::rc::Rc<str>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Reads the catalog; `None` when the extension is not installed in this database.
pub fn load_catalog() -> Catalog {
    let Some((schema, version)) = catalog::installed() else {
        // Without the extension there are no sinks: every pg_cdc slot left here is an orphan
        // (DROP EXTENSION does not drop slots).
        return load(&format!(
            "SELECT jsonb_build_object('installed', false, 'database', current_database(), 'now', clock_timestamp()::text, \
             'wal_insert_lsn', pg_current_wal_insert_lsn()::text, 'sinks', '[]'::jsonb, 'tables', '[]'::jsonb, 'slots', {SLOTS_SQL})"
        ));
    };
    let kept = CATALOG_QUERY
        .with(|q| q.borrow().as_ref().filter(|(s, v, _)| *s == schema && *v == version).map(|(_, _, sql)| sql.clone()));
    let sql = kept.unwrap_or_else(|| {
        let sql: std::rc::Rc<str> = catalog_query(&schema).into();
        CATALOG_QUERY.with(|q| *q.borrow_mut() = Some((schema.clone(), version, sql.clone())));
        sql
    });
    let mut cat = load(&sql);
    cat.schema = Some(schema);
    cat
}

/// The query of [`load_catalog`] for the catalog in `schema`, as its installed version has it.
fn catalog_query(schema: &str) -> String {
    // The schema history, once the catalog has it (ALTER EXTENSION pg_cdc UPDATE to 0.4.0).
    let history = if catalog::has(schema, "_cdc_schema_versions") {
        // Versions with a topic of their own (cdc_create_version_topic).
        let own_topic = if catalog::has(schema, "_cdc_version_topics") {
            format!(
                "EXISTS (SELECT 1 FROM {schema}._cdc_version_topics t WHERE t.table_oid = v.table_oid AND t.version = v.version)"
            )
        } else {
            "false".to_string()
        };
        format!(
            "(SELECT jsonb_agg(jsonb_build_object('lsn', v.lsn::text, 'fields', v.fields, 'version', v.version, 'forced', v.forced,
                                                  'own_topic', {own_topic}) ORDER BY v.version)
                FROM {schema}._cdc_schema_versions v WHERE v.table_oid = p.table_oid)"
        )
    } else {
        "NULL::jsonb".to_string()
    };
    let routing_lsn = if catalog::has(schema, "_cdc_route_offsets") { "p.routing_lsn::text" } else { "NULL::text" };
    // Added by a role that is not a superuser now (a dropped role is none); before 0.7.0, by a superuser.
    let delegated = if catalog::has_column(schema, "_cdc_sinks", "added_by") {
        "coalesce((SELECT NOT r.rolsuper FROM pg_roles r WHERE r.oid = added_by), added_by IS NOT NULL)"
    } else {
        "false"
    };
    format!(
        r#"SELECT jsonb_build_object(
  'installed', true,
  'system_identifier', (SELECT system_identifier::text FROM pg_control_system()),
  'database_oid', (SELECT oid::bigint FROM pg_database WHERE datname = current_database()),
  'database', current_database(),
  'now', clock_timestamp()::text,
  'wal_insert_lsn', pg_current_wal_insert_lsn()::text,
  'snapshot', pg_current_snapshot()::text,
  'sinks', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'id', sink_id, 'name', sink_name, 'type', sink_type, 'config', config, 'slot', slot_name,
                'tables', table_oids::bigint[], 'state', state, 'last_error', last_error,
                'delegated', {delegated}) ORDER BY created_at), '[]')
              FROM {schema}._cdc_sinks),
  'tables', (SELECT coalesce(jsonb_agg(jsonb_build_object('oid', table_oid::bigint, 'config', config, 'key_columns', key_columns,
                                                         'name', table_name, 'history', {history},
                                                         'routing_lsn', {routing_lsn})), '[]')
               FROM {schema}._cdc_publications p WHERE status = 'active'),
  'slots', {SLOTS_SQL},
  'publications', (SELECT coalesce(jsonb_agg(pubname::text), '[]') FROM pg_publication
                   WHERE pubname = ANY (string_to_array('{PUBLICATION_NAMES}', ',')))
)"#
    )
}

/// pg_cdc's slots in this database.
const SLOTS_SQL: &str = r#"(SELECT coalesce(jsonb_agg(jsonb_build_object('name', slot_name, 'confirmed', confirmed_flush_lsn::text,
                'wal_status', wal_status, 'active_pid', active_pid,
                'invalidation_reason', to_jsonb(s) ->> 'invalidation_reason',
                'retained', (pg_current_wal_lsn() - restart_lsn)::bigint)), '[]')
              FROM pg_replication_slots s WHERE database = current_database() AND slot_name LIKE '\_cdc\_%')"#;

fn load(sql: &str) -> Catalog {
    let v = catalog::json_kept(sql).unwrap_or_default();
    match serde_json::from_value(v) {
        Ok(c) => c,
        Err(e) => pgrx::error!("pg_cdc: unexpected catalog shape: {e}"),
    }
}

/// Creates a sink's slot (for sinks added inside a transaction that had already written).
pub fn create_slot(slot: &str) {
    catalog::create_logical_slot(slot);
}

/// Drops a slot.
pub fn drop_slot(slot: &str) {
    catalog::json("SELECT to_jsonb(pg_drop_replication_slot($1)::text)", &[slot.into()]);
}

/// Whether a transaction that started before `since` is still open (it may be the one that
/// created a slot whose sink row is not committed yet).
pub fn older_transaction_open(since: &str) -> bool {
    catalog::json(
        "SELECT to_jsonb(EXISTS (SELECT 1 FROM pg_stat_activity WHERE xact_start < $1::timestamptz AND pid <> pg_backend_pid()))",
        &[since.into()],
    ) == Some(Value::Bool(true))
}

/// Whether a sink row names `slot` (read in the caller's transaction: a sink committed after the
/// catalog was read, whose slot was created inside its transaction, counts), leaving out finished
/// sinks (their slots are dropped).
pub fn slot_has_sink(schema: &str, slot: &str) -> bool {
    catalog::json(
        &format!(
            "SELECT to_jsonb(EXISTS (SELECT 1 FROM {schema}._cdc_sinks WHERE slot_name = $1 AND state <> 'finished'))"
        ),
        &[slot.into()],
    ) == Some(Value::Bool(true))
}

/// Looks up, in pg_type, every column type of the batch's relations the registry has not seen
/// (then their element and base types), once per worker lifetime.
pub(super) fn learn_types(frames: &[RawFrame], types: &mut TypeRegistry) {
    let mut oids: Vec<u32> = Vec::new();
    for f in frames.iter().filter(|f| f.data.first() == Some(&b'R')) {
        if let Ok(cdc_core::decode::Message::Relation(rel)) = cdc_core::decode::decode(&f.data) {
            oids.extend(rel.columns.iter().map(|c| c.type_oid));
        }
    }
    learn_type_oids(&oids, types);
}

/// Looks up, in pg_type, the types of `oids` the registry has not seen (then their element and
/// base types).
pub fn learn_type_oids(oids: &[u32], types: &mut TypeRegistry) {
    let mut wanted: Vec<u32> = Vec::new();
    for &o in oids {
        if !types.knows(o) && !wanted.contains(&o) {
            wanted.push(o);
        }
    }
    for _ in 0..8 {
        if wanted.is_empty() {
            return;
        }
        let list = format!("{{{}}}", wanted.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
        let rows = catalog::json(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('oid', oid::bigint, 'typtype', typtype::text, 'typcategory', typcategory::text, \
             'typelem', typelem::bigint, 'typbasetype', typbasetype::bigint, 'typdelim', typdelim::text, \
             'enum_labels', (SELECT jsonb_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid))), '[]') \
             FROM pg_type t WHERE oid = ANY($1::oid[])",
            &[list.as_str().into()],
        )
        .unwrap_or(Value::Null);
        let mut rows: Vec<PgTypeRow> = rows
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| PgTypeRow {
                        oid: r["oid"].as_u64().unwrap_or(0) as u32,
                        typtype: catalog::str_field(r, "typtype").bytes().next().unwrap_or(b'b'),
                        typcategory: catalog::str_field(r, "typcategory").bytes().next().unwrap_or(b'U'),
                        typelem: r["typelem"].as_u64().unwrap_or(0) as u32,
                        typbasetype: r["typbasetype"].as_u64().unwrap_or(0) as u32,
                        typdelim: catalog::str_field(r, "typdelim").bytes().next().unwrap_or(b','),
                        enum_labels: r["enum_labels"]
                            .as_array()
                            .map(|a| a.iter().filter_map(|l| l.as_str().map(String::from)).collect())
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        // Dependencies first: a domain's base type and an array's element type must be known.
        let next: Vec<u32> = rows
            .iter()
            .flat_map(|r| [r.typelem, r.typbasetype])
            .filter(|&o| o != 0 && !types.knows(o) && !wanted.contains(&o))
            .collect();
        if !next.is_empty() {
            wanted = next.into_iter().chain(wanted).collect();
            wanted.dedup();
            continue;
        }
        rows.sort_by_key(|r| (r.typtype == b'd') as u8);
        for r in &rows {
            types.add(r);
        }
        // Types pg_type no longer has (dropped since) are converted as text.
        for o in &wanted {
            if !types.knows(*o) {
                types.add(&PgTypeRow {
                    oid: *o,
                    typtype: b'b',
                    typcategory: b'U',
                    typelem: 0,
                    typbasetype: 0,
                    typdelim: b',',
                    enum_labels: Vec::new(),
                });
            }
        }
        wanted.clear();
    }
}

pub use cdc_core::deliver::read::TableProgress;

/// Whether this sink worker has seen `_cdc_offsets` with `table_schema` (0.6.0 on): once it has, no
/// more look at the catalog at each confirm (an update never goes back; a new catalog comes only with
/// DROP EXTENSION, which drops this worker's sink).
static OFFSETS_HAVE_TABLE_SCHEMA: AtomicBool = AtomicBool::new(false);

/// Whether `_cdc_offsets` has `table_schema`, in the transaction that writes it. Before 0.6.0 the
/// catalog keys the offsets by the table's name as regclass::text prints it, and has no table_schema.
/// The lock the INSERT takes anyway is taken before the look at the catalog: an ALTER EXTENSION
/// UPDATE committing in between would leave the INSERT of the old form without its constraint (the
/// confirm failed, and the sink read its last delivery again).
fn offsets_have_table_schema(schema: &str) -> bool {
    if OFFSETS_HAVE_TABLE_SCHEMA.load(Ordering::Relaxed) {
        return true;
    }
    catalog::run(&format!("LOCK TABLE {schema}._cdc_offsets IN ROW EXCLUSIVE MODE"), &[]);
    let has = catalog::has_column(schema, "_cdc_offsets", "table_schema");
    OFFSETS_HAVE_TABLE_SCHEMA.store(has, Ordering::Relaxed);
    has
}

/// Records the per-table progress of a delivered read (`_cdc_offsets`); tables dropped since are
/// left out.
pub fn record_progress(schema: &str, sink_name: &str, progress: &HashMap<u32, TableProgress>) {
    if progress.is_empty() {
        return;
    }
    let rows: Vec<Value> = progress
        .iter()
        .map(|(oid, p)| json!({"table_oid": oid, "n": p.events, "last_lsn": p.last_commit_lsn, "ts": p.last_commit_unix_micros}))
        .collect();
    let sql = if offsets_have_table_schema(schema) {
        format!(
            "INSERT INTO {schema}._cdc_offsets AS o
                    (sink_name, table_name, last_lsn, last_timestamp, events_published, table_oid, table_schema)
             SELECT $1, c.relname, x.last_lsn, 'epoch'::timestamptz + x.ts * interval '1 microsecond', x.n, x.table_oid,
                    n.nspname
               FROM jsonb_to_recordset($2) AS x(table_oid oid, n bigint, last_lsn bigint, ts bigint)
               -- A table dropped since its events were delivered has no row here any more (its
               -- name is gone).
               JOIN pg_class c ON c.oid = x.table_oid
               JOIN pg_namespace n ON n.oid = c.relnamespace
             -- One row per table: a RENAME (of the table or its schema) renames the row.
             ON CONFLICT (sink_name, table_oid) DO UPDATE
                SET last_lsn = EXCLUDED.last_lsn, last_timestamp = EXCLUDED.last_timestamp,
                    events_published = o.events_published + EXCLUDED.events_published,
                    table_name = EXCLUDED.table_name, table_schema = EXCLUDED.table_schema"
        )
    } else {
        format!(
            "INSERT INTO {schema}._cdc_offsets AS o (sink_name, table_name, last_lsn, last_timestamp, events_published, table_oid)
             SELECT $1, CASE WHEN n.nspname IN ('public', current_user) THEN quote_ident(c.relname) ELSE c.oid::regclass::text END,
                    x.last_lsn, 'epoch'::timestamptz + x.ts * interval '1 microsecond', x.n, x.table_oid
               FROM jsonb_to_recordset($2) AS x(table_oid oid, n bigint, last_lsn bigint, ts bigint)
               JOIN pg_class c ON c.oid = x.table_oid
               JOIN pg_namespace n ON n.oid = c.relnamespace
             ON CONFLICT (sink_name, table_name) DO UPDATE
                SET last_lsn = EXCLUDED.last_lsn, last_timestamp = EXCLUDED.last_timestamp,
                    events_published = o.events_published + EXCLUDED.events_published, table_oid = EXCLUDED.table_oid"
        )
    };
    catalog::run(&sql, &[sink_name.into(), pgrx::JsonB(Value::Array(rows)).into()]);
}

/// Records the per-route progress of a delivered read (`_cdc_route_offsets`): counts of an older
/// routing of the table start again from these.
pub fn record_route_progress(
    schema: &str,
    sink_name: &str,
    routes: &HashMap<(u32, std::sync::Arc<str>, cdc_core::Lsn), (u64, i64)>,
) {
    if routes.is_empty() {
        return;
    }
    let rows: Vec<Value> = routes
        .iter()
        .map(|((oid, route, at), (n, ts))| {
            json!({"table_oid": oid, "route": &**route, "routing_lsn": at.to_string(), "n": n, "ts": ts})
        })
        .collect();
    catalog::run(
        &format!(
            "INSERT INTO {schema}._cdc_route_offsets AS o (sink_name, table_oid, route, routing_lsn, events, last_commit_at, last_acked_at)
             SELECT $1, x.table_oid, x.route, x.routing_lsn::pg_lsn, x.n, 'epoch'::timestamptz + x.ts * interval '1 microsecond', now()
               FROM jsonb_to_recordset($2) AS x(table_oid oid, route text, routing_lsn text, n bigint, ts bigint)
              WHERE EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = x.table_oid)
             ON CONFLICT (sink_name, table_oid, route) DO UPDATE
                SET events = CASE WHEN o.routing_lsn = EXCLUDED.routing_lsn THEN o.events + EXCLUDED.events ELSE EXCLUDED.events END,
                    routing_lsn = EXCLUDED.routing_lsn, last_commit_at = EXCLUDED.last_commit_at,
                    last_acked_at = EXCLUDED.last_acked_at"
        ),
        &[sink_name.into(), pgrx::JsonB(Value::Array(rows)).into()],
    );
}

/// Records the ids schema registries gave table versions (`_cdc_schema_versions.schema_ids`, once
/// per registry and subject), for `cdc_schema_history`. Nothing on a catalog older than 0.4.0.
pub fn record_registrations(schema: &str, registrations: &[cdc_core::format::Registration]) {
    if registrations.is_empty() || !catalog::has(schema, "_cdc_schema_versions") {
        return;
    }
    for r in registrations {
        let entry = json!([{"registry": r.registry, "subject": r.subject, "schema_id": r.schema_id}]);
        catalog::run(
            &format!(
                "UPDATE {schema}._cdc_schema_versions SET schema_ids = schema_ids || $3
                  WHERE table_oid = $1 AND version = $2 AND NOT schema_ids @> $3"
            ),
            &[pg_sys::Oid::from(r.table_oid).into(), r.version.into(), pgrx::JsonB(entry).into()],
        );
    }
}

/// Commit LSN of the last transaction recorded in `_cdc_offsets` for each table of a sink.
pub fn recorded_offsets(schema: &str, sink_name: &str) -> HashMap<u32, u64> {
    let rows = catalog::json(
        &format!(
            "SELECT coalesce(jsonb_object_agg(table_oid::bigint::text, last_lsn), '{{}}') \
               FROM {schema}._cdc_offsets WHERE sink_name = $1 AND last_lsn IS NOT NULL"
        ),
        &[sink_name.into()],
    )
    .unwrap_or_default();
    rows.as_object()
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.parse().ok()?, v.as_u64()?))).collect())
        .unwrap_or_default()
}

/// Records a sink's state (only called when it changed).
pub fn set_state(schema: &str, sink_id: &str, state: &str, error: Option<&str>) {
    // Never over a pause: cdc_pause_sink may commit while this worker is still in a pass (its
    // UPDATE then finds the paused row and skips it), and the worker exits at its next catalog read.
    let paused = cdc_core::state::SinkState::Paused.label();
    catalog::run(
        &format!(
            "UPDATE {schema}._cdc_sinks SET state = $2, last_error = $3, state_since = now()
              WHERE sink_id = $1::uuid AND state <> '{paused}'"
        ),
        &[sink_id.into(), state.into(), error.into()],
    );
}

/// Marks an `initial_only` sink finished, unless a snapshot of it is still open; returns whether it
/// did. Its row is locked first: a snapshot requested meanwhile (`cdc_snapshot`, `cdc_enable` of a
/// table it carries) either committed before, and is seen here, or waits and then sees the sink
/// finished (those requests lock the row too, and leave finished sinks out).
pub fn finish_sink(schema: &str, sink_id: &str) -> bool {
    let (open, finished) = (SnapshotState::open_sql(), SinkState::Finished.label());
    catalog::json_write(
        &format!("SELECT to_jsonb(true) FROM {schema}._cdc_sinks WHERE sink_id = $1::uuid FOR UPDATE"),
        &[sink_id.into()],
    );
    catalog::json_write(
        &format!(
            "WITH f AS (UPDATE {schema}._cdc_sinks SET state = '{finished}', last_error = NULL, state_since = now()
                         WHERE sink_id = $1::uuid AND NOT EXISTS (SELECT 1 FROM {schema}._cdc_snapshots
                                 WHERE sink_id = $1::uuid AND state IN {open})
                        RETURNING 1)
             SELECT to_jsonb(count(*) > 0) FROM f"
        ),
        &[sink_id.into()],
    ) == Some(Value::Bool(true))
}

/// Writes a running-transactions record (PostgreSQL 16's pg_log_standby_snapshot()); returns
/// where it was written, or None during recovery, where no WAL can be written.
pub fn log_running_xacts() -> Option<Lsn> {
    // SAFETY: called inside a transaction of a regular backend (the worker's run_tx), outside any
    // critical section; LogStandbySnapshot takes its own locks and needs wal_level >= replica,
    // which logical decoding already requires.
    unsafe {
        if pg_sys::RecoveryInProgress() {
            return None;
        }
        Some(Lsn(pg_sys::LogStandbySnapshot()))
    }
}

/// Writes a heartbeat message that the sink's next read returns, so its slot can move past WAL
/// it does not capture. Returns the WAL insert position after it.
pub fn emit_heartbeat() -> Option<String> {
    catalog::json(
        &format!(
            "SELECT to_jsonb(pg_logical_emit_message(false, '{}', '')::text)",
            cdc_core::pipeline::HEARTBEAT_PREFIX
        ),
        &[],
    )
    .and_then(|v| v.as_str().map(str::to_string))
}

/// The first of pg_cdc's publications that does not exist (if one does not), and what the catalog
/// says about the sink's slot.
pub fn slot_view<'a>(cat: &'a Catalog, row: &SinkRow) -> (Option<&'a str>, SlotView) {
    let missing = PUBLICATION_NAMES.split(',').find(|p| !cat.publications.iter().any(|q| q == p));
    let found = cat.slots.iter().find(|s| s.name == row.slot);
    let slot = SlotView {
        name: row.slot.clone(),
        exists: found.is_some(),
        wal_status: found.and_then(|s| s.wal_status.clone()),
        invalidation_reason: found.and_then(|s| s.invalidation_reason.clone()),
        // Its own session holds the slot between reads.
        // SAFETY: MyProcPid is this process's pid, set at its start.
        active_pid: found.and_then(|s| s.active_pid).filter(|&p| p != unsafe { pg_sys::MyProcPid }),
        confirmed: found.and_then(|s| s.confirmed.as_deref()).and_then(|s| s.parse().ok()).unwrap_or_default(),
    };
    (missing, slot)
}
