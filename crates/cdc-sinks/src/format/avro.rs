//! The Avro format: each event as an Avro record in Confluent's wire format, its schema derived
//! from the table version the event was made under and registered with a schema registry.
//!
//! ```text
//!  JSON event ──(plan of its relation version)──▶ Avro schema ──register──▶ schema id (cached)
//!       │                                                                     │
//!       └──────────────── values, by the column types ──▶ 0x00 | id (4 bytes, big-endian) | Avro binary
//! ```
//! The event says what the JSON event says, field by field (`diff` aside: `before` and `after`
//! hold both images). The schema of a table version is built from its relation (pgoutput's
//! description at that LSN), so every event is written with the schema in force at its LSN.
//! The type mapping is [`Ty`]; the README's "Avro" section has it as a table.
use std::collections::HashMap;

use apache_avro::types::Value as Avro;
use apache_avro::{Decimal, Schema};
use cdc_core::envelope::RelationPlan;
use cdc_core::types::{TypeKind, TypeRegistry};
use num_bigint::BigInt;
use serde_json::value::RawValue;
use serde_json::{json, Value as Json};

/// The Avro type a column's values are written as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ty {
    /// `bool`.
    Boolean,
    /// `int2`, `int4`.
    Int,
    /// `int8`, `oid`, `xid`, other integers.
    Long,
    /// `float4`.
    Float,
    /// `float8`.
    Double,
    /// `numeric(p, s)`: the logical type decimal over bytes, exact. `NaN` is written as null.
    Decimal {
        /// Digits in all.
        precision: u32,
        /// Digits after the point.
        scale: u32,
    },
    /// Text, and every type without an Avro counterpart (its text output, as in the JSON event).
    String,
    /// `uuid`: the logical type uuid over string.
    Uuid,
    /// `json`, `jsonb`: the JSON text.
    Json,
    /// `bytea`.
    Bytes,
    /// `date`: the logical type date (days from 1970-01-01); ±infinity are the int's extremes.
    Date,
    /// `time`: the logical type time-micros.
    Time,
    /// `timestamptz`: timestamp-micros (UTC); ±infinity are the long's extremes.
    Timestamp,
    /// `timestamp`: local-timestamp-micros; ±infinity are the long's extremes.
    LocalTimestamp,
    /// A one-dimensional array of the element type (elements may be null).
    Array(Box<Ty>),
}

/// The type of values of type `oid` with modifier `typmod` (`-1`: none).
pub fn column_ty(types: &TypeRegistry, oid: u32, typmod: i32) -> Ty {
    match oid {
        16 => Ty::Boolean,
        21 | 23 => Ty::Int,
        20 | 26 | 28 | 29 | 5069 => Ty::Long,
        700 => Ty::Float,
        701 => Ty::Double,
        1700 => numeric_ty(typmod),
        1082 => Ty::Date,
        1083 => Ty::Time,
        1114 => Ty::LocalTimestamp,
        1184 => Ty::Timestamp,
        2950 => Ty::Uuid,
        17 => Ty::Bytes,
        114 | 3802 => Ty::Json,
        _ => match types.kind(oid) {
            TypeKind::Bool => Ty::Boolean,
            TypeKind::Integer => Ty::Long,
            TypeKind::Float => Ty::Double,
            // A domain over numeric: its scale is not known here; the exact text.
            TypeKind::Numeric | TypeKind::Text => Ty::String,
            TypeKind::Json => Ty::Json,
            TypeKind::Bytea => Ty::Bytes,
            TypeKind::TimestampTz => Ty::Timestamp,
            TypeKind::Timestamp => Ty::LocalTimestamp,
            TypeKind::Date => Ty::Date,
            TypeKind::Array { element, .. } => Ty::Array(Box::new(column_ty(types, element, typmod))),
        },
    }
}

/// The type of a computed column's values (its expression's result kind).
pub fn computed_ty(kind: TypeKind) -> Ty {
    match kind {
        TypeKind::Bool => Ty::Boolean,
        TypeKind::Integer => Ty::Long,
        TypeKind::Float => Ty::Double,
        _ => Ty::String,
    }
}

