//! The pipeline on real pgoutput captures: events field by field.
use serde_json::{json, Value};

use super::*;
use crate::testutil::{config, events, frames, relation_oids, run, types};

fn orders_config() -> CaptureConfig {
    let mut c = config(&["order_id"]);
    c.include_columns =
        Some(["order_id", "customer_id", "total", "status", "customer_region"].map(String::from).to_vec());
    c.before_image = true;
    c.include_transaction_info = true;
    c
}

#[test]
fn insert_update_delete_events() {
    let txns = run("basic", vec![("orders", orders_config()), ("plain", config(&["id"]))]);
    let ev = events(&txns);
    let ops: Vec<&str> = ev.iter().map(|(_, p)| p["metadata"]["operation"].as_str().unwrap()).collect();
    assert_eq!(
        ops,
        [
            "INSERT", "UPDATE", "INSERT", "INSERT", "DELETE", "UPDATE", "DELETE", "INSERT", "UPDATE", "DELETE",
            "UPDATE", "DELETE", "TRUNCATE", "TRUNCATE"
        ]
    );

    // INSERT: numeric keeps its text, excluded columns are absent, the key is the key columns.
    let (key, ins) = &ev[0];
    assert_eq!(key.as_ref().unwrap(), &json!({"order_id": "ORD-12345"}));
    let md = &ins["metadata"];
    assert_eq!(md["source"], "pg_cdc");
    assert_eq!(md["database"], "golden");
    assert_eq!(md["schema"], "public");
    assert_eq!(md["table"], "orders");
    assert!(md["lsn"].as_u64().unwrap() > 0);
    assert!(md["commit_lsn"].as_u64().unwrap() >= md["lsn"].as_u64().unwrap());
    assert!(md["transaction_id"].as_u64().unwrap() > 0);
    let ts = md["timestamp"].as_str().unwrap();
    assert!(ts.len() == 24 && ts.ends_with('Z') && &ts[10..11] == "T", "{ts}");
    assert_eq!(md["transaction"]["event_index"], 1);
    assert_eq!(md["transaction"]["event_count"], 1);
    assert_eq!(md["transaction"]["commit_lsn"], md["commit_lsn"]);
    assert_eq!(ins["before"], Value::Null);
    assert_eq!(
        ins["after"],
        json!({"order_id": "ORD-12345", "customer_id": "CUST-789", "total": 150.00, "status": "pending", "customer_region": "us-east"})
    );
    let raw = String::from_utf8(txns[0].events[0].payload.clone()).unwrap();
    assert!(raw.contains("\"total\":150.00"), "numeric text kept verbatim: {raw}");
    assert!(!raw.contains("internal_notes") && !raw.contains("do not publish"));

    // UPDATE: before image, after image, diff of the changed column only.
    let (_, upd) = &ev[1];
    assert_eq!(upd["before"]["status"], "pending");
    assert_eq!(upd["after"]["status"], "confirmed");
    assert_eq!(upd["before"]["total"], json!(150.00));
    assert_eq!(upd["diff"], json!({"status": {"from": "pending", "to": "confirmed"}}));

    // The multi-row transaction: the savepoint's rollback and the aborted transaction are absent;
    // the key change retracts the old key before the update; positions count 1..4 of 4.
    let multi = &txns[2];
    let idx: Vec<u64> = events(std::slice::from_ref(multi))
        .iter()
        .map(|(_, p)| p["metadata"]["transaction"]["event_index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, [1, 2, 3, 4]);
    assert!(events(std::slice::from_ref(multi)).iter().all(|(_, p)| p["metadata"]["transaction"]["event_count"] == 4));
    assert_eq!(ev[4].0.as_ref().unwrap(), &json!({"order_id": "ORD-3"}));
    assert_eq!(ev[4].1["before"]["order_id"], "ORD-3");
    assert_eq!(ev[4].1["after"], Value::Null);
    assert_eq!(ev[5].0.as_ref().unwrap(), &json!({"order_id": "ORD-3B"}));
    assert_eq!(ev[5].1["diff"], json!({"order_id": {"from": "ORD-3", "to": "ORD-3B"}}));
    let all = serde_json::to_string(&ev.iter().map(|e| &e.1).collect::<Vec<_>>()).unwrap();
    assert!(!all.contains("ORD-ROLLED-BACK") && !all.contains("ORD-ABORTED"));

    // DELETE with a full before image.
    assert_eq!(ev[6].1["before"]["customer_id"], "CUST-1");
    assert_eq!(ev[6].1["after"], Value::Null);

    // Default identity: update has no before image and no diff; delete carries the key only.
    assert_eq!(ev[8].1["before"], Value::Null);
    assert!(ev[8].1.get("diff").is_none());
    assert_eq!(ev[8].1["after"], json!({"id": 1, "v": "uno"}));
    assert_eq!(ev[9].1["before"], json!({"id": 1}), "old key of the key change");
    assert_eq!(ev[10].1["after"], json!({"id": 2, "v": "uno"}));
    assert_eq!(ev[11].1["before"], json!({"id": 2}));

    // TRUNCATE: one event per table, no key, options recorded.
    assert_eq!(ev[12].0, None);
    assert_eq!(ev[12].1["metadata"]["truncate"], json!({"cascade": false, "restart_identity": true}));
}

#[test]
fn operations_and_sink_tables_filter_events() {
    let mut c = orders_config();
    c.operations = crate::config::Operations { insert: true, update: false, delete: false, truncate: false };
    let ev = events(&run("basic", vec![("orders", c)]));
    assert!(ev.iter().all(|(_, p)| p["metadata"]["operation"] == "INSERT" && p["metadata"]["table"] == "orders"));
    assert_eq!(ev.len(), 3);
    // Transactions with nothing for this sink still come out (so the slot can move past them).
    let txns = run("basic", vec![("plain", config(&["id"]))]);
    assert!(txns.iter().any(|t| t.events.is_empty()));
}

#[test]
fn partition_key_keys_messages() {
    let mut c = orders_config();
    c.partition_key = Some("customer_region".into());
    let ev = events(&run("basic", vec![("orders", c)]));
    assert_eq!(ev[0].0.as_ref().unwrap(), &json!({"customer_region": "us-east"}));
}

#[test]
fn every_type_family_converts_without_loss() {
    let ev = events(&run("types", vec![("all_types", config(&["id"]))]));
    assert_eq!(ev.len(), 5);
    let a = &ev[0].1["after"];
    let expect = json!({
        "id": 1, "c_bool": true, "c_int2": -32768, "c_int4": 2147483647, "c_int8": -9223372036854775808i64,
        "c_oid": 4294967295u32, "c_float4": 1.5, "c_float8": std::f64::consts::PI,
        "c_money": "$12.34", "c_text": "multi\nline \"quoted\" \\ back", "c_varchar": "varchar", "c_char": "ab   ",
        "c_name": "a_name", "c_bytea": "3q2+7w==", "c_uuid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "c_json": {"a": [1, 2.50, "x"]}, "c_jsonb": {"b": {"c": null}}, "c_xml": "<r>x</r>",
        "c_date": "2024-02-29", "c_time": "14:23:45.123", "c_timetz": "14:23:45+05:30",
        "c_timestamp": "2024-03-15T14:23:45.123456", "c_timestamptz": "2024-03-15T14:23:45.123456Z",
        "c_interval": "P1Y2M3DT4H5M6.7S", "c_inet": "192.168.0.1/24", "c_cidr": "10.0.0.0/8",
        "c_macaddr": "08:00:2b:01:02:03", "c_bit": "1010", "c_varbit": "101", "c_point": "(1.5,2)",
        "c_box": "(1,1),(0,0)", "c_tsvector": "'a' 'cat' 'fat'", "c_int4range": "[1,10)",
        "c_tstzrange": "[\"2024-01-01 00:00:00+00\",\"2024-02-01 00:00:00+00\")",
        "c_int_array": [1, null, 3], "c_text_array": ["a b", null, "NULL", "q\"x", "back\\slash"],
        "c_int_matrix": [[1, 2], [3, 4]], "c_timestamptz_array": ["2024-01-01T00:00:00Z", "infinity"],
        "c_jsonb_array": [{"k": 1}, null], "c_box_array": ["(1,1),(0,0)", "(3,3),(2,2)"],
        "c_enum": "happy", "c_enum_array": ["sad", null, "ok"], "c_domain_text": "short",
        "c_composite": "(\"Main St, 1\",12345)", "c_composite_array": ["(\"a \"\"b\"\"\",1)", null],
        "c_pg_lsn": "16/B374D848"
    });
    for (k, v) in expect.as_object().unwrap() {
        assert_eq!(&a[k], v, "column {k}");
    }
    // Exact decimal text, checked on the raw bytes (a JSON parser would round them).
    let raw =
        String::from_utf8(run("types", vec![("all_types", config(&["id"]))])[0].events[0].payload.clone()).unwrap();
    for text in [
        "\"c_numeric\":12345678901234567890.123456789",
        "\"c_numeric_scaled\":150.0000",
        "\"c_numeric_array\":[1.10,\"NaN\",-0.5]",
        "\"c_domain\":42.50",
    ] {
        assert!(raw.contains(text), "{text} in {raw}");
    }
    // NaN, infinities, BC dates, huge years.
    let b = &ev[1].1["after"];
    assert_eq!(b["c_float4"], "NaN");
    assert_eq!(b["c_float8"], "Infinity");
    assert_eq!(b["c_numeric"], "NaN");
    assert_eq!(b["c_date"], "-0043-03-15");
    assert_eq!(b["c_timestamp"], "-0043-03-15T12:00:00");
    assert_eq!(b["c_timestamptz"], "-0043-03-15T12:00:00Z");
    assert_eq!(b["c_bytea"], "");
    assert_eq!(b["c_text"], "");
    assert_eq!(b["c_int4"], Value::Null);
    let c = &ev[2].1["after"];
    assert_eq!(c["c_float4"], "-Infinity");
    assert_eq!(c["c_float8"], json!(-0.0));
    assert_eq!(c["c_numeric"], "-Infinity");
    assert_eq!(c["c_date"], "infinity");
    assert_eq!(c["c_timestamp"], "-infinity");
    assert_eq!(c["c_timestamptz"], "infinity");
    let d = &ev[3].1["after"];
    assert_eq!(d["c_numeric"], "Infinity");
    assert_eq!(d["c_date"], "-4712-01-01");
    assert_eq!(d["c_timestamptz"], "+294276-12-31T23:59:59.999999Z");
    assert_eq!(d["c_int_array"], json!([7, 8]));
    assert_eq!(d["c_text"], "unicode: é 漢 🙂");
    // Every column present, NULLs as null.
    assert_eq!(ev[4].1["after"].as_object().unwrap().len(), a.as_object().unwrap().len());
}

#[test]
fn unchanged_toast_is_never_null() {
    let mut full = config(&["id"]);
    full.before_image = true;
    let ev = events(&run("toast", vec![("docs_full", full), ("docs_default", config(&["id"]))]));
    let body = ev[0].1["after"]["body"].as_str().unwrap().to_string();
    assert_eq!(body.len(), 300 * 32);
    // REPLICA IDENTITY FULL: the full value, taken from the old row; no diff entry for it.
    let upd_full = &ev[2].1;
    assert_eq!(upd_full["metadata"]["table"], "docs_full");
    assert_eq!(upd_full["after"]["body"], body.as_str());
    assert_eq!(upd_full["after"]["title"], "v2");
    assert_eq!(upd_full["diff"], json!({"title": {"from": "v1", "to": "v2"}}));
    assert!(upd_full["metadata"].get("unchanged_toast_columns").is_none());
    // Default identity: the value is not in the WAL; the event says so instead of sending null.
    let upd_default = &ev[3].1;
    assert_eq!(upd_default["metadata"]["table"], "docs_default");
    assert!(upd_default["after"].get("body").is_none());
    assert_eq!(upd_default["metadata"]["unchanged_toast_columns"], json!(["body"]));
    assert_eq!(upd_default["after"]["title"], "v2");
    // DELETE under FULL carries the whole old row, large value included.
    assert_eq!(ev[4].1["before"]["body"], body.as_str());
}

#[test]
fn same_wal_encodes_to_the_same_bytes() {
    for name in ["basic", "types", "toast"] {
        let fr = frames(name);
        let oids = relation_oids(&fr);
        let sink: SinkTables = oids.values().map(|&o| (o, Arc::new(config(&[])))).collect();
        let t = types(name);
        let a = Assembler::new("db").process(&fr, &sink, &t).unwrap();
        let b = Assembler::new("db").process(&fr, &sink, &t).unwrap();
        let bytes = |o: &BatchOutput| {
            o.transactions.iter().flat_map(|t| t.events.iter().map(|e| e.payload.clone())).collect::<Vec<_>>()
        };
        assert_eq!(bytes(&a), bytes(&b), "{name}");
    }
}

#[test]
fn incomplete_transaction_is_held_back() {
    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let sink: SinkTables = [(oids["orders"], Arc::new(orders_config()))].into_iter().collect();
    // Cut inside the third transaction (after its Begin and first Insert).
    let cut = fr.iter().enumerate().filter(|(_, f)| f.data[0] == b'B').nth(2).unwrap().0 + 2;
    let out = Assembler::new("db").process(&fr[..cut], &sink, &types("basic")).unwrap();
    assert_eq!(out.transactions.len(), 2);
    assert_eq!(out.held_back_frames, 2);
    assert_eq!(out.confirm_lsn, Some(out.transactions[1].end_lsn));
}

#[test]
fn heartbeat_message_moves_the_confirm_point() {
    let mut m = vec![b'M', 0];
    m.extend_from_slice(&1000u64.to_be_bytes());
    m.extend_from_slice(HEARTBEAT_PREFIX.as_bytes());
    m.push(0);
    m.extend_from_slice(&0u32.to_be_bytes());
    let out = Assembler::new("db")
        .process(&[RawFrame { lsn: Lsn(1000), data: m }], &SinkTables::new(), &TypeRegistry::new())
        .unwrap();
    assert_eq!(out.confirm_lsn, Some(Lsn(1000)));
    assert!(out.transactions.is_empty());
}

#[test]
fn protocol_violations_are_errors() {
    let fr = frames("basic");
    // A change without its Begin.
    let err = Assembler::new("db").process(&fr[2..3], &SinkTables::new(), &TypeRegistry::new()).unwrap_err();
    assert!(matches!(err, PipelineError::Protocol { .. }), "{err}");
    let bad = RawFrame { lsn: Lsn(1), data: vec![b'?'] };
    assert!(matches!(
        Assembler::new("db").process(&[bad], &SinkTables::new(), &TypeRegistry::new()),
        Err(PipelineError::Decode { .. })
    ));
}

/// Every transaction decoded in two passes, fed in chunks of any size, encodes to exactly the
/// bytes of the one-pass path: the large-transaction path changes memory use, never output.
#[test]
fn large_transaction_passes_match_the_buffered_path() {
    for name in ["basic", "types", "toast"] {
        let fr = frames(name);
        let oids = relation_oids(&fr);
        let sink: SinkTables = oids
            .values()
            .map(|&o| {
                let mut c = config(&[]);
                c.include_transaction_info = true;
                (o, Arc::new(c))
            })
            .collect();
        let t = types(name);
        let whole = Assembler::new("db").process(&fr, &sink, &t).unwrap();
        let begins: Vec<usize> = fr.iter().enumerate().filter(|(_, f)| f.data[0] == b'B').map(|(i, _)| i).collect();
        for chunk in [1, 2, 3, 7, 1000] {
            let mut a = Assembler::new("db");
            // Relation messages before the first Begin (none in these captures) would go through process().
            let mut got = Vec::new();
            for (n, &b) in begins.iter().enumerate() {
                let mut lt = LargeTransaction::default();
                let mut pos = b;
                let end = loop {
                    let part = &fr[pos..(pos + chunk).min(fr.len())];
                    if let Some(k) = a.count_large(part, &sink, &t, &mut lt).unwrap() {
                        break pos + k;
                    }
                    pos += chunk;
                };
                let mut events = Vec::new();
                let mut pos = b;
                loop {
                    let part = &fr[pos..(pos + chunk).min(fr.len())];
                    if let Some(k) = a.encode_large(part, &sink, &t, &mut lt, &mut events).unwrap() {
                        assert_eq!(pos + k, end, "{name} chunk {chunk}");
                        break;
                    }
                    pos += chunk;
                }
                let w = &whole.transactions[n];
                // The counting pass knows the events of each table (for _cdc_offsets when the
                // transaction turns out to be delivered already).
                for (oid, count) in lt.table_counts() {
                    assert_eq!(*count as usize, w.events.iter().filter(|e| e.table_oid == *oid).count());
                }
                assert_eq!(lt.table_counts().iter().map(|(_, c)| *c as usize).sum::<usize>(), w.events.len());
                assert_eq!(lt.end_lsn(), Some(w.end_lsn));
                assert_eq!(lt.commit_lsn(), w.commit_lsn);
                assert_eq!(lt.event_count(), w.events.len());
                assert_eq!(events, w.events, "{name} transaction {n} chunk {chunk}");
                got.extend(events);
            }
            assert_eq!(got.len(), whole.transactions.iter().map(|t| t.events.len()).sum::<usize>());
        }
    }
}

#[test]
fn large_transaction_without_commit_is_not_finished() {
    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let sink: SinkTables = [(oids["orders"], Arc::new(orders_config()))].into_iter().collect();
    let b = fr.iter().position(|f| f.data[0] == b'B').unwrap();
    let c = fr.iter().position(|f| f.data[0] == b'C').unwrap();
    let mut lt = LargeTransaction::default();
    assert_eq!(Assembler::new("db").count_large(&fr[b..c], &sink, &types("basic"), &mut lt).unwrap(), None);
    assert_eq!(lt.end_lsn(), None);
}

#[test]
fn pii_is_hidden_in_every_image_the_key_and_the_diff() {
    use crate::config::Compliance;
    use crate::redact::{hash, Method, TokenKey, REDACTED};
    let key = TokenKey::parse(b"0123456789abcdef0123456789abcdef", 4).unwrap();
    let mut c = orders_config();
    c.redactions = vec![
        ("order_id".into(), Method::Tokenize),
        ("status".into(), Method::Tokenize),
        ("customer_id".into(), Method::Hash),
        ("customer_region".into(), Method::Redact),
        ("total".into(), Method::Remove),
    ];
    c.compliance = Some(Compliance { method: Method::Tokenize, audit_retention_days: Some(2555) });
    let frames = frames("basic");
    let oids = relation_oids(&frames);
    let sink: SinkTables = [(oids["orders"], Arc::new(c))].into_iter().collect();

    // Without a key, the sink stops instead of sending the values in the clear.
    let mut a = Assembler::new("golden");
    match a.process(&frames, &sink, &types("basic")) {
        Err(PipelineError::Compliance { table, reason }) => {
            assert_eq!(table, "public.orders");
            assert!(reason.contains("cdc.tokenization_key_file"), "{reason}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }

    a.set_token_key(Some(key.clone()));
    let txns = a.process(&frames, &sink, &types("basic")).unwrap().transactions;
    let ev = events(&txns);
    let all: String = txns.iter().flat_map(|t| &t.events).map(|e| String::from_utf8_lossy(&e.payload) + "\n").collect();
    for secret in ["ORD-12345", "CUST-789", "us-east", "pending", "confirmed", "150.00"] {
        assert!(!all.contains(secret), "{secret} leaked: {all}");
    }
    let (k, ins) = &ev[0];
    assert_eq!(k.as_ref().unwrap(), &json!({"order_id": key.token(b"ORD-12345")}), "the key is tokenized too");
    assert_eq!(
        ins["after"],
        json!({"order_id": key.token(b"ORD-12345"), "customer_id": hash(b"CUST-789"),
               "status": key.token(b"pending"), "customer_region": REDACTED})
    );
    let comp = &ins["compliance"];
    assert_eq!(comp["pii_tokenized"], json!(["order_id", "status"]));
    assert_eq!(comp["pii_hashed"], json!(["customer_id"]));
    assert_eq!(comp["pii_redacted"], json!(["customer_region"]));
    assert_eq!(comp["pii_removed"], json!(["total"]));
    assert_eq!(comp["key_version"], 4);
    assert!(comp["audit_id"].as_str().unwrap().starts_with("AUD-"));
    assert_eq!(comp["retention_until"].as_str().unwrap().len(), 10);
    // UPDATE: before image and diff hidden the same way (tokens stay comparable).
    let (_, upd) = &ev[1];
    assert_eq!(upd["before"]["status"], json!(key.token(b"pending")));
    assert_eq!(upd["diff"], json!({"status": {"from": key.token(b"pending"), "to": key.token(b"confirmed")}}));
    // audit ids are unique per event.
    let ids: std::collections::HashSet<String> =
        ev.iter().filter_map(|(_, p)| p["compliance"]["audit_id"].as_str().map(String::from)).collect();
    assert_eq!(ids.len(), ev.iter().filter(|(_, p)| p["metadata"]["operation"] != "TRUNCATE").count());
    // compliance_metrics: 7 row events of orders carried a compliance block (the key change is a
    // DELETE and an UPDATE); each hid the 5 redacted columns, all holding values.
    let mut c = crate::stats::TableCounters::default();
    for t in &txns {
        if let Some(t) = t.counters.get(&oids["orders"]) {
            c.add(t);
        }
    }
    assert_eq!((c.audit_records, c.pii_redactions), (7, 35));
}

/// A pgoutput 'M' frame (logical decoding message).
fn message_frame(lsn: Lsn, transactional: bool, prefix: &str, content: &[u8]) -> RawFrame {
    let mut d = vec![b'M', u8::from(transactional)];
    d.extend_from_slice(&lsn.0.to_be_bytes());
    d.extend_from_slice(prefix.as_bytes());
    d.push(0);
    d.extend_from_slice(&(content.len() as u32).to_be_bytes());
    d.extend_from_slice(content);
    RawFrame { lsn, data: d }
}

#[test]
fn user_context_is_attached_when_genuine_and_asked_for() {
    use crate::context::{seal, UserContext, PREFIX};
    let key = b"context key of the server".to_vec();
    let mut frames = frames("basic");
    let oids = relation_oids(&frames);
    // The first transaction: Begin, (Relation), Insert, Commit. Put a sealed context right after its Begin.
    let xid = match decode(&frames[0].data).unwrap() {
        Message::Begin { xid, .. } => xid,
        other => panic!("{other:?}"),
    };
    let ctx = UserContext {
        user: Some("teller_system".into()),
        session_id: Some("65f45a11.1f2c".into()),
        client_ip: Some("10.0.1.100".into()),
        application_name: Some("core-banking".into()),
        query: Some("INSERT INTO orders ...".into()),
    };
    let lsn = frames[0].lsn;
    frames.insert(1, message_frame(lsn, true, PREFIX, &seal(&key, xid, &ctx)));
    // A forged context in the second transaction: dropped.
    let second = frames.iter().skip(2).position(|f| matches!(decode(&f.data), Ok(Message::Begin { .. }))).unwrap() + 2;
    let forged = [b"0".repeat(64), br#"{"user":"admin"}"#.to_vec()].concat();
    frames.insert(second + 1, message_frame(frames[second].lsn, true, PREFIX, &forged));

    let run_with = |user_context: bool, query_text: bool, key: Option<Vec<u8>>| {
        let mut c = orders_config();
        c.user_context = user_context;
        c.query_text = query_text;
        let sink: SinkTables = [(oids["orders"], Arc::new(c))].into_iter().collect();
        let mut a = Assembler::new("golden");
        a.set_context_key(key);
        events(&a.process(&frames, &sink, &types("basic")).unwrap().transactions)
    };
    let ev = run_with(true, false, Some(key.clone()));
    let md = &ev[0].1["metadata"];
    assert_eq!(md["user"], "teller_system");
    assert_eq!(md["session_id"], "65f45a11.1f2c");
    assert_eq!(md["client_ip"], "10.0.1.100");
    assert_eq!(md["application_name"], "core-banking");
    assert!(md.get("query").is_none(), "query text only when asked for");
    assert_eq!(ev[1].1["metadata"]["user"], Value::Null, "forged context dropped");

    let ev = run_with(true, true, Some(key.clone()));
    assert_eq!(ev[0].1["metadata"]["query"], "INSERT INTO orders ...");
    // Without the key every context is dropped; without the option nothing is added.
    assert_eq!(run_with(true, false, None)[0].1["metadata"]["user"], Value::Null);
    let plain = run_with(false, false, Some(key));
    assert!(plain[0].1["metadata"].get("user").is_none());
    assert_eq!(plain, events(&run("basic", vec![("orders", orders_config())])), "messages change nothing else");
}

/// Runs the basic capture with a filter (and optional computed columns) on `orders` and `plain`;
/// returns the events and the counters of each transaction.
fn filtered(
    orders_filter: &str,
    plain_filter: &str,
    computed: &[(&str, &str)],
) -> (Vec<(Option<Value>, Value)>, Vec<Transaction>) {
    let mut o = orders_config();
    o.filter = Some(orders_filter.into());
    o.mode = crate::config::CaptureMode::Filtered;
    o.computed = computed.iter().map(|(n, e)| (n.to_string(), e.to_string())).collect();
    let mut p = config(&["id"]);
    p.filter = Some(plain_filter.into());
    let txns = run("basic", vec![("orders", o), ("plain", p)]);
    (events(&txns), txns)
}

fn summary(ev: &[(Option<Value>, Value)]) -> Vec<String> {
    ev.iter()
        .map(|(_, p)| {
            let md = &p["metadata"];
            let id = p["after"]["order_id"].as_str().or(p["before"]["order_id"].as_str());
            let id = id
                .map(String::from)
                .or(p["after"]["id"].as_i64().or(p["before"]["id"].as_i64()).map(|i| i.to_string()));
            format!(
                "{} {} {}{}",
                md["table"].as_str().unwrap(),
                md["operation"].as_str().unwrap(),
                id.unwrap_or_default(),
                md["filter_transition"].as_str().map(|t| format!(" {t}")).unwrap_or_default()
            )
        })
        .collect()
}

#[test]
fn filter_drops_rows_and_keeps_transactions_consistent() {
    let (ev, txns) = filtered("status != 'draft'", "v = 'one'", &[]);
    assert_eq!(
        summary(&ev),
        [
            "orders INSERT ORD-12345",
            "orders UPDATE ORD-12345",
            "orders INSERT ORD-2", // ORD-3 (draft) and its key change to ORD-3B (still draft) are dropped
            "orders DELETE ORD-2",
            "plain INSERT 1",
            // UPDATE v = 'uno' and the key change: no before image, so leaving cannot be told; dropped.
            "plain DELETE 2", // key-only before image: published (the filter cannot judge it)
            "plain TRUNCATE ",
            "orders TRUNCATE ",
        ]
    );
    // Positions and sizes count published events only.
    let multi = &txns[2];
    assert_eq!(multi.events.len(), 1);
    let p: Value = serde_json::from_slice(&multi.events[0].payload).unwrap();
    assert_eq!(p["metadata"]["transaction"]["event_count"], 1);
    assert_eq!(p["metadata"]["transaction"]["event_index"], 1);
    assert_eq!(p["metadata"]["filter_matched"], "status != 'draft'");
    // Counters: what the filter saw, kept, dropped, and the bytes it saved (encoded, not guessed).
    let oids = relation_oids(&frames("basic"));
    let mut total = crate::stats::TableCounters::default();
    for t in &txns {
        if let Some(c) = t.counters.get(&oids["orders"]) {
            total.add(c);
        }
    }
    assert_eq!((total.changes, total.matched, total.excluded), (6, 4, 2));
    assert!(total.excluded_bytes > 400, "two encoded events: {}", total.excluded_bytes);
}

#[test]
fn updates_entering_and_leaving_the_filter() {
    // pending -> confirmed enters "status = 'confirmed'"...
    let (ev, _) = filtered("status = 'confirmed'", "id > 100", &[]);
    assert_eq!(summary(&ev)[..1], ["orders UPDATE ORD-12345 entered"]);
    assert_eq!(ev[0].1["metadata"]["filter_matched"], "status = 'confirmed'");
    // Its earlier version did not match: no before image, no diff.
    assert_eq!(ev[0].1["before"], Value::Null);
    assert!(ev[0].1.get("diff").is_none());
    // A key change entering the filter does not retract an old key the consumer never had.
    let (ev, txns) = filtered("order_id = 'ORD-3B'", "id > 100", &[]);
    assert_eq!(summary(&ev)[..1], ["orders UPDATE ORD-3B entered"]);
    assert_eq!(txns[2].events.len(), 1);
    // ...and leaves "status = 'pending'": a DELETE of the before image, never the new row.
    let (ev, _) = filtered("status = 'pending' OR total > 1000", "id > 100", &[]);
    let s = summary(&ev);
    assert_eq!(s[..2], ["orders INSERT ORD-12345", "orders DELETE ORD-12345 left"]);
    let left = &ev[1].1;
    assert_eq!(left["before"]["status"], "pending");
    assert_eq!(left["after"], Value::Null);
    assert!(left.get("diff").is_none());
    assert_eq!(ev[1].0.as_ref().unwrap(), &json!({"order_id": "ORD-12345"}));
    assert_eq!(ev[0].1["metadata"]["filter_matched"], "status = 'pending'", "the branch that matched");
}

#[test]
fn computed_columns_follow_the_after_image() {
    let (ev, txns) = filtered(
        "TRUE",
        "TRUE",
        &[("total_cents", "total * 100"), ("loud", "upper(status) || '!'"), ("bad", "1 / (total - total)")],
    );
    let ins = &ev[0].1["after"];
    assert_eq!(ins["total_cents"], json!(15000));
    assert_eq!(ins["loud"], "PENDING!");
    assert_eq!(ins["bad"], Value::Null, "an evaluation error gives null, counted");
    let raw = String::from_utf8(txns[0].events[0].payload.clone()).unwrap();
    assert!(raw.contains(r#""customer_region":"us-east","total_cents":15000,"loud":"PENDING!","bad":null}"#), "{raw}");
    // Deletes have no after image, so nothing is computed.
    let del = ev.iter().find(|(_, p)| p["metadata"]["operation"] == "DELETE").unwrap();
    assert_eq!(del.1["after"], Value::Null);
    let oids = relation_oids(&frames("basic"));
    let mut total = crate::stats::TableCounters::default();
    for c in txns.iter().filter_map(|t| t.counters.get(&oids["orders"])) {
        total.add(c);
    }
    assert_eq!(total.computations, 5, "three inserts, two updates: {total:?}");
    assert_eq!(total.expression_errors, 5, "one division by zero each");
}

#[test]
fn a_sink_without_transformations_gets_no_computed_columns_but_keeps_masks() {
    use crate::redact::{hash, Method};
    let mut c = orders_config();
    c.computed = vec![("total_cents".into(), "total * 100".into())];
    c.redactions = vec![("customer_id".into(), Method::Hash)];
    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let sink: SinkTables = [(oids["orders"], Arc::new(c))].into_iter().collect();
    let mut a = Assembler::new("golden");
    a.set_transformations(false);
    let ev = events(&a.process(&fr, &sink, &types("basic")).unwrap().transactions);
    assert!(ev[0].1["after"].get("total_cents").is_none());
    assert_eq!(ev[0].1["after"]["customer_id"], json!(hash(b"CUST-789")), "masks are not optional");
    a.set_transformations(true);
    let ev = events(&a.process(&fr, &sink, &types("basic")).unwrap().transactions);
    assert_eq!(ev[0].1["after"]["total_cents"], json!(15000));
}

/// Seed example 4's readings, enriched from `sensors` as of each reading's commit.
fn enrich_sink(fr: &[RawFrame]) -> (SinkTables, Assembler) {
    use crate::config::Enrich;
    use crate::lookup::{LookupBinding, LookupId, LookupRow, LookupSource};
    use crate::redact::Method;
    /// The persisted copy: empty, as `cdc_enable` seeded it before the first sensor existed.
    struct Empty;
    impl LookupSource for Empty {
        fn fetch(&mut self, _: LookupId, _: &str) -> Result<Option<LookupRow>, String> {
            Ok(None)
        }
    }
    let oids = relation_oids(fr);
    let mut c = config(&["reading_id"]);
    c.enrich = vec![Enrich {
        source_column: "sensor_id".into(),
        lookup_table: "sensors".into(),
        lookup_column: "sensor_id".into(),
        add_columns: ["location", "sensor_type", "owner"].map(String::from).to_vec(),
    }];
    c.partition_key = Some("sensor_type".into());
    c.redactions = vec![("internal_calibration".into(), Method::Remove)];
    c.computed = vec![("deviation_pct".into(), "ABS(reading_value - baseline) / baseline * 100".into())];
    let readings = oids["sensor_readings"];
    let sink: SinkTables = [(readings, Arc::new(c))].into_iter().collect();
    let mut a = Assembler::new("db");
    let l = a.lookups_mut();
    l.set_source(Box::new(Empty));
    l.set_bindings(&[LookupBinding {
        id: LookupId { table_oid: readings, position: 0 },
        lookup_oid: oids["sensors"],
        lookup_column: "sensor_id".into(),
        add_columns: ["location", "sensor_type", "owner"].map(String::from).to_vec(),
        add_types: vec![25, 25, 25],
        as_of: Lsn(0),
    }]);
    (sink, a)
}

#[test]
fn enrichment_sees_the_lookup_row_as_of_each_commit() {
    let fr = frames("enrich");
    let (sink, mut a) = enrich_sink(&fr);
    let txns = a.process(&fr, &sink, &types("enrich")).unwrap().transactions;
    let ev = events(&txns);
    let row = |i: usize| {
        let p = &ev[i].1;
        let img = if p["after"].is_null() { &p["before"] } else { &p["after"] };
        (img["location"].clone(), img["owner"].clone(), ev[i].0.clone().unwrap())
    };
    // The seed's sample: enriched, computed, internal_calibration removed, keyed by sensor_type.
    let first = &ev[0].1["after"];
    assert_eq!(
        *first,
        json!({"reading_id": 1, "sensor_id": "TEMP-001", "reading_value": 95.5, "threshold": 90, "baseline": 80,
               "alert_level": "warning", "location": "Building A, Floor 3", "sensor_type": "temperature",
               "owner": "Facilities Team", "deviation_pct": 19.375})
    );
    assert_eq!(ev[0].0, Some(json!({"sensor_type": "temperature"})));
    // The sensor changed after reading 1 committed: reading 2 sees the new owner.
    assert_eq!(row(1).1, "Operations");
    // Reading 3 was inserted before the location change of its own transaction: as of commit.
    assert_eq!(row(2).0, "Building B");
    // The sensor was renamed: TEMP-001 no longer exists, TEMP-002 does.
    assert_eq!(row(3), (Value::Null, Value::Null, json!({"sensor_type": null})));
    assert_eq!(row(4).1, "Operations");
    // A DELETE without a before image has no sensor_id to look up.
    assert_eq!(ev[5].1["metadata"]["operation"], "DELETE");
    assert_eq!(row(5).0, Value::Null);
    // After TRUNCATE sensors nothing is found.
    assert_eq!(row(6).1, Value::Null);
    assert_eq!(ev.len(), 7);
    let mut total = crate::stats::TableCounters::default();
    for c in txns.iter().filter_map(|t| t.counters.get(&relation_oids(&fr)["sensor_readings"])) {
        total.add(c);
    }
    assert_eq!((total.enrichments, total.lookups, total.lookup_hits), (7, 6, 6), "{total:?}");
}

#[test]
fn enrichment_in_two_passes_matches_the_buffered_path() {
    let fr = frames("enrich");
    let t = types("enrich");
    let (sink, mut whole) = enrich_sink(&fr);
    let whole = whole.process(&fr, &sink, &t).unwrap();
    let (_, mut a) = enrich_sink(&fr);
    let begins: Vec<usize> = fr.iter().enumerate().filter(|(_, f)| f.data[0] == b'B').map(|(i, _)| i).collect();
    // Relation messages come inside transactions in this capture; feed each transaction twice.
    for (n, &b) in begins.iter().enumerate() {
        let end = b + fr[b..].iter().position(|f| f.data[0] == b'C').unwrap() + 1;
        let mut lt = LargeTransaction::default();
        assert_eq!(a.count_large(&fr[b..end], &sink, &t, &mut lt).unwrap(), Some(end - b));
        let mut events = Vec::new();
        assert_eq!(a.encode_large(&fr[b..end], &sink, &t, &mut lt, &mut events).unwrap(), Some(end - b));
        assert_eq!(events, whole.transactions[n].events, "transaction {n}");
    }
}

#[test]
fn a_sink_without_transformations_gets_no_enriched_columns() {
    let fr = frames("enrich");
    let (sink, mut a) = enrich_sink(&fr);
    a.set_transformations(false);
    let txns = a.process(&fr, &sink, &types("enrich")).unwrap().transactions;
    let ev = events(&txns);
    let first = &ev[0].1["after"];
    assert_eq!(
        *first,
        json!({"reading_id": 1, "sensor_id": "TEMP-001", "reading_value": 95.5, "threshold": 90, "baseline": 80,
               "alert_level": "warning"}),
        "no enriched (location, sensor_type, owner) and no computed (deviation_pct) columns; the mask still applies"
    );
    // The partition_key names an enriched column, which this sink does not look up: the message is
    // keyed by the key columns instead.
    assert_eq!(ev[0].0, Some(json!({"reading_id": 1})));
    let mut total = crate::stats::TableCounters::default();
    for c in txns.iter().filter_map(|t| t.counters.get(&relation_oids(&fr)["sensor_readings"])) {
        total.add(c);
    }
    assert_eq!((total.enrichments, total.lookups), (0, 0), "nothing looked up: {total:?}");
}

#[test]
fn a_key_change_retracts_only_what_the_message_key_identified() {
    let plain_ops = |c: CaptureConfig| {
        let txns = run("basic", vec![("plain", c)]);
        events(&txns)
            .iter()
            .map(|(k, p)| (p["metadata"]["operation"].as_str().unwrap().to_string(), k.clone()))
            .collect::<Vec<_>>()
    };
    // By the primary key: `UPDATE plain SET id = 2` retracts id 1, then upserts id 2.
    let by_key = plain_ops(config(&["id"]));
    assert_eq!(by_key[2], ("DELETE".into(), Some(json!({"id": 1}))));
    assert_eq!(by_key[3], ("UPDATE".into(), Some(json!({"id": 2}))));
    // A partition_key groups rows; it never identified the row, so nothing is retracted.
    let mut c = config(&["id"]);
    c.partition_key = Some("v".into());
    let ops: Vec<String> = plain_ops(c).into_iter().map(|(op, _)| op).collect();
    assert_eq!(ops, ["INSERT", "UPDATE", "UPDATE", "DELETE", "TRUNCATE"]);
    // A key column outside the replica identity is not in a key-only old image (cdc_enable refuses
    // such a key without before images; a config recorded earlier may have one): no retraction
    // keyed by null for the key change.
    let by_v = plain_ops(config(&["v"]));
    assert_eq!(
        by_v.iter().map(|(op, _)| op.as_str()).collect::<Vec<_>>(),
        ["INSERT", "UPDATE", "UPDATE", "DELETE", "TRUNCATE"]
    );
}

#[test]
fn a_snapshot_chunk_is_one_transaction_of_read_events_through_the_same_stages() {
    use crate::deliver::memory::MemorySource;
    use crate::deliver::port::ChangeSource;
    use crate::snapshot::{Chunk, ChunkSource, SnapshotReader, WATERMARK_PREFIX};

    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let plain = fr
        .iter()
        .find_map(|f| match decode(&f.data) {
            Ok(Message::Relation(r)) if r.name == "plain" => Some(r),
            _ => None,
        })
        .unwrap();
    let mut chunk = Chunk::new("s 1".into(), plain, &["id".into()], 0).unwrap();
    for (id, v) in [("10", Some("ten")), ("11", None), ("12", Some("twelve"))] {
        chunk.push_row(&[Some(id.as_bytes()), v.map(str::as_bytes)]).unwrap();
    }
    let end = fr.last().unwrap().lsn.0 + 64;
    let mut mark = vec![b'M', 0];
    mark.extend_from_slice(&end.to_be_bytes());
    mark.extend_from_slice(WATERMARK_PREFIX.as_bytes());
    let content = crate::snapshot::watermark_content("s 1", 3);
    mark.push(0);
    mark.extend_from_slice(&(content.len() as u32).to_be_bytes());
    mark.extend_from_slice(content.as_bytes());
    let mut all = fr.clone();
    all.push(RawFrame { lsn: Lsn(end), data: mark });
    let mut state = SnapshotReader::default();
    state.chunk = Some(chunk);
    let types = types("basic");
    let spliced = ChunkSource { inner: &mut MemorySource::new(all), state: &mut state }
        .fetch(usize::MAX, &mut TypeRegistry::new());

    // A filter on `plain` applies to READ rows as to inserts.
    let mut p = config(&["id"]);
    p.filter = Some("v IS NOT NULL".into());
    let sink: SinkTables = [(oids["plain"], Arc::new(p)), (oids["orders"], Arc::new(orders_config()))].into();
    let out = Assembler::new("golden").process(&spliced, &sink, &types).unwrap();
    let last = out.transactions.last().unwrap();
    assert_eq!((last.xid, last.commit_lsn, last.end_lsn), (0, Lsn(end - 1), Lsn(end)));
    assert_eq!(out.confirm_lsn, Some(Lsn(end)));
    let ev = events(std::slice::from_ref(last));
    assert_eq!(ev.len(), 2, "the row whose v is NULL is filtered out");
    for (i, (((key, e), id), lsn)) in ev.iter().zip([10, 12]).zip([end - 4, end - 2]).enumerate() {
        assert_eq!(key.as_ref().unwrap(), &json!({ "id": id }));
        assert_eq!(e["metadata"]["operation"], "READ");
        assert_eq!(e["metadata"]["commit_lsn"], end - 1);
        assert_eq!(e["metadata"]["lsn"], lsn, "each of the 3 rows (one filtered) at its own lsn");
        assert_eq!(e["before"], Value::Null);
        assert_eq!(e["after"]["id"], id);
        assert_eq!(last.events[i].index, i as u32 + 1);
    }
    assert_eq!(last.counters[&oids["plain"]].excluded, 1);
    // The stream's events before the chunk are those of the capture alone.
    let stream = Assembler::new("golden").process(&fr, &sink, &types).unwrap();
    assert_eq!(events(&out.transactions[..out.transactions.len() - 1]), events(&stream.transactions));
}

/// The columns of the `orders` relation of a capture, as a schema version records them.
fn orders_fields(fr: &[RawFrame]) -> Vec<crate::schema::Field> {
    let orders = fr
        .iter()
        .find_map(|f| match decode(&f.data) {
            Ok(Message::Relation(r)) if r.name == "orders" => Some(r),
            _ => None,
        })
        .unwrap();
    orders
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| crate::schema::Field {
            attnum: i as i16 + 1,
            name: c.name.clone(),
            type_sql: String::new(),
            type_oid: c.type_oid,
            typmod: c.type_mod,
            not_null: false,
            default: None,
            missing: None,
        })
        .collect()
}

/// A column renamed after its changes were written (issue 15, "renames never leak"): the config
/// names it as it is now, the stream's relation as it was; the history matches the two by
/// attribute number, so the old name is redacted and included as the new one says, and the
/// events keep the name of their version.
#[test]
fn a_config_follows_a_renamed_column_through_the_history() {
    use crate::redact::{hash, Method};
    use crate::schema::History;
    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let then = orders_fields(&fr);
    let mut now = then.clone();
    now.iter_mut().find(|c| c.name == "customer_id").unwrap().name = "client_id".into();
    // The capture config after the rename: it names client_id.
    let renamed_config = || {
        let mut c = orders_config();
        c.include_columns = None;
        c.exclude_columns = vec!["internal_notes".into()];
        c.redactions = vec![("client_id".into(), Method::Hash)];
        c
    };
    let run_with = |history: Option<History>| {
        let mut c = renamed_config();
        c.history = history.map(Arc::new);
        let sink: SinkTables = [(oids["orders"], Arc::new(c))].into_iter().collect();
        events(&Assembler::new("golden").process(&fr, &sink, &types("basic")).unwrap().transactions)
    };
    // Version 1 before every frame of the capture, version 2 (the rename) after them.
    let history = History::new(vec![(Lsn(1), then.clone()), (Lsn(u64::MAX), now)]);
    let ev = run_with(Some(history));
    assert_eq!(ev[0].1["after"]["customer_id"], json!(hash(b"CUST-789")), "redacted under its old name");
    assert!(ev[0].1["after"].get("client_id").is_none(), "the event has the columns of its version");
    // Negative control: without the history the old name matches nothing in the config and the
    // value goes out in the clear, which is what a rename did before.
    let ev = run_with(None);
    assert_eq!(ev[0].1["after"]["customer_id"], json!("CUST-789"));
    // A history that lacks the relation's column at its position (a DDL read later): the sink
    // retries rather than guess.
    let behind = History::new(vec![(Lsn(1), vec![then[0].clone()])]);
    let mut c = renamed_config();
    c.history = Some(Arc::new(behind));
    let sink: SinkTables = [(oids["orders"], Arc::new(c))].into_iter().collect();
    let err = Assembler::new("golden").process(&fr, &sink, &types("basic")).unwrap_err();
    assert!(matches!(err, PipelineError::SchemaBehind { .. }), "{err}");
}

/// `cdc_create_version_topic`: the events of a version with a topic of its own, and of the
/// versions after it, say so (the Kafka sink writes them to `<topic>.v<N>`); a DDL's version
/// message that the history read so far lacks stops the read, so nothing after the DDL is encoded
/// or routed with the older history.
#[test]
fn a_version_topic_routes_the_events_of_its_versions_and_a_stale_history_is_read_again() {
    use crate::schema::{History, Version, VERSION_MESSAGE_PREFIX};
    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let fields = orders_fields(&fr);
    let version = |number: i32, lsn: u64, own_topic: bool| Version {
        lsn: Lsn(lsn),
        number,
        forced: false,
        own_topic,
        fields: fields.clone(),
    };
    let run = |history: History, frames: &[RawFrame]| {
        let mut c = orders_config();
        c.history = Some(Arc::new(history));
        let sink: SinkTables = [(oids["orders"], Arc::new(c))].into_iter().collect();
        Assembler::new("golden").process(frames, &sink, &types("basic"))
    };
    let topic_versions = |out: BatchOutput| -> Vec<Option<i32>> {
        out.transactions.iter().flat_map(|t| t.events.iter().map(|e| e.topic_version)).collect()
    };
    // Version 2, recorded before every frame, has a topic of its own: every event goes there.
    let own = History::from_versions(vec![version(1, 1, false), version(2, 2, true)]);
    let routed = topic_versions(run(own, &fr).unwrap());
    assert!(!routed.is_empty() && routed.iter().all(|v| *v == Some(2)), "{routed:?}");
    // Negative control: the same history without the topic keeps them on the table's topic.
    let plain = History::from_versions(vec![version(1, 1, false), version(2, 2, false)]);
    assert!(topic_versions(run(plain.clone(), &fr).unwrap()).iter().all(Option::is_none));
    // A DDL in the first transaction recorded version 3; the history read so far ends at 2.
    let mut with_ddl = fr.clone();
    let at = with_ddl[0].lsn;
    let content = format!("{} 3", oids["orders"]);
    with_ddl.insert(1, message_frame(at, true, VERSION_MESSAGE_PREFIX, content.as_bytes()));
    let err = run(plain, &with_ddl).unwrap_err();
    assert!(matches!(err, PipelineError::HistoryBehind { version: 3, .. }), "{err}");
    assert!(err.to_string().contains("version 3"), "{err}");
    // Read again, the history knows version 3: the read goes on.
    let known = History::from_versions(vec![version(1, 1, false), version(2, 2, false), version(3, u64::MAX, false)]);
    assert!(run(known, &with_ddl).is_ok());
    // A history that started again after the message (the table disabled and enabled again) lacks
    // version 3 for good: reading it again would change nothing, so the read goes on.
    let restarted = History::from_versions(vec![version(1, u64::MAX, false)]);
    assert!(run(restarted, &with_ddl).is_ok());
    // A message about a table the sink does not carry is not its business.
    let other = format!("{} 9", oids["orders"] + 100_000);
    let mut unrelated = fr.clone();
    unrelated.insert(1, message_frame(at, true, VERSION_MESSAGE_PREFIX, other.as_bytes()));
    let plain = History::from_versions(vec![version(1, 1, false), version(2, 2, false)]);
    assert!(run(plain, &unrelated).is_ok());
}

/// The xid of the first transaction of `frames` (its Begin).
fn first_xid(frames: &[RawFrame]) -> u32 {
    frames
        .iter()
        .find_map(|f| match crate::decode::decode(&f.data) {
            Ok(Message::Begin { xid, .. }) => Some(xid),
            _ => None,
        })
        .expect("a Begin")
}

/// A catalog snapshot that sees `xid` committed, or one taken while it was in progress.
fn catalog_snapshot(xid: u32, sees: bool) -> crate::snapshot::MvccSnapshot {
    let x = u64::from(xid);
    let text = if sees { format!("{}:{}:", x + 1, x + 1) } else { format!("{x}:{}:{x}", x + 1) };
    crate::snapshot::MvccSnapshot::parse(&text).unwrap()
}

/// `cdc_enable` writes a capture message in its transaction: a catalog copy read before that
/// transaction committed is read again before anything after the message is decoded (regression:
/// a table disabled and enabled again had its changes, and its added snapshot's rows, decoded with
/// a copy that did not carry it, and dropped; the e2e DDL test of the postgres sink lost a column).
#[test]
fn a_capture_message_newer_than_the_catalog_copy_has_it_read_again() {
    use super::CAPTURE_MESSAGE_PREFIX;
    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let xid = first_xid(&fr);
    let mut with_enable = fr.clone();
    let at = with_enable[0].lsn;
    let content = oids["orders"].to_string();
    with_enable.insert(1, message_frame(at, true, CAPTURE_MESSAGE_PREFIX, content.as_bytes()));
    // The copy carries nothing (read while the table was not captured).
    let run = |seen: Option<crate::snapshot::MvccSnapshot>| {
        let mut a = Assembler::new("golden");
        a.set_catalog_snapshot(seen);
        a.process(&with_enable, &SinkTables::new(), &types("basic"))
    };
    let err = run(Some(catalog_snapshot(xid, false))).unwrap_err();
    assert!(matches!(err, PipelineError::CaptureBehind { .. }), "{err}");
    assert!(err.to_string().contains("after the catalog was read"), "{err}");
    // A copy read after the transaction committed: the read goes on (the table is not the sink's).
    assert!(run(Some(catalog_snapshot(xid, true))).is_ok());
    // Unknown snapshot (a caller that does not say): as before.
    assert!(run(None).is_ok());
}

/// With the catalog snapshot known, a DDL's version message is judged by whether the copy saw the
/// DDL's transaction, not by the version's number: a history from before a cdc_disable and
/// cdc_enable that holds another version of the same number is behind (regression: the number
/// alone said it was current).
#[test]
fn a_version_message_is_judged_by_the_transactions_the_catalog_copy_saw() {
    use crate::schema::{History, Version, VERSION_MESSAGE_PREFIX};
    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let xid = first_xid(&fr);
    let fields = orders_fields(&fr);
    let version = |number: i32, lsn: u64| Version {
        lsn: Lsn(lsn),
        number,
        forced: false,
        own_topic: false,
        fields: fields.clone(),
    };
    let mut with_ddl = fr.clone();
    let at = with_ddl[0].lsn;
    // The table's new history: version 1 at enable, then a DDL recorded version 2.
    let content = format!("{} 2", oids["orders"]);
    with_ddl.insert(1, message_frame(at, true, VERSION_MESSAGE_PREFIX, content.as_bytes()));
    // The old history (before the disable) also numbers a version 2, at old positions.
    let old = History::from_versions(vec![version(1, 1), version(2, 2)]);
    let run = |seen: Option<crate::snapshot::MvccSnapshot>| {
        let mut c = orders_config();
        c.history = Some(Arc::new(old.clone()));
        let sink: SinkTables = [(oids["orders"], Arc::new(c))].into_iter().collect();
        let mut a = Assembler::new("golden");
        a.set_catalog_snapshot(seen);
        a.process(&with_ddl, &sink, &types("basic"))
    };
    // Negative control: by number, the old history looks current.
    assert!(run(None).is_ok());
    let err = run(Some(catalog_snapshot(xid, false))).unwrap_err();
    assert!(matches!(err, PipelineError::HistoryBehind { version: 2, .. }), "{err}");
    assert!(run(Some(catalog_snapshot(xid, true))).is_ok());
}

/// The `basic` capture through sink `sink`, the orders table routed by status.
fn routed(
    sink: &str,
    routing: serde_json::Value,
    routing_lsn: u64,
    extra: &[RawFrame],
) -> Result<BatchOutput, PipelineError> {
    routed_filtered(sink, routing, routing_lsn, extra, None)
}

/// [`routed`] with a row filter on orders.
fn routed_filtered(
    sink: &str,
    routing: serde_json::Value,
    routing_lsn: u64,
    extra: &[RawFrame],
    filter: Option<&str>,
) -> Result<BatchOutput, PipelineError> {
    let mut fr = frames("basic");
    let oids = relation_oids(&fr);
    let root = json!({ "regional_routing": routing });
    let o = crate::object::Obj::root("config", &root).unwrap();
    let mut c = orders_config();
    c.routing = crate::routing::parse(o.object("regional_routing").unwrap(), |_, _| Ok(())).unwrap();
    c.routing_lsn = Some(Lsn(routing_lsn));
    c.filter = filter.map(str::to_string);
    let sink_tables: SinkTables =
        [(oids["orders"], Arc::new(c)), (oids["plain"], Arc::new(config(&["id"])))].into_iter().collect();
    for f in extra {
        fr.insert(1, f.clone());
    }
    let mut a = Assembler::new("golden");
    a.set_sink_name(sink);
    a.process(&fr, &sink_tables, &types("basic"))
}

fn routed_summary(out: &BatchOutput) -> Vec<String> {
    let ev = events(&out.transactions);
    let routes = out.transactions.iter().flat_map(|t| t.events.iter().map(|e| e.routes.clone()));
    summary(&ev)
        .into_iter()
        .zip(routes)
        .filter(|(s, _)| !s.starts_with("plain") || s.contains("TRUNCATE"))
        .map(|(s, r)| r.iter().fold(s, |s, (route, _)| format!("{s} @{route}")))
        .collect()
}

#[test]
fn regional_routing_sends_each_row_to_the_sinks_of_its_route() {
    let routes = json!({
        "routing_column": "status",
        "routes": {"pending": ["p", "both"], "confirmed": ["c", "both"]}
    });
    let p = routed_summary(&routed("p", routes.clone(), 0, &[]).unwrap());
    // The row left the sink's route (pending -> confirmed): the DELETE of its before image.
    assert_eq!(
        p,
        [
            "orders INSERT ORD-12345 @pending",
            "orders DELETE ORD-12345 @pending",
            "orders INSERT ORD-2 @pending",
            "orders DELETE ORD-2 @pending",
            "plain TRUNCATE ",
            "orders TRUNCATE "
        ]
    );
    let out = routed("c", routes.clone(), 0, &[]).unwrap();
    // It entered the route of "c": the INSERT of its whole after image.
    assert_eq!(routed_summary(&out), ["orders INSERT ORD-12345 @confirmed", "plain TRUNCATE ", "orders TRUNCATE "]);
    let ev = events(&out.transactions);
    assert_eq!(ev[0].1["after"]["status"], "confirmed");
    assert_eq!(ev[0].1["after"]["total"], json!(150.00));
    assert_eq!(ev[0].1["before"], Value::Null);
    // A sink in both routes gets the UPDATE.
    assert_eq!(
        routed_summary(&routed("both", routes.clone(), 0, &[]).unwrap()),
        [
            "orders INSERT ORD-12345 @pending",
            "orders UPDATE ORD-12345 @confirmed @pending",
            "orders INSERT ORD-2 @pending",
            "orders DELETE ORD-2 @pending",
            "plain TRUNCATE ",
            "orders TRUNCATE "
        ]
    );
    // A sink in no route gets nothing of the table, not even its TRUNCATE.
    assert_eq!(routed_summary(&routed("other", routes.clone(), 0, &[]).unwrap()), ["plain TRUNCATE "]);
    // Drafts take the default route.
    let mut with_default = routes.clone();
    with_default["default_route"] = json!("pending");
    let p = routed_summary(&routed("p", with_default, 0, &[]).unwrap());
    assert!(p.contains(&"orders INSERT ORD-3 @pending".to_string()), "{p:?}");
    assert!(p.contains(&"orders DELETE ORD-3 @pending".to_string()), "the key change retracts ORD-3: {p:?}");
    assert!(p.contains(&"orders UPDATE ORD-3B @pending".to_string()), "{p:?}");
    // Negative control: before the routing's LSN every sink gets every change, unrouted.
    let before = routed_summary(&routed("c", routes.clone(), u64::MAX - 1, &[]).unwrap());
    assert_eq!(before.len(), 9, "{before:?}");
    assert!(before.iter().all(|s| !s.contains('@')), "{before:?}");
}

#[test]
fn a_row_entering_the_filter_counts_only_for_the_route_it_entered() {
    let routes = json!({"routing_column": "status", "routes": {"pending": ["p", "both"], "confirmed": ["both"]}});
    let filter = Some("status = 'confirmed'");
    // pending -> confirmed enters the filter: "both" never had the row in "pending".
    let both = routed_summary(&routed_filtered("both", routes.clone(), 0, &[], filter).unwrap());
    assert_eq!(both[0], "orders UPDATE ORD-12345 entered @confirmed", "{both:?}");
    // "p" never had it either (the filter kept it out): the row leaving "pending" is nothing to it.
    let p = routed_summary(&routed_filtered("p", routes, 0, &[], filter).unwrap());
    assert!(p.iter().all(|s| !s.contains("ORD-12345")), "{p:?}");
}

#[test]
fn a_routing_change_after_the_catalog_was_read_reads_it_again() {
    use crate::routing::ROUTING_MESSAGE_PREFIX;
    let fr = frames("basic");
    let oids = relation_oids(&fr);
    let at = fr[0].lsn;
    let msg = message_frame(at, true, ROUTING_MESSAGE_PREFIX, oids["orders"].to_string().as_bytes());
    let routes = json!({"routing_column": "status", "routes": {"pending": ["p"]}});
    // The copy's routing is older than the message: read the catalog again.
    let err = routed("p", routes.clone(), at.0 - 1, std::slice::from_ref(&msg)).unwrap_err();
    assert!(matches!(err, PipelineError::RoutingBehind { .. }), "{err}");
    assert!(err.to_string().contains("regional_routing changed"), "{err}");
    // The copy has it (its LSN is the message's end, past its start): the read goes on.
    assert!(routed("p", routes.clone(), at.0 + 10, std::slice::from_ref(&msg)).is_ok());
    // A message about a table the sink does not carry is not its business.
    let other = message_frame(at, true, ROUTING_MESSAGE_PREFIX, (oids["orders"] + 100_000).to_string().as_bytes());
    assert!(routed("p", routes, at.0 - 1, &[other]).is_ok());
}
