"""A backlog drained: how fast one exactly-once Kafka sink catches up with millions of changes it has
not read yet, how much WAL it decodes for them, and the memory it takes (issue 17, deliverable 6).

The sink delivers a warm-up row; then its worker is held at its next catalog read (a session holds
an ACCESS EXCLUSIVE lock on `_cdc_sinks`, as the e2e tests' `hold_worker` does) while one
server-side loop commits ROWS rows (~200 bytes, transactions of 10, synchronous_commit off). The
lock is released and the clock starts: elapsed = release -> the sink's last event delivered (from
cdc_delivery_status). Reports events/s, WAL decoded by the sink's session per WAL written during the
load, the CPU of every pg_cdc process over the drain, and the sink worker's private memory
(/proc/PID/smaps_rollup, sampled every 0.5 s: median and max).

    $PG_CDC_VENV/bin/python bench/backlog.py [--rows 5000000] [--out bench/results]

Needs `make up` and a quiet cluster (no other sinks). Writes backlog.md and prints it."""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_bench import (Sampler, capture_pids, captured_table, cpu_seconds, delivered, drop_captured_tables,  # noqa: E402
                       drop_sinks, progress_topic, private_kib, quiet_start, wait_until, wal_marks, write_report)

TABLE = "backlog_bench"
SINK = "backlog_bench"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args()
    env, kafka, conn = quiet_start("backlog")
    captured_table(conn, TABLE, "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, pad text")
    started, load0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    cfg = {"bootstrap_servers": env.bootstrap, "topic": kafka.topic("backlog"), "tables": [TABLE],
           "exactly_once": True}
    conn.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)", (SINK, json.dumps(cfg)))
    slot = conn.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (SINK,)).fetchone()[0]
    try:
        conn.execute(f"INSERT INTO {TABLE} (pad) VALUES ('warm-up')")
        wait_until(lambda: delivered(conn, SINK) == 1, 120, "the warm-up row")
        worker = capture_pids(conn)[0]
        marks0 = wal_marks(conn)  # (it reads _cdc_sinks: before the lock)
        holder = env.connect()
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE _cdc_sinks IN ACCESS EXCLUSIVE MODE")
        wait_until(lambda: conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                        (worker,)).fetchone() == ("Lock",), 60, "the sink worker held")
        t_load = time.monotonic()
        conn.execute("SET synchronous_commit = off")
        conn.execute(f"DO $$ BEGIN FOR i IN 1..{a.rows // 10} LOOP INSERT INTO {TABLE} (pad) "
                     f"SELECT repeat('x', 180) FROM generate_series(1, 10); COMMIT; END LOOP; END $$")
        conn.execute("RESET synchronous_commit")
        load_s = time.monotonic() - t_load
        written = conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8").fetchone()[0] - marks0[1]
        pids = capture_pids(conn)
        memory = Sampler(lambda: private_kib(worker), 0.5)
        cpu0, t0 = cpu_seconds(pids), time.monotonic()
        memory.start()
        holder.execute("COMMIT")
        holder.close()
        wait_until(lambda: delivered(conn, SINK) >= a.rows + 1, 1800, "the backlog drained")
        elapsed, cpu = time.monotonic() - t0, cpu_seconds(pids) - cpu0
        mem = sorted(m / 1024 for m in memory.stop())
        marks1 = wal_marks(conn)
        sessions = conn.execute("SELECT (cdc_delivery_status(%s)->'decoding'->>'sessions_started')::int",
                                (SINK,)).fetchone()[0]
    finally:
        kafka.created.append(progress_topic(slot))
        drop_sinks(conn, [SINK])
        drop_captured_tables(conn, [TABLE])
        kafka.delete(kafka.created)
    load1 = os.getloadavg()
    decoded = marks1[0] - marks0[0]
    lines = [
        "# A backlog drained",
        "",
        f"`bench/backlog.py`, started {started}, one run, 2 shared cores (load average {load0[0]:.2f} at the start, "
        f"{load1[0]:.2f} at the end). One exactly-once Kafka sink on one table; its worker held while one "
        f"server-side loop committed {a.rows:,} rows of ~200 bytes in transactions of 10 (synchronous_commit off, "
        f"{load_s:.0f} s, {written / 2**20:,.0f} MiB of WAL); then released. Elapsed = release -> the sink's last "
        "event delivered (cdc_delivery_status). CPU: every pg_cdc process over the drain. Memory: the sink "
        "worker's private memory (smaps_rollup), every 0.5 s during the drain.",
        "",
        "| changes | WAL written | elapsed s | events/s | WAL decoded / written | WAL decoded per change | "
        "decoding sessions | pg_cdc CPU s | CPU s per 100k events | worker MiB median / max |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {a.rows:,} | {written / 2**20:,.0f} MiB | {elapsed:.1f} | {a.rows / elapsed:,.0f} | "
        f"{decoded / max(written, 1):.2f}x | {decoded / a.rows:.0f} B | {sessions} | {cpu:.1f} | "
        f"{cpu / a.rows * 100_000:.2f} | {mem[len(mem) // 2]:.1f} / {mem[-1]:.1f} |",
        "",
        "WAL decoded counts from the sink worker's first read after the release (its session was open "
        "before: the warm-up row), so 1.00x means every record of the backlog was decoded once.",
    ]
    write_report(a.out, "backlog.md", lines)


if __name__ == "__main__":
    main()
