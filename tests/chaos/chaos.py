#!/usr/bin/env python3
"""Seeded fault-injection run for exactly-once delivery into Kafka, or into the in-database sink
with --sink table (`make chaos`).

Writers commit multi-row, multi-table transactions whose rows carry per-writer gap-free sequences
(including ROLLBACK and ROLLBACK TO SAVEPOINT), while faults hit the pipeline: pg_terminate_backend of
the worker, SIGKILL of the worker (PostgreSQL then crash-restarts every backend), `pg_ctl stop -m
immediate` + start, broker SIGKILL + restart, a broker outage longer than the transaction timeout, the
failpoint between the Kafka commit and the slot advance, and a zombie producer with the pipeline's
transactional.id.

With --snapshot-rows N the run covers snapshots too: chaos_a and chaos_b hold N rows each before the
sink is added, so the sink starts with its initial snapshot (read in chunks of --snapshot-chunk rows)
while the faults hit and a racing writer updates (chaos_b) and deletes (chaos_a) the rows just past the
running snapshot's cursor, as fast as it can; a `snapshot` fault asks for one more snapshot of chaos_a
with cdc_snapshot mid-run. At least --min-faults faults must land while a
snapshot is under way.

With --ddl a DDL thread alters chaos_a while the writers run and the faults hit: ADD COLUMN (with a
default), RENAME COLUMN, ALTER COLUMN ... TYPE (int to bigint) and DROP COLUMN of columns of its own, in
turn, each taking the WAL insert position inside its transaction (while it holds the table's lock, so
every other transaction of chaos_a commits before it or after its commit); and it tries, again and
again, a change chaos_b's enforced compatibility mode forbids (narrowing val to smallint), which must be
refused (55000) every time. The oracle then checks that each chaos_a event carries exactly the columns
of the schema in force at its position (a snapshot READ event may carry the version just before: its
chunk may be read before a DDL that commits ahead of the chunk's watermark), and folds each event
through the DDLs after it before comparing with the table.

With --shared-decoding, cdc.shared_decoding is on and a second Kafka sink on the same tables reads the
same decoding (its topic goes through the same oracle); before each fault the run waits until both
sinks read the shared log (a fault that lands otherwise fails the run), and one more fault kind,
decoder_terminate, ends the decoder process they share.

With --sink table the events go to an event table instead, and the faults are the ones that apply
(worker terminate and SIGKILL, immediate stop, the failpoint after the sink's commit).

The oracle is an independent read_committed consumer (or a SELECT on the event table): it folds the
events by (table, key) in
(commit_lsn, lsn) order -- the apply_cdc rule: newer versions win, deletes leave tombstones -- and
compares with SELECT on the source tables; it also checks zero duplicates, zero per-writer gaps, every
transaction whole (event_count events per commit_lsn), and nothing from aborted work. With snapshots, READ
events fold like inserts, and no row of chaos_b (snapshotted once) may arrive as a READ twice.

    tests/chaos/chaos.py --seed 1 --transactions 2000 --min-faults 2          # short run
    tests/chaos/chaos.py --seed 7 --transactions 100000 --min-faults 20 --fault-count broker_outage=3 \
        --rate 80 --out tests/chaos/results/long.json                          # long run (make chaos-long)
    tests/chaos/chaos.py --control-no-dedup    # must FAIL: proves the oracle sees duplicates
    tests/chaos/chaos.py --sink table --snapshot-rows 30000 --control-no-window   # must see stale rows
    tests/chaos/chaos.py --sink table --seed 3 --transactions 1000 --min-faults 2   # the in-database sink
    tests/chaos/chaos.py --seed 1 --transactions 2000 --min-faults 2 --rate 25 --snapshot-rows 50000  # over snapshots
    tests/chaos/chaos.py --seed 1 --transactions 2000 --min-faults 2 --rate 25 --ddl 2  # ALTERs while it all runs
    tests/chaos/chaos.py --seed 6 --transactions 300 --rate 40 --ddl 1 --control-ddl-unlogged  # must see wrong columns
    tests/chaos/chaos.py --seed 5 --transactions 1000 --min-faults 1 --rate 25 --shared-decoding  # two sinks, one decoding
"""
import argparse
import collections
import json
import os
import random
import subprocess
import sys
import threading
import time

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
DSN = "host={} port={} user={} dbname={}".format(
    os.environ.get("PGHOST", "127.0.0.1"), os.environ.get("PGPORT", "55432"),
    os.environ.get("PGUSER", "postgres"), os.environ.get("PGDATABASE", "postgres"))
BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
TABLES = ("chaos_a", "chaos_b", "chaos_txn")


def log(msg):
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def connect(retries=120):
    for _ in range(retries):
        try:
            return psycopg.connect(DSN, autocommit=True, connect_timeout=3)
        except psycopg.OperationalError:
            time.sleep(0.5)
    raise RuntimeError("PostgreSQL did not come back")


def sh(*args):
    subprocess.run(list(args), check=True, cwd=REPO, stdout=subprocess.DEVNULL)


