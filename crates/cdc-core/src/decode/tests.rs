//! Decoder tests on real pgoutput bytes (tests/golden, captured from PostgreSQL 15).
use super::*;
use crate::testutil::frames;

#[test]
fn decodes_every_golden_frame() {
    for name in ["basic", "types", "toast"] {
        let fr = frames(name);
        assert!(!fr.is_empty(), "{name}");
        for f in &fr {
            decode(&f.data).unwrap_or_else(|e| panic!("{name} at {}: {e}", f.lsn));
        }
    }
}

#[test]
fn basic_stream_has_the_expected_shape() {
    let fr = frames("basic");
    let msgs: Vec<Message<'_>> = fr.iter().map(|f| decode(&f.data).unwrap()).collect();
    let tags: String = fr.iter().map(|f| f.data[0] as char).collect();
    // insert | update | multi-row txn with savepoint rollback and a key change | delete |
    // plain: insert, update, key change, delete | truncate of both tables.
    assert_eq!(tags, "BRICBUCBIIUCBDCBRICBUCBUCBDCBRRTC", "{tags}");
    match &msgs[1] {
        Message::Relation(r) => {
            assert_eq!((r.namespace.as_str(), r.name.as_str()), ("public", "orders"));
            assert_eq!(r.replica_identity, b'f');
            let names: Vec<_> = r.columns.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, ["order_id", "customer_id", "total", "status", "customer_region", "internal_notes"]);
            assert_eq!(r.columns[2].type_oid, 1700);
            assert!(r.columns.iter().all(|c| c.is_key), "FULL marks every column");
        }
        m => panic!("{m:?}"),
    }
    match &msgs[2] {
        Message::Insert { new, .. } => {
            assert_eq!(new[0], TupleValue::Text(b"ORD-12345"));
            assert_eq!(new[2], TupleValue::Text(b"150.00"));
        }
        m => panic!("{m:?}"),
    }
    match &msgs[5] {
        Message::Update { old: Some((OldKind::Full, old)), new, .. } => {
            assert_eq!(old[3], TupleValue::Text(b"pending"));
            assert_eq!(new[3], TupleValue::Text(b"confirmed"));
        }
        m => panic!("{m:?}"),
    }
    let (Message::Begin { final_lsn, xid, commit_time }, Message::Commit { commit_lsn, end_lsn, commit_time: ct, .. }) =
        (&msgs[0], &msgs[3])
    else {
        panic!("B..C")
    };
    assert_eq!(final_lsn, commit_lsn);
    assert!(end_lsn > commit_lsn && *xid > 0 && commit_time == ct);
    // The plain table has the default identity: an update carries no old row, a key change the old key.
    let plain: Vec<_> = msgs.iter().filter(|m| matches!(m, Message::Update { old: None, .. })).collect();
    assert_eq!(plain.len(), 1);
    assert!(msgs.iter().any(|m| matches!(m, Message::Update { old: Some((OldKind::Key, _)), .. })));
    assert!(msgs.iter().any(|m| matches!(m, Message::Delete { kind: OldKind::Key, .. })));
    assert!(msgs.iter().any(|m| matches!(m, Message::Truncate { options: 2, relations, .. } if relations.len() == 2)));
}

#[test]
fn toast_update_sends_unchanged_marker() {
    let fr = frames("toast");
    let updates: Vec<_> = fr
        .iter()
        .filter_map(|f| match decode(&f.data).unwrap() {
            Message::Update { old, new, .. } => Some((old.map(|o| o.0), new[2])),
            _ => None,
        })
        .collect();
    assert_eq!(updates.len(), 2);
    // docs_full: the old row is complete (flattened) and the new value is 'u'.
    assert_eq!(updates[0].0, Some(OldKind::Full));
    assert_eq!(updates[0].1, TupleValue::UnchangedToast);
    // docs_default: no old row at all, and the new value is 'u'.
    assert_eq!(updates[1].0, None);
    assert_eq!(updates[1].1, TupleValue::UnchangedToast);
}

#[test]
fn malformed_frames_are_errors_not_panics() {
    let fr = frames("basic");
    for f in &fr {
        for cut in 0..f.data.len() {
            let _ = decode(&f.data[..cut]);
        }
        let mut longer = f.data.clone();
        longer.push(0);
        assert!(decode(&longer).is_err(), "trailing byte accepted");
    }
    assert!(decode(b"").is_err());
    assert!(decode(b"Z").is_err());
    // A tuple claiming 65535 columns in a short frame.
    assert!(decode(&[b'I', 0, 0, 0, 1, b'N', 0xff, 0xff]).is_err());
    // A text value whose length runs past the end.
    assert!(decode(&[b'I', 0, 0, 0, 1, b'N', 0, 1, b't', 0x7f, 0xff, 0xff, 0xff]).is_err());
}

#[test]
fn decodes_a_logical_message() {
    let mut m = vec![b'M', 0];
    m.extend_from_slice(&42u64.to_be_bytes());
    m.extend_from_slice(b"pg_cdc.heartbeat\0");
    m.extend_from_slice(&3u32.to_be_bytes());
    m.extend_from_slice(b"abc");
    assert_eq!(
        decode(&m).unwrap(),
        Message::LogicalMessage { transactional: false, lsn: Lsn(42), prefix: "pg_cdc.heartbeat", content: b"abc" }
    );
}
