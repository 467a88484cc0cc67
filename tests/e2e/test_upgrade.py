"""ALTER EXTENSION pg_cdc UPDATE from the previous release while a sink delivers and the application
writes: the sink, its slot and its progress are kept, and every row arrives exactly once."""
import json
import os
import threading
import time

import psycopg

from conftest import connect, consume, delivery_status, restart_worker, wait_for


def drop_extension(pg):
    """DROP EXTENSION pg_cdc CASCADE, again if it was chosen as a deadlock's victim: the launcher reads
    its catalog tables in one transaction while the drop takes them one by one (a known limit, in the
    SQL reference: run the drop again)."""
    for _ in range(5):
        try:
            pg.execute("DROP EXTENSION pg_cdc CASCADE")
            return
        except psycopg.errors.DeadlockDetected:
            time.sleep(0.5)
    pg.execute("DROP EXTENSION pg_cdc CASCADE")


def test_update_from_0_1_0_while_delivering_keeps_every_sink_exactly_once(pg, sinks, unique):
    t, topic, name = f"upg_{unique}", f"upg-{unique}", f"upg_{unique}"
    default = pg.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'pg_cdc'").fetchone()[0]
    drop_extension(pg)
    pg.execute("CREATE EXTENSION pg_cdc VERSION '0.1.0'")
    try:
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, phase text)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
        sinks.add(name, topic, tables=[t])
        before = pg.execute("SELECT sink_id, slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()

        # The application keeps writing, one transaction per row, through the update.
        stop, written = threading.Event(), []

        def write():
            with connect() as app:
                i = 0
                while not stop.is_set():
                    i += 1
                    app.execute(f"INSERT INTO {t} VALUES (%s, %s)", (i, "0.1.0"))
                    written.append(i)
                    time.sleep(0.005)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            consume(topic, 50, timeout=60)  # delivering on 0.1.0
            with connect() as dba:
                dba.execute("ALTER EXTENSION pg_cdc UPDATE")
                assert dba.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0] == default
            time.sleep(2.0)
        finally:
            stop.set()
            writer.join()
        n = len(written)
        msgs = consume(topic, n, timeout=120)
        ids = [m["value"]["after"]["id"] for m in msgs]
        assert sorted(ids) == list(range(1, n + 1)), f"{len(ids)} events for {n} rows (each exactly once)"
        after = pg.execute("SELECT sink_id, slot_name, state FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()
        assert after[:2] == before and after[2] == "running"
        # 0.5.0 filled in the name the sink's `tables` resolved to, and nothing is missing.
        assert pg.execute("SELECT table_names FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0] == \
            [f"public.{t}"]
        assert pg.execute("SELECT missing_tables FROM cdc_status() WHERE sink_name = %s", (name,)).fetchone()[0] == []
        published = wait_for(lambda: (p := pg.execute("SELECT events_published FROM _cdc_offsets WHERE sink_name = %s",
                                                       (name,)).fetchone()) and p[0] >= n and p[0], what="offsets")
        assert published == n
        assert delivery_status(pg, name)["deduplication"]["duplicate_events_filtered"] == 0
        pg.execute("SELECT cdc_disable(%s)", (t,))
    finally:
        if pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0] != default:
            pg.execute("ALTER EXTENSION pg_cdc UPDATE")


def test_update_from_0_5_0_merges_the_rows_a_rename_split(pg, sinks, unique):
    """Before 0.6.0 _cdc_offsets was keyed by the table's printed name, so a RENAME started a second row
    for the same table; the update makes them one (counts added) with the bare name and the schema."""
    t, topic, name = f"upgr_{unique}", f"upgr-{unique}", f"upgr_{unique}"
    default = pg.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'pg_cdc'").fetchone()[0]
    drop_extension(pg)
    pg.execute("CREATE EXTENSION pg_cdc VERSION '0.5.0'")
    try:
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
        sinks.add(name, topic, tables=[t])
        pg.execute(f"INSERT INTO {t} VALUES (1), (2)")
        count = "SELECT coalesce(sum(events_published), 0) FROM _cdc_offsets WHERE sink_name = %s"
        wait_for(lambda: pg.execute(count, (name,)).fetchone()[0] == 2, what="2 events recorded")
        pg.execute(f"ALTER TABLE {t} RENAME TO {t}_r")
        pg.execute(f"INSERT INTO {t}_r VALUES (3)")
        wait_for(lambda: pg.execute(count, (name,)).fetchone()[0] == 3, what="3 events recorded")
        split = pg.execute("SELECT table_name, events_published FROM _cdc_offsets WHERE sink_name = %s ORDER BY 1",
                           (name,)).fetchall()
        assert split == [(t, 2), (f"{t}_r", 1)], "0.5.0: a row per name the table had"

        pg.execute("ALTER EXTENSION pg_cdc UPDATE")
        rows = pg.execute("SELECT table_schema, table_name, events_published FROM _cdc_offsets WHERE sink_name = %s",
                          (name,)).fetchall()
        assert rows == [("public", f"{t}_r", 3)]
        pg.execute(f"INSERT INTO {t}_r VALUES (4)")
        wait_for(lambda: pg.execute(count, (name,)).fetchone()[0] == 4, what="4 events recorded")
        assert pg.execute("SELECT count(*) FROM _cdc_offsets WHERE sink_name = %s", (name,)).fetchone()[0] == 1
        assert pg.execute("SELECT table_schema, table_name FROM cdc_snapshots WHERE sink_name = %s",
                          (name,)).fetchall() == [("public", f"{t}_r")]
        assert len(consume(topic, 4)) == 4
        pg.execute(f"SELECT cdc_disable('{t}_r')")
    finally:
        if pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0] != default:
            pg.execute("ALTER EXTENSION pg_cdc UPDATE")


