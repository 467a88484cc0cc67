//! Kafka Connect's Avro converter, for the Debezium format over Avro (`converter: avro`): a
//! Connect schema, as Connect's JSON converter writes it, mapped to the Avro schema Connect's
//! `AvroData` makes of it under its defaults (Connect metadata kept: `connect.name`,
//! `connect.version`, `connect.parameters`, `connect.doc`, `connect.default`, and `connect.type`
//! for int8 and int16), and a Connect JSON payload written as that schema's binary datum.
//!
//! The rules, as `AvroData.fromConnectSchema` applies them:
//! - int8 and int16 are `int` with `connect.type`; int32 `int`, int64 `long`, float32 `float`,
//!   float64 `double`; boolean, string and bytes as named.
//! - `org.apache.kafka.connect.data.Decimal` is `bytes` with the `decimal` logical type, its scale,
//!   and its precision (`connect.decimal.precision`, else 64).
//! - A struct is a record named by the struct's name (namespace: what precedes its last dot).
//!   A record already defined is referred to by its name.
//! - Any other named type is its base type with the metadata properties.
//! - An optional schema is a union with `null`: `null` first and a `null` default, or second when
//!   the field has a default of its own (`default`, and `connect.default` on the type).
//! - An array's items are a union with `null` when optional.
//!
//! Checked against Apicurio's port of that code (`bench/debezium`'s `AvroOracle`) in
//! `debezium_tests.rs`.
use std::collections::HashSet;

use base64::Engine;
use serde_json::{json, Map, Value as Json};

use super::avro::{write_bytes, write_long};

/// The Avro schema (JSON) of a Connect schema.
pub fn avro_schema(connect: &Json) -> Result<Json, String> {
    let mut defined = HashSet::new();
    let (schema, _) = convert(connect, &mut defined, None)?;
    Ok(schema)
}

/// The Avro type of `s`; an optional schema becomes a union with `null`.
/// Also returns whether the result is a union. Written as Avro writes schemas: a record's
/// namespace only where it differs from the enclosing one (`enclosing`), a record defined
/// already by its name (its simple name within the same namespace).
fn convert(s: &Json, defined: &mut HashSet<String>, enclosing: Option<&str>) -> Result<(Json, bool), String> {
    let ty = s["type"].as_str().ok_or_else(|| format!("a Connect schema without a type: {s}"))?;
    let name = s["name"].as_str();
    let base = match (ty, name) {
        ("bytes", Some("org.apache.kafka.connect.data.Decimal")) => {
            let scale: u32 =
                s["parameters"]["scale"].as_str().and_then(|v| v.parse().ok()).ok_or("a Decimal without a scale")?;
            let precision: u32 =
                s["parameters"]["connect.decimal.precision"].as_str().and_then(|v| v.parse().ok()).unwrap_or(64);
            let mut o = Map::new();
            o.insert("type".into(), json!("bytes"));
            o.insert("scale".into(), json!(scale));
            o.insert("precision".into(), json!(precision));
            metadata(s, &mut o);
            o.insert("logicalType".into(), json!("decimal"));
            Json::Object(o)
        }
        ("struct", _) => {
            let full = name.unwrap_or("io.confluent.connect.avro.ConnectDefault");
            let (namespace, simple) = match full.rsplit_once('.') {
                Some((ns, n)) => (Some(ns), n),
                None => (None, full),
            };
            if !defined.insert(full.to_string()) {
                Json::String(if namespace == enclosing { simple } else { full }.to_string())
            } else {
                let mut fields = Vec::new();
                for f in s["fields"].as_array().ok_or("a struct without fields")? {
                    fields.push(field(f, defined, namespace)?);
                }
                let mut o = Map::new();
                o.insert("type".into(), json!("record"));
                o.insert("name".into(), json!(simple));
                if namespace != enclosing {
                    o.insert("namespace".into(), json!(namespace.unwrap_or_default()));
                }
                o.insert("fields".into(), Json::Array(fields));
                metadata(s, &mut o);
                Json::Object(o)
            }
        }
        ("array", _) => {
            let (items, _) = convert(&s["items"], defined, enclosing)?;
            let mut o = Map::new();
            o.insert("type".into(), json!("array"));
            o.insert("items".into(), items);
            metadata(s, &mut o);
            Json::Object(o)
        }
        (primitive, _) => {
            let avro = match primitive {
                "int8" | "int16" | "int32" => "int",
                "int64" => "long",
                "float32" | "float" => "float",
                "float64" | "double" => "double",
                "boolean" | "string" | "bytes" => primitive,
                other => return Err(format!("a Connect type Avro has no mapping for here: {other}")),
            };
            let mut o = Map::new();
            o.insert("type".into(), json!(avro));
            if matches!(primitive, "int8" | "int16") {
                o.insert("connect.type".into(), json!(primitive));
            }
            metadata(s, &mut o);
            if o.len() == 1 {
                Json::String(avro.to_string())
            } else {
                Json::Object(o)
            }
        }
    };
    if s["optional"].as_bool().unwrap_or(false) {
        let union =
            if s.get("default").is_some_and(|d| !d.is_null()) { json!([base, "null"]) } else { json!(["null", base]) };
        return Ok((union, true));
    }
    Ok((base, false))
}

