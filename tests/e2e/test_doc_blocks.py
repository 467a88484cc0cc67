"""Every SQL block of README.md and docs/sql-reference.md runs, with psql, as written: each in a scratch
schema of its own (doc_scratch, first on the search_path) holding the tables the documents' examples
name, captured as the examples assume, and removed after with every sink, table and topic the block
made. Names that cannot resolve here are replaced by the local peers `make up` starts (HOSTS, below;
the README lists them); the secret files the blocks name are written into the data directory for the
run. A block found in the documents that this file does not know fails the test, so a new block is
checked from the day it is written. The README's first two blocks are also checked to show what they
say: the two events of the first try, and the Quickstart's UPDATE with its diff."""
import http.server
import json
import os
import re
import subprocess
import threading

import pytest
from confluent_kafka.admin import AdminClient

from conftest import BOOTSTRAP, connect, consume, delete_topics, drop_schema, wait_for, wal_lsn
from test_eventhub_sink import CA, SASL, connection_string

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md", "docs/sql-reference.md"]

# Host names the documents use that do not resolve here, and what stands for them: the local peers.
# (The Event Hubs namespaces get the local SASL_SSL listener and its CA next to them.)
EVENTHUB_LOCAL = f'"bootstrap_servers": "{SASL}", "properties": {{"ssl.ca.location": "{CA}"}}, '
HOSTS = {
    "https://example.com/cdc": "http://127.0.0.1:HOOK_PORT/cdc",
    "http://registry:8081": "http://127.0.0.1:8081",
    "pulsar://broker:6650": "pulsar://127.0.0.1:6650",
    '"namespace": "contoso", ': '"namespace": "contoso", ' + EVENTHUB_LOCAL,
    '"namespace": "helios-cdc", ': '"namespace": "helios-cdc", ' + EVENTHUB_LOCAL,
}

# Secret files the blocks name, relative to the data directory, and what they hold.
SECRETS = {
    "hook.key": lambda: b"doc blocks webhook secret\n",
    "eventhub.conn": lambda: connection_string().encode() + b"\n",
    "eventhub.connection": lambda: connection_string().encode() + b"\n",
}

# The scratch schema's tables (what the documents' examples name), and which are captured before a
# block runs, with the configs the documents give them.
TABLES = """
CREATE TABLE orders (order_id text PRIMARY KEY, customer_id text, total numeric(10,2), status text,
                     updated_at timestamptz DEFAULT now(), internal_notes text, account_id text);
CREATE TABLE events (id bigint, payload text);
CREATE TABLE global_customers (id int PRIMARY KEY, name text, customer_region text);
CREATE TABLE sensors (sensor_id text PRIMARY KEY, location text, sensor_type text, owner text);
CREATE TABLE sensor_readings (reading_id text PRIMARY KEY, sensor_id text, reading_value numeric(6,1),
                              threshold numeric(6,1), alert_level text);
SELECT cdc_enable('orders');
SELECT cdc_enable('sensor_readings', '{"filter": "reading_value > threshold"}');
"""