def test_update_from_0_6_0_keeps_the_sinks_superusers_added_working(pg, unique):
    """0.7.0 checks what a sink added by a role that is not a superuser may do, also when its worker
    connects (a postgres sink may not connect by trust). Sinks of 0.6.0 were added by superusers: after
    the update they have no added_by and keep working, a trust connection included (test_delegation.py
    shows the same connection refused for a cdc_admin member's sink)."""
    t, name, db = f"upgd_{unique}", f"upgd_{unique}", f"pg_cdc_upgd_{unique}"
    host, port = os.environ.get("PGHOST", "127.0.0.1"), os.environ.get("PGPORT", "55432")
    default = pg.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'pg_cdc'").fetchone()[0]
    drop_extension(pg)
    pg.execute("CREATE EXTENSION pg_cdc VERSION '0.6.0'")
    pg.execute(f"CREATE DATABASE {db}")
    try:
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
        # Trust (loopback, as the server's superuser): what a cdc_admin member may not add.
        conninfo = f"host={host} port={port} dbname={db} user=postgres"
        pg.execute("SELECT cdc_add_sink(%s, 'postgres', %s::jsonb)",
                   (name, json.dumps({"connection": conninfo, "tables": [t]})))
        pg.execute(f"INSERT INTO {t} VALUES (1)")
        with psycopg.connect(f"host={host} port={port} dbname={db} user=postgres", autocommit=True) as target:
            def ids():
                if not target.execute("SELECT to_regclass(%s) IS NOT NULL", (f"public.{t}",)).fetchone()[0]:
                    return []
                return target.execute(f"SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM public.{t}").fetchone()[0]
            wait_for(lambda: ids() == [1], timeout=60, what="0.6.0: the row applied")
            pg.execute("ALTER EXTENSION pg_cdc UPDATE")
            assert pg.execute("SELECT added_by FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone() == (None,)
            pg.execute(f"INSERT INTO {t} VALUES (2)")
            # A new worker reads the new catalog (restart it, as a server restart would).
            restart_worker(pg)
            wait_for(lambda: ids() == [1, 2], timeout=60, what="after the update: the next row applied")
            assert pg.execute("SELECT last_error FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone() == (None,)
    finally:
        pg.execute("SELECT cdc_drop_sink(sink_name) FROM _cdc_sinks WHERE sink_name = %s", (name,))
        pg.execute("SELECT cdc_disable(table_oid::regclass) FROM _cdc_publications WHERE table_oid = to_regclass(%s)", (t,))
        if pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0] != default:
            pg.execute("ALTER EXTENSION pg_cdc UPDATE")
        pg.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def test_update_from_0_7_0_shows_the_new_status_columns_of_a_delivering_sink(pg, sinks, unique):
    """0.8.0 replaces cdc_status (four columns more) and adds cdc_check_failover: a sink of 0.7.0 delivers
    through the update, appears in the new cdc_status with its slot's columns, and monitoring roles keep
    (and get) EXECUTE on both."""
    t, topic, name = f"upg7_{unique}", f"upg7-{unique}", f"upg7_{unique}"
    default = pg.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'pg_cdc'").fetchone()[0]
    drop_extension(pg)
    pg.execute("CREATE EXTENSION pg_cdc VERSION '0.7.0'")
    try:
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
        sinks.add(name, topic, tables=[t])
        pg.execute(f"INSERT INTO {t} VALUES (1)")
        consume(topic, 1)
        pg.execute("ALTER EXTENSION pg_cdc UPDATE")
        assert pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0] == default
        pg.execute(f"INSERT INTO {t} VALUES (2)")
        msgs = consume(topic, 2)
        assert sorted(m["value"]["after"]["id"] for m in msgs) == [1, 2]
        version = int(pg.execute("SHOW server_version_num").fetchone()[0])
        row = pg.execute("SELECT state, slot_failover, slot_invalidation_reason, standby_wait FROM cdc_status() "
                         "WHERE sink_name = %s", (name,)).fetchone()
        # A slot made by 0.7.0 on 17+ is already a failover slot; 15/16 have none.
        assert row == ("running", True if version >= 170000 else None, None, None), row
        assert pg.execute("SELECT count(*) > 0 FROM cdc_check_failover()").fetchone()[0]
        grants = pg.execute(
            "SELECT has_function_privilege('pg_monitor', 'cdc_status()', 'EXECUTE'), "
            "has_function_privilege('pg_monitor', 'cdc_check_failover()', 'EXECUTE'), "
            "has_function_privilege('cdc_admin', 'cdc_check_failover()', 'EXECUTE'), "
            "has_function_privilege('public', 'cdc_check_failover()', 'EXECUTE')").fetchone()
        assert grants == (True, True, True, False), grants
    finally:
        pg.execute("SELECT cdc_drop_sink(sink_name) FROM _cdc_sinks WHERE sink_name = %s", (name,))
        pg.execute("SELECT cdc_disable(table_oid::regclass) FROM _cdc_publications WHERE table_oid = to_regclass(%s)", (t,))
        if pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0] != default:
            pg.execute("ALTER EXTENSION pg_cdc UPDATE")


