"""Promises about delivery that the docs make and a user relies on: checkpoint_interval_ms bounds each
Kafka transaction, and a failpoint armed for one sink never fires for another."""
import json
import time

from conftest import (consume, delivery_status, hold_worker, progress_records, server_log, server_log_size, server_settings,
                      wait_for, wal_lsn)


def backlog_transactions(pg, sinks, unique, prefix, capture, sink_extra, n=10_000):
    """Commits `n` single-row transactions while the worker is held, lets it read them as one
    backlog, and returns how many Kafka transactions carried them (checkpoint records whose end
    LSN falls in the backlog, from the progress topic: independent of the worker's counters)."""
    t, topic, name = f"{prefix}_{unique}", f"{prefix}-{unique}", f"{prefix}_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s, %s::jsonb)", (t, json.dumps(capture)))
    sinks.add(name, topic, tables=[t], **sink_extra)
    pg.execute(f"INSERT INTO {t} VALUES (0, 'warm-up')")
    consume(topic, 1)
    with hold_worker(pg):
        start = wal_lsn(pg)
        pg.execute(f"DO $$ BEGIN FOR i IN 1..{n} LOOP INSERT INTO {t} VALUES (i, 'x'); COMMIT; END LOOP; END $$")
        end = wal_lsn(pg)
    msgs = consume(topic, n + 1, timeout=120)
    assert sorted(m["value"]["after"]["id"] for m in msgs) == list(range(n + 1)), "each row once"
    # The backlog's last commit ends at `end`; a heartbeat the worker writes after it (the holder's
    # COMMIT is WAL past the slot) is a unit of its own, not one of the backlog's.
    units = [lsn for lsn in progress_records(pg, name) if start < lsn <= end]
    pg.execute("SELECT cdc_disable(%s)", (t,))
    return units


def test_checkpoint_interval_bounds_how_long_a_kafka_transaction_stays_open(pg, sinks, unique):
    """Seed example 2's exactly_once.checkpoint_interval_ms (capture config), or the sink's own
    checkpoint_interval_ms: once a Kafka transaction has been open that long, no further PostgreSQL
    transaction goes into it. A backlog of 10,000 transactions read at once is then committed in
    several Kafka transactions (1 ms here); without it, in one. Each unit ends at a whole
    PostgreSQL transaction, and every row arrives once."""
    without = backlog_transactions(pg, sinks, unique, "cpnone", {}, {})
    table = backlog_transactions(pg, sinks, unique, "cptable",
                                 {"exactly_once": {"enabled": True, "checkpoint_interval_ms": 1}}, {})
    sink = backlog_transactions(pg, sinks, unique, "cpsink", {}, {"checkpoint_interval_ms": 1})
    print(f"\nKafka transactions for a 10,000-transaction backlog: none {len(without)}, table {len(table)}, "
          f"sink {len(sink)}")
    assert len(without) == 1, without
    assert len(table) >= 2, table
    assert len(sink) >= 2, sink


def test_a_failpoint_fires_only_for_the_sink_it_names(pg, sinks, unique):
    """cdc.test_failpoint = 'after_sink_commit:<sink>' fires in that sink's step only. Every slot
    reads every captured table's WAL, so one insert makes both sinks commit (the other one first:
    it was added first); the worker must exit at the named sink's commit, never at the other's
    (before this, a demo sink left running took the crash meant for a test's sink)."""
    ta, tb = f"fpa_{unique}", f"fpb_{unique}"
    for t in (ta, tb):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
    other = sinks.add(f"fpb_{unique}", f"fpb-{unique}", tables=[tb])
    named = sinks.add(f"fpa_{unique}", f"fpa-{unique}", tables=[ta])
    pg.execute(f"INSERT INTO {ta} VALUES (0)")
    pg.execute(f"INSERT INTO {tb} VALUES (0)")
    consume(f"fpa-{unique}", 1)
    consume(f"fpb-{unique}", 1)
    logged = server_log_size()
    with server_settings({"cdc.test_failpoint": f"after_sink_commit:{named}"}):
        time.sleep(1.0)  # the worker re-reads its settings at its next pass
        pg.execute(f"INSERT INTO {tb} VALUES (1)")
        wait_for(lambda: f'failpoint after_sink_commit of sink "{named}": exiting' in server_log(logged),
                 timeout=30, what="worker exited at the failpoint")
    log = server_log()
    assert f'failpoint after_sink_commit of sink "{named}"' in log
    assert f'failpoint after_sink_commit of sink "{other}"' not in log
    # The other sink was never interrupted between its Kafka commit and its slot confirm.
    assert delivery_status(pg, other)["deduplication"]["duplicate_events_detected"] == 0
    assert sorted(m["value"]["after"]["id"] for m in consume(f"fpb-{unique}", 2)) == [0, 1]
    pg.execute(f"INSERT INTO {ta} VALUES (1)")
    assert sorted(m["value"]["after"]["id"] for m in consume(f"fpa-{unique}", 2)) == [0, 1]
    for t in (ta, tb):
        pg.execute("SELECT cdc_disable(%s)", (t,))