# Each block, by its document and first line (and which occurrence of it): what it needs beyond TABLES
# ("fresh": tables it creates itself, "setup": a statement run first, "sinks": sinks added before it,
# "settled": their snapshots delivered before it runs,
# "demo": make demo's cdc_demo.orders), and the SQLSTATE it may end with here and why.
KNOWN = {
    ("README.md", "CREATE EXTENSION IF NOT EXISTS pg_cdc;", 1): {},
    ("README.md", "CREATE EXTENSION IF NOT EXISTS pg_cdc;", 2): {"fresh": ["orders"]},
    ("README.md", "SELECT cdc_add_sink('orders_dbz', 'kafka', '{"): {},
    ("README.md", "SELECT cdc_add_sink('orders_copy', 'kafka', '{\"topic\": \"orders\", \"snapshot_chunk_size\": 8192}');"): {},
    ("README.md", "-- In the seed's order: the routing first (a WARNING names the sinks that do not exist yet), the sinks after."): {},
    ("README.md", "SELECT cdc_metrics('cdc_demo.orders');  -- source, per-sink and end-to-end figures, in the seed's shape"):
        {"demo": True},
    ("docs/sql-reference.md", "SELECT cdc_enable(table_name => 'orders', config => '{"): {},
    ("docs/sql-reference.md", "SELECT cdc_enable_multicloud(table_name => 'global_customers', config => '{"): {},
    ("docs/sql-reference.md", "SELECT cdc_disable('orders');"): {},
    ("docs/sql-reference.md", "SELECT cdc_add_sink(sink_name => 'kafka_orders', sink_type => 'kafka', config => '{"): {},
    ("docs/sql-reference.md", "SELECT cdc_snapshot('orders');                                -- every sink that carries orders"):
        {"sinks": {"kafka_orders": '{"topic": "orders-cdc", "tables": ["orders"]}'}},
    ("docs/sql-reference.md", "SELECT cdc_cancel_snapshot('orders');                  -- every sink snapshotting orders"):
        {"sinks": {"kafka_orders": '{"topic": "orders-cdc", "tables": ["orders"]}'}},
    ("docs/sql-reference.md", "SELECT sink_name, table_name, state, percent_done, rows_per_second, eta FROM cdc_snapshots WHERE state = 'running';"): {},
    ("docs/sql-reference.md", "SELECT cdc_schema_history('orders');"): {},
    ("docs/sql-reference.md", "SELECT cdc_force_schema_break('orders');"): {},
    ("docs/sql-reference.md", "SELECT cdc_create_version_topic('orders', 3);"):
        # Seed example 3's orders, at version 2 after its first ALTER.
        {"sinks": {"kafka_orders": '{"topic": "cdc.{schema}.{table}", "tables": ["orders"]}'},
         "setup": "ALTER TABLE orders ADD COLUMN shipping_method varchar(50) DEFAULT 'standard'"},
    ("docs/sql-reference.md", "SELECT cdc_check_compatibility(table_name => 'orders', proposed_change => 'ADD COLUMN priority VARCHAR(10) NOT NULL');"): {},
    ("docs/sql-reference.md", "SELECT sink_name, target, attempts, last_error FROM _cdc_cleanups;   -- empty once everything is deleted"): {},
    ("docs/sql-reference.md", "BEGIN;"): {"sinks": {"orders_log": '{"table": "orders_events", "type": "table"}'}},
    ("docs/sql-reference.md", "SELECT cdc_create_tokenization_key();"):
        {"may_fail": ("42710", "this cluster has its key already (tests and the seed examples made it)")},
    ("docs/sql-reference.md", "SELECT cdc_filter_metrics('sensor_readings');"): {},
    ("docs/sql-reference.md", "SELECT cdc_preview('orders');"): {},
    ("docs/sql-reference.md", "SELECT cdc_metrics('orders');"): {},
    ("docs/sql-reference.md", "SELECT sink_name, state, lag_bytes, retained_wal_bytes, end_to_end_p99_ms FROM cdc_status();"): {},
    ("docs/sql-reference.md", "SELECT sink_name, events_published, last_timestamp, NOW() - last_timestamp AS lag"): {},
    ("docs/sql-reference.md", "SELECT * FROM cdc_check_failover() WHERE NOT ok;"): {},
    ("docs/sql-reference.md", "SELECT cdc_alter_sink('kafka_orders', '{\"topic\": \"orders-v2\", \"linger_ms\": 20}');"):
        {"sinks": {"kafka_orders": '{"topic": "orders-cdc", "tables": ["orders"]}'}},
    ("docs/sql-reference.md", "SELECT cdc_pause_sink('kafka_orders');"):
        {"sinks": {"kafka_orders": '{"topic": "orders-cdc", "tables": ["orders"]}'}},
    ("docs/sql-reference.md", "SELECT ready, reasons FROM cdc_ready();"): {},
    ("docs/sql-reference.md", "LISTEN cdc_sink_state;"): {},
    ("docs/sql-reference.md", "SELECT jsonb_pretty(cdc_reconcile('{\"tables\": [{\"name\": \"orders\", \"config\": {\"operations\": [\"INSERT\", \"UPDATE\"]}}],"):
        {},
    ("docs/sql-reference.md", "SELECT jsonb_pretty(cdc_export_spec());"): {},
    ("docs/sql-reference.md", "SELECT cdc_verify('orders_log', 'orders');"):
        {"sinks": {"orders_log": '{"table": "orders_events", "type": "table", "tables": ["orders"]}'}, "settled": True},
}


def blocks():
    """(document, first line, occurrence, line number, text) of every ```sql block."""
    out, seen = [], {}
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc)).read()
        for m in re.finditer(r"```sql\n(.*?)```", text, re.S):
            first = m.group(1).splitlines()[0]
            seen[(doc, first)] = seen.get((doc, first), 0) + 1
            out.append((doc, first, seen[(doc, first)], text[:m.start()].count("\n") + 2, m.group(1)))
    return out


def known(doc, first, n):
    return KNOWN.get((doc, first, n), KNOWN.get((doc, first)))


BLOCKS = blocks()


def test_every_block_is_known():
    """A block this file does not know (new, or its first line changed) must be added to KNOWN."""
    unknown = [f"{doc}:{line}: {first}" for doc, first, n, line, _ in BLOCKS if known(doc, first, n) is None]
    assert not unknown, "SQL blocks no test runs:\n" + "\n".join(unknown)


class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hook_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def secrets():
    """The secret files the blocks name, in the data directory (left alone if they exist)."""
    made = []
    with connect() as c:
        data = c.execute("SHOW data_directory").fetchone()[0]
    st = os.stat(data)
    for name, content in SECRETS.items():
        path = os.path.join(data, name)
        if os.path.exists(path):
            continue
        with open(path, "wb") as f:
            f.write(content())
        os.chown(path, st.st_uid, st.st_gid)
        os.chmod(path, 0o600)
        made.append(path)
    yield
    for p in made:
        os.unlink(p)


