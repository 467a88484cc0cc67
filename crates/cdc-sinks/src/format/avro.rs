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
//! The type mapping is [`Ty`]; the README's "Avro" section has it as a table. apache-avro parses
//! each schema built here (and the tests read every event back with its reader); the values are
//! written straight from the JSON event's text in the schema's order, without building a value
//! tree: about 2 µs for an event of the golden `basic` capture, where building apache-avro values
//! and writing them with its generic writer took about 10 µs (same machine, release build).
use std::collections::HashMap;

use apache_avro::Schema;
use cdc_core::envelope::RelationPlan;
use cdc_core::types::{TypeKind, TypeRegistry};
use num_bigint::BigInt;
use serde_json::value::RawValue;

use super::event::{Compliance, Fields, JsonEvent, Metadata, Name};
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
    match numeric_typmod(typmod) {
        Some((precision, scale)) => Ty::Decimal { precision, scale },
        None => Ty::String,
    }
}

/// `numeric(p, s)`'s precision and scale from its type modifier; `None` unconstrained, or a scale
/// a fixed-scale decimal cannot carry (negative, or above the precision).
pub(crate) fn numeric_typmod(typmod: i32) -> Option<(u32, u32)> {
    if typmod < 4 {
        return None;
    }
    let t = typmod - 4;
    let precision = ((t >> 16) & 0xffff) as u32;
    let scale = ((t & 0x7ff) ^ 1024) - 1024; // 11-bit two's complement
    (scale >= 0 && scale as u32 <= precision && precision > 0).then_some((precision, scale as u32))
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

    /// Appends the Avro binary of one non-null JSON value of the event (`raw`, as the JSON encoder
    /// wrote it).
    pub fn write(&self, raw: &str, out: &mut Vec<u8>) -> Result<(), String> {
        let bad = || format!("{raw} is not a {self:?} value");
        match self {
            Ty::Boolean => out.push(match raw {
                "true" => 1,
                "false" => 0,
                _ => return Err(bad()),
            }),
            Ty::Int => write_long(out, i64::from(raw.parse::<i32>().map_err(|_| bad())?)),
            Ty::Long => write_long(out, raw.parse().map_err(|_| bad())?),
            Ty::Float => out.extend_from_slice(&(float(raw).ok_or_else(bad)? as f32).to_le_bytes()),
            Ty::Double => out.extend_from_slice(&float(raw).ok_or_else(bad)?.to_le_bytes()),
            Ty::Decimal { scale, .. } => write_bytes(out, &unscaled(raw, *scale).ok_or_else(bad)?.to_signed_bytes_be()),
            // A JSON string's content; any other JSON (a computed number, say) as its text.
            Ty::String | Ty::Uuid => match json_string(raw) {
                Some(s) => write_bytes(out, s.as_bytes()),
                None => write_bytes(out, raw.as_bytes()),
            },
            Ty::Json => write_bytes(out, raw.as_bytes()),
            Ty::Bytes => {
                use base64::Engine;
                let s = json_string(raw).ok_or_else(bad)?;
                match base64::engine::general_purpose::STANDARD.decode(s.as_bytes()) {
                    Ok(b) => write_bytes(out, &b),
                    Err(_) => write_bytes(out, s.as_bytes()),
                }
            }
            Ty::Date => write_long(out, i64::from(parse_date(&json_string(raw).ok_or_else(bad)?).ok_or_else(bad)?)),
            Ty::Time => write_long(out, parse_time(&json_string(raw).ok_or_else(bad)?).ok_or_else(bad)?),
            Ty::Timestamp | Ty::LocalTimestamp => {
                write_long(out, parse_timestamp(&json_string(raw).ok_or_else(bad)?).ok_or_else(bad)?)
            }
            Ty::Array(e) => {
                let items: Vec<&RawValue> = serde_json::from_str(raw).map_err(|_| bad())?;
                if !items.is_empty() {
                    write_long(out, items.len() as i64);
                    for item in items {
                        let text = item.get();
                        if text.starts_with('[') && !matches!(**e, Ty::Array(_)) {
                            return Err(format!(
                                "{raw}: a multidimensional array cannot be written as an Avro array of one dimension"
                            ));
                        }
                        write_nullable(e, Some(text), out)?;
                    }
                }
                write_long(out, 0);
            }
        }
        Ok(())
    }
}

