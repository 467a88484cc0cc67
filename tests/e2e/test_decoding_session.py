"""The sink worker's decoding session: kept open across reads, each WAL record decoded once, the
slot held by the worker between reads, and the WAL reader's buffers surviving the read's
transaction."""
import time

from conftest import (consume, delivery_status, hold_worker, progress_records, server_log, server_log_size,
                      server_settings, sink_state, wait_for, worker_pid)


def captured_sink(pg, sinks, prefix, unique, columns, warm_up):
    """A table with `columns`, captured, a Kafka sink on it alone, and one row (`warm_up`, the values
    of an INSERT) delivered: returns (table, topic, sink name)."""
    t, topic, name = f"{prefix}_{unique}", f"{prefix}-{unique}", f"{prefix}_{unique}"
    pg.execute(f"CREATE TABLE {t} ({columns})")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(name, topic, tables=[t])
    pg.execute(f"INSERT INTO {t} VALUES ({warm_up})")
    consume(topic, 1)
    return t, topic, name


def wal_lsn(pg):
    return pg.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8").fetchone()[0]


def wait_slot_at_checkpoint(pg, name):
    """Waits until the sink's slot is confirmed exactly up to its last checkpoint (once the load stops)."""
    slot = pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]

    def caught_up():
        committed = delivery_status(pg, name)["offset_tracking"]["committed_offset"]
        confirmed = pg.execute("SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::int8 FROM pg_replication_slots "
                               "WHERE slot_name = %s", (slot,)).fetchone()[0]
        return confirmed == committed and (committed, confirmed)

    wait_for(caught_up, what="the slot confirmed up to the sink's last checkpoint")


