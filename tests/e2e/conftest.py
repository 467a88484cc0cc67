"""End-to-end fixtures: the real PostgreSQL started by `make up` and the real Kafka broker.

Events are read back with an independent client (confluent-kafka, read_committed), never from the
worker's own state. Each test uses its own tables and topics, and drops its sinks afterwards.
"""
import contextlib
import json
import os
import re
import threading
import time
import uuid

import psycopg
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

PG_DSN = "host={} port={} user={} dbname={}".format(
    os.environ.get("PGHOST", "127.0.0.1"),
    os.environ.get("PGPORT", "55432"),
    os.environ.get("PGUSER", "postgres"),
    os.environ.get("PGDATABASE", "postgres"),
)
BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")


def connect():
    return psycopg.connect(PG_DSN, autocommit=True)


def foreign_sinks(conn):
    """Sinks on the cluster (each test drops its own, so at the start of a run every sink is
    someone else's: make demo's demo_kafka, a crashed run's leftovers)."""
    if not conn.execute("SELECT to_regclass('_cdc_sinks') IS NOT NULL").fetchone()[0]:
        return []
    return [r[0] for r in conn.execute("SELECT sink_name FROM _cdc_sinks ORDER BY 1").fetchall()]


@pytest.fixture(scope="session", autouse=True)
def quiet_cluster():
    """Refuses to run next to sinks the suite did not create: every sink captures every captured
    table unless its config lists some, so one left running (make demo's) decodes and publishes
    each test's changes too, which doubles the load of the memory and large-transaction tests and
    made them time out."""
    with connect() as conn:
        found = foreign_sinks(conn)
    if found:
        pytest.exit("e2e: sinks the tests did not create are running and would capture every test table: "
                    + ", ".join(found) + ". Drop them first (SELECT cdc_drop_sink(sink_name) FROM _cdc_sinks;), "
                    "or run `make test`, which starts from a new, empty cluster.", returncode=2)
    yield


# A server process that died of a signal other than the tests' own kill -9, or exited with a code
# other than 0 and 1 (the postmaster then restarts every backend).
CRASH = re.compile(r"(terminated by signal (?!9\b)\d+|exited with exit code (?![01]\b)\d+)")


@pytest.fixture(autouse=True)
def no_crash_in_the_server_log():
    """Fails the test during which a server process crashed, with the log lines that led up to it.
    The crash otherwise shows only as a connection some later statement finds closed ("server closed
    the connection unexpectedly"), with nothing that says which process died or why. A worker of the
    previous test's dropped sink may crash while it exits, during this test: the lines say whose."""
    logged = server_log_size() if os.path.exists(SERVER_LOG) else 0
    yield
    if not os.path.exists(SERVER_LOG):
        return
    lines = server_log(logged).splitlines()
    for i, line in enumerate(lines):
        if CRASH.search(line):
            pytest.fail("a server process crashed:\n" + "\n".join(lines[max(0, i - 40):i + 3]), pytrace=False)


@pytest.fixture
def pg():
    with connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cdc")
        before = {r[0] for r in conn.execute("SELECT table_oid FROM _cdc_publications").fetchall()}
        yield conn
    # Leave capture as the test found it: a sink without `tables` carries every captured table and
    # snapshots its rows, so a table a test left captured would be read by every later such sink.
    try:
        with connect() as c:
            for (oid,) in c.execute("SELECT table_oid FROM _cdc_publications").fetchall():
                if oid not in before:
                    c.execute("SELECT cdc_disable(table_oid::regclass) FROM _cdc_publications WHERE table_oid = %s",
                              (oid,))
    except psycopg.Error:
        pass  # the test dropped the extension, or the server is down: nothing to clean


@pytest.fixture
def unique():
    """A short unique suffix for tables, sinks and topics of one test."""
    return uuid.uuid4().hex[:10]


class Sinks:
    def __init__(self, conn):
        self.conn = conn
        self.names = []
        self.topics = []

    def add(self, name, topic, **extra):
        cfg = {"bootstrap_servers": BOOTSTRAP, "topic": topic, "format": "json", **extra}
        self.conn.execute("SELECT cdc_add_sink(sink_name => %s, sink_type => 'kafka', config => %s::jsonb)",
                          (name, json.dumps(cfg)))
        self.names.append(name)
        if "{" not in topic:
            self.topics.append(topic)
        return name

    def drop_all(self):
        # A fresh connection: the test may have crashed the server under the fixture's one.
        with connect() as conn:
            for n in self.names:
                slot = conn.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (n,)).fetchone()
                if slot:
                    self.topics.append("pg_cdc.progress." + slot[0].removeprefix("_cdc_"))
                conn.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (n, n))
        delete_topics(self.topics)


