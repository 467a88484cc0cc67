use std::collections::HashMap;
use std::sync::Arc;

use cdc_core::envelope::{Event, Op};
use cdc_core::schema::{Change, Field};
use cdc_core::types::TypeRegistry;
use cdc_core::Lsn;
use serde_json::json;
use serde_json::value::RawValue;

use super::config::parse;
use super::values::{iso_to_pg, text_array, to_text, ValueKind};
use super::*;

fn raw(s: &str) -> Box<RawValue> {
    RawValue::from_string(s.to_string()).unwrap()
}

fn text(kind: &ValueKind, json: &str) -> Option<String> {
    to_text(kind, &raw(json)).unwrap()
}

/// A JSON event as the envelope writes it (the metadata fields the parser requires).
fn event(op: Op, commit: u64, lsn: u64, before: Option<&str>, after: Option<&str>, toast: &[&str]) -> Event {
    let toast = if toast.is_empty() {
        String::new()
    } else {
        format!(",\"unchanged_toast_columns\":{}", serde_json::to_string(toast).unwrap())
    };
    let payload = format!(
        "{{\"metadata\":{{\"source\":\"pg_cdc\",\"database\":\"db\",\"schema\":\"public\",\"table\":\"t\",\
         \"operation\":\"{}\",\"timestamp\":\"2026-01-01T00:00:00Z\",\"lsn\":{lsn},\"commit_lsn\":{commit},\
         \"transaction_id\":7{toast}}},\"before\":{},\"after\":{}}}",
        op.as_str(),
        before.unwrap_or("null"),
        after.unwrap_or("null")
    );
    Event {
        table_oid: 1,
        schema: Arc::from("public"),
        table: Arc::from("t"),
        op,
        lsn: Lsn(lsn),
        commit_lsn: Lsn(commit),
        index: 1,
        key: None,
        payload: payload.into_bytes(),
        tombstone: false,
        topic_version: None,
        schema_version: None,
        routes: Vec::new(),
    }
}

#[test]
fn values_read_back_as_postgresql_text() {
    assert_eq!(text(&ValueKind::Other, "null"), None);
    assert_eq!(
        text(&ValueKind::Other, "12345678901234567890.000000000000000001").unwrap(),
        "12345678901234567890.000000000000000001"
    );
    assert_eq!(text(&ValueKind::Other, "\"NaN\"").unwrap(), "NaN");
    assert_eq!(text(&ValueKind::Bool, "true").unwrap(), "t");
    assert_eq!(text(&ValueKind::Bool, "false").unwrap(), "f");
    assert_eq!(text(&ValueKind::Bytea, "\"AAH/\"").unwrap(), "\\x0001ff");
    assert_eq!(text(&ValueKind::Json, "{\"a\": [1, 2.50]}").unwrap(), "{\"a\": [1, 2.50]}");
    assert_eq!(text(&ValueKind::Json, "\"just a string\"").unwrap(), "\"just a string\"");
    assert_eq!(text(&ValueKind::Other, "\"a \\\"quoted\\\" \\\\ text\"").unwrap(), "a \"quoted\" \\ text");
    assert_eq!(text(&ValueKind::DateTime, "\"2024-03-15T14:23:45.123456Z\"").unwrap(), "2024-03-15T14:23:45.123456Z");
    assert_eq!(text(&ValueKind::DateTime, "\"infinity\"").unwrap(), "infinity");
    let ints = ValueKind::Array(Box::new(ValueKind::Other));
    assert_eq!(text(&ints, "[[1,2],[3,null]]").unwrap(), "{{\"1\",\"2\"},{\"3\",NULL}}");
    assert_eq!(text(&ints, "[]").unwrap(), "{}");
    assert_eq!(text(&ints, "[\"a,b\",\"c\\\"d\",\"NULL\"]").unwrap(), "{\"a,b\",\"c\\\"d\",\"NULL\"}");
    let blobs = ValueKind::Array(Box::new(ValueKind::Bytea));
    assert_eq!(text(&blobs, "[\"AAH/\",null]").unwrap(), "{\"\\\\x0001ff\",NULL}");
    let docs = ValueKind::Array(Box::new(ValueKind::Json));
    assert_eq!(text(&docs, "[{\"a\":1},[1,2]]").unwrap(), "{\"{\\\"a\\\":1}\",\"[1,2]\"}");
    assert!(to_text(&ints, &raw("{\"a\":1}")).is_err());
    assert!(to_text(&ValueKind::Bytea, &raw("\"not base64!\"")).is_err());
    assert_eq!(text_array([Some("x"), None, Some("\"")]), "{\"x\",NULL,\"\\\"\"}");
}

