#!/usr/bin/env python3
"""Failover with real servers, on the PostgreSQL that PG_BIN names (`make failover-pg18` on 18, `make failover`
on 15).

On PostgreSQL 15 and 16 a standby keeps no logical slot: the run (slots_do_not_follow) promotes a standby and
checks that the sink stops in error naming its slot, then follows the steps the error gives. From 17 on:

Three clusters of the PostgreSQL that PG_BIN names, on this machine: a primary (a), a physical standby
made with pg_basebackup (b), and later a standby of b (c). Each standby syncs the primary's failover slots
(sync_replication_slots), and each primary names its standby's slot in synchronized_standby_slots. Writers
commit transactions all along; three sinks deliver them: exactly-once Kafka, at-least-once Kafka and the
in-database table sink.

  1. Switchover: a is shut down cleanly (its walsenders hand b every record first), b is promoted and
     becomes the primary; the writers go on against b.
  2. A standby down, then the primary killed: c (b's standby) is stopped for a while, during which b's
     transactions reach no standby, so pg_cdc must publish none of them; then b is killed (immediate) and c,
     started again, is promoted. What b committed that c never received is lost with b.

The oracle reads every sink's output back (Kafka with a read_committed consumer, the table sink's events
table on the last primary) and checks it against the last primary's table: nothing lost, nothing doubled
(exactly-once sinks and the table sink), per-key order kept, nothing aborted visible, and none of the
transactions the promotion lost published anywhere. Those lost transactions are counted and named.

--control-no-standby-wait runs the same with cdc.test_ignore_standby_slots on (the read bound of
synchronized_standby_slots switched off): the control must see lost transactions published, or it fails.
"""
import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "chaos"), os.path.join(HERE, "..", "e2e")]
import chaos  # noqa: E402 - the chaos run's Kafka reader
from conftest import wait_for  # noqa: E402 - the end-to-end tests' polling wait

PG_BIN = os.environ["PG_BIN"]
RUN = os.path.join(os.environ.get("PG_CDC_RUN", "/var/tmp/pg_cdc"), "failover")
BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
# Below Linux's ephemeral range (32768-60999): a client connection (a Kafka consumer's) may hold a port
# of that range for a moment, and a server cannot start on it then.
PORTS = {"a": 25420, "b": 25421, "c": 25422}
TABLE = "fo_rows"
EVENTS = "fo_events"