def create_topic(topic, partitions=1):
    """Creates `topic` with `partitions` partitions (a test that needs one order of events across
    keys creates its topic with one, before the sink writes to it)."""
    from confluent_kafka.admin import NewTopic
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    for f in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)]).values():
        f.result(15)


def delete_topics(topics, wait=False):
    """Deletes test topics, so the broker the tests share stays small (its restarts in the chaos run
    load every partition). Best effort: a topic that was never created is fine. With `wait`, returns
    once the broker no longer lists them (a topic of that name made next starts empty)."""
    if not topics:
        return
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    for f in admin.delete_topics(topics, operation_timeout=10).values():
        try:
            f.result(15)
        except Exception:  # noqa: BLE001 - never created, or already gone
            pass
    if wait:
        wait_for(lambda: not set(topics) & set(admin.list_topics(timeout=15).topics), what="topics deleted")


def drop_schema(conn, schema):
    """Stops capturing the tables of `schema`, then drops it with everything in it."""
    for (oid,) in conn.execute("SELECT p.table_oid FROM _cdc_publications p JOIN pg_class k ON k.oid = p.table_oid "
                               "WHERE k.relnamespace::regnamespace::text = %s", (schema,)).fetchall():
        conn.execute("SELECT cdc_disable(%s::regclass)", (oid,))
    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def sinks(pg):
    s = Sinks(pg)
    yield s
    s.drop_all()


class TypedSinks:
    """Sinks of one type a test adds (not Kafka's: the `sinks` fixture also deletes their topics), dropped
    after the test on a fresh connection (the test may have crashed the server under the fixture's one)."""

    def __init__(self, conn, sink_type):
        self.conn, self.sink_type, self.names = conn, sink_type, []

    def add(self, name, config):
        """Adds sink `name` with `config` (a dict, or JSON text kept as written)."""
        self.conn.execute("SELECT cdc_add_sink(%s, %s, %s::jsonb)",
                          (name, self.sink_type, config if isinstance(config, str) else json.dumps(config)))
        self.names.append(name)
        return name

    def drop_all(self):
        with connect() as c:
            for n in self.names:
                c.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (n, n))


@contextlib.contextmanager
def typed_sinks(conn, sink_type):
    """A `TypedSinks` of `sink_type` for the length of a test (its modules make it their fixture)."""
    s = TypedSinks(conn, sink_type)
    try:
        yield s
    finally:
        s.drop_all()


def read_messages(topic, count, timeout=30.0, extra=None):
    """Reads `count` messages (read_committed) from the start of `topic`, failing if they do not
    arrive in time; then keeps reading 1 s more to catch unexpected extra messages. Returns them
    as confluent-kafka messages, in arrival order."""
    conf = {
        "bootstrap.servers": BOOTSTRAP,
        "group.id": "e2e-" + uuid.uuid4().hex,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
    }
    conf.update(extra or {})
    c = Consumer(conf)
    c.subscribe([topic])
    out = []
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and len(out) < count:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            out.append(m)
        tail = time.time() + 1.0
        while time.time() < tail:
            m = c.poll(0.2)
            if m is not None and not m.error():
                out.append(m)
    finally:
        c.close()
    assert len(out) >= count, f"only {len(out)} of {count} messages arrived on {topic}"
    return out


def consume(topic, count, timeout=30.0, extra=None):
    """Reads `count` JSON events (see `read_messages`); returns (key, value) dicts plus the raw
    bytes, in commit order."""
    out = read_messages(topic, count, timeout, extra)
    # Partitions interleave arbitrarily: put the events back in commit order (per key it already is).
    out.sort(key=lambda m: (json.loads(m.value())["metadata"]["commit_lsn"], json.loads(m.value())["metadata"]["lsn"]))
    return [
        {
            "key": json.loads(m.key()) if m.key() else None,
            "value": json.loads(m.value()),
            "raw": m.value(),
            "partition": m.partition(),
            "offset": m.offset(),
            "timestamp": m.timestamp()[1],  # milliseconds: the producer's, or the broker's (LogAppendTime)
        }
        for m in out
    ]


def wait_for(pred, timeout=30.0, what="condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def worker_pids(conn):
    """Every sink worker (one process per sink; pg_stat_activity.backend_type 'pg_cdc worker')."""
    return [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_cdc worker' "
                                       "ORDER BY backend_start").fetchall()]


def worker_pid(conn, sink=None):
    """The sink worker of `sink` (its application_name is 'pg_cdc worker: <sink name>'), or, without
    a sink, the newest sink worker (tests with one sink)."""
    if sink is not None:
        row = conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_cdc worker' "
                           "AND application_name = %s", (f"pg_cdc worker: {sink}",)).fetchone()
        return row[0] if row else None
    pids = worker_pids(conn)
    return pids[-1] if pids else None


