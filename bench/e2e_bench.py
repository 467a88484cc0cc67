"""End-to-end benchmark: pg_cdc and Debezium side by side into the same Kafka (`make bench-e2e`).

One run, on one PostgreSQL, one Kafka broker and one machine, measures each system in turn (never
two at once) and the limits around them, and writes bench/results/e2e.md, e2e.csv and e2e.png:

- throughput (events/s) of four workloads: INSERTs of ~200-byte rows, INSERTs of ~1 KB rows,
  UPDATEs of existing rows, and mixed multi-table transactions. Each system delivers the same
  number of events; the figure is events / (time from the start of the load until a read_committed
  consumer has seen the last event). pg_cdc is measured exactly-once (its default) and
  at-least-once; Debezium 3.6.1.Final runs embedded (bench/debezium/) and forwards each record with
  a KafkaProducer, acknowledged before it is marked processed (at-least-once).
- the limits, on the very WAL pg_cdc just decoded: decoding alone (pg_logical_slot_peek_binary_changes
  on a second slot), the same changes streamed by pg_recvlogical to /dev/null, and Kafka's own
  producer (org.apache.kafka.tools.ProducerPerformance) for records of the size pg_cdc produced;
- end-to-end latency at fixed rates, 1,000, 5,000 and 10,000 tx/s offered (pgbench -R, one single-row
  INSERT per transaction; what pgbench achieved is reported next to it):
  Kafka's LogAppendTime minus the commit time the event carries, and the time a read_committed
  consumer received it minus that commit time, from when the consumer has read the warm-up's events;
  pg_cdc without lingering (linger_ms 0, its default) and without a snapshot, Debezium with and without
  lingering (linger.ms 5 and 0);
- a steady 2,000 single-row tx/s into one table with one exactly-once Kafka sink: alone, next to 20 and
  to 50 idle sinks (each on an idle table of its own), next to 2 more identical sinks on its table, and
  next to seed example 1's other two sinks (Kafka Avro, Kinesis JSON) on it instead; each configuration
  3 times (--steady-repeats), in rounds: the busy sink's p50/p99, the CPU of pg_cdc's processes (all,
  and the busiest one) and the load average around each run; the report gives medians and ratios to
  "alone". Every sink is running before the clock starts (50 workers take a while to start on 2 cores);
- source overhead: pgbench TPC-B TPS with capture off, with pg_cdc on and with Debezium on, on shared
  cores and pinned (PostgreSQL and pgbench on one CPU, the broker and the capturing processes on the other);
- pg_cdc worker memory (private: Private_Clean + Private_Dirty + Swap from /proc/PID/smaps_rollup)
  at steady state and during one 1,000,000-row transaction;
- a backlog of 5,000,000 inserts (--backlog-changes) written while the sinks are held, then read by
  one exactly-once sink and by three identical ones, each decoding their own slots and sharing one
  decoding: seconds to drain, events/s, CPU per 100k events and the largest pg_cdc process's memory.

Everything it creates is named bench_* / pgbench_* (tables, sinks, slots, publications) or
bench-<run id>-* (topics; the steady section's Kinesis streams and registry subjects, removed at the
end of their run) and is dropped at the start (leftovers of an interrupted run) and at the end.
Ports and paths come from the environment (scripts/env.sh); the services must be running (`make
bench-e2e` starts them). bench/e2e_report.py writes the files. Run it with the venv's Python:

    source scripts/env.sh && "$PG_CDC_VENV/bin/python" bench/e2e_bench.py [--quick] [--rows N] [--sections ...]
        [--steady-repeats N] [--steady-idle 20,50] [--shared-decoding off|on|both] [--backlog-changes N]
"""
import argparse
import contextlib
import datetime
import hashlib
import json
import math
import os
import platform
import queue
import re
import shutil
import statistics
import subprocess
import threading
import time
import traceback
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import confluent_kafka
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import e2e_report

REPO = Path(__file__).resolve().parent.parent
DEBEZIUM_SRC = REPO / "bench" / "debezium"
PARTITIONS = 3            # every topic of the run: the broker's default, pre-created with LogAppendTime
ROWS_PER_TX = 100         # rows per transaction in the INSERT and UPDATE workloads
ACCOUNTS = 100_000        # rows of bench_accounts (the UPDATE workload's table)
CUSTOMERS = 10_000        # rows of bench_customers (updated by the mixed workload)
PUBLICATIONS = "_cdc_publication,_cdc_publication_inserts"   # what every pg_cdc slot reads

# The Java producer of the Debezium harness and of ProducerPerformance (one set, so the two agree).
JAVA_PRODUCER = {
    "acks": "all",
    "enable.idempotence": "true",
    "linger.ms": "5",
    "batch.size": "262144",
    "compression.type": "none",
}
# pg_cdc's producer (librdkafka). linger_ms and batch_size are librdkafka's defaults (pg_cdc's own
# default linger_ms is 0), set like the Java side for the throughput and steady sections; compression
# none like the Java side (broker and clients share 2 cores).
PG_CDC_SINK = {"format": "json", "linger_ms": 5, "batch_size": 1_000_000}
# The latency section runs pg_cdc as tuned for latency: no lingering (its default). With the
# throughput setting above, each Kafka request of a small pass waits out the 5 ms (measured
# 2026-12-06, 1,000 tx/s: an at-least-once pass took 5.6 ms to deliver with it, 0.54 ms without).
# Debezium runs there both with JAVA_PRODUCER and with LATENCY_JAVA on top. No snapshot, as Debezium's
# snapshot.mode no_data: bench_lat keeps the rows of the runs before, and a sink that snapshotted them
# delivered them (tens of thousands of READ events) in the warm-up and into the measured run.
LATENCY_PG_CDC = {"linger_ms": 0, "snapshot_mode": "never"}
LATENCY_JAVA = {"linger.ms": "0"}
# Debezium engine and connector settings, tuned for throughput as Debezium's performance advice
# says (bigger batches and queue, short poll interval), plus what makes its events comparable.
DEBEZIUM_ENGINE = {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
    "offset.flush.interval.ms": "1000",
    "plugin.name": "pgoutput",
    "publication.autocreate.mode": "disabled",
    "snapshot.mode": "no_data",
    "topic.prefix": "bench",
    "max.batch.size": "8192",
    "max.queue.size": "32768",
    "poll.interval.ms": "10",
    "statistics.metrics.enabled": "false",
    "tombstones.on.delete": "false",
    "decimal.handling.mode": "string",
    "converter.schemas.enable": "false",
}
DEBEZIUM_JVM = ["-Xmx1g", "-XX:+UseG1GC"]


class BenchError(RuntimeError):
    """A measurement that could not be completed (timeout, failed tool, missing prerequisite)."""


@dataclass(frozen=True)
class LoadResult:
    """What one timed load measured for one system."""
    events_per_s: float      # end to end: load start -> last event visible to a read_committed consumer
    load_s: float            # how long the loader took to commit the events
    value_bytes: float       # average size of the message values the system wrote
    cpu_s_per_100k: float    # CPU seconds of the system's processes per 100,000 events
    cores: float             # the same CPU time divided by the wall time
    wal_decoded_ratio: float  # pg_cdc: WAL its decoding sessions decoded / WAL written, over the load


@dataclass(frozen=True)
class Capture:
    """A running system under test: the processes whose CPU is its cost (the first is the one whose
    memory is sampled) and the replication slot it reads."""
    pids: list
    slot: str


# ---------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class Env:
    """Where the services are and where files go; scripts/env.sh exports all of it."""
    pg_host: str
    pg_port: str
    pg_user: str
    pg_db: str
    bootstrap: str
    cache: Path
    run_root: Path
    pg_bin: Path
    kafka_version: str

    @classmethod
    def from_environ(cls):
        e = os.environ
        port = e.get("KAFKA_PORT", "9092")
        return cls(
            pg_host=e.get("PGHOST", "127.0.0.1"),
            pg_port=e.get("PGPORT", "55432"),
            pg_user=e.get("PGUSER", "postgres"),
            pg_db=e.get("PGDATABASE", "postgres"),
            bootstrap=e.get("KAFKA_BOOTSTRAP", f"{e.get('KAFKA_HOST', '127.0.0.1')}:{port}"),
            cache=Path(e.get("PG_CDC_CACHE", "/var/cache/pg_cdc")),
            run_root=Path(e.get("PG_CDC_RUN", "/var/tmp/pg_cdc")),
            pg_bin=Path(e.get("PG_BIN", "/usr/lib/postgresql/15/bin")),
            kafka_version=e.get("KAFKA_VERSION", "4.1.1"),
        )

    @property
    def dsn(self):
        return f"host={self.pg_host} port={self.pg_port} user={self.pg_user} dbname={self.pg_db}"

    def connect(self):
        return psycopg.connect(self.dsn, autocommit=True)


@dataclass(frozen=True)
class Sizes:
    """How much each section does; --quick and --rows pick these."""
    events: int             # events per throughput measurement (per workload and system)
    latency_seconds: int    # length of each fixed-rate run
    rates: tuple            # transactions per second of the fixed-rate runs
    pgbench_seconds: int    # length of each pgbench run of the overhead section
    pgbench_rounds: int     # rounds of (off, pg_cdc, Debezium)
    pgbench_scale: int
    big_rows: int           # rows of the one large transaction
    steady_rate: int        # steady section: single-row transactions per second into one captured table
    steady_seconds: int     # length of each steady run
    steady_idle: tuple      # idle sinks next to the busy one, one configuration each
    steady_repeats: int     # runs of each steady configuration (the report gives the median)
    steady_shared: tuple = (False, True)  # cdc.shared_decoding off and/or on: each configuration both ways
    steady_only: tuple = ()  # steady section: only these configurations (their short names), all when empty
    steady_reset_caches: bool = True  # one more configuration: alone, catalog caches dropped at every read
    steady_members_poll: bool = True  # one more: the most idle sinks, sharing, members polling as before
    backlog_changes: int = 5_000_000  # backlog section: inserts written while the sinks are held

    @property
    def warmup(self):
        """Events loaded (and waited for) before each timed load, so every system runs warm."""
        return max(2_000, self.events // 10)


FULL = Sizes(events=300_000, latency_seconds=30, rates=(1000, 5000, 10000), pgbench_seconds=20, pgbench_rounds=2,
             pgbench_scale=10, big_rows=1_000_000, steady_rate=2000, steady_seconds=20, steady_idle=(20, 50),
             steady_repeats=3)
QUICK = Sizes(events=50_000, latency_seconds=10, rates=(1000, 5000), pgbench_seconds=8, pgbench_rounds=1,
              pgbench_scale=5, big_rows=200_000, steady_rate=2000, steady_seconds=8, steady_idle=(20, 50),
              steady_repeats=1, backlog_changes=500_000)
SECTIONS = ("throughput", "latency", "steady", "overhead", "memory", "backlog")

# The backlog section's table, and its configurations: (label, sinks, shared decoding).
BACKLOG_TABLE = "bench_backlog"
BACKLOG_CONFIGS = (("1 sink", 1, False), ("1 sink, shared decoding", 1, True),
                   ("3 identical sinks", 3, False), ("3 identical sinks, shared decoding", 3, True))


# ---------------------------------------------------------------------------------------------
# results


class Results:
    """Every figure of the run as rows (section, workload, system, metric, value, unit), plus the
    settings and notes the report prints."""

    def __init__(self):
        self.rows = []
        self.settings = {}
        self.notes = []
        self.series = {}   # timelines for the chart, e.g. memory samples

    def add(self, section, workload, system, metric, value, unit):
        self.rows.append({"section": section, "workload": workload, "system": system, "metric": metric,
                          "value": value, "unit": unit})
        print(f"  {section:10} {workload:14} {system:26} {metric:22} {e2e_report.fmt(value)} {unit}", flush=True)

    def get(self, section, workload, system, metric):
        for r in self.rows:
            if (r["section"], r["workload"], r["system"], r["metric"]) == (section, workload, system, metric):
                return r["value"]
        return None

    def note(self, text):
        self.notes.append(text)
        print(f"  NOTE: {text}", flush=True)


def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list (p in 0..100)."""
    if not sorted_values:
        return None
    return sorted_values[max(1, math.ceil(len(sorted_values) * p / 100)) - 1]


# ---------------------------------------------------------------------------------------------
# processes: CPU time and private memory


def cpu_seconds(pids):
    """User + system CPU time of the given processes so far (processes that are gone count 0)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])   # utime, stime (fields 14 and 15)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / ticks


