"""The in-database sink (sink type `table`): events written to a table of the source database in the
same transaction as the sink's checkpoint, consumed in order with cdc_consume.

The oracle is the source table itself (SELECT), compared with the event table (SELECT): nothing of
the worker's own state."""
import collections
import json
import threading
import time

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import (connect, consume, crash_at_failpoint, delivery_status, server_log, server_settings,
                      sigkill_while_writing, sink_state, wait_for, worker_pid)


class TableSinks:
    """Table sinks a test adds, dropped afterwards with their event tables."""

    def __init__(self, conn):
        self.conn = conn
        self.added = []

    def add(self, name, table, **extra):
        self.conn.execute("SELECT cdc_add_sink(%s, 'table', %s::jsonb)", (name, json.dumps({"table": table, **extra})))
        self.added.append((name, table))
        return name

    def drop_all(self):
        with connect() as conn:
            for name, table in self.added:
                conn.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (name, name))
                conn.execute(f"DROP TABLE IF EXISTS {table}")


@pytest.fixture
def tsinks(pg):
    s = TableSinks(pg)
    yield s
    s.drop_all()


def captured(pg, t, columns="id int PRIMARY KEY, v text"):
    pg.execute(f"CREATE TABLE {t} ({columns})")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    return t


def events(pg, table):
    return pg.execute(f"SELECT event_id, commit_lsn::text, event_index, operation, event_key, event FROM {table} "
                      "ORDER BY event_id").fetchall()


def wait_events(pg, table, n, timeout=60):
    return wait_for(lambda: (c := pg.execute(f"SELECT count(*) FROM {table}").fetchone()[0]) >= n and c,
                    timeout=timeout, what=f"{n} events in {table}")


def assert_exactly_once(pg, source, event_table):
    """Every row of the source table is in the event table once (by its id), nothing else is."""
    ids = collections.Counter(e[5]["after"]["id"] for e in events(pg, event_table) if e[5]["after"])
    dups = {k: v for k, v in ids.items() if v > 1}
    assert not dups, f"duplicates: {dict(list(dups.items())[:10])}"
    src = {r[0] for r in pg.execute(f"SELECT id FROM {source}").fetchall()}
    assert set(ids) == src, f"missing {sorted(src - set(ids))[:10]}, extra {sorted(set(ids) - src)[:10]}"


