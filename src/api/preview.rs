//! `cdc_preview`: the event a row would produce under a table's current capture config, computed
//! by the same code the worker runs, without publishing anything.
use std::sync::Arc;

use cdc_core::config::parse_stored_capture_config;
use cdc_core::decode::{Relation, RelationColumn, TupleValue};
use cdc_core::envelope::{Encoder, FilterMark, Op, RelationPlan, RowChange, TxnInfo};
use cdc_core::lookup::{LookupBinding, LookupId, LookupRow, LookupSource, Lookups};
use cdc_core::types::TypeRegistry;
use cdc_core::{CdcError, ErrorKind, Lsn};
use pgrx::prelude::*;
use pgrx::JsonB;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{required, schema};
use crate::catalog::{self, str_field};
use crate::errors::{raise, OrRaise};
use crate::lookups::{output_text, with_text_format};
use crate::worker::source::learn_type_oids;

/// Shows, for rows of a captured table (its first `max_rows` rows, or the one given as `sample`, a
/// JSON object of column values), whether an INSERT of it would be published under the current config,
/// the branch of the filter it matches, its message key and its event — filtered, masked,
/// tokenized, computed and enriched exactly as the worker would (enriched from the lookup tables'
/// current rows, as a change committed now would be). Nothing is published.
///
/// ```sql
/// SELECT cdc_preview('orders');
/// SELECT cdc_preview('orders', sample => '{"order_id": "ORD-1", "status": "draft"}');
/// ```
#[pg_extern(sql = r#"
CREATE FUNCTION cdc_preview(table_name regclass, sample jsonb DEFAULT NULL, max_rows integer DEFAULT 3) RETURNS jsonb
VOLATILE LANGUAGE c AS '@MODULE_PATHNAME@', '@FUNCTION_NAME@';
"#)]
fn cdc_preview(table_name: Option<pg_sys::Oid>, sample: Option<JsonB>, max_rows: Option<i32>) -> JsonbText {
    let oid = required(table_name, "table_name");
    // Its default is 3; an explicit NULL is refused like every NULL argument (22004).
    let limit = required(max_rows, "max_rows");
    if !(0..=1000).contains(&limit) {
        raise(CdcError::new(ErrorKind::InvalidParameter, format!("max_rows must be between 0 and 1000, not {limit}")));
    }
    super::access::require_select(oid, "preview");
    let _entry = super::access::enter();
    let mut table = TableEncoder::new(oid, "cdc_preview shows events of captured tables; cdc_enable it first.");
    let rows = row_texts(&table.qualified, &table.plan.relation.columns, sample, Some(limit));
    let previews: Vec<Preview> = rows.iter().map(|texts| table.preview(texts)).collect();
    let doc = Document { table: table.name.clone(), operation: "INSERT", previews };
    JsonbText(serde_json::to_string(&doc).unwrap_or_else(|e| raise(CdcError::new(ErrorKind::Internal, e.to_string()))))
}

/// A captured table's events as the worker would encode them now: its capture config, relation,
/// types, lookups (answered from the lookup tables as they are) and the tokenization key. For
/// `cdc_preview` and `cdc_verify`.
pub(crate) struct TableEncoder {
    /// The table as SQL writes it, schema-qualified and quoted.
    pub qualified: String,
    /// Its name as the catalog records it.
    pub name: String,
    /// Its relation and capture config.
    pub plan: RelationPlan,
    types: TypeRegistry,
    lookups: Lookups,
    encoder: Encoder,
    key_error: Option<String>,
    txn: TxnInfo,
}

