"""cdc_pause_sink / cdc_resume_sink, cdc_ready and the cdc_sink_state channel. Oracles: what a
read_committed consumer finds in each sink's topic (every row once), PostgreSQL's own views of the
processes, slots and locks, and the notifications a LISTEN connection receives."""
import json
import threading
import time

import psycopg
import pytest

from conftest import (connect, consume, delivery_status, read_messages, server_log, server_log_size, server_settings,
                      sink_state, wait_for, worker_pid)
from test_exactly_once import assert_exactly_once


class Listener:
    """A connection that LISTENs on cdc_sink_state and keeps every payload it received."""

    def __init__(self):
        self.conn = connect()
        self.conn.execute("LISTEN cdc_sink_state")
        self.payloads = []

    def poll(self, seconds=0.2):
        for n in self.conn.notifies(timeout=seconds):
            self.payloads.append(json.loads(n.payload))
        return self.payloads

    def of(self, sink):
        """The (old_state, new_state) pairs announced for `sink`, in order."""
        self.poll()
        return [(p["old_state"], p["new_state"]) for p in self.payloads if p["sink"] == sink]

    def close(self):
        self.conn.close()


class Writer:
    """Inserts one row per transaction into `table` (ids from 1) until finished."""

    def __init__(self, table):
        self.table, self.stop, self.written = table, threading.Event(), []
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        with connect() as app:
            i = 0
            while not self.stop.is_set():
                i += 1
                app.execute(f"INSERT INTO {self.table} VALUES (%s, 'v')", (i,))
                self.written.append(i)
                time.sleep(0.005)

    def finish(self):
        self.stop.set()
        self.thread.join()
        return len(self.written)


def in_topic(topic):
    """How many messages `topic` holds now (read until a second passes without one)."""
    return len(read_messages(topic, 0, timeout=5))


def state(pg, name):
    return sink_state(pg, name)[0]


def slot_of(pg, name):
    return pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]


def captured(pg, unique, prefix):
    t = f"{prefix}_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    return t


def test_a_paused_sink_stops_and_resumes_exactly_once_under_load(pg, sinks, unique):
    t = captured(pg, unique, "pause")
    paused, control = f"pause_p_{unique}", f"pause_c_{unique}"
    sinks.add(paused, f"pause-p-{unique}", tables=[t])
    sinks.add(control, f"pause-c-{unique}", tables=[t])
    listener = Listener()
    writer = Writer(t)
    try:
        consume(f"pause-p-{unique}", 50, timeout=60)
        wait_for(lambda: state(pg, paused) == "running", what="the sink running")
        assert pg.execute("SELECT cdc_pause_sink(%s)", (paused,)).fetchone()[0] is True
        # Its worker finishes the delivery in hand and exits; the launcher starts none.
        wait_for(lambda: worker_pid(pg, paused) is None, what="the paused sink's worker gone")
        assert state(pg, paused) == "paused"
        assert pg.execute("SELECT cdc_pause_sink(%s)", (paused,)).fetchone()[0] is False, "paused already"
        slot = slot_of(pg, paused)
        held_at = pg.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                             (slot,)).fetchone()[0]
        paused_count, control_count = in_topic(f"pause-p-{unique}"), in_topic(f"pause-c-{unique}")
        time.sleep(3)
        # Nothing more reaches the paused sink's topic while the application writes (the control
        # sink on the same table gets those rows), and its slot stays where it stopped, holding WAL.
        assert in_topic(f"pause-p-{unique}") == paused_count
        assert in_topic(f"pause-c-{unique}") > control_count + 100, "the application wrote meanwhile"
        status = pg.execute("SELECT state, retained_wal_bytes > 0, lag_bytes > 0 FROM cdc_status() "
                            "WHERE sink_name = %s", (paused,)).fetchone()
        assert status == ("paused", True, True), status
        assert pg.execute("SELECT confirmed_flush_lsn, active FROM pg_replication_slots WHERE slot_name = %s",
                          (slot,)).fetchone() == (held_at, False)
        assert worker_pid(pg, paused) is None, "the launcher started no worker for it"

        assert pg.execute("SELECT cdc_resume_sink(%s)", (paused,)).fetchone()[0] is True
        assert pg.execute("SELECT cdc_resume_sink(%s)", (paused,)).fetchone()[0] is False, "not paused now"
        wait_for(lambda: worker_pid(pg, paused), what="a worker for the resumed sink")
        time.sleep(1)
    finally:
        n = writer.finish()
    for topic in (f"pause-p-{unique}", f"pause-c-{unique}"):
        assert_exactly_once(consume(topic, n, timeout=90), range(1, n + 1))
    wait_for(lambda: state(pg, paused) == "running", what="the resumed sink running")
    # Each change of its state was announced, in order; the control sink was never paused.
    transitions = wait_for(lambda: (lambda s: s if ("paused", "starting") in s and s[-1] == ("starting", "running")
                                    else None)(listener.of(paused)), what="the notifications")
    i = transitions.index(("running", "paused"))
    assert transitions[i:] == [("running", "paused"), ("paused", "starting"), ("starting", "running")], transitions
    assert ("running", "paused") not in listener.of(control)
    reasons = [p["reason"] for p in listener.payloads if p["sink"] == paused and p["new_state"] == "paused"]
    assert reasons == [None], reasons
    listener.close()


