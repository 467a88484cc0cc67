"""`cdc_add_sink` creates its slot while the caller waits, and that never ends in an internal error.

While a new slot looks for its consistent point it waits for the transactions that were writing when
it started, then for those running at the next step, and decodes the WAL in between. A cache
invalidation decoded there (a VACUUM's, written without a transaction id) is applied by PostgreSQL
inside an internal subtransaction whose rollback leaves the resource owner at the top transaction's,
and a query that had called `pg_create_logical_replication_slot` fails at its end with
"XX000: snapshot reference ... is not owned by resource owner TopTransaction" (cdc_add_sink called it
through such a query). The tests play that order out step by step, each step waiting until the slot
creation is blocked where it must be, so they do not depend on chance. The control makes the same
call through a query (PL/pgSQL's PERFORM) in the same order: it must fail."""
import json
import threading
import time

import psycopg

from conftest import BOOTSTRAP, connect, consume, sink_state, wait_for
from test_table_sink import TableSinks


def waiting_on(pg, waiter, holder):
    """Whether backend `waiter` waits for the transaction of backend `holder` to end."""
    return pg.execute("SELECT EXISTS (SELECT 1 FROM pg_locks w JOIN pg_locks h USING (locktype, transactionid) "
                      "WHERE locktype = 'transactionid' AND w.pid = %s AND NOT w.granted "
                      "AND h.pid = %s AND h.granted)", (waiter, holder)).fetchone()[0]


def with_invalidation_while_the_slot_waits(pg, table, statement, params=()):
    """Runs `statement` (which creates a slot) on a connection of its own while: a writer of `table`
    is open when it starts, a second writer starts while it waits for the first, and once the first
    ended and it waits for the second, a VACUUM writes an invalidation without a transaction id.
    Returns {"ok": True} or {"error": (sqlstate, message)}."""
    vac = f"{table}_vacuumed"
    pg.execute(f"CREATE TABLE {vac} (i int)")
    pg.execute(f"INSERT INTO {vac} SELECT generate_series(1, 5000)")
    first, second, caller = connect(), connect(), connect()
    result = {}
    try:
        first.execute("BEGIN")
        first.execute(f"INSERT INTO {table} VALUES (1)")
        first_pid = first.execute("SELECT pg_backend_pid()").fetchone()[0]
        caller_pid = caller.execute("SELECT pg_backend_pid()").fetchone()[0]

        def call():
            try:
                caller.execute(statement, params)
                result["ok"] = True
            except psycopg.Error as e:
                result["error"] = (e.sqlstate, str(e))

        thread = threading.Thread(target=call)
        thread.start()
        wait_for(lambda: waiting_on(pg, caller_pid, first_pid), what="the slot creation waits for the first writer")
        second.execute("BEGIN")
        second.execute(f"INSERT INTO {table} VALUES (2)")
        second_pid = second.execute("SELECT pg_backend_pid()").fetchone()[0]
        first.execute("COMMIT")
        wait_for(lambda: waiting_on(pg, caller_pid, second_pid), what="the slot creation waits for the second writer")
        # VACUUM updates the table's pg_class row in place: an invalidation without a transaction id.
        pg.execute(f"VACUUM {vac}")
        second.execute("COMMIT")
        thread.join(60)
        return result
    finally:
        for c in (first, second, caller):
            c.close()
        pg.execute(f"DROP TABLE {vac}")


def test_cdc_add_sink_survives_an_invalidation_decoded_while_its_slot_waits(pg, unique):
    t, name, ev = f"sc_{unique}", f"sc_{unique}", f"sc_events_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks = TableSinks(pg)
    sinks.added.append((name, ev))
    try:
        result = with_invalidation_while_the_slot_waits(
            pg, t, "SELECT cdc_add_sink(%s, 'table', %s::jsonb)", (name, json.dumps({"table": ev, "tables": [t]})))
        assert result == {"ok": True}, f"cdc_add_sink failed: {result}"
        assert pg.execute("SELECT state <> 'creating_slot' FROM _cdc_sinks WHERE sink_name = %s",
                          (name,)).fetchone()[0], "the call made the slot itself"
        # The slot started after both writers committed: their rows arrive as the sink's snapshot.
        wait_for(lambda: pg.execute(f"SELECT count(*) FROM {ev}").fetchone()[0] == 2, what="both rows delivered")
    finally:
        sinks.drop_all()


def test_control_the_same_order_fails_a_slot_created_through_a_query(pg, unique):
    t, slot = f"sc_ctl_{unique}", f"sc_ctl_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    try:
        result = with_invalidation_while_the_slot_waits(
            pg, t, f"DO $$ BEGIN PERFORM pg_create_logical_replication_slot('{slot}', 'pgoutput'); END $$")
        assert result.get("error", ("", ""))[0] == "XX000", f"the order did not trigger the fault: {result}"
        assert "is not owned by resource owner TopTransaction" in result["error"][1]
    finally:
        pg.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                   (slot,))
        pg.execute(f"DROP TABLE {t}")


def test_a_slot_the_worker_cannot_make_yet_is_made_once_it_can(pg, sinks, unique):
    """A sink added in a transaction that had written gets its slot from the worker after COMMIT. With
    every replication slot in use the worker cannot make it: the sink stays creating_slot with the
    reason and is tried again, and once a slot is free it is made and every row arrives (its snapshot:
    the rows committed before the slot, as READ events). Regression: the failure marked the sink error,
    and since only creating_slot makes a slot, every later pass reported the slot as dropped."""
    t = f"slotlater_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    name, topic = f"slotlater_{unique}", f"slotlater-{unique}"
    fill = []
    try:
        # Slots of sinks dropped by the tests before go first (the launcher drops them shortly after),
        # or one would free up under the fill.
        wait_for(lambda: pg.execute(
            "SELECT count(*) = 0 FROM pg_replication_slots WHERE slot_name LIKE '\\_cdc\\_%' "
            "AND slot_name <> '_cdc_group' AND slot_name NOT IN (SELECT slot_name FROM _cdc_sinks)").fetchone()[0],
            timeout=60, what="no slot of a dropped sink left")
        while True:
            try:
                fill.append(f"e2e_fill_{unique}_{len(fill)}")
                pg.execute("SELECT pg_create_physical_replication_slot(%s)", (fill[-1],))
            except psycopg.errors.ConfigurationLimitExceeded:
                fill.pop()
                break
        with connect() as c:
            c.execute("BEGIN")
            c.execute(f"INSERT INTO {t} VALUES (1, 'before')")
            c.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)",
                      (name, json.dumps({"bootstrap_servers": BOOTSTRAP, "topic": topic, "tables": [t]})))
            c.execute("COMMIT")
        sinks.names.append(name)
        sinks.topics.append(topic)
        state = wait_for(lambda: (s := sink_state(pg, name)) and s[1] and s, what="the failure recorded")
        assert state[0] == "creating_slot" and "cannot create replication slot" in state[1], state
        time.sleep(2)
        assert sink_state(pg, name)[0] == "creating_slot", "still waiting for a slot, not given up"
        pg.execute("SELECT pg_drop_replication_slot(%s)", (fill.pop(),))
        wait_for(lambda: sink_state(pg, name)[0] == "running", timeout=90, what="the slot made and the sink running")
    finally:
        for slot in fill:
            pg.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    pg.execute(f"INSERT INTO {t} VALUES (2, 'after')")
    got = consume(topic, 2, timeout=60)
    assert sorted(m["value"]["after"]["id"] for m in got) == [1, 2], got
    assert sink_state(pg, name) == ("running", None)
