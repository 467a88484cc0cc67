use std::cell::RefCell;
use std::rc::Rc;

use super::*;
use crate::decode::RelationColumn;

const SENSORS: u32 = 500;
const ID: LookupId = LookupId { table_oid: 600, position: 0 };

/// The persisted copy, shared with the test so it can look at what was fetched.
#[derive(Default)]
struct Copy {
    rows: HashMap<String, Vec<Option<String>>>,
    fetched: Vec<String>,
}

struct Source(Rc<RefCell<Copy>>);

impl LookupSource for Source {
    fn fetch(&mut self, id: LookupId, key: &str) -> Result<Option<LookupRow>, String> {
        assert_eq!(id, ID);
        let mut copy = self.0.borrow_mut();
        copy.fetched.push(key.to_string());
        Ok(copy.rows.get(key).map(|r| r.iter().map(|v| v.as_deref().map(Box::from)).collect()))
    }
}

fn relation() -> Relation {
    let col = |name: &str, is_key| RelationColumn { name: name.into(), type_oid: 25, type_mod: -1, is_key };
    Relation {
        oid: SENSORS,
        namespace: "public".into(),
        name: "sensors".into(),
        replica_identity: b'd',
        columns: vec![col("sensor_id", true), col("location", false), col("owner", false)],
    }
}

fn binding(as_of: u64) -> LookupBinding {
    LookupBinding {
        id: ID,
        lookup_oid: SENSORS,
        lookup_column: "sensor_id".into(),
        add_columns: vec!["owner".into(), "location".into()],
        add_types: vec![25, 25],
        as_of: Lsn(as_of),
    }
}

fn setup(as_of: u64, copy: &[(&str, &str, &str)]) -> (Lookups, Rc<RefCell<Copy>>) {
    let shared = Rc::new(RefCell::new(Copy::default()));
    for (k, owner, loc) in copy {
        shared.borrow_mut().rows.insert(k.to_string(), vec![Some(owner.to_string()), Some(loc.to_string())]);
    }
    let mut l = Lookups::default();
    l.set_source(Box::new(Source(shared.clone())));
    l.set_bindings(&[binding(as_of)]);
    l.relation(&relation());
    (l, shared)
}

fn row<'a>(id: &'a str, loc: &'a str, owner: &'a str) -> Tuple<'a> {
    vec![TupleValue::Text(id.as_bytes()), TupleValue::Text(loc.as_bytes()), TupleValue::Text(owner.as_bytes())]
}

fn owner(l: &mut Lookups, key: &str) -> (Option<String>, Answer) {
    let (r, a) = l.lookup(ID, key).unwrap();
    (r.and_then(|r| r[0].as_deref().map(str::to_string)), a)
}

#[test]
fn a_miss_reads_the_copy_once_then_memory_answers() {
    let (mut l, copy) = setup(100, &[("S1", "Facilities", "Building A")]);
    assert_eq!(owner(&mut l, "S1"), (Some("Facilities".into()), Answer::Miss));
    assert_eq!(owner(&mut l, "S1"), (Some("Facilities".into()), Answer::Hit));
    assert_eq!(owner(&mut l, "S9"), (None, Answer::Miss));
    assert_eq!(owner(&mut l, "S9"), (None, Answer::Hit), "absent rows are remembered too");
    assert_eq!(copy.borrow().fetched, ["S1", "S9"]);
}

#[test]
fn changes_apply_at_commit_and_only_when_the_copy_lacks_them() {
    let (mut l, copy) = setup(100, &[("S1", "Facilities", "Building A")]);
    // Committed before the copy's position: already in it (read again after a restart).
    let old = [LookupChange::Upsert { oid: SENSORS, old: None, new: row("S1", "Old", "Old team") }];
    l.commit(Lsn(90), Lsn(95), &old).unwrap();
    assert_eq!(owner(&mut l, "S1").0.as_deref(), Some("Facilities"));
    let new = [LookupChange::Upsert { oid: SENSORS, old: None, new: row("S1", "Building B", "Ops") }];
    l.commit(Lsn(100), Lsn(120), &new).unwrap();
    assert_eq!(owner(&mut l, "S1"), (Some("Ops".into()), Answer::Hit));
    // The same transaction read again (its events re-sent) is not applied twice.
    l.commit(Lsn(100), Lsn(120), &[LookupChange::Delete { oid: SENSORS, old: row("S1", "", "") }]).unwrap();
    assert_eq!(owner(&mut l, "S1").0.as_deref(), Some("Ops"));
    // Other tables' changes are not lookups.
    l.commit(Lsn(130), Lsn(140), &[LookupChange::Delete { oid: 777, old: row("S1", "", "") }]).unwrap();
    assert_eq!(owner(&mut l, "S1").0.as_deref(), Some("Ops"));
    l.commit(Lsn(150), Lsn(160), &[LookupChange::Delete { oid: SENSORS, old: row("S1", "", "") }]).unwrap();
    assert_eq!(owner(&mut l, "S1"), (None, Answer::Hit));
    assert_eq!(copy.borrow().fetched, ["S1"], "only the first read needed the copy");
}