def restart_worker(conn):
    """pg_terminate_backend on every sink worker, then wait for the launcher to start new ones."""
    old = set(wait_for(lambda: worker_pids(conn), what="worker running"))
    for pid in old:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_for(lambda: worker_pids(conn) and not old & set(worker_pids(conn)), what="worker restarted")


def with_slot_taken_from_worker(conn, slot, sql, params=()):
    """Runs `sql` on a sink's slot, which its worker holds while it runs (its decoding session):
    ends the process holding it, then runs `sql` before the launcher's new worker takes it back
    (the launcher waits a second between starts of one sink's worker). What a DBA does to touch a
    slot by hand."""
    for _ in range(100):
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        if row and row[0] is not None:
            conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            time.sleep(0.05)
        try:
            return conn.execute(sql, params)
        except psycopg.errors.ObjectInUse:
            time.sleep(0.05)
    raise AssertionError(f"slot {slot} stayed in use")


SERVER_LOG = os.path.join(os.environ.get("PG_CDC_RUN", "/var/tmp/pg_cdc"),
                          f"postgresql-{os.environ.get('PGPORT', '55432')}.log")


def server_log(since=0):
    """The server log from byte `since` on (see `server_log_size`)."""
    with open(SERVER_LOG, "rb") as f:
        f.seek(since)
        return f.read().decode(errors="replace")


def server_log_size():
    return os.path.getsize(SERVER_LOG)


def sink_state(conn, name):
    row = conn.execute("SELECT state, last_error FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()
    return row


def delivery_status(conn, name):
    """cdc_delivery_status(name) as a dict."""
    return conn.execute("SELECT cdc_delivery_status(%s)", (name,)).fetchone()[0]


@contextlib.contextmanager
def server_settings(settings):
    """ALTER SYSTEM SET each setting and reload; RESET them all on the way out, on a fresh connection
    (the test may have restarted the server under its own)."""
    with connect() as c:
        for name, value in settings.items():
            c.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        c.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with connect() as c:
            for name in settings:
                c.execute(f"ALTER SYSTEM RESET {name}")
            c.execute("SELECT pg_reload_conf()")


def crash_at_failpoint(pg, sink, write):
    """Arms the after_sink_commit failpoint of `sink` (and of no other sink), runs `write`, waits
    until the worker exits at it (after the sink's Kafka commit, before its slot moves), and disarms
    it. The launcher starts a new worker for the sink."""
    old = wait_for(lambda: worker_pid(pg, sink), what="worker running")
    logged = server_log_size()
    with server_settings({"cdc.test_failpoint": f"after_sink_commit:{sink}"}):
        # The worker re-reads its settings at its next tick, and logs the failpoint it armed.
        wait_for(lambda: f"test failpoint after_sink_commit:{sink} armed" in server_log(logged),
                 what="the worker armed the failpoint")
        write()
        # Read from the log: the worker may exit at the failpoint again and again while it stays
        # armed, each replacement living only milliseconds.
        wait_for(lambda: f'failpoint after_sink_commit of sink "{sink}": exiting' in server_log(logged),
                 timeout=30, what="worker exited at the failpoint")
    # Disarmed once a new session sees it: the postmaster has reloaded and signalled every worker,
    # and a worker reads its settings again before it fires (one forked before the reload, or in a
    # pass when the signal came, fired again after a later commit: a flake in CI).
    with connect() as c:
        wait_for(lambda: c.execute("SELECT current_setting('cdc.test_failpoint')").fetchone()[0] == "",
                 timeout=10, what="the failpoint disarmed")
    wait_for(lambda: worker_pid(pg, sink) not in (None, old), timeout=30, what="a new worker for the sink")


@contextlib.contextmanager
def hold_worker(pg):
    """Holds the sink workers at the start of their next pass (they wait for a lock on _cdc_sinks) while the
    block runs, so everything the block commits is read afterwards as one backlog."""
    with connect() as holder:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE _cdc_sinks IN ACCESS EXCLUSIVE MODE")
        wait_for(lambda: worker_pids(pg) and all(
            pg.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (p,)).fetchone() == ("Lock",)
            for p in worker_pids(pg)), what="worker waiting")
        yield
        holder.execute("COMMIT")