class Writer(threading.Thread):
    """Commits transactions (writer, seq = 1, 2, ...) with no gaps; resolves unknown outcomes by
    reading the table back."""

    def __init__(self, wid, rng, target, stop, interval):
        super().__init__(daemon=True)
        self.wid, self.rng, self.target, self.stop_ev = wid, rng, target, stop
        self.interval = interval  # seconds between this writer's commits (0: as fast as it can)
        self.seq = 0
        self.aborted = 0
        self.unknown_resolved = 0
        self.error = None

    def committed(self, conn, seq):
        return conn.execute("SELECT 1 FROM chaos_txn WHERE writer = %s AND seq = %s", (self.wid, seq)).fetchone() is not None

    def one(self, conn, seq):
        r, w = self.rng, self.wid
        with conn.transaction():
            for i in range(r.randint(1, 3)):
                conn.execute("INSERT INTO chaos_a VALUES (%s, %s, %s, %s)", (f"{w}-{seq}-{i}", w, seq, r.randint(0, 9)))
            conn.execute("INSERT INTO chaos_b VALUES (%s, %s, %s, 0)", (f"{w}-{seq}", w, seq))
            if seq > 1:
                old = r.randint(max(1, seq - 50), seq - 1)
                conn.execute("UPDATE chaos_b SET val = val + 1, seq = %s WHERE id = %s", (seq, f"{w}-{old}"))
                if r.random() < 0.3:
                    conn.execute("DELETE FROM chaos_a WHERE id = %s", (f"{w}-{old}-0",))
            if r.random() < 0.2:
                conn.execute("SAVEPOINT s")
                conn.execute("INSERT INTO chaos_a VALUES (%s, %s, %s, -1)", (f"aborted-sp-{w}-{seq}", w, seq))
                conn.execute("ROLLBACK TO SAVEPOINT s")
            conn.execute("INSERT INTO chaos_txn VALUES (%s, %s)", (w, seq))

    def run(self):
        conn = connect()
        next_at = time.time()
        try:
            # At least `target` transactions, and on until the last fault is done, so every fault
            # lands while transactions are being committed.
            while self.seq < self.target or not self.stop_ev.is_set():
                if self.interval:
                    next_at += self.interval
                    time.sleep(max(0.0, next_at - time.time()))
                seq = self.seq + 1
                try:
                    if self.rng.random() < 0.1:
                        try:
                            with conn.transaction():
                                conn.execute("INSERT INTO chaos_a VALUES (%s, %s, %s, -1)", (f"aborted-{self.wid}-{seq}", self.wid, seq))
                                raise ValueError("rollback")
                        except ValueError:
                            self.aborted += 1
                    self.one(conn, seq)
                    self.seq = seq
                except (psycopg.OperationalError, psycopg.errors.AdminShutdown, psycopg.InterfaceError):
                    # The server went away, maybe during COMMIT: read the outcome back.
                    try:
                        conn.close()
                    except Exception:
                        pass
                    conn = connect()
                    if self.committed(conn, seq):
                        self.seq = seq
                        self.unknown_resolved += 1
        except Exception as e:  # noqa: BLE001 - reported by the run
            self.error = repr(e)


def worker_pid(conn, sink):
    row = conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_cdc worker' "
                       "AND application_name = %s", (f"pg_cdc worker: {sink}",)).fetchone()
    return row[0] if row else None


def decoder_pid(conn):
    row = conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_cdc decoder'").fetchone()
    return row[0] if row else None


