//! The group log and a member's feed, played out on files in a temporary directory.
//!
//! The oracle of the feed is a model of the WAL (transactions of changes and messages) rendered
//! twice, independently of the feed: as the group's session emits it (every table; a Relation
//! before a table's first change in the session) and as a session of the member's own would (its
//! tables only; a transaction with nothing for it left out). The feed of the first must equal the
//! second, up to the Relation frames of tables the member does not carry.
use std::collections::HashSet;
use std::path::PathBuf;

use super::feed::{Feed, Opened};
use super::log::{trimmed_under, LogEnd, LogReader, LogWriter, Start, SEGMENT_HEADER};
use crate::frame::RawFrame;
use crate::testutil::wal::{begin, commit, delete, insert, relation, relation_frame};
use crate::Lsn;

/// Fails with the first frame where `got` and `expected` differ (the whole streams are too long to read).
#[track_caller]
fn assert_same(got: &[RawFrame], expected: &[RawFrame], what: &str) {
    let show = |f: Option<&RawFrame>| {
        f.map(|f| format!("{}@{}{:?}", f.data[0] as char, f.lsn.0, &f.data[1..14.min(f.data.len())]))
    };
    if let Some(i) = (0..got.len().max(expected.len())).find(|&i| got.get(i) != expected.get(i)) {
        let around = |v: &[RawFrame]| (i.saturating_sub(3)..i + 3).map(|j| show(v.get(j))).collect::<Vec<_>>();
        panic!(
            "{what}: frame {i} differs (of {} and {}):\n got      {:?}\n expected {:?}",
            got.len(),
            expected.len(),
            around(got),
            around(expected)
        );
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("cdc_fanout_{name}_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A logical message at `lsn`, inside a transaction or not.
fn message(transactional: bool, lsn: u64) -> RawFrame {
    let mut d = vec![b'M', u8::from(transactional)];
    d.extend_from_slice(&lsn.to_be_bytes());
    d.extend_from_slice(b"pg_cdc.test\0");
    d.extend_from_slice(&2u32.to_be_bytes());
    d.extend_from_slice(b"hi");
    RawFrame { lsn: Lsn(lsn), data: d }
}

/// A TRUNCATE of `oids`.
fn truncate(oids: &[u32], lsn: u64) -> RawFrame {
    let mut d = vec![b'T'];
    d.extend_from_slice(&(oids.len() as u32).to_be_bytes());
    d.push(0);
    for oid in oids {
        d.extend_from_slice(&oid.to_be_bytes());
    }
    RawFrame { lsn: Lsn(lsn), data: d }
}

/// What happened in the WAL, one unit at a time.
#[derive(Debug, Clone)]
enum Unit {
    /// A transaction: its changes (table, row; `None` row: a TRUNCATE of the tables listed) and
    /// whether it emitted a transactional message.
    Transaction { changes: Vec<(Vec<u32>, Option<u32>)>, message: bool },
    /// A message outside any transaction.
    Message,
}

/// The model rendered as a session emits it, carrying `carried` (all when `None`): each unit with
/// its commit position, and its frames (a transaction with nothing carried and no message emits
/// none).
fn render(units: &[Unit], carried: Option<&HashSet<u32>>) -> Vec<(Lsn, Vec<RawFrame>)> {
    render_from(units, carried, 0)
}

/// The same, by a session that starts at unit `from` (it describes each table again before its
/// first change).
fn render_from(units: &[Unit], carried: Option<&HashSet<u32>>, from: usize) -> Vec<(Lsn, Vec<RawFrame>)> {
    let carries = |oid: &u32| carried.is_none_or(|c| c.contains(oid));
    let mut described: HashSet<u32> = HashSet::new();
    let mut out = Vec::new();
    for (i, unit) in units.iter().enumerate().skip(from) {
        let base = 1_000 + 1_000 * i as u64;
        let commit_at = base + 900;
        match unit {
            Unit::Message => out.push((Lsn(base), vec![message(false, base)])),
            Unit::Transaction { changes, message: with_message } => {
                let mut frames = vec![begin(i as u32 + 1, commit_at)];
                let mut any = false;
                for (j, (oids, row)) in changes.iter().enumerate() {
                    let lsn = base + 10 * (j as u64 + 1);
                    let shown: Vec<u32> = oids.iter().copied().filter(carries).collect();
                    if shown.is_empty() {
                        continue;
                    }
                    any = true;
                    // pgoutput describes every table of a TRUNCATE it sends, one row's table else.
                    let described_now = if row.is_none() { oids.clone() } else { shown.clone() };
                    for oid in &described_now {
                        if described.insert(*oid) {
                            frames.push(relation_frame(&relation(*oid), lsn));
                        }
                    }
                    frames.push(match row {
                        Some(r) if r % 2 == 0 => insert(shown[0], *r, lsn),
                        Some(r) => delete(shown[0], *r, lsn),
                        // pgoutput lists every truncated table it publishes.
                        None => truncate(oids, lsn),
                    });
                }
                if *with_message {
                    any = true;
                    frames.push(message(true, base + 500));
                }
                frames.push(commit(commit_at));
                out.push((Lsn(commit_at), if any { frames } else { Vec::new() }));
            }
        }
    }
    out
}

/// A model of `n` units over tables 1, 2 and 3 from `seed`.
fn model(seed: u64, n: usize) -> Vec<Unit> {
    let mut state = seed;
    let mut next = move |m: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % m
    };
    (0..n)
        .map(|_| match next(10) {
            0 => Unit::Message,
            _ => {
                let changes = (0..1 + next(4))
                    .map(|_| match next(12) {
                        0 => (vec![1 + next(3) as u32, 1 + next(3) as u32], None),
                        _ => (vec![1 + next(3) as u32], Some(next(100) as u32)),
                    })
                    .collect();
                Unit::Transaction { changes, message: next(8) == 0 }
            }
        })
        .collect()
}

fn write_log(dir: &std::path::Path, units: &[(Lsn, Vec<RawFrame>)], segment_bytes: u64) -> (LogWriter, LogEnd) {
    let mut w = LogWriter::create(dir, Lsn(0), segment_bytes).unwrap();
    for (_, frames) in units {
        for f in frames {
            w.append(f).unwrap();
        }
    }
    let end = w.publish().unwrap();
    (w, end)
}

fn feed(dir: &std::path::Path, confirmed: Lsn, end: LogEnd, carried: Option<HashSet<u32>>) -> Box<Feed> {
    match Feed::open(dir, confirmed, end, carried).unwrap() {
        Opened::Feed(f) => f,
        other => panic!("expected a feed, got {other:?}"),
    }
}

/// Everything the feed hands out of a log of `frames` frames, pulling `step` at a time (a pull
/// may hand out nothing while it holds a transaction back).
fn pull_all(feed: &mut Feed, end: LogEnd, frames: usize, step: usize) -> Vec<RawFrame> {
    let mut out = Vec::new();
    for _ in 0..=frames / step + 1 {
        out.extend(feed.pull(end, step).unwrap());
    }
    assert!(feed.pull(end, usize::MAX).unwrap().is_empty(), "frames left after {frames}");
    out
}

fn count(units: &[(Lsn, Vec<RawFrame>)]) -> usize {
    units.iter().map(|(_, f)| f.len()).sum()
}

#[test]
fn a_reader_gets_every_frame_in_order_across_segments_and_only_what_was_published() {
    let tmp = TempDir::new("order");
    let units = render(&model(7, 300), None);
    let all: Vec<RawFrame> = units.iter().flat_map(|(_, f)| f.clone()).collect();
    let mut w = LogWriter::create(&tmp.0, Lsn(0), 2_000).unwrap();
    let Start::At(mut r, relations) = LogReader::open(&tmp.0, Lsn(0), w.published()).unwrap() else {
        panic!("an empty log serves the position it started at");
    };
    assert!(relations.is_empty());
    let mut read = Vec::new();
    for (_, frames) in &units {
        read.extend(r.read(w.published(), usize::MAX).unwrap());
        for f in frames {
            w.append(f).unwrap();
        }
        // Nothing past the published end is read.
        assert!(r.read(w.published(), usize::MAX).unwrap().is_empty(), "frames read before they were published");
        let end = w.publish().unwrap();
        read.extend(r.read(end, 3).unwrap());
    }
    read.extend(r.read(w.publish().unwrap(), usize::MAX).unwrap());
    assert!(w.segments() > 10, "the test should span many segments, got {}", w.segments());
    assert_eq!(read, all);
}

/// Pulls of a few frames, of more than one chunk of the feed's reads (each chunk's frames read into
/// the buffers of frames dropped before, of other sizes), and of the whole log at once.
#[test]
fn a_feed_gives_a_member_what_its_own_session_would_emit() {
    for seed in 1..=20 {
        let units = model(seed, 200);
        let group = render(&units, None);
        for carried in [HashSet::from([1]), HashSet::from([2, 3])] {
            for step in [7, 300, 1 << 20] {
                let tmp = TempDir::new(&format!("equiv{seed}"));
                let (_, end) = write_log(&tmp.0, &group, 4_000);
                let mut f = feed(&tmp.0, Lsn(0), end, Some(carried.clone()));
                let got = pull_all(&mut f, end, count(&group), step);
                let own: Vec<RawFrame> = render(&units, Some(&carried)).into_iter().flat_map(|(_, f)| f).collect();
                assert_same(&got, &own, &format!("seed {seed}, tables {carried:?}, {step} at a time"));
            }
        }
    }
}

#[test]
fn a_feed_from_a_position_skips_what_it_covers_and_knows_the_tables_described_before() {
    let units = model(11, 400);
    let group = render(&units, None);
    let carried = HashSet::from([2]);
    let tmp = TempDir::new("position");
    let (mut w, end) = write_log(&tmp.0, &group, 3_000);
    for cut in [0, 1, 57, 200, 399] {
        // The member delivered every unit before `cut`: its position is the last one's end (a
        // commit's end is 16 bytes past it; a message's end is its LSN).
        let confirmed = if cut == 0 {
            Lsn(0)
        } else {
            match &units[cut - 1] {
                Unit::Message => group[cut - 1].0,
                Unit::Transaction { .. } => Lsn(group[cut - 1].0 .0 + 16),
            }
        };
        let mut f = feed(&tmp.0, confirmed, end, Some(carried.clone()));
        let got = pull_all(&mut f, end, count(&group), 50);
        // What a session of the member's own started there would emit.
        let own: Vec<RawFrame> = render_from(&units, Some(&carried), cut).into_iter().flat_map(|(_, f)| f).collect();
        assert_same(&got, &own, &format!("cut at unit {cut}"));
    }
    // Trimmed up to a position: an older one is no longer served, that one still is.
    let confirmed = Lsn(group[250].0 .0 + 16);
    assert!(w.trim(confirmed).unwrap() > 0);
    assert!(matches!(Feed::open(&tmp.0, Lsn(0), end, None).unwrap(), Opened::Behind));
    let mut f = feed(&tmp.0, confirmed, end, Some(carried.clone()));
    let own: Vec<RawFrame> = render_from(&units, Some(&carried), 251).into_iter().flat_map(|(_, f)| f).collect();
    assert_same(&pull_all(&mut f, end, count(&group), 50), &own, "after the trim");
}

#[test]
fn a_feed_counts_the_wal_it_moved_over_whatever_its_tables() {
    // The rate behind lag_events is a member's events per WAL byte read: a member reading the log
    // decodes nothing itself, so the WAL its log frames span stands for it — every table's frames,
    // whether the member carries that table or not, and nothing before its position.
    let units = model(13, 300);
    let group = render(&units, None);
    let furthest = group.iter().flat_map(|(_, f)| f).map(|f| f.lsn).max().unwrap();
    let tmp = TempDir::new("passed");
    let (_, end) = write_log(&tmp.0, &group, 5_000);
    for (cut, carried) in [(0, None), (120, Some(HashSet::from([2]))), (120, Some(HashSet::from([99])))] {
        let confirmed = if cut == 0 { Lsn(0) } else { Lsn(group[cut - 1].0 .0 + 16) };
        let mut f = feed(&tmp.0, confirmed, end, carried.clone());
        let mut passed = 0;
        for _ in 0..=count(&group) / 9 + 1 {
            f.pull(end, 9).unwrap();
            passed += f.take_wal_passed();
        }
        assert_eq!(passed, furthest.0 - confirmed.0, "from unit {cut}, tables {carried:?}");
        assert_eq!(f.take_wal_passed(), 0, "counted once");
    }
}

#[test]
fn trim_keeps_the_segment_a_member_starts_in_and_the_one_being_written() {
    let tmp = TempDir::new("trim");
    let group = render(&model(3, 100), None);
    let (mut w, end) = write_log(&tmp.0, &group, 1);
    // A segment per unit (each unit starts a new one once the current holds a byte).
    let segments = w.segments();
    assert_eq!(segments, group.iter().filter(|(_, f)| !f.is_empty()).count());
    assert_eq!(w.trim(Lsn(0)).unwrap(), 0);
    let last = group.iter().rev().find(|(_, f)| !f.is_empty()).unwrap();
    assert_eq!(w.trim(Lsn(u64::MAX)).unwrap(), segments - 1, "the segment being written stays");
    assert!(matches!(LogReader::open(&tmp.0, Lsn(0), end).unwrap(), Start::Behind));
    let Start::At(mut r, _) = LogReader::open(&tmp.0, Lsn(u64::MAX), end).unwrap() else { panic!() };
    assert_eq!(r.read(end, usize::MAX).unwrap(), last.1);
}

#[test]
fn a_feed_whose_next_segment_was_trimmed_under_it_says_so_and_nothing_else_does() {
    // A member reading the first segment while the writer trims past it (a member that lags
    // more than the bound is left out of the trim): its next read finds the segment after
    // its own gone. That, and only that, reads as `trimmed_under` (it leaves for its own slot).
    let tmp = TempDir::new("trimmed_under");
    let group = render(&model(5, 40), None);
    let (mut w, end) = write_log(&tmp.0, &group, 1);
    let mut f = feed(&tmp.0, Lsn(0), end, None);
    // Into the first unit (its Begin is held until a change of it comes): its segment is open.
    while f.pull(end, 1).unwrap().is_empty() {}
    assert!(w.trim(Lsn(u64::MAX)).unwrap() > 1);
    let err = (0..count(&group)).find_map(|_| f.pull(end, 1).err()).expect("a read past the trimmed segments");
    assert!(trimmed_under(&err), "{err}");
    assert!(err.to_string().contains("trimmed before this reader reached it"), "{err}");
    // A segment cut short is a broken log, not a trimmed one.
    let torn = TempDir::new("torn");
    let (_w, end) = write_log(&torn.0, &group, 1);
    let seg = std::fs::read_dir(&torn.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .min()
        .unwrap();
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 1).unwrap();
    let mut f = feed(&torn.0, Lsn(0), end, None);
    let err = (0..count(&group)).find_map(|_| f.pull(end, 1).err()).expect("a read of the torn segment");
    assert!(!trimmed_under(&err), "{err}");
}

#[test]
fn a_log_that_started_after_a_position_does_not_serve_it() {
    let tmp = TempDir::new("start");
    let mut w = LogWriter::create(&tmp.0, Lsn(5_000), 1 << 20).unwrap();
    w.append(&begin(1, 6_000)).unwrap();
    w.append(&insert(1, 2, 5_500)).unwrap();
    w.append(&commit(6_000)).unwrap();
    let end = w.publish().unwrap();
    assert_eq!(w.complete_to(), Lsn(6_016));
    assert!(matches!(LogReader::open(&tmp.0, Lsn(4_999), end).unwrap(), Start::Behind));
    assert!(matches!(LogReader::open(&tmp.0, Lsn(5_000), end).unwrap(), Start::At(..)));
    assert!(matches!(LogReader::open(tmp.0.join("nothing"), Lsn(5_000), end).unwrap(), Start::Missing));
    // A log cannot start inside a transaction.
    let other = TempDir::new("start_bad");
    let mut w = LogWriter::create(&other.0, Lsn(0), 1 << 20).unwrap();
    assert!(w.append(&insert(1, 2, 10)).is_err());
}

#[test]
fn a_torn_relation_record_is_ignored_and_only_the_last_description_is_replayed() {
    let tmp = TempDir::new("relations");
    let mut w = LogWriter::create(&tmp.0, Lsn(0), 1).unwrap();
    let mut wide = relation(1);
    wide.columns.truncate(1);
    for (i, rel) in [relation(1), wide.clone(), relation(2)].iter().enumerate() {
        let c = 1_000 * (i as u64 + 1);
        for f in [begin(i as u32, c), relation_frame(rel, c - 100), insert(rel.oid, 1, c - 50), commit(c)] {
            w.append(&f).unwrap();
        }
    }
    for f in [begin(9, 9_000), insert(1, 1, 8_950), commit(9_000)] {
        w.append(&f).unwrap();
    }
    let end = w.publish().unwrap();
    // Half a record, as a writer cut short leaves it.
    use std::io::Write;
    let mut rel = std::fs::OpenOptions::new().append(true).open(tmp.0.join("relations")).unwrap();
    rel.write_all(&[0u8; 20]).unwrap();
    let Start::At(_, replayed) = LogReader::open(&tmp.0, Lsn(8_000), end).unwrap() else { panic!() };
    // Reading starts in the segment of the transaction at 3000 (the last one 8000 covers), so
    // table 2's description comes in the stream; table 1's last one before it is replayed.
    assert_eq!(replayed, vec![relation_frame(&wide, 1_900)]);
    assert!(end.bytes > SEGMENT_HEADER);
}

#[test]
fn a_feed_says_when_it_stopped_inside_a_transaction_it_hands_out() {
    let tmp = TempDir::new("mid");
    let mut w = LogWriter::create(&tmp.0, Lsn(0), 1 << 20).unwrap();
    for f in [begin(1, 1_000), relation_frame(&relation(1), 900), insert(1, 1, 900), insert(1, 2, 910), commit(1_000)] {
        w.append(&f).unwrap();
    }
    let end = w.publish().unwrap();
    let mut f = feed(&tmp.0, Lsn(0), end, Some(HashSet::from([1])));
    let mut inside = Vec::new();
    while !f.caught_up(end) {
        f.pull(end, 1).unwrap();
        inside.push(f.mid_transaction());
    }
    // Begin and the Relation are held until the first change; the Commit closes it.
    assert_eq!(inside, [false, false, true, true, false]);
}

#[test]
fn a_read_that_stopped_inside_a_transaction_ends_at_its_commit_and_no_further() {
    let units = model(5, 300);
    let group = render(&units, None);
    let carried = HashSet::from([1, 3]);
    let own: Vec<RawFrame> = render(&units, Some(&carried)).into_iter().flat_map(|(_, f)| f).collect();
    let tmp = TempDir::new("finish");
    let (_, end) = write_log(&tmp.0, &group, 5_000);
    for step in [1, 3, 40] {
        let mut f = feed(&tmp.0, Lsn(0), end, Some(carried.clone()));
        let (mut got, mut finished) = (Vec::new(), 0);
        for _ in 0..=count(&group) {
            // A member's read: a pull, then the rest of the transaction it stopped inside of.
            let mut read = f.pull(end, step).unwrap();
            if f.mid_transaction() {
                finished += 1;
                let mut rest = Vec::new();
                while f.mid_transaction() {
                    rest.extend(f.finish_transaction(end, step).unwrap());
                }
                let commits = rest.iter().filter(|fr| fr.data[0] == b'C').count();
                assert!(commits <= 1, "step {step}: the rest of one transaction held {commits} commits");
                read.extend(rest);
                assert_eq!(read.last().map(|fr| fr.data[0]), Some(b'C'), "step {step}: a read ends at a Commit");
            }
            got.extend(read);
        }
        assert!(f.caught_up(end));
        assert!(finished > 0, "step {step}: no read stopped inside a transaction");
        assert_same(&got, &own, &format!("step {step}"));
    }
}

#[test]
fn each_publish_says_whose_tables_it_touched_and_a_member_it_does_not_concern_gets_nothing_from_it() {
    let tmp = TempDir::new("touched");
    let units = model(13, 300);
    let group = render(&units, None);
    let mut w = LogWriter::create(&tmp.0, Lsn(0), 4_000).unwrap();
    let end0 = w.published();
    let carried = [HashSet::from([1]), HashSet::from([2, 3]), HashSet::from([4])];
    let mut feeds: Vec<Box<Feed>> = carried.iter().map(|c| feed(&tmp.0, Lsn(0), end0, Some(c.clone()))).collect();
    let (mut concerned, mut not_concerned) = (0, 0);
    for (unit, (_, frames)) in units.iter().zip(&group) {
        for f in frames {
            w.append(f).unwrap();
        }
        let end = w.publish().unwrap();
        let touched = w.take_touched();
        // The oracle: the model's unit itself.
        let (tables, message) = match unit {
            Unit::Message => (Default::default(), true),
            Unit::Transaction { changes, message } => {
                (changes.iter().flat_map(|(oids, _)| oids.iter().copied()).collect(), *message)
            }
        };
        assert_eq!(touched.tables, tables);
        assert_eq!(touched.message, message);
        assert!(w.take_touched().is_empty(), "taking it again gives nothing new");
        for (f, c) in feeds.iter_mut().zip(&carried) {
            let c: Vec<u32> = c.iter().copied().collect();
            let got = f.pull(end, usize::MAX).unwrap();
            // A member the publish does not concern may sleep through it: its feed hands nothing out.
            assert_eq!(!got.is_empty(), touched.concerns(Some(&c)), "unit {unit:?}, tables {c:?}");
            if touched.concerns(Some(&c)) {
                concerned += 1;
            } else {
                not_concerned += 1;
            }
        }
        assert_eq!(touched.concerns(None), !frames.is_empty());
    }
    assert!(concerned > 100 && not_concerned > 100, "{concerned} concerned, {not_concerned} not");
}

#[test]
fn the_members_heartbeat_waits_for_the_interval_unless_the_group_slot_is_far_behind() {
    use super::{members_heartbeat_due, MEMBERS_HEARTBEAT_BYTES};
    use std::time::Duration;
    let interval = Duration::from_secs(10);
    let soon = Duration::from_secs(3);
    let default_lag = 1024 << 20;
    // Caught up: never, however long since the last one.
    assert!(!members_heartbeat_due(0, Duration::MAX, interval, default_lag));
    // Behind by a steady load's few seconds of WAL (what the old 2 MB bound answered every 3 s).
    assert!(!members_heartbeat_due(2 << 20, soon, interval, default_lag));
    assert!(!members_heartbeat_due(MEMBERS_HEARTBEAT_BYTES - 1, soon, interval, default_lag));
    assert!(members_heartbeat_due(1, interval, interval, default_lag));
    assert!(members_heartbeat_due(MEMBERS_HEARTBEAT_BYTES, soon, interval, default_lag));
    // A small lag bound brings it sooner: a quarter of it, long before a member would lose the log.
    let small_lag = 1 << 20;
    assert!(!members_heartbeat_due(small_lag / 4 - 1, soon, interval, small_lag));
    assert!(members_heartbeat_due(small_lag / 4, soon, interval, small_lag));
}

/// The feed reads frames into the buffers of frames it dropped; a member's small frame read into a
/// large dropped frame's buffer goes out in a buffer of its own size (the member's spool counts its
/// memory by frame bytes).
#[test]
fn a_frame_read_into_a_larger_frames_spare_buffer_goes_out_fitted() {
    let mut units = Vec::new();
    for k in 0..200u32 {
        let (c, table) = (1_000 + u64::from(k) * 100, if k % 2 == 0 { 2 } else { 1 });
        let mut change = insert(table, k, c - 4);
        if table == 2 {
            change.data.resize(900, b'.');
        }
        units.push((Lsn(c), vec![begin(k, c), change, commit(c)]));
    }
    let tmp = TempDir::new("fitted");
    let (_, end) = write_log(&tmp.0, &units, 1 << 20);
    let mut f = feed(&tmp.0, Lsn(0), end, Some(HashSet::from([1])));
    let got = pull_all(&mut f, end, count(&units), 1 << 20);
    let own: Vec<RawFrame> =
        units.iter().filter(|(_, fr)| fr[1].data.len() < 900).flat_map(|(_, fr)| fr.clone()).collect();
    assert_same(&got, &own, "table 1's transactions");
    let loose = got.iter().filter(|f| f.data.capacity() > 2 * f.data.len() + 64).count();
    assert_eq!(loose, 0, "of {} frames, {loose} went out in oversized buffers", got.len());
}
