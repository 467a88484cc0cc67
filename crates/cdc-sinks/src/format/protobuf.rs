//! The Protobuf format: each event as a `pg_cdc.v1.Event` message of the published contract
//! `proto/pg_cdc/v1/event.proto` (one generic message for every table: a row is its columns in
//! table order, each value tagged with its kind), its key as a `pg_cdc.v1.Row`. With a schema
//! registry, both are framed as Confluent's Protobuf serializer frames them: a zero byte, the
//! schema id (4 bytes, big-endian), the message's index path in the file (`[0]` for `Event`,
//! written as one zero byte; `[5]` for `Row`), then the message.
//!
//! The values are written straight from the JSON event's text by the column's type ([`Kind`]),
//! so every filter, transformation and redaction rule holds, as in the other formats.
use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use cdc_core::envelope::{Event, RelationPlan};
use cdc_core::format::{EventFormat, FormatError};
use cdc_core::types::{TypeKind, TypeRegistry};
use serde_json::value::RawValue;

use super::schema_registry::SchemaRegistry;
use super::{checked_registry, configured_registry};
use crate::kafka::config::expand_topic;

use super::avro::{json_string, parse_date, parse_time, parse_timestamp};
use super::event::{Compliance, Fields, JsonEvent, Metadata};

/// The published contract, as registered with a schema registry.
pub const PROTO: &str = include_str!("../../../../proto/pg_cdc/v1/event.proto");

/// The index of `Row` among the file's top-level messages (Event, Metadata, Transaction,
/// Truncate, Compliance, Row, ...): its Confluent message-index path is `[5]`.
pub const ROW_INDEX: u64 = 5;

/// A value's kind in the contract (`Value.kind`), from its column's type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `bool_value`.
    Bool,
    /// `int_value` (sint64).
    Int,
    /// `double_value`.
    Double,
    /// `decimal_value`: the exact text.
    Decimal,
    /// `string_value`.
    String,
    /// `bytes_value`.
    Bytes,
    /// `json_value`.
    Json,
    /// `date_value`.
    Date,
    /// `time_value`.
    Time,
    /// `timestamp_value`.
    Timestamp,
    /// `local_timestamp_value`.
    LocalTimestamp,
    /// `uuid_value`.
    Uuid,
    /// `array_value` of the element's kind.
    Array(Box<Kind>),
}

/// The kind of a column of type `oid`.
pub fn column_kind(types: &TypeRegistry, oid: u32) -> Kind {
    match types.base_type(oid) {
        16 => Kind::Bool,
        21 | 23 | 20 | 26 | 28 | 29 | 5069 => Kind::Int,
        700 | 701 => Kind::Double,
        1700 | 790 => Kind::Decimal,
        1082 => Kind::Date,
        1083 => Kind::Time,
        1114 => Kind::LocalTimestamp,
        1184 => Kind::Timestamp,
        2950 => Kind::Uuid,
        17 => Kind::Bytes,
        114 | 3802 => Kind::Json,
        oid => match types.kind(oid) {
            TypeKind::Bool => Kind::Bool,
            TypeKind::Integer => Kind::Int,
            TypeKind::Float => Kind::Double,
            TypeKind::Numeric => Kind::Decimal,
            TypeKind::Json => Kind::Json,
            TypeKind::Bytea => Kind::Bytes,
            TypeKind::TimestampTz => Kind::Timestamp,
            TypeKind::Timestamp => Kind::LocalTimestamp,
            TypeKind::Date => Kind::Date,
            TypeKind::Array { element, .. } => Kind::Array(Box::new(column_kind(types, element))),
            TypeKind::Text => Kind::String,
        },
    }
}

fn computed_kind(kind: TypeKind) -> Kind {
    match kind {
        TypeKind::Bool => Kind::Bool,
        TypeKind::Integer => Kind::Int,
        TypeKind::Float => Kind::Double,
        _ => Kind::String,
    }
}

/// The kind of each column an event can carry, by name.
pub type Kinds = Vec<(String, Kind)>;

