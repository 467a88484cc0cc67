"""The worker's CPU per delivered event, sink type by sink type, side by side in one run.

A DBA runs pg_cdc on the primary: its CPU there is our cost. This runs the same workload (N rows in
transactions of 100, into a fresh captured table) through one sink of each type in turn, alone on
the cluster, and reads the worker's CPU time (utime + stime of its process, /proc) before and after
the sink reported every event delivered. Wall time is the peer's as much as ours (the local Kinesis
server stores a few thousand records a second at best), so only the CPU figure compares the sinks.

    $PG_CDC_VENV/bin/python bench/sink_cpu.py [--rows 20000] [--out bench/results]

`kafka_avro` is the Kafka sink with `"format": "avro"` (the registry stand-in of `make up`; a schema
is registered once, at the warm-up row, so the figure is the encoding's). `kafka_debezium` is the
Kafka sink with `"format": "debezium"` and Debezium's defaults (every key and value carries its
schema, as Kafka Connect's JSON converter writes them); `kafka_debezium_noschema` without schemas;
`kafka_debezium_avro` with Kafka Connect's Avro converter (`"converter": "avro"`, the registry stand-in).
`kafka_protobuf` is the Kafka sink with `"format": "protobuf"` (no registry: the plain messages).
`postgres` is the apply sink writing into a second database of the same cluster (`bench_apply_target`,
created and dropped here); besides the worker's CPU it reports the CPU of the target's backend that
applies the rows (the sink's connection), which the primary pays too when the target is on it.

Needs `make up` (PostgreSQL, Kafka, the local Kinesis server, the schema registry stand-in) and a quiet cluster (no other sinks).
Writes sink_cpu.md and prints the table."""
import argparse
import json
import os
import sys
import time
import uuid

import boto3
import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import connect, delivery_status, foreign_sinks, wait_for, worker_pid  # noqa: E402
from e2e_bench import cpu_seconds  # noqa: E402

KINESIS = os.environ.get("KINESIS_ENDPOINT", "http://127.0.0.1:4568")
REGISTRY = os.environ.get("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081")


