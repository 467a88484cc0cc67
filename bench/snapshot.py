"""An initial snapshot: how fast one exactly-once Kafka sink delivers the rows a table holds as READ
events, against the limits of the machine and Debezium's initial snapshot of the same table, and the
memory it takes (issue 16, deliverable 7).

A table of ROWS rows (~200 bytes each) is filled and analyzed; then, one after the other:
- `COPY table TO '/dev/null'` (server side): the rows read and formatted, nothing sent;
- pg_cdc: cdc_add_sink with the default snapshot_mode initial; elapsed = cdc_add_sink -> the sink's
  snapshot done (`_cdc_snapshots`) and every row delivered (cdc_delivery_status); the sink worker's
  private memory (smaps_rollup, every 0.5 s) and the CPU of every pg_cdc process;
- writes next to it: a second connection inserts one row per transaction into the table every 10 ms,
  for 5 s before the sink is added (the baseline) and all through pg_cdc's snapshot; their latency
  says whether the snapshot blocked or slowed a write (issue 16's goal: no write blocked). The
  inserted rows are delivered too (as READ or INSERT events) and deleted before Debezium runs;
- Kafka's own producer (ProducerPerformance) for as many records of the size pg_cdc's events had;
- Debezium 3.6.1 (the embedded engine harness of bench-e2e, bench/debezium) with snapshot.mode initial:
  elapsed = the JVM started -> every row visible to a read_committed consumer of its topic; CPU and
  memory of the JVM (the backend serving its SELECT is not counted; pg_cdc reads in its own process).
  `--no-debezium` leaves it out.

    $PG_CDC_VENV/bin/python bench/snapshot.py [--rows 1000000] [--chunk 8192] [--no-debezium] [--out bench/results]

Needs `make up` and a quiet cluster (no other sinks). Writes snapshot.md and prints it."""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_bench import (BenchError, Counter, Debezium, Sampler, capture_pids, captured_table, cpu_seconds,  # noqa: E402
                       delivered, drop_captured_tables, drop_sinks, percentile, private_kib, producer_alone,
                       quiet_start, wait_until, write_report)

TABLE = "snapshot_bench"
SINK = "snapshot_bench"
BASELINE_S = 5


