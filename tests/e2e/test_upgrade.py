"""ALTER EXTENSION pg_cdc UPDATE from the previous release while a sink delivers and the application
writes: the sink, its slot and its progress are kept, and every row arrives exactly once."""
import threading
import time

import psycopg

from conftest import connect, consume, delivery_status, wait_for


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
