"""A captured table dropped and created again is never silent: a sink whose `tables` named it keeps the
schema-qualified name it resolved when it was added, lists it in `cdc_status().missing_tables` while it
is gone (and stays running for its other tables), and a later `cdc_enable` of that name binds the new
table to it, whose rows arrive as an `added` snapshot. The same for the lookup table of an `enrich`
transformation and for the table of a regional route; inside one transaction too.

The oracle is the source tables (SELECT) against the events an in-database sink wrote (SELECT): nothing
of the worker's state. The negative controls are the new table's rows written before `cdc_enable`:
without the rebinding they never arrive, and the same `CREATE TABLE` without `cdc_enable` leaves the
table missing."""
import http.server
import json
import threading

import psycopg

from conftest import PG_DSN, connect, wait_for
from test_table_sink import events, tsinks, wait_events  # noqa: F401 (tsinks: a fixture)


def missing(pg, sink):
    return pg.execute("SELECT missing_tables FROM cdc_status() WHERE sink_name = %s", (sink,)).fetchone()[0]


def state(pg, sink):
    return pg.execute("SELECT state, last_error FROM _cdc_sinks WHERE sink_name = %s", (sink,)).fetchone()


def rows_of(pg, event_table, table, after=0):
    """The rows the sink's events after event id `after` fold to for `table` (READ and INSERT add,
    UPDATE replaces, DELETE removes), by id."""
    folded = {}
    for event_id, _, _, op, key, ev in events(pg, event_table):
        if ev["metadata"]["table"] != table or event_id <= after:
            continue
        if op in ("READ", "INSERT", "UPDATE"):
            folded[key["id"]] = ev["after"]
        elif op == "DELETE":
            folded.pop(key["id"], None)
    return folded


def table_rows(pg, table):
    cols = [r[0] for r in pg.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                                      "AND NOT attisdropped ORDER BY attnum", (table,)).fetchall()]
    return {r[0]: dict(zip(cols, r)) for r in pg.execute(f"SELECT * FROM {table}").fetchall()}


def wait_folded(pg, event_table, table, what, after=0):
    return wait_for(lambda: rows_of(pg, event_table, table, after) == table_rows(pg, table), timeout=60, what=what)


def last_event(pg, event_table):
    return pg.execute(f"SELECT coalesce(max(event_id), 0) FROM {event_table}").fetchone()[0]


def test_a_dropped_table_is_listed_missing_and_cdc_enable_of_its_name_binds_the_new_one(pg, tsinks, unique):
    t, other, ev = f"dr_{unique}", f"dr_other_{unique}", f"dr_events_{unique}"
    for table in (t, other):
        pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
        pg.execute("SELECT cdc_enable(%s)", (table,))
    sink = tsinks.add(f"dr_{unique}", ev, tables=[t, other])
    pg.execute(f"INSERT INTO {t} VALUES (1, 'old table')")
    pg.execute(f"INSERT INTO {other} VALUES (1, 'other')")
    wait_events(pg, ev, 2)
    assert missing(pg, sink) == []

    pg.execute(f"DROP TABLE {t}")
    assert missing(pg, sink) == [f"public.{t}"], "the dropped table is named, schema-qualified"
    # The sink goes on for its other table.
    pg.execute(f"INSERT INTO {other} VALUES (2, 'after the drop')")
    wait_folded(pg, ev, other, "the other table's change")
    assert state(pg, sink)[0] == "running"

    dropped_at = last_event(pg, ev)
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute(f"INSERT INTO {t} VALUES (10, 'new table, before cdc_enable'), (11, 'also before')")
    assert missing(pg, sink) == [f"public.{t}"], "CREATE TABLE alone binds nothing"
    pg.execute("SELECT cdc_enable(%s)", (t,))
    assert missing(pg, sink) == []
    new_oid = pg.execute("SELECT %s::regclass::oid", (t,)).fetchone()[0]
    assert new_oid in pg.execute("SELECT table_oids FROM _cdc_sinks WHERE sink_name = %s", (sink,)).fetchone()[0]
    pg.execute(f"INSERT INTO {t} VALUES (12, 'after cdc_enable')")
    pg.execute(f"UPDATE {t} SET v = 'changed' WHERE id = 10")
    wait_folded(pg, ev, t, "the new table's rows (its added snapshot) and changes", after=dropped_at)
    ops = [(op, key["id"]) for _, _, _, op, key, e in events(pg, ev)
           if e["metadata"]["table"] == t and key["id"] >= 10]
    assert ("READ", 11) in ops, f"the rows written before cdc_enable arrive as READ events: {ops}"
    # The old table's row stays as it was delivered (the sink keeps its events); nothing of the old
    # table arrives twice.
    old = [(op, key["id"]) for _, _, _, op, key, e in events(pg, ev) if e["metadata"]["table"] == t and key["id"] == 1]
    assert old == [("INSERT", 1)]
    assert state(pg, sink)[0] == "running"