def test_a_paused_sink_leaves_the_shared_decoding_and_catches_up_after(pg, sinks, unique):
    t = captured(pg, unique, "pause_shared")
    a, b = f"pause_sa_{unique}", f"pause_sb_{unique}"
    with server_settings({"cdc.shared_decoding": "on", "cdc.heartbeat_interval_ms": 500}):
        sinks.add(a, f"pause-sa-{unique}", tables=[t])
        sinks.add(b, f"pause-sb-{unique}", tables=[t])
        pg.execute(f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(1, 100) g")
        for n in (a, b):
            wait_for(lambda n=n: delivery_status(pg, n)["decoding"]["shared"], what=f"{n} reading the shared log")
        consume(f"pause-sa-{unique}", 100, timeout=60)
        pg.execute("SELECT cdc_pause_sink(%s)", (a,))
        wait_for(lambda: worker_pid(pg, a) is None, what="the paused sink's worker gone")
        held_at = pg.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                             (slot_of(pg, a),)).fetchone()[0]
        for i in range(101, 2101, 100):
            pg.execute(f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(%s::int, %s::int) g", (i, i + 99))
        # The group's slot moves past the paused sink's position: it holds nobody back (a member
        # holds the group's slot at its own slot's position).
        wait_for(lambda: pg.execute(
            "SELECT confirmed_flush_lsn > %s::pg_lsn FROM pg_replication_slots WHERE slot_name = '_cdc_group'",
            (held_at,)).fetchone()[0], what="the group's slot past the paused sink")
        assert_exactly_once(consume(f"pause-sb-{unique}", 2100, timeout=60), range(1, 2101))
        assert pg.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                          (slot_of(pg, a),)).fetchone()[0] == held_at
        pg.execute("SELECT cdc_resume_sink(%s)", (a,))
        # It decodes its own slot from where it stopped, then joins the log again.
        assert_exactly_once(consume(f"pause-sa-{unique}", 2100, timeout=90), range(1, 2101))
        wait_for(lambda: delivery_status(pg, a)["decoding"]["shared"], timeout=60, what="the resumed sink sharing")


