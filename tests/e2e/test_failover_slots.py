"""Failover slots (PostgreSQL 17+): every sink's slot is one, and pg_cdc delivers nothing the standbys named
in synchronized_standby_slots have not confirmed — the wait PostgreSQL's walsenders apply, which pg_cdc's
in-process decoding would otherwise bypass.

The standby is stood for by a physical slot nobody streams from: its restart position is what a standby
confirmed, and pg_replication_slot_advance moves it as a standby's feedback would. On PostgreSQL 15 and 16 there are no
failover slots: these tests are skipped.
"""
import json
import time

import pytest

from conftest import BOOTSTRAP, consume, read_messages, restart_worker, server_log, server_log_size, server_settings, wait_for
from test_exactly_once import setup as exactly_once_setup


def version(pg):
    return int(pg.execute("SHOW server_version_num").fetchone()[0])


def ids_of(msgs):
    return sorted(m["value"]["after"]["id"] for m in msgs if m["value"]["after"])


def ids_of_raw(messages):
    return sorted(json.loads(m.value())["after"]["id"] for m in messages if json.loads(m.value())["after"])


@pytest.fixture
def failover(pg):
    if version(pg) < 170000:
        pytest.skip("failover slots and synchronized_standby_slots came with PostgreSQL 17")


@pytest.fixture
def standby_slot(pg, unique):
    """The name of the physical slot standing for a standby, dropped afterwards; made by `reserve`."""
    name = f"cdc_standby_{unique}"
    yield name
    pg.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (name,))


def setup(pg, sinks, unique, prefix):
    """The exactly-once tests' table and sink, with one warm-up row delivered."""
    t, topic, name = exactly_once_setup(pg, sinks, unique, prefix)
    pg.execute(f"INSERT INTO {t} VALUES (0, 'warm-up')")
    consume(topic, 1)
    return t, topic, name


def reserve(pg, standby):
    """Makes the standby's physical slot and moves it to the WAL's end now: what a standby that has
    received everything so far and nothing after would have confirmed (a physical slot reserves WAL
    from the last checkpoint's redo position)."""
    pg.execute("SELECT pg_create_physical_replication_slot(%s, true)", (standby,))
    pg.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (standby,))


def insert_rows(pg, t, ids):
    for i in ids:
        pg.execute(f"INSERT INTO {t} VALUES (%s, 'x')", (i,))


def slot_positions(pg, sink_slot, standby):
    return pg.execute(
        "SELECT (SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s), "
        "(SELECT restart_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s)",
        (sink_slot, standby)).fetchone()


def status(pg, name):
    """cdc_status()'s failover columns of sink `name`."""
    return pg.execute("SELECT slot_failover, standby_wait FROM cdc_status() WHERE sink_name = %s", (name,)).fetchone()


def check(pg, item):
    """cdc_check_failover()'s row `item`: (ok, detail)."""
    return pg.execute("SELECT ok, detail FROM cdc_check_failover() WHERE item = %s", (item,)).fetchone()


def test_a_sinks_slot_is_a_failover_slot(pg, sinks, unique, failover):
    _, _, name = setup(pg, sinks, unique, "fo_flag")
    row = pg.execute("SELECT r.failover, r.temporary FROM _cdc_sinks s JOIN pg_replication_slots r USING (slot_name) "
                     "WHERE s.sink_name = %s", (name,)).fetchone()
    assert row == (True, False)
    # What a DBA reads: cdc_status shows it, and the readiness check counts the slot as ready.
    assert status(pg, name) == (True, None)
    slot = pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
    assert check(pg, f"slot {slot} (sink {name})") == (True, "a failover slot")


def test_the_shared_decodings_slot_is_a_failover_slot(pg, sinks, unique, failover):
    with server_settings({"cdc.shared_decoding": "on"}):
        setup(pg, sinks, unique, "fo_group")
        row = wait_for(lambda: pg.execute("SELECT failover, temporary FROM pg_replication_slots "
                                          "WHERE slot_name = '_cdc_group'").fetchone(), what="the group's slot")
        assert row == (True, False)


def test_nothing_is_delivered_that_the_named_standby_has_not_confirmed(pg, sinks, unique, failover, standby_slot):
    t, topic, name = setup(pg, sinks, unique, "fo_hold")
    sink_slot = pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
    # After the warm-up row went out: the sink's slot may be confirmed up to here, not past it.
    reserve(pg, standby_slot)
    with server_settings({"synchronized_standby_slots": standby_slot}):
        # The new worker reads the setting at its start: no row below can slip through before it has it.
        restart_worker(pg)
        insert_rows(pg, t, range(1, 11))
        # Held: the standby's slot has not moved since before the rows were written.
        time.sleep(5)
        held = read_messages(topic, 1, timeout=2)
        assert ids_of_raw(held) == [0], "rows the standby had not confirmed reached Kafka"
        confirmed, standby = slot_positions(pg, sink_slot, standby_slot)
        assert confirmed <= standby, (confirmed, standby)
        # cdc_status names the standby holding the sink back, and that none streams from its slot;
        # the readiness check says the same of the slot.
        _, wait = status(pg, name)
        assert wait and wait.startswith(f"waiting for standby slot {standby_slot} (no standby streaming"), wait
        ok, detail = check(pg, f"standby slot {standby_slot}")
        assert not ok and "no standby streams from it" in detail, detail
        # The standby confirms everything written so far (what its feedback would do): the rows go out, once.
        pg.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (standby_slot,))
        msgs = consume(topic, 11, timeout=30)
        assert ids_of(msgs) == list(range(0, 11))


