"""Measure pg_cdc under load through its monitoring SQL and chart it: monitoring.csv + monitoring.png.

    chart.py run  --dsn DSN --bootstrap HOST:PORT [--rates 200,1000] [--seconds 20] [--out DIR]
    chart.py plot DIR/monitoring.csv            # redraw the chart from recorded samples

`run` creates the table `cdc_chart` and a Kafka sink `cdc_chart` (exactly-once, the default) on the
broker given, waits until the sink is running and has delivered one warm-up row, then for each rate
drives single-row INSERT transactions with pgbench (`-R rate`, Poisson arrivals, several clients)
for `--seconds`, followed by `--idle` seconds without load. Every `--interval` seconds (from before
the first phase to the end) it takes one sample, in one statement: the sink's row of cdc_status(),
cdc_metrics('cdc_chart'), the buckets of pg_cdc_end_to_end_latency_seconds from
cdc_prometheus_metrics(), and the table's sequence (rows inserted). The samples go, unchanged, to
monitoring.csv; the table and the sink are dropped at the end (unless --keep). It needs a superuser
DSN (it creates the table and the sink) and pgbench ($PG_BIN or PATH).

What the chart shows, all derived from those samples:
- rows inserted per second (sequence deltas) and events published per second (deltas of
  cdc_status().events_published, i.e. acknowledged by the broker);
- end-to-end latency (commit in PostgreSQL -> broker acknowledgement): per-interval p50 and p99
  computed from the deltas of the histogram buckets between two samples, interpolated inside a
  bucket as Prometheus' histogram_quantile does (the buckets are 1, 2.5, 5, 10, 25, 50, 100, 250,
  500 ms ...: coarse), and the cumulative p50 and p99 of cdc_status() (finer histogram, but over
  every event since the server started);
- lag_bytes and retained_wal_bytes of cdc_status().
"""
import argparse
import csv
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

TABLE = SINK = "cdc_chart"
TOPIC = "cdc-chart"
BOUNDS = ["0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5",
          "10", "30", "60", "+Inf"]   # `le` of pg_cdc_end_to_end_latency_seconds, seconds
BUCKET_COLUMNS = [f"le_{b}" for b in BOUNDS]
COLUMNS = ["t_s", "unix_time", "phase_rate", "load", "rows_inserted", "state", "events_published",
           "lag_bytes", "retained_wal_bytes", "e2e_p50_ms", "e2e_p99_ms", "e2e_p999_ms", "capture_p50_ms",
           "capture_p99_ms", "publish_p50_ms", "publish_p99_ms", "e2e_count", "e2e_sum_s"] + BUCKET_COLUMNS
# The sink's end-to-end histogram lines in cdc_prometheus_metrics(): (bucket|sum|count, le, value).
HISTOGRAM_LINE = re.compile(r'^pg_cdc_end_to_end_latency_seconds_(bucket|sum|count)\{sink="%s"(?:,le="([^"]+)")?\} (\S+)$'
                            % SINK)

SAMPLE_SQL = f"""
SELECT extract(epoch FROM clock_timestamp())::float8, s.state, s.events_published, s.lag_bytes,
       s.retained_wal_bytes, s.end_to_end_p50_ms, s.end_to_end_p99_ms, s.end_to_end_p999_ms,
       (m -> 'source_metrics' ->> 'capture_latency_p50_ms')::float8,
       (m -> 'source_metrics' ->> 'capture_latency_p99_ms')::float8,
       (m -> 'sink_metrics' -> '{SINK}' ->> 'publish_latency_p50_ms')::float8,
       (m -> 'sink_metrics' -> '{SINK}' ->> 'publish_latency_p99_ms')::float8,
       (SELECT last_value FROM {TABLE}_id_seq), cdc_prometheus_metrics()
  FROM cdc_status() s, cdc_metrics('{TABLE}') m
 WHERE s.sink_name = '{SINK}'"""


# ------------------------------------------------------------------------------------------------
# run


def setup(conn, bootstrap):
    """(Re)creates the table and the sink, waits until the sink runs and delivered a warm-up row."""
    teardown(conn)
    conn.execute(f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, payload text NOT NULL)")
    conn.execute("SELECT cdc_enable(%s)", [TABLE])
    config = {"bootstrap_servers": bootstrap, "topic": TOPIC, "tables": [TABLE]}
    conn.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)", [SINK, json.dumps(config)])
    wait_for(conn, "SELECT state = 'running' FROM cdc_status() WHERE sink_name = %s", "the sink to run")
    conn.execute(f"INSERT INTO {TABLE} (payload) VALUES ('warm-up')")
    wait_for(conn, "SELECT events_published >= 1 FROM cdc_status() WHERE sink_name = %s",
             "the warm-up row to be delivered")