def kinesis_stream(name):
    k = boto3.client("kinesis", endpoint_url=KINESIS, region_name="us-east-1",
                     aws_access_key_id="bench", aws_secret_access_key="bench")
    k.create_stream(StreamName=name, ShardCount=4)
    wait_for(lambda: k.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", what="stream active")
    return lambda: k.delete_stream(StreamName=name, EnforceConsumerDeletion=True)


def run(conn, kind, rows):
    tag = uuid.uuid4().hex[:8]
    table, sink = f"bench_cpu_{tag}", f"bench_cpu_{kind}_{tag}"
    conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, customer int, amount numeric, note text)")
    conn.execute("SELECT cdc_enable(%s)", (table,))
    cleanup = lambda: None  # noqa: E731
    if kind == "kafka":
        cfg = {"topic": f"bench-cpu-{tag}"}
    elif kind == "kafka_avro":
        cfg = {"topic": f"bench-cpu-{tag}", "format": "avro", "schema_registry": REGISTRY}
    elif kind == "kafka_debezium":
        cfg = {"topic": f"bench-cpu-{tag}", "format": "debezium"}
    elif kind == "kafka_debezium_noschema":
        cfg = {"topic": f"bench-cpu-{tag}", "format": "debezium", "debezium": {"schemas": False}}
    elif kind == "kafka_debezium_avro":
        cfg = {"topic": f"bench-cpu-{tag}", "format": "debezium", "schema_registry": REGISTRY,
               "debezium": {"converter": "avro"}}
    elif kind == "kafka_protobuf":
        cfg = {"topic": f"bench-cpu-{tag}", "format": "protobuf"}
    elif kind == "kafka_at_least_once":
        cfg = {"topic": f"bench-cpu-{tag}", "exactly_once": False}
    elif kind == "kinesis":
        cfg = {"stream_name": f"bench-cpu-{tag}"}
        cleanup = kinesis_stream(cfg["stream_name"])
    elif kind == "postgres":
        conn.execute("DROP DATABASE IF EXISTS bench_apply_target WITH (FORCE)")
        conn.execute("CREATE DATABASE bench_apply_target")
        cfg = {"connection": f"host={os.environ.get('PGHOST', '127.0.0.1')} port={os.environ.get('PGPORT', '55432')} "
                             "dbname=bench_apply_target user=postgres"}
        cleanup = lambda: conn.execute("DROP DATABASE IF EXISTS bench_apply_target WITH (FORCE)")  # noqa: E731
    else:
        cfg = {"table": f"bench_cpu_events_{tag}"}
    conn.execute("SELECT cdc_add_sink(%s, %s, %s::jsonb)",
                 (sink, "kafka" if kind.startswith("kafka") else kind, json.dumps({**cfg, "tables": [table]})))
    try:
        # One row first, so the sink is open (producer, credentials, stream check) before measuring.
        conn.execute(f"INSERT INTO {table} VALUES (0, 0, 0, 'warm-up')")
        wait_for(lambda: delivery_status(conn, sink)["delivered"]["events"] >= 1, timeout=60, what="warm-up delivered")
        pid = worker_pid(conn)
        # The apply sink's connection: the target's backend that does the writes.
        applier = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                               (f"pg_cdc-{sink}",)).fetchall()]
        cpu0, t0 = cpu_seconds([pid]), time.time()
        target0 = cpu_seconds(applier) if applier else 0.0
        for start in range(1, rows + 1, 100):
            with conn.transaction():
                conn.execute(f"INSERT INTO {table} SELECT g, g %% 97, g * 1.5, 'note ' || g "
                             f"FROM generate_series(%s::int, %s::int) g", (start, min(start + 99, rows)))
        wait_for(lambda: delivery_status(conn, sink)["delivered"]["events"] >= rows + 1, timeout=900,
                 what=f"{kind}: every event delivered")
        wall, cpu = time.time() - t0, cpu_seconds([pid]) - cpu0
        target_cpu = cpu_seconds(applier) - target0 if applier else None
        assert worker_pid(conn) == pid, "the worker restarted during the run"
    finally:
        conn.execute("SELECT cdc_drop_sink(%s)", (sink,))
        conn.execute("SELECT cdc_disable(%s)", (table,))
        conn.execute(f"DROP TABLE {table}")
        if kind == "table":
            conn.execute(f"DROP TABLE {cfg['table']}")
        cleanup()
    return {"sink": kind, "events": rows, "wall_s": wall, "cpu_s": cpu, "cpu_ms_per_1000": cpu * 1e6 / rows,
            "target_cpu_s": target_cpu}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--sinks",
                    default="kafka,kafka_avro,kafka_protobuf,kafka_debezium,kafka_debezium_noschema,kafka_debezium_avro,"
                            "kafka_at_least_once,kinesis,table,postgres")
    a = ap.parse_args()
    with connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cdc")
        if foreign_sinks(conn):
            sys.exit("bench: other sinks are running (they would capture the bench tables too): "
                     + ", ".join(foreign_sinks(conn)))
        results = [run(conn, kind, a.rows) for kind in a.sinks.split(",")]
    base = results[0]["cpu_ms_per_1000"]
    lines = [f"# Worker CPU per delivered event ({a.rows} rows, transactions of 100, one sink at a time)", "",
             "| sink | wall s | worker CPU s | CPU ms per 1,000 events | vs " + results[0]["sink"] + " |",
             "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['sink']} | {r['wall_s']:.1f} | {r['cpu_s']:.2f} | {r['cpu_ms_per_1000']:.1f} | "
                     f"{r['cpu_ms_per_1000'] / base:.2f}x |")
    for r in results:
        if r["target_cpu_s"] is not None:
            lines.append(f"\n{r['sink']}: the target's backend applying the rows used {r['target_cpu_s']:.2f} s of CPU "
                         f"({r['target_cpu_s'] * 1e6 / r['events']:.1f} ms per 1,000 events) besides the worker's.")
    lines += ["", "Wall time includes the peer (the local Kinesis server is slow); compare the CPU columns.",
              f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores."]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "sink_cpu.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