/// BC dates and timestamps: PostgreSQL's text, through the event's JSON (cdc_core::value), back
/// to the same text.
#[test]
fn bc_dates_round_trip_through_the_event() {
    let types = TypeRegistry::new();
    for (oid, pg) in [
        (1082u32, "4713-01-01 BC"),
        (1082, "0001-01-01 BC"),
        (1184, "0044-03-15 12:00:00+00 BC"),
        (1114, "0044-03-15 12:00:00.5 BC"),
    ] {
        let mut json = Vec::new();
        cdc_core::value::write_value(&mut json, &types, oid, pg.as_bytes());
        let back = text(&ValueKind::DateTime, std::str::from_utf8(&json).unwrap()).unwrap();
        assert_eq!(back.replace('T', " "), pg, "{oid} {pg} via {}", String::from_utf8_lossy(&json));
    }
    assert_eq!(iso_to_pg("2024-01-01"), "2024-01-01");
}

#[test]
fn kinds_from_the_catalog() {
    assert_eq!(ValueKind::of(16, "B", 0), ValueKind::Bool);
    assert_eq!(ValueKind::of(3802, "U", 0), ValueKind::Json);
    assert_eq!(ValueKind::of(1001, "A", 17), ValueKind::Array(Box::new(ValueKind::Bytea)));
    assert_eq!(ValueKind::of(1700, "N", 0), ValueKind::Other);
}

#[test]
fn config_refuses_a_password_and_what_the_sink_cannot_do() {
    let ok = parse(&json!({"connection": "host=/tmp dbname=target user=apply"})).unwrap();
    assert!(ok.create_tables);
    assert_eq!(ok.tombstone_retention_hours, 168);
    assert_eq!(ok.state_schema, "cdc_apply");
    assert_eq!(ok.schema, None);
    let err = |v: serde_json::Value| {
        let e = parse(&v).unwrap_err();
        (e.kind.sqlstate().to_string(), e.message.clone())
    };
    for bad in [
        json!({"connection": "host=/tmp password=secret"}),
        json!({"connection": "postgresql://apply:secret@localhost/target"}),
    ] {
        let (state, msg) = err(bad);
        assert_eq!(state, "22023");
        assert!(msg.contains("must not hold a password") && !msg.contains("secret"), "{msg}");
    }
    let (state, msg) = err(json!({"connection": "host=/tmp dbname='unterminated"}));
    assert_eq!(state, "22023");
    assert!(msg.contains("not a valid connection string"), "{msg}");
    assert_eq!(err(json!({})).0, "22023");
    assert_eq!(err(json!({"connection": "dbname=t", "format": "avro"})).0, "22023");
    assert_eq!(err(json!({"connection": "dbname=t", "partition_key": "id"})).0, "22023");
    assert_eq!(err(json!({"connection": "dbname=t", "schema": "no spaces"})).0, "22023");
    assert_eq!(err(json!({"connection": "dbname=t", "state_schema": "pg_mine"})).0, "22023");
    assert_eq!(err(json!({"connection": "dbname=t", "tombstone_retention_hours": 0})).0, "22023");
    // A service file or a password file is how a password is given.
    assert!(parse(&json!({"connection": "service=analytics"})).is_ok());
    assert!(parse(&json!({"connection": "host=h dbname=t passfile=/etc/pg_cdc/pgpass"})).is_ok());
}

fn ch(key: &str, version: Version, op: RowOp) -> RowChange {
    RowChange { key: key.into(), version, op }
}

fn up(cols: &[(&str, &str)]) -> RowOp {
    RowOp::Upsert(cols.iter().map(|(n, v)| (n.to_string(), Some(v.to_string()))).collect())
}

