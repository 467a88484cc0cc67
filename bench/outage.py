"""A healthy sink next to one whose destination hangs, side by side in one run: what another
sink's outage costs the one that works (issue 17, deliverable 3).

pgbench commits single-row INSERTs at a steady rate (1,000 tx/s by default) into one table. An
exactly-once Kafka sink captures it; its end-to-end latency (commit time -> visible to a
read_committed consumer) is measured twice: alone, then with a webhook sink on the same table whose
endpoint accepts connections and never answers (a hung destination: every delivery waits out its
`timeout_ms`, then the sink retries with backoff). The webhook sink's delivered count and state are
reported too, to show it really was down for the whole run.

    $PG_CDC_VENV/bin/python bench/outage.py [--rate 1000] [--seconds 20] [--out bench/results]

Needs `make up` and a quiet cluster (no other sinks). Writes outage.md and prints it."""
import argparse
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_bench import (LatencyCollector, captured_table, delivered, drop_captured_tables, drop_sinks,  # noqa: E402
                       percentile, pg_cdc_commit_us, pgbench_at_rate, quiet_start, wait_until, write_report)

TABLE = "outage_bench"


class HungEndpoint(threading.Thread):
    """An HTTP endpoint that accepts every connection, reads what it is sent and never answers."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held = []

    def run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setblocking(False)
            self.held.append(conn)


def measure(conn, env, kafka, script, a, hung):
    topic = kafka.topic("outage", "hung" if hung else "alone")
    kafka_sink = f"outage_kafka_{'hung' if hung else 'alone'}"
    cfg = {"bootstrap_servers": env.bootstrap, "topic": topic, "tables": [TABLE], "exactly_once": True}
    conn.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)", (kafka_sink, json.dumps(cfg)))
    names, other = [kafka_sink], None
    if hung:
        other = "outage_webhook_hung"
        endpoint = HungEndpoint()
        endpoint.start()
        conn.execute("SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)",
                     (other, json.dumps({"url": f"http://127.0.0.1:{endpoint.port}/cdc", "tables": [TABLE],
                                         "timeout_ms": 30000})))
        names.append(other)
    try:
        wait_until(lambda: conn.execute("SELECT state FROM _cdc_sinks WHERE sink_name = %s",
                                        (kafka_sink,)).fetchone()[0] == "running", 120, "the Kafka sink running")
        pgbench_at_rate(env, script, a.rate, 3)  # warm-up: the webhook sink is now stuck in its first delivery
        collector = LatencyCollector(kafka, topic, pg_cdc_commit_us, since_us=time.time() * 1_000_000)
        collector.start()
        processed = pgbench_at_rate(env, script, a.rate, a.seconds)
        try:
            collector.wait_for(processed, timeout=180)
        finally:
            collector.stop()
        visible = sorted(collector.visible_ms)
        result = {"events": processed, "p50": percentile(visible, 50), "p99": percentile(visible, 99),
                  "p999": percentile(visible, 99.9)}
        if other:
            state = conn.execute("SELECT state, left(coalesce(last_error, ''), 80) FROM _cdc_sinks WHERE sink_name = %s",
                                 (other,)).fetchone()
            result["other"] = {"delivered": delivered(conn, other), "state": state[0], "error": state[1]}
        return result
    finally:
        drop_sinks(conn, names)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args()
    env, kafka, conn = quiet_start("outage")
    captured_table(conn, TABLE, "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int, note text, "
                   "created_at timestamptz DEFAULT now()")
    script = Path(env.run_root) / "outage_insert.sql"
    script.write_text("\\set a random(1, 100000)\n"
                      f"INSERT INTO {TABLE} (account, note) VALUES (:a, repeat('x', 130));\n")
    started, load0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    try:
        alone = measure(conn, env, kafka, script, a, False)
        hung = measure(conn, env, kafka, script, a, True)
    finally:
        drop_captured_tables(conn, [TABLE])
        kafka.delete(kafka.created + [t for t in kafka.admin.list_topics(timeout=15).topics
                                      if t.startswith("pg_cdc.progress.")])
    load1 = os.getloadavg()
    o = hung["other"]
    lines = [
        "# A healthy sink next to one whose destination hangs",
        "",
        f"`bench/outage.py`, started {started}, one run, 2 shared cores (load average {load0[0]:.2f} at the start, "
        f"{load1[0]:.2f} at the end). pgbench at {a.rate:,} single-row INSERTs/s for {a.seconds} s (3 s of warm-up "
        "first) into one table with an exactly-once Kafka sink; then the same with a webhook sink on that table too, "
        "whose endpoint accepts connections and never answers (`timeout_ms` 30,000). Latency of the Kafka sink: "
        "commit -> visible to a read_committed consumer (ms resolution of the event's commit timestamp).",
        "",
        "| run | events | p50 ms | p99 ms | p99.9 ms |",
        "|---|---:|---:|---:|---:|",
        f"| Kafka sink alone | {alone['events']:,} | {alone['p50']:.0f} | {alone['p99']:.0f} | {alone['p999']:.0f} |",
        f"| Kafka sink, webhook sink hung | {hung['events']:,} | {hung['p50']:.0f} | {hung['p99']:.0f} | "
        f"{hung['p999']:.0f} |",
        "",
        f"p99 with the other sink hung / alone: {hung['p99'] / max(alone['p99'], 1e-9):.2f}x. The webhook sink "
        f"delivered {o['delivered']} events during its run and ended in state `{o['state']}`"
        + (f" ({o['error']})" if o['error'] else "") + ".",
    ]
    write_report(a.out, "outage.md", lines)


if __name__ == "__main__":
    main()