impl TableEncoder {
    /// The encoder of a captured table (`not_captured_hint`: the HINT when it is not captured).
    pub(crate) fn new(oid: pg_sys::Oid, not_captured_hint: &str) -> Self {
        let schema = schema();
        let captured = catalog::json(
            &format!(
                "SELECT jsonb_build_object('config', config, 'key_columns', to_jsonb(key_columns), 'name', table_name, \
                 'lookup_oids', lookup_oids::bigint[], \
                 'schema', n.nspname::text, 'relname', c.relname::text, 'replident', c.relreplident::text, \
                 'qualified', quote_ident(n.nspname::text) || '.' || quote_ident(c.relname::text), \
                 'columns', (SELECT jsonb_agg(jsonb_build_object('name', a.attname::text, 'type', a.atttypid::bigint, \
                                              'typmod', a.atttypmod) ORDER BY a.attnum) \
                               FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                                AND a.attgenerated = '')) \
                 FROM {schema}._cdc_publications p JOIN pg_class c ON c.oid = p.table_oid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.table_oid = $1"
            ),
            &[oid.into()],
        )
        .unwrap_or_else(|| super::not_captured(oid, not_captured_hint));
        let keys: Vec<String> = serde_json::from_value(captured["key_columns"].clone()).unwrap_or_default();
        let cfg = Arc::new(parse_stored_capture_config(&captured["config"], keys.clone()).or_raise());
        let columns: Vec<RelationColumn> = captured["columns"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        let name = str_field(c, "name").to_string();
                        RelationColumn {
                            is_key: keys.contains(&name),
                            name,
                            type_oid: c["type"].as_u64().unwrap_or(0) as u32,
                            type_mod: c["typmod"].as_i64().unwrap_or(-1) as i32,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut types = TypeRegistry::new();
        learn_type_oids(&columns.iter().map(|c| c.type_oid).collect::<Vec<_>>(), &mut types);
        let relation = Relation {
            oid: oid.to_u32(),
            namespace: str_field(&captured, "schema").to_string(),
            name: str_field(&captured, "relname").to_string(),
            replica_identity: str_field(&captured, "replident").bytes().next().unwrap_or(b'd'),
            columns,
        };
        let lookup_oids: Vec<u32> = serde_json::from_value(captured["lookup_oids"].clone()).unwrap_or_default();
        for l in lookup_oids.iter().filter(|&&l| l != 0) {
            super::access::require_select(pg_sys::Oid::from(*l), "preview the enrichment from");
        }
        let lookups = live_lookups(oid.to_u32(), &captured["config"], &lookup_oids);
        for b in (0..cfg.enrich.len())
            .filter_map(|i| lookups.binding(LookupId { table_oid: oid.to_u32(), position: i as u32 }))
        {
            learn_type_oids(&b.add_types, &mut types);
        }
        let mut plan = RelationPlan::new(relation, cfg, &types, true).unwrap_or_else(|e| {
            raise(CdcError::new(e.kind, format!("the capture config no longer fits the table: {}", e.message)))
        });
        plan.bind_lookups(&lookups).or_raise();
        let mut encoder =
            Encoder::new(&catalog::select_one::<String>("SELECT current_database()::text", &[]).unwrap_or_default());
        let mut key_error = None;
        if plan.needs_token_key() {
            match crate::keys::load(&crate::keys::settings()) {
                Ok(Some(k)) => encoder.token_key = Some(k),
                Ok(None) => key_error = Some(cdc_core::redact::MissingKey.to_string()),
                Err(e) => key_error = Some(e),
            }
        }
        let now = catalog::select_one::<i64>("SELECT ((extract(epoch FROM now()) - 946684800) * 1000000)::int8", &[])
            .unwrap_or(0);
        let txn = TxnInfo { xid: 0, commit_lsn: Lsn(0), commit_time: now, event_count: 1 };
        TableEncoder {
            qualified: str_field(&captured, "qualified").to_string(),
            name: str_field(&captured, "name").to_string(),
            plan,
            types,
            lookups,
            encoder,
            key_error,
            txn,
        }
    }

    /// What an INSERT of the row with these column texts (the worker's text format) would publish.
    pub(crate) fn preview(&mut self, texts: &[Option<String>]) -> Preview {
        let tuple: Vec<TupleValue<'_>> =
            texts.iter().map(|t| t.as_deref().map_or(TupleValue::Null, |s| TupleValue::Text(s.as_bytes()))).collect();
        let row: Value = self
            .plan
            .relation
            .columns
            .iter()
            .zip(texts)
            .map(|(c, t)| (c.name.clone(), t.clone().map_or(Value::Null, Value::String)))
            .collect::<serde_json::Map<_, _>>()
            .into();
        let mark = match &self.plan.filter {
            None => Some(FilterMark::None),
            Some(_) => self.plan.matched_branch(&tuple).map(FilterMark::Matched),
        };
        let Some(mark) = mark else {
            let reason = format!(
                "the filter is not true for this row: {}",
                self.plan.config.filter.as_deref().unwrap_or_default()
            );
            return Preview::refused(row, reason, true);
        };
        if let Some(e) = &self.key_error {
            return Preview::refused(row, e.clone(), false);
        }
        let enriched: Vec<Option<LookupRow>> = (0..self.plan.enrich.len())
            .map(|i| {
                let key = self.plan.lookup_key(i, &tuple)?;
                let key = std::str::from_utf8(key).ok()?;
                self.lookups.lookup(self.plan.enrich[i].id, key).ok().and_then(|(row, _)| row)
            })
            .collect();
        let ch = RowChange {
            plan: &self.plan,
            op: Op::Insert,
            lsn: Lsn(0),
            old: None,
            new: Some(&tuple),
            ctx: None,
            mark: &mark,
            enriched: &enriched,
        };
        let ev = self.encoder.encode_row(&self.types, &ch, &self.txn, 1);
        let text = String::from_utf8_lossy(&ev.payload).into_owned();
        Preview {
            row,
            published: true,
            filtered: false,
            reason: None,
            filter_matched: Some(match &mark {
                FilterMark::Matched(b) => Value::String(b.to_string()),
                _ => Value::Null,
            }),
            key: ev.key.as_deref().and_then(raw_json),
            event: raw_json(text.as_bytes()),
            event_text: Some(text),
        }
    }
}

/// `cdc_preview`'s result. Events and keys are the worker's JSON text as is (`RawValue`), so a
/// number keeps its digits: serde_json's `Value` would show the 1.00 the worker writes as 1.0.
#[derive(Serialize)]
struct Document {
    table: String,
    operation: &'static str,
    previews: Vec<Preview>,
}

/// One row's preview: published with its key, event and the event's text, or not, with the reason.
#[derive(Serialize)]
pub(crate) struct Preview {
    row: Value,
    pub published: bool,
    /// Not published because the filter is not true for it (`reason` says so too).
    #[serde(skip)]
    pub filtered: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    filter_matched: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    event: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_text: Option<String>,
}

impl Preview {
    fn refused(row: Value, reason: String, filtered: bool) -> Self {
        Preview {
            row,
            published: false,
            filtered,
            reason: Some(reason),
            filter_matched: None,
            key: None,
            event: None,
            event_text: None,
        }
    }
}

/// JSON bytes as they are, or None when they are not JSON.
fn raw_json(bytes: &[u8]) -> Option<Box<RawValue>> {
    let text = std::str::from_utf8(bytes).ok()?;
    RawValue::from_string(text.to_string()).ok()
}

/// A jsonb result given as JSON text, which PostgreSQL's own jsonb input parses: numbers keep their
/// digits and scale.
pub(crate) struct JsonbText(String);

impl IntoDatum for JsonbText {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        let text = std::ffi::CString::new(self.0).ok()?;
        // SAFETY: jsonb_in takes a NUL-terminated C string, which `text` is for the call's length.
        unsafe { pgrx::direct_function_call_as_datum(pg_sys::jsonb_in, &[Some(text.as_ptr().into())]) }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// SAFETY: the Datum returned is the jsonb made above, or NULL.
unsafe impl pgrx::callconv::BoxRet for JsonbText {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut pgrx::callconv::FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        match self.into_datum() {
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}

pgrx::impl_sql_translatable!(JsonbText, "jsonb");

/// The text output of each column, under the worker's text format, for the given row or the
/// table's first rows.
/// (`limit` None: every row.)
pub(crate) fn row_texts(
    qualified: &str,
    columns: &[RelationColumn],
    row: Option<JsonB>,
    limit: Option<i32>,
) -> Vec<Vec<Option<String>>> {
    let list = columns.iter().map(|c| output_text(&c.name)).collect::<Vec<_>>().join(", ");
    let (from, arg) = match (&row, limit) {
        (Some(r), _) => (format!("jsonb_populate_record(NULL::{qualified}, $1) t"), Some(r.0.clone())),
        (None, Some(limit)) => (format!("(SELECT * FROM {qualified} LIMIT {limit}) t"), None),
        (None, None) => (format!("{qualified} t"), None),
    };
    let sql = format!("SELECT coalesce(jsonb_agg(jsonb_build_array({list})), '[]') FROM {from}");
    let out = with_text_format(|| match arg {
        Some(a) => catalog::json(&sql, &[JsonB(a).into()]),
        None => catalog::json(&sql, &[]),
    });
    out.and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default()
}

/// The lookups of a table's enrich transformations, answered from the lookup tables themselves.
fn live_lookups(table_oid: u32, config: &Value, lookup_oids: &[u32]) -> Lookups {
    let specs = crate::lookups::specs_of_config(table_oid, config, lookup_oids);
    let bindings: Vec<LookupBinding> = specs
        .iter()
        .map(|s| LookupBinding {
            id: LookupId { table_oid, position: s.position },
            lookup_oid: s.lookup_oid,
            lookup_column: s.lookup_column.clone(),
            add_columns: s.add_columns.clone(),
            add_types: crate::lookups::column_types(s.lookup_oid, &s.add_columns),
            as_of: Lsn(0),
        })
        .collect();
    let mut lookups = Lookups::default();
    lookups.set_source(Box::new(Live { specs }));
    lookups.set_bindings(&bindings);
    lookups
}

/// Reads lookup rows from the lookup tables as they are now.
struct Live {
    specs: Vec<crate::lookups::Spec>,
}

impl LookupSource for Live {
    fn fetch(&mut self, id: LookupId, key: &str) -> Result<Option<LookupRow>, String> {
        let Some(s) = self.specs.iter().find(|s| s.position == id.position) else {
            return Ok(None);
        };
        let list = s.add_columns.iter().map(|c| output_text(c)).collect::<Vec<_>>().join(", ");
        let sql = format!(
            "SELECT ARRAY[{list}]::text[] FROM {} t WHERE {} = $1 LIMIT 1",
            catalog::select_one::<String>("SELECT $1::bigint::oid::regclass::text", &[i64::from(s.lookup_oid).into()])
                .ok_or("the lookup table no longer exists")?,
            output_text(&s.lookup_column)
        );
        let vals = with_text_format(|| catalog::select_one::<Vec<Option<String>>>(&sql, &[key.into()]));
        Ok(vals.map(|v| v.into_iter().map(|s| s.map(Box::from)).collect()))
    }
}
