//! The Debezium format against Debezium itself: the golden workloads' pgoutput frames go through
//! the pipeline and the Debezium format, and every record is compared, field by field and
//! schema by schema, with what Debezium 3.6's PostgreSQL connector wrote for the same workload
//! (`tests/debezium/<workload>.<variant>.jsonl`, recorded by `scripts/capture_debezium.py`; this
//! code never wrote them). Values that differ by nature are set aside before comparing: times of
//! processing and commit, LSNs, transaction ids and versions. The deviations pg_cdc chooses are
//! listed in [`DEVIATIONS`], each checked to be what it claims.
use std::sync::Arc;

use cdc_core::config::sink::{DebeziumOptions, DecimalHandling};
use cdc_core::config::{CaptureConfig, Operations};
use cdc_core::envelope::Op;
use cdc_core::format::EventFormat;
use cdc_core::pipeline::{Assembler, SinkTables};
use cdc_core::testutil::{config, crate_dir, frames, relation_oids, types};
use serde_json::{json, Value as Json};

use super::debezium::{column_dt, DebeziumFormat, Dt};

/// Debezium's records of a workload run: (key, value), a tombstone's value `None`.
fn debezium(name: &str, variant: &str) -> Vec<(Json, Option<Json>)> {
    let path = crate_dir(env!("CARGO_MANIFEST_DIR")).join(format!("tests/debezium/{name}.{variant}.jsonl"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let r: Json = serde_json::from_str(l).unwrap();
            (r["key"].clone(), (!r["value"].is_null()).then(|| r["value"].clone()))
        })
        .collect()
}

/// pg_cdc's records of the same workload through the Debezium format (TRUNCATE left out, as
/// Debezium's default `skipped.operations` does).
fn ours(name: &str, tables: &[(&str, CaptureConfig)], options: DebeziumOptions) -> Vec<(Json, Option<Json>)> {
    let fr = frames(name);
    let oids = relation_oids(&fr);
    let sink: SinkTables = tables.iter().map(|(t, c)| (oids[*t], Arc::new(c.clone()))).collect();
    let mut a = Assembler::new("golden");
    let format: Box<dyn EventFormat> = Box::new(DebeziumFormat::new(options, "pg_cdc_golden_dbz", "0.0.0"));
    a.set_format(Some(format));
    let out = a.process(&fr, &sink, &types(name)).expect("pipeline");
    let mut records = Vec::new();
    for e in out.transactions.iter().flat_map(|t| &t.events) {
        let key: Json = e.key.as_ref().map_or(Json::Null, |k| serde_json::from_slice(k).expect("key is JSON"));
        let value: Json = serde_json::from_slice(&e.payload)
            .unwrap_or_else(|err| panic!("not JSON ({err}): {}", String::from_utf8_lossy(&e.payload)));
        records.push((key.clone(), Some(value)));
        if e.tombstone {
            records.push((key, None));
        }
    }
    records
}

fn options(schemas: bool, decimals: DecimalHandling, tombstones: bool) -> DebeziumOptions {
    DebeziumOptions {
        topic_prefix: Some("golden".into()),
        schemas,
        decimal_handling_mode: decimals,
        tombstones_on_delete: tombstones,
        converter: cdc_core::config::sink::DebeziumConverter::Json,
    }
}

fn no_truncate(key: &[&str]) -> CaptureConfig {
    let mut c = config(key);
    c.operations = Operations { insert: true, update: true, delete: true, truncate: false };
    c
}

/// Sets aside what differs by nature between two runs: processing and commit times, LSNs,
/// transaction ids, the connector's version.
fn normalize(v: &mut Json) {
    let payload = if v.get("schema").is_some() && v.get("payload").is_some() { &mut v["payload"] } else { v };
    if let Some(p) = payload.as_object_mut() {
        for f in ["ts_ms", "ts_us", "ts_ns"] {
            if p.contains_key(f) {
                p.insert(f.into(), json!("<time>"));
            }
        }
        if let Some(s) = p.get_mut("source").and_then(Json::as_object_mut) {
            for f in ["version", "ts_ms", "ts_us", "ts_ns", "txId", "lsn", "sequence"] {
                s.insert(f.into(), json!("<run>"));
            }
        }
    }
}

