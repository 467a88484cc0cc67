"""Several sinks on one table (seed example 1 has three), side by side in one run: what each more
sink on the same table costs, and whether sharing one decoding among them would pay.

One server-side loop commits ROWS rows (transactions of 10 rows, ~200-byte rows,
synchronous_commit off) into one captured table, once with one exactly-once Kafka sink on it and
once with SINKS of them. Each sink keeps its own slot and decoding session, so each decodes the same
WAL. Reports, per run: each sink's events/s (rows / (load start -> its last event delivered, from
cdc_delivery_status)), the total, the CPU of every pg_cdc process (utime + stime from /proc) per
100,000 source rows and per 100,000 delivered events, and the WAL the sinks decoded per WAL written
(SINKS x 1.0 when each decodes every record once).

    $PG_CDC_VENV/bin/python bench/shared_table.py [--rows 200000] [--sinks 3] [--out bench/results]

Needs `make up` and a quiet cluster (no other sinks). Writes shared_table.md and prints it."""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_bench import (capture_pids, captured_table, cpu_seconds, delivered, drop_captured_tables,  # noqa: E402
                       drop_sinks, progress_topic, quiet_start, wait_until, wal_marks, write_report)

TABLE = "shared_bench"


def measure(conn, env, kafka, rows, sinks):
    names = [f"shared_bench_{sinks}_{i}" for i in range(sinks)]
    for n in names:
        cfg = {"bootstrap_servers": env.bootstrap, "topic": kafka.topic("shared", str(sinks), n[-1]),
               "tables": [TABLE], "exactly_once": True}
        conn.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)", (n, json.dumps(cfg)))
    try:
        # A warm-up row each sink must deliver: its producer is open before the clock starts.
        conn.execute(f"INSERT INTO {TABLE} (pad) VALUES ('warm-up')")
        wait_until(lambda: all(delivered(conn, n) == 1 for n in names), 120, "every sink's warm-up row")
        pids = capture_pids(conn)
        marks0, cpu0, t0 = wal_marks(conn), cpu_seconds(pids), time.monotonic()
        conn.execute("SET synchronous_commit = off")
        conn.execute(f"DO $$ BEGIN FOR i IN 1..{rows // 10} LOOP INSERT INTO {TABLE} (pad) "
                     f"SELECT repeat('x', 180) FROM generate_series(1, 10); COMMIT; END LOOP; END $$")
        conn.execute("RESET synchronous_commit")
        loaded = time.monotonic() - t0
        done = {}
        while len(done) < len(names):
            for n in names:
                if n not in done and delivered(conn, n) >= rows + 1:
                    done[n] = time.monotonic() - t0
            if time.monotonic() - t0 > 600:
                raise SystemExit("shared_table: the sinks did not deliver every row within 10 minutes")
            time.sleep(0.05)
        cpu, marks1 = cpu_seconds(pids) - cpu0, wal_marks(conn)
        written = marks1[1] - marks0[1]
        return {"sinks": sinks, "rows": rows, "loaded_s": loaded, "per_sink": [rows / done[n] for n in names],
                "total": rows * sinks / max(done.values()), "last_s": max(done.values()), "cpu_s": cpu,
                "cpu_per_100k_rows": cpu / rows * 100_000, "cpu_per_100k_events": cpu / (rows * sinks) * 100_000,
                "decoded_per_written": (marks1[0] - marks0[0]) / written if written > 0 else 0.0}
    finally:
        for n in names:
            slot = conn.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (n,)).fetchone()[0]
            kafka.created.append(progress_topic(slot))
        drop_sinks(conn, names)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--sinks", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args()
    env, kafka, conn = quiet_start("shared_table")
    captured_table(conn, TABLE, "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, pad text")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    try:
        runs = [measure(conn, env, kafka, a.rows, 1), measure(conn, env, kafka, a.rows, a.sinks)]
    finally:
        drop_captured_tables(conn, [TABLE])
        kafka.delete(kafka.created)
    load1 = os.getloadavg()
    one, many = runs
    lines = [
        "# Several sinks on one table",
        "",
        f"`bench/shared_table.py`, started {started}, one run, 2 shared cores (load average {load0[0]:.2f} at the "
        f"start, {load1[0]:.2f} at the end). {a.rows:,} rows of ~200 bytes committed in transactions of 10 by one "
        "server-side loop (synchronous_commit off) into one captured table; first with one exactly-once Kafka sink "
        f"on it, then with {a.sinks}. Each sink has its own slot and decoding session. Events/s = rows / (load start "
        "-> the sink's last event delivered, from cdc_delivery_status); CPU = every pg_cdc process (utime + stime "
        "from /proc) over the same span; WAL decoded / written = the sinks' `decoding.wal_decoded_bytes` over the "
        "WAL written.",
        "",
        "| sinks | load alone s | per-sink events/s | total events/s | last sink done s | pg_cdc CPU s | "
        "CPU s per 100k rows | CPU s per 100k events | WAL decoded / written |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        per = " / ".join(f"{x:,.0f}" for x in r["per_sink"])
        lines.append(f"| {r['sinks']} | {r['loaded_s']:.1f} | {per} | {r['total']:,.0f} | {r['last_s']:.1f} | "
                     f"{r['cpu_s']:.2f} | {r['cpu_per_100k_rows']:.2f} | {r['cpu_per_100k_events']:.2f} | "
                     f"{r['decoded_per_written']:.2f}x |")
    lines += ["", f"With {a.sinks} sinks: CPU per source row {many['cpu_per_100k_rows'] / one['cpu_per_100k_rows']:.2f}x "
              f"one sink's; total events/s {many['total'] / one['total']:.2f}x; the slowest sink's events/s "
              f"{min(many['per_sink']) / min(one['per_sink']):.2f}x the single sink's."]
    write_report(a.out, "shared_table.md", lines)


if __name__ == "__main__":
    main()