#[test]
fn fold_keeps_what_is_newer_than_the_target() {
    let ins = ch("k", (10, 5), up(&[("id", "1"), ("a", "1"), ("b", "1")]));
    let upd = ch("k", (20, 15), up(&[("id", "1"), ("a", "2")])); // b unchanged (TOAST)
    let del = ch("k", (30, 25), RowOp::Delete);
    // In any order, with repeats: the newest wins, partial images merged over older ones.
    assert_eq!(fold(&[&upd, &ins, &upd], (0, 0)), Some((up(&[("id", "1"), ("a", "2"), ("b", "1")]), (20, 15))));
    assert_eq!(fold(&[&del, &ins, &upd], (0, 0)), Some((RowOp::Delete, (30, 25))));
    // The target has the update: the insert is stale, nothing to do.
    assert_eq!(fold(&[&ins], (20, 15)), None);
    // A tombstone at (30, 25): a late insert cannot bring the row back.
    assert_eq!(fold(&[&ins, &upd], (30, 25)), None);
    // Re-inserted after the delete: a fresh row, not merged with what the delete removed.
    let again = ch("k", (40, 35), up(&[("id", "1"), ("a", "9")]));
    assert_eq!(fold(&[&again, &del, &ins], (0, 0)), Some((up(&[("id", "1"), ("a", "9")]), (40, 35))));
}

/// A source of random changes on a few keys; its change stream shuffled, repeated and cut into
/// random units, applied as the sink does (fold against the stored versions, versions written
/// after each unit), must leave the table the source has.
#[test]
fn a_shuffled_and_repeated_stream_leaves_the_source_table() {
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..200 {
        let mut source: HashMap<String, Vec<(String, Option<String>)>> = HashMap::new();
        let mut stream: Vec<RowChange> = Vec::new();
        let mut lsn = 100u64;
        for _txn in 0..30 {
            let n = 1 + rnd(4);
            let commit = lsn + 10 * n + 5;
            for _ in 0..n {
                lsn += 10;
                let key = format!("{{\"id\":{}}}", rnd(6));
                let op = if source.contains_key(&key) && rnd(3) == 0 {
                    source.remove(&key);
                    RowOp::Delete
                } else {
                    let cols = vec![("id".to_string(), Some(key.clone())), ("v".to_string(), Some(lsn.to_string()))];
                    source.insert(key.clone(), cols.clone());
                    RowOp::Upsert(cols)
                };
                stream.push(ch(&key, (commit, lsn), op));
            }
            lsn = commit;
        }
        // Shuffle, repeat a third of it, cut into units.
        let mut delivered = stream.clone();
        for c in &stream {
            if rnd(3) == 0 {
                delivered.push(c.clone());
            }
        }
        for i in (1..delivered.len()).rev() {
            delivered.swap(i, rnd(i as u64 + 1) as usize);
        }
        let mut target: HashMap<String, Vec<(String, Option<String>)>> = HashMap::new();
        let mut versions: HashMap<String, Version> = HashMap::new();
        let mut rest = &delivered[..];
        while !rest.is_empty() {
            let take = (1 + rnd(12) as usize).min(rest.len());
            let (unit, tail) = rest.split_at(take);
            rest = tail;
            let mut by_key: HashMap<&str, Vec<&RowChange>> = HashMap::new();
            for c in unit {
                by_key.entry(c.key.as_str()).or_default().push(c);
            }
            for (key, list) in by_key {
                let stored = versions.get(key).copied().unwrap_or((0, 0));
                if let Some((op, v)) = fold(&list, stored) {
                    match op {
                        RowOp::Delete => {
                            target.remove(key);
                        }
                        RowOp::Upsert(cols) => {
                            target.insert(key.to_string(), cols);
                        }
                    }
                    versions.insert(key.to_string(), v);
                }
            }
        }
        assert_eq!(target, source, "round {round}");
    }
}