/// `numeric(p, s)` is an exact decimal; unconstrained numeric (any scale) and a negative scale
/// or one above the precision (PostgreSQL 15 allows both) are the exact text.
fn numeric_ty(typmod: i32) -> Ty {
    if typmod < 4 {
        return Ty::String;
    }
    let t = typmod - 4;
    let precision = ((t >> 16) & 0xffff) as u32;
    let scale = ((t & 0x7ff) ^ 1024) - 1024; // 11-bit two's complement
    if scale < 0 || scale as u32 > precision || precision == 0 {
        return Ty::String;
    }
    Ty::Decimal { precision, scale: scale as u32 }
}

impl Ty {
    /// Its Avro schema.
    pub fn schema(&self) -> Json {
        match self {
            Ty::Boolean => json!("boolean"),
            Ty::Int => json!("int"),
            Ty::Long => json!("long"),
            Ty::Float => json!("float"),
            Ty::Double => json!("double"),
            Ty::Decimal { precision, scale } => {
                json!({"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale})
            }
            Ty::String | Ty::Json => json!("string"),
            Ty::Uuid => json!({"type": "string", "logicalType": "uuid"}),
            Ty::Bytes => json!("bytes"),
            Ty::Date => json!({"type": "int", "logicalType": "date"}),
            Ty::Time => json!({"type": "long", "logicalType": "time-micros"}),
            Ty::Timestamp => json!({"type": "long", "logicalType": "timestamp-micros"}),
            Ty::LocalTimestamp => json!({"type": "long", "logicalType": "local-timestamp-micros"}),
            Ty::Array(e) => json!({"type": "array", "items": ["null", e.schema()]}),
        }
    }

    /// The Avro value of one non-null JSON value of the event (`raw`, as the JSON encoder wrote it).
    pub fn value(&self, raw: &str) -> Result<Avro, String> {
        let bad = || format!("{raw} is not a {self:?} value");
        let string = || serde_json::from_str::<String>(raw).ok();
        Ok(match self {
            Ty::Boolean => Avro::Boolean(raw.parse().map_err(|_| bad())?),
            Ty::Int => Avro::Int(raw.parse().map_err(|_| bad())?),
            Ty::Long => Avro::Long(raw.parse().map_err(|_| bad())?),
            Ty::Float => Avro::Float(float(raw).ok_or_else(bad)? as f32),
            Ty::Double => Avro::Double(float(raw).ok_or_else(bad)?),
            Ty::Decimal { scale, .. } => match unscaled(raw, *scale) {
                Some(n) => Avro::Decimal(Decimal::from(n.to_signed_bytes_be())),
                None if string().as_deref() == Some("NaN") => Avro::Null,
                None => return Err(bad()),
            },
            // A JSON string's content; any other JSON (a computed number, say) as its text.
            Ty::String | Ty::Uuid => Avro::String(string().unwrap_or_else(|| raw.to_string())),
            Ty::Json => Avro::String(raw.to_string()),
            Ty::Bytes => {
                use base64::Engine;
                let s = string().ok_or_else(bad)?;
                let bytes = base64::engine::general_purpose::STANDARD.decode(&s).unwrap_or_else(|_| s.into_bytes());
                Avro::Bytes(bytes)
            }
            Ty::Date => Avro::Date(parse_date(&string().ok_or_else(bad)?).ok_or_else(bad)?),
            Ty::Time => Avro::TimeMicros(parse_time(&string().ok_or_else(bad)?).ok_or_else(bad)?),
            Ty::Timestamp => Avro::TimestampMicros(parse_timestamp(&string().ok_or_else(bad)?).ok_or_else(bad)?),
            Ty::LocalTimestamp => {
                Avro::LocalTimestampMicros(parse_timestamp(&string().ok_or_else(bad)?).ok_or_else(bad)?)
            }
            Ty::Array(e) => {
                let items: Vec<&RawValue> = serde_json::from_str(raw).map_err(|_| bad())?;
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    let text = item.get();
                    if text.starts_with('[') && !matches!(**e, Ty::Array(_)) {
                        return Err(format!(
                            "{raw}: a multidimensional array cannot be written as an Avro array of one dimension"
                        ));
                    }
                    out.push(nullable(e, Some(text))?);
                }
                Avro::Array(out)
            }
        })
    }
}

/// A value of a `["null", T]` union.
pub fn nullable(ty: &Ty, raw: Option<&str>) -> Result<Avro, String> {
    match raw {
        None | Some("null") => Ok(Avro::Union(0, Box::new(Avro::Null))),
        Some(r) => match ty.value(r)? {
            Avro::Null => Ok(Avro::Union(0, Box::new(Avro::Null))),
            v => Ok(Avro::Union(1, Box::new(v))),
        },
    }
}

fn float(raw: &str) -> Option<f64> {
    match raw {
        "\"NaN\"" => Some(f64::NAN),
        "\"Infinity\"" => Some(f64::INFINITY),
        "\"-Infinity\"" => Some(f64::NEG_INFINITY),
        _ => raw.parse().ok(),
    }
}

/// The unscaled integer of a decimal text at `scale` (`12.5` at scale 2 is 1250); `None` when it
/// is not a plain decimal or has more fractional digits than the scale.
fn unscaled(raw: &str, scale: u32) -> Option<BigInt> {
    let (neg, digits) = match raw.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, raw),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac = frac.trim_end_matches('0');
    if frac.len() > scale as usize {
        return None;
    }
    let mut text = String::with_capacity(int.len() + scale as usize + 1);
    if neg {
        text.push('-');
    }
    text.push_str(int);
    text.push_str(frac);
    text.extend(std::iter::repeat_n('0', scale as usize - frac.len()));
    text.parse().ok()
}