def test_drop_and_create_again_in_one_transaction_rebinds_at_commit(pg, tsinks, unique):
    t, ev = f"drtx_{unique}", f"drtx_events_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sink = tsinks.add(f"drtx_{unique}", ev, tables=[t])
    pg.execute(f"INSERT INTO {t} VALUES (1, 'old')")
    wait_events(pg, ev, 1)
    dropped_at = last_event(pg, ev)
    with connect() as c:
        c.execute("BEGIN")
        c.execute(f"DROP TABLE {t}")
        c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, extra int)")
        c.execute(f"INSERT INTO {t} VALUES (5, 'in the transaction', 1)")
        c.execute("SELECT cdc_enable(%s)", (t,))
        c.execute("COMMIT")
    assert missing(pg, sink) == []
    pg.execute(f"INSERT INTO {t} VALUES (6, 'after', 2)")
    wait_folded(pg, ev, t, "the re-created table's rows", after=dropped_at)
    assert state(pg, sink)[0] == "running"


def test_a_rename_keeps_the_binding_and_the_added_name_is_what_a_drop_leaves_missing(pg, tsinks, unique):
    t, ev = f"drrn_{unique}", f"drrn_events_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sink = tsinks.add(f"drrn_{unique}", ev, tables=[t])
    pg.execute(f"ALTER TABLE {t} RENAME TO {t}_old")
    pg.execute(f"INSERT INTO {t}_old VALUES (1, 'renamed')")
    wait_events(pg, ev, 1)
    assert missing(pg, sink) == []
    # The usual swap: a new table takes the name, the old one is dropped.
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute(f"DROP TABLE {t}_old")
    assert missing(pg, sink) == [f"public.{t}"], "the name the sink resolved when it was added"
    # cdc_enable of another table binds nothing.
    pg.execute(f"CREATE TABLE {t}_x (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (f"{t}_x",))
    assert missing(pg, sink) == [f"public.{t}"]
    pg.execute(f"INSERT INTO {t} VALUES (2, 'new')")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    assert missing(pg, sink) == []
    wait_for(lambda: (2, "new") in [(k["id"], e["after"]["v"]) for _, _, _, _, k, e in events(pg, ev)],
             what="the new table's row")
    pg.execute(f"DROP TABLE {t}_x")


def test_a_dropped_lookup_table_is_missing_its_events_carry_no_lookup_row_and_cdc_enable_binds_the_new_one(
        pg, tsinks, unique):
    t, lookup, ev = f"drl_{unique}", f"drl_lookup_{unique}", f"drl_events_{unique}"
    pg.execute(f"CREATE TABLE {lookup} (code text PRIMARY KEY, label text)")
    pg.execute(f"INSERT INTO {lookup} VALUES ('a', 'first label')")
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, code text)")
    pg.execute("SELECT cdc_enable(%s, %s::jsonb)", (t, json.dumps({"transformations": [
        {"type": "enrich", "source_column": "code", "lookup_table": lookup, "lookup_column": "code",
         "add_columns": ["label"]}]})))
    sink = tsinks.add(f"drl_{unique}", ev, tables=[t])
    pg.execute(f"INSERT INTO {t} VALUES (1, 'a')")
    wait_events(pg, ev, 1)
    assert events(pg, ev)[-1][5]["after"]["label"] == "first label"

    pg.execute(f"DROP TABLE {lookup}")
    assert missing(pg, sink) == [f"public.{lookup} (lookup of {t})"]
    # As of their commit the lookup table holds no row: the events come, without its columns' values.
    pg.execute(f"INSERT INTO {t} VALUES (2, 'a')")
    wait_events(pg, ev, 2)
    assert events(pg, ev)[-1][5]["after"]["label"] is None
    assert state(pg, sink) == ("running", None)

    pg.execute(f"CREATE TABLE {lookup} (code text PRIMARY KEY, label text)")
    pg.execute(f"INSERT INTO {lookup} VALUES ('a', 'second label')")
    pg.execute("SELECT cdc_enable(%s)", (lookup,))
    assert missing(pg, sink) == []
    pg.execute(f"INSERT INTO {t} VALUES (3, 'a')")
    wait_events(pg, ev, 3)
    assert events(pg, ev)[-1][5]["after"]["label"] == "second label"
    pg.execute(f"UPDATE {lookup} SET label = 'third label'")
    pg.execute(f"INSERT INTO {t} VALUES (4, 'a')")
    wait_events(pg, ev, 4)
    assert events(pg, ev)[-1][5]["after"]["label"] == "third label", "the new lookup table's changes are followed"
    assert state(pg, sink) == ("running", None)