def progress_messages(pg, sink):
    """The messages committed to a sink's progress topic (its name, and the messages in order), read
    with an independent read_committed consumer: one per Kafka transaction the sink committed."""
    slot = pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (sink,)).fetchone()[0]
    topic = "pg_cdc.progress." + slot.removeprefix("_cdc_")
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "e2e-" + uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    out, idle = [], time.time() + 5
    try:
        while time.time() < idle:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            out.append(m)
            idle = time.time() + 2
    finally:
        c.close()
    return topic, out


def progress_records(pg, sink):
    """The checkpoint records' end LSNs, in order, of a sink's progress topic (`progress_messages`)."""
    return [json.loads(m.value())["end_lsn"] for m in progress_messages(pg, sink)[1]]


def wal_lsn(pg):
    """The current WAL position as a number (what events and checkpoints carry)."""
    return int(pg.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()[0])


def wait_setting(conn, name, value):
    """Waits until a reloaded server setting has reached `conn`'s backend (a backend applies a
    reload between statements, once the postmaster's signal has arrived)."""
    wait_for(lambda: conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0] == str(value),
             timeout=10, what=f"{name} = {value} in this session")


def worker_back():
    """Whether the server accepts connections again and the worker runs (after a crash-restart)."""
    try:
        with connect() as c:
            return worker_pid(c) is not None
    except psycopg.OperationalError:
        return False


def check_keyed_at_least_once(messages, expected_ids, table=None, *, key, ident):
    """The at-least-once oracle of the keyed sinks (Kinesis, Pub/Sub, Pulsar), over what an independent
    client read back: each message a dict with "raw" (its bytes) and "event" (parsed). Every expected row
    (of `table`, when given) arrived; a message seen twice (`ident(m)`) is byte-identical; per key
    (`key(m)`), first arrivals are in commit order. Returns how many messages were duplicates."""
    seen, first_by_key = {}, {}
    for m in messages:
        i = ident(m)
        if i in seen:
            assert seen[i] == m["raw"], f"message {i} differs on its second send"
            continue
        seen[i] = m["raw"]
        md = m["event"]["metadata"]
        first_by_key.setdefault(key(m), []).append((md["commit_lsn"], md["lsn"]))
    for k, order in first_by_key.items():
        assert order == sorted(order), f"key {k}: messages arrived out of commit order"
    got = {m["event"]["after"]["id"] for m in messages
           if (table is None or m["event"]["metadata"]["table"] == table) and m["event"].get("after")}
    assert got == set(expected_ids), f"missing {sorted(set(expected_ids) - got)[:10]}"
    return len(messages) - len(seen)


def sigkill_while_writing(pg, table, rows_per_txn, kills=2, ready=lambda: True, pause=0.0):
    """Commits transactions of `rows_per_txn` rows into `table` (id int, v text) from a thread while the
    worker is SIGKILLed `kills` times, each once writes flow and `ready()` holds (PostgreSQL then
    crash-restarts every backend). The writer reconnects through each restart and goes on from the
    table's highest id (uncommitted rows are gone); it sleeps `pause` seconds after each commit (a slow
    peer would otherwise fall minutes behind). Returns once the server is back after the last kill and
    the writer stopped: the source table is then the oracle."""
    stop, committed = threading.Event(), []

    def writer():
        while not stop.is_set():
            try:
                with psycopg.connect(PG_DSN, autocommit=True) as w:
                    n = w.execute(f"SELECT coalesce(max(id) + 1, 0) FROM {table}").fetchone()[0]
                    while not stop.is_set():
                        with w.transaction():
                            for _ in range(rows_per_txn):
                                w.execute(f"INSERT INTO {table} VALUES (%s, 'x')", (n,))
                                n += 1
                        committed.append(n)
                        if pause:
                            time.sleep(pause)
            except psycopg.OperationalError:
                time.sleep(0.5)

    th = threading.Thread(target=writer)
    th.start()
    try:
        for _ in range(kills):
            wait_for(lambda: len(committed) > 30 and ready(), what="writes flowing")
            committed.clear()
            with connect() as c:
                os.kill(wait_for(lambda: worker_pid(c), what="worker"), 9)
            time.sleep(3)
            wait_for(worker_back, timeout=60, what="server back")
    finally:
        stop.set()
        th.join(60)


@contextlib.contextmanager
def secret_in_data_dir(pg, prefix, content):
    """A file holding `content` in the data directory, owned by the server's user, mode 0600, as pg_cdc
    wants its secret files; yields its name (relative to the data directory) and removes it after."""
    data = pg.execute("SHOW data_directory").fetchone()[0]
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    path = os.path.join(data, name)
    with open(path, "wb") as f:
        f.write(content)
    st = os.stat(data)
    os.chown(path, st.st_uid, st.st_gid)
    os.chmod(path, 0o600)
    try:
        yield name
    finally:
        os.unlink(path)
