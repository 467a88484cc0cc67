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
use cdc_core::testutil::{config, frames, relation_oids, types};
use serde_json::{json, Value as Json};

use super::debezium::{column_dt, DebeziumFormat, Dt};

/// Debezium's records of a workload run: (key, value), a tombstone's value `None`.
fn debezium(name: &str, variant: &str) -> Vec<(Json, Option<Json>)> {
    let path = format!("{}/tests/debezium/{name}.{variant}.jsonl", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
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