def test_update_from_0_8_0_lets_a_delivering_sink_pause_and_resume(pg, sinks, unique):
    """0.9.0 adds the paused state (the CHECK constraint), cdc_pause_sink, cdc_resume_sink, cdc_ready and the
    state announcements: a sink of 0.8.0 delivers through the update, is paused and resumed, and its rows
    arrive once each."""
    t, topic, name = f"upg8_{unique}", f"upg8-{unique}", f"upg8_{unique}"
    default = pg.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'pg_cdc'").fetchone()[0]
    drop_extension(pg)
    pg.execute("CREATE EXTENSION pg_cdc VERSION '0.8.0'")
    try:
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
        sinks.add(name, topic, tables=[t])
        pg.execute(f"INSERT INTO {t} VALUES (1)")
        consume(topic, 1)
        pg.execute("ALTER EXTENSION pg_cdc UPDATE")
        assert pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0] == default
        with connect() as listener:
            listener.execute("LISTEN cdc_sink_state")
            assert pg.execute("SELECT cdc_pause_sink(%s)", (name,)).fetchone()[0] is True
            wait_for(lambda: pg.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                        (f"pg_cdc worker: {name}",)).fetchone()[0] == 0, what="its worker gone")
            pg.execute(f"INSERT INTO {t} VALUES (2)")
            assert pg.execute("SELECT ready FROM cdc_ready()").fetchone()[0] is not None
            pg.execute("SELECT cdc_resume_sink(%s)", (name,))
            msgs = consume(topic, 2)
            assert sorted(m["value"]["after"]["id"] for m in msgs) == [1, 2]
            got = [json.loads(n.payload) for n in listener.notifies(timeout=2)]
            assert {"sink": name, "old_state": "running", "new_state": "paused", "reason": None} in got, got
        grants = pg.execute(
            "SELECT has_function_privilege('cdc_admin', 'cdc_pause_sink(text)', 'EXECUTE'), "
            "has_function_privilege('pg_monitor', 'cdc_ready(bigint)', 'EXECUTE'), "
            "has_function_privilege('public', 'cdc_resume_sink(text)', 'EXECUTE')").fetchone()
        assert grants == (True, True, False), grants
    finally:
        pg.execute("SELECT cdc_drop_sink(sink_name) FROM _cdc_sinks WHERE sink_name = %s", (name,))
        pg.execute("SELECT cdc_disable(table_oid::regclass) FROM _cdc_publications WHERE table_oid = to_regclass(%s)", (t,))
        if pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0] != default:
            pg.execute("ALTER EXTENSION pg_cdc UPDATE")