def test_a_named_standby_slot_that_is_dropped_holds_every_failover_slot_back(pg, sinks, unique, failover,
                                                                              standby_slot):
    t, topic, name = setup(pg, sinks, unique, "fo_gone")
    reserve(pg, standby_slot)
    logged = server_log_size()
    with server_settings({"synchronized_standby_slots": standby_slot}):
        restart_worker(pg)
        pg.execute("SELECT pg_drop_replication_slot(%s)", (standby_slot,))
        insert_rows(pg, t, range(1, 6))
        wait_for(lambda: "names a slot that no standby confirms WAL through" in server_log(logged),
                 what="the warning naming synchronized_standby_slots")
        assert ids_of_raw(read_messages(topic, 1, timeout=2)) == [0]
        _, wait = status(pg, name)
        assert wait and wait.startswith(f"standby slot {standby_slot} does not exist"), wait
        ok, detail = check(pg, f"standby slot {standby_slot}")
        assert not ok and detail.startswith("does not exist"), detail
    # The setting removed (the DBA's fix): the worker re-reads it at its next tick and delivers.
    msgs = consume(topic, 6, timeout=30)
    assert ids_of(msgs) == list(range(0, 6))


def test_control_without_the_setting_rows_go_out_at_once(pg, sinks, unique, failover, standby_slot):
    """A control of the two tests above: the same standby slot, not named, holds nothing back."""
    t, topic, name = setup(pg, sinks, unique, "fo_ctl")
    reserve(pg, standby_slot)
    restart_worker(pg)
    insert_rows(pg, t, range(1, 11))
    assert status(pg, name) == (True, None)
    msgs = consume(topic, 11, timeout=30)
    assert ids_of(msgs) == list(range(0, 11))


def test_control_reading_past_the_standby_delivers_what_it_has_not_confirmed(pg, sinks, unique, failover,
                                                                            standby_slot):
    """The control that must see the violation: the same sequence as the hold test, with the bound switched
    off (cdc.test_ignore_standby_slots, how pg_cdc read before it applied the bound). The rows reach Kafka
    while the standby's slot is still behind them, and the sink's slot is confirmed past it."""
    t, topic, name = setup(pg, sinks, unique, "fo_noholdctl")
    sink_slot = pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
    reserve(pg, standby_slot)
    with server_settings({"synchronized_standby_slots": standby_slot, "cdc.test_ignore_standby_slots": "on"}):
        restart_worker(pg)
        insert_rows(pg, t, range(1, 11))
        msgs = consume(topic, 11, timeout=30)
        assert ids_of(msgs) == list(range(0, 11))
        confirmed, standby = wait_for(lambda: (p := slot_positions(pg, sink_slot, standby_slot))[0] > p[1] and p,
                                      what="the sink's slot confirmed past the standby's")
        assert confirmed > standby



def test_an_unheld_slot_shows_when_the_idle_timeout_would_invalidate_it_then_the_error_names_it(pg, sinks, unique):
    """PostgreSQL 18's idle_replication_slot_timeout invalidates a slot no process held that long (at a
    checkpoint). A sink whose destination is unreachable retries without holding its slot: cdc_status
    shows the deadline, and once the slot is invalidated the sink's error names the setting (it used to
    blame max_slot_wal_keep_size)."""
    if version(pg) < 180000:
        pytest.skip("idle_replication_slot_timeout came with PostgreSQL 18")
    t = f"fo_idle_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    name = sinks.add(f"fo_idle_{unique}", f"fo-idle-{unique}", bootstrap_servers="127.0.0.1:9", tables=[t])
    wait_for(lambda: pg.execute("SELECT state FROM cdc_status() WHERE sink_name = %s", (name,)).fetchone()[0]
             == "retrying", what="the sink retrying")
    with server_settings({"idle_replication_slot_timeout": "1h"}):
        deadline = wait_for(lambda: pg.execute(
            "SELECT slot_idle_deadline - now() FROM cdc_status() WHERE sink_name = %s", (name,)).fetchone()[0],
            what="an idle deadline")
        assert 3000 < deadline.total_seconds() <= 3600, deadline
    # Control: a running sink holds its slot, so it shows no deadline.
    _, _, running = setup(pg, sinks, unique, "fo_idle_ok")
    with server_settings({"idle_replication_slot_timeout": "1s"}):
        assert pg.execute("SELECT slot_idle_deadline FROM cdc_status() WHERE sink_name = %s",
                          (running,)).fetchone()[0] is None
        time.sleep(2)
        pg.execute("CHECKPOINT")
        reason = pg.execute("SELECT slot_invalidation_reason FROM cdc_status() WHERE sink_name = %s",
                            (name,)).fetchone()[0]
        assert reason == "idle_timeout"
        assert pg.execute("SELECT slot_invalidation_reason FROM cdc_status() WHERE sink_name = %s",
                          (running,)).fetchone()[0] is None
    # The destination comes back (the config points to the broker): the sink stops in error naming the cause.
    pg.execute("UPDATE _cdc_sinks SET config = jsonb_set(config, '{bootstrap_servers}', to_jsonb(%s::text)) "
               "WHERE sink_name = %s", (BOOTSTRAP, name))
    err = wait_for(lambda: pg.execute("SELECT last_error FROM cdc_status() WHERE sink_name = %s AND state = 'error' "
                                      "AND last_error LIKE '%%invalidated%%'", (name,)).fetchone(),
                   timeout=60, what="the sink in error")[0]
    assert "idle_replication_slot_timeout" in err and "max_slot_wal_keep_size" not in err, err
