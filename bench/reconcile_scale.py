"""cdc_reconcile at the scale of the operational seed: a spec of 250 sinks over 50 captured tables.

Runs on a cluster of its own (port 25433, data in $PG_CDC_RUN/pgdata-reconcile, wiped at the start and
stopped at the end), since 250 sinks need 250 replication slots and 250 workers, more than the dev
cluster allows. Each table holds --rows rows; each sink is a table sink (the in-database sink, so no
peer limits the figure) carrying --per-sink tables. Measures, one run, wall clock of each call:

- the plan (a dry run) of the whole spec against an empty state: every object to create;
- applying it (one call: 250 slots made, 50 tables captured, 250 sinks and event tables added);
- how long until every sink is running with its snapshot delivered, and the CPU of pg_cdc's processes;
- the dry run and the apply of the same spec again (no-op), cdc_export_spec, and reconciling the export;
- a spec that changes one sink's tables (one alter and its back-fill), applied;
- the spec of nothing with force_drop of every sink (the teardown), applied.

    $PG_CDC_VENV/bin/python bench/reconcile_scale.py [--sinks 250] [--tables 50] [--per-sink 10] [--rows 1000]

Writes bench/results/reconcile.md and prints it."""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_bench import cpu_seconds, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PORT = 25433


def pg_script(env, *args):
    subprocess.run(["bash", "-c", f"source {ROOT}/scripts/env.sh && scripts/pg.sh {' '.join(args)}"],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def timed(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


def pg_cdc_cpu(conn):
    """CPU seconds of every pg_cdc background process alive now (launcher, decoder, sink workers)."""
    return cpu_seconds([r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type LIKE 'pg_cdc %'").fetchall()])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sinks", type=int, default=250)
    ap.add_argument("--tables", type=int, default=50)
    ap.add_argument("--per-sink", type=int, default=10)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()
    run = os.environ.get("PG_CDC_RUN", "/var/tmp/pg_cdc")
    env = {**os.environ, "PGPORT": str(PORT), "PG_CDC_PGDATA": f"{run}/pgdata-reconcile", "PG_VERSION": "15"}
    pg_script(env, "reset")
    pg_script(env, "start")
    dsn = f"host=127.0.0.1 port={PORT} user=postgres dbname={os.environ.get('PGDATABASE', 'postgres')}"
    with psycopg.connect(dsn, autocommit=True) as c:
        slots = a.sinks + 20
        c.execute(f"ALTER SYSTEM SET max_replication_slots = {slots}")
        c.execute(f"ALTER SYSTEM SET max_worker_processes = {slots + 10}")
        c.execute("ALTER SYSTEM SET max_connections = 400")
    pg_script(env, "restart")
    rows = []
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_cdc")
            for i in range(a.tables):
                c.execute(f"CREATE TABLE rec_t{i} (id int PRIMARY KEY, v text)")
                c.execute(f"INSERT INTO rec_t{i} SELECT g, md5(g::text) FROM generate_series(1, {a.rows}) g")
            tables = [{"name": f"public.rec_t{i}"} for i in range(a.tables)]
            sinks = [{"name": f"rec_s{j}", "type": "table",
                      "config": {"table": f"rec_e{j}",
                                 "tables": [f"rec_t{(j + k) % a.tables}" for k in range(a.per_sink)]}}
                     for j in range(a.sinks)]
            spec = {"tables": tables, "sinks": sinks}

            def reconcile(s, apply):
                return c.execute("SELECT cdc_reconcile(%s::jsonb, %s)", (json.dumps(s), not apply)).fetchone()[0]

            plan, t = timed(lambda: reconcile(spec, False))
            rows.append(("plan (dry run) from nothing", t, f"{plan['changes']} changes, "
                         f"{len(plan['snapshots'])} snapshots planned"))
            cpu0 = pg_cdc_cpu(c)
            applied, t = timed(lambda: reconcile(spec, True))
            rows.append(("apply from nothing", t, f"{applied['changes']} changes applied"))
            start = time.perf_counter()
            while True:
                left = c.execute("SELECT count(*) FILTER (WHERE state <> 'running'), "
                                 "(SELECT count(*) FROM cdc_snapshots WHERE state NOT IN ('done', 'skipped')) "
                                 "FROM _cdc_sinks").fetchone()
                if left == (0, 0):
                    break
                if time.perf_counter() - start > 1800:
                    raise SystemExit(f"sinks not running / snapshots open after 30 minutes: {left}")
                time.sleep(1)
            settled = time.perf_counter() - start
            events = sum(c.execute(f"SELECT count(*) FROM rec_e{j}").fetchone()[0] for j in range(a.sinks))
            rows.append(("every sink running, every snapshot delivered (after the apply)", settled,
                         f"{events:,} READ events in the event tables; pg_cdc CPU {pg_cdc_cpu(c) - cpu0:.0f} s"))
            assert events == a.sinks * a.per_sink * a.rows, events
            again, t = timed(lambda: reconcile(spec, False))
            rows.append(("dry run of the same spec (nothing to do)", t, f"{again['changes']} changes"))
            again, t = timed(lambda: reconcile(spec, True))
            rows.append(("apply of the same spec (no-op)", t, f"{again['changes']} changes"))
            exported, t = timed(lambda: c.execute("SELECT cdc_export_spec()").fetchone()[0])
            rows.append(("cdc_export_spec()", t, f"{len(exported['sinks'])} sinks, {len(exported['tables'])} tables, "
                         f"{len(json.dumps(exported)):,} bytes"))
            again, t = timed(lambda: reconcile(exported, True))
            rows.append(("apply of the export (no-op)", t, f"{again['changes']} changes"))
            changed = json.loads(json.dumps(spec))
            changed["sinks"][0]["config"]["tables"].append(f"rec_t{a.per_sink % a.tables + a.tables // 2}")
            one, t = timed(lambda: reconcile(changed, True))
            rows.append(("apply with one sink's tables changed", t,
                         f"{one['changes']} change, {len(one['snapshots'])} back-fill"))
            teardown = {"force_drop": {"sinks": [s["name"] for s in sinks],
                                       "tables": [t["name"] for t in tables]}}
            dropped, t = timed(lambda: reconcile(teardown, True))
            rows.append(("apply of the empty spec with force_drop (teardown)", t, f"{dropped['changes']} changes"))
    finally:
        pg_script(env, "stop")
    lines = [
        "# cdc_reconcile at the seed's scale",
        "",
        f"A spec of {a.sinks} table sinks over {a.tables} captured tables ({a.rows:,} rows each; each sink carries "
        f"{a.per_sink} tables), on a PostgreSQL 15 cluster of its own (max_replication_slots {a.sinks + 20}). "
        "Wall clock of each call from a client on the same machine. Generated by `bench/reconcile_scale.py` "
        f"(`make bench-reconcile`); one run, {time.strftime('%Y-%m-%d')}, 2 shared cores.",
        "",
        "| step | seconds | result |",
        "|---|---:|---|",
    ]
    lines += [f"| {name} | {t:.2f} | {what} |" for name, t, what in rows]
    write_report(a.out, "reconcile.md", lines)


if __name__ == "__main__":
    main()