def wait_for_pid(find, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with connect() as c:
                pid = find(c)
                if pid:
                    return pid
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the {what} did not come back")


def reads_shared_log(sink):
    """Whether the sink's worker reads the shared decoding's log now (None: the server is away)."""
    try:
        with connect(retries=1) as c:
            return c.execute("SELECT (cdc_delivery_status(%s) -> 'decoding' ->> 'shared')::boolean",
                             (sink,)).fetchone()[0]
    except Exception:  # noqa: BLE001 - the server is restarting
        return None


def pre_id(n):
    """The key of preloaded row n: zero-padded, so the snapshot reads them in numeric order."""
    return f"pre-{n:07d}"


class SnapshotWriter(threading.Thread):
    """While a snapshot of chaos_a or chaos_b runs, changes the rows just past its cursor (the chunk
    in flight and the next), one per transaction, as fast as it can: the rows whose changes race
    their chunk's read. Updates chaos_b's rows, deletes chaos_a's. Unknown outcomes need no care:
    the oracle compares with the tables as they end."""

    def __init__(self, rng, rows, chunk, stop):
        super().__init__(daemon=True)
        self.rng, self.rows, self.chunk, self.stop_ev = rng, rows, chunk, stop
        self.changed = 0

    def run(self):
        conn = None
        while not self.stop_ev.is_set():
            try:
                conn = conn or connect()
                cur = conn.execute(
                    "SELECT t.relname, (s.last_key)[1] FROM _cdc_snapshots s JOIN pg_class t ON t.oid = s.table_oid "
                    "WHERE s.state = 'running' AND t.relname IN ('chaos_a', 'chaos_b') "
                    "ORDER BY s.snapshot_id DESC LIMIT 1").fetchone()
                if cur is None:
                    time.sleep(0.2)
                    continue
                table, last = cur
                n = (int(last[4:]) if last and last.startswith("pre-") else 0) + self.rng.randint(1, 2 * self.chunk)
                if n > self.rows:
                    time.sleep(0.05)
                    continue
                if table == "chaos_b":
                    self.changed += conn.execute("UPDATE chaos_b SET val = val + 1 WHERE id = %s", (pre_id(n),)).rowcount
                else:
                    self.changed += conn.execute("DELETE FROM chaos_a WHERE id = %s", (pre_id(n),)).rowcount
            except psycopg.Error:
                try:
                    conn and conn.close()
                except Exception:  # noqa: BLE001 - the server is away
                    pass
                conn = None
                time.sleep(0.2)


BASE_COLUMNS = ("id", "writer", "seq", "val")


class DdlRunner(threading.Thread):
    """Alters chaos_a every `interval` seconds until stopped (see --ddl): ADD, RENAME, TYPE, DROP of
    its own columns, in turn. Records (position, step) for each DDL that committed: the position is
    the WAL insert LSN taken inside its transaction, after the ALTER (it holds the table's ACCESS
    EXCLUSIVE lock then, so every other transaction writing chaos_a commits before it or after the DDL
    commits). A DDL whose commit was lost to a fault is resolved by reading the catalog back; its
    position is then the LSN taken inside, when that answer came back, else the window around it."""

    def __init__(self, interval, stop):
        super().__init__(daemon=True)
        self.interval, self.stop_ev = interval, stop
        self.log = []  # (lo, hi, step): the DDL's position is in [lo, hi] (lo == hi when exact)
        self.refused = 0  # enforced chaos_b changes refused with 55000
        self.accepted = 0  # ... and let through (must stay 0)
        self.error = None

    def steps(self):
        n = 0
        while True:
            n += 1
            col, renamed = f"ddl_{n}", f"ddl_{n}_r"
            yield ("add", col, n), f"ALTER TABLE chaos_a ADD COLUMN {col} int DEFAULT {n}", (col, True)
            yield ("rename", col, renamed), f"ALTER TABLE chaos_a RENAME COLUMN {col} TO {renamed}", (renamed, True)
            yield ("type", renamed, "bigint"), f"ALTER TABLE chaos_a ALTER COLUMN {renamed} TYPE bigint", \
                (renamed, "bigint")
            yield ("drop", renamed), f"ALTER TABLE chaos_a DROP COLUMN {renamed}", (renamed, False)

    @staticmethod
    def lsn(conn):
        return int(conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'").fetchone()[0])

    @staticmethod
    def done(conn, check):
        """Whether the catalog shows the step done: the column exists (or not), or has the type."""
        col, want = check
        row = conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'chaos_a'::regclass "
                           "AND attname = %s AND NOT attisdropped", (col,)).fetchone()
        if want is False:
            return row is None
        if want is True:
            return row is not None
        return row is not None and row[0] == want

    def run(self):
        conn, steps = None, self.steps()
        step, sql, check = next(steps)
        try:
            while not self.stop_ev.wait(self.interval):
                lo, inside = None, None
                try:
                    conn = conn or connect()
                    lo = self.lsn(conn)
                    conn.execute("SET lock_timeout = '5s'")
                    with conn.transaction():
                        conn.execute(sql)
                        inside = self.lsn(conn)
                    self.log.append((inside, inside, step))
                    step, sql, check = next(steps)
                except psycopg.errors.LockNotAvailable:
                    continue  # busy: try the same step again
                except (psycopg.OperationalError, psycopg.errors.AdminShutdown, psycopg.InterfaceError):
                    try:
                        conn and conn.close()
                    except Exception:  # noqa: BLE001 - the server is away
                        pass
                    conn = connect()
                    if lo is not None and self.done(conn, check):
                        hi = self.lsn(conn)
                        self.log.append((inside, inside, step) if inside else (lo, hi, step))
                        step, sql, check = next(steps)
                    continue
                if len(self.log) % 4 != 1:
                    continue
                try:
                    conn.execute("ALTER TABLE chaos_b ALTER COLUMN val TYPE smallint")
                    self.accepted += 1
                except psycopg.errors.ObjectNotInPrerequisiteState:
                    self.refused += 1
                except psycopg.Error:
                    pass  # a fault in between: tried again next time
        except Exception as e:  # noqa: BLE001 - reported by the run
            self.error = repr(e)


def columns_at(ddl_log, commit_lsn):
    """chaos_a's columns for a transaction committed at `commit_lsn`, by the DDL log: (exact,
    uncertain) where uncertain is the other possible set when a DDL's position is a window holding it."""
    cols, uncertain = list(BASE_COLUMNS), None
    for lo, hi, step in ddl_log:
        before = list(cols)
        if lo <= commit_lsn <= hi and lo != hi:
            uncertain = before
        if commit_lsn > lo:
            cols = apply_step(cols, step)
        else:
            break
    return cols, uncertain


def apply_step(cols, step):
    kind = step[0]
    if kind == "add":
        return cols + [step[1]]
    if kind == "rename":
        return [step[2] if c == step[1] else c for c in cols]
    if kind == "drop":
        return [c for c in cols if c != step[1]]
    return cols


def fold_through(image, ddl_log, commit_lsn):
    """A chaos_a row image as the table shows it after every DDL past `commit_lsn`: an added column
    reads its default, a renamed one its new name, a dropped one is gone."""
    image = dict(image)
    for _, hi, step in ddl_log:
        # Each step is idempotent (a default set once, a rename of a name that is there, a drop),
        # so a DDL whose position is a window around the event applies either way.
        if hi < commit_lsn:
            continue
        kind = step[0]
        if kind == "add":
            image.setdefault(step[1], step[2])
        elif kind == "rename" and step[1] in image:
            image[step[2]] = image.pop(step[1])
        elif kind == "drop":
            image.pop(step[1], None)
    return image


class Faults:
    KINDS = ("terminate", "sigkill", "pg_immediate", "broker_restart", "broker_outage", "failpoint", "zombie")
    # The faults of a sink that has no broker.
    TABLE_KINDS = ("terminate", "sigkill", "pg_immediate", "failpoint")
    # With --snapshot-rows: cdc_snapshot of chaos_a while everything else goes on.
    SNAPSHOT_KINDS = ("snapshot",)
    # With --shared-decoding: pg_terminate_backend of the decoder every sink reads.
    SHARED_KINDS = ("decoder_terminate",)

    def __init__(self, rng, txn_id, topic, sink, no_dedup):
        self.rng, self.txn_id, self.topic, self.sink, self.no_dedup = rng, txn_id, topic, sink, no_dedup
        self.count = collections.Counter()
        self.nudges = 0  # transactions the failpoint wrote itself (writer 0)

    def inject(self, kind):
        log(f"fault: {kind}")
        if kind == "terminate":
            with connect() as c:
                c.execute("SELECT pg_terminate_backend(%s)", (self.wait_worker(),))
        elif kind == "decoder_terminate":
            with connect() as c:
                c.execute("SELECT pg_terminate_backend(%s)", (wait_for_pid(decoder_pid, "pg_cdc decoder"),))
        elif kind == "sigkill":
            os.kill(self.wait_worker(), 9)  # PostgreSQL crash-restarts every backend
            time.sleep(2)
        elif kind == "pg_immediate":
            sh("scripts/pg.sh", "crash")
        elif kind == "broker_restart":
            sh("scripts/kafka.sh", "kill")
            time.sleep(self.rng.uniform(1, 5))
            sh("scripts/kafka.sh", "start")
        elif kind == "broker_outage":
            # Longer than the broker's transaction timeout (transaction.timeout.ms, 60 s by default):
            # the producer's open transaction cannot survive it.
            sh("scripts/kafka.sh", "kill")
            time.sleep(65)
            sh("scripts/kafka.sh", "start")
        elif kind == "failpoint":
            # Fires at the worker's next Kafka commit. Right after a broker fault that commit can be
            # a minute away (the producer's commit timeout, then a fresh producer), so wait longer;
            # and when the writers are done there is nothing to commit: write one transaction of
            # our own (writer 0, gap-free like the others, checked by the oracle the same way).
            with connect() as c:
                self.wait_worker()
                logged = os.path.getsize(SERVER_LOG)
                c.execute(f"ALTER SYSTEM SET cdc.test_failpoint = 'after_sink_commit:{self.sink}'")
                c.execute("SELECT pg_reload_conf()")
                deadline, nudge_at = time.time() + 180, time.time() + 30
                fired = False
                while time.time() < deadline and not fired:
                    # The worker logs its exit at the failpoint. (Read from the log: each new worker
                    # may fire it again before the RESET below reaches it, and be gone within
                    # milliseconds; a table sink commits that quickly.)
                    fired = failpoint_logged(self.sink, logged)
                    if time.time() > nudge_at:
                        self.nudges += 1
                        c.execute("INSERT INTO chaos_txn VALUES (0, %s)", (self.nudges,))
                        nudge_at = time.time() + 30
                    time.sleep(0.1)
                c.execute("ALTER SYSTEM RESET cdc.test_failpoint")
                c.execute("SELECT pg_reload_conf()")
                if not fired:
                    log("failpoint did not fire within 180 s (the worker committed nothing); not counted")
                    return
        elif kind == "snapshot":
            with connect() as c:
                c.execute("SELECT cdc_snapshot('chaos_a', %s)", (self.sink,))
        elif kind == "zombie":
            # The worker may be opening its producer at this moment (a fault before this one
            # restarted it): its init_transactions can fence the zombie's own before the zombie
            # wrote anything. That zombie fenced nobody; a new one tries again.
            for attempt in range(5):
                z = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": self.txn_id})
                try:
                    z.init_transactions(30)
                    z.begin_transaction()
                except KafkaException as e:
                    if e.args[0].code() != KafkaError._FENCED:
                        raise
                    log(f"zombie fenced by the worker before it wrote (attempt {attempt + 1}); again")
                    time.sleep(1)
                    continue
                z.produce(self.topic, key=b'{"zombie":1}', value=b'{"zombie":true}')
                z.flush(10)
                # left open: the worker must fence it back; its record must never become visible
                break
            else:
                log("zombie fenced by the worker 5 times before it wrote; not counted")
                return
        self.count[kind] += 1
        self.wait_worker()

    def wait_worker(self):
        return wait_for_pid(lambda c: worker_pid(c, self.sink), f"pg_cdc worker of {self.sink}")


SERVER_LOG = os.path.join(os.environ.get("PG_CDC_RUN", "/var/tmp/pg_cdc"),
                          f"postgresql-{os.environ.get('PGPORT', '55432')}.log")


def failpoint_logged(sink, since):
    """Whether a worker exited at the after_sink_commit failpoint of `sink` (server log from byte `since`)."""
    with open(SERVER_LOG, "rb") as f:
        f.seek(since)
        return f'failpoint after_sink_commit of sink "{sink}": exiting'.encode() in f.read()


def dedup_logged(sink, since):
    """Events the worker reported skipping (already in Kafka), from the server log since `since`."""
    total, marker = 0, f'pg_cdc sink "{sink}": skipped '
    with open(SERVER_LOG, errors="replace") as f:
        for line in f:
            if marker in line and line[:19] >= since:
                total += int(line.split(marker, 1)[1].split()[0])
    return total


def snapshots_open(sink):
    """How many of the sink's snapshots are pending or running (None: the server is away)."""
    try:
        with connect(retries=1) as c:
            return c.execute("SELECT count(*) FROM _cdc_snapshots s JOIN _cdc_sinks k USING (sink_id) "
                             "WHERE k.sink_name = %s AND s.state IN ('pending', 'running')", (sink,)).fetchone()[0]
    except Exception:  # noqa: BLE001 - the server is restarting
        return None


def read_topic(topic, idle=8.0, limit=600.0):
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"chaos-oracle-{time.time()}",
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed", "enable.auto.commit": False})
    c.subscribe([topic])
    out, last, start = [], time.time(), time.time()
    while time.time() - last < idle and time.time() - start < limit:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        out.append((m.key(), m.value()))
        last = time.time()
    c.close()
    return out


def read_table(table):
    """The events of an in-database sink, in event_id order, as (key, value) bytes."""
    with connect() as c:
        rows = c.execute(f"SELECT event_key::text, event::text FROM {table} ORDER BY event_id").fetchall()
    return [(k.encode() if k is not None else None, v.encode()) for k, v in rows]


def norm_key(key):
    """A message key as canonical JSON (a Kafka key keeps the encoder's field order, jsonb its own)."""
    return json.dumps(json.loads(key), sort_keys=True, separators=(",", ":")).encode() if key else key


def oracle(records, conn, ddl_log=None):
    ddl_log = sorted(ddl_log or [], key=lambda e: e[0])
    schema_checked, schema_mismatched, reads_of_version_before = 0, 0, 0
    seen, dups, foreign = set(), 0, 0
    reads = collections.Counter()
    per_txn = collections.defaultdict(list)
    state = {}
    events = []
    for key, value in records:
        ev = json.loads(value)
        md = ev.get("metadata")
        if md is None:
            foreign += 1  # e.g. a zombie record: must never be visible
            continue
        key = norm_key(key)
        ident = (md["commit_lsn"], md["lsn"], md["table"], key)
        if ident in seen:
            dups += 1
            continue
        seen.add(ident)
        if md["operation"] == "READ":
            reads[(md["table"], key)] += 1
        per_txn[md["commit_lsn"]].append(md["transaction"]["event_count"])
        if ddl_log and md["table"] == "chaos_a" and ev["after"] is not None:
            # The columns of its version, by the DDL log (not by pg_cdc's history).
            want, maybe = columns_at(ddl_log, md["commit_lsn"])
            # As sets: the in-database sink keeps events as jsonb, whose keys come out sorted.
            got, want = sorted(ev["after"]), sorted(want)
            maybe = sorted(maybe) if maybe is not None else None
            schema_checked += 1
            fold_from = md["commit_lsn"]
            if got != want and got != maybe:
                last = max((lo for lo, _, _ in ddl_log if lo < md["commit_lsn"]), default=None)
                earlier = sorted(columns_at(ddl_log, last - 1)[0]) if last is not None else None
                if md["operation"] == "READ" and got == earlier:
                    reads_of_version_before += 1
                    fold_from = last  # its chunk was read before that DDL: fold through it too
                else:
                    schema_mismatched += 1
                    if schema_mismatched <= 5:
                        log(f"event of chaos_a at {md['commit_lsn']}/{md['lsn']} has columns {got}, its version {want}")
            ev["after"] = fold_through(ev["after"], ddl_log, fold_from)
        events.append((md["commit_lsn"], md["lsn"], md["table"], key, ev))
    torn = sum(1 for counts in per_txn.values() if len(counts) != counts[0])
    events.sort(key=lambda e: (e[0], e[1]))
    for _, _, table, key, ev in events:  # apply_cdc: later versions win, deletes are tombstones
        if ev["metadata"]["operation"] == "DELETE":
            state[(table, key)] = None
        elif ev["after"] is not None:
            state[(table, key)] = ev["after"]
    folded = {t: {} for t in TABLES}
    for (table, key), row in state.items():
        if row is not None:
            folded[table][key] = row
    mismatched = 0
    aborted_visible = 0
    for t in TABLES:
        rows = conn.execute(f"SELECT to_jsonb(x) FROM {t} x").fetchall()
        src = {norm_key(json.dumps({k: r[0][k] for k in (["writer", "seq"] if t == "chaos_txn" else ["id"])})): r[0]
               for r in rows}
        got = folded[t]
        wrong = [k for k in src if got.get(k) != src[k]] + [k for k in got if k not in src]
        mismatched += len(wrong)
        for k in wrong[:5]:  # what went wrong, for whoever reads the log
            history = [(e[0], e[1], e[4]["metadata"]["operation"], e[4]["after"]) for e in events
                       if e[2].endswith(t) and e[3] == k]
            log(f"wrong row {t} {k}: table {src.get(k)}, events {history}")
        aborted_visible += sum(1 for row in got.values() if str(row.get("id", "")).startswith("aborted"))
    gaps = 0
    by_writer = collections.defaultdict(set)
    for row in folded["chaos_txn"].values():
        by_writer[row["writer"]].add(row["seq"])
    for seqs in by_writer.values():
        gaps += max(seqs) - len(seqs) if seqs else 0
    # chaos_b is snapshotted once (the initial snapshot): a row read twice was delivered twice.
    repeated = sum(n - 1 for (table, _), n in reads.items() if table.endswith("chaos_b") and n > 1)
    return {"events_read": len(records), "unique_events": len(events), "duplicated": dups, "torn": torn,
            "snapshot_reads": sum(reads.values()), "snapshot_reads_repeated": repeated,
            "lost_or_wrong_rows": mismatched, "aborted_visible": aborted_visible + foreign, "writer_gaps": gaps,
            "transactions_seen": len(per_txn), "events_schema_checked": schema_checked,
            "events_with_wrong_columns": schema_mismatched, "snapshot_reads_of_the_version_before": reads_of_version_before}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--transactions", type=int, default=2000)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--min-faults", type=int, default=2, help="at least this many of every fault kind")
    p.add_argument("--fault-count", action="append", default=[], metavar="KIND=N",
                   help="a different count for one fault kind (e.g. broker_outage=3: each costs over a minute)")
    p.add_argument("--rate", type=float, default=0, help="transactions per second, all writers together "
                   "(0: unthrottled); keeps writes flowing while the faults happen")
    p.add_argument("--control-no-dedup", action="store_true", help="turn dedup off: the run must fail")
    p.add_argument("--control-no-window", action="store_true", help="with --snapshot-rows: keep every row of a "
                   "chunk, also those changed while it was in flight (no faults); the oracle must see stale rows")
    p.add_argument("--sink", choices=("kafka", "table"), default="kafka", help="the sink type under test")
    p.add_argument("--snapshot-rows", type=int, default=0, help="rows in chaos_a and chaos_b before the sink is "
                   "added: the run covers its initial snapshot, and a snapshot fault (cdc_snapshot) too")
    p.add_argument("--snapshot-chunk", type=int, default=100, help="the sink's snapshot_chunk_size")
    p.add_argument("--ddl", type=float, default=0, metavar="SECONDS", help="alter chaos_a every SECONDS while "
                   "the writers run (ADD, RENAME, TYPE, DROP COLUMN), and try a change chaos_b's enforced mode refuses")
    p.add_argument("--control-ddl-unlogged", action="store_true", help="with --ddl: the oracle forgets the "
                   "renames it made (no faults); it must see events whose columns are not their version's")
    p.add_argument("--shared-decoding", action="store_true", help="cdc.shared_decoding on, with a second Kafka "
                   "sink on the same tables reading the same decoding (checked by the oracle too); every fault "
                   "lands while both read the shared log, and the decoder is terminated too (decoder_terminate)")
    p.add_argument("--out", help="write the figures to this JSON file")
    a = p.parse_args()
    if a.control_no_window and not a.snapshot_rows:
        p.error("--control-no-window needs --snapshot-rows")
    if a.control_ddl_unlogged and not a.ddl:
        p.error("--control-ddl-unlogged needs --ddl")
    rng = random.Random(a.seed)
    tag = f"{a.seed}-{int(time.time())}"
    topic, txn_id, sink = f"chaos-{tag}", f"chaos-{tag}", f"chaos_{a.sink}_{a.seed}"
    conn = connect()
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cdc")
    conn.execute("SELECT cdc_drop_sink(sink_name) FROM _cdc_sinks WHERE sink_name = %s", (sink,))
    # Another sink (make demo's) would capture the chaos tables too and share the worker's time.
    others = [r[0] for r in conn.execute("SELECT sink_name FROM _cdc_sinks ORDER BY 1").fetchall()]
    if others:
        raise SystemExit(f"chaos: other sinks are running and would capture the chaos tables too: {', '.join(others)}; "
                         "drop them first (SELECT cdc_drop_sink(sink_name) FROM _cdc_sinks;)")
    capture_off(conn)
    for t in TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {t}")
    conn.execute("CREATE TABLE chaos_a (id text PRIMARY KEY, writer int, seq int, val int)")
    conn.execute("CREATE TABLE chaos_b (id text PRIMARY KEY, writer int, seq int, val int)")
    conn.execute("CREATE TABLE chaos_txn (writer int, seq int, PRIMARY KEY (writer, seq))")
    for t in ("chaos_a", "chaos_b"):
        conn.execute(f"INSERT INTO {t} SELECT 'pre-' || lpad(g::text, 7, '0'), 0, g, 0 "
                     "FROM generate_series(1, %s) g", (a.snapshot_rows,))
    for t in TABLES:
        cfg = {"include_transaction_info": True}
        if t == "chaos_b" and a.ddl:
            cfg["schema_evolution"] = {"compatibility_mode": "backward", "enforce": True}
        conn.execute("SELECT cdc_enable(%s, %s::jsonb)", (t, json.dumps(cfg)))
    log_since = conn.execute("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')").fetchone()[0]
    conn.execute("ALTER SYSTEM SET cdc.heartbeat_interval_ms = 1000")
    conn.execute("ALTER SYSTEM SET cdc.test_skip_dedup = %s" % ("on" if a.control_no_dedup else "off"))
    conn.execute("ALTER SYSTEM SET cdc.test_skip_snapshot_window = %s" % ("on" if a.control_no_window else "off"))
    conn.execute("ALTER SYSTEM SET cdc.shared_decoding = %s" % ("on" if a.shared_decoding else "off"))
    conn.execute("SELECT pg_reload_conf()")
    try:
        run(a, rng, conn, topic, txn_id, sink, log_since)
    finally:
        with connect() as c:
            # The tables stay, to look into: a later test or benchmark whose sink names no tables
            # would read the chaos tables' events too.
            capture_off(c)
            for setting in ("cdc.test_skip_dedup", "cdc.test_skip_snapshot_window", "cdc.test_failpoint",
                            "cdc.heartbeat_interval_ms", "cdc.shared_decoding"):
                c.execute(f"ALTER SYSTEM RESET {setting}")
            c.execute("SELECT pg_reload_conf()")