/// Days from 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD` (a signed year of four or more digits, as the JSON event writes it) as days.
fn date_days(s: &str) -> Option<i64> {
    let (sign, body) = match s.as_bytes().first()? {
        b'-' => (-1, &s[1..]),
        b'+' => (1, &s[1..]),
        _ => (1, s),
    };
    let mut parts = body.splitn(3, '-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    if y.len() < 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    let (y, m, d): (i64, i64, i64) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    Some(days_from_civil(sign * y, m, d))
}

/// A date as Avro's date: days from 1970-01-01; `infinity` and `-infinity` are the int's extremes.
pub fn parse_date(s: &str) -> Option<i32> {
    match s {
        "infinity" => Some(i32::MAX),
        "-infinity" => Some(i32::MIN),
        _ => i32::try_from(date_days(s)?).ok(),
    }
}

/// `HH:MM:SS[.ffffff]` as microseconds after midnight (`24:00:00` is the end of the day).
pub fn parse_time(s: &str) -> Option<i64> {
    let (hms, frac) = s.split_once('.').unwrap_or((s, ""));
    let mut p = hms.splitn(3, ':');
    let (h, m, sec): (i64, i64, i64) = (p.next()?.parse().ok()?, p.next()?.parse().ok()?, p.next()?.parse().ok()?);
    if frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) || h > 24 || m > 59 || sec > 60 {
        return None;
    }
    let micros: i64 = if frac.is_empty() { 0 } else { format!("{frac:0<6}").parse().ok()? };
    Some(((h * 60 + m) * 60 + sec) * 1_000_000 + micros)
}