def test_events_are_in_commit_order_whole_and_each_consumer_reads_each_once(pg, tsinks, unique):
    t = captured(pg, f"tord_{unique}")
    name, table = tsinks.add(f"tord_{unique}", f"tord_events_{unique}"), f"tord_events_{unique}"
    # Interleaved transactions: B commits before A, so B's events come first.
    with connect() as a, connect() as b:
        a.execute("BEGIN")
        b.execute("BEGIN")
        for i in range(3):
            a.execute(f"INSERT INTO {t} VALUES (%s, 'a')", (i,))
            b.execute(f"INSERT INTO {t} VALUES (%s, 'b')", (100 + i,))
        b.execute("COMMIT")
        a.execute("COMMIT")
    pg.execute(f"UPDATE {t} SET v = 'u' WHERE id = 0")
    pg.execute(f"DELETE FROM {t} WHERE id = 1")
    wait_events(pg, table, 8)
    rows = events(pg, table)
    assert [r[5]["after"]["id"] for r in rows[:6]] == [100, 101, 102, 0, 1, 2]
    assert [r[3] for r in rows] == ["INSERT"] * 6 + ["UPDATE", "DELETE"]
    # Each transaction's events are contiguous, numbered 1..n, in commit order.
    by_commit = collections.defaultdict(list)
    for r in rows:
        by_commit[r[1]].append(r[2])
    assert [v for v in by_commit.values()] == [[1, 2, 3], [1, 2, 3], [1], [1]]
    assert [r[4] for r in rows[:2]] == [{"id": 100}, {"id": 101}]
    # The event is pg_cdc's JSON event, and (commit_lsn, event_index) is its identity.
    assert rows[0][5]["metadata"]["table"] == t and rows[0][5]["metadata"]["operation"] == "INSERT"

    # cdc_consume: batches in order; a rolled-back call's batch comes again.
    with connect() as c:
        c.execute("BEGIN")
        first = [r[0] for r in c.execute("SELECT event_id FROM cdc_consume(%s, 3)", (name,)).fetchall()]
        c.execute("ROLLBACK")
    again = [r[0] for r in pg.execute("SELECT event_id FROM cdc_consume(%s, 3)", (name,)).fetchall()]
    assert first == again == [r[0] for r in rows[:3]]
    rest = [r[0] for r in pg.execute("SELECT event_id FROM cdc_consume(%s, 100)", (name,)).fetchall()]
    assert rest == [r[0] for r in rows[3:]]
    assert pg.execute("SELECT count(*) FROM cdc_consume(%s)", (name,)).fetchone()[0] == 0
    # Another consumer name reads everything again, on its own.
    other = [r[0] for r in pg.execute("SELECT event_id FROM cdc_consume(%s, 100, 'audit')", (name,)).fetchall()]
    assert other == [r[0] for r in rows]

    # Two calls of one consumer at once: the second waits for the first and gets the next batch.
    pg.execute(f"INSERT INTO {t} SELECT g, 'c' FROM generate_series(1000, 1009) g")
    wait_events(pg, table, 18)
    got = {}
    with connect() as c1:
        c1.execute("BEGIN")
        got["first"] = [r[0] for r in c1.execute("SELECT event_id FROM cdc_consume(%s, 5, 'pair')", (name,)).fetchall()]

        def second():
            with connect() as c2:
                got["second"] = [r[0] for r in c2.execute("SELECT event_id FROM cdc_consume(%s, 5, 'pair')",
                                                          (name,)).fetchall()]
        th = threading.Thread(target=second)
        th.start()
        time.sleep(1.0)
        assert "second" not in got, "the second call must wait for the first to commit"
        c1.execute("COMMIT")
        th.join(30)
    assert got["first"] == [r[0] for r in rows[:5]] and got["second"] == [r[0] for r in rows[5:8]] + \
        [r[0] for r in events(pg, table)[8:10]]
    # The figures are counted once the slot is confirmed, just after the events' commit.
    status = wait_for(lambda: (s := delivery_status(pg, name))["delivered"]["events"] >= 18
                      and s["state"] == "running" and s, what="counted and running")
    assert status["delivery_mode"] == "exactly_once" and status["state"] == "running"
    assert status["sink_type"] == "table" and status["transaction_status"]["committed_transactions"] >= 1
    assert status["delivered"]["events"] == 18
    wait_for(lambda: pg.execute("SELECT sum(events_published) FROM _cdc_offsets WHERE sink_name = %s",
                                (name,)).fetchone()[0] == 18, what="offsets")
    text = pg.execute("SELECT cdc_prometheus_metrics()").fetchone()[0]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    info = [s for s in families["pg_cdc_sink_info"].samples if s.labels["sink"] == name]
    assert [(s.labels["type"], s.labels["delivery_mode"], s.value) for s in info] == [("table", "exactly_once", 1)]
    published = [s.value for s in families["pg_cdc_events_published"].samples if s.labels["sink"] == name]
    assert published == [18]
    pg.execute("SELECT cdc_disable(%s)", (t,))


def insert_ten(pg, t, start):
    with pg.transaction():
        for i in range(start, start + 10):
            pg.execute(f"INSERT INTO {t} VALUES (%s, 'x')", (i,))