#[test]
fn events_become_row_changes() {
    let key = vec!["id".to_string()];
    let ins = event(Op::Insert, 100, 90, None, Some("{\"id\":1,\"doc\":{\"a\": 1},\"n\":1.50}"), &[]);
    let Applied::Rows(rows) = read_event(&ins, &key).unwrap() else { panic!() };
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].key, "{\"id\":1}");
    assert_eq!(rows[0].version, (100, 90));
    assert_eq!(
        rows[0].op,
        RowOp::Upsert(vec![
            ("id".into(), Some("1".into())),
            ("doc".into(), Some("{\"a\": 1}".into())),
            ("n".into(), Some("1.50".into()))
        ])
    );
    // An UPDATE that moves the key: the old key deleted, the new one written, at one version.
    let moved = event(Op::Update, 200, 190, Some("{\"id\":1}"), Some("{\"id\":2,\"big\":null}"), &["big"]);
    let Applied::Rows(rows) = read_event(&moved, &key).unwrap() else { panic!() };
    assert_eq!(rows[0], ch("{\"id\":1}", (200, 190), RowOp::Delete));
    // The unchanged TOAST column is left out: the target keeps its value.
    assert_eq!(rows[1], ch("{\"id\":2}", (200, 190), RowOp::Upsert(vec![("id".into(), Some("2".into()))])));
    let del = event(Op::Delete, 300, 290, Some("{\"id\":2}"), None, &[]);
    assert_eq!(read_event(&del, &key).unwrap(), Applied::Rows(vec![ch("{\"id\":2}", (300, 290), RowOp::Delete)]));
    let mut trunc = event(Op::Truncate, 400, 390, None, None, &[]);
    trunc.payload.clear();
    assert_eq!(read_event(&trunc, &key).unwrap(), Applied::Truncate((400, 390)));
    let err = read_event(&ins, &[]).unwrap_err();
    assert!(err.contains("has no key"), "{err}");
    let err = read_event(&del, &["other".to_string()]).unwrap_err();
    assert!(err.contains("lacks its key columns"), "{err}");
}

fn field(attnum: i16, name: &str, ty: &str, missing: Option<&str>) -> Field {
    Field {
        attnum,
        name: name.into(),
        type_sql: ty.into(),
        type_oid: 0,
        typmod: -1,
        not_null: false,
        default: None,
        missing: missing.map(str::to_string),
    }
}

#[test]
fn target_tables_follow_the_source_schema() {
    let fields = vec![field(1, "id", "bigint", None), field(2, "Total", "numeric(10,2)", None)];
    assert_eq!(
        create_table_sql("app", "orders", &fields, &["id".into()]),
        "CREATE SCHEMA IF NOT EXISTS \"app\"; CREATE TABLE \"app\".\"orders\" (\"id\" bigint, \"Total\" numeric(10,2), \
         PRIMARY KEY (\"id\"))"
    );
    let changes = vec![
        Change::DropField { field: field(3, "gone", "text", None) },
        Change::RenameField {
            from: field(2, "Total", "numeric(10,2)", None),
            to: field(2, "amount", "numeric(10,2)", None),
        },
        Change::ChangeType {
            from: field(2, "amount", "numeric(10,2)", None),
            to: field(2, "amount", "numeric(12,2)", None),
        },
        Change::AddField { field: field(4, "status", "text", Some("it's new")) },
        Change::AddField { field: field(5, "note", "text", None) },
        Change::SetRequired { field: field(5, "note", "text", None) },
    ];
    assert_eq!(
        alter_statements("t", &changes),
        vec![
            "ALTER TABLE t DROP COLUMN IF EXISTS \"gone\"",
            "ALTER TABLE t RENAME COLUMN \"Total\" TO \"amount\"",
            "ALTER TABLE t ALTER COLUMN \"amount\" TYPE numeric(12,2) USING \"amount\"::numeric(12,2)",
            "ALTER TABLE t ADD COLUMN \"status\" text DEFAULT 'it''s new'::text",
            "ALTER TABLE t ALTER COLUMN \"status\" DROP DEFAULT",
            "ALTER TABLE t ADD COLUMN \"note\" text",
        ]
    );
}

#[test]
fn errors_are_classed() {
    let e = |s: &str| TargetError { sqlstate: s.into(), message: String::new(), connection: false };
    assert_eq!(e("40001").class(), ErrorClass::Retry);
    assert_eq!(e("57P01").class(), ErrorClass::Retry);
    assert_eq!(e("42501").class(), ErrorClass::Operator);
    assert_eq!(e("22P02").class(), ErrorClass::Operator);
    assert_eq!(TargetError::connection("gone".into()).class(), ErrorClass::Retry);
}