/// `YYYY-MM-DDTHH:MM:SS[.ffffff][Z|±HH[:MM[:SS]]]` as microseconds from 1970-01-01T00:00:00 (UTC
/// when it has a zone); `infinity` and `-infinity` are the long's extremes.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    match s {
        "infinity" => return Some(i64::MAX),
        "-infinity" => return Some(i64::MIN),
        _ => {}
    }
    let t = s.find('T')?;
    let days = date_days(&s[..t])?;
    let rest = &s[t + 1..];
    let zone_at = rest.find(['Z', '+', '-']).unwrap_or(rest.len());
    let time = parse_time(&rest[..zone_at])?;
    let zone = &rest[zone_at..];
    let offset_secs: i64 = match zone.as_bytes().first() {
        None | Some(b'Z') => 0,
        Some(&sign) => {
            let mut p = zone[1..].split(':');
            let h: i64 = p.next()?.parse().ok()?;
            let m: i64 = p.next().map_or(Some(0), |x| x.parse().ok())?;
            let sec: i64 = p.next().map_or(Some(0), |x| x.parse().ok())?;
            let v = h * 3600 + m * 60 + sec;
            if sign == b'-' {
                -v
            } else {
                v
            }
        }
    };
    days.checked_mul(86_400_000_000)?.checked_add(time)?.checked_sub(offset_secs * 1_000_000)
}

/// A name Avro accepts (`[A-Za-z_][A-Za-z0-9_]*`): other characters become `_`, and a leading
/// digit gets a `_` before it.
pub fn avro_name(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// One field of the row record: the column's name in the JSON event, its Avro name and type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// The name in the JSON event.
    pub json: String,
    /// The Avro field name.
    pub avro: String,
    /// Its values' type.
    pub ty: Ty,
}

/// The schemas of one table version.
#[derive(Debug, Clone)]
pub struct TableSchemas {
    /// The namespace of its records: `<database>.<schema>.<table>`, made Avro names.
    pub namespace: String,
    /// The row record's fields, in the images' order.
    pub columns: Vec<Column>,
    /// The value schema (the envelope), as JSON.
    pub value: Json,
    /// Every column the key may name (all of the relation's and the enriched ones), by JSON name.
    pub key_types: HashMap<String, Ty>,
}