def test_a_crash_between_the_commit_and_the_slot_confirm_is_deduplicated(pg, tsinks, unique):
    """The failpoint exits right after the transaction that wrote the events and the checkpoint
    committed, before the slot moves: the restarted worker reads those changes again and must skip
    them."""
    t = captured(pg, f"tfp_{unique}")
    name, table = tsinks.add(f"tfp_{unique}", f"tfp_events_{unique}"), f"tfp_events_{unique}"
    pg.execute(f"INSERT INTO {t} VALUES (0, 'warm-up')")
    wait_events(pg, table, 1)
    crash_at_failpoint(pg, name, lambda: insert_ten(pg, t, 1))
    pg.execute(f"INSERT INTO {t} VALUES (11, 'after')")
    wait_events(pg, table, 12)
    wait_for(lambda: f'pg_cdc sink "{name}": skipped 10 events' in server_log(), what="dedup logged")
    time.sleep(1.0)
    assert_exactly_once(pg, t, table)
    assert f'failpoint after_sink_commit of sink "{name}"' in server_log()
    dedup = delivery_status(pg, name)["deduplication"]
    assert dedup["duplicate_events_detected"] == dedup["duplicate_events_filtered"] == 10
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_control_without_dedup_the_same_crash_duplicates(pg, tsinks, unique):
    """The control: with cdc.test_skip_dedup the re-read transaction is written again, and the
    oracle above sees the duplicates."""
    t = captured(pg, f"tnd_{unique}")
    name, table = tsinks.add(f"tnd_{unique}", f"tnd_events_{unique}"), f"tnd_events_{unique}"
    pg.execute(f"INSERT INTO {t} VALUES (0, 'warm-up')")
    wait_events(pg, table, 1)
    with server_settings({"cdc.test_skip_dedup": "on"}):
        crash_at_failpoint(pg, name, lambda: insert_ten(pg, t, 1))
        wait_events(pg, table, 21)
    with pytest.raises(AssertionError, match="duplicates"):
        assert_exactly_once(pg, t, table)
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_sigkill_during_delivery_loses_and_duplicates_nothing(pg, tsinks, unique):
    """kill -9 of the worker while writes stream (PostgreSQL then crash-restarts every backend and
    rolls back the worker's open transaction): every committed row is in the event table once."""
    t = captured(pg, f"tkill_{unique}")
    table = f"tkill_events_{unique}"
    tsinks.add(f"tkill_{unique}", table)
    sigkill_while_writing(pg, t, 20)
    with connect() as c:
        total = c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        wait_events(c, table, total, timeout=120)
        time.sleep(1.0)
        assert_exactly_once(c, t, table)
        c.execute("SELECT cdc_disable(%s)", (t,))


