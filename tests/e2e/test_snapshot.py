"""Snapshots: a new sink first delivers the rows its tables hold as READ events, consistent with the
changes that follow (no gap, no overlap), read in chunks by key while writes go on.

The oracle is the source table itself (SELECT), compared with the fold by key of what the sink
delivered (each key's last event wins, a DELETE removes it), and exactly-once counts read back from
the destination: nothing of the worker's own state."""
import collections
import json
import os
import random
import threading
import time

import psycopg
import pytest

from conftest import (PG_DSN, connect, consume, crash_at_failpoint, server_log, server_log_size, server_settings,
                      wait_for, worker_back, worker_pid)


@pytest.fixture
def tsinks(pg):
    added = []

    def add(name, table, **extra):
        pg.execute("SELECT cdc_add_sink(%s, 'table', %s::jsonb)", (name, json.dumps({"table": table, **extra})))
        added.append((name, table))

    yield add
    with connect() as conn:
        for name, table in added:
            conn.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (name, name))
            conn.execute(f"DROP TABLE IF EXISTS {table}")


def fold(events):
    """Each key's last event: (operation, key, after) in delivery order -> {key: after}."""
    state = {}
    for op, key, after in events:
        k = json.dumps(key, sort_keys=True)
        if op == "DELETE":
            state.pop(k, None)
        else:
            state[k] = after
    return state


def table_rows(pg, t):
    return {json.dumps({"id": i}, sort_keys=True): {"id": i, "v": v}
            for i, v in pg.execute(f"SELECT id, v FROM {t}").fetchall()}


def event_table(pg, ev, t):
    """(operation, key, after) of the events of table `t` in an event table, in commit order."""
    return pg.execute(f"SELECT operation, event_key, event->'after' FROM {ev} "
                      f"WHERE table_name LIKE %s ORDER BY event_id", ("%" + t,)).fetchall()


def events_up_to_a_last_row(pg, ev, t):
    """Inserts the row (-1, -1) into `t`, waits for its event (everything committed before it is
    delivered then), and returns the events of `t` (event_table)."""
    pg.execute(f"INSERT INTO {t} VALUES (-1, -1)")
    wait_for(lambda: pg.execute(f"SELECT count(*) FROM {ev} WHERE event_key = '{{\"id\": -1}}'").fetchone()[0],
             timeout=120, what="the last row delivered")
    return event_table(pg, ev, t)


def snapshot_rows(pg, sink):
    return pg.execute("SELECT s.state, s.rows_done, s.note FROM _cdc_snapshots s JOIN _cdc_sinks k USING (sink_id) "
                      "WHERE k.sink_name = %s ORDER BY snapshot_id", (sink,)).fetchall()


def snapshot_done(pg, sink):
    rows = snapshot_rows(pg, sink)
    return rows and all(r[0] in ("done", "skipped") for r in rows)