/// Equal as JSON, numbers compared by value (`-0` and `-0.0`, `1e+30` and `1.0E30`, to the
/// parser's precision); says where they differ first.
fn same(path: &str, a: &Json, b: &Json) -> Result<(), String> {
    match (a, b) {
        // serde_json's parser may be one unit in the last place off (no float_roundtrip).
        (Json::Number(x), Json::Number(y))
            if x.as_f64().zip(y.as_f64()).is_some_and(|(x, y)| (x - y).abs() <= 1e-15 * x.abs().max(y.abs())) =>
        {
            Ok(())
        }
        (Json::Object(x), Json::Object(y)) => {
            let kx: Vec<&String> = x.keys().collect();
            let ky: Vec<&String> = y.keys().collect();
            if kx != ky {
                return Err(format!("{path}: fields {kx:?} vs {ky:?}"));
            }
            x.iter().try_for_each(|(k, v)| same(&format!("{path}.{k}"), v, &y[k]))
        }
        (Json::Array(x), Json::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().try_for_each(|(i, (p, q))| same(&format!("{path}[{i}]"), p, q))
        }
        _ if a == b => Ok(()),
        _ => Err(format!("{path}: pg_cdc {a} vs Debezium {b}")),
    }
}

/// Columns where pg_cdc writes what Debezium 3.6 loses, by (workload, column): pg_cdc's value
/// and Debezium's, in the first event of the `types` workload.
const DEVIATIONS: &[(&str, &str)] = &[
    // Debezium writes null for a `name` column.
    ("c_name", "a_name"),
    // Debezium writes null for a numeric array holding NaN; pg_cdc writes NaN as the mode writes
    // it in a column (precise: null; string: "NAN"; double: "NaN").
    ("c_numeric_array", "[{scale:2,...},null,{scale:1,...}]"),
    // Debezium writes null for an enum array with a NULL element (its items are not optional).
    ("c_enum_array", "[\"sad\",null,\"ok\"]"),
];

/// Drops the deviating columns from both sides (after checking pg_cdc's values are the real
/// ones, and Debezium's the lost ones), and the `int[][]` column pg_cdc's format refuses (the
/// run leaves it out of pg_cdc's events; Debezium writes `[null, null]`).
fn set_deviations_aside(ours: &mut [(Json, Option<Json>)], theirs: &mut [(Json, Option<Json>)]) {
    for (i, (_, v)) in ours.iter_mut().enumerate() {
        let Some(v) = v else { continue };
        let schemas = v.get("schema").is_some();
        let p = if schemas { &mut v["payload"] } else { &mut *v };
        if i == 0 {
            let after = &p["after"];
            assert_eq!(after["c_name"], "a_name");
            assert_eq!(after["c_enum_array"], json!(["sad", null, "ok"]));
            let nums = &after["c_numeric_array"];
            assert_eq!(nums.as_array().map(Vec::len), Some(3), "{nums}");
            assert!(!nums[0].is_null() && !nums[2].is_null(), "{nums}");
        }
        for image in ["before", "after"] {
            if let Some(o) = p[image].as_object_mut() {
                for (c, _) in DEVIATIONS {
                    o.remove(*c);
                }
            }
        }
        if schemas {
            strip_schema_fields(&mut v["schema"], &[]);
        }
    }
    for (i, (_, v)) in theirs.iter_mut().enumerate() {
        let Some(v) = v else { continue };
        let schemas = v.get("schema").is_some();
        let p = if schemas { &mut v["payload"] } else { &mut *v };
        if i == 0 {
            let after = &p["after"];
            for (c, _) in DEVIATIONS {
                assert!(after[c].is_null(), "Debezium loses {c}: {}", after[c]);
            }
            assert_eq!(after["c_int_matrix"], json!([null, null]));
        }
        for image in ["before", "after"] {
            if let Some(o) = p[image].as_object_mut() {
                for (c, _) in DEVIATIONS {
                    o.remove(*c);
                }
                o.remove("c_int_matrix");
            }
        }
        if schemas {
            strip_schema_fields(&mut v["schema"], &["c_int_matrix"]);
        }
    }
}