def test_retention_removes_old_events_and_consumers_hear_of_what_they_missed(pg, tsinks, unique):
    t = captured(pg, f"tret_{unique}")
    name, table = tsinks.add(f"tret_{unique}", f"tret_events_{unique}", retention_events=5), f"tret_events_{unique}"
    pg.execute(f"INSERT INTO {t} SELECT g, 'x' FROM generate_series(1, 20) g")
    wait_events(pg, table, 20)
    # Retention runs when the sink opens and every minute after: a restarted worker opens it now.
    old = worker_pid(pg, name)
    pg.execute("SELECT pg_terminate_backend(%s)", (old,))
    wait_for(lambda: pg.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 5, what="retention applied")
    kept = [r[5]["after"]["id"] for r in events(pg, table)]
    assert kept == [16, 17, 18, 19, 20]
    notices = []
    pg.add_notice_handler(lambda d: notices.append(d.message_primary))
    got = [r[0] for r in pg.execute("SELECT event_id FROM cdc_consume(%s, 100, 'late')", (name,)).fetchall()]
    assert len(got) == 5
    assert any('consumer "late"' in n and "missed events" in n for n in notices), notices
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_errors_a_dba_understands(pg, tsinks, unique):
    t = captured(pg, f"terr_{unique}")
    table = f"terr_events_{unique}"
    name = tsinks.add(f"terr_{unique}", table, tables=[t])

    def sqlstate(sql, args=()):
        with pytest.raises(psycopg.Error) as e:
            pg.execute(sql, args)
        return e.value.sqlstate, e.value.diag.message_primary

    # The event table exists already.
    assert sqlstate("SELECT cdc_add_sink('x_' || %s, 'table', %s::jsonb)", (unique, json.dumps({"table": table})))[0] == "42P07"
    # Capturing an event table would capture its own events without end.
    code, msg = sqlstate("SELECT cdc_enable(%s)", (table,))
    assert code == "42809" and f'event table of sink "{name}"' in msg
    code, _ = sqlstate("SELECT cdc_add_sink('y_' || %s, 'table', %s::jsonb)",
                       (unique, json.dumps({"table": f"other_{unique}", "tables": [table]})))
    assert code == "42809"
    assert sqlstate("SELECT * FROM cdc_consume('nope_' || %s)", (unique,))[0] == "42704"
    assert sqlstate("SELECT * FROM cdc_consume(%s, 0)", (name,))[0] == "22023"
    # A dropped event table stops the sink with a reason, instead of losing its events.
    pg.execute(f"INSERT INTO {t} VALUES (1, 'x')")
    wait_events(pg, table, 1)
    pg.execute(f"DROP TABLE {table}")
    pg.execute(f"INSERT INTO {t} VALUES (2, 'x')")
    # The first failure is the write itself; the retry (a fresh open) names the cause.
    state = wait_for(lambda: (s := sink_state(pg, name))[0] == "error" and "was dropped" in (s[1] or "") and s,
                     what="error state naming the dropped table")
    assert "event table" in state[1] and "drop and re-add the sink" in state[1], state
    assert sqlstate("SELECT * FROM cdc_consume(%s)", (name,))[0] == "55000"
    # Dropping a sink keeps its event table, and says so.
    table2 = f"terr2_events_{unique}"
    name2 = tsinks.add(f"terr2_{unique}", table2, tables=[t])
    notices = []
    pg.add_notice_handler(lambda d: notices.append(d.message_primary))
    pg.execute("SELECT cdc_drop_sink(%s)", (name2,))
    assert any(table2 in n for n in notices), notices
    assert pg.execute("SELECT to_regclass(%s) IS NOT NULL", (table2,)).fetchone()[0]
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_sink_level_partition_key_keys_the_events_of_tables_that_have_it(pg, tsinks, sinks, unique):
    """Seed example 2 sets partition_key on the sink: it keys the events of every table that has
    the column; a table without it keeps its own key. Kafka and the table sink alike; another sink
    of the same tables keeps the tables' keys."""
    acc = captured(pg, f"tpk_acc_{unique}", "id int PRIMARY KEY, account_id int, amount int")
    other = captured(pg, f"tpk_other_{unique}", "id int PRIMARY KEY, v text")
    table = f"tpk_events_{unique}"
    tsinks.add(f"tpk_{unique}", table, partition_key="account_id", tables=[acc, other])
    sinks.add(f"tpk_kafka_{unique}", f"tpk-{unique}", partition_key="account_id", tables=[acc])
    sinks.add(f"tpk_plain_{unique}", f"tpk-plain-{unique}", tables=[acc])
    pg.execute(f"INSERT INTO {acc} VALUES (1, 7, 10), (2, 8, 20)")
    pg.execute(f"INSERT INTO {other} VALUES (5, 'x')")
    wait_events(pg, table, 3)
    keys = [(r[5]["metadata"]["table"], r[4]) for r in events(pg, table)]
    assert keys == [(acc, {"account_id": 7}), (acc, {"account_id": 8}), (other, {"id": 5})]
    assert [m["key"] for m in consume(f"tpk-{unique}", 2)] == [{"account_id": 7}, {"account_id": 8}]
    assert [m["key"] for m in consume(f"tpk-plain-{unique}", 2)] == [{"id": 1}, {"id": 2}]
    pg.execute("SELECT cdc_disable(%s)", (acc,))
    pg.execute("SELECT cdc_disable(%s)", (other,))
