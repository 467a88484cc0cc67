//! SPI access to PostgreSQL's catalogs and pg_cdc's own tables.
//!
//! Each read is one query that returns a single jsonb document, parsed with serde: it keeps the
//! SPI surface (and its unsafety) to a handful of calls.
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::OwnedPreparedStatement;
use pgrx::JsonB;
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

thread_local! {
    /// Whether the backend's catalog caches may hold entries a logical decoding built (see
    /// [`present_catalog`]).
    static HISTORIC: Cell<bool> = const { Cell::new(false) };
    /// The plans of the queries [`json_kept`] ran, by their text.
    static KEPT: RefCell<HashMap<String, OwnedPreparedStatement>> = RefCell::new(HashMap::new());
}

/// The most plans [`json_kept`] keeps: a process runs one or two such queries; a text that
/// changed (a catalog upgraded under a running worker) makes new ones, and past this many the
/// old ones go.
const KEPT_PLANS: usize = 8;

/// Makes the backend's catalog caches fit for ordinary catalog access: drops them if a logical
/// decoding ran since they were last dropped. Every catalog access of a process that decodes
/// goes through here first (the SPI calls below, `worker::run_tx`, the snapshot reads).
///
/// Decoding looks the catalogs up as they were at the WAL it decodes, and its entries stay in
/// the caches afterwards. An entry built for a position before a DDL whose invalidation this
/// backend had already received (a committed `ALTER TABLE` the decoding has not reached yet)
/// would serve a later ordinary query stale; the other way round, an entry an ordinary query
/// built would serve the decoding of older WAL. `pg_logical_slot_get_changes` drops the caches
/// before and after each call; the worker drops them only when it goes from one kind of access
/// to the other, so a sink that only decodes between its reads (a Kafka sink, its catalog copy
/// reused) keeps its entries from one read to the next, as a walsender does. Measured at 2,000
/// single-row tx/s with one Kafka sink: keeping them took the worker from 0.30 to 0.22 of a core.
pub fn present_catalog() {
    if HISTORIC.with(|h| h.replace(false)) {
        // SAFETY: drops every catalog cache entry of this backend (they are rebuilt on use);
        // callable in or out of a transaction.
        unsafe { pg_sys::InvalidateSystemCaches() };
    }
}

/// The other direction of [`present_catalog`]: called before a logical decoding reads WAL, drops
/// the caches if ordinary catalog access may have filled them since the last decoding.
pub fn historic_catalog() {
    if !HISTORIC.with(|h| h.replace(true)) {
        // SAFETY: as in present_catalog.
        unsafe { pg_sys::InvalidateSystemCaches() };
    }
}

/// The jsonb of a one-row, one-column result: no row and NULL are both `None`.
fn one_json(r: Result<Option<JsonB>, pgrx::spi::SpiError>) -> Option<Value> {
    match r {
        Ok(v) => v.map(|j| j.0),
        Err(pgrx::spi::SpiError::InvalidPosition) => None,
        Err(e) => pgrx::error!("pg_cdc catalog query failed: {e}"),
    }
}

