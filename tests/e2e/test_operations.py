"""Operational behaviour: worker restarts, slot lifecycle, heartbeats, deferred slot creation."""
import json
import os
import subprocess
import sys
import time

import psycopg
import pytest
from confluent_kafka import Producer

from conftest import (BOOTSTRAP, connect, consume, progress_messages, restart_worker, server_settings, sink_state,
                      wait_for, with_slot_taken_from_worker)


def slot_of(pg, sink):
    return pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (sink,)).fetchone()[0]


def slot_exists(pg, slot):
    return pg.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0] == 1


def test_at_least_once_sink_loses_nothing_when_the_worker_dies(pg, sinks, unique):
    """At-least-once (exactly_once false): kill the worker while it streams; every committed row
    arrives (duplicates allowed)."""
    t, topic = f"kill_{unique}", f"kill-{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(f"kill_{unique}", topic, exactly_once=False)
    n = 0
    for _ in range(3):
        for _ in range(200):
            pg.execute(f"INSERT INTO {t} VALUES (%s)", (n,))
            n += 1
        restart_worker(pg)
    msgs = consume(topic, n, timeout=60)
    ids = {m["value"]["after"]["id"] for m in msgs}
    assert ids == set(range(n)), f"missing {sorted(set(range(n)) - ids)[:10]}"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_drop_sink_drops_its_slot(pg, sinks, unique):
    name = sinks.add(f"drop_{unique}", f"drop-{unique}")
    slot = slot_of(pg, name)
    assert slot_exists(pg, slot)
    pg.execute("SELECT cdc_drop_sink(%s)", (name,))
    sinks.names.remove(name)
    wait_for(lambda: not slot_exists(pg, slot), timeout=20, what="slot dropped by the worker")


def test_rolled_back_add_sink_leaves_no_slot(pg, unique):
    with connect() as c:
        c.autocommit = False
        c.execute("SELECT cdc_add_sink(%s, 'kafka', '{\"topic\": \"rb\"}')", (f"rb_{unique}",))
        slot = c.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (f"rb_{unique}",)).fetchone()[0]
        # The slot exists while the transaction is open and must survive the worker's orphan check.
        time.sleep(2.0)
        assert slot_exists(pg, slot)
        c.rollback()
    wait_for(lambda: not slot_exists(pg, slot), timeout=20, what="orphan slot dropped")


def test_sink_added_after_writes_in_same_transaction(pg, sinks, unique):
    """The slot is created by the worker after COMMIT; later changes are delivered."""
    t, topic, name = f"defer_{unique}", f"defer-{unique}", f"defer_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    with connect() as c:
        c.autocommit = False
        c.execute("SELECT cdc_enable(%s)", (t,))
        c.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)", (name, f'{{"topic": "{topic}"}}'))
        notices = [d.message_primary for d in getattr(c, "_notices", [])]
        c.commit()
    sinks.names.append(name)
    wait_for(lambda: sink_state(pg, name)[0] == "running", what="sink running")
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    msgs = consume(topic, 1)
    assert msgs[0]["value"]["after"] == {"id": 1}
    del notices
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_slot_dropped_by_hand_is_an_error_not_a_resync(pg, sinks, unique):
    name = sinks.add(f"lost_{unique}", f"lost-{unique}")
    slot = slot_of(pg, name)
    wait_for(lambda: sink_state(pg, name)[0] == "running", what="sink running")
    with_slot_taken_from_worker(pg, slot, "SELECT pg_drop_replication_slot(%s)", (slot,))
    state = wait_for(lambda: (s := sink_state(pg, name)) and s[0] == "error" and s, what="error state")
    assert "does not exist" in state[1] and "re-add" in state[1]
    time.sleep(1.0)
    assert not slot_exists(pg, slot), "no new slot made behind the user's back"