def teardown(conn):
    """Drops the sink and the table if they exist (leftovers of an interrupted run too)."""
    if conn.execute("SELECT 1 FROM cdc_status() WHERE sink_name = %s", [SINK]).fetchone():
        conn.execute("SELECT cdc_drop_sink(%s)", [SINK])
    if conn.execute("SELECT to_regclass(%s)", [TABLE]).fetchone()[0]:
        conn.execute(f"DROP TABLE {TABLE}")   # the event trigger forgets its capture


def wait_for(conn, sql, what, timeout_s=60):
    """Polls `sql` (one boolean, parameter: the sink) until true; raises after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = conn.execute(sql, [SINK]).fetchone()
        if row and row[0]:
            return
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}: {conn.execute('SELECT * FROM cdc_status()').fetchall()}")


def take_sample(conn, t0, phase_rate, load):
    """One row of monitoring.csv (see COLUMNS)."""
    (now, state, published, lag, retained, p50, p99, p999, c50, c99, pub50, pub99, inserted,
     text) = conn.execute(SAMPLE_SQL).fetchone()
    hist = {}   # le -> cumulative count, and "sum", "count"
    for m in filter(None, map(HISTOGRAM_LINE.match, text.splitlines())):
        hist[m.group(2) or m.group(1)] = m.group(3)
    return {"t_s": round(now - t0, 3), "unix_time": round(now, 3), "phase_rate": phase_rate, "load": int(load),
            "rows_inserted": inserted, "state": state, "events_published": published, "lag_bytes": lag,
            "retained_wal_bytes": retained, "e2e_p50_ms": p50, "e2e_p99_ms": p99, "e2e_p999_ms": p999,
            "capture_p50_ms": c50, "capture_p99_ms": c99, "publish_p50_ms": pub50, "publish_p99_ms": pub99,
            "e2e_count": hist["count"], "e2e_sum_s": hist["sum"],
            **{f"le_{b}": hist[b] for b in BOUNDS}}


def pgbench_command(dsn, rate, seconds, clients, script):
    """pgbench running `script` at `rate` transactions/s for `seconds` over `clients` connections."""
    pgbench = shutil.which("pgbench", path=os.environ.get("PG_BIN", "") + os.pathsep + os.environ.get("PATH", ""))
    if not pgbench:
        raise SystemExit("pgbench not found (set PG_BIN)")
    return [pgbench, "-n", "-f", script, "-R", str(rate), "-T", str(seconds), "-c", str(clients),
            "-j", str(min(clients, 2))] + ([dsn] if dsn else [])


def run(args):
    """Sets up, drives every rate while sampling, writes the CSV, plots, tears down."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rates = [int(r) for r in args.rates.split(",")]
    with psycopg.connect(args.dsn, autocommit=True) as conn, tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "insert.sql")
        script.write_text(f"INSERT INTO {TABLE} (payload) VALUES (repeat('x', 100));\n")
        setup(conn, args.bootstrap)
        samples, t0 = [], time.time()
        next_at = time.monotonic()

        def tick(rate, load):
            """Sleeps until the next sample is due, then takes it."""
            nonlocal next_at
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += args.interval
            samples.append(take_sample(conn, t0, rate, load))

        tick(0, False)
        try:
            for rate in rates:
                bench = subprocess.Popen(pgbench_command(args.dsn, rate, args.seconds, args.clients, str(script)),
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                while bench.poll() is None:
                    tick(rate, True)
                report = bench.stdout.read()
                if bench.returncode != 0:
                    raise SystemExit(f"pgbench failed:\n{report}")
                print(f"--- {rate}/s: pgbench says", *[line for line in report.splitlines()
                                                       if line.startswith(("number of transactions actually",
                                                                           "latency average", "tps"))], sep="\n  ")
                for _ in range(round(args.idle / args.interval)):
                    tick(rate, False)
        finally:
            write_csv(out / "monitoring.csv", samples)
            if not args.keep:
                teardown(conn)
    print(f"{len(samples)} samples -> {out / 'monitoring.csv'}")
    plot(out / "monitoring.csv", out / "monitoring.png")


def write_csv(path, samples):
    """Writes the raw samples."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(samples)


# ------------------------------------------------------------------------------------------------
# plot


def number(v):
    """A CSV cell as float (NaN when empty)."""
    return float(v) if v not in ("", None) else math.nan


def histogram_quantile(q, buckets):
    """Prometheus' histogram_quantile over [(upper bound, cumulative count)] ending with +Inf: linear
    interpolation inside the bucket holding rank q * total (from 0 for the first bucket); the
    highest finite bound when the rank falls in +Inf; NaN without observations."""
    total = buckets[-1][1]
    if total <= 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below) if count > below else upper
        lower, below = upper, count
    return lower


def interval_series(rows):
    """Per-interval figures between consecutive samples: x (interval end), rows inserted/s, events
    published/s, and end-to-end p50 / p99 in ms from the bucket deltas."""
    series = {k: [] for k in ("t", "inserted", "published", "p50", "p99")}
    for a, b in zip(rows, rows[1:]):
        dt = number(b["t_s"]) - number(a["t_s"])
        delta = [(float(x), number(b[f"le_{x}"]) - number(a[f"le_{x}"])) for x in BOUNDS]
        series["t"].append(number(b["t_s"]))
        series["inserted"].append((number(b["rows_inserted"]) - number(a["rows_inserted"])) / dt)
        series["published"].append((number(b["events_published"]) - number(a["events_published"])) / dt)
        series["p50"].append(histogram_quantile(0.5, delta) * 1000)
        series["p99"].append(histogram_quantile(0.99, delta) * 1000)
    return series


def phases(rows):
    """{rate: (index of the sample before the phase began, indices of its samples)}, in order."""
    out = {}
    for i, r in enumerate(rows):
        if r["phase_rate"] != "0":
            out.setdefault(r["phase_rate"], (i - 1, []))[1].append(i)
    return out


def phase_summary(rows):
    """Per rate, from the sample before the phase to its last one (load and idle tail): rows
    inserted, events published, p50 / p99 in ms from the bucket deltas, cdc_status()'s cumulative
    p50 / p99 and cdc_metrics()'s cumulative capture and publish p50 at the phase's end, and the
    largest lag_bytes."""
    summary = []
    for rate, (before, idx) in phases(rows).items():
        first, last = rows[before], rows[idx[-1]]

        def grew(column):
            return number(last[column]) - number(first[column])

        delta = [(float(x), grew(f"le_{x}")) for x in BOUNDS]
        summary.append({"rate": int(rate), "rows": grew("rows_inserted"), "events": grew("events_published"),
                        "p50_ms": histogram_quantile(0.5, delta) * 1000,
                        "p99_ms": histogram_quantile(0.99, delta) * 1000,
                        **{k: number(last[k]) for k in ("e2e_p50_ms", "e2e_p99_ms", "capture_p50_ms",
                                                        "publish_p50_ms")},
                        "max_lag_bytes": max(number(rows[i]["lag_bytes"]) for i in idx)})
    return summary


def plot(csv_path, png_path):
    """Draws the three panels from the samples in `csv_path` and prints the per-phase summary."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    s = interval_series(rows)
    t = [number(r["t_s"]) for r in rows]
    summary = phase_summary(rows)
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 10), sharex=True)

    for ax in (ax1, ax2, ax3):   # shade the intervals under load, label the rate
        for rate, (before, idx) in phases(rows).items():
            start, end = t[before], max(t[i] for i in idx if rows[i]["load"] == "1")
            ax.axvspan(start, end, color="0.92", zorder=0)
            if ax is ax1:
                ax.text((start + end) / 2, 1.01, f"{rate} tx/s offered", transform=ax.get_xaxis_transform(),
                        ha="center", va="bottom", fontsize=9)
        ax.grid(True, alpha=0.3)

    ax1.plot(s["t"], s["inserted"], drawstyle="steps-pre", label="rows inserted / s (table's sequence)")
    ax1.plot(s["t"], s["published"], drawstyle="steps-pre", label="events published / s (cdc_status, broker-acked)")
    ax1.set_ylabel("per second")
    ax1.legend(loc="upper left", fontsize=8)

    ax2.plot(s["t"], s["p50"], "o-", ms=3, color="tab:blue", label="p50 per interval (histogram bucket deltas)")
    ax2.plot(s["t"], s["p99"], "o-", ms=3, color="tab:red", label="p99 per interval (histogram bucket deltas)")
    ax2.plot(t, [number(r["e2e_p50_ms"]) for r in rows], "--", color="tab:blue",
             label="p50 cumulative since server start (cdc_status)")
    ax2.plot(t, [number(r["e2e_p99_ms"]) for r in rows], "--", color="tab:red",
             label="p99 cumulative since server start (cdc_status)")
    ax2.set_ylim(bottom=0)
    top = ax2.get_ylim()[1]
    for b in BOUNDS[:-1]:   # the histogram's bucket bounds: per-interval values are interpolated between them
        if float(b) * 1000 < top:
            ax2.axhline(float(b) * 1000, color="0.5", lw=0.8, ls=":", zorder=1)
    ax2.text(1.0, 1.01, "dotted: bucket bounds of pg_cdc_end_to_end_latency_seconds", transform=ax2.transAxes,
             ha="right", va="bottom", fontsize=8, color="0.4")
    ax2.set_ylabel("end-to-end latency, ms\n(commit -> broker ack)")
    ax2.legend(loc="upper right", fontsize=8)

    ax3.plot(t, [number(r["retained_wal_bytes"]) / 1024 for r in rows], color="tab:orange",
             label="retained_wal_bytes (WAL the slot keeps), left axis")
    ax3.set_ylabel("retained WAL, KiB")
    ax3.set_ylim(bottom=0)
    ax3.set_xlabel(f"seconds (one sample every {t[1] - t[0]:.0f} s)" if len(t) > 1 else "seconds")
    lag = ax3.twinx()   # the lag is two orders of magnitude smaller: its own axis
    lag.plot(t, [number(r["lag_bytes"]) / 1024 for r in rows], color="tab:blue",
             label="lag_bytes (WAL not yet confirmed), right axis")
    lag.set_ylabel("lag, KiB")
    lag.set_ylim(bottom=0)
    ax3.legend(handles=ax3.get_lines() + lag.get_lines(), loc="upper left", fontsize=8)

    fig.suptitle("pg_cdc under load: single-row INSERT transactions (pgbench -R), exactly-once Kafka sink\n"
                 "cdc_status() cumulative p50 / p99 at the end of each phase: "
                 + "; ".join(f"after {p['rate']}/s {p['e2e_p50_ms']:.0f} / {p['e2e_p99_ms']:.0f} ms" for p in summary),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    for p in summary:
        print(f"{p['rate']:>5}/s offered: {p['rows']:.0f} rows inserted, {p['events']:.0f} events published, "
              f"max lag {p['max_lag_bytes'] / 1024:.0f} KiB; end to end p50 / p99: "
              f"{p['p50_ms']:.1f} / {p['p99_ms']:.1f} ms from the bucket deltas over the phase, "
              f"{p['e2e_p50_ms']:.1f} / {p['e2e_p99_ms']:.1f} ms cumulative at its end; "
              f"cumulative capture p50 {p['capture_p50_ms']:.1f} ms, publish p50 {p['publish_p50_ms']:.1f} ms")
    print(f"chart -> {png_path}")


def main():
    """Command line: `run` or `plot`."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure, write monitoring.csv and monitoring.png")
    r.add_argument("--dsn", default="", help="libpq connection string, superuser (default: PG* variables)")
    r.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers for the sink")
    r.add_argument("--rates", default="200,1000", help="transactions/s, comma-separated (default 200,1000)")
    r.add_argument("--seconds", type=int, default=20, help="seconds of load per rate (default 20)")
    r.add_argument("--idle", type=float, default=5, help="seconds sampled without load after each rate (default 5)")
    r.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    r.add_argument("--clients", type=int, default=4, help="pgbench connections (default 4)")
    r.add_argument("--out", default=str(Path(__file__).resolve().parent), help="output directory")
    r.add_argument("--keep", action="store_true", help="keep the table and the sink afterwards")
    d = sub.add_parser("plot", help="redraw monitoring.png from a monitoring.csv")
    d.add_argument("csv", help="the samples")
    d.add_argument("--png", help="output (default: monitoring.png beside the CSV)")
    args = p.parse_args()
    if args.command == "run":
        run(args)
    else:
        plot(Path(args.csv), Path(args.png) if args.png else Path(args.csv).with_name("monitoring.png"))


if __name__ == "__main__":
    main()