/// The kinds of every column an event of `plan` can carry, by name.
pub fn kinds(plan: &RelationPlan, types: &TypeRegistry) -> Kinds {
    let rel = &plan.relation;
    let mut out: Vec<(String, Kind)> = (0..rel.columns.len())
        .map(|i| {
            let kind =
                if plan.redact[i].is_some() { Kind::String } else { column_kind(types, rel.columns[i].type_oid) };
            (rel.columns[i].name.clone(), kind)
        })
        .collect();
    for (e, cfg) in plan.enrich.iter().zip(&plan.config.enrich) {
        for (name, &oid) in cfg.add_columns.iter().zip(e.added_types()) {
            out.push((name.clone(), column_kind(types, oid)));
        }
    }
    for (name, bound) in &plan.computed {
        out.push((name.clone(), computed_kind(bound.result_kind())));
    }
    out
}

// --- the wire format -----------------------------------------------------------------------

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn bytes_field(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn uint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, VARINT);
    varint(out, v);
}

/// `int32`/`int64`: a negative value is its 64-bit two's complement (ten bytes).
fn int_field(out: &mut Vec<u8>, field: u32, v: i64) {
    uint_field(out, field, v as u64);
}

fn sint_field(out: &mut Vec<u8>, field: u32, v: i64) {
    uint_field(out, field, ((v << 1) ^ (v >> 63)) as u64);
}

/// A nested message: written by `f` into `scratch`, then length-prefixed into `out`.
fn message_field(
    out: &mut Vec<u8>,
    field: u32,
    f: impl FnOnce(&mut Vec<u8>) -> Result<(), String>,
) -> Result<(), String> {
    let mut inner = Vec::with_capacity(64);
    f(&mut inner)?;
    bytes_field(out, field, &inner);
    Ok(())
}

// --- values --------------------------------------------------------------------------------

impl Kind {
    /// Appends the `Value` message of one JSON value of the event (its raw text).
    pub fn write_value(&self, raw: &str, out: &mut Vec<u8>) -> Result<(), String> {
        if raw == "null" {
            uint_field(out, 1, 0);
            return Ok(());
        }
        let bad = || format!("{raw} is not a {self:?} value");
        let text = || json_string(raw).ok_or_else(bad);
        match self {
            Kind::Bool => uint_field(
                out,
                2,
                match raw {
                    "true" => 1,
                    "false" => 0,
                    _ => return Err(bad()),
                },
            ),
            Kind::Int => sint_field(out, 3, raw.parse().map_err(|_| bad())?),
            Kind::Double => {
                let v = match raw {
                    "\"NaN\"" => f64::NAN,
                    "\"Infinity\"" => f64::INFINITY,
                    "\"-Infinity\"" => f64::NEG_INFINITY,
                    _ => raw.parse().map_err(|_| bad())?,
                };
                tag(out, 4, FIXED64);
                out.extend_from_slice(&v.to_le_bytes());
            }
            // A number's text, or a string's content ("NaN", "$12.34").
            Kind::Decimal => match json_string(raw) {
                Some(s) => bytes_field(out, 5, s.as_bytes()),
                None => bytes_field(out, 5, raw.as_bytes()),
            },
            Kind::String => match json_string(raw) {
                Some(s) => bytes_field(out, 6, s.as_bytes()),
                None => bytes_field(out, 6, raw.as_bytes()),
            },
            Kind::Bytes => {
                let s = text()?;
                let b = base64::engine::general_purpose::STANDARD.decode(s.as_bytes()).map_err(|_| bad())?;
                bytes_field(out, 7, &b);
            }
            Kind::Json => bytes_field(out, 8, raw.as_bytes()),
            Kind::Date => int_field(out, 9, i64::from(parse_date(&text()?).ok_or_else(bad)?)),
            Kind::Time => int_field(out, 10, parse_time(&text()?).ok_or_else(bad)?),
            Kind::Timestamp => int_field(out, 11, parse_timestamp(&text()?).ok_or_else(bad)?),
            Kind::LocalTimestamp => int_field(out, 12, parse_timestamp(&text()?).ok_or_else(bad)?),
            Kind::Uuid => bytes_field(out, 13, text()?.as_bytes()),
            Kind::Array(e) => {
                let items: Vec<&RawValue> = serde_json::from_str(raw).map_err(|_| bad())?;
                message_field(out, 14, |list| {
                    for item in items {
                        let item = item.get();
                        if item.starts_with('[') && !matches!(**e, Kind::Array(_)) {
                            return Err(format!(
                                "{raw}: a multidimensional array cannot be written as a ListValue of one dimension"
                            ));
                        }
                        message_field(list, 1, |v| e.write_value(item, v))?;
                    }
                    Ok(())
                })?;
            }
        }
        Ok(())
    }
}