def test_a_routed_table_dropped_and_created_again_is_routed_again(pg, tsinks, unique):
    t = f"drrt_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, region text)")
    east = tsinks.add(f"drrt_east_{unique}", f"drrt_east_events_{unique}", tables=[t])
    west = tsinks.add(f"drrt_west_{unique}", f"drrt_west_events_{unique}", tables=[t])
    routing = json.dumps({"regional_routing": {"routing_column": "region", "routes": {"east": [east], "west": [west]}}})
    pg.execute("SELECT cdc_enable_multicloud(%s, %s::jsonb)", (t, routing))
    pg.execute(f"INSERT INTO {t} VALUES (1, 'east'), (2, 'west')")
    wait_events(pg, f"drrt_east_events_{unique}", 1)
    wait_events(pg, f"drrt_west_events_{unique}", 1)

    pg.execute(f"DROP TABLE {t}")
    assert missing(pg, east) == [f"public.{t}"] and missing(pg, west) == [f"public.{t}"]
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, region text)")
    pg.execute(f"INSERT INTO {t} VALUES (3, 'east'), (4, 'west')")
    pg.execute("SELECT cdc_enable_multicloud(%s, %s::jsonb)", (t, routing))
    assert missing(pg, east) == [] and missing(pg, west) == []
    pg.execute(f"INSERT INTO {t} VALUES (5, 'east'), (6, 'west')")

    def ids(sink_events):
        return sorted(k["id"] for _, _, _, _, k, _ in events(pg, sink_events))
    wait_for(lambda: ids(f"drrt_east_events_{unique}") == [1, 3, 5], what="east's rows")
    wait_for(lambda: ids(f"drrt_west_events_{unique}") == [2, 4, 6], what="west's rows")


class GatedHook:
    """An HTTP server whose answers wait until `open` is set: a webhook sink's delivery is held in
    flight for as long as a test needs."""

    def __init__(self):
        self.open = threading.Event()
        self.arrived = threading.Event()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.arrived.set()
                hook.open.wait(60)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/cdc"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.open.set()
        self.server.shutdown()


def test_no_offsets_row_is_named_by_a_bare_oid_when_the_table_is_dropped_during_its_delivery(pg, unique):
    """The table is dropped while its change is in flight to the destination: the worker records the
    delivery after the drop, when `regclass::text` of the table's OID is only a number."""
    t, name = f"droff_{unique}", f"droff_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    hook = GatedHook()
    try:
        pg.execute("SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)",
                   (name, json.dumps({"url": hook.url, "tables": [t], "snapshot_mode": "never"})))
        with connect() as c:
            c.execute("BEGIN")
            c.execute(f"INSERT INTO {t} VALUES (1)")
            # Before the commit record: the slot is confirmed past it once the delivery is recorded.
            written = c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
            c.execute("COMMIT")
        assert hook.arrived.wait(60), "the delivery reached the hook"
        pg.execute(f"DROP TABLE {t}")
        hook.open.set()
        # The worker confirms the slot in the transaction that records the delivery in _cdc_offsets.
        wait_for(lambda: pg.execute("SELECT r.confirmed_flush_lsn > %s::pg_lsn FROM pg_replication_slots r "
                                    "JOIN _cdc_sinks s ON s.slot_name = r.slot_name WHERE s.sink_name = %s",
                                    (written, name)).fetchone()[0], what="the delivery recorded")
        bare = pg.execute("SELECT table_name FROM _cdc_offsets WHERE table_name ~ '^[0-9]+$'").fetchall()
        assert bare == [], f"offsets rows named by a bare OID: {bare}"
    finally:
        pg.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (name, name))
        hook.close()


def test_a_role_that_is_not_superuser_drops_its_tables_captured_or_not(pg, tsinks, unique):
    """The drop trigger runs for every DROP of every role: it must not need rights on pg_cdc's catalog
    (before, a role without them could drop no table at all while pg_cdc was installed)."""
    role, t, plain, ev = f"dr_role_{unique}", f"drown_{unique}", f"drplain_{unique}", f"drown_events_{unique}"
    pg.execute(f"CREATE ROLE {role} LOGIN")
    pg.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
    try:
        with psycopg.connect(PG_DSN.replace("user=postgres", f"user={role}"), autocommit=True) as app:
            app.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
            app.execute(f"CREATE TABLE {plain} (id int)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
        sink = tsinks.add(f"drown_{unique}", ev, tables=[t])
        with psycopg.connect(PG_DSN.replace("user=postgres", f"user={role}"), autocommit=True) as app:
            app.execute(f"DROP TABLE {plain}")
            app.execute(f"DROP TABLE {t}")
        assert missing(pg, sink) == [f"public.{t}"]
    finally:
        pg.execute(f"DROP TABLE IF EXISTS {t}, {plain}")
        pg.execute(f"REVOKE CREATE ON SCHEMA public FROM {role}")
        pg.execute(f"DROP ROLE {role}")
