"""A busy sink next to idle ones, side by side in one run: what many sinks cost the one that works.

pgbench commits single-row INSERTs at a steady rate (2,000 tx/s by default) into one table that one
exactly-once Kafka sink captures. Measured twice: that sink alone, then with N more Kafka sinks (20 by
default), each on an idle table of its own. Reports the busy sink's end-to-end latency (commit time
-> visible to a read_committed consumer, p50 and p99) and the CPU of every pg_cdc process (the
launcher and each sink's worker, utime + stime from /proc) as cores over the run.

    $PG_CDC_VENV/bin/python bench/idle_sinks.py [--rate 2000] [--idle 20] [--seconds 20] [--out bench/results]

Needs `make up` and a quiet cluster (no other sinks). Writes idle_sinks.md and prints it."""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_bench import (LatencyCollector, cpu_seconds, drop_sinks, percentile, pg_cdc_commit_us, private_kib,  # noqa: E402
                       quiet_start, wait_until, write_report)

PIDS = "SELECT pid FROM pg_stat_activity WHERE backend_type IN ('pg_cdc worker', 'pg_cdc launcher')"


def pgbench(env, script, rate, seconds):
    out = subprocess.run([str(env.pg_bin / "pgbench"), "-h", env.pg_host, "-p", env.pg_port, "-U", env.pg_user,
                          "-n", "-f", str(script), "-c", "8", "-j", "2", "-R", str(rate), "-T", str(seconds), env.pg_db],
                         capture_output=True, text=True, check=True).stdout
    return int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))


def add_sink(conn, env, name, topic, table):
    cfg = {"bootstrap_servers": env.bootstrap, "topic": topic, "tables": [table], "exactly_once": True}
    conn.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)", (name, json.dumps(cfg)))


def measure(conn, env, kafka, script, a, idle):
    tag = f"{idle}idle"
    busy_topic = kafka.topic("idle", tag, "busy")
    names = [f"idle_bench_busy_{tag}"]
    add_sink(conn, env, names[0], busy_topic, "idle_bench_busy")
    for i in range(idle):
        names.append(f"idle_bench_{tag}_{i}")
        add_sink(conn, env, names[-1], kafka.topic("idle", tag, str(i)), f"idle_bench_t{i}")
    try:
        wait_until(lambda: conn.execute("SELECT count(*) FROM _cdc_sinks WHERE state = 'running'").fetchone()[0]
                   == len(names), 120, "every sink running")
        pgbench(env, script, a.rate, 3)  # warm-up
        collector = LatencyCollector(kafka, busy_topic, pg_cdc_commit_us, since_us=time.time() * 1_000_000)
        collector.start()
        pids = [r[0] for r in conn.execute(PIDS).fetchall()]
        cpu0, t0 = cpu_seconds(pids), time.monotonic()
        processed = pgbench(env, script, a.rate, a.seconds)
        try:
            collector.wait_for(processed, timeout=180)
        finally:
            collector.stop()
        elapsed, cpu = time.monotonic() - t0, cpu_seconds(pids) - cpu0
        visible = sorted(collector.visible_ms)
        workers = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_cdc worker'")]
        memory = sorted(m / 1024 for m in map(private_kib, workers) if m is not None) or [0.0]
        return {"sinks": len(names), "processes": len(pids), "events": processed,
                "p50": percentile(visible, 50), "p99": percentile(visible, 99),
                "cores": cpu / elapsed, "cpu_per_100k": cpu / max(processed, 1) * 100_000,
                "mib_median": memory[len(memory) // 2], "mib_total": sum(memory)}
    finally:
        drop_sinks(conn, names)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--idle", type=int, default=20)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args()
    env, kafka, conn = quiet_start("idle_sinks")
    tables = ["idle_bench_busy"] + [f"idle_bench_t{i}" for i in range(a.idle)]
    for t in tables:
        conn.execute(f"DROP TABLE IF EXISTS {t}")
    conn.execute("CREATE TABLE idle_bench_busy (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int, "
                 "note text, created_at timestamptz DEFAULT now())")
    for i in range(a.idle):
        conn.execute(f"CREATE TABLE idle_bench_t{i} (id int PRIMARY KEY, v text)")
    for t in tables:
        conn.execute("SELECT cdc_enable(%s, '{}')", (t,))
    script = Path(env.run_root) / "idle_sinks_insert.sql"
    script.write_text("\\set a random(1, 100000)\n"
                      "INSERT INTO idle_bench_busy (account, note) VALUES (:a, repeat('x', 130));\n")
    try:
        alone = measure(conn, env, kafka, script, a, 0)
        crowded = measure(conn, env, kafka, script, a, a.idle)
    finally:
        for t in tables:
            conn.execute("SELECT cdc_disable(%s)", (t,))
            conn.execute(f"DROP TABLE {t}")
        kafka.delete(kafka.created + [t for t in kafka.admin.list_topics(timeout=15).topics
                                      if t.startswith("pg_cdc.progress.")])
    lines = [
        "# A busy sink next to idle ones",
        "",
        f"pgbench at {a.rate:,} single-row INSERTs/s for {a.seconds} s into one table with one exactly-once Kafka "
        f"sink; then the same with {a.idle} more Kafka sinks, each on an idle table of its own. Latency: commit -> "
        "visible to a read_committed consumer (ms resolution of the event's commit timestamp). CPU: every pg_cdc "
        f"process (launcher and sink workers). Generated by `bench/idle_sinks.py`; one run, "
        f"{time.strftime('%Y-%m-%d')}, 2 shared cores.",
        "",
        "| run | sinks | pg_cdc processes | events | p50 ms | p99 ms | pg_cdc cores | CPU s per 100k events "
        "| sink worker private MiB (median / all) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in (("busy sink alone", alone), (f"with {a.idle} idle sinks", crowded)):
        lines.append(f"| {name} | {r['sinks']} | {r['processes']} | {r['events']:,} | {r['p50']:.0f} | {r['p99']:.0f} | "
                     f"{r['cores']:.2f} | {r['cpu_per_100k']:.1f} | {r['mib_median']:.0f} / {r['mib_total']:.0f} |")
    lines += ["", f"p99 with idle sinks / alone: {crowded['p99'] / max(alone['p99'], 1e-9):.2f}x; "
              f"cores with idle sinks / alone: {crowded['cores'] / max(alone['cores'], 1e-9):.2f}x."]
    write_report(a.out, "idle_sinks.md", lines)


if __name__ == "__main__":
    main()