/// Removes the deviating columns (and `extra`) from the Value structs of an envelope schema.
fn strip_schema_fields(schema: &mut Json, extra: &[&str]) {
    for f in schema["fields"].as_array_mut().into_iter().flatten() {
        if f["field"] == "before" || f["field"] == "after" {
            if let Some(fields) = f["fields"].as_array_mut() {
                fields.retain(|c| {
                    let name = c["field"].as_str().unwrap_or_default();
                    !DEVIATIONS.iter().any(|(d, _)| *d == name) && !extra.contains(&name)
                });
            }
        }
    }
}

/// The one schema deviation: an enum array's items are optional in pg_cdc's schema (an element
/// may be NULL, which Debezium's schema cannot hold, so it writes the whole array as null). Sets
/// Debezium's to pg_cdc's after checking it is that and nothing else.
fn enum_items_optional(schema: &mut Json) {
    for image in schema["fields"].as_array_mut().into_iter().flatten() {
        if image["field"] != "before" && image["field"] != "after" {
            continue;
        }
        for f in image["fields"].as_array_mut().into_iter().flatten() {
            if f["type"] == "array" && f["items"]["name"] == "io.debezium.data.Enum" {
                assert_eq!(f["items"]["optional"], false);
                f["items"]["optional"] = json!(true);
            }
        }
    }
}

fn compare(name: &str, variant: &str, mut ours: Vec<(Json, Option<Json>)>, mut theirs: Vec<(Json, Option<Json>)>) {
    if name == "types" {
        set_deviations_aside(&mut ours, &mut theirs);
    }
    for v in theirs.iter_mut().filter_map(|(_, v)| v.as_mut()) {
        if v.get("schema").is_some() {
            enum_items_optional(&mut v["schema"]);
        }
    }
    assert_eq!(
        ours.len(),
        theirs.len(),
        "{name}.{variant}: {} records vs Debezium's {}:\n{ours:#?}",
        ours.len(),
        theirs.len()
    );
    for (i, ((k1, v1), (k2, v2))) in ours.iter_mut().zip(theirs.iter_mut()).enumerate() {
        if let Err(e) = same("key", k1, k2) {
            panic!("{name}.{variant} record {i}: {e}");
        }
        match (v1, v2) {
            (Some(a), Some(b)) => {
                normalize(a);
                normalize(b);
                if let Err(e) = same("value", a, b) {
                    panic!("{name}.{variant} record {i}: {e}");
                }
            }
            (None, None) => {}
            (a, b) => panic!("{name}.{variant} record {i}: tombstone {} vs Debezium's {}", a.is_none(), b.is_none()),
        }
    }
}

fn types_config() -> CaptureConfig {
    let mut c = no_truncate(&["id"]);
    c.exclude_columns = vec!["c_int_matrix".into()];
    c
}

/// `req`'s config with its schema history (every column NOT NULL, as the worker reads it from
/// the catalog; pgoutput does not say).
fn req_config() -> CaptureConfig {
    use cdc_core::schema::{Field, History, Version};
    let mut c = no_truncate(&["id"]);
    let fields = [
        ("id", 23, -1),
        ("n", 23, -1),
        ("s", 25, -1),
        ("d", 1700, (10 << 16 | 2) + 4),
        ("at", 1184, -1),
        ("ok", 16, -1),
        ("day", 1082, -1),
        ("b", 17, -1),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(name, type_oid, typmod))| Field {
        attnum: i as i16 + 1,
        name: name.into(),
        type_sql: String::new(),
        type_oid,
        typmod,
        not_null: true,
        default: None,
        missing: None,
    })
    .collect();
    let v = Version { lsn: cdc_core::Lsn(1), number: 1, forced: false, own_topic: false, fields };
    c.history = Some(Arc::new(History::from_versions(vec![v])));
    c
}

#[test]
fn basic_matches_debezium_with_and_without_schemas() {
    let tables = [("orders", no_truncate(&["order_id"])), ("plain", no_truncate(&["id"]))];
    for (variant, schemas, tombstones) in
        [("default", true, true), ("noschema", false, true), ("notombstones", false, false)]
    {
        let o = ours("basic", &tables, options(schemas, DecimalHandling::Precise, tombstones));
        compare("basic", variant, o, debezium("basic", variant));
    }
}