/// Appends a `Row`: the image's columns in their order, each with its kind's value.
fn write_row(fields: &Fields<'_>, kinds: &[(String, Kind)], out: &mut Vec<u8>) -> Result<(), String> {
    // An image's columns come in the kinds' order (it leaves columns out, never reorders them; a
    // key names its own): one pass, from where the last column was found.
    let mut next = 0;
    for (name, raw) in &fields.0 {
        let at = kinds[next..]
            .iter()
            .position(|(n, _)| n == &*name.0)
            .map(|p| next + p)
            .or_else(|| kinds.iter().position(|(n, _)| n == &*name.0))
            .ok_or_else(|| format!("column \"{}\" is not in the table version", name.0))?;
        next = at + 1;
        let kind = &kinds[at].1;
        message_field(out, 1, |c| {
            bytes_field(c, 1, name.0.as_bytes());
            message_field(c, 2, |v| kind.write_value(raw.get(), v)).map_err(|e| format!("column \"{}\": {e}", name.0))
        })?;
    }
    Ok(())
}

fn operation(op: &str) -> u64 {
    match op {
        "INSERT" => 1,
        "UPDATE" => 2,
        "DELETE" => 3,
        "TRUNCATE" => 4,
        "READ" => 5,
        _ => 0,
    }
}

fn write_metadata(m: &Metadata<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    for (field, s) in [(1, &m.source), (2, &m.database), (3, &m.schema), (4, &m.table)] {
        bytes_field(out, field, s.0.as_bytes());
    }
    uint_field(out, 5, operation(&m.operation.0));
    let ts = parse_timestamp(&m.timestamp.0).ok_or("metadata.timestamp is not a timestamp")?;
    int_field(out, 6, ts.div_euclid(1000));
    uint_field(out, 7, m.lsn);
    uint_field(out, 8, m.commit_lsn);
    uint_field(out, 9, m.transaction_id);
    for (field, v) in [
        (10, &m.user),
        (11, &m.session_id),
        (12, &m.client_ip),
        (13, &m.application_name),
        (14, &m.query),
        (15, &m.filter_matched),
        (16, &m.filter_transition),
    ] {
        if let Some(s) = v {
            bytes_field(out, field, s.as_bytes());
        }
    }
    if let Some(t) = &m.transaction {
        message_field(out, 17, |o| {
            for (field, v) in [(1, t.id), (2, t.commit_lsn), (3, t.event_index), (4, t.event_count)] {
                uint_field(o, field, v);
            }
            Ok(())
        })?;
    }
    for c in m.unchanged_toast_columns.iter().flatten() {
        bytes_field(out, 18, c.as_bytes());
    }
    if let Some(t) = &m.truncate {
        message_field(out, 19, |o| {
            uint_field(o, 1, u64::from(t.cascade));
            uint_field(o, 2, u64::from(t.restart_identity));
            Ok(())
        })?;
    }
    Ok(())
}

fn write_compliance(c: &Compliance<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    bytes_field(out, 1, c.audit_id.0.as_bytes());
    if let Some(d) = &c.retention_until {
        int_field(out, 2, i64::from(parse_date(d).ok_or("compliance.retention_until is not a date")?));
    }
    if let Some(v) = c.key_version {
        uint_field(out, 3, v);
    }
    for (field, list) in [(4, &c.pii_tokenized), (5, &c.pii_hashed), (6, &c.pii_redacted), (7, &c.pii_removed)] {
        for s in list.iter().flatten() {
            bytes_field(out, field, s.as_bytes());
        }
    }
    Ok(())
}

