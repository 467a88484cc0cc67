//! Test helpers: load the golden pgoutput captures (`tests/golden/`, made by
//! `scripts/capture-golden.sh` from a real PostgreSQL 15) and run them through the pipeline.
use std::collections::HashMap;
use std::sync::Arc;

use crate::config::CaptureConfig;
use crate::decode::{decode, Message};
use crate::lsn::Lsn;
use crate::pipeline::{Assembler, RawFrame, SinkTables, Transaction};
use crate::types::{PgTypeRow, TypeRegistry};

fn golden_path(file: &str) -> String {
    format!("{}/tests/golden/{file}", env!("CARGO_MANIFEST_DIR"))
}

/// The frames of a capture.
pub fn frames(name: &str) -> Vec<RawFrame> {
    let text = std::fs::read_to_string(golden_path(&format!("{name}.frames"))).expect("golden frames");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (lsn, hex) = l.split_once('\t').expect("lsn<TAB>hex");
            let data =
                (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
            RawFrame { lsn: Lsn(lsn.parse().expect("lsn")), data }
        })
        .collect()
}

/// The type registry as the worker would build it for a capture.
pub fn types(name: &str) -> TypeRegistry {
    let text = std::fs::read_to_string(golden_path(&format!("{name}.types.json"))).expect("golden types");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).expect("types json");
    let mut reg = TypeRegistry::new();
    let mut rows: Vec<PgTypeRow> = rows
        .iter()
        .map(|r| PgTypeRow {
            oid: r["oid"].as_u64().unwrap() as u32,
            typtype: r["typtype"].as_str().unwrap().as_bytes()[0],
            typcategory: r["typcategory"].as_str().unwrap().as_bytes()[0],
            typelem: r["typelem"].as_u64().unwrap() as u32,
            typbasetype: r["typbasetype"].as_u64().unwrap() as u32,
            typdelim: r["typdelim"].as_str().unwrap().as_bytes()[0],
            enum_labels: r["enum_labels"]
                .as_array()
                .map(|a| a.iter().filter_map(|l| l.as_str().map(String::from)).collect())
                .unwrap_or_default(),
        })
        .collect();
    rows.sort_by_key(|r| r.typtype == b'd');
    for r in &rows {
        reg.add(r);
    }
    reg
}

/// Table name -> OID, from the Relation messages of a capture.
pub fn relation_oids(frames: &[RawFrame]) -> HashMap<String, u32> {
    frames
        .iter()
        .filter_map(|f| match decode(&f.data) {
            Ok(Message::Relation(r)) => Some((r.name, r.oid)),
            _ => None,
        })
        .collect()
}

/// A capture config with every column, every operation, and the given key columns.
pub fn config(key: &[&str]) -> CaptureConfig {
    CaptureConfig::with_key(key.iter().map(|s| s.to_string()).collect())
}

/// Runs a capture through one sink that captures the named tables.
pub fn run(name: &str, tables: Vec<(&str, CaptureConfig)>) -> Vec<Transaction> {
    let frames = frames(name);
    let oids = relation_oids(&frames);
    let sink: SinkTables = tables.into_iter().map(|(t, c)| (oids[t], Arc::new(c))).collect();
    let mut a = Assembler::new("golden");
    let out = a.process(&frames, &sink, &types(name)).expect("pipeline");
    assert_eq!(out.held_back_frames, 0);
    out.transactions
}

/// Every event of the transactions as (key, parsed payload).
pub fn events(txns: &[Transaction]) -> Vec<(Option<serde_json::Value>, serde_json::Value)> {
    txns.iter()
        .flat_map(|t| t.events.iter())
        .map(|e| {
            let key = e.key.as_ref().map(|k| serde_json::from_slice(k).expect("key is JSON"));
            let payload = serde_json::from_slice(&e.payload)
                .unwrap_or_else(|err| panic!("payload is not JSON ({err}): {}", String::from_utf8_lossy(&e.payload)));
            (key, payload)
        })
        .collect()
}