/// The Connect metadata properties of `s` (a struct's doc included), in AvroData's order.
fn metadata(s: &Json, o: &mut Map<String, Json>) {
    if let Some(doc) = s.get("doc").filter(|d| !d.is_null()) {
        o.insert("connect.doc".into(), doc.clone());
    }
    if let Some(v) = s.get("version").filter(|v| !v.is_null()) {
        o.insert("connect.version".into(), v.clone());
    }
    if let Some(p) = s.get("parameters").filter(|p| !p.is_null()) {
        o.insert("connect.parameters".into(), p.clone());
    }
    if let Some(d) = s.get("default").filter(|d| !d.is_null()) {
        o.insert("connect.default".into(), d.clone());
    }
    if let Some(n) = s.get("name").filter(|n| !n.is_null()) {
        o.insert("connect.name".into(), n.clone());
    }
}

/// A record field of a struct's field schema.
fn field(f: &Json, defined: &mut HashSet<String>, enclosing: Option<&str>) -> Result<Json, String> {
    let name = f["field"].as_str().ok_or("a struct field without a name")?;
    let (ty, union) = convert(f, defined, enclosing)?;
    let mut o = Map::new();
    o.insert("name".into(), json!(name));
    o.insert("type".into(), ty);
    match f.get("default").filter(|d| !d.is_null()) {
        Some(d) => {
            o.insert("default".into(), d.clone());
        }
        None if union => {
            o.insert("default".into(), Json::Null);
        }
        None => {}
    }
    Ok(Json::Object(o))
}

/// Writes `value` (a Connect JSON payload of schema `s`) as the binary datum of
/// [`avro_schema`]`(s)`.
pub fn write_datum(s: &Json, value: &Json, out: &mut Vec<u8>) -> Result<(), String> {
    write(s, value, out, true)
}

fn write(s: &Json, v: &Json, out: &mut Vec<u8>, union: bool) -> Result<(), String> {
    let optional = s["optional"].as_bool().unwrap_or(false);
    if union && optional {
        // The branch: null first, unless the schema has a default of its own.
        let null_first = s.get("default").is_none_or(Json::is_null);
        // Branch 0 or 1 (null's index, or the other's).
        write_long(out, i64::from(v.is_null() != null_first));
        if v.is_null() {
            return Ok(());
        }
    } else if v.is_null() {
        return Err(format!("null for a required {} value", s["type"]));
    }
    let bad = || format!("{v} is not a Connect {} value", s["type"]);
    match s["type"].as_str().unwrap_or_default() {
        "boolean" => out.push(u8::from(v.as_bool().ok_or_else(bad)?)),
        "int8" | "int16" | "int32" | "int64" => write_long(out, v.as_i64().ok_or_else(bad)?),
        "float32" | "float" => out.extend_from_slice(&(float(v).ok_or_else(bad)? as f32).to_le_bytes()),
        "float64" | "double" => out.extend_from_slice(&float(v).ok_or_else(bad)?.to_le_bytes()),
        "string" => write_bytes(out, v.as_str().ok_or_else(bad)?.as_bytes()),
        "bytes" => {
            let b = base64::engine::general_purpose::STANDARD.decode(v.as_str().ok_or_else(bad)?).map_err(|_| bad())?;
            write_bytes(out, &b);
        }
        "struct" => {
            for f in s["fields"].as_array().ok_or("a struct without fields")? {
                let name = f["field"].as_str().unwrap_or_default();
                write(f, v.get(name).unwrap_or(&Json::Null), out, true)?;
            }
        }
        "array" => {
            let items = v.as_array().ok_or_else(bad)?;
            if !items.is_empty() {
                write_long(out, items.len() as i64);
                for item in items {
                    write(&s["items"], item, out, true)?;
                }
            }
            write_long(out, 0);
        }
        other => return Err(format!("a Connect type Avro has no mapping for here: {other}")),
    }
    Ok(())
}

/// A JSON number, or the converter's strings for NaN and the infinities.
fn float(v: &Json) -> Option<f64> {
    match v {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// The `source.lsn` of a Debezium record written with the Avro converter (Confluent's framing),
/// read with its writer schema, which `schema_of` gives by the record's schema id (a registry
/// lookup; `cdc_schema_history`'s consumers). `None` when the record is not such a one.
pub fn debezium_lsn(framed: &[u8], schema_of: impl FnOnce(u32) -> Option<String>) -> Option<u64> {
    use apache_avro::types::Value as Avro;
    let (&magic, rest) = framed.split_first()?;
    if magic != 0 || rest.len() < 4 {
        return None;
    }
    let id = u32::from_be_bytes(rest[..4].try_into().ok()?);
    let schema = apache_avro::Schema::parse_str(&schema_of(id)?).ok()?;
    let value = apache_avro::reader::datum::GenericDatumReader::builder(&schema)
        .build()
        .ok()?
        .read_value(&mut &rest[4..])
        .ok()?;
    let field = |v: &Avro, name: &str| match v {
        Avro::Record(fields) => fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()),
        _ => None,
    };
    match field(&field(&value, "source")?, "lsn")? {
        Avro::Union(_, lsn) => match *lsn {
            Avro::Long(l) => u64::try_from(l).ok(),
            _ => None,
        },
        Avro::Long(l) => u64::try_from(l).ok(),
        _ => None,
    }
}