/// Builds the schemas of the events of a relation version, as `plan` writes them.
pub fn table_schemas(plan: &RelationPlan, types: &TypeRegistry, database: &str) -> Result<TableSchemas, String> {
    let rel = &plan.relation;
    let namespace = [database, &rel.namespace, &rel.name].map(avro_name).join(".");
    let ty_of = |i: usize| -> Ty {
        // A hidden column's values are the method's text (a token, a hash, a mask).
        if plan.redact[i].is_some() {
            Ty::String
        } else {
            column_ty(types, rel.columns[i].type_oid, rel.columns[i].type_mod)
        }
    };
    let mut columns: Vec<Column> = Vec::new();
    let mut push = |json: &str, ty: Ty| {
        columns.push(Column { json: json.to_string(), avro: avro_name(json), ty });
    };
    for &i in &plan.included {
        push(&rel.columns[i].name, ty_of(i));
    }
    let mut key_types: HashMap<String, Ty> =
        (0..rel.columns.len()).map(|i| (rel.columns[i].name.clone(), ty_of(i))).collect();
    for (e, cfg) in plan.enrich.iter().zip(&plan.config.enrich) {
        for (name, &oid) in cfg.add_columns.iter().zip(e.added_types()) {
            let ty = column_ty(types, oid, -1);
            key_types.insert(name.clone(), ty.clone());
            push(name, ty);
        }
    }
    for (name, bound) in &plan.computed {
        push(name, computed_ty(bound.result_kind()));
    }
    let mut seen = std::collections::HashSet::new();
    for c in &columns {
        if !seen.insert(c.avro.as_str()) {
            return Err(format!(
                "two columns of its events have the Avro field name \"{}\" (Avro names use letters, digits and _ only)",
                c.avro
            ));
        }
    }
    let fields: Vec<Json> =
        columns.iter().map(|c| json!({"name": c.avro, "type": ["null", c.ty.schema()], "default": null})).collect();
    let opt_string = |name: &str| json!({"name": name, "type": ["null", "string"], "default": null});
    let strings = json!({"type": "array", "items": "string"});
    let metadata = json!({
        "type": "record", "name": "Metadata",
        "fields": [
            {"name": "source", "type": "string"},
            {"name": "database", "type": "string"},
            {"name": "schema", "type": "string"},
            {"name": "table", "type": "string"},
            {"name": "operation", "type": "string"},
            {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "lsn", "type": "long"},
            {"name": "commit_lsn", "type": "long"},
            {"name": "transaction_id", "type": "long"},
            opt_string("user"), opt_string("session_id"), opt_string("client_ip"),
            opt_string("application_name"), opt_string("query"),
            opt_string("filter_matched"), opt_string("filter_transition"),
            {"name": "transaction", "default": null, "type": ["null", {
                "type": "record", "name": "Transaction",
                "fields": [
                    {"name": "id", "type": "long"},
                    {"name": "commit_lsn", "type": "long"},
                    {"name": "event_index", "type": "long"},
                    {"name": "event_count", "type": "long"},
                ]}]},
            {"name": "unchanged_toast_columns", "type": ["null", strings], "default": null},
            {"name": "truncate", "default": null, "type": ["null", {
                "type": "record", "name": "Truncate",
                "fields": [
                    {"name": "cascade", "type": "boolean"},
                    {"name": "restart_identity", "type": "boolean"},
                ]}]},
        ]
    });
    let compliance = json!({
        "type": "record", "name": "Compliance",
        "fields": [
            {"name": "audit_id", "type": "string"},
            {"name": "retention_until", "type": ["null", {"type": "int", "logicalType": "date"}], "default": null},
            {"name": "key_version", "type": ["null", "long"], "default": null},
            {"name": "pii_tokenized", "type": ["null", strings], "default": null},
            {"name": "pii_hashed", "type": ["null", strings], "default": null},
            {"name": "pii_redacted", "type": ["null", strings], "default": null},
            {"name": "pii_removed", "type": ["null", strings], "default": null},
        ]
    });
    let value = json!({
        "type": "record", "name": "Envelope", "namespace": namespace,
        "fields": [
            {"name": "metadata", "type": metadata},
            {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": fields}], "default": null},
            {"name": "after", "type": ["null", "Value"], "default": null},
            {"name": "compliance", "type": ["null", compliance], "default": null},
        ]
    });
    Ok(TableSchemas { namespace, columns, value, key_types })
}

impl TableSchemas {
    /// The key schema for a key with these columns (JSON names, in order).
    pub fn key_schema(&self, names: &[&str]) -> Result<(Json, Vec<Ty>), String> {
        let mut fields = Vec::with_capacity(names.len());
        let mut tys = Vec::with_capacity(names.len());
        for name in names {
            let ty = self
                .key_types
                .get(*name)
                .cloned()
                .ok_or_else(|| format!("its key names an unknown column \"{name}\""))?;
            fields.push(json!({"name": avro_name(name), "type": ["null", ty.schema()], "default": null}));
            tys.push(ty);
        }
        Ok((json!({"type": "record", "name": "Key", "namespace": self.namespace, "fields": fields}), tys))
    }

    /// The Avro value of a JSON event (the payload the JSON encoder wrote).
    pub fn value_of(&self, payload: &[u8]) -> Result<Avro, String> {
        #[derive(serde::Deserialize)]
        struct Event<'a> {
            metadata: Json,
            #[serde(borrow)]
            before: Option<HashMap<String, &'a RawValue>>,
            #[serde(borrow)]
            after: Option<HashMap<String, &'a RawValue>>,
            compliance: Option<Json>,
        }
        let ev: Event<'_> =
            serde_json::from_slice(payload).map_err(|e| format!("the JSON event does not parse: {e}"))?;
        let image = |img: &Option<HashMap<String, &RawValue>>| -> Result<Avro, String> {
            let Some(img) = img else { return Ok(Avro::Union(0, Box::new(Avro::Null))) };
            let mut fields = Vec::with_capacity(self.columns.len());
            for c in &self.columns {
                let v = nullable(&c.ty, img.get(&c.json).map(|r| r.get()))
                    .map_err(|e| format!("column \"{}\": {e}", c.json))?;
                fields.push((c.avro.clone(), v));
            }
            if let Some(extra) = img.keys().find(|k| !self.columns.iter().any(|c| &c.json == *k)) {
                return Err(format!("column \"{extra}\" is not in the table version's schema"));
            }
            Ok(Avro::Union(1, Box::new(Avro::Record(fields))))
        };
        let before = image(&ev.before)?;
        let after = image(&ev.after)?;
        let compliance = match &ev.compliance {
            None | Some(Json::Null) => Avro::Union(0, Box::new(Avro::Null)),
            Some(c) => Avro::Union(1, Box::new(compliance_of(c)?)),
        };
        Ok(Avro::Record(vec![
            ("metadata".into(), metadata_of(&ev.metadata)?),
            ("before".into(), before),
            ("after".into(), after),
            ("compliance".into(), compliance),
        ]))
    }

    /// The Avro value of a JSON key, with the key schema's types.
    pub fn key_of(key: &[u8], tys: &[Ty]) -> Result<Avro, String> {
        let fields: Vec<(String, &RawValue)> = ordered_fields(key)?;
        let mut out = Vec::with_capacity(fields.len());
        for ((name, raw), ty) in fields.into_iter().zip(tys) {
            out.push((
                avro_name(&name),
                nullable(ty, Some(raw.get())).map_err(|e| format!("key column \"{name}\": {e}"))?,
            ));
        }
        Ok(Avro::Record(out))
    }
}