def log(msg):
    print(f"[failover {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def as_pg(*args, check=True):
    return subprocess.run(["runuser", "-u", "postgres", "--", *args], check=check,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


class Server:
    def __init__(self, name):
        self.name, self.port = name, PORTS[name]
        self.data = os.path.join(RUN, name)
        self.log = os.path.join(RUN, f"{name}.log")

    def dsn(self):
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def connect(self):
        return psycopg.connect(self.dsn(), autocommit=True, connect_timeout=3)

    def query(self, sql, params=()):
        with self.connect() as c:
            return c.execute(sql, params).fetchall()

    failover_slots = True  # PostgreSQL 17+ (main sets it)

    def write_conf(self, *, sync_standby=None, upstream=None, extra=None):
        """This server's settings, in failover.conf (included by postgresql.conf, rewritten at each role
        change: a base backup copies its primary's)."""
        lines = [
            f"port = {self.port}", "listen_addresses = '127.0.0.1'", f"unix_socket_directories = '{RUN}'",
            "wal_level = logical", "shared_preload_libraries = 'pg_cdc'", "max_replication_slots = 20",
            "max_wal_senders = 10", "max_worker_processes = 32", "hot_standby = on", "hot_standby_feedback = on",
            "cdc.database = 'postgres'", f"cdc.kafka_bootstrap_servers = '{BOOTSTRAP}'",
            "log_min_messages = warning", "log_line_prefix = '%m [%p] %b '", "wal_receiver_status_interval = 1",
        ]
        if Server.failover_slots:
            lines.append("sync_replication_slots = on")
        if sync_standby:
            lines.append(f"synchronized_standby_slots = '{sync_standby}'")
        if upstream:
            primary, slot = upstream
            lines.append(f"primary_conninfo = '{primary.dsn()} application_name={self.name}'")
            lines.append(f"primary_slot_name = '{slot}'")
        lines += extra or []
        path = os.path.join(self.data, "failover.conf")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        shutil.chown(path, "postgres", "postgres")
        conf = os.path.join(self.data, "postgresql.conf")
        with open(conf) as f:
            has = "include_if_exists = 'failover.conf'" in f.read()
        if not has:
            with open(conf, "a") as f:
                f.write("include_if_exists = 'failover.conf'\n")

    def initdb(self):
        os.makedirs(self.data)
        shutil.chown(self.data, "postgres", "postgres")
        os.chmod(self.data, 0o700)
        as_pg(f"{PG_BIN}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8")

    def base_backup(self, primary, slot):
        as_pg(f"{PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
              "-D", self.data, "-X", "stream", "-S", slot)
        open(os.path.join(self.data, "standby.signal"), "w").close()
        shutil.chown(os.path.join(self.data, "standby.signal"), "postgres", "postgres")

    def start(self):
        r = as_pg(f"{PG_BIN}/pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "start", check=False)
        if r.returncode != 0:
            raise SystemExit(f"failover: server {self.name} did not start: {r.stderr}\n{tail(self.log)}")

    def stop(self, mode="fast"):
        as_pg(f"{PG_BIN}/pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop", check=False)

    def reload(self):
        as_pg(f"{PG_BIN}/pg_ctl", "-D", self.data, "reload")

    def promote(self):
        as_pg(f"{PG_BIN}/pg_ctl", "-D", self.data, "-w", "-t", "60", "promote")


def tail(path, n=30):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class Cluster:
    """Which server is the primary now (the writers follow it)."""

    def __init__(self, primary):
        self.primary = primary

    def switch_to(self, new, extra=None):
        """Promotes the standby `new` and makes it the primary the writers use; its settings become a
        primary's (no upstream), with `extra`."""
        new.promote()
        new.write_conf(extra=extra)
        new.reload()
        self.primary = new


class Writer(threading.Thread):
    """Commits transactions: each inserts row (writer, seq) and bumps `touched` of an older row of the
    writer; one in ten is rolled back first (its row must never be seen). A commit whose outcome the
    connection lost is looked up on the primary that comes next."""

    def __init__(self, wid, cluster, stop, interval, seed):
        super().__init__(daemon=True)
        self.wid, self.cluster, self.stop_ev, self.interval = wid, cluster, stop, interval
        self.rng = random.Random(seed)
        self.seq = 0
        self.acked = {}  # seq -> the phase it was acknowledged in
        self.phase = "before"
        self.error = None

    def row_id(self, seq):
        return self.wid * 10_000_000 + seq

    def connect(self):
        while not self.stop_ev.is_set():
            try:
                conn = self.cluster.primary.connect()
                if not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
                    return conn
                conn.close()
            except psycopg.OperationalError:
                pass
            time.sleep(0.2)
        return None

    def run(self):
        conn = self.connect()
        try:
            while conn is not None and not self.stop_ev.is_set():
                time.sleep(self.interval)
                seq = self.seq + 1
                try:
                    if self.rng.random() < 0.1:
                        try:
                            with conn.transaction():
                                conn.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, %s, -1)", (-self.row_id(seq), self.wid, seq))
                                raise ValueError("rollback")
                        except ValueError:
                            pass
                    with conn.transaction():
                        conn.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, %s, 0)", (self.row_id(seq), self.wid, seq))
                        if seq > 1:
                            old = self.rng.randint(max(1, seq - 20), seq - 1)
                            conn.execute(f"UPDATE {TABLE} SET touched = %s WHERE id = %s", (seq, self.row_id(old)))
                    self.seq = seq
                    self.acked[seq] = self.phase
                except (psycopg.OperationalError, psycopg.errors.AdminShutdown, psycopg.InterfaceError,
                        psycopg.errors.ReadOnlySqlTransaction):
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001 - the connection is gone either way
                        pass
                    conn = self.connect()
                    if conn is not None and conn.execute(f"SELECT 1 FROM {TABLE} WHERE id = %s",
                                                         (self.row_id(seq),)).fetchone():
                        self.seq = seq
                        self.acked[seq] = self.phase
        except Exception as e:  # noqa: BLE001 - reported by the run
            self.error = repr(e)


def sink_slots(server):
    return {r[0] for r in server.query("SELECT slot_name FROM _cdc_sinks")}


def synced_on(standby, slots):
    """Whether the standby holds a persistent synced copy of every one of `slots`."""
    rows = standby.query("SELECT slot_name FROM pg_replication_slots WHERE synced AND NOT temporary")
    return slots <= {r[0] for r in rows}


def streaming(primary, standby_name):
    return primary.query("SELECT 1 FROM pg_stat_replication WHERE application_name = %s AND state = 'streaming'",
                         (standby_name,))


def read_topic(topic):
    """The values of every message of `topic` (read_committed), in arrival order (the chaos run's reader)."""
    return [value for _, value in chaos.read_topic(topic)]


def lsn(value):
    """An event's LSN (a number; the text form 'X/Y' too)."""
    if isinstance(value, int):
        return value
    hi, lo = value.split("/")
    return int(hi, 16) << 32 | int(lo, 16)


def oracle(values, source_rows, lost_ids):
    """Checks one sink's events (in arrival order) against the last primary's rows."""
    seen, dups, events = set(), 0, []
    last_commit = {}
    order_violations = 0
    aborted = 0
    lost_published = set()
    for value in values:
        ev = json.loads(value)
        md = ev["metadata"]
        ident = (md["commit_lsn"], md["lsn"])
        if ident in seen:
            dups += 1
            continue
        seen.add(ident)
        row = ev["after"] or ev["before"]
        rid = row["id"]
        if rid < 0:
            aborted += 1
        if rid in lost_ids:
            lost_published.add(rid)
        # Per key, the events' commits in arrival order must not go back.
        commit = lsn(md["commit_lsn"])
        if commit < last_commit.get(rid, -1):
            order_violations += 1
        last_commit[rid] = commit
        events.append((commit, lsn(md["lsn"]), rid, md["operation"], ev["after"]))
    state = {}
    for _, _, rid, op, after in sorted(events, key=lambda e: (e[0], e[1])):
        state[rid] = None if op == "DELETE" else after
    folded = {rid: row for rid, row in state.items() if row is not None}
    wrong = [rid for rid, row in source_rows.items() if folded.get(rid) != row]
    extra = [rid for rid in folded if rid not in source_rows]
    return {"events_read": len(values), "unique_events": len(events), "duplicated": dups,
            "lost_or_wrong_rows": len(wrong), "rows_not_on_the_last_primary": len(extra),
            "aborted_visible": aborted, "per_key_order_violations": order_violations,
            "lost_transactions_published": len(lost_published), "examples_wrong": wrong[:5], "examples_extra": extra[:5]}


def primary_and_standby(extra):
    """Server a, a primary with the captured table, and server b, its physical standby streaming through
    slot standby_b, which a names in synchronized_standby_slots where PostgreSQL has failover slots."""
    sa, sb = Server("a"), Server("b")
    sa.initdb()
    sa.write_conf(sync_standby="standby_b" if Server.failover_slots else None, extra=extra)
    sa.start()
    with sa.connect() as c:
        c.execute("CREATE EXTENSION pg_cdc")
        c.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, writer int, seq int, touched int)")
        c.execute("SELECT cdc_enable(%s)", (TABLE,))
        c.execute("SELECT pg_create_physical_replication_slot('standby_b', true)")
    sb.base_backup(sa, "standby_b")
    sb.write_conf(upstream=(sa, "standby_b"), extra=extra)
    sb.start()
    wait_for(lambda: streaming(sa, "b"), 60, "b streaming from a")
    return sa, sb