/// Appends the `Event` message of a JSON event (the payload the JSON encoder wrote).
pub fn write_event(payload: &[u8], kinds: &[(String, Kind)], out: &mut Vec<u8>) -> Result<(), String> {
    let ev: JsonEvent<'_> = serde_json::from_slice(payload)
        .map_err(|e| format!("the JSON event does not fit the Protobuf contract: {e}"))?;
    message_field(out, 1, |o| write_metadata(&ev.metadata, o))?;
    if let Some(before) = &ev.before {
        message_field(out, 2, |o| write_row(before, kinds, o))?;
    }
    if let Some(after) = &ev.after {
        message_field(out, 3, |o| write_row(after, kinds, o))?;
    }
    if let Some(c) = &ev.compliance {
        message_field(out, 4, |o| write_compliance(c, o))?;
    }
    Ok(())
}

/// Appends the `Row` message of a JSON key.
pub fn write_key(key: &[u8], kinds: &[(String, Kind)], out: &mut Vec<u8>) -> Result<(), String> {
    let fields: Fields<'_> = serde_json::from_slice(key).map_err(|e| format!("the JSON key does not parse: {e}"))?;
    write_row(&fields, kinds, out)
}

/// Confluent's framing of a Protobuf message: magic byte, schema id, the message-index path
/// (`[0]` as a single zero byte, else its length then each index, zig-zag varints).
pub fn frame(id: u32, index: u64, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 8);
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
    if index == 0 {
        out.push(0);
    } else {
        varint(&mut out, 2); // one index, zig-zag
        varint(&mut out, index << 1);
    }
    out.extend_from_slice(message);
    out
}

/// The `metadata.lsn` of an `Event` record, plain or in Confluent's framing (a plain `Event`
/// starts with its metadata's tag, never a zero byte). `None` when it is not one.
pub fn event_lsn(record: &[u8]) -> Option<u64> {
    let mut rest = record;
    if rest.first() == Some(&0) {
        rest = rest.get(5..)?;
        let count = read_varint(&mut rest)? >> 1; // zig-zag; a lone 0 is the path [0]
        for _ in 0..count {
            read_varint(&mut rest)?;
        }
    }
    let metadata = find_field(rest, 1)?;
    let mut m = metadata;
    loop {
        let key = read_varint(&mut m)?;
        let (field, wire) = (key >> 3, (key & 7) as u8);
        if field == 7 && wire == VARINT {
            return read_varint(&mut m);
        }
        skip(&mut m, wire)?;
    }
}

/// The bytes of the first length-delimited field `field` of a message.
fn find_field(mut m: &[u8], field: u64) -> Option<&[u8]> {
    loop {
        let key = read_varint(&mut m)?;
        let wire = (key & 7) as u8;
        if key >> 3 == field && wire == LEN {
            let len = usize::try_from(read_varint(&mut m)?).ok()?;
            return m.get(..len);
        }
        skip(&mut m, wire)?;
    }
}

fn skip(m: &mut &[u8], wire: u8) -> Option<()> {
    match wire {
        VARINT => {
            read_varint(m)?;
        }
        FIXED64 => *m = m.get(8..)?,
        LEN => {
            let len = usize::try_from(read_varint(m)?).ok()?;
            *m = m.get(len..)?;
        }
        5 => *m = m.get(4..)?,
        _ => return None,
    }
    Some(())
}

fn read_varint(m: &mut &[u8]) -> Option<u64> {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let (&b, tail) = m.split_first()?;
        *m = tail;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
}

/// The Protobuf format of one sink.
pub struct ProtobufFormat {
    /// The topic template (`{database}`, `{schema}`, `{table}`) the subjects are named after.
    topic: String,
    database: String,
    /// The sink's `schema_registry`.
    sink_registry: Option<String>,
    /// The server setting `cdc.schema_registry`.
    server_registry: Option<String>,
    registries: HashMap<String, SchemaRegistry>,
    /// The contract's id under each (registry, subject), for this worker's life.
    ids: HashMap<(String, String), u32>,
    /// Each table's value kinds, for the plan they were made for.
    tables: HashMap<u32, (Arc<RelationPlan>, Arc<Kinds>)>,
}