/// A JSON object's fields in their order.
pub fn ordered_fields(object: &[u8]) -> Result<Vec<(String, &RawValue)>, String> {
    struct Fields<'a>(Vec<(String, &'a RawValue)>);
    impl<'de> serde::Deserialize<'de> for Fields<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Fields<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                    let mut out = Vec::new();
                    while let Some((k, v)) = m.next_entry::<String, &'de RawValue>()? {
                        out.push((k, v));
                    }
                    Ok(Fields(out))
                }
            }
            d.deserialize_map(V)
        }
    }
    serde_json::from_slice::<Fields<'_>>(object).map(|f| f.0).map_err(|e| format!("the JSON key does not parse: {e}"))
}

fn opt_str(v: Option<&Json>) -> Avro {
    match v.and_then(Json::as_str) {
        Some(s) => Avro::Union(1, Box::new(Avro::String(s.to_string()))),
        None => Avro::Union(0, Box::new(Avro::Null)),
    }
}

fn opt_strings(v: Option<&Json>) -> Avro {
    match v.and_then(Json::as_array) {
        Some(a) => Avro::Union(
            1,
            Box::new(Avro::Array(a.iter().map(|s| Avro::String(s.as_str().unwrap_or_default().to_string())).collect())),
        ),
        None => Avro::Union(0, Box::new(Avro::Null)),
    }
}

fn long(v: &Json, name: &str) -> Result<i64, String> {
    v.get(name)
        .and_then(Json::as_u64)
        .and_then(|n| i64::try_from(n).ok())
        .ok_or_else(|| format!("metadata.{name} is missing"))
}

fn string(v: &Json, name: &str) -> Result<Avro, String> {
    v.get(name)
        .and_then(Json::as_str)
        .map(|s| Avro::String(s.to_string()))
        .ok_or_else(|| format!("metadata.{name} is missing"))
}