#[test]
fn a_key_change_deletes_the_old_key_and_unchanged_toast_keeps_values() {
    let (mut l, _) = setup(0, &[("S1", "Facilities", "Building A")]);
    let ch = [LookupChange::Upsert { oid: SENSORS, old: Some(row("S1", "", "")), new: row("S2", "B", "Ops") }];
    l.commit(Lsn(10), Lsn(20), &ch).unwrap();
    assert_eq!(owner(&mut l, "S1").0, None);
    assert_eq!(owner(&mut l, "S2").0.as_deref(), Some("Ops"));
    let toast = vec![TupleValue::Text(b"S2"), TupleValue::Text(b"C"), TupleValue::UnchangedToast];
    l.commit(Lsn(30), Lsn(40), &[LookupChange::Upsert { oid: SENSORS, old: None, new: toast }]).unwrap();
    let (r, _) = l.lookup(ID, "S2").unwrap();
    let r = r.unwrap();
    assert_eq!((r[0].as_deref(), r[1].as_deref()), (Some("Ops"), Some("C")));
}

#[test]
fn flush_hands_over_changed_rows_and_the_position_once() {
    let (mut l, _) = setup(100, &[("S1", "Facilities", "Building A")]);
    owner(&mut l, "S1");
    let ch = [
        LookupChange::Upsert { oid: SENSORS, old: None, new: row("S2", "B", "Ops") },
        LookupChange::Delete { oid: SENSORS, old: row("S3", "", "") },
    ];
    l.commit(Lsn(100), Lsn(110), &ch).unwrap();
    let mut f = l.take_flush();
    assert_eq!(f.len(), 1);
    f[0].rows.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(f[0].as_of, Lsn(110));
    assert!(!f[0].truncate);
    assert_eq!(f[0].rows.len(), 2);
    assert_eq!(f[0].rows[0].0, "S2");
    assert_eq!(f[0].rows[1], ("S3".to_string(), None));
    assert!(l.take_flush().is_empty(), "nothing changed since");
    // A transaction without lookup changes still moves the position.
    l.commit(Lsn(200), Lsn(210), &[]).unwrap();
    assert_eq!(l.take_flush()[0].as_of, Lsn(210));
}

#[test]
fn truncate_empties_the_copy_without_reading_it() {
    let (mut l, copy) = setup(0, &[("S1", "Facilities", "Building A")]);
    l.commit(Lsn(10), Lsn(20), &[LookupChange::Truncate(vec![SENSORS])]).unwrap();
    assert_eq!(owner(&mut l, "S1").0, None);
    assert!(copy.borrow().fetched.is_empty());
    let f = l.take_flush();
    assert!(f[0].truncate);
}

#[test]
fn eviction_keeps_unflushed_rows_and_bounds_the_rest() {
    let copy: Vec<(String, String, String)> = (0..1000).map(|i| (format!("S{i}"), "o".into(), "l".into())).collect();
    let refs: Vec<(&str, &str, &str)> = copy.iter().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())).collect();
    let (mut l, source) = setup(0, &refs);
    l.set_capacity(50);
    l.commit(Lsn(1), Lsn(2), &[LookupChange::Upsert { oid: SENSORS, old: None, new: row("S5", "new", "new") }])
        .unwrap();
    for round in 0..3 {
        for i in 0..1000 {
            let (o, _) = owner(&mut l, &format!("S{i}"));
            assert_eq!(o.as_deref(), Some(if i == 5 { "new" } else { "o" }), "round {round} key S{i}");
        }
    }
    assert!(l.caches[0].rows.len() <= 50 + 50 / 8 + 2, "{} rows in memory", l.caches[0].rows.len());
    assert!(source.borrow().fetched.iter().all(|k| k != "S5"), "the unflushed row was never evicted");
}

#[test]
fn reset_and_rebinding_go_back_to_the_copy() {
    let (mut l, _) = setup(100, &[("S1", "Facilities", "Building A")]);
    l.commit(Lsn(100), Lsn(110), &[LookupChange::Upsert { oid: SENSORS, old: None, new: row("S1", "B", "Ops") }])
        .unwrap();
    // Same binding again (the next step): memory is kept.
    l.set_bindings(&[binding(100)]);
    assert_eq!(owner(&mut l, "S1").0.as_deref(), Some("Ops"));
    // After a failure the sink reads again from the slot: memory starts from the copy.
    l.reset();
    l.set_bindings(&[binding(100)]);
    l.relation(&relation());
    assert_eq!(owner(&mut l, "S1"), (Some("Facilities".into()), Answer::Miss));
}

#[test]
fn a_change_before_the_relation_description_is_an_error() {
    let mut l = Lookups::default();
    l.set_bindings(&[binding(0)]);
    let e = l.commit(Lsn(1), Lsn(2), &[LookupChange::Delete { oid: SENSORS, old: row("S1", "", "") }]).unwrap_err();
    assert!(e.contains("before its description"), "{e}");
}