def start_writers(a, cluster):
    """The writers, started against the cluster's primary; the event that stops them."""
    stop = threading.Event()
    writers = [Writer(i + 1, cluster, stop, a.writers / a.rate, a.seed * 100 + i) for i in range(a.writers)]
    for w in writers:
        w.start()
    return stop, writers


def slots_do_not_follow(a, version, run_id):
    """PostgreSQL 15 and 16: a standby keeps no logical slot, so after a promotion every sink's slot is
    missing. Each sink must stop in `error` naming its slot, the cause and the steps; the steps (drop the
    sink, add it again with the same config) must then deliver every row of the promoted server."""
    sa, sb = primary_and_standby([])
    topic = f"failover-old-{run_id}"
    config = {"topic": topic, "tables": [TABLE]}
    with sa.connect() as c:
        c.execute("SELECT cdc_add_sink('fo_eo', 'kafka', %s::jsonb)", (json.dumps(config),))
    cluster = Cluster(sa)
    stop, writers = start_writers(a, cluster)
    time.sleep(a.seconds)
    slot = sa.query("SELECT slot_name FROM _cdc_sinks WHERE sink_name = 'fo_eo'")[0][0]
    log("switchover: a shut down (fast), b promoted")
    sa.stop("fast")
    cluster.switch_to(sb)
    time.sleep(a.seconds / 2)
    stop.set()
    for w in writers:
        w.join(timeout=30)
    failures = []
    state = wait_for(lambda: (r := sb.query("SELECT state, last_error FROM cdc_status() WHERE sink_name = 'fo_eo'"))
                     and r[0][0] == "error" and r[0], 60, "the sink in error on b")
    log(f"on b the sink is in error: {state[1]}")
    if not (slot in state[1] and "promoted" in state[1] and "cdc_add_sink" in state[1]):
        failures.append(f"the error does not name the slot, the cause and the steps: {state[1]}")
    # The steps it gives: drop the sink, add it again with the same config; its snapshot sends every row.
    with sb.connect() as c:
        c.execute("SELECT cdc_drop_sink('fo_eo')")
        c.execute("SELECT cdc_add_sink('fo_eo', 'kafka', %s::jsonb)", (json.dumps(config),))
    source = {r[0]: r[1] for r in sb.query(f"SELECT id, to_jsonb(t) FROM {TABLE} t")}
    # Delivered: its snapshot done, and its slot (confirmed only once Kafka committed) past the WAL of now.
    # ('running' is no such sign: the sink reaches it while its delivery thread still commits the snapshot.)
    wait_for(lambda: sb.query("SELECT bool_and(state = 'done') FROM cdc_snapshots WHERE sink_name = 'fo_eo'")[0][0],
             120, "the snapshot of the sink added again done")
    end = sb.query("SELECT pg_current_wal_lsn()::text")[0][0]
    wait_for(lambda: sb.query("SELECT r.confirmed_flush_lsn >= %s::pg_lsn FROM _cdc_sinks s "
                              "JOIN pg_replication_slots r USING (slot_name) WHERE s.sink_name = 'fo_eo'",
                              (end,))[0][0], 120, "the sink added again confirmed past the WAL written so far")
    # The snapshot's rows come after what the first sink published: fold everything, the last image wins.
    values = read_topic(topic)
    folded = {}
    for v in values:
        ev = json.loads(v)
        row = ev["after"] or ev["before"]
        folded[row["id"]] = ev["after"]
    wrong = [rid for rid, row in source.items() if folded.get(rid) != row]
    extra = [rid for rid in folded if rid not in source and folded[rid] is not None]
    log(f"after the steps: {len(values)} events, rows on b {len(source)}, missing or wrong {len(wrong)}, extra {len(extra)}")
    if wrong:
        failures.append(f"{len(wrong)} rows of b missing or wrong downstream after the steps (e.g. {wrong[:5]})")
    for s_ in (sa, sb):
        s_.stop("immediate")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"version": version, "run": run_id, "error": state[1], "events": len(values),
                       "rows": len(source), "missing_or_wrong": len(wrong), "extra": len(extra)}, f, indent=2)
    if failures:
        raise SystemExit("failover FAILED: " + "; ".join(failures) + f" (logs in {RUN})")
    shutil.rmtree(RUN, ignore_errors=True)
    log("ok: without failover slots the sink stops in error naming its slot; its steps deliver every row again")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="writing time of each stage")
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--rate", type=float, default=40.0, help="transactions a second, all writers together")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--control-no-standby-wait", action="store_true")
    ap.add_argument("--out", help="write the report (JSON) here")
    a = ap.parse_args()

    version = subprocess.run([f"{PG_BIN}/pg_config", "--version"], capture_output=True, text=True).stdout.strip()
    Server.failover_slots = int(version.split()[1].split(".")[0]) >= 17
    for name in PORTS:
        if os.path.exists(os.path.join(RUN, name, "PG_VERSION")):
            Server(name).stop("immediate")
    shutil.rmtree(RUN, ignore_errors=True)
    os.makedirs(RUN)
    shutil.chown(RUN, "postgres", "postgres")
    run_id = f"{a.seed}-{uuid.uuid4().hex[:8]}"
    control = ["cdc.test_ignore_standby_slots = on"] if a.control_no_standby_wait else []
    log(f"{version}; run {run_id}{' (control: no standby wait)' if control else ''}")
    if not Server.failover_slots:
        return slots_do_not_follow(a, version, run_id)

    sa, sb = primary_and_standby(control)
    sc = Server("c")
    topics = {"eo": f"failover-eo-{run_id}", "alo": f"failover-alo-{run_id}"}
    with sa.connect() as c:
        c.execute("SELECT cdc_add_sink('fo_eo', 'kafka', %s::jsonb)",
                  (json.dumps({"topic": topics["eo"], "tables": [TABLE]}),))
        c.execute("SELECT cdc_add_sink('fo_alo', 'kafka', %s::jsonb)",
                  (json.dumps({"topic": topics["alo"], "tables": [TABLE], "exactly_once": False}),))
        c.execute("SELECT cdc_add_sink('fo_table', 'table', %s::jsonb)",
                  (json.dumps({"table": EVENTS, "tables": [TABLE]}),))
    wait_for(lambda: all(r[0] == "running" for r in sa.query("SELECT state FROM cdc_status()")), 60, "sinks running")
    slots = sink_slots(sa)

    cluster = Cluster(sa)
    stop, writers = start_writers(a, cluster)
    started = time.time()

    def phase(name):
        for w in writers:
            w.phase = name

    # 1. Switchover.
    phase("before the switchover")
    wait_for(lambda: synced_on(sb, slots), 120, "b holding synced copies of the sinks' slots")
    # The readiness check on real servers: every setting and slot as a failover needs, on both.
    for server in (sa, sb):
        bad = server.query("SELECT item, detail FROM cdc_check_failover() WHERE NOT ok")
        if bad:
            raise SystemExit(f"failover: cdc_check_failover() on {server.name} reports {bad}")
    # Nothing of pg_cdc runs on a standby (its launcher starts at the end of recovery); after b's promotion
    # its sinks deliver (the oracle below).
    running = sb.query("SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'pg_cdc%%'")[0][0]
    if running:
        raise SystemExit(f"failover: {running} pg_cdc processes run on the standby b")
    time.sleep(max(0.0, a.seconds - (time.time() - started)))
    log("switchover: a shut down (fast), b promoted")
    phase("during the switchover")
    sa.stop("fast")
    cluster.switch_to(sb, control)
    phase("after the switchover")
    time.sleep(a.seconds / 2)

    # 2. c, a standby of b; then c down, b killed, c promoted.
    with sb.connect() as c:
        c.execute("SELECT pg_create_physical_replication_slot('standby_c', true)")
    sc.base_backup(sb, "standby_c")
    # c starts without what slot synchronization needs (the last setting of a name counts):
    # cdc_check_failover on c must name each setting, and each sink's slot as not synchronized.
    lacking = ["sync_replication_slots = off", "hot_standby_feedback = off",
               f"primary_conninfo = 'host=127.0.0.1 port={sb.port} user=postgres application_name=c'"]
    sc.write_conf(upstream=(sb, "standby_c"), extra=control + lacking)
    sc.start()
    wait_for(lambda: streaming(sb, "c"), 60, "c streaming from b")
    reported = {r[0] for r in sc.query("SELECT item FROM cdc_check_failover() WHERE NOT ok")}
    expected = {"sync_replication_slots", "hot_standby_feedback", "primary_conninfo"} | {
        r[0] for r in sc.query("SELECT 'slot ' || slot_name || ' (sink ' || sink_name || ')' FROM _cdc_sinks")}
    if reported != expected:
        raise SystemExit(f"failover: cdc_check_failover() on c reports {sorted(reported)}, not {sorted(expected)}")
    sc.write_conf(upstream=(sb, "standby_c"), extra=control)
    sc.reload()
    wait_for(lambda: streaming(sb, "c"), 60, "c streaming from b again")
    sb.write_conf(sync_standby="standby_c", extra=control)
    sb.reload()
    wait_for(lambda: synced_on(sc, slots), 120, "c holding synced copies of the sinks' slots")
    time.sleep(a.seconds / 2)
    phase("while the standby was down")
    # What b acknowledged before that label reached c (asynchronous streaming): c must not lose it.
    flushed = sb.query("SELECT pg_current_wal_flush_lsn()::text")[0][0]
    wait_for(lambda: sc.query("SELECT pg_last_wal_receive_lsn() >= %s::pg_lsn", (flushed,))[0][0], 30,
             "c receiving what b acknowledged so far")
    log("c stopped: b's transactions now reach no standby")
    sc.stop("fast")
    down_at = sb.query("SELECT pg_current_wal_flush_lsn()::text")[0][0]
    down_started = time.time()
    if not a.control_no_standby_wait:
        # cdc_status names the standby that holds every sink back, and that it is not streaming.
        wait_for(lambda: all((r[0] or "").startswith("waiting for standby slot standby_c (no standby streaming")
                             for r in sb.query("SELECT standby_wait FROM cdc_status()")), 30,
                 "cdc_status on b naming standby_c as holding every sink back")
    time.sleep(max(0.0, a.seconds / 2 - (time.time() - down_started)))
    if a.control_no_standby_wait:
        # The control's violation made certain, not left to timing: b's Kafka sinks have confirmed (so
        # published) WAL written after c stopped, which c cannot have.
        kafka_slots = [r[0] for r in sb.query("SELECT slot_name FROM _cdc_sinks WHERE sink_type = 'kafka'")]
        wait_for(lambda: sb.query("SELECT bool_and(confirmed_flush_lsn > %s::pg_lsn) FROM pg_replication_slots "
                                  "WHERE slot_name = ANY(%s)", (down_at, kafka_slots))[0][0], 30,
                 "b's Kafka sinks publishing past what c received (the control)")
    log("b killed (immediate); c started and promoted")
    sb.stop("immediate")
    phase("during the failover")
    sc.start()
    cluster.switch_to(sc, control)
    phase("after the failover")
    time.sleep(a.seconds / 2)
    stop.set()
    for w in writers:
        w.join(timeout=30)
    errors = [w.error for w in writers if w.error]
    if errors:
        raise SystemExit(f"failover: a writer failed: {errors}")

    # Drained: every sink's slot on c confirmed past the WAL written by the last commit.
    end = sc.query("SELECT pg_current_wal_lsn()::text")[0][0]
    wait_for(lambda: all(r[0] for r in sc.query(
        "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = ANY(%s)",
        (end, list(slots)))), 120, "the sinks on c caught up")
    source = {r[0]: r[1] for r in sc.query(f"SELECT id, to_jsonb(t) FROM {TABLE} t")}
    lost = {}
    for w in writers:
        for seq, ph in w.acked.items():
            if w.row_id(seq) not in source:
                lost[w.row_id(seq)] = ph
    lost_by_phase = collections.Counter(lost.values())
    log(f"transactions acknowledged: {sum(len(w.acked) for w in writers)}; on c: {len(source)} rows; "
        f"acknowledged but not on c (lost with a promotion): {dict(lost_by_phase) or 0}")

    results = {
        "fo_eo": oracle(read_topic(topics["eo"]), source, set(lost)),
        "fo_alo": oracle(read_topic(topics["alo"]), source, set(lost)),
        "fo_table": oracle([r[0] for r in sc.query(f"SELECT event::text FROM {EVENTS} ORDER BY event_id")],
                           source, set(lost)),
    }
    for name, r in results.items():
        log(f"{name}: {r}")
    report = {"version": version, "run": run_id, "control_no_standby_wait": a.control_no_standby_wait,
              "acknowledged": sum(len(w.acked) for w in writers), "rows_on_last_primary": len(source),
              "lost_with_promotion": dict(lost_by_phase), "sinks": results}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=2)

    failures = []
    kept = ("before the switchover", "during the switchover", "after the switchover")
    if any(lost_by_phase.get(p) for p in kept):
        failures.append(f"acknowledged transactions that reached a running standby were lost: {dict(lost_by_phase)}")
    if a.control_no_standby_wait:
        published = sum(r["lost_transactions_published"] for r in results.values())
        for sc_ in (sa, sb, sc):
            sc_.stop("immediate")
        if published == 0:
            raise SystemExit("failover control FAILED: without the standby wait no lost transaction was published "
                             "(the oracle or the scenario cannot see what the wait prevents)")
        log(f"control ok: without the standby wait, {published} publications of transactions the promotion lost")
        return
    for name, r in results.items():
        exact = name != "fo_alo"
        bad = {k: r[k] for k in ("lost_or_wrong_rows", "rows_not_on_the_last_primary", "aborted_visible",
                                 "per_key_order_violations", "lost_transactions_published") if r[k]}
        if exact and r["duplicated"]:
            bad["duplicated"] = r["duplicated"]
        if bad:
            failures.append(f"{name}: {bad}")
    for s in (sa, sb, sc):
        s.stop("immediate")
    if failures:
        raise SystemExit("failover FAILED: " + "; ".join(failures) + f" (logs in {RUN})")
    shutil.rmtree(RUN, ignore_errors=True)
    log("ok: nothing lost, nothing doubled where exactly-once, order kept, nothing aborted or lost published")


if __name__ == "__main__":
    sys.exit(main())