impl ProtobufFormat {
    /// The format of a sink whose events go to `topic` (a template) in `database`.
    pub fn new(topic: &str, database: &str, sink_registry: Option<String>, server_registry: Option<String>) -> Self {
        ProtobufFormat {
            topic: topic.to_string(),
            database: database.to_string(),
            sink_registry,
            server_registry,
            registries: HashMap::new(),
            ids: HashMap::new(),
            tables: HashMap::new(),
        }
    }

    /// The contract's id under `subject` (registered, or looked up without `auto_register`).
    fn id(&mut self, url: &str, subject: &str, plan: &RelationPlan) -> Result<u32, FormatError> {
        let cache_key = (url.to_string(), subject.to_string());
        if let Some(id) = self.ids.get(&cache_key) {
            return Ok(*id);
        }
        let registry = self.registries.entry(url.to_string()).or_insert_with(|| SchemaRegistry::new(url));
        let id = if plan.config.schema_evolution.auto_register {
            registry.register_as(subject, PROTO, "PROTOBUF")?
        } else {
            registry.lookup_as(subject, PROTO, "PROTOBUF")?.ok_or_else(|| {
                FormatError::operator(format!(
                    "schema registry {}: pg_cdc's Protobuf contract is not registered under subject {subject}, and \
                     the table's schema_evolution.auto_register is false: register proto/pg_cdc/v1/event.proto \
                     there, or set auto_register to true",
                    registry.label()
                ))
            })?
        };
        self.ids.insert(cache_key, id);
        Ok(id)
    }
}