MEMORY_FIELDS = ("Private_Clean", "Private_Dirty", "Swap")


def private_kib(pid):
    """Private memory of a process in KiB: Private_Clean + Private_Dirty + Swap from
    /proc/PID/smaps_rollup (pages no other process maps; shared_buffers is shared, so it is not in it)."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in MEMORY_FIELDS:
                    total += int(rest.split()[0])
    except FileNotFoundError:
        return None
    return total


class Sampler(threading.Thread):
    """Calls `probe()` every `interval` seconds until stopped, keeping (seconds since start, value)
    for each value that is not None."""

    def __init__(self, probe, interval):
        super().__init__(daemon=True)
        self.probe, self.interval = probe, interval
        self.samples = []
        self._stop_event = threading.Event()

    def run(self):
        start = time.monotonic()
        while not self._stop_event.is_set():
            value = self.probe()
            if value is not None:
                self.samples.append((time.monotonic() - start, value))
            self._stop_event.wait(self.interval)

    def stop(self):
        """Stops sampling; returns the values."""
        self._stop_event.set()
        self.join()
        return [value for _, value in self.samples]


# ---------------------------------------------------------------------------------------------
# Kafka


class Kafka:
    """Topic administration for the run; every topic it creates is deleted at the end."""

    def __init__(self, env, run_id):
        self.env = env
        self.run_id = run_id
        self.admin = AdminClient({"bootstrap.servers": env.bootstrap})
        self.created = []

    def topic(self, *parts):
        """Creates a fresh topic bench-<run id>-<parts> with PARTITIONS partitions and broker
        timestamps (LogAppendTime), and returns its name."""
        name = "-".join(("bench", self.run_id) + parts)
        futures = self.admin.create_topics([NewTopic(name, PARTITIONS, 1,
                                                     config={"message.timestamp.type": "LogAppendTime"})])
        for f in futures.values():
            f.result(30)
        self.created.append(name)
        return name

    def delete(self, names):
        """Deletes topics, best effort (a topic never created is fine)."""
        if not names:
            return
        for f in self.admin.delete_topics(list(names), operation_timeout=30).values():
            with contextlib.suppress(Exception):
                f.result(60)

    def delete_leftovers(self):
        """Deletes bench-* topics left by an interrupted earlier run."""
        topics = self.admin.list_topics(timeout=15).topics
        self.delete([t for t in topics if t.startswith("bench-")])

    def consumer(self, topic, low_latency=False):
        """A read_committed consumer assigned to every partition of `topic` from its start."""
        conf = {
            "bootstrap.servers": self.env.bootstrap,
            "group.id": "bench-" + uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
        if low_latency:
            conf["fetch.wait.max.ms"] = 5
        c = Consumer(conf)
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        return c


class Counter:
    """Counts the messages of one topic as they become visible to a read_committed consumer."""

    def __init__(self, kafka, topic):
        self.consumer = kafka.consumer(topic)
        self.topic = topic
        self.count = 0
        self.value_bytes = 0

    def wait_for(self, target, timeout):
        """Reads until `target` messages were seen in total; returns time.monotonic() at that moment."""
        deadline = time.monotonic() + timeout
        while self.count < target:
            if time.monotonic() > deadline:
                raise BenchError(f"only {self.count} of {target} events arrived on {self.topic} in {timeout:.0f} s")
            for m in self.consumer.consume(num_messages=10_000, timeout=0.5):
                if m.error() is None:
                    self.count += 1
                    self.value_bytes += len(m.value() or b"")
        return time.monotonic()

    def close(self):
        self.consumer.close()


def pg_cdc_commit_us(value):
    """Commit time (µs since the epoch) of a pg_cdc event: metadata.timestamp, ISO-8601 with ms."""
    ts = json.loads(value)["metadata"]["timestamp"]
    return int(datetime.datetime.fromisoformat(ts).timestamp() * 1_000_000)


def debezium_commit_us(value):
    """Commit time (µs since the epoch) of a Debezium event: source.ts_us."""
    return int(json.loads(value)["source"]["ts_us"])


class LatencyCollector(threading.Thread):
    """Reads a topic and records, for each event committed at or after `since_us`, the broker's
    LogAppendTime minus its commit time and the moment this consumer received it minus its commit
    time (both in ms)."""

    def __init__(self, kafka, topic, commit_us, since_us):
        super().__init__(daemon=True)
        self.consumer = kafka.consumer(topic, low_latency=True)
        self.commit_us, self.since_us = commit_us, since_us
        self.append_ms, self.visible_ms = [], []
        self.received = 0
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            # One message per poll, so each gets its own receive time (a batch call would wait to fill).
            m = self.consumer.poll(0.1)
            received_us = time.time() * 1_000_000
            if m is None or m.error() is not None:
                continue
            self.received += 1
            committed = self.commit_us(m.value())
            if committed >= self.since_us:
                self.append_ms.append(m.timestamp()[1] - committed / 1000)
                self.visible_ms.append((received_us - committed) / 1000)
        self.consumer.close()

    def catch_up(self, count, timeout):
        """Waits until `count` messages (the warm-up's) were received, then measures from now on: the
        consumer starts at offset 0, and while it read the warm-up's events the first measured ones
        waited behind them (measured: consumer p99 of seconds where the broker's was 12-31 ms)."""
        deadline = time.monotonic() + timeout
        while self.received < count:
            if time.monotonic() > deadline:
                raise BenchError(f"only {self.received} of the {count} warm-up events arrived in {timeout:.0f} s")
            time.sleep(0.05)
        self.since_us = time.time() * 1_000_000

    def wait_for(self, count, timeout):
        deadline = time.monotonic() + timeout
        while len(self.visible_ms) < count:
            if time.monotonic() > deadline:
                raise BenchError(f"only {len(self.visible_ms)} of {count} events arrived in {timeout:.0f} s")
            time.sleep(0.1)

    def stop(self):
        self._stop_event.set()
        self.join()


# ---------------------------------------------------------------------------------------------
# PostgreSQL: tables, workloads, cleanup

SCHEMA_SQL = f"""
CREATE TABLE bench_rows_200 (id bigint PRIMARY KEY, account int, amount numeric(12,2), status text,
                             note text, created_at timestamptz DEFAULT now());
CREATE TABLE bench_rows_1k (LIKE bench_rows_200 INCLUDING ALL);
CREATE TABLE bench_accounts (id int PRIMARY KEY, balance numeric(12,2), status text, note text,
                             updated_at timestamptz DEFAULT now());
INSERT INTO bench_accounts (id, balance, status, note)
    SELECT g, 100, 'open', repeat('a', 130) FROM generate_series(0, {ACCOUNTS - 1}) g;
CREATE TABLE bench_customers (id int PRIMARY KEY, name text, orders int, last_order_at timestamptz);
INSERT INTO bench_customers SELECT g, 'customer ' || g, 0, NULL FROM generate_series(0, {CUSTOMERS - 1}) g;
CREATE TABLE bench_orders (id bigint PRIMARY KEY, customer_id int, total numeric(12,2), status text,
                           note text, created_at timestamptz DEFAULT now());
CREATE TABLE bench_order_items (order_id bigint, line int, sku text, qty int, price numeric(10,2),
                                PRIMARY KEY (order_id, line));
CREATE TABLE bench_lat (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int,
                        amount numeric(12,2), status text, note text, created_at timestamptz DEFAULT now());
CREATE TABLE bench_big (LIKE bench_rows_200 INCLUDING ALL);

-- Transaction k of a workload touches rows derived from k, so loads never collide.
CREATE PROCEDURE bench_insert_rows(tbl regclass, pad int, first_tx bigint, ntx int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 0 .. ntx - 1 LOOP
    EXECUTE format('INSERT INTO %s (id, account, amount, status, note)
                    SELECT g, g %% 1000, (g %% 100000) / 100.0, ''pending'', repeat(''x'', %s)
                      FROM generate_series($1, $2) g', tbl, pad)
      USING (first_tx + i) * {ROWS_PER_TX}, (first_tx + i + 1) * {ROWS_PER_TX} - 1;
    COMMIT;
  END LOOP;
END $$;
CREATE PROCEDURE bench_update_accounts(first_tx bigint, ntx int) LANGUAGE plpgsql AS $$
DECLARE lo int;
BEGIN
  FOR i IN 0 .. ntx - 1 LOOP
    lo := ((first_tx + i) * {ROWS_PER_TX}) % {ACCOUNTS};
    UPDATE bench_accounts SET balance = balance + 1, updated_at = now() WHERE id >= lo AND id < lo + {ROWS_PER_TX};
    COMMIT;
  END LOOP;
END $$;
CREATE PROCEDURE bench_mixed_orders(first_tx bigint, ntx int) LANGUAGE plpgsql AS $$
DECLARE o bigint;
BEGIN
  FOR i IN 0 .. ntx - 1 LOOP
    o := first_tx + i;
    INSERT INTO bench_orders (id, customer_id, total, status, note)
        VALUES (o, o % {CUSTOMERS}, 0, 'new', repeat('o', 60));
    INSERT INTO bench_order_items SELECT o, l, 'SKU-' || ((o * 7 + l) % 5000), 1 + l % 3, 9.99 + l
        FROM generate_series(1, 5) l;
    UPDATE bench_orders SET total = (SELECT sum(qty * price) FROM bench_order_items WHERE order_id = o),
                            status = 'priced' WHERE id = o;
    DELETE FROM bench_order_items WHERE order_id = o AND line = 5;
    UPDATE bench_customers SET orders = orders + 1, last_order_at = now() WHERE id = o % {CUSTOMERS};
    COMMIT;
  END LOOP;
END $$;
"""
BENCH_TABLES = ("bench_rows_200", "bench_rows_1k", "bench_accounts", "bench_customers", "bench_orders",
                "bench_order_items", "bench_lat", "bench_big")
PGBENCH_TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")
PROCEDURES = ("bench_insert_rows(regclass, int, bigint, int)", "bench_update_accounts(bigint, int)",
              "bench_mixed_orders(bigint, int)")


class Workload:
    """One throughput workload: the tables it writes, how many events a transaction makes, and the
    procedure that commits `ntx` transactions of it. Keeps its own transaction counter."""

    def __init__(self, key, title, tables, events_per_tx, call):
        self.key, self.title, self.tables = key, title, tables
        self.events_per_tx = events_per_tx
        self.call = call          # SQL with two placeholders: first transaction number, count
        self.next_tx = 1

    def transactions(self, events):
        """Whole transactions needed for at least `events` events."""
        return -(-events // self.events_per_tx)

    def load(self, env, ntx):
        """Commits the next `ntx` transactions (own session, synchronous_commit off so the loader
        is never what limits the measured throughput); returns the seconds it took."""
        first, self.next_tx = self.next_tx, self.next_tx + ntx
        with env.connect() as conn:
            conn.execute("SET synchronous_commit = off")
            t0 = time.monotonic()
            conn.execute(self.call, (first, ntx))
            return time.monotonic() - t0


def workloads():
    return [
        Workload("insert_200B", "INSERT, ~200-byte rows, 100 rows/tx", ("bench_rows_200",), ROWS_PER_TX,
                 "CALL bench_insert_rows('bench_rows_200', 130, %s, %s)"),
        Workload("insert_1KB", "INSERT, ~1 KB rows, 100 rows/tx", ("bench_rows_1k",), ROWS_PER_TX,
                 "CALL bench_insert_rows('bench_rows_1k', 930, %s, %s)"),
        Workload("update", "UPDATE of existing ~200-byte rows, 100 rows/tx", ("bench_accounts",), ROWS_PER_TX,
                 "CALL bench_update_accounts(%s, %s)"),
        Workload("mixed", "3 tables, 9 changes/tx (INSERT order + 5 items, UPDATE order and customer, "
                 "DELETE item)", ("bench_orders", "bench_order_items", "bench_customers"), 9,
                 "CALL bench_mixed_orders(%s, %s)"),
    ]


def progress_topic(slot):
    """The progress topic of an exactly-once Kafka sink with replication slot `slot` (the name
    crates/cdc-sinks/src/kafka gives it)."""
    return "pg_cdc.progress." + slot.removeprefix("_cdc_")


def cleanup_database(conn):
    """Drops everything a benchmark run creates, so a run interrupted half-way leaves nothing that
    disturbs the next one; returns the progress topics of the pg_cdc sinks it dropped."""
    progress_topics = []
    for name, slot in conn.execute(
            r"SELECT sink_name, slot_name FROM _cdc_sinks WHERE sink_name LIKE 'bench\_%'").fetchall():
        progress_topics.append(progress_topic(slot))
        conn.execute("SELECT cdc_drop_sink(%s)", (name,))
    captured = {r[0] for r in conn.execute("SELECT table_name FROM _cdc_publications").fetchall()}
    steady = [r[0] for r in conn.execute(r"SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                                         r"AND tablename LIKE 'bench\_steady\_%'").fetchall()]
    for t in BENCH_TABLES + PGBENCH_TABLES + tuple(steady):
        if t in captured:
            conn.execute("SELECT cdc_disable(%s)", (t,))
        conn.execute(f"DROP TABLE IF EXISTS {t}")
    for proc in PROCEDURES:
        conn.execute(f"DROP PROCEDURE IF EXISTS {proc}")
    for (pub,) in conn.execute(r"SELECT pubname FROM pg_publication WHERE pubname LIKE 'bench\_%'").fetchall():
        conn.execute(f"DROP PUBLICATION {pub}")
    for (slot,) in conn.execute(r"SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'bench\_%'"):
        drop_slot(conn, slot)
    return progress_topics


def drop_slot(conn, slot):
    """Drops a replication slot, first ending the session that streams from it (if any)."""
    row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return
    if row[0] is not None:
        conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        wait_until(lambda: conn.execute("SELECT active_pid IS NULL FROM pg_replication_slots WHERE slot_name = %s",
                                        (slot,)).fetchone()[0], 30, f"slot {slot} to be released")
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# what the small benches (idle_sinks, shared_table, outage, backlog) share


def quiet_start(bench):
    """(env, kafka, conn) for a small bench; refuses a cluster where other sinks run (their slots
    decode the bench's tables too)."""
    env = Env.from_environ()
    kafka = Kafka(env, uuid.uuid4().hex[:6])
    conn = env.connect()
    if conn.execute("SELECT count(*) FROM _cdc_sinks").fetchone()[0]:
        raise SystemExit(f"{bench}: other sinks are running; this needs a quiet cluster")
    return env, kafka, conn


def captured_table(conn, table, columns):
    """Creates `table` afresh with `columns` and captures it (the default capture config)."""
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE {table} ({columns})")
    conn.execute("SELECT cdc_enable(%s, '{}')", (table,))


def delivered(conn, sink):
    """Events the sink delivered (cdc_delivery_status)."""
    return conn.execute("SELECT (cdc_delivery_status(%s)->'delivered'->>'events')::bigint", (sink,)).fetchone()[0]


def drop_sinks(conn, names):
    """Drops the sinks and waits until their workers dropped their slots, so none holds WAL for the
    next measurement (sinks of others, if any, are left alone). Returns the dropped sinks' slots."""
    if not names:
        return []
    slots = [r[0] for r in conn.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = ANY(%s)",
                                        (list(names),)).fetchall()]
    for n in names:
        conn.execute("SELECT cdc_drop_sink(%s)", (n,))
    wait_until(lambda: conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY(%s)",
                                    (slots,)).fetchone()[0] == 0, 120, "the dropped sinks' slots gone")
    return slots


def drop_sinks_and_topics(conn, kafka, names, topics):
    """Drops the sinks (drop_sinks) and deletes their topics and progress topics."""
    slots = drop_sinks(conn, names)
    kafka.delete(topics + [progress_topic(slot) for slot in slots])
    kafka.created = [t for t in kafka.created if t not in topics]


def all_reading_shared_log(conn, names):
    """Whether every one of the sinks reads the shared decoding's log now."""
    return conn.execute("SELECT bool_and((cdc_delivery_status(n)->'decoding'->>'shared')::bool) "
                        "FROM unnest(%s::text[]) n", (list(names),)).fetchone()[0]


def pgbench(env, *args, prefix=()):
    """Runs pgbench against the benchmark database (after `prefix`, e.g. taskset); returns its output."""
    return subprocess.run([*prefix, str(env.pg_bin / "pgbench"), "-h", env.pg_host, "-p", env.pg_port,
                           "-U", env.pg_user, *args, env.pg_db], capture_output=True, text=True, check=True).stdout


def pgbench_tps(env, args, prefix=()):
    """Runs pgbench; returns (TPS, transactions processed)."""
    out = pgbench(env, *args, prefix=prefix)
    return (float(re.search(r"tps = ([\d.]+)", out).group(1)),
            int(re.search(r"number of transactions actually processed: (\d+)", out).group(1)))


def pgbench_at_rate(env, script, rate, seconds):
    """pgbench with 8 clients running `script` at `rate` transactions per second for `seconds`;
    returns the transactions it processed."""
    return pgbench_tps(env, ["-n", "-f", str(script), "-c", "8", "-j", "2", "-R", str(rate), "-T", str(seconds)])[1]


def drop_captured_tables(conn, tables):
    """Stops capturing `tables` and drops them."""
    for t in tables:
        conn.execute("SELECT cdc_disable(%s)", (t,))
        conn.execute(f"DROP TABLE {t}")


STEADY_BUSY = "bench_steady_busy"
STEADY_SCRIPT = ("\\set a random(1, 100000)\n"
                 f"INSERT INTO {STEADY_BUSY} (account, note) VALUES (:a, repeat('x', 130));\n")


def steady_tables(conn, idle):
    """The steady runs' tables, created afresh and captured: one busy table and `idle` idle ones."""
    captured_table(conn, STEADY_BUSY, "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int, note text, "
                                      "created_at timestamptz DEFAULT now()")
    for i in range(idle):
        captured_table(conn, f"bench_steady_idle{i}", "id int PRIMARY KEY, v text")
    return [STEADY_BUSY] + [f"bench_steady_idle{i}" for i in range(idle)]


def set_shared_decoding(conn, on):
    """cdc.shared_decoding on or off (None: the server's default again), reloaded; waits until the
    decoder process runs, or is gone."""
    if on is None:
        conn.execute("ALTER SYSTEM RESET cdc.shared_decoding")
    else:
        conn.execute(f"ALTER SYSTEM SET cdc.shared_decoding = {'on' if on else 'off'}")
    conn.execute("SELECT pg_reload_conf()")
    if on is not None and not on:
        wait_until(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_cdc decoder'"
                                        ).fetchone()[0] == 0, 30, "the shared decoding's decoder to exit")


# Test-only settings a steady configuration may turn on to run a former behaviour side by side.
STEADY_TEST_SETTINGS = (
    # A read drops the worker's catalog caches after decoding, as every read did before they were kept.
    "cdc.test_reset_caches_each_read",
    # Sinks reading the shared decoding's log look for new publishes as they did before the decoder
    # woke them (every 5 ms after a pass that read, doubling up to cdc.naptime_ms).
    "cdc.test_members_poll_publishes",
)


def set_test_settings(conn, on=()):
    """Turns the STEADY_TEST_SETTINGS named in `on` on and the others off (reset), reloaded: the pg_cdc
    processes read them at their next pass."""
    for name in STEADY_TEST_SETTINGS:
        if name in on:
            conn.execute(f"ALTER SYSTEM SET {name} = on")
        else:
            conn.execute(f"ALTER SYSTEM RESET {name}")
    conn.execute("SELECT pg_reload_conf()")


def steady_run(conn, env, kafka, script, rate, seconds, idle, peers=(), tag=None, shared=False):
    """One exactly-once Kafka sink on the busy table (steady_tables), `idle` more, each on an idle
    table of its own, and `peers`: more sinks on the busy table, (name, type, config) each (config
    without "tables"). Empties the busy table, adds the sinks and waits until every one is running,
    then pgbench runs `script` at `rate` for 3 s (warm-up, which every sink on the busy table must
    have delivered) and for `seconds` (timed). Returns the busy sink's latency (commit time -> seen by a read_committed consumer), the CPU of every pg_cdc process
    (launcher and sink workers, utime + stime) from the start of the timed load until the busy sink's
    consumer saw its last event and every peer delivered it too (summed, the busiest process, and the
    idle sinks' workers together),
    and the 1-minute load average at the start and the end. Drops its sinks and their topics, also
    when it fails. `tag` (default "<idle>idle") names the sinks and topics. `shared`: cdc.shared_decoding
    is on, and the clock starts only once every sink reads the shared decoding's log (a new sink
    decodes its own slot until its position is in that log)."""
    tag = tag or f"{idle}idle"
    busy = f"bench_steady_{tag}_busy"
    busy_topic = kafka.topic("steady", tag, "busy")
    topics = [busy_topic]
    sinks = [(busy, "kafka", {"bootstrap_servers": env.bootstrap, "topic": busy_topic, "tables": [STEADY_BUSY],
                              "exactly_once": True})]
    for i in range(idle):
        topics.append(kafka.topic("steady", tag, str(i)))
        sinks.append((f"bench_steady_{tag}_{i}", "kafka", {"bootstrap_servers": env.bootstrap, "topic": topics[-1],
                                                           "tables": [f"bench_steady_idle{i}"], "exactly_once": True}))
    sinks += [(f"bench_steady_{tag}_{name}", kind, {**config, "tables": [STEADY_BUSY]}) for name, kind, config in peers]
    topics += [config["topic"] for _, kind, config in peers if kind == "kafka"]
    on_busy = [busy] + [f"bench_steady_{tag}_{name}" for name, _, _ in peers]
    names = []
    # Each sink starts with a snapshot of the rows its table holds: empty, so no run inherits the
    # rows of the ones before (and no sink is still snapshotting them when the clock starts).
    conn.execute(f"TRUNCATE {STEADY_BUSY}")
    try:
        for name, kind, config in sinks:
            conn.execute("SELECT cdc_add_sink(%s, %s, %s::jsonb)", (name, kind, json.dumps(config)))
            names.append(name)
        wait_sinks_running(conn, names, 120 + 3 * len(names))
        warm = pgbench_at_rate(env, script, rate, 3)
        wait_until(lambda: all((delivered(conn, n) or 0) >= warm for n in on_busy), 300,
                   "every sink on the busy table to deliver the warm-up")
        if shared:
            # Idle sinks move past the log's start with their heartbeats (WAL 2 MB ahead of them).
            wait_until(lambda: all_reading_shared_log(conn, names), 180, "every sink reading the shared decoding's log")
        before = {n: delivered(conn, n) or 0 for n in on_busy[1:]}
        collector = LatencyCollector(kafka, busy_topic, pg_cdc_commit_us, since_us=time.time() * 1_000_000)
        collector.start()
        pids = capture_pids(conn)
        # Which sink each worker serves (its application_name, "pg_cdc worker: <sink>").
        sink_of = dict(conn.execute("SELECT pid, substring(application_name from ': (.*)$') FROM pg_stat_activity "
                                    "WHERE backend_type = 'pg_cdc worker'").fetchall())
        idle_sinks = {name for name, _, _ in sinks[1:1 + idle]}
        load0 = os.getloadavg()[0]
        cpu0, t0 = [cpu_seconds([p]) for p in pids], time.monotonic()
        processed = pgbench_at_rate(env, script, rate, seconds)
        try:
            collector.wait_for(processed, timeout=300)
        finally:
            collector.stop()
        seen = time.monotonic()
        # The local Kinesis server (seed example 1's third sink) stores only a few hundred records a
        # second here: its sink takes minutes to deliver the timed load (4.5 min for 40,000 events once).
        wait_until(lambda: all((delivered(conn, n) or 0) >= before[n] + processed for n in on_busy[1:]), 600,
                   "every sink on the busy table to deliver the timed load")
        elapsed, cpu = time.monotonic() - t0, [cpu_seconds([p]) - c for p, c in zip(pids, cpu0)]
        load1 = os.getloadavg()[0]
        restarted = capture_pids(conn) != pids
        visible = sorted(collector.visible_ms)
        workers = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_cdc worker'")]
        memory = sorted(m / 1024 for m in map(private_kib, workers) if m is not None) or [0.0]
        per_100k = 100_000 / max(processed, 1)
        idle_cpu = sum(c for p, c in zip(pids, cpu) if sink_of.get(p) in idle_sinks)
        return {"sinks": len(names), "processes": len(pids), "events": processed,
                "p50": percentile(visible, 50), "p99": percentile(visible, 99),
                "cores": sum(cpu) / elapsed, "cpu_per_100k": sum(cpu) * per_100k,
                "busiest_cores": max(cpu) / elapsed, "busiest_cpu_per_100k": max(cpu) * per_100k,
                "idle_cores": idle_cpu / elapsed,
                "catch_up_s": time.monotonic() - seen, "load_start": load0, "load_end": load1,
                "restarted": restarted, "mib_median": memory[len(memory) // 2], "mib_total": sum(memory)}
    finally:
        drop_sinks_and_topics(conn, kafka, names, topics)


def wait_sinks_running(conn, names, timeout):
    """Waits until every one of the sinks is running (its worker has opened its slot and destination
    and reads); a sink in error fails at once, with its last error."""
    def running():
        rows = conn.execute("SELECT sink_name, state, last_error FROM _cdc_sinks WHERE sink_name = ANY(%s)",
                            (names,)).fetchall()
        failed = [f"{n}: {error}" for n, state, error in rows if state == "error"]
        if failed:
            raise BenchError(f"{len(failed)} sinks in error: " + "; ".join(failed[:3]))
        return sum(state == "running" for _, state, _ in rows) == len(names)
    try:
        wait_until(running, timeout, f"{len(names)} sinks running")
    except BenchError as e:
        if not str(e).startswith("timed out"):
            raise
        states = conn.execute("SELECT state, count(*), max(last_error) FROM _cdc_sinks WHERE sink_name = ANY(%s) "
                              "GROUP BY 1", (names,)).fetchall()
        raise BenchError(f"timed out after {timeout} s waiting for {len(names)} sinks running: "
                         + ", ".join(f"{n} {state} ({error})" for state, n, error in states)) from None


# What steady_run returns that the report shows: (metric, key, unit).
STEADY_METRICS = (
    ("events", "events", "events"),
    ("visible_p50_ms", "p50", "ms"),
    ("visible_p99_ms", "p99", "ms"),
    ("cores", "cores", "cores (every pg_cdc process)"),
    ("cpu_s_per_100k", "cpu_per_100k", "CPU s per 100k events (every pg_cdc process)"),
    ("busiest_cores", "busiest_cores", "cores (the busiest pg_cdc process)"),
    ("busiest_cpu_s_per_100k", "busiest_cpu_per_100k", "CPU s per 100k events (the busiest pg_cdc process)"),
    ("catch_up_s", "catch_up_s", "s (the other busy sinks after the busy sink's last event)"),
    ("idle_cores", "idle_cores", "cores (the idle sinks' workers together)"),
    ("worker_mib_median", "mib_median", "MiB"),
    ("sinks", "sinks", "sinks"),
    ("processes", "processes", "pg_cdc processes"),
    ("load_start", "load_start", "1-min load average"),
    ("load_end", "load_end", "1-min load average"),
)
KINESIS_ENDPOINT = os.environ.get("KINESIS_ENDPOINT", "http://127.0.0.1:4568")
SCHEMA_REGISTRY = os.environ.get("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081")


def kinesis_stream(name, shards):
    """Creates a stream on the local Kinesis server and waits until it is active; returns what
    deletes it. (boto3 is in the venv for the tests; imported here so no other section needs it.)"""
    import boto3
    k = boto3.client("kinesis", endpoint_url=KINESIS_ENDPOINT, region_name="us-east-1",
                     aws_access_key_id="bench", aws_secret_access_key="bench")
    k.create_stream(StreamName=name, ShardCount=shards)

    def remove():
        with contextlib.suppress(Exception):
            k.delete_stream(StreamName=name, EnforceConsumerDeletion=True)
    try:
        wait_until(lambda: k.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamStatus"]
                   == "ACTIVE", 60, f"Kinesis stream {name} active")
    except BaseException:
        remove()
        raise
    return remove


def delete_subjects(prefix):
    """Deletes (soft, then permanently) the schema registry's subjects whose names start with
    `prefix`, best effort."""
    def call(method, path):
        with urllib.request.urlopen(urllib.request.Request(SCHEMA_REGISTRY + path, method=method), timeout=10) as r:
            return json.loads(r.read() or b"null")
    with contextlib.suppress(Exception):
        for subject in call("GET", "/subjects"):
            if subject.startswith(prefix):
                quoted = urllib.parse.quote(subject, safe="")
                call("DELETE", f"/subjects/{quoted}")
                call("DELETE", f"/subjects/{quoted}?permanent=true")


def producer_alone(env, topic, records, size):
    """Records/s of Kafka's own producer (ProducerPerformance from the broker's jars, with the Java
    producer settings the Debezium harness uses) sending `records` records of `size` bytes."""
    libs = env.cache / f"kafka-{env.kafka_version}" / "libs"
    out = subprocess.run(
        ["java", "-Xmx512m", f"-Dlog4j2.configurationFile={REPO / 'kafka' / 'log4j2.yaml'}",
         "-Dkafka.root.level=ERROR", "-cp", f"{libs}/*", "org.apache.kafka.tools.ProducerPerformance",
         "--topic", topic, "--num-records", str(records), "--record-size", str(size), "--throughput", "-1",
         "--producer-props", f"bootstrap.servers={env.bootstrap}",
         *(f"{k}={v}" for k, v in JAVA_PRODUCER.items())],
        capture_output=True, text=True, check=True).stdout
    m = re.search(r"(\d+) records sent, ([\d.]+) records/sec", out)
    if m is None:
        raise BenchError(f"unexpected ProducerPerformance output: {out[-500:]}")
    return float(m.group(2))


def write_report(out, name, lines):
    """Writes the report's lines to `out`/`name` and prints them."""
    report = "\n".join(lines) + "\n"
    os.makedirs(out, exist_ok=True)
    Path(out, name).write_text(report)
    print(report)


def wal_marks(conn):
    """(WAL decoded by every pg_cdc sink's decoding sessions, the current WAL position), in bytes:
    two marks around a run give the WAL decoded per WAL written (1.0: every record once)."""
    decoded = 0
    if conn.execute("SELECT to_regclass('_cdc_sinks') IS NOT NULL").fetchone()[0]:
        decoded = conn.execute("SELECT coalesce(sum((cdc_delivery_status(sink_name)->'decoding'->>'wal_decoded_bytes')::bigint), 0) "
                               "FROM _cdc_sinks").fetchone()[0]
    lsn = conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8").fetchone()[0]
    return int(decoded), int(lsn)


def decoded_ratio(before, after):
    written = after[1] - before[1]
    return (after[0] - before[0]) / written if written > 0 else None


def capture_pids(conn):
    """Every pg_cdc process: the sink workers first (one per sink, started by the launcher once it
    sees the sink; the first one's memory is what the bench samples), then the launcher and the
    shared decoding's decoder when it runs (ps titles "postgres: pg_cdc worker", "postgres: pg_cdc
    launcher", "postgres: pg_cdc decoder")."""
    sql = ("SELECT pid FROM pg_stat_activity WHERE backend_type IN ('pg_cdc worker', 'pg_cdc launcher', "
           "'pg_cdc decoder') ORDER BY backend_type <> 'pg_cdc worker', backend_start")
    wait_until(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_cdc worker'"
                                    ).fetchone()[0] > 0, 30, "a pg_cdc sink worker")
    pids = [r[0] for r in conn.execute(sql).fetchall()]
    if not pids:
        raise BenchError("no pg_cdc process is running (is pg_cdc in shared_preload_libraries?)")
    return pids


def set_affinity(pid, cpus):
    """Puts every thread of `pid` on `cpus` (threads and children it starts later inherit it)."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(int(tid), cpus)


def children(pid):
    """The pids whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                status = Path(f"/proc/{entry}/status").read_text()
                if re.search(rf"^PPid:\s+{pid}$", status, re.M):
                    found.append(int(entry))
    return found


class Pinning:
    """The source on one core, the capture on the other: the postmaster and every process it runs
    (so every backend it forks later, pgbench's included) and pgbench itself on the first CPU; the
    Kafka broker, the capturing processes (pin_capture) and this script on the second. undo() gives
    every one of them all CPUs back."""

    def __init__(self, conn, env):
        self.all = os.sched_getaffinity(0)
        if len(self.all) < 2:
            raise BenchError("pinning needs 2 CPUs")
        self.source, self.capture = {min(self.all)}, self.all - {min(self.all)}
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        self.postmaster = int(re.search(r"^PPid:\s+(\d+)$", Path(f"/proc/{backend}/status").read_text(), re.M).group(1))
        kafka_pid = env.run_root / "kafka" / "kafka.pid"
        self.broker = int(kafka_pid.read_text()) if kafka_pid.exists() else None
        self.prefix = ["taskset", "-c", ",".join(map(str, sorted(self.source)))]

    def apply(self):
        for pid in [self.postmaster] + children(self.postmaster):
            set_affinity(pid, self.source)
        for pid in (self.broker, os.getpid()):
            if pid:
                set_affinity(pid, self.capture)

    def pin_capture(self, pids):
        for pid in pids:
            set_affinity(pid, self.capture)

    def undo(self):
        for pid in [self.postmaster] + children(self.postmaster) + [self.broker, os.getpid()]:
            if pid:
                set_affinity(pid, self.all)


# ---------------------------------------------------------------------------------------------
# the two systems


class PgCdc:
    """pg_cdc: one sink per measurement, added before and dropped after it."""

    def __init__(self, bench):
        self.bench = bench

    @contextlib.contextmanager
    def sink(self, name, topic, tables, exactly_once=True, overrides=None):
        conn, env = self.bench.conn, self.bench.env
        config = {"bootstrap_servers": env.bootstrap, "topic": topic, **PG_CDC_SINK, **(overrides or {}),
                  "exactly_once": exactly_once, "tables": list(tables)}
        conn.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)", (name, json.dumps(config)))
        slot = conn.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
        try:
            yield Capture(capture_pids(conn), slot)
        finally:
            conn.execute("SELECT cdc_drop_sink(%s)", (name,))
            self.bench.topics_to_delete.append(progress_topic(slot))
            # The worker drops the slot shortly after; wait so it never holds WAL for the next step.
            wait_until(lambda: conn.execute("SELECT count(*) = 0 FROM pg_replication_slots WHERE slot_name = %s",
                                            (slot,)).fetchone()[0], 60, f"pg_cdc to drop slot {slot}")


class Debezium:
    """The Debezium embedded engine harness (bench/debezium), built once into the cache."""

    def __init__(self, bench):
        self.bench = bench
        self.home = bench.env.cache / "bench-debezium"
        self.classpath = None

    def sources_stamp(self):
        """Hash of the harness sources: a rebuild happens only when they changed."""
        h = hashlib.sha256()
        for p in sorted([DEBEZIUM_SRC / "pom.xml"] + list((DEBEZIUM_SRC / "src").rglob("*"))):
            if p.is_file():
                h.update(str(p.relative_to(DEBEZIUM_SRC)).encode() + b"\0" + p.read_bytes() + b"\0")
        return h.hexdigest()

    def build(self):
        """mvn package into $PG_CDC_CACHE/bench-debezium/target (Maven repository $PG_CDC_CACHE/m2),
        unless the stamp says the sources did not change since the last build."""
        target, stamp_file = self.home / "target", self.home / "sources.sha256"
        stamp = self.sources_stamp()
        if not (stamp_file.exists() and stamp_file.read_text() == stamp and (target / "classes").is_dir()):
            print("building the Debezium harness (mvn package)", flush=True)
            shutil.rmtree(target, ignore_errors=True)
            self.home.mkdir(parents=True, exist_ok=True)
            log = self.home / "mvn.log"
            with open(log, "w") as out:
                rc = subprocess.call(["mvn", "-q", "-B", "-f", str(DEBEZIUM_SRC / "pom.xml"),
                                      f"-Dmaven.repo.local={self.bench.env.cache / 'm2'}",
                                      f"-Dbench.build.dir={target}", "package"], stdout=out, stderr=subprocess.STDOUT)
            if rc != 0:
                raise BenchError(f"building the Debezium harness failed (see {log})")
            stamp_file.write_text(stamp)
        self.classpath = f"{target / 'classes'}:{target / 'lib'}/*"
        return sorted(p.name for p in (target / "lib").glob("*.jar"))

    @contextlib.contextmanager
    def run(self, name, topic, tables, overrides=None, streaming=True, producer_overrides=None):
        """Starts the harness with its own slot and publication on `tables` (engine settings
        `overrides` on top of DEBEZIUM_ENGINE, producer settings `producer_overrides` on top of
        JAVA_PRODUCER); yields a Capture whose pids are the JVM and the
        walsender decoding for it, once its slot is streamed (or, with `streaming` False, the JVM
        alone as soon as the engine polls: an initial snapshot runs before the slot is streamed).
        Stops it and drops both on exit."""
        bench = self.bench
        conn, env = bench.conn, bench.env
        slot = publication = f"bench_dbz_{name}"
        conn.execute(f"CREATE PUBLICATION {publication} FOR TABLE {', '.join(tables)}")
        engine = {**DEBEZIUM_ENGINE, "name": slot, "slot.name": slot, "publication.name": publication,
                  "database.hostname": env.pg_host, "database.port": env.pg_port, "database.user": env.pg_user,
                  "database.password": "", "database.dbname": env.pg_db,
                  "table.include.list": ",".join(f"public.{t}" for t in tables), **(overrides or {})}
        producer = {**JAVA_PRODUCER, **(producer_overrides or {}), "bootstrap.servers": env.bootstrap}
        files = {}
        for kind, props in (("engine", engine), ("producer", producer)):
            files[kind] = bench.run_dir / f"debezium-{name}.{kind}.properties"
            files[kind].write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        log = open(bench.run_dir / f"debezium-{name}.log", "w")
        proc = subprocess.Popen(["java", *DEBEZIUM_JVM, "-cp", self.classpath, "io.pgcdc.bench.DebeziumBench",
                                 str(files["engine"]), str(files["producer"]), topic],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        ready = queue.Queue()
        threading.Thread(target=self._watch_stdout, args=(proc.stdout, ready), daemon=True).start()
        try:
            try:
                started = ready.get(timeout=120)
            except queue.Empty:
                started = False
            if not started:
                raise BenchError(f"Debezium did not start (see {log.name})")
            if not streaming:
                yield Capture([proc.pid], slot)
                return
            wait_until(lambda: conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                                            (slot,)).fetchone() == (True,), 60, "Debezium's slot to be streamed")
            walsender = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                                     (slot,)).fetchone()[0]
            yield Capture([proc.pid, walsender], slot)
        finally:
            proc.stdin.close()
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            drop_slot(conn, slot)
            conn.execute(f"DROP PUBLICATION IF EXISTS {publication}")
        if proc.returncode != 0:
            raise BenchError(f"the Debezium harness exited with {proc.returncode} (see {log.name})")

    @staticmethod
    def _watch_stdout(stdout, ready):
        """Puts True on `ready` when the harness prints READY, False if its stdout ends first."""
        for line in stdout:
            if line.strip() == "READY":
                ready.put(True)
        ready.put(False)


# ---------------------------------------------------------------------------------------------
# the benchmark


class Bench:
    def __init__(self, env, sizes, out_dir, sections):
        self.env, self.sizes, self.out_dir, self.sections = env, sizes, out_dir, sections
        self.run_id = uuid.uuid4().hex[:6]
        self.run_dir = env.run_root / "bench-e2e"   # harness configs and logs of the last run
        self.results = Results()
        self.conn = None
        self.kafka = Kafka(env, self.run_id)
        self.topics_to_delete = []
        self.pg_cdc = PgCdc(self)
        self.debezium = Debezium(self)

    # -- set-up and tear-down ---------------------------------------------------------------

    def setup(self):
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True)
        self.conn = self.env.connect()
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cdc")
        self.kafka.delete(cleanup_database(self.conn))
        self.kafka.delete_leftovers()
        self.conn.execute(SCHEMA_SQL)
        for t in BENCH_TABLES:
            self.conn.execute("SELECT cdc_enable(%s, '{}')", (t,))
        self.conn.execute("VACUUM ANALYZE")
        try:
            jars = self.debezium.build()
        except BenchError as e:
            jars = None
            self.debezium = None
            self.results.note(f"Debezium was not measured: {e}")
        self.record_environment(jars)

    def teardown(self):
        if self.conn is not None:
            if self.conn.closed:
                # A section lost the connection (a server restart, a terminated backend): clean up
                # over a new one, so that the report of the sections measured is still written.
                self.conn = self.env.connect()
            self.topics_to_delete += cleanup_database(self.conn)
            self.conn.close()
        self.kafka.delete(self.kafka.created + self.topics_to_delete)

    def record_environment(self, debezium_jars):
        """Machine, versions and every setting, for the report."""
        s = self.results.settings
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "unknown")
        s["machine"] = {"cores (nproc)": str(os.cpu_count()),
                        "memory": f"{int(meminfo['MemTotal'].split()[0]) / 2**20:.1f} GiB",
                        "CPU model": cpu, "kernel": platform.release(),
                        "load average at start": " ".join(Path("/proc/loadavg").read_text().split()[:3])}
        s["versions"] = {
            "PostgreSQL": self.conn.execute("SHOW server_version").fetchone()[0],
            "pg_cdc": self.pg_cdc_version(),
            "Kafka broker": f"Apache Kafka {self.env.kafka_version} (one KRaft node, scripts/kafka.sh)",
            "librdkafka in pg_cdc": re.search(r'name = "rdkafka-sys"\nversion = "[^+]*\+([^"]+)"',
                                              (REPO / "Cargo.lock").read_text()).group(1),
            "Java": subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0],
            "consumer of this script": f"confluent-kafka {confluent_kafka.__version__} "
                                       f"(librdkafka {confluent_kafka.libversion()[0]})",
        }
        if debezium_jars:
            s["versions"]["Debezium harness jars"] = ", ".join(
                j for j in debezium_jars if re.match(r"(debezium-(embedded|connector-postgres)|kafka-clients|postgresql)-", j))
        s["PostgreSQL settings"] = dict(self.conn.execute(
            "SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings WHERE name IN ('shared_buffers', "
            "'wal_level', 'synchronous_commit', 'max_wal_size', 'work_mem') OR name LIKE 'cdc.%' "
            "ORDER BY name").fetchall())
        s["PostgreSQL settings"]["throughput loader sessions"] = "SET synchronous_commit = off"
        s["pg_cdc capture and sinks"] = {
            "cdc_enable config": "{} (pgbench_history: {\"operations\": [\"INSERT\"]})",
            "cdc_add_sink config": json.dumps({"bootstrap_servers": self.env.bootstrap, "topic": "<per run>",
                                               **PG_CDC_SINK, "exactly_once": "true | false",
                                               "tables": ["<the workload's tables>"]}),
            "fixed by pg_cdc": "acks=all, enable.idempotence=true, queue.buffering.max.kbytes capped "
                               "(crates/cdc-sinks); one Kafka transaction per peek batch when exactly-once",
        }
        s["Debezium engine and connector"] = {
            **DEBEZIUM_ENGINE,
            "slot.name, publication.name": "bench_dbz_<run> (one each per run, created FOR TABLE the workload's "
                                           "tables, dropped after)",
            "table.include.list": "public.<the workload's tables>",
            "JVM": " ".join(DEBEZIUM_JVM),
        }
        s["Java producer (Debezium harness and ProducerPerformance)"] = dict(JAVA_PRODUCER)
        s["latency section"] = {"pg_cdc sink config on top": json.dumps(LATENCY_PG_CDC),
                                f"Java producer on top ({e2e_report.DBZ0})": json.dumps(LATENCY_JAVA)}
        s["Kafka topics and consumers"] = {
            "topics": f"{PARTITIONS} partitions, replication 1, message.timestamp.type=LogAppendTime, created per run",
            "consumers": "confluent-kafka, isolation.level=read_committed, assigned all partitions from offset 0 "
                         "(latency runs: fetch.wait.max.ms=5, one poll per message)",
        }

    def pg_cdc_version(self):
        """Extension version, git commit, and which library: the one the server loaded (checksum that
        scripts/pg.sh records at start) and the one installed now."""
        git = ["git", "-C", str(REPO)]
        commit = subprocess.check_output(git + ["rev-parse", "--short=12", "HEAD"], text=True).strip()
        dirty = subprocess.check_output(git + ["status", "--porcelain", "--", "src", "crates", "sql"], text=True)
        lib = Path(subprocess.check_output([str(self.env.pg_bin / "pg_config"), "--pkglibdir"], text=True).strip(),
                   "pg_cdc.so")
        installed = hashlib.sha256(lib.read_bytes()).hexdigest()
        loaded_file = self.env.run_root / f"pg_cdc-{self.env.pg_port}.so.sha256"
        loaded = loaded_file.read_text().split()[0] if loaded_file.exists() else None
        mtime = datetime.datetime.fromtimestamp(lib.stat().st_mtime, datetime.timezone.utc)
        text = (self.conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0]
                + f", git commit {commit}" + (" with src/, crates/ or sql/ modified in the work tree" if dirty else "")
                + f"; {lib} sha256 {installed[:16]}, installed {mtime:%Y-%m-%d %H:%M} UTC")
        if loaded is None:
            text += "; which library the server loaded is unknown (not started by scripts/pg.sh)"
        elif loaded != installed:
            text += f"; the server loaded an earlier build, sha256 {loaded[:16]} (the measured one)"
        return text

    # -- throughput ---------------------------------------------------------------------------

    def throughput(self):
        for w in workloads():
            print(f"throughput: {w.key}", flush=True)
            self.throughput_pg_cdc(w)
            self.throughput_pg_cdc(w, exactly_once=False)
            if self.debezium is not None:
                self.throughput_debezium(w)
            self.producer_limit(w)

    def timed_load(self, w, topic, capture, before_timed_load=None):
        """Warm-up load (waited for), then the timed load of `sizes.events` events, around which the
        WAL pg_cdc's decoding sessions decoded is compared with the WAL written (pg_cdc only)."""
        counter = Counter(self.kafka, topic)
        try:
            warm_tx = w.transactions(self.sizes.warmup)
            w.load(self.env, warm_tx)
            counter.wait_for(warm_tx * w.events_per_tx, timeout=120)
            if before_timed_load is not None:
                before_timed_load()
            ntx = w.transactions(self.sizes.events)
            events = ntx * w.events_per_tx
            target = counter.count + events
            bytes_before = counter.value_bytes
            cpu_before = cpu_seconds(capture.pids)
            load_seconds = []
            with self.env.connect() as probe:
                marks = wal_marks(probe)
                t0 = time.monotonic()
                loader = threading.Thread(target=lambda: load_seconds.append(w.load(self.env, ntx)))
                loader.start()
                done = counter.wait_for(target, timeout=max(300, events / 1000))
                loader.join()
                ratio = decoded_ratio(marks, wal_marks(probe))
            cpu = cpu_seconds(capture.pids) - cpu_before
            return LoadResult(events_per_s=events / (done - t0), load_s=load_seconds[0],
                              value_bytes=(counter.value_bytes - bytes_before) / events,
                              cpu_s_per_100k=cpu * 100_000 / events, cores=cpu / (done - t0),
                              wal_decoded_ratio=ratio)
        finally:
            counter.close()

    def add_load_result(self, w, system, result, cpu_of):
        r = self.results
        r.add("throughput", w.key, system, "events_per_s", result.events_per_s, "events/s")
        r.add("throughput", w.key, system, "cpu_s_per_100k", result.cpu_s_per_100k, f"CPU s ({cpu_of}) per 100k events")
        r.add("throughput", w.key, system, "cores", result.cores, f"cores busy ({cpu_of}) on average")
        r.add("throughput", w.key, system, "value_bytes", result.value_bytes, "bytes/event")

    def throughput_pg_cdc(self, w, exactly_once=True):
        mode = "exactly-once" if exactly_once else "at-least-once"
        system = f"pg_cdc ({mode})"
        topic = self.kafka.topic("pgcdc", "eo" if exactly_once else "alo", w.key.lower())
        limit_slots = (f"bench_peek_{w.key.lower()}", f"bench_recv_{w.key.lower()}")

        def create_limit_slots():
            for slot in limit_slots:
                self.conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))

        with self.pg_cdc.sink(f"bench_{w.key.lower()}", topic, w.tables, exactly_once) as capture:
            result = self.timed_load(w, topic, capture, create_limit_slots if exactly_once else None)
        self.add_load_result(w, system, result, "worker")
        self.results.add("throughput", w.key, system, "wal_decoded_ratio", result.wal_decoded_ratio,
                         "WAL decoded / WAL written")
        if exactly_once:
            events = w.transactions(self.sizes.events) * w.events_per_tx
            self.results.add("throughput", w.key, "load alone", "events_per_s", events / result.load_s, "events/s")
            self.decoding_limits(w, *limit_slots)

    def decoding_limits(self, w, peek_slot, recv_slot):
        """Decoding alone (SQL peek) and pg_recvlogical over the WAL of the timed pg_cdc load (the
        two slots were created right before it), run while nothing else is busy."""
        events = w.transactions(self.sizes.events) * w.events_per_tx
        end_lsn = self.conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        t0 = time.monotonic()
        messages = self.conn.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
            "'publication_names', %s)", (peek_slot, PUBLICATIONS)).fetchone()[0]
        peek_s = time.monotonic() - t0
        t0 = time.monotonic()
        subprocess.run([str(self.env.pg_bin / "pg_recvlogical"), "-d", self.env.dsn, "-S", recv_slot, "--start",
                        "-o", "proto_version=1", "-o", f"publication_names={PUBLICATIONS}", "-E", str(end_lsn),
                        "--no-loop", "-f", "/dev/null"], check=True)
        recv_s = time.monotonic() - t0
        drop_slot(self.conn, peek_slot)
        drop_slot(self.conn, recv_slot)
        self.results.add("throughput", w.key, "decoding alone (SQL peek)", "events_per_s", events / peek_s,
                         f"events/s ({messages} pgoutput messages)")
        self.results.add("throughput", w.key, "pg_recvlogical", "events_per_s", events / recv_s, "events/s")

    def throughput_debezium(self, w):
        topic = self.kafka.topic("dbz", w.key.lower())
        try:
            with self.debezium.run(w.key.lower(), topic, w.tables) as capture:
                result = self.timed_load(w, topic, capture)
        except BenchError as e:
            self.results.note(f"Debezium, {w.key}: {e}")
            return
        self.add_load_result(w, "Debezium", result, "JVM + walsender")

    def producer_limit(self, w):
        """Kafka's own producer for as many records as the workload's events, each the average size
        of pg_cdc's events of that workload."""
        size = int(self.results.get("throughput", w.key, "pg_cdc (exactly-once)", "value_bytes"))
        records = w.transactions(self.sizes.events) * w.events_per_tx
        rate = producer_alone(self.env, self.kafka.topic("producer", w.key.lower()), records, size)
        self.results.add("throughput", w.key, "Kafka producer alone", "events_per_s", rate,
                         f"records/s ({size}-byte records)")

    # -- latency ------------------------------------------------------------------------------

    def latency(self):
        script = self.run_dir / "insert_one.sql"
        script.write_text("\\set a random(1, 100000)\n"
                          "INSERT INTO bench_lat (account, amount, status, note) "
                          "VALUES (:a, :a / 100.0, 'pending', repeat('x', 130));\n")
        for rate in self.sizes.rates:
            print(f"latency: {rate} tx/s", flush=True)
            for exactly_once, mode in ((True, "exactly-once"), (False, "at-least-once")):
                topic = self.kafka.topic("lat", "pgcdc", mode, str(rate))
                with self.pg_cdc.sink(f"bench_lat_{rate}", topic, ("bench_lat",), exactly_once,
                                      LATENCY_PG_CDC) as capture:
                    self.fixed_rate(f"pg_cdc ({mode})", topic, pg_cdc_commit_us, rate, script, capture)
            # Debezium both ways: neither setting was the better one at every rate in the runs of
            # 2026-12-06 (bench/results/latency.md); the goals compare with the better of the two.
            for system, short, producer in (("Debezium", "dbz", None), (e2e_report.DBZ0, "dbz0", LATENCY_JAVA)):
                if self.debezium is None:
                    break
                topic = self.kafka.topic("lat", short, str(rate))
                try:
                    with self.debezium.run(f"lat{short}_{rate}", topic, ("bench_lat",),
                                           producer_overrides=producer) as capture:
                        self.fixed_rate(system, topic, debezium_commit_us, rate, script, capture)
                except BenchError as e:
                    self.results.note(f"{system}, latency at {rate} tx/s: {e}")

    def pgbench(self, *args, prefix=()):
        return pgbench(self.env, *args, prefix=prefix)

    def fixed_rate(self, system, topic, commit_us, rate, script, capture):
        """pgbench at `rate` single-row transactions per second (a 3 s warm-up, then the measured
        run); latency of every event of the measured run. Meanwhile samples the private memory of
        the capture's first process and, for pg_cdc, compares the WAL decoded with the WAL written."""
        args = ["-n", "-f", str(script), "-c", "8", "-j", "2", "-R", str(rate)]
        _, warm = self.pgbench_tps(args + ["-T", "3"])
        collector = LatencyCollector(self.kafka, topic, commit_us, since_us=time.time() * 1_000_000)
        collector.start()
        collector.catch_up(warm, timeout=120)
        memory = Sampler(lambda: private_kib(capture.pids[0]), 0.5)
        memory.start()
        with self.env.connect() as probe:
            marks = wal_marks(probe)
            tps, processed = self.pgbench_tps(args + ["-T", str(self.sizes.latency_seconds)])
            try:
                collector.wait_for(processed, timeout=120)
            finally:
                collector.stop()
                memory_kib = memory.stop()
                ratio = decoded_ratio(marks, wal_marks(probe))
        r, wl = self.results, f"{rate} tx/s"
        r.add("latency", wl, system, "achieved_tps", tps, "tx/s (pgbench)")
        for name, values in (("append", collector.append_ms), ("visible", collector.visible_ms)):
            values.sort()
            for p, label in ((50, "p50"), (99, "p99"), (99.9, "p999")):
                r.add("latency", wl, system, f"{name}_{label}_ms", percentile(values, p), "ms")
        r.add("memory", wl, system, "private_median_mib", statistics.median(memory_kib) / 1024, "MiB")
        r.add("memory", wl, system, "private_max_mib", max(memory_kib) / 1024, "MiB")
        if system.startswith("pg_cdc"):
            r.add("latency", wl, system, "wal_decoded_ratio", ratio, "WAL decoded / WAL written")

    # -- steady small load: one sink alone, next to idle sinks, next to more sinks on its table ---

    def steady(self):
        """A steady rate of single-row transactions into one table with one exactly-once Kafka sink:
        that sink alone; next to idle sinks (each on an idle table of its own, one configuration per
        count in sizes.steady_idle); next to 2 more identical sinks on its table; next to seed
        example 1's other two sinks on its table instead. Each configuration runs sizes.steady_repeats
        times, in rounds (every configuration once per round, so a change in the machine's load is
        spread over them); the section "steady_runs" has every run, "steady" the medians."""
        sz, results = self.sizes, self.results
        script = self.run_dir / "steady_insert.sql"
        script.write_text(STEADY_SCRIPT)
        wl = f"{sz.steady_rate} tx/s"
        plain = ([(e2e_report.STEADY_ALONE, "alone", 0, None)]
                 + [(e2e_report.steady_idle_label(n), f"{n}idle", n, None) for n in sz.steady_idle]
                 + [(e2e_report.STEADY_IDENTICAL, "same", 0, "identical"),
                    (e2e_report.STEADY_EXAMPLE, "ex1", 0, "example 1")])
        # Each configuration with each decoding: its sinks decoding their own slots, and sharing one
        # decoding (cdc.shared_decoding), side by side in every round.
        configs = [(e2e_report.shared_label(label) if shared else label, f"{short}{'_sh' if shared else ''}", idle,
                    peers, shared, ())
                   for label, short, idle, peers in plain for shared in sz.steady_shared]
        if sz.steady_reset_caches:
            # What keeping the worker's catalog caches between reads saves: the busy sink alone as
            # every read was before (cdc.test_reset_caches_each_read), in the same rounds.
            configs.append((e2e_report.STEADY_RESET_CACHES, "alone_rc", 0, None, False,
                            ("cdc.test_reset_caches_each_read",)))
        if sz.steady_members_poll and sz.steady_idle and True in sz.steady_shared:
            # What waking the members (and letting the quiet ones sleep) saves: the most idle sinks,
            # sharing one decoding, members polling as before (cdc.test_members_poll_publishes).
            n = max(sz.steady_idle)
            configs.append((e2e_report.steady_members_poll_label(n), f"{n}idle_poll", n, None, True,
                            ("cdc.test_members_poll_publishes",)))
        if sz.steady_only:
            configs = [c for c in configs if c[1] in sz.steady_only]
        runs = {label: [] for label, *_ in configs}
        failed = 0
        tables = steady_tables(self.conn, max(sz.steady_idle, default=0))
        try:
            for rep in range(1, sz.steady_repeats + 1):
                for label, short, idle, peers, shared, test_settings in configs:
                    print(f"steady: {wl}, {label}, run {rep} of {sz.steady_repeats}", flush=True)
                    tag, started = f"{short}_r{rep}", time.monotonic()
                    try:
                        set_shared_decoding(self.conn, shared)
                        set_test_settings(self.conn, test_settings)
                        with self.steady_peers(peers, tag) as peer_sinks:
                            r = steady_run(self.conn, self.env, self.kafka, script, sz.steady_rate,
                                           sz.steady_seconds, idle, peer_sinks, tag, shared)
                    except Exception as e:  # noqa: BLE001 - noted; the other runs still run, the section fails
                        traceback.print_exc()
                        results.note(f"steady {label}, run {rep}: {type(e).__name__}: {e}")
                        failed += 1
                        continue
                    print(f"  ({time.monotonic() - started:.0f} s with setting up and dropping its sinks)", flush=True)
                    if r["restarted"]:
                        results.note(f"steady {label}, run {rep}: a pg_cdc process restarted during the run")
                    runs[label].append(r)
                    for metric, key, unit in STEADY_METRICS:
                        results.add("steady_runs", wl, f"{label} #{rep}", metric, r[key], unit)
        finally:
            set_shared_decoding(self.conn, None)
            set_test_settings(self.conn)
            drop_captured_tables(self.conn, tables)
        for label, rs in runs.items():
            if not rs:
                continue
            for metric, key, unit in STEADY_METRICS:
                results.add("steady", wl, label, metric, statistics.median(r[key] for r in rs), f"{unit} (median)")
            results.add("steady", wl, label, "runs", len(rs), "runs")
            results.add("steady", wl, label, "load_each_run",
                        ", ".join(f"{r['load_start']:.1f}-{r['load_end']:.1f}" for r in rs),
                        "1-min load average at the start-end of each run")
        if failed:
            raise BenchError(f"{failed} steady runs failed (see the notes)")

    @contextlib.contextmanager
    def steady_peers(self, kind, tag):
        """The sinks next to the busy one on the busy table, for steady_run (their cdc_add_sink configs,
        without "tables"). "identical": 2 more with the busy sink's config, each with its own topic.
        "example 1": seed example 1's other two sinks (examples/seed/1_order_pipeline.sql; the busy sink,
        an exactly-once Kafka JSON sink, is its kafka_analytics): kafka_fulfillment, Kafka with format
        avro (the registry stand-in of `make up`), and kinesis_fraud, Kinesis JSON (the local server, a
        stream of 2 shards as scripts/kinesis.sh creates the example's). Removes the Kinesis stream and
        the registry subjects afterwards; steady_run deletes the topics."""
        env, kafka = self.env, self.kafka
        if kind is None:
            yield []
        elif kind == "identical":
            yield [(f"same{i}", "kafka", {"bootstrap_servers": env.bootstrap,
                                          "topic": kafka.topic("steady", tag, f"same{i}"), "exactly_once": True})
                   for i in (1, 2)]
        else:
            fulfillment = kafka.topic("steady", tag, "fulfillment")
            stream = f"bench-{self.run_id}-steady-{tag}-fraud"
            remove_stream = kinesis_stream(stream, shards=2)
            try:
                yield [("fulfillment", "kafka", {"bootstrap_servers": env.bootstrap, "topic": fulfillment,
                                                 "format": "avro", "schema_registry": SCHEMA_REGISTRY}),
                       ("fraud", "kinesis", {"stream_name": stream, "region": "us-east-1", "format": "json"})]
            finally:
                remove_stream()
                delete_subjects(fulfillment)

    # -- source overhead ----------------------------------------------------------------------

    def overhead(self):
        print("overhead: pgbench -i", flush=True)
        self.pgbench("-i", "-q", "-s", str(self.sizes.pgbench_scale))
        modes = ["capture off", "pg_cdc"] + (["Debezium"] if self.debezium is not None else [])
        for section, pinning in (("overhead", None), ("overhead_pinned", Pinning(self.conn, self.env))):
            if pinning:
                pinning.apply()
            try:
                for round_no in range(1, self.sizes.pgbench_rounds + 1):
                    for mode in modes:
                        print(f"{section}: round {round_no}, {mode}", flush=True)
                        try:
                            tps = self.pgbench_with(mode, pinning)
                        except BenchError as e:
                            self.results.note(f"pgbench with {mode}, {section} round {round_no}: {e}")
                            continue
                        self.results.add(section, f"round {round_no}", mode, "tps", tps, "tx/s (pgbench TPC-B)")
            finally:
                if pinning:
                    pinning.undo()

    def pgbench_with(self, mode, pinning):
        """One pgbench TPC-B run (4 changes per transaction) with `mode` capturing the four pgbench
        tables. A capturing system first delivers a short warm-up run; after the timed run it must
        deliver everything, so the next run starts on a quiet machine. With `pinning`, pgbench runs on
        the source's CPU and the capturing processes on the other."""
        self.conn.execute("VACUUM pgbench_branches, pgbench_tellers")
        self.conn.execute("TRUNCATE pgbench_history")
        timed = ["-n", "-c", "4", "-j", "2", "-T", str(self.sizes.pgbench_seconds)]
        prefix = pinning.prefix if pinning else []
        if mode == "capture off":
            return self.pgbench_tps(timed, prefix)[0]
        topic = self.kafka.topic("pgbench", mode.lower().replace("_", ""), uuid.uuid4().hex[:4])
        if mode == "pg_cdc":
            for t in PGBENCH_TABLES:
                config = '{"operations": ["INSERT"]}' if t == "pgbench_history" else "{}"
                self.conn.execute("SELECT cdc_enable(%s, %s)", (t, config))
            system = self.pg_cdc.sink(f"bench_pgbench_{uuid.uuid4().hex[:6]}", topic, PGBENCH_TABLES)
        else:
            system = self.debezium.run(f"pgbench_{uuid.uuid4().hex[:6]}", topic, PGBENCH_TABLES)
        counter = Counter(self.kafka, topic)
        try:
            with system as capture:
                if pinning:
                    pinning.pin_capture(capture.pids)
                _, warm = self.pgbench_tps(["-n", "-c", "1", "-t", "200"], prefix)
                counter.wait_for(4 * warm, timeout=120)
                tps, transactions = self.pgbench_tps(timed, prefix)
                counter.wait_for(4 * (warm + transactions), timeout=300)
        finally:
            counter.close()
            if mode == "pg_cdc":
                for t in PGBENCH_TABLES:
                    self.conn.execute("SELECT cdc_disable(%s)", (t,))
        return tps

    def pgbench_tps(self, args, prefix=()):
        return pgbench_tps(self.env, args, prefix)

    # -- one large transaction ----------------------------------------------------------------

    def memory(self):
        rows = self.sizes.big_rows
        print(f"memory: one transaction of {rows} rows", flush=True)
        topic = self.kafka.topic("big")
        counter = Counter(self.kafka, topic)
        try:
            with self.pg_cdc.sink("bench_big", topic, ("bench_big",)) as capture:
                self.conn.execute("INSERT INTO bench_big (id, note) VALUES (0, 'warm-up')")
                counter.wait_for(1, timeout=60)
                sampler = Sampler(lambda: private_kib(capture.pids[0]), 0.1)
                sampler.start()
                t0 = time.monotonic()
                self.conn.execute("INSERT INTO bench_big (id, account, amount, status, note) "
                                  "SELECT g, g %% 1000, (g %% 100000) / 100.0, 'pending', repeat('x', 130) "
                                  "FROM generate_series(1, %s) g", (rows,))
                committed = time.monotonic() - t0
                done = counter.wait_for(rows + 1, timeout=600)
                samples = sampler.stop()
        finally:
            counter.close()
        r, wl = self.results, f"{rows}-row tx"
        r.add("memory", wl, "pg_cdc (exactly-once)", "private_before_mib", samples[0] / 1024, "MiB")
        r.add("memory", wl, "pg_cdc (exactly-once)", "private_max_mib", max(samples) / 1024, "MiB")
        r.add("memory", wl, "pg_cdc (exactly-once)", "commit_s", committed, "s (INSERT ... SELECT to COMMIT)")
        r.add("memory", wl, "pg_cdc (exactly-once)", "delivered_s", done - t0, "s (INSERT start to last event seen)")
        r.series["big_tx_memory"] = sampler.samples

    def backlog(self):
        """A backlog of sizes.backlog_changes inserts (transactions of 1,000 rows) written while the
        sinks are held (they wait for a lock on _cdc_sinks at their next pass, as a stopped worker
        would leave them), then read: one exactly-once Kafka sink, and three identical ones on the
        same table, each with the sinks decoding their own slots and sharing one decoding. From the
        release to the last event visible (read_committed) in every sink's topic: seconds, events
        per second per sink, CPU of every pg_cdc process per 100k events delivered, and the largest
        private memory of any pg_cdc process (sampled every 0.2 s). The clock stops when pg_cdc counted
        every event delivered; each topic is then read back (read_committed) to check it holds them."""
        n = self.sizes.backlog_changes
        wl = f"{n:,} changes"
        captured_table(self.conn, BACKLOG_TABLE, "id bigint PRIMARY KEY, note text")
        try:
            for label, count, shared in BACKLOG_CONFIGS:
                if shared not in self.sizes.steady_shared:
                    continue
                print(f"backlog: {wl}, {label}", flush=True)
                for metric, (value, unit) in self.backlog_run(n, count, shared).items():
                    self.results.add("backlog", wl, label, metric, value, unit)
        finally:
            set_shared_decoding(self.conn, None)
            drop_captured_tables(self.conn, [BACKLOG_TABLE])

    def backlog_run(self, n, count, shared):
        conn, kafka = self.conn, self.kafka
        set_shared_decoding(conn, shared)
        conn.execute(f"TRUNCATE {BACKLOG_TABLE}")
        names = [f"bench_backlog_{i}" for i in range(count)]
        topics = [kafka.topic("backlog", str(count), "sh" if shared else "own", str(i)) for i in range(count)]
        counters, added = [], []
        try:
            for name, topic in zip(names, topics):
                conn.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)", (name, json.dumps(
                    {"bootstrap_servers": self.env.bootstrap, "topic": topic, "tables": [BACKLOG_TABLE],
                     "exactly_once": True})))
                added.append(name)
            wait_sinks_running(conn, names, 120)
            counters = [Counter(kafka, t) for t in topics]
            # Warm-up rows until every sink delivered one (and, shared, reads the log: a new sink
            # decodes its own slot until its position is one the log serves).
            warm = 0
            deadline = time.monotonic() + 180
            while True:
                conn.execute(f"INSERT INTO {BACKLOG_TABLE} VALUES (%s, 'warm-up')", (-1 - warm,))
                warm += 1
                for c in counters:
                    c.wait_for(warm, timeout=60)
                if not shared or all_reading_shared_log(conn, names):
                    break
                if time.monotonic() > deadline:
                    raise BenchError("the sinks did not read the shared decoding's log within 180 s")
                time.sleep(0.5)
            with self.env.connect() as holder:
                holder.execute("BEGIN")
                holder.execute("LOCK TABLE _cdc_sinks IN ACCESS EXCLUSIVE MODE")
                wait_until(lambda: conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_cdc worker' "
                    "AND wait_event_type = 'Lock'").fetchone()[0] == count, 60, "the sinks held")
                with self.env.connect() as writer:
                    writer.execute(
                        f"DO $$ BEGIN FOR i IN 0..{n // 1000 - 1} LOOP "
                        f"INSERT INTO {BACKLOG_TABLE} SELECT i * 1000 + g, repeat('x', 100) "
                        f"FROM generate_series(0, 999) g; COMMIT; END LOOP; END $$")
                pids = capture_pids(conn)
                cpu0 = cpu_seconds(pids)
                sampler = Sampler(lambda: max((m for m in map(private_kib, pids) if m is not None), default=None), 0.2)
                sampler.start()
                t0 = time.monotonic()
                holder.execute("COMMIT")
            # The clock stops when pg_cdc has counted every event delivered (its Kafka transactions
            # committed): reading three topics of 5,000,000 events back with one Python consumer each
            # takes longer than pg_cdc takes to write them. The topics are read back afterwards, to
            # check that each holds every event.
            target = warm + n // 1000 * 1000
            try:
                wait_until(lambda: all((delivered(conn, name) or 0) >= target for name in names), 3600,
                           "every sink to deliver the backlog")
                done = time.monotonic()
            finally:
                memory = sampler.stop()
            elapsed = done - t0
            cpu = cpu_seconds(pids) - cpu0
            for c in counters:
                c.wait_for(target, timeout=600)
            delivered_events = count * (n // 1000 * 1000)
            return {"drain_s": (elapsed, "s (release to every event delivered by every sink)"),
                    "events_per_s": ((n // 1000 * 1000) / elapsed, "events/s per sink"),
                    "cpu_s_per_100k": (cpu * 100_000 / delivered_events,
                                       "CPU s per 100k events delivered (every pg_cdc process)"),
                    "cores": (cpu / elapsed, "cores (every pg_cdc process)"),
                    "max_private_mib": (max(memory, default=0) / 1024, "MiB (the largest pg_cdc process)"),
                    "processes": (len(pids), "pg_cdc processes")}
        finally:
            for c in counters:
                c.close()
            drop_sinks_and_topics(conn, kafka, added, topics)

    # -- driver -------------------------------------------------------------------------------

    def run(self):
        """Runs the chosen sections; a section that fails is reported (traceback on stderr, a note in
        the report) and the others still run. Returns False if any failed."""
        started = time.monotonic()
        started_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        self.setup()
        ok = True
        try:
            for section in SECTIONS:
                if section not in self.sections:
                    continue
                try:
                    getattr(self, section)()
                except Exception as e:  # noqa: BLE001 - reported, and the run exits non-zero
                    traceback.print_exc()
                    self.results.note(f"section {section} failed: {type(e).__name__}: {e}")
                    ok = False
        finally:
            self.teardown()
        s = self.results.settings
        s["machine"]["load average at end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        s["run"] = {"started": started_at,
                    "duration": f"{(time.monotonic() - started) / 60:.1f} min", "sections": ", ".join(self.sections),
                    **{k: str(v) for k, v in vars(self.sizes).items()}}
        return ok


def foreign_capture(conn):
    """What, besides the benchmark's own bench_* objects, would decode or publish the benchmark's
    load: pg_cdc sinks (every sink captures every captured table unless `tables` limits it, and
    every slot decodes all WAL) and logical replication slots some other client streams from.
    Returns one line per finding, with the statement that removes it."""
    found, cdc_slots = [], set()
    if conn.execute("SELECT to_regclass('_cdc_sinks') IS NOT NULL").fetchone()[0]:
        for name, state, slot in conn.execute("SELECT sink_name, state, slot_name FROM _cdc_sinks ORDER BY 1").fetchall():
            cdc_slots.add(slot)
            if not name.startswith("bench_"):
                found.append(f"pg_cdc sink {name!r} ({state}): SELECT cdc_drop_sink('{name}');")
    for slot, pid in conn.execute(
            "SELECT slot_name, active_pid FROM pg_replication_slots WHERE slot_type = 'logical' AND active "
            "ORDER BY 1").fetchall():
        if slot not in cdc_slots and not slot.startswith("bench_"):
            found.append(f"logical replication slot {slot!r} in use by process {pid}: "
                         f"SELECT pg_terminate_backend({pid}); SELECT pg_drop_replication_slot('{slot}');")
    return found


def refuse_a_busy_cluster(env):
    """Stops before anything is measured when the cluster has capture the benchmark did not create:
    it would decode and publish the benchmark's tables too (measured once: 42k instead of 199k
    events/s with three sinks left over from tests and the demo), and every figure would be wrong."""
    with psycopg.connect(env.dsn, autocommit=True) as conn:
        found = foreign_capture(conn)
    if found:
        raise SystemExit("bench-e2e: refusing to run on a cluster with capture the benchmark did not create "
                         "(it would capture the benchmark's load too and skew every figure):\n  "
                         + "\n  ".join(found) + "\nDrop them (or run on a fresh cluster: make down; rm -rf "
                         f"{env.run_root}; make up), then run the benchmark again.")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: about 7 minutes instead of 35")
    parser.add_argument("--rows", type=int, help="events per throughput measurement (default 300000, quick 50000)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    parser.add_argument("--steady-repeats", type=int,
                        help="runs of each configuration of the steady section (default 3, quick 1)")
    parser.add_argument("--shared-decoding", choices=("off", "on", "both"), default="both",
                        help="steady section: cdc.shared_decoding off, on, or each configuration both ways (default)")
    parser.add_argument("--backlog-changes", type=int,
                        help="backlog section: inserts written while the sinks are held (default 5000000, quick 500000)")
    parser.add_argument("--steady-idle", help="steady section: the counts of idle sinks, comma-separated "
                        "(default 20,50)")
    parser.add_argument("--steady-configs", help="steady section: only these configurations, comma-separated short "
                        "names (alone, 20idle, 50idle, same, ex1, each with _sh when sharing one decoding, "
                        "alone_rc, 50idle_poll; default: all)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where e2e.md/csv/png go")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.rows:
        sizes = Sizes(**{**vars(sizes), "events": args.rows})
    if args.steady_repeats:
        sizes = Sizes(**{**vars(sizes), "steady_repeats": args.steady_repeats})
    if args.backlog_changes:
        sizes = Sizes(**{**vars(sizes), "backlog_changes": args.backlog_changes})
    if args.steady_idle:
        try:
            idle = tuple(int(n) for n in args.steady_idle.split(",") if n)
        except ValueError:
            parser.error(f"--steady-idle {args.steady_idle}: expected counts such as 5,10")
        sizes = Sizes(**{**vars(sizes), "steady_idle": idle})
    if args.shared_decoding != "both":
        sizes = Sizes(**{**vars(sizes), "steady_shared": (args.shared_decoding == "on",)})
    if args.steady_configs:
        sizes = Sizes(**{**vars(sizes), "steady_only": tuple(c for c in args.steady_configs.split(",") if c)})
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    env = Env.from_environ()
    refuse_a_busy_cluster(env)
    bench = Bench(env, sizes, args.out, sections)
    ok = bench.run()
    e2e_report.write(bench.results, args.out, sizes, args.quick)
    if not ok:
        raise SystemExit("some sections failed: see the notes in the report")


if __name__ == "__main__":
    main()