/// Appends a value of a `["null", T]` union (a numeric `NaN` is null: a decimal cannot hold it).
pub fn write_nullable(ty: &Ty, raw: Option<&str>, out: &mut Vec<u8>) -> Result<(), String> {
    match raw {
        None | Some("null") => out.push(0),
        Some("\"NaN\"") if matches!(ty, Ty::Decimal { .. }) => out.push(0),
        Some(r) => {
            out.push(2); // branch 1, zig-zag
            ty.write(r, out)?;
        }
    }
    Ok(())
}

/// Avro's `long` (and `int`): zig-zag, then a variable-length integer.
pub fn write_long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Avro's `bytes` and `string`: the length, then the bytes.
pub fn write_bytes(out: &mut Vec<u8>, b: &[u8]) {
    write_long(out, b.len() as i64);
    out.extend_from_slice(b);
}

/// The content of a JSON string (`None`: not a string), borrowed when it has no escape.
pub(crate) fn json_string(raw: &str) -> Option<std::borrow::Cow<'_, str>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    if inner.contains('\\') {
        serde_json::from_str::<String>(raw).ok().map(std::borrow::Cow::Owned)
    } else {
        Some(std::borrow::Cow::Borrowed(inner))
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
pub(crate) fn unscaled(raw: &str, scale: u32) -> Option<BigInt> {
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
/// when it has a zone); `infinity` and `-infinity` are the long's extremes, and so is a time past
/// what a long holds.
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
    // PostgreSQL's years reach 294276, past a long of microseconds from 1970 (292277): such a
    // value is the long's extreme, as the infinities are.
    let micros =
        days.checked_mul(86_400_000_000).and_then(|d| d.checked_add(time)?.checked_sub(offset_secs * 1_000_000));
    Some(micros.unwrap_or(if days > 0 { i64::MAX } else { i64::MIN }))
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

    /// Appends the Avro binary of a JSON event (the payload the JSON encoder wrote) in the
    /// envelope schema's field order.
    pub fn write_value(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        let ev: JsonEvent<'_> = serde_json::from_slice(payload)
            .map_err(|e| format!("the JSON event does not fit the Avro envelope: {e}"))?;
        write_metadata(&ev.metadata, out)?;
        for image in [&ev.before, &ev.after] {
            match image {
                None => out.push(0),
                Some(fields) => {
                    out.push(2);
                    self.write_image(&fields.0, out)?;
                }
            }
        }
        match &ev.compliance {
            None => out.push(0),
            Some(c) => {
                out.push(2);
                write_compliance(c, out)?;
            }
        }
        Ok(())
    }

    /// The row record: the image's fields come in the schema's column order (an image leaves
    /// columns out, never reorders them), each column absent from it is null.
    fn write_image(&self, fields: &[(Name<'_>, &RawValue)], out: &mut Vec<u8>) -> Result<(), String> {
        let mut next = 0;
        for c in &self.columns {
            let raw = match fields.get(next) {
                Some((name, raw)) if name.0 == c.json => {
                    next += 1;
                    Some(raw.get())
                }
                _ => None,
            };
            write_nullable(&c.ty, raw, out).map_err(|e| format!("column \"{}\": {e}", c.json))?;
        }
        if let Some((extra, _)) = fields.get(next) {
            return Err(format!("column \"{}\" is not in the table version's schema", extra.0));
        }
        Ok(())
    }
}

/// A message key (a JSON object of key columns), parsed once.
pub struct Key<'a>(Fields<'a>);

impl<'a> Key<'a> {
    /// Parses a JSON key.
    pub fn parse(key: &'a [u8]) -> Result<Key<'a>, String> {
        serde_json::from_slice(key).map(Key).map_err(|e| format!("the JSON key does not parse: {e}"))
    }

    /// Whether its columns are `names`, in that order.
    pub fn has_names(&self, names: &[String]) -> bool {
        self.0 .0.len() == names.len() && self.0 .0.iter().zip(names).all(|((n, _), m)| n.0 == *m)
    }

    /// Its columns' names.
    pub fn names(&self) -> Vec<String> {
        self.0 .0.iter().map(|(n, _)| n.0.to_string()).collect()
    }

    /// Appends its Avro binary, with the key schema's types.
    pub fn write(&self, tys: &[Ty], out: &mut Vec<u8>) -> Result<(), String> {
        for ((name, raw), ty) in self.0 .0.iter().zip(tys) {
            write_nullable(ty, Some(raw.get()), out).map_err(|e| format!("key column \"{}\": {e}", name.0))?;
        }
        Ok(())
    }
}

fn write_opt_str(out: &mut Vec<u8>, v: &Option<String>) {
    match v {
        Some(s) => {
            out.push(2);
            write_bytes(out, s.as_bytes());
        }
        None => out.push(0),
    }
}

fn write_opt_strings(out: &mut Vec<u8>, v: &Option<Vec<String>>) {
    match v {
        Some(a) => {
            out.push(2);
            if !a.is_empty() {
                write_long(out, a.len() as i64);
                for s in a {
                    write_bytes(out, s.as_bytes());
                }
            }
            write_long(out, 0);
        }
        None => out.push(0),
    }
}

fn write_u64(out: &mut Vec<u8>, n: u64, what: &str) -> Result<(), String> {
    write_long(out, i64::try_from(n).map_err(|_| format!("{what} {n} does not fit a long"))?);
    Ok(())
}

fn write_metadata(m: &Metadata<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    for s in [&m.source, &m.database, &m.schema, &m.table, &m.operation] {
        write_bytes(out, s.0.as_bytes());
    }
    let ts = parse_timestamp(&m.timestamp.0).ok_or("metadata.timestamp is not a timestamp")?;
    write_long(out, ts.div_euclid(1000));
    write_u64(out, m.lsn, "metadata.lsn")?;
    write_u64(out, m.commit_lsn, "metadata.commit_lsn")?;
    write_u64(out, m.transaction_id, "metadata.transaction_id")?;
    for v in
        [&m.user, &m.session_id, &m.client_ip, &m.application_name, &m.query, &m.filter_matched, &m.filter_transition]
    {
        write_opt_str(out, v);
    }
    match &m.transaction {
        Some(t) => {
            out.push(2);
            for n in [t.id, t.commit_lsn, t.event_index, t.event_count] {
                write_u64(out, n, "metadata.transaction")?;
            }
        }
        None => out.push(0),
    }
    write_opt_strings(out, &m.unchanged_toast_columns);
    match &m.truncate {
        Some(t) => {
            out.push(2);
            out.push(u8::from(t.cascade));
            out.push(u8::from(t.restart_identity));
        }
        None => out.push(0),
    }
    Ok(())
}

fn write_compliance(c: &Compliance<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    write_bytes(out, c.audit_id.0.as_bytes());
    match &c.retention_until {
        Some(d) => {
            out.push(2);
            write_long(out, i64::from(parse_date(d).ok_or("compliance.retention_until is not a date")?));
        }
        None => out.push(0),
    }
    match c.key_version {
        Some(v) => {
            out.push(2);
            write_u64(out, v, "compliance.key_version")?;
        }
        None => out.push(0),
    }
    for v in [&c.pii_tokenized, &c.pii_hashed, &c.pii_redacted, &c.pii_removed] {
        write_opt_strings(out, v);
    }
    Ok(())
}

/// The `metadata.lsn` of an event in the wire format (after the 5-byte header): the envelope's
/// first fields are five strings and the timestamp, then the LSN. `None` when it is not one.
pub fn event_lsn(framed: &[u8]) -> Option<u64> {
    let mut rest = framed.get(5..)?;
    for _ in 0..5 {
        // A string: its length, then its bytes.
        let len = usize::try_from(read_long(&mut rest)?).ok()?;
        rest = rest.get(len..)?;
    }
    read_long(&mut rest)?; // timestamp
    u64::try_from(read_long(&mut rest)?).ok()
}

/// Reads one Avro `long` off the front of `rest`.
fn read_long(rest: &mut &[u8]) -> Option<i64> {
    let (mut z, mut shift) = (0u64, 0);
    loop {
        let (&b, tail) = rest.split_first()?;
        *rest = tail;
        z |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
}

/// Parses a schema built here (a failure is a bug of this module, reported, never panicking).
pub fn parse_schema(schema: &Json) -> Result<Schema, String> {
    Schema::parse(schema).map_err(|e| format!("its Avro schema does not parse: {e}"))
}

/// A record in Confluent's wire format: magic byte 0, the schema id (4 bytes, big-endian), then
/// the Avro binary `write` appends.
pub fn frame(id: u32, write: impl FnOnce(&mut Vec<u8>) -> Result<(), String>) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(256);
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
    write(&mut out)?;
    Ok(out)
}