impl EventFormat for ProtobufFormat {
    fn encode(&mut self, plan: &Arc<RelationPlan>, types: &TypeRegistry, event: &mut Event) -> Result<(), FormatError> {
        let oid = plan.relation.oid;
        let kinds = match self.tables.get(&oid) {
            Some((p, k)) if Arc::ptr_eq(p, plan) => k.clone(),
            _ => {
                let k = Arc::new(kinds(plan, types));
                self.tables.insert(oid, (plan.clone(), k.clone()));
                k
            }
        };
        let mut value = Vec::with_capacity(event.payload.len());
        write_event(&event.payload, &kinds, &mut value).map_err(FormatError::operator)?;
        let mut key = match &event.key {
            Some(k) => {
                let mut out = Vec::with_capacity(k.len());
                write_key(k, &kinds, &mut out).map_err(FormatError::operator)?;
                Some(out)
            }
            None => None,
        };
        let registry = configured_registry(self.sink_registry.as_deref(), plan, self.server_registry.as_deref());
        if let Some(url) = registry {
            let url = checked_registry(&url)?;
            let topic = expand_topic(&self.topic, &self.database, &plan.relation.namespace, &plan.relation.name);
            let topic = match plan.topic_version {
                Some(v) => cdc_core::schema::version_topic(&topic, v),
                None => topic,
            };
            let value_id = self.id(&url, &format!("{topic}-value"), plan)?;
            value = frame(value_id, 0, &value);
            if let Some(k) = key.take() {
                let key_id = self.id(&url, &format!("{topic}-key"), plan)?;
                key = Some(frame(key_id, ROW_INDEX, &k));
            }
        }
        event.payload = value;
        event.key = key;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use cdc_core::envelope::{Event, RelationPlan};
    use cdc_core::format::{EventFormat, FormatError};
    use cdc_core::pipeline::{Assembler, SinkTables};
    use cdc_core::testutil::{config, frames, relation_oids, types};
    use cdc_core::types::TypeRegistry;

    use super::ProtobufFormat;

    /// Keeps each encoded event.
    #[derive(Clone)]
    struct Keep(Arc<Mutex<Vec<Event>>>, Arc<Mutex<ProtobufFormat>>);

    impl EventFormat for Keep {
        fn encode(&mut self, plan: &Arc<RelationPlan>, t: &TypeRegistry, ev: &mut Event) -> Result<(), FormatError> {
            self.1.lock().unwrap().encode(plan, t, ev)?;
            self.0.lock().unwrap().push(ev.clone());
            Ok(())
        }
    }

    /// Every event of the golden captures encodes (the oracle that reads them back is protoc's
    /// Python code in tests/e2e/test_protobuf.py); a key is a Row, a TRUNCATE has none.
    #[test]
    fn every_golden_event_encodes() {
        let mut lines = Vec::new();
        for (name, table, key) in
            [("types", "all_types", "id"), ("basic", "orders", "order_id"), ("toast", "docs_default", "id")]
        {
            let fr = frames(name);
            let oids = relation_oids(&fr);
            let mut cfg = config(&[key]);
            cfg.exclude_columns = if name == "types" { vec!["c_int_matrix".into()] } else { vec![] };
            let sink: SinkTables = [(oids[table], Arc::new(cfg))].into_iter().collect();
            let keep = Keep(Arc::default(), Arc::new(Mutex::new(ProtobufFormat::new("t", "golden", None, None))));
            let mut a = Assembler::new("golden");
            a.set_format(Some(Box::new(keep.clone())));
            a.process(&fr, &sink, &types(name)).expect("pipeline");
            for (e, json) in keep.0.lock().unwrap().iter().zip(jsons(name, table, key)) {
                // The LSN reads back, plain and framed (cdc_schema_history reads it so).
                assert_eq!(super::event_lsn(&e.payload), Some(json), "{name}");
                assert_eq!(super::event_lsn(&super::frame(9, 0, &e.payload)), Some(json), "{name}");
                let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                lines.push(format!("{name}\t{}\t{}", e.key.as_deref().map(hex).unwrap_or_default(), hex(&e.payload)));
            }
        }
        assert_eq!(lines.len(), 15);
        assert!(lines.iter().all(|l| l.split('\t').nth(2).is_some_and(|v| !v.is_empty())));
    }

    /// The `metadata.lsn` of each JSON event of a golden capture.
    fn jsons(name: &str, table: &str, key: &str) -> Vec<u64> {
        let mut cfg = config(&[key]);
        cfg.exclude_columns = if name == "types" { vec!["c_int_matrix".into()] } else { vec![] };
        let txns = cdc_core::testutil::run(name, vec![(table, cfg)]);
        cdc_core::testutil::events(&txns).iter().map(|(_, p)| p["metadata"]["lsn"].as_u64().unwrap()).collect()
    }

    /// The wire bytes of single values, worked out by hand from the Protocol Buffers encoding
    /// rules (tag = field << 3 | wire type; sint64 zig-zag; int32 negatives in ten bytes).
    #[test]
    fn values_are_written_as_the_encoding_rules_say() {
        use super::Kind;
        let w = |k: Kind, raw: &str| {
            let mut out = Vec::new();
            k.write_value(raw, &mut out).unwrap();
            out
        };
        assert_eq!(w(Kind::Int, "null"), [0x08, 0x00]);
        assert_eq!(w(Kind::Int, "-1"), [0x18, 0x01]);
        assert_eq!(w(Kind::Int, "150"), [0x18, 0xac, 0x02]);
        assert_eq!(w(Kind::Bool, "true"), [0x10, 0x01]);
        assert_eq!(w(Kind::Double, "1.5"), [0x21, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f]);
        assert_eq!(w(Kind::Decimal, "150.00"), [0x2a, 6, b'1', b'5', b'0', b'.', b'0', b'0']);
        assert_eq!(w(Kind::Date, "\"1969-12-31\""), [0x48, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert_eq!(w(Kind::Bytes, "\"3q2+7w==\""), [0x3a, 4, 0xde, 0xad, 0xbe, 0xef]);
        // An array: field 14, a ListValue of Values (field 1 each).
        assert_eq!(
            w(Kind::Array(Box::new(Kind::Int)), "[1,null]"),
            [0x72, 8, 0x0a, 2, 0x18, 0x02, 0x0a, 2, 0x08, 0x00]
        );
        let two_d = Kind::Array(Box::new(Kind::Int)).write_value("[[1]]", &mut Vec::new());
        assert!(two_d.unwrap_err().contains("multidimensional"));
        // Confluent framing: magic, id, message indexes ([0] is one zero byte; [5] is count 1, 5).
        assert_eq!(super::frame(7, 0, &[0xaa]), [0, 0, 0, 0, 7, 0, 0xaa]);
        assert_eq!(super::frame(7, 5, &[0xaa]), [0, 0, 0, 0, 7, 2, 10, 0xaa]);
    }
}
