//! Throughput of the pure pipeline — decode -> filter -> transform -> encode — on one core, for a
//! 10-column row, run by `make bench`. Prints the figures and writes `pipeline.md` and
//! `pipeline.csv` to the directory given with `--out` (default `bench/results`).
//!
//! The input is real pgoutput v1 bytes (Relation, Begin, Insert x N, Commit) built here the way
//! PostgreSQL 15 lays them out, so the decoder does exactly the work it does on a slot. Each
//! scenario runs several times over the same frames; the best run is reported (the machine is
//! shared, the best run is the least disturbed one), with the median beside it.
use std::sync::Arc;
use std::time::Instant;

use cdc_core::config::{CaptureConfig, CaptureMode};
use cdc_core::pipeline::{Assembler, RawFrame, SinkTables};
use cdc_core::redact::Method;
use cdc_core::types::TypeRegistry;
use cdc_core::Lsn;

const TABLE_OID: u32 = 16_384;
/// (name, type OID) of the 10 columns: int8, text x4, numeric x2, timestamptz, bool, int4.
const COLUMNS: [(&str, u32); 10] = [
    ("id", 20),
    ("status", 25),
    ("region", 25),
    ("customer", 25),
    ("note", 25),
    ("amount", 1700),
    ("tax", 1700),
    ("created_at", 1184),
    ("active", 16),
    ("qty", 23),
];

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

fn relation() -> Vec<u8> {
    let mut d = vec![b'R'];
    d.extend_from_slice(&TABLE_OID.to_be_bytes());
    cstr(&mut d, "public");
    cstr(&mut d, "orders");
    d.push(b'd');
    d.extend_from_slice(&(COLUMNS.len() as u16).to_be_bytes());
    for (i, (name, oid)) in COLUMNS.iter().enumerate() {
        d.push(u8::from(i == 0));
        cstr(&mut d, name);
        d.extend_from_slice(&oid.to_be_bytes());
        d.extend_from_slice(&(-1i32).to_be_bytes());
    }
    d
}

fn insert(i: u64) -> Vec<u8> {
    let statuses = ["pending", "confirmed", "draft", "shipped"];
    let regions = ["eu", "us", "apac", "latam"];
    let values: [String; 10] = [
        i.to_string(),
        statuses[(i % 4) as usize].to_string(),
        regions[(i / 4 % 4) as usize].to_string(),
        format!("CUST-{:06}", i % 100_000),
        "a note of about forty characters, here".to_string(),
        format!("{}.{:02}", 50 + i % 200, i % 100),
        format!("{}.{:02}", i % 40, i % 100),
        format!("2024-03-15 14:{:02}:{:02}.{:06}+00", i / 60 % 60, i % 60, i % 1_000_000),
        if i.is_multiple_of(3) { "f" } else { "t" }.to_string(),
        (i % 10).to_string(),
    ];
    let mut d = vec![b'I'];
    d.extend_from_slice(&TABLE_OID.to_be_bytes());
    d.push(b'N');
    d.extend_from_slice(&(values.len() as u16).to_be_bytes());
    for v in &values {
        d.push(b't');
        d.extend_from_slice(&(v.len() as u32).to_be_bytes());
        d.extend_from_slice(v.as_bytes());
    }
    d
}

/// One transaction of `n` inserts, starting at LSN `base`.
fn transaction(base: u64, first_id: u64, n: u64, with_relation: bool) -> Vec<RawFrame> {
    let commit_lsn = base + 100 * (n + 2);
    let time: i64 = 763_741_425_000_000;
    let mut frames = Vec::with_capacity(n as usize + 3);
    let mut begin = vec![b'B'];
    begin.extend_from_slice(&commit_lsn.to_be_bytes());
    begin.extend_from_slice(&time.to_be_bytes());
    begin.extend_from_slice(&(1000 + (first_id as u32)).to_be_bytes());
    frames.push(RawFrame { lsn: Lsn(base), data: begin });
    if with_relation {
        frames.push(RawFrame { lsn: Lsn(base), data: relation() });
    }
    for k in 0..n {
        frames.push(RawFrame { lsn: Lsn(base + 100 * (k + 1)), data: insert(first_id + k) });
    }
    let mut commit = vec![b'C', 0];
    commit.extend_from_slice(&commit_lsn.to_be_bytes());
    commit.extend_from_slice(&(commit_lsn + 48).to_be_bytes());
    commit.extend_from_slice(&time.to_be_bytes());
    frames.push(RawFrame { lsn: Lsn(commit_lsn), data: commit });
    frames
}

fn config() -> CaptureConfig {
    CaptureConfig::with_key(vec!["id".into()])
}

struct Scenario {
    name: &'static str,
    config: CaptureConfig,
}