def test_a_sink_added_in_a_transaction_that_wrote_misses_no_row(pg, sinks, unique):
    """The gap the issue measured (820 of 3,000 rows lost): enable + add sink in one transaction,
    then 3,000 single-row INSERTs right after COMMIT. Every row arrives exactly once: what committed
    before the slot as a READ, what after as an INSERT."""
    t, topic, name = f"snap_gap_{unique}", f"snap-gap-{unique}", f"snap_gap_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute(f"INSERT INTO {t} SELECT g, 'before' FROM generate_series(1, 1000) g")
    with pg.transaction():
        pg.execute("SELECT cdc_enable(%s)", (t,))
        sinks.add(name, topic, tables=[t])
    for i in range(1001, 4001):
        pg.execute(f"INSERT INTO {t} VALUES (%s, 'after')", (i,))
    msgs = consume(topic, 4000, timeout=180)
    ids = sorted(m["value"]["after"]["id"] for m in msgs)
    assert ids == list(range(1, 4001)), f"{len(ids)} events for 4000 rows (each exactly once)"
    ops = collections.Counter(m["value"]["metadata"]["operation"] for m in msgs)
    assert ops["READ"] >= 1000 and ops["READ"] + ops["INSERT"] == 4000, ops
    reads = [m["value"] for m in msgs if m["value"]["metadata"]["operation"] == "READ"]
    assert all(r["before"] is None and r["metadata"]["transaction_id"] == 0 for r in reads)
    wait_for(lambda: snapshot_done(pg, name), what="snapshot done")
    state, rows_done, _ = snapshot_rows(pg, name)[0]
    # Rows the chunks read: those inserted while their chunk was in flight arrived as INSERTs.
    assert state == "done" and ops["READ"] <= rows_done <= 4000
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_snapshot_mode_never_is_refused_where_it_would_leave_a_gap(pg, sinks, unique):
    t, name = f"snap_never_{unique}", f"snap_never_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute(f"INSERT INTO {t} VALUES (1, 'old')")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
        with pg.transaction():
            pg.execute(f"INSERT INTO {t} VALUES (2, 'in the same transaction')")
            sinks.add(name, f"snap-never-{unique}", tables=[t], snapshot_mode="never")
    assert "its own transaction" in e.value.diag.message_hint
    assert pg.execute("SELECT count(*) FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0] == 0
    # In its own transaction: only changes, no READ.
    topic = f"snap-never2-{unique}"
    sinks.add(name, topic, tables=[t], snapshot_mode="never")
    pg.execute(f"INSERT INTO {t} VALUES (3, 'new')")
    msgs = consume(topic, 1, timeout=60)
    assert [(m["value"]["metadata"]["operation"], m["value"]["after"]["id"]) for m in msgs] == [("INSERT", 3)]
    assert snapshot_rows(pg, name) == []
    pg.execute("SELECT cdc_disable(%s)", (t,))


def write_around_the_snapshot(t, sink, stop, stats, seed):
    """Changes rows of the chunk in flight and just after it, as fast as it can: updates, deletes,
    key changes and inserts of new and deleted keys, one row per transaction."""
    rnd = random.Random(seed)
    with psycopg.connect(PG_DSN, autocommit=True) as w:
        while not stop.is_set():
            done = w.execute("SELECT (s.last_key)[1]::int FROM _cdc_snapshots s JOIN _cdc_sinks k USING (sink_id) "
                             "WHERE k.sink_name = %s AND s.table_oid = %s::regclass ORDER BY s.snapshot_id DESC "
                             "LIMIT 1", (sink, t)).fetchone()
            base = (done[0] if done and done[0] is not None else 0) + 1
            i = base + rnd.randrange(400)
            op = rnd.random()
            if op < 0.6:
                kind, n = "update", w.execute(f"UPDATE {t} SET v = v + 1 WHERE id = %s", (i,)).rowcount
            elif op < 0.75:
                kind, n = "delete", w.execute(f"DELETE FROM {t} WHERE id = %s", (i,)).rowcount
            elif op < 0.85:
                try:
                    kind, n = "move", w.execute(f"UPDATE {t} SET id = id + 1000000 WHERE id = %s", (i,)).rowcount
                except psycopg.errors.UniqueViolation:
                    kind, n = "move", 0  # moved there before, re-inserted and moved again: the writer goes on
            else:
                kind, n = "insert", w.execute(f"INSERT INTO {t} VALUES (%s, 0) ON CONFLICT DO NOTHING", (i,)).rowcount
            stats[kind] += n


def run_snapshot_under_writes(pg, tsinks, unique, rows=20000, chunk=200, requested=False):
    """A snapshot of `rows` rows while a writer changes the rows around its chunk in flight: a new
    sink's initial snapshot, or (`requested`) one cdc_snapshot asks of a running sink that had none."""
    t, ev, name = f"snap_w_{unique}", f"snap_w_ev_{unique}", f"snap_w_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)")
    pg.execute(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(1, {rows}) g")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    if requested:
        tsinks(name, ev, tables=[t], snapshot_chunk_size=chunk, snapshot_mode="never")
        wait_for(lambda: pg.execute("SELECT state FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
                 == "running", what="sink running")
    stop, stats = threading.Event(), collections.Counter()
    writer = threading.Thread(target=write_around_the_snapshot, args=(t, name, stop, stats, unique))
    writer.start()
    states = set()
    try:
        if requested:
            while sum(stats.values()) < 50:  # changes go on before the snapshot starts too
                time.sleep(0.05)
            ids = [r[0] for r in pg.execute("SELECT cdc_snapshot(%s)", (t,)).fetchall()]
            assert len(ids) == 1
        else:
            tsinks(name, ev, tables=[t], snapshot_chunk_size=chunk)

        def done():
            states.add(pg.execute("SELECT state FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0])
            return snapshot_done(pg, name)
        wait_for(done, timeout=300, what="snapshot done")
    finally:
        stop.set()
        writer.join(30)
    events = events_up_to_a_last_row(pg, ev, t)
    return t, ev, name, events, stats, states


def test_a_snapshot_under_concurrent_writes_folds_to_the_table(pg, tsinks, unique):
    t, ev, name, events, stats, states = run_snapshot_under_writes(pg, tsinks, unique)
    ops = collections.Counter(e[0] for e in events)
    assert ops["READ"] > 15000 and sum(stats.values()) > 100, (ops, stats)
    assert fold(events) == table_rows(pg, t), "the fold of the delivered events is the table"
    dups = pg.execute(f"SELECT count(*) - count(DISTINCT (commit_lsn, event_index)) FROM {ev}").fetchone()[0]
    assert dups == 0
    assert "snapshotting" in states
    assert pg.execute("SELECT state FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0] == "running"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_requested_snapshot_under_concurrent_writes_folds_to_the_table(pg, tsinks, unique):
    """cdc_snapshot on a running sink that had no snapshot (snapshot_mode never): its READ rows
    and the changes around them fold to the table, and cdc_snapshots shows its progress."""
    t, ev, name, events, stats, states = run_snapshot_under_writes(pg, tsinks, unique, requested=True)
    ops = collections.Counter(e[0] for e in events)
    assert ops["READ"] > 15000 and sum(stats.values()) > 100, (ops, stats)
    assert fold(events) == table_rows(pg, t), "the fold of the delivered events is the table"
    reads = collections.Counter(json.dumps(e[1], sort_keys=True) for e in events if e[0] == "READ")
    assert max(reads.values()) == 1, "a requested snapshot reads each row once"
    assert "snapshotting" in states
    view = pg.execute("SELECT kind, state, rows_done, rows_estimate > 0, percent_done, rows_per_second > 0 "
                      "FROM cdc_snapshots WHERE sink_name = %s", (name,)).fetchall()
    assert len(view) == 1 and view[0][:2] == ("requested", "done") and view[0][3:] == (True, 100, True), view
    # Rows the chunks read: those changed while their chunk was in flight arrived as changes. A
    # key moved past the read range, or a key inserted again, can be read a second time.
    assert ops["READ"] <= view[0][2] <= 20000 + stats["move"] + stats["insert"], (view, stats)
    # Asked again while none is under way: a new snapshot, delivered in full again.
    (again,) = pg.execute("SELECT cdc_snapshot(%s, %s)", (t, name)).fetchone()
    wait_for(lambda: snapshot_done(pg, name), what="second snapshot done")
    assert pg.execute("SELECT state, rows_done FROM cdc_snapshots WHERE snapshot_id = %s", (again,)).fetchone() \
        == ("done", pg.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
    pg.execute("SELECT cdc_disable(%s)", (t,))


def sink_state(pg, name):
    return pg.execute("SELECT state FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]


def test_an_initial_only_sink_delivers_its_snapshot_then_finishes_and_holds_no_wal(pg, tsinks, unique):
    """snapshot_mode initial_only: the rows as READ events and the changes committed while they are
    read (a writer changes rows around the chunk in flight for most of the snapshot), folding to the
    table; then the sink is finished, its slot and worker gone, and later changes are not delivered."""
    t, ev, name = f"snap_once_{unique}", f"snap_once_ev_{unique}", f"snap_once_{unique}"
    rows = 20000
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)")
    pg.execute(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(1, {rows}) g")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    stop, stats = threading.Event(), collections.Counter()
    writer = threading.Thread(target=write_around_the_snapshot, args=(t, name, stop, stats, unique))
    tsinks(name, ev, tables=[t], snapshot_chunk_size=200, snapshot_mode="initial_only")
    slot = pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
    writer.start()
    states = set()
    try:
        # The writer stops at about two thirds, so the table holds still when the sink finishes.
        def far_enough():
            states.add(sink_state(pg, name))
            r = snapshot_rows(pg, name)
            return r and r[0][1] > rows * 2 // 3
        wait_for(far_enough, timeout=300, what="two thirds of the snapshot delivered")
    finally:
        stop.set()
        writer.join(30)
    wait_for(lambda: states.add(sink_state(pg, name)) or sink_state(pg, name) == "finished", timeout=300,
             what="sink finished")
    assert states <= {"creating_slot", "starting", "snapshotting", "finished"}, states
    events = event_table(pg, ev, t)
    ops = collections.Counter(e[0] for e in events)
    assert ops["READ"] > rows // 2 and sum(stats.values()) > 100, (ops, stats)
    assert fold(events) == table_rows(pg, t), "the fold of the delivered events is the table"
    assert snapshot_rows(pg, name)[0][0] == "done"
    # Finished: no slot (no WAL held), no worker, and nothing more delivered.
    assert pg.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0] == 0
    status = pg.execute("SELECT state, last_error, slot_name, wal_status FROM cdc_status() WHERE sink_name = %s",
                        (name,)).fetchone()
    assert status == ("finished", None, slot, None), status
    assert worker_pid(pg, name) is None
    count = len(events)
    pg.execute(f"INSERT INTO {t} VALUES (-1, -1)")
    time.sleep(3)
    assert len(event_table(pg, ev, t)) == count, "a finished sink delivers nothing more"
    # It takes no new snapshot: asked by name it refuses, and the table's other requests skip it.
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
        pg.execute("SELECT cdc_snapshot(%s, %s)", (t, name))
    assert "finished" in e.value.diag.message_primary and "Drop it" in e.value.diag.message_hint
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="no sink carries"):
        pg.execute("SELECT cdc_snapshot(%s)", (t,))
    # Nor is there anything to pause.
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is finished"):
        pg.execute("SELECT cdc_pause_sink(%s)", (name,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is finished"):
        pg.execute("SELECT cdc_alter_sink(%s, '{\"retention_hours\": 24}')", (name,))
    pg.execute("SELECT cdc_disable(%s)", (t,))
    pg.execute("SELECT cdc_enable(%s)", (t,))  # its capture starts again: no snapshot for a finished sink
    assert len(snapshot_rows(pg, name)) == 1
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_an_initial_only_sink_finishing_while_a_table_is_added_snapshots_that_table_first(pg, tsinks, unique):
    """The race at the end of an initial_only sink: a table it carries is captured (its snapshot is
    requested) in a transaction still open when the sink is about to finish. The sink waits for that
    transaction, sees the new snapshot, delivers it, and only then finishes."""
    t1, t2, ev, name = f"snap_fin1_{unique}", f"snap_fin2_{unique}", f"snap_fin_ev_{unique}", f"snap_fin_{unique}"
    for t in (t1, t2):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)")
        pg.execute(f"INSERT INTO {t} SELECT g, g FROM generate_series(1, 300) g")
    pg.execute("SELECT cdc_enable(%s)", (t1,))
    with connect() as a:
        a.autocommit = False
        tsinks(name, ev, tables=[t1, t2], snapshot_mode="initial_only", snapshot_chunk_size=100)
        a.execute("SELECT cdc_enable(%s)", (t2,))  # uncommitted: its snapshot request locks the sink's row
        blocked = wait_for(lambda: pg.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE application_name = %s",
            (f"pg_cdc worker: {name}",)).fetchone() == (True,), timeout=60, what="the sink waiting to finish")
        assert blocked and sink_state(pg, name) == "snapshotting"
        a.commit()
    wait_for(lambda: sink_state(pg, name) == "finished", timeout=120, what="sink finished")
    assert [r[0] for r in snapshot_rows(pg, name)] == ["done", "done"]
    for t in (t1, t2):
        assert fold(event_table(pg, ev, t)) == table_rows(pg, t), t
    for t in (t1, t2):
        pg.execute("SELECT cdc_disable(%s)", (t,))


@pytest.mark.parametrize("mode", ["initial", "initial_only"])
def test_a_cancelled_snapshot_stops_after_its_chunk_in_flight_and_changes_flow_on(pg, tsinks, unique, mode):
    """cdc_cancel_snapshot mid-snapshot: the snapshot is cancelled with the rows delivered so far
    (its chunk in flight included, counted), no chunk is read after it, and the table's changes are
    still delivered; an initial_only sink whose only snapshot is cancelled finishes."""
    t, ev, name = f"snap_cancel_{unique}", f"snap_cancel_ev_{unique}", f"snap_cancel_{unique}"
    rows = 100000
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)")
    pg.execute(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(1, {rows}) g")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    tsinks(name, ev, tables=[t], snapshot_chunk_size=50, snapshot_mode=mode)
    wait_for(lambda: (r := snapshot_rows(pg, name)) and r[0][1] > 0, timeout=120, what="chunks delivered")
    ids = [r[0] for r in pg.execute("SELECT cdc_cancel_snapshot(%s, %s)", (t, name)).fetchall()]
    assert len(ids) == 1
    state, done, note = pg.execute("SELECT state, rows_done, note FROM cdc_snapshots WHERE snapshot_id = %s",
                                   ids).fetchone()
    assert state == "cancelled" and note.startswith("cancelled by ") and done < rows, (state, done)

    def reads():
        return pg.execute(f"SELECT count(*) FROM {ev} WHERE operation = 'READ'").fetchone()[0]
    # The chunk in flight arrives and is settled (counted); nothing after it.
    wait_for(lambda: pg.execute("SELECT chunk_watermark IS NULL, rows_done FROM _cdc_snapshots WHERE snapshot_id = %s",
                                ids).fetchone() == (True, reads()), timeout=60, what="chunk settled, READ events = rows_done")
    settled = reads()
    assert settled < rows // 2, settled
    if mode == "initial_only":
        wait_for(lambda: sink_state(pg, name) == "finished", timeout=60, what="sink finished")
    else:
        wait_for(lambda: sink_state(pg, name) == "running", timeout=60, what="sink running")
        pg.execute(f"UPDATE {t} SET v = 1 WHERE id = {rows}")
        wait_for(lambda: pg.execute(f"SELECT count(*) FROM {ev} WHERE operation = 'UPDATE'").fetchone()[0] == 1,
                 timeout=60, what="the change delivered")
    time.sleep(2)
    # Settling the chunk in flight kept the cancel (state, and when).
    assert reads() == settled and pg.execute("SELECT state, finished_at IS NOT NULL FROM cdc_snapshots "
                                             "WHERE snapshot_id = %s", ids).fetchone() == ("cancelled", True)
    notices = []
    pg.add_notice_handler(lambda d: notices.append(d.message_primary))
    assert pg.execute("SELECT cdc_cancel_snapshot(%s)", (t,)).fetchall() == []
    assert notices == [f"no snapshot of table {t} is under way"], notices
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_chunk_of_wide_rows_ends_at_its_byte_budget(pg, tsinks, unique):
    """Memory stays bounded whatever the rows' width: with 1 MB rows a chunk ends at 8 MiB of row text
    (8 rows), not at snapshot_chunk_size (8192) rows, and every row still arrives once."""
    t, ev, name = f"snap_wide_{unique}", f"snap_wide_ev_{unique}", f"snap_wide_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, doc text NOT NULL)")
    pg.execute(f"INSERT INTO {t} SELECT g, repeat(md5(g::text), 1024 * 1024 / 32) FROM generate_series(1, 40) g")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    tsinks(name, ev, tables=[t])
    wait_for(lambda: snapshot_done(pg, name), timeout=120, what="snapshot done")
    chunks = pg.execute(f"SELECT commit_lsn, count(*), min(event_key->>'id'), max(event_key->>'id') FROM {ev} "
                        "WHERE operation = 'READ' GROUP BY commit_lsn ORDER BY commit_lsn").fetchall()
    assert sum(c[1] for c in chunks) == 40 and [c[1] for c in chunks] == [8] * 5, chunks
    assert pg.execute(f"SELECT count(DISTINCT event_key) FROM {ev} WHERE operation = 'READ'").fetchone()[0] == 40
    assert snapshot_rows(pg, name)[0][:2] == ("done", 40)
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_cdc_snapshot_with_wait_returns_once_delivered_and_reports_progress(pg, tsinks, unique):
    """wait => true: the request commits on its own (the worker starts on it while the call waits),
    the call returns the snapshot's id once every row is delivered, with NOTICEs on its progress."""
    t, ev, name = f"snap_wait_{unique}", f"snap_wait_ev_{unique}", f"snap_wait_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)")
    pg.execute(f"INSERT INTO {t} SELECT g, g FROM generate_series(1, 20000) g")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    tsinks(name, ev, tables=[t], snapshot_mode="never", snapshot_chunk_size=500)
    wait_for(lambda: pg.execute("SELECT state FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
             == "running", what="sink running")
    notices = []
    pg.add_notice_handler(lambda d: notices.append(d.message_primary))
    ids = [r[0] for r in pg.execute("SELECT cdc_snapshot(%s, %s, wait => true)", (t, name)).fetchall()]
    # Returned: done, and every row is in the event table already.
    assert len(ids) == 1
    assert pg.execute("SELECT state, rows_done FROM cdc_snapshots WHERE snapshot_id = %s", ids).fetchone() == \
        ("done", 20000)
    assert pg.execute(f"SELECT count(DISTINCT event_key) FROM {ev} WHERE operation = 'READ'").fetchone()[0] == 20000
    assert any(n.startswith(f"snapshot {ids[0]} of {t} for sink \"{name}\"") for n in notices), notices
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_table_added_to_a_running_sink_arrives_in_full(pg, tsinks, unique):
    """A sink whose tables list names a table captured only later: once cdc_enable commits, its
    rows arrive as READ events (kind added), and rows inserted right after it as changes; the fold
    is the table, every row there, none stale."""
    first, added, ev, name = f"snap_a1_{unique}", f"snap_a2_{unique}", f"snap_a_ev_{unique}", f"snap_a_{unique}"
    pg.execute(f"CREATE TABLE {first} (id int PRIMARY KEY, v int NOT NULL)")
    pg.execute(f"INSERT INTO {first} VALUES (1, 1)")
    pg.execute(f"CREATE TABLE {added} (id int PRIMARY KEY, v int NOT NULL)")
    pg.execute(f"INSERT INTO {added} SELECT g, 0 FROM generate_series(1, 30000) g")
    pg.execute("SELECT cdc_enable(%s)", (first,))
    tsinks(name, ev, tables=[first, added], snapshot_chunk_size=1000)
    wait_for(lambda: snapshot_done(pg, name), what="initial snapshot done")
    pg.execute("SELECT cdc_enable(%s)", (added,))
    with connect() as w:
        for i in range(30001, 31001):
            w.execute(f"INSERT INTO {added} VALUES (%s, 1)", (i,))
        for i in range(1, 30000, 97):
            w.execute(f"UPDATE {added} SET v = v + 1 WHERE id = %s", (i,))
    wait_for(lambda: snapshot_done(pg, name), timeout=120, what="added table's snapshot done")
    events = events_up_to_a_last_row(pg, ev, added)
    assert fold(events) == table_rows(pg, added), "the fold of the delivered events is the table"
    ops = collections.Counter(e[0] for e in events)
    assert ops["READ"] >= 29000, ops
    assert [r[:2] for r in pg.execute("SELECT kind, state FROM cdc_snapshots WHERE sink_name = %s", (name,))] == \
        [("initial", "done"), ("added", "done")]
    pg.execute("SELECT cdc_disable(%s)", (first,))
    pg.execute("SELECT cdc_disable(%s)", (added,))


def test_a_snapshot_requested_while_another_table_is_snapshotted_folds_to_the_table(pg, tsinks, unique):
    """Regression: a snapshot requested (cdc_snapshot) while the sink still snapshotted another table
    had its chunks read with no window open (the windows opened only when the sink had no snapshot
    left), so rows changed while their chunk was in flight arrived as stale READs (the chaos run over
    snapshots: 39 wrong rows). The first table is done, the second still running when the request
    commits; a writer changes the first table's rows around its new snapshot's chunk in flight."""
    a, b, ev, name = f"snap_2a_{unique}", f"snap_2b_{unique}", f"snap_2_ev_{unique}", f"snap_2_{unique}"
    for t, rows in ((a, 20000), (b, 60000)):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)")
        pg.execute(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(1, {rows}) g")
        pg.execute("SELECT cdc_enable(%s)", (t,))
    tsinks(name, ev, tables=[a, b], snapshot_chunk_size=200)

    def states():
        return dict(pg.execute("SELECT s.table_oid::regclass::text, s.state FROM _cdc_snapshots s JOIN _cdc_sinks k "
                               "USING (sink_id) WHERE k.sink_name = %s AND s.kind = 'initial'", (name,)).fetchall())
    wait_for(lambda: states() == {a: "done", b: "running"}, timeout=120, what="the first table done, the second running")
    (requested,) = pg.execute("SELECT cdc_snapshot(%s, %s)", (a, name)).fetchone()
    assert states()[b] == "running", "the second table's snapshot must still run when the request commits"
    stop, stats = threading.Event(), collections.Counter()
    writer = threading.Thread(target=write_around_the_snapshot, args=(a, name, stop, stats, unique))
    writer.start()
    try:
        wait_for(lambda: snapshot_done(pg, name), timeout=300, what="the snapshots done")
    finally:
        stop.set()
        writer.join(30)
    events = events_up_to_a_last_row(pg, ev, a)
    assert sum(stats.values()) > 100, stats
    assert pg.execute("SELECT state FROM _cdc_snapshots WHERE snapshot_id = %s", (requested,)).fetchone()[0] == "done"
    assert fold(events) == table_rows(pg, a), "the fold of the delivered events is the table"
    pg.execute("SELECT cdc_disable(%s)", (a,))
    pg.execute("SELECT cdc_disable(%s)", (b,))


@pytest.mark.parametrize("requested", [False, True], ids=["initial", "requested"])
def test_control_without_the_window_the_oracle_sees_stale_rows(pg, tsinks, unique, requested):
    """The negative control: with the test-only setting that keeps every row of a chunk (also those
    changed while it was in flight), the same run must end with a fold that is not the table."""
    with server_settings({"cdc.test_skip_snapshot_window": "on"}):
        t, ev, name, events, stats, _ = run_snapshot_under_writes(pg, tsinks, unique, requested=requested)
    folded, table = fold(events), table_rows(pg, t)
    stale = [k for k in table if folded.get(k) != table[k]] + [k for k in folded if k not in table]
    assert stale, f"no stale row after {sum(stats.values())} concurrent changes: the oracle cannot see the window"
    pg.execute("SELECT cdc_disable(%s)", (t,))


@pytest.mark.parametrize("mode", ["initial", "requested", "initial_only"])
def test_a_snapshot_resumes_after_kill_9_exactly_once(pg, sinks, unique, mode):
    """The worker is SIGKILLed (PostgreSQL crash-restarts) twice in the middle of a snapshot to
    Kafka, a new sink's, one cdc_snapshot asked of a running sink, or an initial_only sink's: every
    row arrives exactly once, read back read_committed (and the initial_only sink then finishes)."""
    requested = mode == "requested"
    t, topic, name = f"snap_kill_{unique}", f"snap-kill-{unique}", f"snap_kill_{unique}"
    rows = 150000
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute(f"INSERT INTO {t} SELECT g, repeat('x', 100) FROM generate_series(1, {rows}) g")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    if requested:
        sinks.add(name, topic, tables=[t], snapshot_chunk_size=200, snapshot_mode="never")
        wait_for(lambda: pg.execute("SELECT state FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
                 == "running", what="sink running")
        pg.execute("SELECT cdc_snapshot(%s)", (t,))
    else:
        sinks.add(name, topic, tables=[t], snapshot_chunk_size=200, snapshot_mode=mode)
    for _ in range(2):
        with connect() as c:
            before = wait_for(lambda: (r := snapshot_rows(c, name)) and r[0][1] > 0 and r[0][1], timeout=120,
                              what="chunks delivered")
            assert before < rows, "the snapshot finished before the kill"
            os.kill(wait_for(lambda: worker_pid(c, name), what="worker"), 9)
        time.sleep(3)
        wait_for(worker_back, timeout=60, what="server back")
    msgs = consume(topic, rows, timeout=300)
    ids = collections.Counter(m["value"]["after"]["id"] for m in msgs)
    assert len(ids) == rows and set(ids.values()) == {1}, "each row exactly once"
    with connect() as c:
        wait_for(lambda: snapshot_done(c, name), what="snapshot done")
        assert snapshot_rows(c, name)[0][:2] == ("done", rows)
        if mode == "initial_only":
            wait_for(lambda: sink_state(c, name) == "finished", what="sink finished")
            assert c.execute("SELECT count(*) FROM pg_replication_slots s JOIN _cdc_sinks k USING (slot_name) "
                             "WHERE k.sink_name = %s", (name,)).fetchone()[0] == 0
        c.execute("SELECT cdc_disable(%s)", (t,))


def test_filters_apply_to_read_rows_and_a_keyless_table_is_read_whole(pg, tsinks, unique):
    t, keyless, ev, name = f"snap_f_{unique}", f"snap_nokey_{unique}", f"snap_f_ev_{unique}", f"snap_f_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int, secret text)")
    pg.execute(f"INSERT INTO {t} SELECT g, g, 's' || g FROM generate_series(1, 100) g")
    pg.execute("SELECT cdc_enable(%s, %s::jsonb)",
               (t, json.dumps({"filter": "v > 90", "exclude_columns": ["secret"]})))
    pg.execute(f"CREATE TABLE {keyless} (v int)")
    pg.execute(f"INSERT INTO {keyless} VALUES (1), (2), (2)")
    pg.execute("SELECT cdc_enable(%s, '{\"operations\": [\"insert\"]}'::jsonb)", (keyless,))
    tsinks(name, ev, tables=[t, keyless])
    wait_for(lambda: snapshot_done(pg, name), what="snapshot done")
    assert [r[:2] for r in snapshot_rows(pg, name)] == [("done", 100), ("done", 3)]
    pg.execute(f"INSERT INTO {keyless} VALUES (3)")
    wait_for(lambda: len(event_table(pg, ev, keyless)) == 4, what="the keyless table's change")
    reads = event_table(pg, ev, t)
    assert sorted(e[2]["id"] for e in reads) == list(range(91, 101))
    assert all(e[0] == "READ" and "secret" not in e[2] for e in reads)
    got = [(e[0], e[2]) for e in event_table(pg, ev, keyless)]
    assert sorted(got[:3], key=str) == [("READ", {"v": 1}), ("READ", {"v": 2}), ("READ", {"v": 2})]
    assert got[3] == ("INSERT", {"v": 3})
    pg.execute("SELECT cdc_disable(%s)", (t,))
    pg.execute("SELECT cdc_disable(%s)", (keyless,))


def keyless_snapshot_under_writes(pg, tsinks, unique, rows=20000, chunk=500):
    """The initial snapshot of a table without a key (REPLICA IDENTITY FULL, duplicate rows) while
    a writer inserts, updates and deletes rows, from before the sink exists until its snapshot is
    done. Returns the table and its events (operation, before, after) up to a last row."""
    t, ev, name = f"snap_kl_{unique}", f"snap_kl_ev_{unique}", f"snap_kl_{unique}"
    pg.execute(f"CREATE TABLE {t} (g int NOT NULL, v int NOT NULL)")
    pg.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
    pg.execute(f"INSERT INTO {t} SELECT g % {rows // 2}, 0 FROM generate_series(1, {rows}) g")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    stop, stats = threading.Event(), collections.Counter()

    def write():
        rng = random.Random(unique)
        with psycopg.connect(PG_DSN, autocommit=True) as c:
            while not stop.is_set():
                g, op = rng.randrange(rows // 2), rng.choice(["insert", "update", "delete"])
                pick = f"(SELECT ctid FROM {t} WHERE g = {g} LIMIT 1)"
                if op == "insert":
                    c.execute(f"INSERT INTO {t} VALUES ({g}, {rng.randrange(100)})")
                elif op == "update":
                    c.execute(f"UPDATE {t} SET v = v + 1 WHERE ctid = {pick}")
                else:
                    c.execute(f"DELETE FROM {t} WHERE ctid = {pick}")
                stats[op] += 1
    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_for(lambda: sum(stats.values()) >= 50, what="writes before the sink")
        tsinks(name, ev, tables=[t], snapshot_chunk_size=chunk)
        wait_for(lambda: snapshot_done(pg, name), timeout=300, what="snapshot done")
        during = sum(stats.values())
        wait_for(lambda: sum(stats.values()) >= during + 50, what="writes after the snapshot")
    finally:
        stop.set()
        writer.join(30)
    pg.execute(f"INSERT INTO {t} VALUES (-1, -1)")
    last = {"g": -1, "v": -1}
    wait_for(lambda: pg.execute(f"SELECT count(*) FROM {ev} WHERE event->'after' = %s::jsonb",
                                (json.dumps(last),)).fetchone()[0], what="the last row")
    events = pg.execute(f"SELECT operation, event->'before', event->'after' FROM {ev} ORDER BY event_id").fetchall()
    return t, name, events, stats


def multiset_fold(events):
    """The rows the events leave, as a multiset: READ and INSERT add their after image, DELETE
    takes its before image away, UPDATE both."""
    rows = collections.Counter()
    for op, before, after in events:
        if op in ("UPDATE", "DELETE"):
            rows[json.dumps(before, sort_keys=True)] -= 1
        if op in ("READ", "INSERT", "UPDATE"):
            rows[json.dumps(after, sort_keys=True)] += 1
    return {k: n for k, n in rows.items() if n != 0}


def keyless_table(pg, t):
    return dict(collections.Counter(json.dumps({"g": g, "v": v}, sort_keys=True)
                                    for g, v in pg.execute(f"SELECT g, v FROM {t}").fetchall()))


def test_a_keyless_tables_initial_snapshot_under_writes_folds_to_the_table(pg, tsinks, unique):
    """A table without a key is read whole from the snapshot of a slot's consistent point, piece by
    piece: its READ rows and the changes around them fold to the table, as a multiset (rows
    without a key can repeat), although writes went on from before the sink until after."""
    t, name, events, stats = keyless_snapshot_under_writes(pg, tsinks, unique)
    ops = collections.Counter(e[0] for e in events)
    assert ops["READ"] > 15000 and min(stats.values()) > 20, (ops, stats)
    assert multiset_fold(events) == keyless_table(pg, t), "the fold of the delivered events is the table"
    first_change = next(i for i, e in enumerate(events) if e[0] != "READ")
    assert all(e[0] != "READ" for e in events[first_change:]), "every READ before the first change"
    state, done, note = snapshot_rows(pg, name)[0]
    assert (state, note) == ("done", None) and done == ops["READ"]
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_control_a_keyless_snapshot_with_every_change_kept_does_not_fold_to_the_table(pg, tsinks, unique):
    """The negative control: with the test-only setting that also keeps the changes the rows'
    snapshot holds, the same run must end with a fold that is not the table (rows twice)."""
    with server_settings({"cdc.test_skip_snapshot_window": "on"}):
        t, _, events, stats = keyless_snapshot_under_writes(pg, tsinks, unique)
    assert multiset_fold(events) != keyless_table(pg, t), f"no row twice after {dict(stats)} writes"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def crash_after_a_chunk_commit(pg, sinks, unique):
    """A snapshot to exactly-once Kafka whose worker exits right after a Kafka commit (a chunk's,
    the snapshot being all there is to deliver) and before its slot moves; returns the delivered
    id counts once the snapshot is done, read back read_committed."""
    t, topic, name = f"snap_fp_{unique}", f"snap-fp-{unique}", f"snap_fp_{unique}"
    rows = 200000
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute(f"INSERT INTO {t} SELECT g, 'x' FROM generate_series(1, {rows}) g")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(name, topic, tables=[t], snapshot_chunk_size=100)
    wait_for(lambda: (r := snapshot_rows(pg, name)) and r[0][1] > 0, timeout=120, what="chunks delivered")
    crash_at_failpoint(pg, name, lambda: None)
    assert snapshot_rows(pg, name)[0][1] < rows, "the snapshot finished before the crash"
    wait_for(lambda: snapshot_done(pg, name), timeout=300, what="snapshot done")
    msgs = consume(topic, rows, timeout=300)
    pg.execute("SELECT cdc_disable(%s)", (t,))
    return rows, collections.Counter(m["value"]["after"]["id"] for m in msgs)


def test_a_chunk_committed_before_the_slot_moved_is_delivered_once(pg, sinks, unique):
    """Regression for the settling of a chunk in flight at a restart: the slot lags the Kafka
    commit, so only the checkpoint says the chunk was delivered."""
    rows, ids = crash_after_a_chunk_commit(pg, sinks, unique)
    assert len(ids) == rows and set(ids.values()) == {1}, "each row exactly once"


def test_control_settled_by_the_slot_alone_a_chunk_is_delivered_twice(pg, sinks, unique):
    logged = server_log_size()
    with server_settings({"cdc.test_snapshot_ignore_checkpoint": "on"}):
        rows, ids = crash_after_a_chunk_commit(pg, sinks, unique)
    # The failpoint may fire again in the next worker before it is disarmed: each exit at it sends the
    # chunk in flight once more.
    exits = server_log(logged).count(f'failpoint after_sink_commit of sink "snap_fp_{unique}": exiting')
    assert exits >= 1
    assert len(ids) == rows and max(ids.values()) == exits + 1, "the chunk in flight read again and delivered again"


def test_read_rows_of_a_table_no_change_was_streamed_for_yet_are_typed(pg, tsinks, unique):
    """Regression: a table snapshotted before any of its changes is streamed has had no relation
    message to learn its column types from; its READ rows used to carry an array, an enum array
    and a domain over numeric as their text ('{a,b}') instead of JSON arrays and a number."""
    t, ev, name = f"snap_ty_{unique}", f"snap_ty_ev_{unique}", f"snap_ty_{unique}"
    pg.execute(f"CREATE DOMAIN snap_ty_amount_{unique} AS numeric CHECK (VALUE > 0)")
    pg.execute(f"CREATE TYPE snap_ty_mood_{unique} AS ENUM ('sad', 'ok')")
    pg.execute(f"""CREATE TABLE {t} (id int PRIMARY KEY, tags text[], moods snap_ty_mood_{unique}[],
                   amount snap_ty_amount_{unique})""")
    pg.execute(f"INSERT INTO {t} VALUES (1, '{{a,b}}', '{{sad,ok}}', 12.50)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    tsinks(name, ev, tables=[t])
    wait_for(lambda: snapshot_done(pg, name), what="initial snapshot done")
    wait_for(lambda: pg.execute(f"SELECT count(*) FROM {ev}").fetchone()[0] == 1, what="the READ row delivered")
    raw = pg.execute(f"SELECT event::text FROM {ev}").fetchone()[0]
    after = json.loads(raw)["after"]
    assert after == {"id": 1, "tags": ["a", "b"], "moods": ["sad", "ok"], "amount": 12.50}, after
    assert '"amount": 12.50' in raw, raw
    pg.execute("SELECT cdc_disable(%s)", (t,))
    pg.execute(f"DROP TABLE {t}")
    pg.execute(f"DROP TYPE snap_ty_mood_{unique}")
    pg.execute(f"DROP DOMAIN snap_ty_amount_{unique}")


def test_read_rows_are_written_as_the_stream_writes_the_same_values(pg, tsinks, unique):
    """A READ row's values are each type's output text, as pgoutput sends them for an INSERT (the
    chunk reader copies each value's text straight into the chunk's tuple). The oracle is the
    stream: the same values inserted after the snapshot arrive as an INSERT, whose `after` must
    equal the READ's but for the id. Covers inline compressed and out-of-line TOAST, bytea, arrays,
    ranges, json, intervals, time zones, NULL."""
    t, ev, name = f"snap_txt_{unique}", f"snap_txt_ev_{unique}", f"snap_txt_{unique}"
    pg.execute(f"""CREATE TABLE {t} (id int PRIMARY KEY, compressed text, external text, raw bytea, n numeric,
                   f float8, ts timestamptz, d date, iv interval, j jsonb, tags text[], r int4range, u uuid,
                   b boolean, none text)""")
    # `compressed` compresses inline; `external`, 64 kB of random hex digits, does not compress
    # (pglz saves less than it asks for), so it is stored out of line, uncompressed.
    values = ("repeat('abc', 20000)", "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 2000))",
              "decode(repeat('00ff', 10), 'hex')", "12345678901234567890.0001", "-1.5e-7",
              "'2026-12-04 10:11:12.345678+05:30'", "'2026-02-28'", "'1 year 2 mons 3 days 04:05:06.7'",
              """'{"a": [1, 2.50, null], "b": "é"}'""", """'{x,"y z",NULL}'""", "'[3,7)'",
              "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "true", "NULL")
    pg.execute(f"INSERT INTO {t} VALUES (1, {', '.join(values)})")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    tsinks(name, ev, tables=[t])
    wait_for(lambda: snapshot_done(pg, name), what="initial snapshot done")
    # The same values again, from row 1 itself (the external text is random), as a streamed INSERT.
    pg.execute(f"INSERT INTO {t} SELECT 2, compressed, external, raw, n, f, ts, d, iv, j, tags, r, u, b, none "
               f"FROM {t} WHERE id = 1")
    wait_for(lambda: pg.execute(f"SELECT count(*) FROM {ev}").fetchone()[0] == 2, what="the READ and the INSERT")
    rows = dict(pg.execute(f"SELECT operation, event->'after' FROM {ev}").fetchall())
    assert set(rows) == {"READ", "INSERT"}, rows
    read, insert = rows["READ"], rows["INSERT"]
    assert (read.pop("id"), insert.pop("id")) == (1, 2)
    assert read == insert, {k: (read[k], insert.get(k)) for k in read if read[k] != insert.get(k)}
    assert len(read["external"]) == 64_000 and read["compressed"] == "abc" * 20000 and read["none"] is None
    stored = pg.execute(f"SELECT pg_column_size(external) < octet_length(external), "
                        f"pg_column_size(compressed) < octet_length(compressed) FROM {t} WHERE id = 1").fetchone()
    assert stored == (False, True), f"expected external uncompressed and compressed compressed: {stored}"
    pg.execute("SELECT cdc_disable(%s)", (t,))
