//! The Avro format against the golden captures: each event, written with the schema built from
//! its relation and read back with apache-avro's own reader, says what its JSON event says.
use std::sync::{Arc, Mutex};

use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use cdc_core::config::CaptureConfig;
use cdc_core::envelope::{Event, RelationPlan};
use cdc_core::format::{EventFormat, FormatError};
use cdc_core::pipeline::{Assembler, SinkTables};
use cdc_core::testutil::{config, frames, relation_oids, types};
use cdc_core::types::TypeRegistry;
use num_bigint::BigInt;
use serde_json::{json, Value as Json};

use super::avro::{self, Ty};
use super::Subjects;

/// A JSON event and the plan it was made under.
type Planned = (Arc<RelationPlan>, Event);

/// Keeps each JSON event with its plan, unchanged.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Planned>>>);

impl EventFormat for Capture {
    fn encode(&mut self, plan: &Arc<RelationPlan>, _: &TypeRegistry, event: &mut Event) -> Result<(), FormatError> {
        self.0.lock().unwrap().push((plan.clone(), event.clone()));
        Ok(())
    }
}

fn captured(name: &str, table: &str, cfg: CaptureConfig) -> (Vec<Planned>, TypeRegistry) {
    let fr = frames(name);
    let oids = relation_oids(&fr);
    let sink: SinkTables = [(oids[table], Arc::new(cfg))].into_iter().collect();
    let t = types(name);
    let capture = Capture::default();
    let mut a = Assembler::new("golden");
    a.set_format(Some(Box::new(capture.clone())));
    a.process(&fr, &sink, &t).expect("pipeline");
    let out = capture.0.lock().unwrap().clone();
    (out, t)
}

/// Reads one Avro datum (apache-avro's reader, not this crate's code).
fn read_datum(schema: &Schema, bytes: &[u8]) -> Avro {
    apache_avro::reader::datum::GenericDatumReader::builder(schema)
        .build()
        .unwrap()
        .read_value(&mut &bytes[..])
        .unwrap()
}

/// Writes an event in the wire format and reads it back with apache-avro.
fn round_trip(plan: &RelationPlan, t: &TypeRegistry, ev: &Event) -> (Avro, Schema) {
    let s = avro::table_schemas(plan, t, "golden").unwrap();
    let schema = avro::parse_schema(&s.value).unwrap();
    let bytes = avro::frame(7, |out| s.write_value(&ev.payload, out)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(bytes[0], 0, "magic byte");
    assert_eq!(&bytes[1..5], &7u32.to_be_bytes(), "schema id");
    let read = read_datum(&schema, &bytes[5..]);
    (read, schema)
}

fn field<'a>(record: &'a Avro, name: &str) -> &'a Avro {
    match record {
        Avro::Record(fields) => &fields.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no field {name}")).1,
        Avro::Union(_, inner) => field(inner, name),
        other => panic!("{other:?} is not a record"),
    }
}

fn inner(v: &Avro) -> &Avro {
    match v {
        Avro::Union(_, b) => b,
        v => v,
    }
}

fn decimal(v: &Avro) -> BigInt {
    match inner(v) {
        Avro::Decimal(d) => BigInt::from(d.clone()),
        other => panic!("{other:?} is not a decimal"),
    }
}