fn scenarios() -> Vec<Scenario> {
    let filter = "status != 'draft' AND amount > 100 AND region IN ('eu', 'us')".to_string();
    let mut filtered = config();
    filtered.filter = Some(filter.clone());
    filtered.mode = CaptureMode::Filtered;
    let mut transformed = filtered.clone();
    transformed.computed = vec![("total".into(), "amount + tax".into())];
    transformed.redactions = vec![("customer".into(), Method::Hash)];
    let mut txinfo = config();
    txinfo.include_transaction_info = true;
    vec![
        Scenario { name: "decode + encode (no filter)", config: config() },
        Scenario { name: "+ transaction info", config: txinfo },
        Scenario { name: "3-predicate filter (about 1 row in 4 kept)", config: filtered },
        Scenario { name: "filter + computed column + hashed column", config: transformed },
    ]
}

struct Figure {
    name: &'static str,
    changes: u64,
    published: u64,
    best: f64,
    median: f64,
}

fn run(s: &Scenario, frames: &[Vec<RawFrame>], changes: u64, repeats: usize) -> Figure {
    let tables: SinkTables = [(TABLE_OID, Arc::new(s.config.clone()))].into_iter().collect();
    let types = TypeRegistry::new();
    let mut rates = Vec::with_capacity(repeats);
    let mut published = 0;
    for _ in 0..repeats {
        let mut a = Assembler::new("bench");
        let started = Instant::now();
        let mut out = 0u64;
        for batch in frames {
            let b = a.process(batch, &tables, &types).expect("pipeline");
            out += b.transactions.iter().map(|t| t.events.len() as u64).sum::<u64>();
        }
        let secs = started.elapsed().as_secs_f64();
        published = out;
        rates.push(changes as f64 / secs);
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    Figure { name: s.name, changes, published, best: rates[rates.len() - 1], median: rates[rates.len() / 2] }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("{cpu}, {cores} cores available (the benchmark uses one)")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out_dir = args.windows(2).find(|w| w[0] == "--out").map(|w| w[1].clone()).unwrap_or("bench/results".into());
    let (txns, per_txn) = (2_000u64, 100u64); // 200,000 changes, 100 per transaction
    let frames: Vec<Vec<RawFrame>> = (0..txns)
        // Batches of 10 transactions, as a peek returns them; each batch describes the relation once.
        .collect::<Vec<_>>()
        .chunks(10)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .flat_map(|(k, &t)| transaction(1_000_000 + t * 100_000, t * per_txn, per_txn, k == 0))
                .collect()
        })
        .collect();
    let changes = txns * per_txn;
    let bytes: usize = frames.iter().flatten().map(|f| f.data.len()).sum();
    println!("pipeline benchmark: {changes} changes of a 10-column row ({} bytes of pgoutput), one core", bytes);
    let figures: Vec<Figure> = scenarios().iter().map(|s| run(s, &frames, changes, 7)).collect();
    let mut md = format!(
        "# Pure pipeline throughput (decode -> filter -> transform -> encode)\n\n\
         Machine: {}. Build: release. Input: {changes} INSERTs of a 10-column row (int8, 4 text, 2 numeric, \
         timestamptz, bool, int4) as pgoutput v1 bytes, 100 per transaction, 10 transactions per batch. \
         Each scenario ran 7 times; best and median runs. Events/s counts input changes per second.\n\n\
         | scenario | changes/s (best) | changes/s (median) | events published |\n|---|---:|---:|---:|\n",
        machine()
    );
    let mut csv = String::from("scenario,changes,published,best_changes_per_s,median_changes_per_s\n");
    for f in &figures {
        println!(
            "{:<48} {:>12.0} changes/s (median {:>12.0}), {} of {} published",
            f.name, f.best, f.median, f.published, f.changes
        );
        md.push_str(&format!("| {} | {:.0} | {:.0} | {} of {} |\n", f.name, f.best, f.median, f.published, f.changes));
        csv.push_str(&format!("\"{}\",{},{},{:.0},{:.0}\n", f.name, f.changes, f.published, f.best, f.median));
    }
    let base = figures[0].best;
    md.push_str("\nRatios to decode + encode alone (best runs):\n\n");
    for f in &figures[1..] {
        md.push_str(&format!("- {}: {:.2}\n", f.name, f.best / base));
    }
    if std::fs::create_dir_all(&out_dir).is_ok() {
        let _ = std::fs::write(format!("{out_dir}/pipeline.md"), md);
        let _ = std::fs::write(format!("{out_dir}/pipeline.csv"), csv);
        println!("wrote {out_dir}/pipeline.md and {out_dir}/pipeline.csv");
    }
}
