#!/usr/bin/env python3
"""Records what Debezium itself writes for the golden workloads: the oracle of pg_cdc's
`format: debezium` (its unit tests run the same workloads' pgoutput frames through pg_cdc's
Debezium format and compare, field by field, with these records).

For each workload crates/cdc-core/tests/golden/<name>.sql and each variant of Debezium's settings
below it: creates a scratch database, runs the schema part (before "-- @capture"), creates a
publication for all tables, starts the Debezium embedded engine with the PostgreSQL connector
(the harness of bench/debezium, class DebeziumCapture; its own slot, snapshot.mode no_data), runs
the changes, waits until Debezium has written nothing for a while, and writes
crates/cdc-sinks/tests/debezium/<name>.<variant>.jsonl: one line per record, {"key": ..., "value": ...}
exactly as Debezium's JSON converter serialized them. Generated, never edited by hand.

For each variant written with schemas it then writes <name>.<variant>.avro.jsonl: what Kafka
Connect's Avro converter makes of the same records (the harness class AvroOracle: Connect's JSON
converter reads each record back, and AvroData, as Apicurio's converter module ships it, maps it
to an Avro schema and datum). `--avro-only` redoes that step alone from the records on disk.

Run with `make golden-debezium` after `make up` (the harness is built with Maven into the cache once).
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from e2e_bench import Debezium  # noqa: E402  (the harness build, shared with the benchmark)

GOLDEN = REPO / "crates" / "cdc-core" / "tests" / "golden"
OUT = REPO / "crates" / "cdc-sinks" / "tests" / "debezium"
DB = "pg_cdc_golden_dbz"
SLOT = "pg_cdc_golden_dbz"

# Debezium's defaults, with the few settings a capture needs (its own slot and publication, no
# initial snapshot, the topic prefix "golden").
BASE = {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
    "offset.flush.interval.ms": "1000",
    "plugin.name": "pgoutput",
    "publication.autocreate.mode": "disabled",
    "publication.name": "golden",
    "slot.name": SLOT,
    "snapshot.mode": "no_data",
    "topic.prefix": "golden",
    "name": "golden",
    "poll.interval.ms": "10",
}
# Variants: a name and the settings that differ from Debezium's defaults.
VARIANTS = {
    "basic": {"default": {}, "noschema": {"converter.schemas.enable": "false"},
              "notombstones": {"tombstones.on.delete": "false", "converter.schemas.enable": "false"}},
    "types": {"default": {}, "string": {"decimal.handling.mode": "string"},
              "double": {"decimal.handling.mode": "double"}},
    "toast": {"default": {}},
    "formats": {"default": {}, "string": {"decimal.handling.mode": "string"},
                "double": {"decimal.handling.mode": "double"}},
}


def run_variant(name, variant, overrides, classpath, env):
    sql = (GOLDEN / f"{name}.sql").read_text()
    schema_part, change_part = sql.split("-- @capture", 1)
    admin = psycopg.connect(autocommit=True)
    admin.execute(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{SLOT}'")
    admin.execute(f"DROP DATABASE IF EXISTS {DB}")
    admin.execute(f"CREATE DATABASE {DB}")
    db = psycopg.connect(dbname=DB, autocommit=True)
    db.execute(schema_part)
    db.execute("CREATE PUBLICATION golden FOR ALL TABLES")
    props = {**BASE, "database.hostname": env["PGHOST"], "database.port": env["PGPORT"],
             "database.user": env["PGUSER"], "database.password": "", "database.dbname": DB, **overrides}
    work = Path(env["PG_CDC_RUN"]) / "golden-debezium"
    work.mkdir(parents=True, exist_ok=True)
    prop_file, out_file = work / f"{name}.{variant}.properties", work / f"{name}.{variant}.jsonl"
    prop_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    log = open(work / f"{name}.{variant}.log", "w")
    proc = subprocess.Popen(["java", "-Xmx512m", "-cp", classpath, "io.pgcdc.bench.DebeziumCapture",
                             str(prop_file), str(out_file)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        if proc.stdout.readline().strip() != "READY":
            raise SystemExit(f"Debezium did not start (see {log.name})")
        # Each statement in its own transaction unless the workload groups them (as psql does).
        subprocess.run(["psql", "-qX", "-v", "ON_ERROR_STOP=1", "-d", DB], input=change_part, text=True,
                       check=True, stdout=subprocess.DEVNULL)
        # Debezium writes as it streams: done when the file stopped growing for 5 s.
        size, quiet_since = -1, time.monotonic()
        while time.monotonic() - quiet_since < 5:
            time.sleep(0.5)
            now = out_file.stat().st_size if out_file.exists() else 0
            if now != size:
                size, quiet_since = now, time.monotonic()
    finally:
        proc.stdin.close()
        rc = proc.wait(120)
        log.close()
    if rc != 0:
        raise SystemExit(f"Debezium failed (rc {rc}, see {log.name})")
    db.close()
    admin.execute(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{SLOT}'")
    admin.execute(f"DROP DATABASE {DB}")
    admin.close()
    target = OUT / f"{name}.{variant}.jsonl"
    target.write_text(out_file.read_text())
    print(f"[golden-debezium] {name}.{variant}: {len(target.read_text().splitlines())} records")


def avro_oracle(name, variant, overrides, classpath):
    """Writes <name>.<variant>.avro.jsonl from <name>.<variant>.jsonl (variants with schemas)."""
    if overrides.get("converter.schemas.enable") == "false":
        return
    source, target = OUT / f"{name}.{variant}.jsonl", OUT / f"{name}.{variant}.avro.jsonl"
    subprocess.run(["java", "-Xmx512m", "-cp", classpath, "io.pgcdc.bench.AvroOracle", str(source), str(target)],
                   check=True)
    print(f"[golden-debezium] {name}.{variant}.avro: {len(target.read_text().splitlines())} records")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("workloads", nargs="*", help="workload names (default: all)")
    p.add_argument("--avro-only", action="store_true", help="only map the records on disk to Avro")
    args = p.parse_args()
    env = os.environ
    harness = Debezium(SimpleNamespace(env=SimpleNamespace(cache=Path(env["PG_CDC_CACHE"]))))
    harness.build()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, variants in VARIANTS.items():
        if args.workloads and name not in args.workloads:
            continue
        for variant, overrides in variants.items():
            if not args.avro_only:
                run_variant(name, variant, overrides, harness.classpath, env)
            avro_oracle(name, variant, overrides, harness.classpath)


if __name__ == "__main__":
    main()