def capture_off(conn):
    """Turns capture off on the chaos tables that have it on."""
    for t in TABLES:
        conn.execute("SELECT cdc_disable(table_name::regclass) FROM _cdc_publications WHERE table_name = %s", (t,))


def fault_counts(a):
    """How many of each fault kind the run must inject: --min-faults, except where --fault-count says."""
    kinds = (Faults.TABLE_KINDS if a.sink == "table" else Faults.KINDS) + (Faults.SNAPSHOT_KINDS if a.snapshot_rows else ()) \
        + (Faults.SHARED_KINDS if a.shared_decoding else ())
    wanted = {k: a.min_faults for k in kinds}
    for spec in a.fault_count:
        kind, _, n = spec.partition("=")
        if kind not in wanted or not n.isdigit():
            sys.exit(f"--fault-count {spec}: expected KIND=N with KIND one of {', '.join(wanted)}")
        wanted[kind] = int(n)
    return wanted


def run(a, rng, conn, topic, txn_id, sink, log_since):
    """Adds the sink, runs the writers and the fault schedule, then checks with the oracle."""
    event_table = f"chaos_events_{a.seed}"
    if a.sink == "table":
        conn.execute(f"DROP TABLE IF EXISTS {event_table}")
        conn.execute("SELECT cdc_add_sink(%s, 'table', %s::jsonb)",
                     (sink, json.dumps({"table": event_table, "tables": list(TABLES),
                                        "snapshot_chunk_size": a.snapshot_chunk})))
    else:
        conn.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)",
                     (sink, json.dumps({"topic": topic, "transactional_id": txn_id, "tables": list(TABLES),
                                        "snapshot_chunk_size": a.snapshot_chunk})))
    # With --shared-decoding: a second sink on the same tables, reading the same decoding.
    neighbour = (f"{sink}_neighbour", f"{topic}-neighbour") if a.shared_decoding else None
    if neighbour:
        conn.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)",
                     (neighbour[0], json.dumps({"topic": neighbour[1], "transactional_id": f"{txn_id}-neighbour",
                                                "tables": list(TABLES), "snapshot_chunk_size": a.snapshot_chunk})))
    conn.close()
    sharing = [sink, neighbour[0]] if neighbour else []

    stop = threading.Event()
    per_writer = a.transactions // a.writers
    interval = a.writers / a.rate if a.rate else 0
    writers = [Writer(i + 1, random.Random(a.seed * 1000 + i), per_writer, stop, interval) for i in range(a.writers)]
    racer_stop = threading.Event()  # the racer goes on until the snapshots are done
    racer = SnapshotWriter(random.Random(a.seed * 1000 - 1), a.snapshot_rows, a.snapshot_chunk, racer_stop)
    if a.snapshot_rows:
        racer.start()
    faults = Faults(rng, txn_id, topic, sink, a.control_no_dedup)
    wanted = fault_counts(a)
    schedule = [k for k in wanted for _ in range(wanted[k])]
    rng.shuffle(schedule)
    if a.control_no_dedup:
        schedule = ["failpoint"] * max(2, a.min_faults)
    if a.control_no_window or a.control_ddl_unlogged:
        schedule = []  # the stale rows (the wrong columns) come from what the control switched off alone
    ddl_stop = threading.Event()
    ddl = DdlRunner(a.ddl, ddl_stop)
    started = time.time()
    for w in writers:
        w.start()
    if a.ddl:
        ddl.start()
    total = per_writer * a.writers
    during_snapshot = 0
    errors_shared = []
    for n, kind in enumerate(schedule):
        # Spread the faults over the run, by progress of the writers.
        goal = total * (n + 1) / (len(schedule) + 1)
        while sum(w.seq for w in writers) < goal and any(w.is_alive() for w in writers):
            time.sleep(0.2)
        time.sleep(rng.uniform(0, 1.5))
        # Every fault lands while the sinks read the shared log (they join again after each).
        deadline = time.time() + 60
        while sharing and not all(reads_shared_log(x) for x in sharing) and time.time() < deadline:
            time.sleep(0.5)
        if sharing and not all(reads_shared_log(x) for x in sharing):
            errors_shared.append(f"before fault {n + 1} ({kind}): a sink did not read the shared log within 60 s")
        before = faults.count[kind]
        snapshotting = bool(snapshots_open(sink))
        for _ in range(3):  # a failpoint that did not fire is tried again while writes flow
            faults.inject(kind)
            if faults.count[kind] > before or not any(w.is_alive() for w in writers):
                break
        during_snapshot += snapshotting and faults.count[kind] > before and kind != "snapshot"
    stop.set()
    for w in writers:
        w.join()
    ddl_stop.set()
    if a.ddl:
        ddl.join()
    errors = [w.error for w in writers if w.error] + ([ddl.error] if ddl.error else []) + errors_shared
    if a.ddl and (len(ddl.log) < 4 or ddl.refused == 0 or ddl.accepted):
        errors.append(f"DDL: {len(ddl.log)} committed (4 wanted), enforced change refused {ddl.refused} times "
                      f"and let through {ddl.accepted} times (0 wanted)")
    log(f"writers done: {sum(w.seq for w in writers)} transactions in {time.time() - started:.0f}s")

    with connect() as c:
        deadline = time.time() + 300
        while a.snapshot_rows and snapshots_open(sink) != 0 and time.time() < deadline:
            time.sleep(1)
        if a.snapshot_rows and snapshots_open(sink) != 0:
            errors.append("the snapshots did not finish within 300 s after the writers")
        racer_stop.set()
        if racer.is_alive():
            racer.join()
        end = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        for s in [sink] + ([neighbour[0]] if neighbour else []):
            deadline = time.time() + 300
            while time.time() < deadline:
                ok = c.execute("SELECT s.confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots s JOIN _cdc_sinks k "
                               "ON k.slot_name = s.slot_name WHERE k.sink_name = %s", (end, s)).fetchone()
                if ok and ok[0]:
                    break
                time.sleep(1)
            else:
                errors.append(f"sink {s} did not catch up within 300 s")
        records = read_table(event_table) if a.sink == "table" else read_topic(topic)
        ddl_log = [e for e in ddl.log if not (a.control_ddl_unlogged and e[2][0] == "rename")]
        result = oracle(records, c, ddl_log if a.ddl else None)
        if neighbour:
            result["neighbour"] = oracle(read_topic(neighbour[1]), c, ddl_log if a.ddl else None)
            n_state = c.execute("SELECT state FROM _cdc_sinks WHERE sink_name = %s", (neighbour[0],)).fetchone()
            n_slot = c.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (neighbour[0],)).fetchone()[0]
            c.execute("SELECT cdc_drop_sink(%s)", (neighbour[0],))
            result["neighbour"]["sink_state"] = n_state[0] if n_state else None
        state = c.execute("SELECT state, last_error FROM _cdc_sinks WHERE sink_name = %s", (sink,)).fetchone()
        slot = c.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (sink,)).fetchone()[0]
        c.execute("SELECT cdc_drop_sink(%s)", (sink,))
        c.execute(f"DROP TABLE IF EXISTS {event_table}")
    # The run's topics go: the broker every run shares stays small, and its restarts quick.
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    topics = [topic, "pg_cdc.progress." + slot.removeprefix("_cdc_")]
    if neighbour:
        topics += [neighbour[1], "pg_cdc.progress." + n_slot.removeprefix("_cdc_")]
    for f in admin.delete_topics(topics, operation_timeout=10).values():
        try:
            f.result(15)
        except Exception:  # noqa: BLE001 - best effort
            pass
    result.update({
        "sink": a.sink, "seed": a.seed, "transactions": sum(w.seq for w in writers), "aborted_transactions": sum(w.aborted for w in writers),
        "commits_resolved_by_reading_back": sum(w.unknown_resolved for w in writers),
        "faults": dict(faults.count), "failpoint_nudges": faults.nudges,
        "seconds": round(time.time() - started), "dedup": not a.control_no_dedup,
        "snapshot_rows": a.snapshot_rows, "faults_during_snapshot": during_snapshot,
        "shared_decoding": a.shared_decoding,
        "snapshot_rows_changed_by_racer": racer.changed,
        "sink_state": state[0] if state else None, "errors": errors,
        "ddl_committed": len(ddl.log), "ddl_positions_uncertain": sum(1 for lo, hi, _ in ddl.log if lo != hi),
        "enforced_ddl_refused": ddl.refused,
        "duplicate_events_skipped_by_worker": dedup_logged(sink, log_since),
    })
    print(json.dumps(result, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    def failed(r):
        return r["duplicated"] or r["torn"] or r["lost_or_wrong_rows"] or r["aborted_visible"] \
            or r["writer_gaps"] or r["snapshot_reads_repeated"] or r["events_with_wrong_columns"]
    bad = failed(result) or (neighbour and failed(result["neighbour"])) or errors
    # A control must go red: the figure the switched-off protection guards must be above zero.
    control = ("duplicated", "dedup off", "duplicates") if a.control_no_dedup else \
        ("lost_or_wrong_rows", "no snapshot window", "wrong rows") if a.control_no_window else \
        ("events_with_wrong_columns", "the renames left out of the oracle's DDL log", "events with the wrong columns") \
        if a.control_ddl_unlogged else None
    if control:
        figure, off, what = control
        if result[figure] == 0:
            log(f"CONTROL FAILED: {off}, yet the oracle saw no {what}")
            sys.exit(1)
        log(f"control ok: with {off} the oracle saw {result[figure]} {what}")
        log("1 passed, 0 failed")
        return
    if bad:
        log("FAILED")
        sys.exit(1)
    if a.snapshot_rows and (result["snapshot_reads"] == 0 or during_snapshot < a.min_faults):
        log(f"FAILED: {result['snapshot_reads']} READ events, {during_snapshot} faults while a snapshot was under way "
            f"(at least {a.min_faults} wanted: more --snapshot-rows, or a smaller --snapshot-chunk)")
        sys.exit(1)
    short = {k: f"{faults.count[k]} of {n}" for k, n in wanted.items() if faults.count[k] < n}
    if short:
        log(f"FAILED: fault kinds that happened fewer times than asked: {short}")
        sys.exit(1)
    if faults.count["failpoint"] and not result["duplicate_events_skipped_by_worker"]:
        log("FAILED: the failpoint fired but the worker reported no skipped duplicates")
        sys.exit(1)
    log("1 passed, 0 failed")


if __name__ == "__main__":
    main()