def test_idle_sink_moves_its_slot_over_uncaptured_writes(pg, sinks, unique):
    """Heartbeat: writes to a table nobody captures must not pin WAL forever."""
    with server_settings({"cdc.heartbeat_interval_ms": 500}):
        name = sinks.add(f"hb_{unique}", f"hb-{unique}")
        slot = slot_of(pg, name)
        wait_for(lambda: sink_state(pg, name)[0] == "running", what="sink running")
        pg.execute(f"CREATE TABLE uncaptured_{unique} (id int, pad text)")
        pg.execute(f"INSERT INTO uncaptured_{unique} SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g")
        target = pg.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        wait_for(lambda: pg.execute("SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                                    (target, slot)).fetchone()[0], timeout=20, what="slot past the uncaptured writes")


def test_regression_uncaptured_writes_do_not_leave_the_slot_far_behind(pg, sinks, unique):
    """Every empty peek decodes again the WAL between the slot and the WAL end; a sink that captures
    nothing of a busy server kept its slot up to cdc.heartbeat_interval_ms behind and the worker
    re-decoded that WAL many times a second (0.74 cores at 2,000 uncaptured tx/s). Now a heartbeat
    goes out once the slot is 2 MB behind, whatever the interval (a minute here)."""
    with server_settings({"cdc.heartbeat_interval_ms": 60_000}):
        name = sinks.add(f"hbfar_{unique}", f"hbfar-{unique}")
        slot = slot_of(pg, name)
        wait_for(lambda: sink_state(pg, name)[0] == "running", what="sink running")
        time.sleep(1.0)  # the first heartbeat (none was written yet) goes out now, not in a minute
        pg.execute(f"CREATE TABLE uncaptured_{unique} (id int, pad text)")
        pg.execute(f"INSERT INTO uncaptured_{unique} SELECT g, repeat('x', 200) FROM generate_series(1, 40000) g")
        target = pg.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        wait_for(lambda: pg.execute("SELECT confirmed_flush_lsn >= %s::pg_lsn - 2 * 1024 * 1024 FROM pg_replication_slots "
                                    "WHERE slot_name = %s", (target, slot)).fetchone()[0],
                 timeout=30, what="slot within 2 MB of the uncaptured writes, long before the heartbeat interval")


@pytest.mark.slow
def test_broker_down_keeps_the_slot_and_recovers(pg, sinks, unique):
    """Broker unreachable: state 'retrying' with the error in SQL, nothing lost when it returns."""
    import subprocess
    t, topic, name = f"down_{unique}", f"down-{unique}", f"down_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(name, topic)
    pg.execute(f"INSERT INTO {t} VALUES (0)")
    consume(topic, 1)
    slot = slot_of(pg, name)
    before = pg.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0]
    subprocess.run(["scripts/kafka.sh", "stop"], check=True)
    try:
        for i in range(1, 51):
            pg.execute(f"INSERT INTO {t} VALUES (%s)", (i,))
        state = wait_for(lambda: (s := sink_state(pg, name)) and s[0] == "retrying" and s, timeout=150, what="retrying")
        assert state[1], "the error is visible in SQL"
        after = pg.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0]
        assert after == before, "the slot does not move while the broker is down"
    finally:
        subprocess.run(["scripts/kafka.sh", "start"], check=True)
    msgs = consume(topic, 51, timeout=120)
    assert {m["value"]["after"]["id"] for m in msgs} == set(range(51))
    wait_for(lambda: sink_state(pg, name)[0] == "running", timeout=60, what="running again")
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_dropped_publication_is_an_error_with_the_reason(pg, sinks, unique):
    """A pg_cdc publication dropped by hand: every sink stops in 'error' and says why."""
    t, name = f"pub_{unique}", f"pub_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(name, f"pub-{unique}")
    wait_for(lambda: sink_state(pg, name)[0] == "running", what="sink running")
    members = pg.execute("SELECT schemaname, tablename FROM pg_publication_tables "
                         "WHERE pubname = '_cdc_publication_inserts'").fetchall()
    pg.execute("DROP PUBLICATION _cdc_publication_inserts")
    try:
        pg.execute(f"INSERT INTO {t} VALUES (1)")
        state = wait_for(lambda: (s := sink_state(pg, name)) and s[0] == "error" and s, what="error state")
        assert "publication _cdc_publication_inserts does not exist" in state[1], state[1]
        assert "CREATE EXTENSION" in state[1], "the message says how to recover"
    finally:
        # Put it back as it was, for the tests that follow (their slots start after this point).
        pg.execute("CREATE PUBLICATION _cdc_publication_inserts WITH (publish = 'insert, truncate')")
        for schema, table in members:
            pg.execute(f'ALTER PUBLICATION _cdc_publication_inserts ADD TABLE ONLY "{schema}"."{table}"')
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_invalidated_slot_is_an_error_not_a_resync(pg, sinks, unique):
    """max_slot_wal_keep_size removes WAL a stuck sink still needs: 'error' with the reason, no new slot."""
    t, name = f"inval_{unique}", f"inval_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, pad text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    # A broker nobody listens on: the sink can read but never deliver, so its slot stays behind.
    sinks.add(name, f"inval-{unique}", bootstrap_servers="127.0.0.1:1")
    slot = slot_of(pg, name)
    pg.execute(f"INSERT INTO {t} VALUES (0, 'x')")
    wait_for(lambda: sink_state(pg, name)[0] == "retrying", timeout=60, what="retrying")
    with server_settings({"max_slot_wal_keep_size": "1MB"}):
        def lost():
            pg.execute(f"INSERT INTO {t} SELECT g, repeat('x', 500) FROM generate_series(1, 2000) g "
                       f"ON CONFLICT (id) DO UPDATE SET pad = excluded.pad")
            pg.execute("SELECT pg_switch_wal()")
            pg.execute("CHECKPOINT")
            return pg.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0] == "lost"
        wait_for(lost, timeout=60, what="slot invalidated")
    state = wait_for(lambda: (s := sink_state(pg, name)) and s[0] == "error" and s, timeout=60, what="error state")
    assert "invalidated" in state[1] and "re-add" in state[1], state[1]
    assert pg.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0] == 1, \
        "the invalidated slot is left for the DBA to see, not replaced"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_slot_moved_past_the_kafka_checkpoint_is_an_error(pg, sinks, unique):
    """Exactly-once: a slot advanced by hand past what Kafka holds stops the sink, while running
    and after a restart; nothing is skipped silently."""
    t, topic, name = f"ahead_{unique}", f"ahead-{unique}", f"ahead_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(name, topic)
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    consume(topic, 1)
    slot = slot_of(pg, name)
    time.sleep(1.0)  # let a first heartbeat, if any, be delivered before the jump
    # WAL the sink does not capture, then the slot jumps to its end behind the worker's back.
    pg.execute(f"CREATE TABLE other_{unique} AS SELECT 1 AS x")
    target = pg.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    with_slot_taken_from_worker(pg, slot, "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, target))
    pg.execute(f"INSERT INTO {t} VALUES (2)")
    state = wait_for(lambda: (s := sink_state(pg, name)) and s[0] == "error" and s, timeout=60, what="error state")
    assert "past the last checkpoint its sink committed" in state[1], state[1]
    restart_worker(pg)
    time.sleep(2.0)
    state = sink_state(pg, name)
    assert state[0] == "error" and "past the last checkpoint" in state[1], state
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_checkpoint_another_cluster_wrote_is_not_this_ones(pg, sinks, unique):
    """After pg_upgrade from PostgreSQL 17+, a sink's slot is carried over, starting at the new cluster's
    WAL position, while its progress topic's last checkpoint holds the old cluster's, lower: the
    exactly-once sink stopped in error ("past the last checkpoint") though the upgrade had required
    every change delivered. Checkpoints carry the system identifier of the cluster that wrote them; one
    another cluster wrote is not this cluster's. Here the slot is moved by hand past the checkpoint (the
    same check must stop the sink first: the control), then the topic gets the same checkpoint as
    another cluster would have written it."""
    t, topic, name = f"upgraded_{unique}", f"upgraded-{unique}", f"upgraded_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(name, topic)
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    consume(topic, 1)
    slot = slot_of(pg, name)
    system = pg.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()[0]
    pg.execute(f"CREATE TABLE other_{unique} AS SELECT 1 AS x")
    target = pg.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    with_slot_taken_from_worker(pg, slot, "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, target))
    state = wait_for(lambda: (s := sink_state(pg, name)) and s[0] == "error" and s, timeout=60, what="error state")
    assert "past the last checkpoint its sink committed" in state[1], state[1]
    # The last checkpoint record, this cluster's; then the same written by another cluster.
    progress, messages = progress_messages(pg, name)
    last = messages[-1]
    record = json.loads(last.value())
    assert record["system"] == system, record
    record["system"] = "1" + system
    p = Producer({"bootstrap.servers": BOOTSTRAP})
    p.produce(progress, key=last.key(), value=json.dumps(record).encode(), partition=0)
    assert p.flush(15) == 0
    restart_worker(pg)
    wait_for(lambda: sink_state(pg, name)[0] == "running", timeout=60, what="the sink running")
    pg.execute(f"INSERT INTO {t} VALUES (2)")
    msgs = consume(topic, 2)
    assert sorted(m["value"]["after"]["id"] for m in msgs) == [1, 2]
    # Its next checkpoints are this cluster's again.
    pg.execute(f"INSERT INTO {t} VALUES (3)")
    consume(topic, 3)
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_sink_with_an_unreachable_broker_does_not_stall_the_others(pg, sinks, unique):
    """Opening a producer against a dead broker takes the transaction timeout (30 s); it runs on
    its own thread, so the other sinks keep delivering meanwhile."""
    dead_t, t, topic = f"dead_{unique}", f"alive_{unique}", f"alive-{unique}"
    for table in (dead_t, t):
        pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        pg.execute("SELECT cdc_enable(%s)", (table,))
    sinks.add(f"alive_{unique}", topic, tables=[t])
    pg.execute(f"INSERT INTO {t} VALUES (0)")
    consume(topic, 1)
    sinks.add(f"dead_{unique}", f"dead-{unique}", bootstrap_servers="127.0.0.1:1", tables=[dead_t])
    pg.execute(f"INSERT INTO {dead_t} VALUES (1)")
    time.sleep(1.0)  # the dead sink starts opening its producer
    for i in range(1, 6):
        pg.execute(f"INSERT INTO {t} VALUES (%s)", (i,))
    msgs = consume(topic, 6, timeout=15)  # well inside the dead sink's 30 s open
    assert {m["value"]["after"]["id"] for m in msgs} == set(range(6))
    state = wait_for(lambda: (s := sink_state(pg, f"dead_{unique}")) and s[0] == "retrying" and s, timeout=90,
                     what="dead sink retrying")
    assert "Kafka" in state[1]
    for table in (dead_t, t):
        pg.execute("SELECT cdc_disable(%s)", (table,))


def test_the_benchmark_refuses_a_cluster_with_capture_it_did_not_create(pg, sinks, unique, tmp_path):
    """make bench-e2e on a cluster where a sink of someone else's (a demo or test leftover) captures
    every table would measure that sink's work too (42k instead of 199k events/s once): it stops
    before creating anything, names the sink and says how to drop it."""
    name = sinks.add(f"leftover_{unique}", f"leftover-{unique}")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "bench/e2e_bench.py", "--quick", "--out", str(tmp_path)],
                       cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stdout
    assert "refusing to run" in r.stderr and f"pg_cdc sink '{name}'" in r.stderr, r.stderr
    assert f"SELECT cdc_drop_sink('{name}');" in r.stderr
    assert pg.execute(r"SELECT count(*) FROM pg_class WHERE relname LIKE 'bench\_%'").fetchone()[0] == 0, \
        "nothing was created"
    assert not list(tmp_path.iterdir()), "no report was written"


def test_a_stored_config_that_cannot_be_read_stops_the_sinks_carrying_the_table(pg, sinks, unique):
    """A capture config changed by hand (or one a later version no longer accepts) used to be skipped
    with a WARNING, its table's changes dropped without a word. Now the sinks that carry the table stop
    in state error naming it, the others go on, and re-enabling delivers what was held back."""
    t, other = f"badcfg_{unique}", f"badcfgother_{unique}"
    for x in (t, other):
        pg.execute(f"CREATE TABLE {x} (id int PRIMARY KEY)")
        pg.execute("SELECT cdc_enable(%s)", (x,))
    carrier = sinks.add(f"badcfg_{unique}", f"badcfg-{unique}", tables=[t, other])
    sinks.add(f"badcfgby_{unique}", f"badcfgby-{unique}", tables=[other])
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    consume(f"badcfg-{unique}", 1)
    pg.execute("UPDATE _cdc_publications SET config = '{\"operations\": [\"UPSERT\"]}' WHERE table_name = %s", (t,))
    pg.execute(f"INSERT INTO {t} VALUES (2)")
    pg.execute(f"INSERT INTO {other} VALUES (1)")
    state = wait_for(lambda: (s := sink_state(pg, carrier)) and s[0] == "error" and s, what="error state")
    assert t in state[1] and "cannot be read" in state[1] and "UPSERT" in state[1], state[1]
    assert [m["value"]["after"]["id"] for m in consume(f"badcfgby-{unique}", 1)] == [1]
    pg.execute("SELECT cdc_enable(%s)", (t,))
    msgs = consume(f"badcfg-{unique}", 3, timeout=90)
    assert sorted((m["value"]["metadata"]["table"], m["value"]["after"]["id"]) for m in msgs) == \
        sorted([(t, 1), (t, 2), (other, 1)])
    for x in (t, other):
        pg.execute("SELECT cdc_disable(%s)", (x,))