#[test]
fn every_type_family_matches_debezium_in_each_decimal_mode() {
    for (variant, mode) in [
        ("default", DecimalHandling::Precise),
        ("string", DecimalHandling::String),
        ("double", DecimalHandling::Double),
    ] {
        let o = ours("types", &[("all_types", types_config())], options(true, mode, true));
        compare("types", variant, o, debezium("types", variant));
        let o = ours("formats", &[("fmt", no_truncate(&["id"])), ("req", req_config())], options(true, mode, true));
        compare("formats", variant, o, debezium("formats", variant));
    }
}

#[test]
fn unchanged_toast_values_are_debeziums_placeholder() {
    let tables = [("docs_full", no_truncate(&["id"])), ("docs_default", no_truncate(&["id"]))];
    let o = ours("toast", &tables, options(true, DecimalHandling::Precise, true));
    compare("toast", "default", o, debezium("toast", "default"));
}

/// The negative control: the comparison sees one wrong value.
#[test]
fn the_comparison_catches_a_wrong_value() {
    let tables = [("orders", no_truncate(&["order_id"])), ("plain", no_truncate(&["id"]))];
    let mut o = ours("basic", &tables, options(false, DecimalHandling::Precise, true));
    o[1].1.as_mut().unwrap()["after"]["status"] = json!("shipped");
    let caught = std::panic::catch_unwind(|| compare("basic", "noschema", o, debezium("basic", "noschema")));
    assert!(caught.is_err(), "a wrong value must fail the comparison");
}

#[test]
fn truncate_and_snapshot_rows_have_debeziums_op_codes() {
    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let sink: SinkTables = [(oids["plain"], Arc::new(config(&["id"])))].into_iter().collect();
    let mut a = Assembler::new("golden");
    a.set_format(Some(Box::new(DebeziumFormat::new(options(false, DecimalHandling::Precise, true), "db", "0.0.0"))));
    let out = a.process(&fr, &sink, &types("basic")).expect("pipeline");
    let events: Vec<_> = out.transactions.iter().flat_map(|t| &t.events).collect();
    let truncate = events.iter().find(|e| e.op == Op::Truncate).expect("a truncate");
    let v: Json = serde_json::from_slice(&truncate.payload).unwrap();
    assert_eq!((v["op"].as_str(), &v["before"], &v["after"]), (Some("t"), &Json::Null, &Json::Null));
    assert_eq!(v["source"]["table"], "plain");
    assert!(truncate.key.is_none() && !truncate.tombstone);
    // Only a DELETE is followed by a tombstone.
    assert!(events.iter().all(|e| e.tombstone == (e.op == Op::Delete)));
}

#[test]
fn durations_times_and_bits_as_debezium_computes_them() {
    use cdc_core::types::TypeRegistry;
    let t = TypeRegistry::new();
    let dt = |oid, typmod| column_dt(&t, oid, typmod, DecimalHandling::Precise).unwrap();
    let w = |d: &Dt, raw: &str| {
        let mut s = String::new();
        d.write(raw, &mut s).unwrap();
        s
    };
    assert_eq!(w(&dt(1186, -1), "\"P-1Y-2DT3H0.25S\""), "-31719599750000");
    assert_eq!(w(&dt(1186, -1), "\"PT0S\""), "0");
    assert_eq!(w(&dt(1266, -1), "\"00:30:00+01\""), "\"23:30:00Z\"");
    assert_eq!(w(&dt(1560, 4), "\"0000\""), "\"\"");
    assert_eq!(w(&dt(1184, 0), "\"2024-01-01T00:00:00.5Z\""), "\"2024-01-01T00:00:00Z\"");
    // A jsonb value that is a JSON string is still its JSON text.
    assert_eq!(w(&dt(3802, -1), "\"hello\""), r#""\"hello\"""#);
    assert_eq!(w(&dt(3802, -1), "[1,2]"), r#""[1,2]""#);
    // A type Debezium does not know is left out.
    assert_eq!(column_dt(&t, 603, -1, DecimalHandling::Precise), None);
}

/// The oracle's Avro records of a workload run: per record, the key and the value as
/// (Avro schema, datum); a tombstone's value `None`.
type AvroRecord = (Option<(Json, Vec<u8>)>, Option<(Json, Vec<u8>)>);

fn avro_oracle(name: &str, variant: &str) -> Vec<AvroRecord> {
    use base64::Engine;
    let path = crate_dir(env!("CARGO_MANIFEST_DIR")).join(format!("tests/debezium/{name}.{variant}.avro.jsonl"));
    let part = |r: &Json, f: &str| {
        r[f].as_str()
            .map(|b| (r[format!("{f}_schema")].clone(), base64::engine::general_purpose::STANDARD.decode(b).unwrap()))
    };
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let r: Json = serde_json::from_str(l).unwrap();
            (part(&r, "key"), part(&r, "value"))
        })
        .collect()
}