/// Runs a writing statement that returns at most one jsonb value (no row or NULL -> `None`).
pub fn json_write(sql: &str, args: &[DatumWithOid<'_>]) -> Option<Value> {
    present_catalog();
    one_json(Spi::connect_mut(|c| c.update(sql, Some(1), args)?.first().get_one::<JsonB>()))
}

/// Runs a read-only query for one value of any type (no row or NULL -> `None`).
///
/// Reads go through read-only SPI on purpose: pgrx's writing SPI calls assign a transaction id,
/// after which PostgreSQL refuses to create a logical replication slot in that transaction, and
/// the worker would burn an xid per tick.
pub fn select_one<T: pgrx::FromDatum + pgrx::IntoDatum>(sql: &str, args: &[DatumWithOid<'_>]) -> Option<T> {
    present_catalog();
    match Spi::connect(|c| c.select(sql, Some(1), args)?.first().get_one::<T>()) {
        Ok(v) => v,
        Err(pgrx::spi::SpiError::InvalidPosition) => None,
        Err(e) => pgrx::error!("pg_cdc catalog query failed: {e}"),
    }
}

/// Runs a writing statement that returns at most one value of any type (no row or NULL -> `None`).
pub fn select_one_write<T: pgrx::FromDatum + pgrx::IntoDatum>(sql: &str, args: &[DatumWithOid<'_>]) -> Option<T> {
    present_catalog();
    match Spi::connect_mut(|c| c.update(sql, Some(1), args)?.first().get_one::<T>()) {
        Ok(v) => v,
        Err(pgrx::spi::SpiError::InvalidPosition) => None,
        Err(e) => pgrx::error!("pg_cdc catalog statement failed: {e}"),
    }
}

/// Runs a read-only query that returns at most one jsonb value (see [`select_one`]).
pub fn json(sql: &str, args: &[DatumWithOid<'_>]) -> Option<Value> {
    present_catalog();
    one_json(Spi::connect(|c| c.select(sql, Some(1), args)?.first().get_one::<JsonB>()))
}

/// [`json`] for a query without arguments that a process runs again and again (a worker's read
/// of its catalog): it is parsed and planned once, and its plan kept. PostgreSQL's plan cache
/// makes the plan again when what the query reads changes (or the backend's caches were dropped:
/// a worker that decodes its own slot drops them between decoding and its catalog reads, so there
/// the plan is made again each time, as before). A sink reading the shared decoding's log decodes
/// nothing, and its catalog reads, every 5 s, were mostly parsing and planning (by a profile of
/// idle members: parse analysis and planning about a tenth of their CPU).
pub fn json_kept(sql: &str) -> Option<Value> {
    present_catalog();
    one_json(Spi::connect(|c| {
        KEPT.with(|kept| {
            let mut kept = kept.borrow_mut();
            if !kept.contains_key(sql) {
                if kept.len() >= KEPT_PLANS {
                    kept.clear();
                }
                let plan = c.prepare(sql, &[])?.keep();
                kept.insert(sql.to_string(), plan);
            }
            match kept.get(sql) {
                Some(plan) => c.select(plan, Some(1), &[])?.first().get_one::<JsonB>(),
                None => Ok(None),
            }
        })
    }))
}

/// The current transaction's isolation level as SQL names it (`read committed`, `repeatable read`,
/// `serializable`).
pub fn transaction_isolation() -> String {
    select_one::<String>("SELECT current_setting('transaction_isolation')", &[]).unwrap_or_default()
}

/// Runs a statement that changes the database.
pub fn run(sql: &str, args: &[DatumWithOid<'_>]) {
    present_catalog();
    Spi::run_with_args(sql, args).unwrap_or_else(|e| pgrx::error!("pg_cdc catalog statement failed: {e}"))
}

/// Writes a transactional logical message (`prefix`, `content`) into the WAL, in the caller's
/// transaction: sink workers decode it in commit order, before any change that follows it. Returns its
/// LSN as text.
pub fn emit_message(prefix: &str, content: &str) -> String {
    select_one::<String>("SELECT pg_logical_emit_message(true, $1, $2)::text", &[prefix.into(), content.into()])
        .unwrap_or_else(|| pgrx::error!("pg_cdc: cannot write the {prefix} message"))
}

/// The schema pg_cdc is installed in, quoted for SQL, and its installed version, by a query whose
/// plan is kept (a worker asks at every read of its catalog); `None` when the extension is absent.
pub fn installed() -> Option<(String, String)> {
    let v = json_kept(
        "SELECT jsonb_build_array(quote_ident(n.nspname::text), e.extversion) FROM pg_extension e \
         JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_cdc'",
    )?;
    Some((v.get(0)?.as_str()?.to_string(), v.get(1)?.as_str()?.to_string()))
}

/// The schema pg_cdc is installed in, quoted for SQL; `None` when the extension is absent (see
/// [`installed`]).
pub fn extension_schema() -> Option<String> {
    installed().map(|(schema, _)| schema)
}

/// The publication of captured tables whose updates and deletes are captured.
pub const PUBLICATION: &str = "_cdc_publication";

/// The publication of insert-only captured tables: it publishes inserts and truncates only, so
/// the application's UPDATE and DELETE on a table without a replica identity keep working.
pub const PUBLICATION_INSERTS: &str = "_cdc_publication_inserts";

/// Every sink's slot reads both publications.
pub const PUBLICATION_NAMES: &str = "_cdc_publication,_cdc_publication_inserts";

/// Everything `cdc_enable` needs to know about a table, as one jsonb.
pub const TABLE_SHAPE_SQL: &str = r#"
SELECT jsonb_build_object(
  'relkind', c.relkind::text,
  'persistence', c.relpersistence::text,
  'replident', c.relreplident::text,
  'schema', n.nspname::text,
  'name', c.relname::text,
  'display', c.oid::regclass::text,
  'qualified', quote_ident(n.nspname::text) || '.' || quote_ident(c.relname::text),
  'columns', (SELECT coalesce(jsonb_agg(a.attname::text ORDER BY a.attnum), '[]')
                FROM pg_attribute a
               WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
  'column_types', (SELECT coalesce(jsonb_agg(CASE WHEN t.typcategory = 'A' THEN -1
                                                  WHEN t.typtype = 'd' THEN t.typbasetype::bigint
                                                  ELSE t.oid::bigint END ORDER BY a.attnum), '[]')
                     FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                    WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
  'primary_key', (SELECT coalesce(jsonb_agg(a.attname::text ORDER BY k.ord), '[]')
                    FROM pg_index i
                    CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                   WHERE i.indrelid = c.oid AND i.indisprimary),
  'ri_index', (SELECT coalesce(jsonb_agg(a.attname::text ORDER BY k.ord), '[]')
                 FROM pg_index i
                 CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                WHERE i.indrelid = c.oid AND i.indisreplident),
  'ri_index_oid', (SELECT i.indexrelid::bigint FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident),
  'publications', (SELECT coalesce(jsonb_agg(p.pubname::text ORDER BY p.pubname), '[]')
                     FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
                    WHERE p.pubname IN ('_cdc_publication', '_cdc_publication_inserts') AND pr.prrelid = c.oid),
  'generated', (SELECT coalesce(jsonb_agg(a.attname::text ORDER BY a.attnum), '[]')
                  FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated <> ''),
  'is_extension_member', EXISTS (SELECT 1 FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                                  WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                                    AND d.refclassid = 'pg_extension'::regclass AND e.extname = 'pg_cdc')
)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = $1"#;

/// String field of a jsonb object ("" when absent).
pub fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// String-array field of a jsonb object (empty when absent).
pub fn strings_field(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Whether pg_cdc's catalog in `schema` has `table` (a catalog older than the library lacks the
/// tables later versions added, until `ALTER EXTENSION pg_cdc UPDATE`).
pub fn has(schema: &str, table: &str) -> bool {
    let name = format!("{schema}.{table}");
    select_one::<bool>("SELECT to_regclass($1) IS NOT NULL", &[name.as_str().into()]).unwrap_or(false)
}

/// Whether `table` of pg_cdc's catalog in `schema` has `column` (columns later versions added exist
/// only after `ALTER EXTENSION pg_cdc UPDATE`).
pub fn has_column(schema: &str, table: &str, column: &str) -> bool {
    let name = format!("{schema}.{table}");
    select_one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
        &[name.as_str().into(), column.into()],
    )
    .unwrap_or(false)
}

/// A table's schema-qualified name, each part quoted as SQL needs (`public.orders`,
/// `sales."Order Lines"`): the form pg_cdc keeps names in to bind a table created again later.
pub fn qualified_name(oid: pg_sys::Oid) -> Option<String> {
    select_one::<String>(
        "SELECT quote_ident(n.nspname::text) || '.' || quote_ident(c.relname::text)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
        &[oid.into()],
    )
}

/// Creates the persistent logical replication slot `slot` for pgoutput, as
/// `pg_create_logical_replication_slot(slot, 'pgoutput')` does (it waits for the transactions
/// that are writing right now), but called directly instead of through a query.
///
/// Why not `SELECT pg_create_logical_replication_slot(...)`: while the slot looks for its
/// consistent point, PostgreSQL applies the cache invalidations of transactions it decodes (a
/// VACUUM's, for one) inside an internal subtransaction, and rolling that back leaves
/// `CurrentResourceOwner` at the top transaction's. The query that called the function registered
/// its snapshot with the resource owner that was current before (the calling portal's), so
/// unregistering it at the query's end failed with "snapshot reference ... is not owned by
/// resource owner TopTransaction" (XX000). Here nothing is registered around the call, and the
/// caller's resource owner is put back after it, as `pg_logical_slot_get_changes` does.
///
/// On PostgreSQL 17 and later the slot is a failover slot ([`crate::pg_compat::FAILOVER_SLOTS`]).
pub fn create_logical_slot(slot: &str) {
    let signature = crate::pg_compat::CREATE_LOGICAL_SLOT;
    let function = select_one::<pg_sys::Oid>(&format!("SELECT '{signature}'::regprocedure::oid"), &[])
        .unwrap_or_else(|| pgrx::error!("pg_cdc: pg_create_logical_replication_slot is missing"));
    let name = std::ffi::CString::new(slot).unwrap_or_else(|_| pgrx::error!("pg_cdc: invalid slot name {slot:?}"));
    // SAFETY: NameData is plain bytes, filled by namestrcpy; the function reads its arguments as
    // `Name` pointers, which live on this frame for the whole call. An ERROR inside the call
    // unwinds through pgrx's guard and aborts the transaction, which releases the slot (still
    // ephemeral until it is created) and restores the resource owner itself.
    unsafe {
        let mut slot_name: pg_sys::NameData = std::mem::zeroed();
        let mut plugin: pg_sys::NameData = std::mem::zeroed();
        pg_sys::namestrcpy(&mut slot_name, name.as_ptr());
        pg_sys::namestrcpy(&mut plugin, c"pgoutput".as_ptr());
        let owner = pg_sys::CurrentResourceOwner;
        let (name, plugin) = (
            pg_sys::Datum::from(&slot_name as *const pg_sys::NameData),
            pg_sys::Datum::from(&plugin as *const pg_sys::NameData),
        );
        crate::pg_compat::call_create_logical_slot(function, name, plugin);
        pg_sys::CurrentResourceOwner = owner;
    }
}

/// Whether logical slot `slot` holds a change it has not confirmed (committed before `upto`, an LSN
/// as text, when given), looked at through a temporary copy of it (a sink's worker may hold the slot
/// itself): its WAL past the confirmed position decoded until the first transaction that publishes
/// a change of a captured table, whichever sink it is for. WAL that is not such a change (a
/// checkpoint, a running-transactions record) does not count, which the slot's lag in bytes cannot
/// tell apart. Read-only statements only, so the caller's transaction gets no xid (after which
/// PostgreSQL would make no slot in it, this copy included): call it before the transaction writes.
pub fn slot_holds_change(slot: &str, upto: Option<&str>) -> bool {
    // SAFETY: reads the backend's own process id.
    let copy = format!("pg_cdc_look_{}", unsafe { pg_sys::MyProcPid });
    let changes = select_one::<i64>(
        &format!(
            "SELECT count(*) FROM pg_copy_logical_replication_slot($1, $2, true),
                    LATERAL pg_logical_slot_peek_binary_changes($2, $3::pg_lsn, 1, 'proto_version', '1',
                                                                'publication_names', '{PUBLICATION_NAMES}')"
        ),
        &[slot.into(), copy.as_str().into(), upto.into()],
    )
    .unwrap_or(0);
    select_one::<bool>("SELECT pg_drop_replication_slot($1) IS NULL", &[copy.as_str().into()]);
    changes > 0
}

/// Whether the catalog has the snapshots' table: not before `ALTER EXTENSION pg_cdc UPDATE` brought
/// it to 0.4.0.
pub fn has_snapshots(schema: &str) -> bool {
    has(schema, "_cdc_snapshots")
}

/// Runs `f` as `role` (no SET ROLE inside; `restricted`: also a security-restricted operation, as
/// PostgreSQL runs a table owner's code in maintenance), then switches back. After an ERROR the
/// (sub)transaction's abort restores the user, as it does for SECURITY DEFINER functions.
pub fn as_user<R>(role: pg_sys::Oid, restricted: bool, f: impl FnOnce() -> R) -> R {
    let mut user = pg_sys::InvalidOid;
    let mut sec = 0;
    let extra = if restricted {
        pg_sys::SECURITY_LOCAL_USERID_CHANGE | pg_sys::SECURITY_RESTRICTED_OPERATION
    } else {
        pg_sys::SECURITY_LOCAL_USERID_CHANGE
    };
    // SAFETY: saves the current user and security context, and switches to `role`.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut sec);
        pg_sys::SetUserIdAndSecContext(role, sec | extra as i32);
    }
    let out = f();
    // SAFETY: back to the saved user and context.
    unsafe { pg_sys::SetUserIdAndSecContext(user, sec) };
    out
}

/// Sets a setting at the current GUC nesting level, as a function's `SET` clause does (undone by
/// `AtEOXact_GUC` at that level, or by the transaction's rollback).
///
/// # Safety
/// Call it after `NewGUCNestLevel`, in a transaction.
pub unsafe fn set_at_nest_level(name: &std::ffi::CStr, value: &std::ffi::CStr) {
    present_catalog();
    // SAFETY: what fmgr_security_definer does for a SET clause (superuser context: pg_cdc sets
    // it, not the caller).
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
    }
}