class Writes:
    """Inserts one row per transaction into the bench table every 10 ms on a connection of its own
    (ids above the table's), and keeps each insert's latency in ms, per phase."""

    def __init__(self, env, first_id):
        self.conn = env.connect()
        self.pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        self.next_id = first_id
        self.phase = "baseline"
        self.latencies = {"baseline": [], "snapshot": []}
        self.sampler = Sampler(self.insert, 0.01)
        # Whether the writer's backend waits for a lock, looked at every 20 ms from another connection.
        self.watch = env.connect()
        self.lock_waits = Sampler(lambda: self.watch.execute(
            "SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' FROM pg_stat_activity WHERE pid = %s",
            (self.pid,)).fetchone()[0], 0.02)

    def insert(self):
        t = time.monotonic()
        self.conn.execute(f"INSERT INTO {TABLE} VALUES (%s, 0, 0, 'write')", (self.next_id,))
        self.latencies[self.phase].append((time.monotonic() - t) * 1000)
        self.next_id += 1

    def inserted(self):
        return sum(len(v) for v in self.latencies.values())

    def start(self):
        self.sampler.start()
        self.lock_waits.start()

    def stop(self):
        """Stops writing; returns (samples that saw the writer waiting for a lock, samples)."""
        self.sampler.stop()
        waits = self.lock_waits.stop()
        self.conn.close()
        self.watch.close()
        return sum(waits), len(waits)

    def summary(self, phase):
        v = sorted(self.latencies[phase])
        return (f"{len(v):,} inserts, p50 {percentile(v, 50):.1f} ms, p99 {percentile(v, 99):.1f} ms, "
                f"max {v[-1]:.1f} ms" if v else "no insert")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=8192, help="snapshot_chunk_size")
    ap.add_argument("--no-debezium", action="store_true", help="leave Debezium's initial snapshot out")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args()
    env, kafka, conn = quiet_start("snapshot")
    captured_table(conn, TABLE, "id bigint PRIMARY KEY, account int, amount numeric(12,2), pad text")
    started, load0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    slot = None
    try:
        conn.execute(f"INSERT INTO {TABLE} SELECT g, g % 1000, g / 100.0, repeat('x', 150) "
                     f"FROM generate_series(1, {a.rows}) g")
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        size = conn.execute(f"SELECT pg_table_size('{TABLE}')").fetchone()[0]
        t = time.monotonic()
        conn.execute(f"COPY {TABLE} TO '/dev/null'")
        copy_s = time.monotonic() - t

        cfg = {"bootstrap_servers": env.bootstrap, "topic": kafka.topic("snapshot"), "tables": [TABLE],
               "exactly_once": True, "snapshot_chunk_size": a.chunk}
        writes = Writes(env, a.rows + 1)
        writes.start()
        time.sleep(BASELINE_S)
        writes.phase = "snapshot"
        t0 = time.monotonic()
        conn.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)", (SINK, json.dumps(cfg)))
        slot = conn.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (SINK,)).fetchone()[0]
        pids = capture_pids(conn)
        worker = pids[0]
        cpu0 = cpu_seconds(pids)
        memory = Sampler(lambda: private_kib(worker), 0.5)
        memory.start()
        # Every row, and every insert made so far, delivered (as a READ or an INSERT).
        wait_until(lambda: (delivered(conn, SINK) or 0) >= a.rows + writes.inserted(), 3600, "every row delivered")
        elapsed, cpu = time.monotonic() - t0, cpu_seconds(pids) - cpu0
        mem = sorted(m / 1024 for m in memory.stop())
        lock_waits, lock_samples = writes.stop()
        conn.execute(f"DELETE FROM {TABLE} WHERE id > %s", (a.rows,))
        conn.execute(f"VACUUM {TABLE}")
        wait_until(lambda: conn.execute("SELECT bool_and(s.state = 'done') FROM _cdc_snapshots s JOIN _cdc_sinks k "
                                        "USING (sink_id) WHERE k.sink_name = %s", (SINK,)).fetchone()[0], 60,
                   "the snapshot done")
        st = conn.execute("SELECT cdc_delivery_status(%s)->'delivered'", (SINK,)).fetchone()[0]
        record = int(st["bytes"] / max(st["events"], 1))
        producer = producer_alone(env, kafka.topic("producer"), a.rows, record)
        kafka.created.append("pg_cdc.progress." + slot.removeprefix("_cdc_"))
        drop_sinks(conn, [SINK])  # Debezium runs alone
        slot = None
        dbz = None if a.no_debezium else debezium_snapshot(env, kafka, conn, a.rows)
    finally:
        if slot:
            kafka.created.append("pg_cdc.progress." + slot.removeprefix("_cdc_"))
            drop_sinks(conn, [SINK])
        drop_captured_tables(conn, [TABLE])
        kafka.delete(kafka.created)
    load1 = os.getloadavg()
    rate, copy_rate = a.rows / elapsed, a.rows / copy_s
    limit = min(copy_rate, producer)
    lines = [
        "# An initial snapshot",
        "",
        f"`bench/snapshot.py`, started {started}, one run, 2 shared cores (load average {load0[0]:.2f} at the start, "
        f"{load1[0]:.2f} at the end). A table of {a.rows:,} rows ({size / 2**20:,.0f} MiB), captured, nothing "
        f"else running; one exactly-once Kafka sink added with the default snapshot_mode initial "
        f"(snapshot_chunk_size {a.chunk}). Elapsed = cdc_add_sink -> every row delivered as a READ event "
        "(cdc_delivery_status). CPU: every pg_cdc process over it. Memory: the sink worker's private memory "
        "(smaps_rollup), every 0.5 s.",
        "",
        "| | rows/s | of the limit |",
        "|---|---:|---:|",
        f"| pg_cdc snapshot to Kafka (exactly-once) | {rate:,.0f} | {rate / limit:.0%} |",
        f"| `COPY {TABLE} TO '/dev/null'` (server side) | {copy_rate:,.0f} | |",
        f"| Kafka producer alone ({record}-byte records) | {producer:,.0f} | |",
        "",
        f"Limit = min(COPY, producer alone) = {limit:,.0f} rows/s. pg_cdc: {elapsed:.1f} s, {cpu:.1f} CPU s "
        f"({cpu / a.rows * 100_000:.2f} per 100k rows), worker private memory median / max "
        f"{mem[len(mem) // 2]:.1f} / {mem[-1]:.1f} MiB.",
        "",
        f"Writes next to it (one-row INSERTs into the same table every 10 ms, own connection): {BASELINE_S} s before "
        f"the sink, {writes.summary('baseline')}; during pg_cdc's snapshot, {writes.summary('snapshot')}. "
        f"The writer's backend was seen waiting for a lock in {lock_waits} of {lock_samples:,} samples "
        "(pg_stat_activity, every 20 ms, from the baseline on).",
    ]
    if isinstance(dbz, dict):
        at = next(i for i, line in enumerate(lines) if line.startswith("| pg_cdc snapshot")) + 1
        lines[at:at] = [f"| Debezium 3.6.1 initial snapshot to Kafka | {dbz['rate']:,.0f} | {dbz['rate'] / limit:.0%} |"]
        lines += ["", f"pg_cdc / Debezium: {rate / dbz['rate']:.2f}x (goal: 3x). Debezium: {dbz['elapsed']:.1f} s from "
                  f"its JVM's start, {dbz['cpu']:.1f} CPU s of the JVM ({dbz['cpu'] / a.rows * 100_000:.2f} per 100k rows; "
                  "the backend serving its SELECT not counted), JVM private memory median / max "
                  f"{dbz['mib_median']:.0f} / {dbz['mib_max']:.0f} MiB (-Xmx1g), {dbz['record']}-byte records, "
                  "delivered at least once (its Kafka producer as in bench-e2e: idempotent, acks all)."]
    elif dbz is not None:
        lines += ["", f"Debezium's initial snapshot could not be measured in this run: {dbz}"]
    write_report(a.out, "snapshot.md", lines)


