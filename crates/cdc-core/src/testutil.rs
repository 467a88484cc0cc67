//! Test helpers: load the golden pgoutput captures (`tests/golden/`, made by
//! `scripts/capture-golden.sh` from a real PostgreSQL 15) and run them through the pipeline.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::config::CaptureConfig;
use crate::decode::{decode, Message};
use crate::lsn::Lsn;
use crate::pipeline::{Assembler, RawFrame, SinkTables, Transaction};
use crate::types::{PgTypeRow, TypeRegistry};

/// The directory of the crate whose tests run: `CARGO_MANIFEST_DIR` as cargo sets it when it runs
/// them, else `compiled` (the caller's `env!("CARGO_MANIFEST_DIR")`). Not the compiled value first:
/// the cargo target directory is shared outside the repository, so a test binary built in another
/// clone, whose sources are older, is reused here with that clone's paths in it (the unit tests
/// failed to find their golden files once that clone was gone).
pub fn crate_dir(compiled: &str) -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from(compiled), PathBuf::from)
}

/// A golden file; from cdc-core's tests and from those of the crates next to it.
fn golden_path(file: &str) -> PathBuf {
    crate_dir(env!("CARGO_MANIFEST_DIR")).join("../cdc-core/tests/golden").join(file)
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

/// pgoutput frames built by hand for one small table (`t`: `id int4` key, `v text`), for tests
/// that need changes, commits and snapshot watermarks at chosen positions.
pub mod wal {
    use crate::decode::{Relation, RelationColumn};
    use crate::lsn::Lsn;
    use crate::pipeline::RawFrame;
    use crate::snapshot::{watermark_content, write_relation, write_tuple, WATERMARK_PREFIX};

    /// Table `public.t` with OID `oid`: `id int4` (its key), `v text`.
    pub fn relation(oid: u32) -> Relation {
        let col = |name: &str, type_oid: u32, is_key: bool| RelationColumn {
            is_key,
            name: name.into(),
            type_oid,
            type_mod: -1,
        };
        Relation {
            oid,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns: vec![col("id", 23, true), col("v", 25, false)],
        }
    }

    fn tuple(out: &mut Vec<u8>, id: u32, v: Option<&str>) {
        write_tuple(out, &[Some(id.to_string().as_bytes()), v.map(str::as_bytes)]);
    }

    /// A Begin of transaction `xid` committing at `commit`.
    pub fn begin(xid: u32, commit: u64) -> RawFrame {
        let mut d = vec![b'B'];
        d.extend_from_slice(&commit.to_be_bytes());
        d.extend_from_slice(&0i64.to_be_bytes());
        d.extend_from_slice(&xid.to_be_bytes());
        RawFrame { lsn: Lsn(commit - 8), data: d }
    }

    /// The Commit of a transaction committing at `commit` (ends 16 bytes later).
    pub fn commit(commit: u64) -> RawFrame {
        let mut d = vec![b'C', 0];
        d.extend_from_slice(&commit.to_be_bytes());
        d.extend_from_slice(&(commit + 16).to_be_bytes());
        d.extend_from_slice(&0i64.to_be_bytes());
        RawFrame { lsn: Lsn(commit + 16), data: d }
    }

    /// An INSERT of row (`id`, 'new') into table `oid`.
    pub fn insert(oid: u32, id: u32, lsn: u64) -> RawFrame {
        let mut d = vec![b'I'];
        d.extend_from_slice(&oid.to_be_bytes());
        d.push(b'N');
        tuple(&mut d, id, Some("new"));
        RawFrame { lsn: Lsn(lsn), data: d }
    }

    /// An UPDATE that moved row `from` to key `to` (old key image).
    pub fn rekey(oid: u32, from: u32, to: u32, lsn: u64) -> RawFrame {
        let mut d = vec![b'U'];
        d.extend_from_slice(&oid.to_be_bytes());
        d.push(b'K');
        write_tuple(&mut d, &[Some(from.to_string().as_bytes()), None]);
        d.push(b'N');
        tuple(&mut d, to, Some("moved"));
        RawFrame { lsn: Lsn(lsn), data: d }
    }

    /// A DELETE of row `id` of table `oid` (key image).
    pub fn delete(oid: u32, id: u32, lsn: u64) -> RawFrame {
        let mut d = vec![b'D'];
        d.extend_from_slice(&oid.to_be_bytes());
        d.push(b'K');
        write_tuple(&mut d, &[Some(id.to_string().as_bytes()), None]);
        RawFrame { lsn: Lsn(lsn), data: d }
    }

    /// The watermark `id` of a chunk, its record ending at `end`.
    pub fn watermark(id: &str, end: u64) -> RawFrame {
        piece_watermark(id, 5, end)
    }

    /// The watermark `id` of a piece or chunk of `rows` rows, its record ending at `end`.
    pub fn piece_watermark(id: &str, rows: usize, end: u64) -> RawFrame {
        let content = watermark_content(id, rows);
        let mut d = vec![b'M', 0];
        d.extend_from_slice(&end.to_be_bytes());
        d.extend_from_slice(WATERMARK_PREFIX.as_bytes());
        d.push(0);
        d.extend_from_slice(&(content.len() as u32).to_be_bytes());
        d.extend_from_slice(content.as_bytes());
        RawFrame { lsn: Lsn(end), data: d }
    }

    /// The transactional message a DDL writes when it records `version` of table `oid`
    /// ([`crate::schema::VERSION_MESSAGE_PREFIX`]), at `lsn`.
    pub fn version_message(oid: u32, version: i32, lsn: u64) -> RawFrame {
        let content = format!("{oid} {version}");
        let mut d = vec![b'M', 1];
        d.extend_from_slice(&lsn.to_be_bytes());
        d.extend_from_slice(crate::schema::VERSION_MESSAGE_PREFIX.as_bytes());
        d.push(0);
        d.extend_from_slice(&(content.len() as u32).to_be_bytes());
        d.extend_from_slice(content.as_bytes());
        RawFrame { lsn: Lsn(lsn), data: d }
    }

    /// The Relation message of `rel`, at `lsn`.
    pub fn relation_frame(rel: &Relation, lsn: u64) -> RawFrame {
        let mut d = vec![b'R'];
        write_relation(&mut d, rel);
        RawFrame { lsn: Lsn(lsn), data: d }
    }
}

#[cfg(test)]
mod tests {
    use super::crate_dir;

    #[test]
    fn test_files_are_found_where_cargo_runs_the_tests_not_where_the_binary_was_compiled() {
        // A binary compiled in a clone that is gone since: cargo's directory of this run wins.
        let dir = crate_dir("/a/clone/that/is/gone/crates/cdc-core");
        assert!(dir.join("tests/golden/basic.frames").is_file(), "{}", dir.display());
    }
}
