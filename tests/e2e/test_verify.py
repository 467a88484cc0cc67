"""cdc_verify: a captured table against what a table sink's event table holds. The oracle is the
table itself (the call's result must say the two match while writes go on, with masks, a filter and a
column left out applied), and the negative controls are rows broken, removed and added at the
destination by hand, which the call must name, key by key."""
import json
import random
import threading

import psycopg
import pytest

from conftest import connect, typed_sinks, wait_for


@pytest.fixture
def table_sinks(pg):
    with typed_sinks(pg, "table") as s:
        yield s


def verify(pg, sink, table, max_differences=10):
    return pg.execute("SELECT cdc_verify(%s, %s, %s)", (sink, table, max_differences)).fetchone()[0]


def setup(pg, table_sinks, unique, rows=300):
    t, et, name = f"ver_{unique}", f"ver_e_{unique}", f"ver_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, ssn text, price numeric(10,2), note text)")
    pg.execute(f"INSERT INTO {t} SELECT g, 'v' || g, 'ssn-' || g, g * 1.25, 'n' FROM generate_series(1, {rows}) g")
    pg.execute("SELECT cdc_enable(%s, %s::jsonb)", (t, json.dumps({
        "exclude_columns": ["note"],
        "filter": "id % 10 <> 0",
        "transformations": [{"type": "mask", "column": "ssn", "method": "hash"}]})))
    table_sinks.add(name, {"table": et, "tables": [t]})
    wait_for(lambda: pg.execute("SELECT count(*) FROM cdc_snapshots WHERE sink_name = %s AND state = 'done'",
                                (name,)).fetchone()[0] == 1, timeout=60, what="the snapshot delivered")
    return t, et, name


class Churn:
    """Updates, deletes and inserts random rows of `table`, one per transaction, until stopped."""

    def __init__(self, table, rows):
        self.table, self.rows, self.stop, self.count = table, rows, threading.Event(), 0
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        rnd = random.Random(7)
        with connect() as app:
            while not self.stop.is_set():
                i = rnd.randint(1, self.rows * 2)
                op = rnd.choice(("update", "update", "delete", "insert"))
                if op == "update":
                    app.execute(f"UPDATE {self.table} SET v = v || 'x', price = price + 1 WHERE id = %s", (i,))
                elif op == "delete":
                    app.execute(f"DELETE FROM {self.table} WHERE id = %s", (i,))
                else:
                    app.execute(f"INSERT INTO {self.table} VALUES (%s, 'new', 'ssn', 1.5, 'n') ON CONFLICT DO NOTHING", (i,))
                self.count += 1

    def finish(self):
        self.stop.set()
        self.thread.join()


def test_a_table_sink_matches_its_table_while_writes_go_on(pg, table_sinks, unique):
    t, et, name = setup(pg, table_sinks, unique)
    out = verify(pg, name, t)
    # 300 rows, every tenth left out by the filter.
    assert out["matches"] is True and out["differing_rows"] == 0, out
    assert out["source"] == out["destination"] and out["source"]["rows"] == 270, out
    assert out["filtered_rows"] == 30 and out["differences"] == [], out
    churn = Churn(t, 300)
    try:
        wait_for(lambda: churn.count > 200, what="writes under way")
        for _ in range(3):
            out = verify(pg, name, t)
            assert out["matches"] is True, out
            assert out["source"]["checksum"] == out["destination"]["checksum"], out
    finally:
        churn.finish()
    assert churn.count > 200
    # And after the writes: the table as it is now, with its own count.
    expected = pg.execute(f"SELECT count(*) FROM {t} WHERE id % 10 <> 0").fetchone()[0]
    out = verify(pg, name, t)
    assert out["matches"] is True and out["source"]["rows"] == expected == out["destination"]["rows"], out


def test_a_broken_a_missing_and_an_extra_row_are_named(pg, table_sinks, unique):
    t, et, name = setup(pg, table_sinks, unique, rows=50)
    assert verify(pg, name, t)["matches"] is True
    last = f"(SELECT max(event_id) FROM {et} WHERE (event_key ->> 'id')::int = %s)"
    # Broken: row 7's last event says another price. Missing: row 8's events gone. Extra: row 11 deleted
    # at the source, and its DELETE event removed from the destination.
    pg.execute(f"UPDATE {et} SET event = jsonb_set(event, '{{after,price}}', '99.99') WHERE event_id = {last}", (7,))
    pg.execute(f"DELETE FROM {et} WHERE (event_key ->> 'id')::int = 8")
    pg.execute(f"DELETE FROM {t} WHERE id = 11")
    wait_for(lambda: pg.execute(f"SELECT count(*) FROM {et} WHERE operation = 'DELETE'").fetchone()[0] == 1,
             what="the delete delivered")
    pg.execute(f"DELETE FROM {et} WHERE operation = 'DELETE'")
    out = verify(pg, name, t, max_differences=2)
    assert out["matches"] is False and out["differing_rows"] == 3, out
    # 45 published rows: the source lost row 11; the destination lost row 8 and kept row 11.
    assert out["source"]["rows"] == 44 and out["destination"]["rows"] == 44, out
    assert out["source"]["checksum"] != out["destination"]["checksum"]
    assert len(out["differences"]) == 2, "bounded by max_differences"
    everything = verify(pg, name, t, max_differences=100)["differences"]
    by_key = {d["key"]["id"]: d for d in everything}
    assert set(by_key) == {7, 8, 11}, everything
    assert by_key[7]["destination"]["price"] == 99.99 and by_key[7]["source"]["price"] == 8.75
    assert by_key[8]["destination"] is None and by_key[8]["source"]["v"] == "v8"
    assert by_key[11]["source"] is None and by_key[11]["destination"]["id"] == 11
    # The mask is applied on both sides: the source's value is the hash the sink wrote, not the SSN.
    assert by_key[7]["source"]["ssn"] != "ssn-7" and "note" not in by_key[7]["source"]


def test_verify_refuses_what_it_cannot_compare(pg, table_sinks, sinks, unique):
    t, et, name = setup(pg, table_sinks, unique, rows=5)
    with pytest.raises(psycopg.errors.UndefinedObject):
        verify(pg, f"nope_{unique}", t)
    kafka = f"ver_k_{unique}"
    sinks.add(kafka, f"ver-k-{unique}", tables=[t])
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="reads back table sinks"):
        verify(pg, kafka, t)
    other = f"ver_o_{unique}"
    pg.execute(f"CREATE TABLE {other} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (other,))
    with pytest.raises(psycopg.errors.UndefinedObject, match="does not carry"):
        verify(pg, name, other)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        verify(pg, name, t, max_differences=-1)
    with connect() as c:
        with pytest.raises(psycopg.errors.ActiveSqlTransaction):
            with c.transaction():
                c.execute("SELECT cdc_verify(%s, %s)", (name, t))
    # A sink that is not delivering: the call says so once its timeout passes.
    pg.execute("SELECT cdc_pause_sink(%s)", (name,))
    wait_for(lambda: pg.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                (f"pg_cdc worker: {name}",)).fetchone()[0] == 0, what="its worker gone")
    pg.execute(f"INSERT INTO {t} VALUES (100, 'late', 's', 1, 'n')")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=r"\(paused\) has not delivered"):
        pg.execute("SELECT cdc_verify(%s, %s, timeout_ms => 500)", (name, t))