def debezium_snapshot(env, kafka, conn, rows):
    """Debezium's initial snapshot of the bench table into one topic: rows/s from the JVM's start
    to every row visible (read_committed), the JVM's CPU and memory. Returns a dict, or the reason
    it could not be measured (a string)."""
    bench = SimpleNamespace(env=env, conn=conn, run_dir=Path(tempfile.mkdtemp(prefix="bench-snapshot-")))
    dbz = Debezium(bench)
    try:
        dbz.build()
        topic = kafka.topic("dbz-snapshot")
        counter = Counter(kafka, topic)
        t0 = time.monotonic()
        with dbz.run("snapshot", topic, (TABLE,), {"snapshot.mode": "initial"}, streaming=False) as capture:
            jvm = capture.pids[0]
            memory = Sampler(lambda: private_kib(jvm), 0.5)
            memory.start()
            try:
                end = counter.wait_for(rows, 3600)
            finally:
                mem = sorted(m / 1024 for m in memory.stop()) or [0.0]
            cpu = cpu_seconds([jvm])
        counter.close()
        elapsed = end - t0
        return {"rate": rows / elapsed, "elapsed": elapsed, "cpu": cpu, "record": int(counter.value_bytes / rows),
                "mib_median": mem[len(mem) // 2], "mib_max": mem[-1]}
    except BenchError as e:
        return str(e)


if __name__ == "__main__":
    main()
