"""The read-path prototype: the same backlog read three ways, side by side in one run.

Issue "decode each change once" asks to prototype the ways of reading a slot and to measure them
before picking one. Three slots are created at the same WAL position, a backlog of N inserts is
written, then each slot is drained once:

  peek loop   what the worker does today: pg_logical_slot_peek_binary_changes(slot, NULL, 100000)
              then pg_replication_slot_advance to the end of what it returned, until drained. Each
              call builds a decoding session and decodes from the slot's restart_lsn, which does not
              move inside a backlog (no running-xacts record in it), so every batch decodes again
              what the earlier ones did.
  one session one peek over the whole backlog in one backend: a decoding session kept open across
              the backlog, in-process (what a process holding its slot open would pay to decode).
  walsender   START_REPLICATION ... LOGICAL over a replication connection with pg_cdc's client
              (crates/cdc-repl, examples/stream_probe.rs): decoding runs in the walsender, the client
              only receives; CPU counts both processes.

CPU is utime + stime from /proc of every process doing the work; WAL decoded is the bytes between
the slot's restart_lsn and the end of each call, summed.

    $PG_CDC_VENV/bin/python bench/read_path.py [--rows 1000000] [--row-bytes 200] [--out bench/results]

Needs `make up` and a quiet cluster. Writes read_path.md and prints the table."""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import connect  # noqa: E402
from e2e_bench import cpu_seconds  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# Where cargo builds (scripts/env.sh sets CARGO_TARGET_DIR to the cache).
PROBE = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "examples", "stream_probe")
OPTS = "'proto_version', '1', 'publication_names', 'rp_bench_pub', 'messages', 'true'"


def restart_lsn(conn, slot):
    return conn.execute("SELECT restart_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                        (slot,)).fetchone()[0]


def peek_loop(slot, batch):
    conn = connect()
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    cpu0, t0 = cpu_seconds([pid]), time.monotonic()
    decoded, changes, calls = 0, 0, 0
    while True:
        start = restart_lsn(conn, slot)
        row = conn.execute(
            f"SELECT max(lsn) - '0/0'::pg_lsn, max(lsn)::text, count(*) FILTER (WHERE get_byte(data, 0) IN (73, 85, 68)) "
            f"FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, {OPTS})", (slot, batch)).fetchone()
        calls += 1
        if row[0] is None:
            decoded += 0
            break
        decoded += int(row[0]) - int(start)
        changes += row[2]
        # The advance decodes from restart_lsn to the target again.
        start = restart_lsn(conn, slot)
        conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, row[1]))
        decoded += int(row[0]) - int(start)
    elapsed = time.monotonic() - t0
    cpu = cpu_seconds([pid]) - cpu0
    conn.close()
    return {"changes": changes, "elapsed_s": elapsed, "cpu_s": cpu, "wal_decoded": decoded, "calls": calls}


def one_session(slot):
    conn = connect()
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    start = restart_lsn(conn, slot)
    cpu0, t0 = cpu_seconds([pid]), time.monotonic()
    row = conn.execute(
        f"SELECT max(lsn) - '0/0'::pg_lsn, count(*) FILTER (WHERE get_byte(data, 0) IN (73, 85, 68)) "
        f"FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, {OPTS})", (slot,)).fetchone()
    elapsed = time.monotonic() - t0
    cpu = cpu_seconds([pid]) - cpu0
    conn.close()
    return {"changes": row[1], "elapsed_s": elapsed, "cpu_s": cpu, "wal_decoded": int(row[0]) - int(start), "calls": 1}