fn metadata_of(m: &Json) -> Result<Avro, String> {
    let ts =
        m.get("timestamp").and_then(Json::as_str).and_then(parse_timestamp).ok_or("metadata.timestamp is missing")?;
    let transaction = match m.get("transaction") {
        Some(t) if t.is_object() => Avro::Union(
            1,
            Box::new(Avro::Record(vec![
                ("id".into(), Avro::Long(long(t, "id")?)),
                ("commit_lsn".into(), Avro::Long(long(t, "commit_lsn")?)),
                ("event_index".into(), Avro::Long(long(t, "event_index")?)),
                ("event_count".into(), Avro::Long(long(t, "event_count")?)),
            ])),
        ),
        _ => Avro::Union(0, Box::new(Avro::Null)),
    };
    let truncate = match m.get("truncate") {
        Some(t) if t.is_object() => Avro::Union(
            1,
            Box::new(Avro::Record(vec![
                ("cascade".into(), Avro::Boolean(t.get("cascade").and_then(Json::as_bool).unwrap_or(false))),
                (
                    "restart_identity".into(),
                    Avro::Boolean(t.get("restart_identity").and_then(Json::as_bool).unwrap_or(false)),
                ),
            ])),
        ),
        _ => Avro::Union(0, Box::new(Avro::Null)),
    };
    Ok(Avro::Record(vec![
        ("source".into(), string(m, "source")?),
        ("database".into(), string(m, "database")?),
        ("schema".into(), string(m, "schema")?),
        ("table".into(), string(m, "table")?),
        ("operation".into(), string(m, "operation")?),
        ("timestamp".into(), Avro::TimestampMillis(ts.div_euclid(1000))),
        ("lsn".into(), Avro::Long(long(m, "lsn")?)),
        ("commit_lsn".into(), Avro::Long(long(m, "commit_lsn")?)),
        ("transaction_id".into(), Avro::Long(long(m, "transaction_id")?)),
        ("user".into(), opt_str(m.get("user"))),
        ("session_id".into(), opt_str(m.get("session_id"))),
        ("client_ip".into(), opt_str(m.get("client_ip"))),
        ("application_name".into(), opt_str(m.get("application_name"))),
        ("query".into(), opt_str(m.get("query"))),
        ("filter_matched".into(), opt_str(m.get("filter_matched"))),
        ("filter_transition".into(), opt_str(m.get("filter_transition"))),
        ("transaction".into(), transaction),
        ("unchanged_toast_columns".into(), opt_strings(m.get("unchanged_toast_columns"))),
        ("truncate".into(), truncate),
    ]))
}

fn compliance_of(c: &Json) -> Result<Avro, String> {
    let retention = match c.get("retention_until").and_then(Json::as_str) {
        Some(d) => {
            Avro::Union(1, Box::new(Avro::Date(parse_date(d).ok_or("compliance.retention_until is not a date")?)))
        }
        None => Avro::Union(0, Box::new(Avro::Null)),
    };
    let key_version = match c.get("key_version").and_then(Json::as_i64) {
        Some(v) => Avro::Union(1, Box::new(Avro::Long(v))),
        None => Avro::Union(0, Box::new(Avro::Null)),
    };
    Ok(Avro::Record(vec![
        ("audit_id".into(), Avro::String(c.get("audit_id").and_then(Json::as_str).unwrap_or_default().to_string())),
        ("retention_until".into(), retention),
        ("key_version".into(), key_version),
        ("pii_tokenized".into(), opt_strings(c.get("pii_tokenized"))),
        ("pii_hashed".into(), opt_strings(c.get("pii_hashed"))),
        ("pii_redacted".into(), opt_strings(c.get("pii_redacted"))),
        ("pii_removed".into(), opt_strings(c.get("pii_removed"))),
    ]))
}

/// Parses a schema built here (a failure is a bug of this module, reported, never panicking).
pub fn parse_schema(schema: &Json) -> Result<Schema, String> {
    Schema::parse(schema).map_err(|e| format!("its Avro schema does not parse: {e}"))
}

/// Writes `value` with `schema` in Confluent's wire format: magic byte 0, the schema id (4 bytes,
/// big-endian), the Avro binary encoding.
pub fn frame(schema: &Schema, id: u32, value: &Avro) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(256);
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
    let writer = apache_avro::writer::datum::GenericDatumWriter::builder(schema).build().map_err(|e| e.to_string())?;
    writer.write_value_ref(&mut out, value).map_err(|e| format!("the event does not fit its Avro schema: {e}"))?;
    Ok(out)
}