/// Reads one Avro datum (apache-avro's reader, not this crate's code).
fn read_datum(schema: &apache_avro::Schema, bytes: &[u8]) -> apache_avro::types::Value {
    apache_avro::reader::datum::GenericDatumReader::builder(schema)
        .build()
        .unwrap()
        .read_value(&mut &bytes[..])
        .unwrap()
}

/// What Connect's Avro converter writes for one JSON-converter record (schema and payload).
fn converted(record: &Json) -> (Json, Vec<u8>) {
    let schema = super::connect_avro::avro_schema(&record["schema"]).unwrap();
    let mut datum = Vec::new();
    super::connect_avro::write_datum(&record["schema"], &record["payload"], &mut datum).unwrap();
    (schema, datum)
}

/// The payload as the oracle sees it: it reads Debezium's JSON records back with Connect's JSON
/// converter, which reads a float written as a string (NaN, the infinities) as 0.0 (Jackson's
/// `floatValue` of a text node), and -0.0 as 0.0. Debezium's Avro converter gets the float itself, and pg_cdc
/// writes it (checked below); for the byte comparison those values are 0.0 on both sides.
fn as_the_oracle_reads(schema: &Json, payload: &mut Json) {
    match schema["type"].as_str() {
        // So does it a -0.0 (read as an exact decimal, which has no negative zero).
        Some("float" | "double") if payload.is_string() || payload.as_f64() == Some(0.0) => *payload = json!(0.0),
        Some("struct") => {
            for f in schema["fields"].as_array().into_iter().flatten() {
                if let Some(v) = payload.get_mut(f["field"].as_str().unwrap_or_default()) {
                    as_the_oracle_reads(f, v);
                }
            }
        }
        Some("array") => {
            for v in payload.as_array_mut().into_iter().flatten() {
                as_the_oracle_reads(&schema["items"], v);
            }
        }
        _ => {}
    }
}

/// The Avro converter's mapping against Connect's own (AvroData, run by the harness's
/// AvroOracle on Debezium's records): for every record Debezium wrote in every workload, the
/// same Avro schema and the same datum, byte for byte, from the same Connect schema and payload.
#[test]
fn the_avro_converter_maps_debeziums_records_as_connects_avro_data_does() {
    for (name, variant) in [
        ("basic", "default"),
        ("types", "default"),
        ("types", "string"),
        ("types", "double"),
        ("toast", "default"),
        ("formats", "default"),
        ("formats", "string"),
        ("formats", "double"),
    ] {
        let records = debezium(name, variant);
        let oracle = avro_oracle(name, variant);
        assert_eq!(records.len(), oracle.len(), "{name}.{variant}");
        for (i, ((key, value), (okey, ovalue))) in records.iter().zip(&oracle).enumerate() {
            let at = format!("{name}.{variant} record {i}");
            let (ks, kd) = converted(key);
            let (oks, okd) = okey.clone().expect("a key");
            assert_eq!(ks, oks, "{at}: key schema");
            assert_eq!(kd, okd, "{at}: key datum");
            match (value, ovalue) {
                (Some(v), Some((ovs, ovd))) => {
                    let mut v = v.clone();
                    as_the_oracle_reads(&v["schema"].clone(), &mut v["payload"]);
                    let (vs, vd) = converted(&v);
                    if let Err(e) = same("schema", &vs, ovs) {
                        panic!("{at}: value {e}");
                    }
                    assert_eq!(&vd, ovd, "{at}: value datum");
                    // And Avro reads the datum back with the schema.
                    let schema = super::avro::parse_schema(&vs).unwrap();
                    read_datum(&schema, &vd);
                }
                (None, None) => {}
                _ => panic!("{at}: tombstone mismatch"),
            }
        }
    }
}