def scratch_cleanup(before_sinks, before_topics):
    with connect() as c:
        for (s,) in c.execute("SELECT sink_name FROM _cdc_sinks").fetchall():
            if s not in before_sinks:
                c.execute("SELECT cdc_drop_sink(%s)", (s,))
        for schema in ("doc_scratch", "cdc_demo"):
            drop_schema(c, schema)
    new = [t for t in AdminClient({"bootstrap.servers": BOOTSTRAP}).list_topics(timeout=15).topics
           if t not in before_topics and not t.startswith("__") and not t.startswith("pg_cdc.progress.")]
    delete_topics(new, wait=True)


def run_block(text, hook_port):
    for host, local in HOSTS.items():
        text = text.replace(host, local.replace("HOOK_PORT", str(hook_port)))
    script = "SET search_path = doc_scratch, public;\n" + text
    return subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose"], input=script,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("doc,first,n,line,text", BLOCKS, ids=[f"{b[0]}:{b[3]}" for b in BLOCKS])
def test_block_runs_as_written(doc, first, n, line, text, hook_port, secrets, pg):
    need = known(doc, first, n)
    assert need is not None, "unknown block: see test_every_block_is_known"
    before_sinks = {r[0] for r in pg.execute("SELECT sink_name FROM _cdc_sinks").fetchall()}
    before_topics = set(AdminClient({"bootstrap.servers": BOOTSTRAP}).list_topics(timeout=15).topics)
    try:
        pg.execute("DROP SCHEMA IF EXISTS doc_scratch CASCADE")
        pg.execute("CREATE SCHEMA doc_scratch")
        pg.execute("SET search_path = doc_scratch, public")
        for statement in TABLES.strip().split(";\n"):
            if statement.strip() and not any(f"TABLE {t} " in statement or f"'{t}'" in statement
                                             for t in need.get("fresh", [])):
                pg.execute(statement)
        if need.get("demo"):
            pg.execute("CREATE SCHEMA cdc_demo")
            pg.execute("CREATE TABLE cdc_demo.orders (order_id text PRIMARY KEY, total numeric(10,2))")
            pg.execute("SELECT cdc_enable('cdc_demo.orders')")
        if "setup" in need:
            pg.execute(need["setup"])
        for name, config in need.get("sinks", {}).items():
            cfg = json.loads(config)
            kind = cfg.pop("type", "kafka")
            pg.execute("SELECT cdc_add_sink(%s, %s, %s::jsonb)", (name, kind, json.dumps(cfg)))
        if need.get("settled"):
            # The block reads what the sinks delivered: their snapshots first.
            wait_for(lambda: pg.execute("SELECT count(*) FROM cdc_snapshots WHERE sink_name = ANY (%s) "
                                        "AND state NOT IN ('done', 'skipped')",
                                        (list(need["sinks"]),)).fetchone()[0] == 0, what="the sinks' snapshots")
        pg.execute("RESET search_path")
        start = wal_lsn(pg)
        out = run_block(text, hook_port)
        if out.returncode != 0 and "may_fail" in need:
            state, why = need["may_fail"]
            assert f"ERROR:  {state}:" in out.stderr, f"{doc}:{line}: {out.stderr}"
            pytest.skip(f"{doc}:{line} ends with {state} here: {why}")
        assert out.returncode == 0, f"{doc}:{line}:\n{out.stderr}"
        if (doc, first, n) == ("README.md", "CREATE EXTENSION IF NOT EXISTS pg_cdc;", 1):
            # As shown: the two events, once the worker delivered them.
            got = wait_for(lambda: (r := pg.execute(
                "SELECT event_id, operation, event_key, event -> 'after' FROM doc_scratch.accounts_events "
                "ORDER BY event_id").fetchall()) and len(r) == 2 and r, what="the first try's two events")
            assert got == [(1, "INSERT", {"id": 1}, {"id": 1, "owner": "ada", "balance": 100}),
                           (2, "UPDATE", {"id": 1}, {"id": 1, "owner": "ada", "balance": 90})]
        if (doc, first, n) == ("README.md", "CREATE EXTENSION IF NOT EXISTS pg_cdc;", 2):
            # The topic may hold an earlier run's events: this run's are those committed after it started.
            events = [m["value"] for m in consume("orders-cdc", 3) if m["value"]["metadata"]["commit_lsn"] > start]
            assert [e["metadata"]["operation"] for e in events] == ["INSERT", "UPDATE", "DELETE"]
            assert events[1]["diff"] == {"status": {"from": "pending", "to": "confirmed"}}
            assert "internal_notes" not in events[1]["after"], "include_columns leaves it out"
    finally:
        pg.execute("RESET search_path")
        scratch_cleanup(before_sinks, before_topics)