def walsender(slot, rows):
    conn = connect()
    start = restart_lsn(conn, slot)
    end = conn.execute("SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn").fetchone()[0]
    conn.close()
    env = os.environ
    t0 = time.monotonic()
    out = subprocess.run([PROBE, os.path.join(env["PG_CDC_RUN"], "sock"), env["PGPORT"], "postgres", env["PGDATABASE"],
                          slot, "rp_bench_pub", str(rows)], check=True, capture_output=True, text=True).stdout
    elapsed = time.monotonic() - t0
    r = json.loads(out)
    return {"changes": r["changes"], "elapsed_s": elapsed, "cpu_s": r["client_cpu_s"] + r["walsender_cpu_s"],
            "cpu_walsender_s": r["walsender_cpu_s"], "cpu_client_s": r["client_cpu_s"],
            "wal_decoded": int(end) - int(start), "calls": 1}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--row-bytes", type=int, default=200)
    ap.add_argument("--txn-rows", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=100_000, help="the peek loop's upto_nchanges (cdc.batch_changes)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    a = ap.parse_args()
    if not os.path.exists(PROBE):
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "cdc-repl", "--example", "stream_probe"],
                       cwd=ROOT, check=True)
    conn = connect()
    slots = {"peek loop": "rp_bench_peek", "one session": "rp_bench_session", "walsender": "rp_bench_walsender"}
    conn.execute("DROP PUBLICATION IF EXISTS rp_bench_pub")
    conn.execute("DROP TABLE IF EXISTS rp_bench")
    for s in slots.values():
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (s,))
    conn.execute("CREATE TABLE rp_bench (id bigint PRIMARY KEY, payload text)")
    conn.execute("CREATE PUBLICATION rp_bench_pub FOR TABLE rp_bench")
    for s in slots.values():
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))
    pad = max(1, a.row_bytes - 40)
    w0 = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0]
    for lo in range(0, a.rows, a.txn_rows):
        conn.execute("INSERT INTO rp_bench SELECT g, repeat('x', %s::int) FROM generate_series(%s::bigint, %s::bigint) g",
                     (pad, lo + 1, min(a.rows, lo + a.txn_rows)))
    wal = int(conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0]) - int(w0)
    conn.execute("CHECKPOINT")
    results = {
        "peek loop": peek_loop(slots["peek loop"], a.batch),
        "one session": one_session(slots["one session"]),
        "walsender": walsender(slots["walsender"], a.rows),
    }
    for s in slots.values():
        conn.execute("SELECT pg_drop_replication_slot(%s)", (s,))
    conn.execute("DROP PUBLICATION rp_bench_pub")
    conn.execute("DROP TABLE rp_bench")
    conn.close()

    base = results["walsender"]
    lines = [
        "# Read path prototype: one backlog read three ways",
        "",
        f"{a.rows:,} inserts of ~{a.row_bytes} B in transactions of {a.txn_rows:,} ({wal / 2**20:.0f} MiB of WAL), "
        f"written before any read; each way reads its own slot created at the same position. Generated by "
        f"`bench/read_path.py`; one run, {time.strftime('%Y-%m-%d')}, 2 shared cores.",
        "",
        "| way | changes | calls | WAL decoded | WAL decoded per change | elapsed | changes/s | CPU s per 100k changes | CPU vs walsender |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        per100k = r["cpu_s"] / max(r["changes"], 1) * 100_000
        lines.append(
            f"| {name} | {r['changes']:,} | {r['calls']} | {r['wal_decoded'] / 2**20:,.0f} MiB | "
            f"{r['wal_decoded'] / max(r['changes'], 1):,.0f} B | {r['elapsed_s']:.2f} s | "
            f"{r['changes'] / r['elapsed_s']:,.0f} | {per100k:.3f} | {r['cpu_s'] / base['cpu_s']:.2f}x |")
    lines += [
        "",
        f"walsender CPU: {base['cpu_walsender_s']:.2f} s in the walsender (decoding, pgoutput, sending) + "
        f"{base['cpu_client_s']:.2f} s in the client (receiving).",
        "",
        "The peek loop's `WAL decoded` counts the peek and the slot advance, each from the slot's restart_lsn; the",
        "worker today also writes a running-xacts record every 2 MB of new WAL, which bounds that in steady state but",
        "not inside a backlog written before it read (this case).",
    ]
    report = "\n".join(lines) + "\n"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "read_path.md"), "w") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