def test_cdc_ready_says_which_sink_is_not_ready_and_why(pg, sinks, unique):
    t = captured(pg, unique, "ready")
    good, bad = f"ready_g_{unique}", f"ready_b_{unique}"
    sinks.add(good, f"ready-g-{unique}", tables=[t])
    pg.execute(f"INSERT INTO {t} VALUES (1, 'v')")
    consume(f"ready-g-{unique}", 1)
    wait_for(lambda: state(pg, good) == "running", what="the sink running")

    def mine():
        ready, reasons = pg.execute("SELECT ready, reasons FROM cdc_ready()").fetchone()
        assert ready == (reasons == []), (ready, reasons)
        return [r for r in reasons if unique in r]

    assert mine() == []
    # A broker nobody listens on: the sink retries, and is not ready.
    pg.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)",
               (bad, json.dumps({"bootstrap_servers": "127.0.0.1:1", "topic": f"ready-b-{unique}", "tables": [t]})))
    sinks.names.append(bad)
    reasons = wait_for(lambda: [r for r in mine() if bad in r and ("retrying" in r or "error" in r)],
                       what="the unreachable sink not ready")
    assert len(reasons) == 1 and reasons[0].startswith(f"sink {bad} is "), reasons
    metrics = pg.execute("SELECT cdc_prometheus_metrics()").fetchone()[0]
    assert f'pg_cdc_sink_ready{{sink="{bad}"}} 0' in metrics
    assert f'pg_cdc_sink_ready{{sink="{good}"}} 1' in metrics
    assert "\npg_cdc_ready 0\n" in metrics
    # Paused on purpose: ready.
    pg.execute("SELECT cdc_pause_sink(%s)", (bad,))
    assert mine() == []

    # Behind the WAL: the running sink's worker waits for a lock on its progress table, so its slot
    # cannot move past the row written now.
    with connect() as holder:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE _cdc_offsets IN ACCESS EXCLUSIVE MODE")
        pg.execute(f"INSERT INTO {t} VALUES (2, 'v')")
        wait_for(lambda: pg.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                    (worker_pid(pg, good),)).fetchone() == ("Lock",), what="the worker waiting")
        behind = [r for r in pg.execute("SELECT reasons FROM cdc_ready(max_lag_bytes => 0)").fetchone()[0]
                  if good in r]
        assert len(behind) == 1 and "bytes behind the WAL (more than 0)" in behind[0], behind
        assert not [r for r in pg.execute("SELECT reasons FROM cdc_ready(max_lag_bytes => 1073741824)").fetchone()[0]
                    if good in r]
        holder.execute("COMMIT")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        pg.execute("SELECT cdc_ready(max_lag_bytes => -1)")


def test_a_paused_sink_past_paused_max_wal_size_resumes_by_itself(pg, sinks, unique):
    t = captured(pg, unique, "pause_bound")
    name = f"pause_bound_{unique}"
    sinks.add(name, f"pause-bound-{unique}", tables=[t])
    pg.execute(f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(1, 10) g")
    consume(f"pause-bound-{unique}", 10)
    listener = Listener()
    pg.execute("SELECT cdc_pause_sink(%s)", (name,))
    wait_for(lambda: worker_pid(pg, name) is None, what="the paused sink's worker gone")
    retained = pg.execute("SELECT retained_wal_bytes FROM cdc_status() WHERE sink_name = %s", (name,)).fetchone()[0]
    bound_mb = (retained >> 20) + 4
    logged = server_log_size()
    with server_settings({"cdc.paused_max_wal_size": bound_mb}):
        # Below the bound it stays paused (the launcher looks every second).
        pg.execute(f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(11, 20) g")
        time.sleep(3)
        assert state(pg, name) == "paused"
        # Past it, the launcher resumes it, and says why.
        pg.execute("SELECT pg_logical_emit_message(false, 'pause-bound-test', repeat('x', %s))",
                   ((bound_mb + 2) << 20,))
        wait_for(lambda: state(pg, name) == "running", what="the sink resumed by itself")
    assert_exactly_once(consume(f"pause-bound-{unique}", 20), range(1, 21))
    assert f'pg_cdc sink "{name}": resumed by itself' in server_log(logged)
    resumed = [p for p in listener.poll() if p["sink"] == name and p["old_state"] == "paused"]
    assert resumed and resumed[0]["new_state"] == "starting", resumed
    assert "over cdc.paused_max_wal_size" in resumed[0]["reason"], resumed
    listener.close()


def test_pause_and_resume_refuse_what_they_cannot_do(pg, sinks, unique):
    with pytest.raises(psycopg.errors.UndefinedObject):
        pg.execute("SELECT cdc_pause_sink('no_such_sink')")
    with pytest.raises(psycopg.errors.UndefinedObject):
        pg.execute("SELECT cdc_resume_sink('no_such_sink')")
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        pg.execute("SELECT cdc_pause_sink(NULL)")
    t = captured(pg, unique, "pause_refused")
    name = f"pause_refused_{unique}"
    # Added in a transaction that already wrote: its slot is made after COMMIT; no pause before.
    with connect() as c:
        c.execute("BEGIN")
        c.execute(f"INSERT INTO {t} VALUES (1, 'v')")
        c.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)",
                  (name, json.dumps({"bootstrap_servers": "127.0.0.1:9092", "topic": f"pause-refused-{unique}",
                                     "tables": [t]})))
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            c.execute("SELECT cdc_pause_sink(%s)", (name,))
        assert "no slot yet" in e.value.diag.message_primary
        c.execute("ROLLBACK")