def test_each_wal_record_is_decoded_once_across_many_reads(pg, sinks, unique):
    """With the peek every read decoded again from the slot's restart position; the session keeps
    decoding where it stopped. Oracle: PostgreSQL's own WAL positions (the WAL written while the
    sink reads in small batches) against the worker's count of WAL decoded."""
    t, topic, name = f"once_{unique}", f"once-{unique}", f"once_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, pad text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    with server_settings({"cdc.batch_changes": 300}):
        sinks.add(name, topic, tables=[t])
        pg.execute(f"INSERT INTO {t} VALUES (0, 'warm-up')")
        consume(topic, 1)
        pid = worker_pid(pg, name)
        before = delivery_status(pg, name)["decoding"]
        start = wal_lsn(pg)
        # 2,000 transactions of 5 rows (7 messages each): about 45 reads of 300 messages.
        pg.execute(f"DO $$ BEGIN FOR i IN 1..2000 LOOP INSERT INTO {t} SELECT i * 10 + g, repeat('x', 200) "
                   f"FROM generate_series(1, 5) g; COMMIT; END LOOP; END $$")
        written = wal_lsn(pg) - start
        assert len(consume(topic, 10_001, timeout=120)) == 10_001
        after = delivery_status(pg, name)["decoding"]
    assert worker_pid(pg, name) == pid, "the worker was not restarted"
    assert after["sessions_started"] == before["sessions_started"], "one session for all reads"
    decoded = after["wal_decoded_bytes"] - before["wal_decoded_bytes"]
    print(f"\nWAL written {written} bytes, decoded {decoded} bytes over the reads")
    # Every record once (plus what other tests write meanwhile and the heartbeats): the peek
    # decoded it again at every read, tens of times here.
    assert written * 0.9 <= decoded <= written * 1.5 + (1 << 20), (written, decoded)
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_the_worker_holds_its_slot_between_reads(pg, sinks, unique):
    t, topic, name = captured_sink(pg, sinks, "hold", unique, "id int PRIMARY KEY", "1")
    slot = pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
    active = pg.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0]
    assert active == worker_pid(pg, name)
    assert sink_state(pg, name)[0] == "running", "its own session is not 'in use by another process'"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_regression_records_spanning_pages_after_a_commit_in_one_read(pg, sinks, unique):
    """Decoding a commit ends a subtransaction of the read's transaction and leaves that
    transaction's memory context current; the WAL reader then allocated what a big record needs
    (its buffer for records that span pages grows past 40 kB, and a record too big for its decode
    buffer gets memory of its own) in it, which was freed at the read's commit and used again by
    the next read: the worker crashed (SIGSEGV, first in a full e2e run). Each round commits a
    small transaction, then a 200 kB WAL record (a logical message) and big TOASTed values, all
    read at once, and the worker must survive every round."""
    t, topic, name = f"span_{unique}", f"span-{unique}", f"span_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, body text)")
    pg.execute(f"ALTER TABLE {t} ALTER COLUMN body SET STORAGE EXTERNAL")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(name, topic, tables=[t])
    pg.execute(f"INSERT INTO {t} VALUES (0, 'warm-up')")
    consume(topic, 1)
    pid = worker_pid(pg, name)
    logged = server_log_size()
    big = "".join(f"{i:08x}" for i in range(40_000))  # 320 kB, stored out of line in ~2 kB chunks
    n = 1
    for _ in range(6):
        with hold_worker(pg):
            for _ in range(3):
                pg.execute(f"INSERT INTO {t} VALUES (%s, 'small')", (n,))
                pg.execute("SELECT pg_logical_emit_message(false, 'pg_cdc_test.big', repeat('m', 200000))")
                pg.execute(f"INSERT INTO {t} VALUES (%s, %s || %s)", (n + 1, str(n), big))
                n += 2
        wait_for(lambda: delivery_status(pg, name)["delivered"]["events"] >= n, timeout=60, what="round delivered")
    msgs = consume(topic, n)
    bodies = {m["value"]["after"]["id"]: m["value"]["after"]["body"] for m in msgs}
    assert all(bodies[i] == str(i - 1) + big for i in range(2, n, 2))
    assert "terminated by signal" not in server_log(logged)
    assert worker_pid(pg, name) == pid, "the worker was not restarted"
    time.sleep(0.5)
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_regression_a_backlog_that_spills_to_disk_resumes_at_a_transaction(pg, sinks, unique):
    """A read holds up to 10,000 messages before it sends them; with 1 KB rows that is past the
    session's 8 MB in memory, so the rest goes to its spill file. Releasing what was sent dropped the
    memory part only, and a transaction split between memory and file left its tail behind: the next
    read began inside it ("Insert outside a transaction", found by make bench-e2e's 1 KB workload).
    A 30 MB backlog read in several reads must arrive whole, each row once, with no error."""
    t, topic, name = captured_sink(pg, sinks, "spill", unique, "id int PRIMARY KEY, pad text", "0, 'warm-up'")
    logged = server_log_size()
    with hold_worker(pg):
        pg.execute(f"DO $$ BEGIN FOR i IN 0..299 LOOP INSERT INTO {t} SELECT i * 100 + g, repeat('x', 1000) "
                   f"FROM generate_series(1, 100) g; COMMIT; END LOOP; END $$")
    msgs = consume(topic, 30_001, timeout=180)
    assert sorted(m["value"]["after"]["id"] for m in msgs) == [0] + list(range(1, 30_001)), "each row once"
    assert "cannot decode the change stream" not in server_log(logged)
    assert sink_state(pg, name)[0] == "running"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_deliveries_confirmed_together_record_every_event(pg, sinks, unique):
    """While deliveries keep coming, the slot is confirmed (and `_cdc_offsets` written, in the same
    transaction) at most every 200 ms, for every delivery since the last confirm. Oracles: the rows
    the test wrote per table, which `_cdc_offsets` must count exactly once across the grouped
    deliveries, and the sink's last checkpoint, which the slot must reach once the load stops."""
    a, b, topic, name = f"grp_a_{unique}", f"grp_b_{unique}", f"grp-{unique}", f"grp_{unique}"
    for t in (a, b):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(name, topic, tables=[a, b])
    pg.execute(f"INSERT INTO {a} VALUES (0)")
    consume(topic, 1)
    before = delivery_status(pg, name)["transaction_status"]["committed_transactions"]
    # 1,500 transactions over a second or more, so the worker delivers many small batches.
    pg.execute(f"DO $$ BEGIN FOR i IN 1..1500 LOOP INSERT INTO {a} VALUES (i); "
               f"IF i % 3 = 0 THEN INSERT INTO {b} VALUES (i); END IF; COMMIT; "
               f"IF i % 25 = 0 THEN PERFORM pg_sleep(0.02); END IF; END LOOP; END $$")
    assert len(consume(topic, 2001, timeout=120)) == 2001
    wait_slot_at_checkpoint(pg, name)
    delivered = delivery_status(pg, name)["transaction_status"]["committed_transactions"] - before
    print(f"\n{delivered} Kafka transactions for 1,500 source transactions")
    recorded = dict(pg.execute("SELECT table_name, events_published FROM _cdc_offsets WHERE sink_name = %s",
                               (name,)).fetchall())
    assert recorded == {a: 1501, b: 500}
    for t in (a, b):
        pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_backlog_is_read_while_the_unit_before_commits_and_arrives_once(pg, sinks, unique):
    """Decoding and delivery overlap: while one unit of a backlog commits on the sink's delivery
    thread, the worker reads and encodes the next. Oracles: the rows the test wrote (each id
    exactly once in the topic, read_committed, and counted once in `_cdc_offsets`), the sink's
    checkpoints (strictly increasing, one per Kafka transaction), and the slot, which must reach
    the last checkpoint. Fails with the overlap turned off (`reads_overlapped` stays 0)."""
    t, topic, name = captured_sink(pg, sinks, "overlap", unique, "id int PRIMARY KEY, pad text", "0, 'warm-up'")
    pid = worker_pid(pg, name)
    before = delivery_status(pg, name)
    # 40 transactions of 1,000 rows, read 5,000 messages at a time: units of about 5 transactions.
    with server_settings({"cdc.batch_changes": 5000}):
        with hold_worker(pg):
            pg.execute(f"DO $$ BEGIN FOR i IN 0..39 LOOP INSERT INTO {t} SELECT i * 1000 + g, repeat('x', 100) "
                       f"FROM generate_series(1, 1000) g; COMMIT; END LOOP; END $$")
        got = consume(topic, 40_001, timeout=120)
    ids = [m["value"]["after"]["id"] for m in got]
    assert sorted(ids) == list(range(0, 40_001)), "every row exactly once"
    wait_slot_at_checkpoint(pg, name)
    after = delivery_status(pg, name)
    assert worker_pid(pg, name) == pid, "no restart"
    overlapped = after["decoding"]["reads_overlapped"] - before["decoding"]["reads_overlapped"]
    units = (after["transaction_status"]["committed_transactions"]
             - before["transaction_status"]["committed_transactions"])
    print(f"\n{units} Kafka transactions, {overlapped} reads made while the one before committed")
    assert overlapped >= 1, "no read ran while a unit was committing"
    checkpoints = progress_records(pg, name)
    assert checkpoints == sorted(set(checkpoints)), "checkpoints strictly increasing"
    recorded = pg.execute("SELECT events_published FROM _cdc_offsets WHERE sink_name = %s", (name,)).fetchone()[0]
    assert recorded == 40_001
    pg.execute("SELECT cdc_disable(%s)", (t,))