/// pg_cdc's own records through the Avro converter read back as what its JSON converter says,
/// field by field (the JSON records match Debezium's, above), and a changed field is noticed.
#[test]
fn debezium_over_avro_reads_back_as_the_json_records() {
    use apache_avro::types::Value as Avro;
    let records = ours("types", &[("all_types", types_config())], options(true, DecimalHandling::Precise, true));
    let mut checked = 0;
    for (key, value) in &records {
        for record in [Some(key), value.as_ref()].into_iter().flatten() {
            let (schema, datum) = converted(record);
            let schema = super::avro::parse_schema(&schema).unwrap();
            let read = read_datum(&schema, &datum);
            let Avro::Record(fields) = &read else { panic!("a record: {read:?}") };
            let payload = record["payload"].as_object().unwrap();
            let mut names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
            names.sort_unstable();
            assert_eq!(names, payload.keys().map(String::as_str).collect::<Vec<_>>());
            // Every field that is a string or an integer in the JSON record is that in the datum.
            for (name, v) in fields {
                let read = match v {
                    Avro::Union(_, b) => b.as_ref(),
                    other => other,
                };
                match (read, &payload[name]) {
                    (Avro::String(a), Json::String(b)) => assert_eq!(a, b, "{name}"),
                    (Avro::Long(a), Json::Number(b)) => assert_eq!(Some(*a), b.as_i64(), "{name}"),
                    (Avro::Int(a), Json::Number(b)) => assert_eq!(Some(i64::from(*a)), b.as_i64(), "{name}"),
                    (Avro::Null, Json::Null) | (Avro::Record(_), Json::Object(_)) => {}
                    (a, b) => panic!("{name}: {a:?} vs {b}"),
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 5);
    // Negative control: a payload that does not fit its schema is refused, not written.
    let (_, Some(value)) = &records[0] else { panic!("a value") };
    let mut broken = value.clone();
    broken["payload"]["op"] = json!(7);
    let mut out = Vec::new();
    assert!(super::connect_avro::write_datum(&broken["schema"], &broken["payload"], &mut out).is_err());
    // The floats the JSON converter writes as strings are the floats themselves in Avro.
    let float = json!({"type": "struct", "name": "t.F", "optional": false, "fields": [
        {"type": "float", "optional": false, "field": "f"}, {"type": "double", "optional": true, "field": "d"}]});
    let mut out = Vec::new();
    super::connect_avro::write_datum(&float, &json!({"f": "NaN", "d": "-Infinity"}), &mut out).unwrap();
    assert!(f32::from_le_bytes(out[..4].try_into().unwrap()).is_nan());
    assert_eq!((out[4], f64::from_le_bytes(out[5..].try_into().unwrap())), (2, f64::NEG_INFINITY));
}

/// `cdc_schema_history`'s consumers read a Debezium record's LSN over Avro with its writer schema
/// (the registry's, by the id in the framing): each of Debezium's own records gives the LSN its
/// JSON record says; a record that is not framed, or a schema the registry does not give, none.
#[test]
fn the_lsn_of_a_debezium_avro_record_is_read_with_its_writer_schema() {
    let records = debezium("basic", "default");
    let oracle = avro_oracle("basic", "default");
    let mut read = 0;
    for ((_, value), (_, avro)) in records.iter().zip(&oracle) {
        let (Some(value), Some((schema, datum))) = (value, avro) else { continue };
        let framed = super::avro::frame(42, |out| {
            out.extend_from_slice(datum);
            Ok(())
        })
        .unwrap();
        let text = schema.to_string();
        let lsn = super::connect_avro::debezium_lsn(&framed, |id| (id == 42).then(|| text.clone()));
        assert_eq!(lsn, value["payload"]["source"]["lsn"].as_u64());
        assert_eq!(super::connect_avro::debezium_lsn(&framed, |_| None), None);
        assert_eq!(super::connect_avro::debezium_lsn(&framed[1..], |_| Some(text.clone())), None);
        read += 1;
    }
    assert!(read > 5);
}