#[test]
fn every_type_of_the_golden_capture_reads_back_with_its_avro_type() {
    let mut cfg = config(&["id"]);
    // A two-dimensional array has no one-dimensional Avro array (see the test below).
    cfg.exclude_columns = vec!["c_int_matrix".into()];
    let (events, t) = captured("types", "all_types", cfg);
    assert_eq!(events.len(), 5);
    let (plan, ev) = &events[0];
    let (read, _) = round_trip(plan, &t, ev);
    let after = field(&read, "after");
    let f = |n: &str| inner(field(after, n)).clone();
    assert_eq!(f("id"), Avro::Int(1));
    assert_eq!(f("c_bool"), Avro::Boolean(true));
    assert_eq!(f("c_int2"), Avro::Int(-32768));
    assert_eq!(f("c_int8"), Avro::Long(i64::MIN));
    assert_eq!(f("c_oid"), Avro::Long(4294967295));
    assert_eq!(f("c_float4"), Avro::Float(1.5));
    assert_eq!(f("c_float8"), Avro::Double(std::f64::consts::PI));
    // numeric(12,4): exact, at its scale.
    assert_eq!(decimal(field(after, "c_numeric_scaled")), BigInt::from(1_500_000));
    // Unconstrained numeric: the exact text.
    assert_eq!(f("c_numeric"), Avro::String("12345678901234567890.123456789".into()));
    assert_eq!(f("c_bytea"), Avro::Bytes(vec![0xde, 0xad, 0xbe, 0xef]));
    assert_eq!(f("c_uuid"), Avro::Uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".parse().unwrap()));
    assert_eq!(f("c_json"), Avro::String(r#"{"a": [1, 2.50, "x"]}"#.into()));
    assert_eq!(f("c_date"), Avro::Date(19782)); // 2024-02-29
    assert_eq!(f("c_time"), Avro::TimeMicros(((14 * 60 + 23) * 60 + 45) * 1_000_000 + 123_000));
    assert_eq!(f("c_timestamp"), Avro::LocalTimestampMicros(1_710_512_625_123_456));
    assert_eq!(f("c_timestamptz"), Avro::TimestampMicros(1_710_512_625_123_456));
    assert_eq!(f("c_interval"), Avro::String("P1Y2M3DT4H5M6.7S".into()));
    assert_eq!(
        f("c_int_array"),
        Avro::Array(vec![
            Avro::Union(1, Box::new(Avro::Int(1))),
            Avro::Union(0, Box::new(Avro::Null)),
            Avro::Union(1, Box::new(Avro::Int(3)))
        ])
    );
    assert_eq!(
        f("c_timestamptz_array"),
        Avro::Array(vec![
            Avro::Union(1, Box::new(Avro::TimestampMicros(1_704_067_200_000_000))),
            Avro::Union(1, Box::new(Avro::TimestampMicros(i64::MAX)))
        ])
    );
    assert_eq!(f("c_enum"), Avro::String("happy".into()));
    // Every column of the JSON image is a field, and nothing else.
    let json: Json = serde_json::from_slice(&ev.payload).unwrap();
    let Avro::Record(fields) = inner(after) else { panic!() };
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    let expected: Vec<&str> = json["after"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(names.len(), expected.len());
    for n in expected {
        assert!(names.contains(&n), "{n}");
    }
    // Metadata as in the JSON event.
    let meta = field(&read, "metadata");
    assert_eq!(inner(field(meta, "operation")), &Avro::String("INSERT".into()));
    assert_eq!(inner(field(meta, "lsn")), &Avro::Long(json["metadata"]["lsn"].as_i64().unwrap()));
    assert_eq!(field(&read, "before"), &Avro::Union(0, Box::new(Avro::Null)));
    // The LSN is found in the wire format without the schema (for consumers' positions).
    let s = avro::table_schemas(plan, &t, "golden").unwrap();
    let framed = avro::frame(7, |out| s.write_value(&ev.payload, out)).unwrap();
    assert_eq!(avro::event_lsn(&framed), json["metadata"]["lsn"].as_u64());

    // NaN, infinities and BC dates.
    let (read, _) = round_trip(&events[1].0, &t, &events[1].1);
    let after = field(&read, "after");
    let f = |n: &str| inner(field(after, n)).clone();
    assert!(matches!(f("c_float4"), Avro::Float(x) if x.is_nan()));
    assert_eq!(f("c_float8"), Avro::Double(f64::INFINITY));
    assert_eq!(f("c_numeric"), Avro::String("NaN".into()));
    // -0043-03-15: Julian day 1705428 (Fliegel and Van Flandern's formula), epoch 2440588.
    assert_eq!(f("c_date"), Avro::Date(1_705_428 - 2_440_588));
    assert_eq!(f("c_bytea"), Avro::Bytes(vec![]));
    let (read, _) = round_trip(&events[2].0, &t, &events[2].1);
    let after = field(&read, "after");
    assert_eq!(inner(field(after, "c_date")), &Avro::Date(i32::MAX));
    assert_eq!(inner(field(after, "c_timestamp")), &Avro::LocalTimestampMicros(i64::MIN));
    // Row 5 is all NULL but its id.
    let (read, _) = round_trip(&events[4].0, &t, &events[4].1);
    assert_eq!(field(field(&read, "after"), "c_text"), &Avro::Union(0, Box::new(Avro::Null)));
}

#[test]
fn a_two_dimensional_array_is_an_error_that_names_the_column() {
    let (events, t) = captured("types", "all_types", config(&["id"]));
    let s = avro::table_schemas(&events[0].0, &t, "golden").unwrap();
    let err = s.write_value(&events[0].1.payload, &mut Vec::new()).unwrap_err();
    assert!(err.contains("c_int_matrix") && err.contains("multidimensional"), "{err}");
}

#[test]
fn keys_are_records_of_their_columns() {
    let (events, t) = captured("basic", "orders", config(&["order_id"]));
    let (plan, ev) = &events[0];
    let s = avro::table_schemas(plan, &t, "golden").unwrap();
    let key = ev.key.as_ref().unwrap();
    let parsed = avro::Key::parse(key).unwrap();
    let names = parsed.names();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (json, tys) = s.key_schema(&refs).unwrap();
    assert!(parsed.has_names(&names));
    assert_eq!(json["name"], "Key");
    assert_eq!(json["namespace"], "golden.public.orders");
    let schema = avro::parse_schema(&json).unwrap();
    let bytes = avro::frame(3, |out| parsed.write(&tys, out)).unwrap();
    let read = read_datum(&schema, &bytes[5..]);
    let k: Json = serde_json::from_slice(key).unwrap();
    match (&k["order_id"], inner(field(&read, "order_id"))) {
        (Json::Number(n), Avro::Int(v)) => assert_eq!(n.as_i64(), Some(i64::from(*v))),
        (Json::Number(n), Avro::Long(v)) => assert_eq!(n.as_i64(), Some(*v)),
        (Json::String(s), Avro::String(v)) => assert_eq!(s, v),
        (j, a) => panic!("{j} vs {a:?}"),
    }
}

#[test]
fn every_event_of_the_basic_capture_round_trips() {
    let (events, t) = captured("basic", "orders", config(&["order_id"]));
    assert!(events.len() > 3);
    for (plan, ev) in &events {
        let (read, _) = round_trip(plan, &t, ev);
        let json: Json = serde_json::from_slice(&ev.payload).unwrap();
        for image in ["before", "after"] {
            match (&json[image], field(&read, image)) {
                (Json::Null, v) => assert_eq!(v, &Avro::Union(0, Box::new(Avro::Null))),
                (Json::Object(o), v) => {
                    for (k, jv) in o {
                        let av = inner(field(v, k));
                        match (jv, av) {
                            (Json::Null, Avro::Null) => {}
                            (Json::Number(n), Avro::Int(i)) => assert_eq!(n.as_i64(), Some(i64::from(*i)), "{k}"),
                            (Json::Number(n), Avro::Long(i)) => assert_eq!(n.as_i64(), Some(*i), "{k}"),
                            (Json::String(s), Avro::String(a)) => assert_eq!(s, a, "{k}"),
                            (j, a) => assert!(json_matches(j, a), "{k}: {j} vs {a:?}"),
                        }
                    }
                }
                (j, _) => panic!("{image}: {j}"),
            }
        }
    }
}

/// Values whose Avro form is not the JSON one (decimals, timestamps) compared by their meaning.
fn json_matches(j: &Json, a: &Avro) -> bool {
    match a {
        Avro::Decimal(_) => j.is_number(),
        Avro::TimestampMicros(m) | Avro::LocalTimestampMicros(m) => {
            j.as_str().and_then(avro::parse_timestamp) == Some(*m)
        }
        Avro::Boolean(b) => j.as_bool() == Some(*b),
        Avro::Double(d) => j.as_f64() == Some(*d),
        _ => false,
    }
}

#[test]
fn types_map_as_documented() {
    let t = TypeRegistry::new();
    // numeric(10,2): typmod = (10 << 16 | 2) + 4
    assert_eq!(avro::column_ty(&t, 1700, (10 << 16 | 2) + 4), Ty::Decimal { precision: 10, scale: 2 });
    assert_eq!(avro::column_ty(&t, 1700, -1), Ty::String);
    // numeric(3,-2) (PostgreSQL 15): the exact text.
    assert_eq!(avro::column_ty(&t, 1700, (3 << 16 | (0x800 - 2)) + 4), Ty::String);
    assert_eq!(avro::column_ty(&t, 2950, -1).schema(), json!({"type": "string", "logicalType": "uuid"}));
    // Values, read back with apache-avro's reader.
    let read = |ty: &Ty, raw: &str| {
        let schema = Schema::parse(&json!(["null", ty.schema()])).unwrap();
        let mut out = Vec::new();
        avro::write_nullable(ty, Some(raw), &mut out).unwrap();
        inner(&read_datum(&schema, &out)).clone()
    };
    let dec = Ty::Decimal { precision: 10, scale: 2 };
    assert_eq!(decimal(&read(&dec, "-12.5")), BigInt::from(-1250));
    assert_eq!(decimal(&read(&dec, "99999999.99")), BigInt::from(9_999_999_999i64));
    assert_eq!(decimal(&read(&dec, "0")), BigInt::from(0));
    assert!(dec.write("1.234", &mut Vec::new()).is_err(), "more digits than the scale");
    assert_eq!(read(&dec, "\"NaN\""), Avro::Null);
    assert_eq!(read(&Ty::Long, "-9223372036854775808"), Avro::Long(i64::MIN));
    assert!(Ty::Int.write("2147483648", &mut Vec::new()).is_err());
    assert_eq!(read(&Ty::String, r#""a \"quoted\" \u00e9""#), Avro::String("a \"quoted\" é".into()));
    assert_eq!(read(&Ty::String, "12.50"), Avro::String("12.50".into()), "a computed number as text");
    assert_eq!(read(&Ty::Array(Box::new(Ty::Int)), "[]"), Avro::Array(vec![]));
    assert_eq!(read(&Ty::Boolean, "false"), Avro::Boolean(false));
    assert!(matches!(read(&Ty::Double, "\"-Infinity\""), Avro::Double(d) if d == f64::NEG_INFINITY));
}

#[test]
fn dates_and_times_convert_exactly() {
    assert_eq!(avro::parse_date("1970-01-01"), Some(0));
    assert_eq!(avro::parse_date("2000-03-01"), Some(11017));
    assert_eq!(avro::parse_date("1969-12-31"), Some(-1));
    // 1 BC is astronomical year 0, a leap year.
    assert_eq!(avro::parse_date("0000-03-01").unwrap() - avro::parse_date("0000-02-28").unwrap(), 2);
    assert_eq!(avro::parse_date("+10000-01-01"), Some(2_932_897));
    assert_eq!(avro::parse_date("infinity"), Some(i32::MAX));
    assert_eq!(avro::parse_time("24:00:00"), Some(86_400_000_000));
    assert_eq!(avro::parse_time("00:00:00.000001"), Some(1));
    assert_eq!(avro::parse_timestamp("1970-01-01T00:00:00.5Z"), Some(500_000));
    assert_eq!(avro::parse_timestamp("1970-01-01T01:00:00+01:00"), Some(0));
    assert_eq!(avro::parse_timestamp("1969-12-31T23:59:59.999999Z"), Some(-1));
    assert_eq!(avro::parse_timestamp("-infinity"), Some(i64::MIN));
    assert_eq!(avro::parse_timestamp("garbage"), None);
}

#[test]
fn names_become_avro_names() {
    assert_eq!(avro::avro_name("order id"), "order_id");
    assert_eq!(avro::avro_name("1st"), "_1st");
    assert_eq!(avro::avro_name("straße"), "stra_e");
}

#[test]
fn subjects_follow_the_topic() {
    let per_table = Subjects { topic: "cdc.{schema}.{table}".into(), database: "shop".into() };
    assert_eq!(
        per_table.of("public", "orders", "shop.public.orders", None),
        ("cdc.public.orders-value".to_string(), "cdc.public.orders-key".to_string())
    );
    let shared = Subjects { topic: "orders.fulfillment".into(), database: "shop".into() };
    assert_eq!(
        shared.of("public", "orders", "shop.public.orders", None),
        (
            "orders.fulfillment-shop.public.orders.Envelope".to_string(),
            "orders.fulfillment-shop.public.orders.Key".to_string()
        )
    );
    // A table version with a topic of its own (cdc_create_version_topic): fresh subjects, so the
    // registry's compatibility check of the table's topic does not refuse its break.
    assert_eq!(
        per_table.of("public", "orders", "shop.public.orders", Some(3)),
        ("cdc.public.orders.v3-value".to_string(), "cdc.public.orders.v3-key".to_string())
    );
    assert_eq!(
        shared.of("public", "orders", "shop.public.orders", Some(3)).0,
        "orders.fulfillment.v3-shop.public.orders.Envelope"
    );
}

#[test]
fn an_unchanged_toast_column_is_null_and_listed() {
    let (events, t) = captured("toast", "docs_default", config(&["id"]));
    let mut listed = 0;
    for (plan, ev) in &events {
        let (read, _) = round_trip(plan, &t, ev);
        let json: Json = serde_json::from_slice(&ev.payload).unwrap();
        if let Some(cols) = json["metadata"]["unchanged_toast_columns"].as_array() {
            listed += 1;
            let names: Vec<Avro> = cols.iter().map(|c| Avro::String(c.as_str().unwrap().into())).collect();
            assert_eq!(inner(field(field(&read, "metadata"), "unchanged_toast_columns")), &Avro::Array(names));
            for c in cols {
                assert_eq!(field(field(&read, "after"), c.as_str().unwrap()), &Avro::Union(0, Box::new(Avro::Null)));
            }
        }
    }
    assert!(listed > 0, "the capture has an update that leaves a TOASTed value out");
}

#[test]
fn a_registry_url_is_shown_without_its_credentials() {
    use super::schema_registry::label;
    assert_eq!(label("https://user:s3cret@registry:8081/api"), "https://***@registry:8081/api");
    assert_eq!(label("http://registry:8081"), "http://registry:8081");
}

/// Regression: PostgreSQL's largest timestamp (294276-12-31) is past what a long of microseconds
/// from 1970 holds; encoding it stopped the sink. It is written as the long's extreme, as
/// `infinity` is (the README says so).
#[test]
fn every_event_of_the_golden_type_capture_encodes_even_at_the_calendars_ends() {
    let mut cfg = config(&["id"]);
    cfg.exclude_columns = vec!["c_int_matrix".into()];
    let (events, t) = captured("types", "all_types", cfg);
    let reads: Vec<Avro> = events.iter().map(|(plan, ev)| round_trip(plan, &t, ev).0).collect();
    let after = |i: usize, n: &str| inner(field(field(&reads[i], "after"), n)).clone();
    assert_eq!(after(3, "c_timestamptz"), Avro::TimestampMicros(i64::MAX), "294276-12-31T23:59:59.999999Z");
    assert_eq!(after(2, "c_timestamptz"), Avro::TimestampMicros(i64::MAX), "infinity");
    assert_eq!(after(2, "c_timestamp"), Avro::LocalTimestampMicros(i64::MIN), "-infinity");
    assert_eq!(after(1, "c_date"), Avro::Date(-735_160), "0044-03-15 BC");
    assert_eq!(after(3, "c_date"), Avro::Date(-2_440_550), "4713-01-01 BC");
}