def test_update_from_0_9_0_reconciles_the_sinks_of_the_older_catalog(pg, sinks, unique):
    """0.10.0 adds cdc_reconcile, cdc_export_spec and cdc_verify: a sink of 0.9.0 that delivers through the update is in
    the export (its secrets hidden), the export reconciles as a no-op, and a changed spec alters it in place."""
    t, topic, name = f"upg9_{unique}", f"upg9-{unique}", f"upg9_{unique}"
    default = pg.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'pg_cdc'").fetchone()[0]
    drop_extension(pg)
    pg.execute("CREATE EXTENSION pg_cdc VERSION '0.9.0'")
    try:
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
        sinks.add(name, topic, tables=[t], properties={"client.id": "upg9"})
        pg.execute(f"INSERT INTO {t} VALUES (1)")
        consume(topic, 1)
        pg.execute("ALTER EXTENSION pg_cdc UPDATE")
        assert pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0] == default
        spec = pg.execute("SELECT cdc_export_spec()").fetchone()[0]
        mine = next(s for s in spec["sinks"] if s["name"] == name)
        assert mine["config"]["properties"] == "(unchanged)", mine
        out = pg.execute("SELECT cdc_reconcile(%s::jsonb, false)", (json.dumps(spec),)).fetchone()[0]
        assert out["changes"] == 0, out
        mine["config"]["linger_ms"] = 3
        out = pg.execute("SELECT cdc_reconcile(%s::jsonb, false)", (json.dumps(spec),)).fetchone()[0]
        assert [s["action"] for s in out["sinks"] if s["sink"] == name] == ["alter"], out
        pg.execute(f"INSERT INTO {t} VALUES (2)")
        assert sorted(m["value"]["after"]["id"] for m in consume(topic, 2)) == [1, 2]
        grants = pg.execute(
            "SELECT has_function_privilege('cdc_admin', 'cdc_reconcile(jsonb, boolean)', 'EXECUTE'), "
            "has_function_privilege('public', 'cdc_export_spec()', 'EXECUTE'), "
            "has_function_privilege('cdc_admin', 'cdc_verify(text, regclass, integer, integer)', 'EXECUTE')").fetchone()
        assert grants == (False, False, True), grants
    finally:
        pg.execute("SELECT cdc_drop_sink(sink_name) FROM _cdc_sinks WHERE sink_name = %s", (name,))
        pg.execute("SELECT cdc_disable(table_oid::regclass) FROM _cdc_publications WHERE table_oid = to_regclass(%s)", (t,))
        if pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0] != default:
            pg.execute("ALTER EXTENSION pg_cdc UPDATE")
