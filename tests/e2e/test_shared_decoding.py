"""Shared decoding (cdc.shared_decoding): one decoder process decodes the WAL once into the group's
log, and the sinks read their tables from it instead of each decoding the WAL; each sink keeps its
own slot, moved without decoding. Oracle: what a read_committed consumer finds in each sink's
topic (every row once), PostgreSQL's own view of the slots and processes, and the workers' counters."""
import contextlib
import json
import threading
import time

from conftest import (connect, consume, delivery_status, server_log, server_log_size, server_settings, sink_state,
                      wait_for, worker_pid)
from test_exactly_once import assert_exactly_once
from test_webhook_sink import Hook


def decoder_pid(pg):
    row = pg.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_cdc decoder'").fetchone()
    return row[0] if row else None


def shared(pg, name):
    return delivery_status(pg, name)["decoding"]["shared"]


def slot_of(pg, name):
    return pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]


def insert_rows(table, start, count, per_tx=10):
    with connect() as c:
        for i in range(start, start + count, per_tx):
            c.execute(f"INSERT INTO {table} SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
                      (i, min(i + per_tx, start + count) - 1))


def test_sinks_share_one_decoding_and_deliver_every_change_once(pg, sinks, unique):
    busy, idle = f"shared_busy_{unique}", f"shared_idle_{unique}"
    for t in (busy, idle):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
    names = [f"shared_{i}_{unique}" for i in range(3)]
    with server_settings({"cdc.shared_decoding": "on", "cdc.heartbeat_interval_ms": 500}):
        for n in names:
            sinks.add(n, n.replace("_", "-"), tables=[busy])
        idle_sink = sinks.add(f"shared_idle_{unique}", f"shared-idle-{unique}", tables=[idle])
        pid = wait_for(lambda: decoder_pid(pg), what="the decoder running")
        wait_for(lambda: pg.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = '_cdc_group'")
                 .fetchone() == (pid,), what="the decoder holding the group's slot")
        # A new sink reads its own slot until the log serves its position, then joins.
        insert_rows(busy, 0, 100)
        for n in names + [idle_sink]:
            wait_for(lambda n=n: shared(pg, n), what=f"{n} reading the shared log")
        before = {n: delivery_status(pg, n)["decoding"] for n in names}
        wal_before = pg.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        insert_rows(busy, 100, 2_900)
        wal_written = pg.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (wal_before,)).fetchone()[0]
        for n in names:
            assert_exactly_once(consume(n.replace("_", "-"), 3_000, timeout=60), range(3_000))
        after = {n: delivery_status(pg, n)["decoding"] for n in names}
        for n in names:
            assert after[n]["shared"], n
            assert after[n]["log_frames_read"] > before[n]["log_frames_read"], (before[n], after[n])
            assert after[n]["sessions_started"] == before[n]["sessions_started"], "no decoding of its own"
            # Its own slot takes the group slot's restart position and catalog horizon: it reads
            # none of the WAL again (before, each member moved its slot by reading all of it in
            # fast-forward mode, the WAL written counted again per member).
            moved_over = after[n]["wal_decoded_bytes"] - before[n]["wal_decoded_bytes"]
            assert moved_over < wal_written / 4, (n, moved_over, int(wal_written))
            # Its own slot holds by its worker and moves with its deliveries, without decoding.
            slot = slot_of(pg, n)
            active = pg.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
            assert active == (worker_pid(pg, n),)
        # The idle sink skipped the busy table's changes and still gets its own.
        idle_status = delivery_status(pg, idle_sink)["decoding"]
        assert idle_status["changes_skipped"] >= 2_900, idle_status
        insert_rows(idle, 0, 5)
        assert_exactly_once(consume(f"shared-idle-{unique}", 5, timeout=30), range(5))
        # The slots move: each sink's own slot and the group's reach the WAL written before.
        mark = pg.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        for slot in [slot_of(pg, n) for n in names + [idle_sink]] + ["_cdc_group"]:
            wait_for(lambda slot=slot: pg.execute(
                "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = %s",
                (mark, slot)).fetchone()[0], timeout=60, what=f"slot {slot} past {mark}")

        # The decoder killed while rows are written: a new one writes a new log from the group's
        # slot, the sinks open it again from their own positions; nothing lost, nothing twice.
        writer = threading.Thread(target=insert_rows, args=(busy, 3_000, 3_000, 5))
        writer.start()
        time.sleep(0.5)
        pg.execute("SELECT pg_terminate_backend(%s)", (pid,))
        writer.join()
        wait_for(lambda: decoder_pid(pg) not in (None, pid), what="a new decoder")
        for n in names:
            assert_exactly_once(consume(n.replace("_", "-"), 6_000, timeout=90), range(6_000))
            wait_for(lambda n=n: shared(pg, n), what=f"{n} reading the new log")
            assert delivery_status(pg, n)["decoding"]["shared_joins"] >= 2, n
    # Off, while rows keep coming: the decoder exits, the sinks decode their own slots again, and
    # the group's slot goes. A sink leaves the log with deliveries it has not confirmed yet; its own
    # slot's new session starts behind them and must not read them again (until 2026-12-07 it did:
    # Kafka held every event once, but _cdc_offsets counted those events twice).
    def trickle():
        with connect() as c:
            for i in range(6_000, 6_500, 5):
                c.execute(f"INSERT INTO {busy} SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g", (i, i + 4))
                time.sleep(0.01)

    writer = threading.Thread(target=trickle)
    writer.start()
    time.sleep(0.3)
    with server_settings({"cdc.shared_decoding": "off"}):
        writer.join()
        wait_for(lambda: decoder_pid(pg) is None, what="the decoder gone")
        for n in names:
            assert_exactly_once(consume(n.replace("_", "-"), 6_500, timeout=60), range(6_500))
            assert not shared(pg, n)
            published = wait_for(lambda n=n: (p := pg.execute(
                "SELECT events_published FROM _cdc_offsets WHERE sink_name = %s", (n,)).fetchone()) and p[0] >= 6_500
                and p[0], what=f"{n}'s offsets")
            time.sleep(0.5)  # a count past 6,500 would show by now (confirms are at most 200 ms apart)
            assert pg.execute("SELECT events_published FROM _cdc_offsets WHERE sink_name = %s",
                              (n,)).fetchone()[0] == 6_500, (n, published)
        wait_for(lambda: group_slot(pg) is None, timeout=60, what="the group's slot dropped")
    for t in (busy, idle):
        pg.execute("SELECT cdc_disable(%s)", (t,))


def group_slot(pg):
    """The group's slot (active_pid, wal_status), or None when there is none."""
    return pg.execute("SELECT active_pid, wal_status FROM pg_replication_slots WHERE slot_name = '_cdc_group'").fetchone()


def rows_until_shared(pg, tables, start, names, limit=60):
    """A row (ids start, start + 1, ...) into each of `tables` a second until every sink of `names`
    reads the shared log (a sink joins once its position is one the log serves); returns how many
    rows each table got."""
    for n in range(1, limit + 1):
        for t in tables:
            insert_rows(t, start + n - 1, 1)
        if all(shared(pg, name) for name in names):
            return n
        time.sleep(1)
    raise AssertionError(f"not every sink read the shared log: {({name: shared(pg, name) for name in names})}")


def test_a_member_whose_tables_are_quiet_sleeps_through_the_other_tables_changes(pg, sinks, unique):
    """The decoder wakes a member when a publish holds something for it (a change of one of its
    tables, or a message), so a sink on a quiet table sleeps through a steady stream of another
    table's transactions (it reads the log once a second) while the busy sink reads at once, and a
    change of its own table still reaches it. Oracle: the sinks' own counts of their reads of the log
    (decoding.log_reads) and the quiet sink's topic. Control: with cdc.test_members_poll_publishes on
    (members look for new publishes as before: every 5 ms after a pass that read, doubling up to
    cdc.naptime_ms, 200 ms) the quiet sink reads about five times a second."""
    busy, quiet = f"wake_busy_{unique}", f"wake_quiet_{unique}"
    for t in (busy, quiet):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
    # No heartbeat (a message, which wakes every member) during the runs.
    with server_settings({"cdc.shared_decoding": "on", "cdc.heartbeat_interval_ms": 600000}):
        busy_sink = sinks.add(f"wake_busy_{unique}", f"wake-busy-{unique}", tables=[busy])
        quiet_sink = sinks.add(f"wake_quiet_{unique}", f"wake-quiet-{unique}", tables=[quiet])
        joined = rows_until_shared(pg, [busy, quiet], 0, [busy_sink, quiet_sink])
        written = [joined]

        def reads():
            return {n: delivery_status(pg, n)["decoding"]["log_reads"] for n in (busy_sink, quiet_sink)}

        def steady_run():
            """400 single-row transactions over about 4 s into the busy table, delivered; the reads of
            each sink meanwhile, and how long that took (s)."""
            wait_for(lambda: delivery_status(pg, busy_sink)["delivered"]["events"] >= written[0],
                     what="the busy sink caught up")
            before, started = reads(), time.monotonic()
            with connect() as c:
                for i in range(written[0], written[0] + 400):
                    c.execute(f"INSERT INTO {busy} VALUES (%s, 'v')", (i,))
                    time.sleep(0.01)
            written[0] += 400
            wait_for(lambda: delivery_status(pg, busy_sink)["delivered"]["events"] >= written[0],
                     what="the busy sink delivered the run")
            after, took = reads(), time.monotonic() - started
            return after[busy_sink] - before[busy_sink], after[quiet_sink] - before[quiet_sink], took

        busy_reads, quiet_reads, took = steady_run()
        assert busy_reads >= 40, f"the busy sink read the log {busy_reads} times for 400 transactions"
        # One read a second, and a wake-up or two (the run's start).
        assert quiet_reads <= took + 3, \
            f"the quiet sink read the log {quiet_reads} times in {took:.1f} s ({busy_reads} for the busy one)"
        with server_settings({"cdc.test_members_poll_publishes": "on"}):
            busy_polling, quiet_polling, took_polling = steady_run()
        # About five reads a second.
        assert quiet_polling >= 2.5 * took_polling, \
            f"control: polling, the quiet sink read {quiet_polling} times in {took_polling:.1f} s ({busy_polling} " \
            "for the busy one)"
        # Its own table's changes still reach it (it is woken for them).
        insert_rows(quiet, 1_000, 5)
        assert len(consume(f"wake-quiet-{unique}", joined + 5, timeout=30)) == joined + 5
    for t in (busy, quiet):
        pg.execute("SELECT cdc_disable(%s)", (t,))


def test_an_idle_exactly_once_member_commits_for_the_heartbeat_interval_not_every_few_mb(pg, sinks, unique):
    """Regression: the decoder wrote the members' heartbeat whenever the group's slot was 2 MB behind
    the WAL, and every idle exactly-once member committed a Kafka transaction for it (measured: one
    every 3.3 s each, next to a sink busy at 2,000 tx/s). Now, far from the lag bound, the heartbeat
    waits for cdc.heartbeat_interval_ms (10 minutes here): about 8 MB of WAL on the busy table bring the
    idle member no Kafka transaction. Oracle: its own count of Kafka transactions
    (transaction_status.committed_transactions). Control: with cdc.shared_decoding_max_lag at 8 MB the
    heartbeat comes sooner, at a quarter of it (2 MB, the old bound), and the same WAL brings some."""
    busy_t, idle_t = f"hbm_b_{unique}", f"hbm_i_{unique}"
    for t in (busy_t, idle_t):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
    with server_settings({"cdc.shared_decoding": "on", "cdc.heartbeat_interval_ms": 600000}):
        busy = sinks.add(f"hbm_b_{unique}", f"hbm-b-{unique}", tables=[busy_t], exactly_once=True)
        idle = sinks.add(f"hbm_i_{unique}", f"hbm-i-{unique}", tables=[idle_t], exactly_once=True)
        joined = rows_until_shared(pg, [busy_t, idle_t], 0, [busy, idle])
        written = [joined]

        def commits():
            return delivery_status(pg, idle)["transaction_status"]["committed_transactions"]

        def eight_mb_on_the_busy_table():
            """About 8 MB of WAL in transactions of 500 rows, delivered by the busy sink; the idle
            member's Kafka transactions meanwhile (its count once it stayed put for 2 s)."""
            wait_for(lambda: delivery_status(pg, idle)["delivered"]["events"] >= joined, what="the idle sink delivered")
            before = settled(commits)
            start = written[0]
            with connect() as c:
                for i in range(start, start + 8_000, 500):
                    c.execute(f"INSERT INTO {busy_t} SELECT g, repeat('x', 900) FROM generate_series(%s::int, %s::int) g",
                              (i, i + 499))
            written[0] += 8_000
            wait_for(lambda: delivery_status(pg, busy)["delivered"]["events"] >= written[0], timeout=60,
                     what="the busy sink delivered the rows")
            time.sleep(1.5)  # the decoder's confirms after the last rows (every 200 ms) had their say
            return settled(commits) - before

        assert eight_mb_on_the_busy_table() == 0, "an idle member committed for WAL it does not capture"
        assert shared(pg, idle) and shared(pg, busy)
        with server_settings({"cdc.shared_decoding_max_lag": "8MB"}):
            assert eight_mb_on_the_busy_table() >= 1, "control: a heartbeat at 2 MB behind brings a commit"
    for t in (busy_t, idle_t):
        pg.execute("SELECT cdc_disable(%s)", (t,))


def settled(read, quiet=2.0, timeout=30):
    """`read()` once it gave the same value for `quiet` seconds."""
    value, since, started = read(), time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() - started > timeout:
            raise AssertionError(f"still changing after {timeout} s: {value}")
        time.sleep(0.25)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value


@contextlib.contextmanager
def webhook_sink(pg, name, table, **config):
    """A webhook sink on `table` (and `config`) whose server (a test_webhook_sink.Hook) the test
    answers as it likes; dropped, and its server closed, on the way out."""
    hook = Hook()
    try:
        pg.execute("SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)",
                   (name, json.dumps({"url": hook.url, "tables": [table], **config})))
        yield hook
    finally:
        hook.close()
        pg.execute("SELECT cdc_drop_sink(sink_name) FROM _cdc_sinks WHERE sink_name = %s", (name,))


def refuse_from_now_on(pg, hook, table, row_id):
    """Every delivery to `hook` answered 503 from now on; returns once a delivery of a row written
    now (`row_id` into `table`) was refused."""
    hook.policy = lambda n: (503, {}, b"")
    answered = len(hook.requests)
    insert_rows(table, row_id, 1)
    wait_for(lambda: any(r[3] == 503 for r in hook.requests[answered:]), timeout=60, what="the stuck sink refused")


def test_a_stuck_member_does_not_cost_the_group_its_slot(pg, sinks, unique):
    """A sink whose destination answers every delivery with 503 reads its changes and stays behind
    until max_slot_wal_keep_size takes its slot's WAL. Its own slot is invalidated (the sink goes
    to 'error', as without shared decoding); the group's slot is not, or is made again: the decoder
    goes on and a new sink reads the shared log. Fails when the group's slot waits for the stuck
    member and an invalidated group slot is not replaced (the decoder then fails for good and no
    sink shares again)."""
    stuck_t, live_t, stuck = f"stuck_{unique}", f"live_{unique}", f"stuck_{unique}"
    for t in (stuck_t, live_t):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, pad text)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
    with server_settings({"cdc.shared_decoding": "on"}), webhook_sink(pg, stuck, stuck_t) as hook:
        # It delivers until it reads the shared log, then every delivery is refused.
        rows_until_shared(pg, [stuck_t], 0, [stuck])
        refuse_from_now_on(pg, hook, stuck_t, -1)
        slot = slot_of(pg, stuck)
        with server_settings({"max_slot_wal_keep_size": "1MB"}):
            def lost():
                pg.execute(f"INSERT INTO {stuck_t} SELECT g, repeat('x', 500) FROM generate_series(1, 2000) g "
                           f"ON CONFLICT (id) DO UPDATE SET pad = excluded.pad")
                pg.execute("SELECT pg_switch_wal()")
                pg.execute("CHECKPOINT")
                return pg.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s",
                                  (slot,)).fetchone()[0] == "lost"
            wait_for(lost, timeout=90, what="the stuck sink's slot invalidated")
        state = wait_for(lambda: (s := sink_state(pg, stuck)) and s[0] == "error" and s, timeout=60,
                         what="the stuck sink in error")
        assert "invalidated" in state[1], state[1]
        # The decoder holds a usable group slot again.
        wait_for(lambda: (g := group_slot(pg)) and g[0] is not None and g[0] == decoder_pid(pg)
                 and g[1] != "lost", timeout=90, what="the decoder holding a group slot that was not invalidated")
        live = sinks.add(f"live_{unique}", f"live-{unique}", tables=[live_t])
        insert_rows(live_t, 0, 50)
        wait_for(lambda: shared(pg, live), timeout=60, what="a new sink reading the shared log")
        insert_rows(live_t, 50, 50)
        assert_exactly_once(consume(f"live-{unique}", 100, timeout=60), range(100))
    for t in (stuck_t, live_t):
        pg.execute("SELECT cdc_disable(%s)", (t,))


def test_auto_shares_the_decoding_from_ten_sinks_on(pg, sinks, unique):
    """cdc.shared_decoding = auto (the default): nine sinks (a Kafka sink and eight table sinks)
    decode their own slots; a tenth starts the decoder and every sink moves onto the shared log;
    back to nine, the decoder leaves, the group's slot goes, and the sinks decode their own slots
    again. Every row once throughout (the topic, read_committed, and the event tables)."""
    t, kafka = f"auto_{unique}", f"auto_k_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    tables = [f"auto_t{i}_{unique}" for i in range(9)]

    def add_table_sink(name):
        pg.execute("SELECT cdc_add_sink(%s, 'table', %s::jsonb)", (name, json.dumps({"table": f"{name}_ev", "tables": [t]})))

    def delivered_everywhere(count, names):
        assert_exactly_once(consume(kafka.replace("_", "-"), count, timeout=60), range(count))
        for n in names:
            wait_for(lambda n=n: pg.execute(f"SELECT count(*) FROM {n}_ev").fetchone()[0] >= count,
                     timeout=60, what=f"{n} holding {count} rows")
            rows, ids = pg.execute(f"SELECT count(*), count(DISTINCT event -> 'after' ->> 'id') FROM {n}_ev").fetchone()
            assert rows == ids == count, (n, rows, ids, count)
    try:
        with server_settings({"cdc.shared_decoding": "auto"}):
            sinks.add(kafka, kafka.replace("_", "-"), tables=[t])
            for n in tables[:8]:
                add_table_sink(n)
            nine = [kafka] + tables[:8]
            insert_rows(t, 0, 100)
            delivered_everywhere(100, tables[:8])
            time.sleep(2)  # the launcher's passes: no decoder is started for nine sinks
            assert decoder_pid(pg) is None and not any(shared(pg, n) for n in nine)
            add_table_sink(tables[8])
            wait_for(lambda: decoder_pid(pg), timeout=30, what="the decoder started for a tenth sink")
            written = 100 + rows_until_shared(pg, [t], 100, nine + [tables[8]])
            insert_rows(t, written, 1_000 - written)
            delivered_everywhere(1_000, tables[:8])
            pg.execute("SELECT cdc_drop_sink(%s)", (tables[8],))
            wait_for(lambda: decoder_pid(pg) is None, timeout=30, what="the decoder gone with the tenth sink")
            wait_for(lambda: group_slot(pg) is None, timeout=60, what="the group's slot dropped")
            insert_rows(t, 1_000, 100)
            delivered_everywhere(1_100, tables[:8])
            assert not any(shared(pg, n) for n in nine)
    finally:
        with connect() as c:
            for n in tables:
                c.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (n, n))
                c.execute(f"DROP TABLE IF EXISTS {n}_ev")
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_member_behind_the_lag_bound_no_longer_holds_the_group(pg, sinks, unique):
    """cdc.shared_decoding_max_lag: a member whose destination refuses every delivery stays behind;
    once it is more than the bound (1 MB here) behind the WAL, the group's slot and log no longer
    wait for it: the group's slot moves past the stuck member's own slot while that one stays put,
    and a busy member keeps reading the log. When the destination answers again, the stuck sink,
    whose position the log no longer serves, catches up from its own slot and every row arrives.
    Fails when the group's confirm waits for every member whatever its lag."""
    stuck_t, busy_t, stuck = f"lagb_s_{unique}", f"lagb_b_{unique}", f"lagb_s_{unique}"
    for t in (stuck_t, busy_t):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
    with server_settings({"cdc.shared_decoding": "on", "cdc.shared_decoding_max_lag": "1MB"}), \
            webhook_sink(pg, stuck, stuck_t) as hook:
        busy = sinks.add(f"lagb_b_{unique}", f"lagb-b-{unique}", tables=[busy_t])
        joined = rows_until_shared(pg, [stuck_t, busy_t], 0, [stuck, busy])
        wait_for(lambda: len(hook.delivered()) >= joined, timeout=60, what="the webhook sink delivering")
        refuse_from_now_on(pg, hook, stuck_t, 1_000)
        time.sleep(1)  # a confirm of what it delivered before lands
        stuck_slot = slot_of(pg, stuck)
        held = pg.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                          (stuck_slot,)).fetchone()[0]
        # About 4 MB of WAL on the busy table, delivered by the busy sink.
        with connect() as c:
            c.execute(f"INSERT INTO {busy_t} SELECT g, repeat('x', 400) FROM generate_series(100, 10099) g")
        assert_exactly_once(consume(f"lagb-b-{unique}", 10_000 + joined, timeout=90),
                            list(range(joined)) + list(range(100, 10_100)))
        assert pg.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                          (stuck_slot,)).fetchone()[0] == held, "the stuck sink's own slot holds"
        wait_for(lambda: pg.execute(
            "SELECT confirmed_flush_lsn - %s::pg_lsn > 1024 * 1024 FROM pg_replication_slots "
            "WHERE slot_name = '_cdc_group'", (held,)).fetchone()[0], timeout=60,
            what="the group's slot more than the bound past the stuck member's")
        assert shared(pg, busy)
        hook.policy = lambda n: (200, {}, b"")
        wait_for(lambda: {(r["event"].get("after") or {}).get("id") for r in hook.delivered()} >= set(range(joined)) | {1_000},
                 timeout=90, what="the stuck sink catching up")
    for t in (stuck_t, busy_t):
        pg.execute("SELECT cdc_disable(%s)", (t,))


def log_segments(pg):
    """The numbers of the segments of the newest shared log on disk (in the data directory's
    base/pgsql_tmp), oldest first."""
    logs = [r[0] for r in pg.execute("SELECT pg_ls_dir('base/pgsql_tmp', true, false)").fetchall()
            if r[0].startswith("pgsql_tmp_cdc_group.")]
    if not logs:
        return []
    newest = max(logs, key=lambda d: int(d.rsplit(".", 1)[1]))
    return sorted(int(f[:-len(".seg")], 16) for (f,) in pg.execute(
        "SELECT pg_ls_dir(%s, true, false)", (f"base/pgsql_tmp/{newest}",)).fetchall() if f.endswith(".seg"))


def test_a_member_the_log_was_trimmed_under_goes_on_from_its_own_slot(pg, sinks, unique):
    """A member more than cdc.shared_decoding_max_lag behind is left out of the log's trim. One that
    still reads, slowly (its webhook answers each batch of 50 after 0.5 s), is inside a segment when
    the decoder removes the segments after it (a fast member confirmed them). Once its destination
    is fast again, it reaches the end of its segment and finds the next one gone: it leaves the log
    and decodes its own slot from where it is, with no error, and every row arrives. Regression: the
    missing segment was a read error (ENOENT), the sink went to 'error' with "cannot read the shared
    decoding's log" and was read again after a backoff (the 5M-row backlog bench met it)."""
    t, slow = f"trim_{unique}", f"trim_slow_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, pad text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    got = set()
    with server_settings({"cdc.shared_decoding": "on", "cdc.shared_decoding_max_lag": "1MB"}), \
            webhook_sink(pg, slow, t, batch_max_events=50) as hook:
        read = 0

        def delivered():
            """Ids the slow sink delivered so far (the requests parsed once each)."""
            nonlocal read
            answered = hook.requests[read:]
            read += len(answered)
            got.update((e["event"].get("after") or {}).get("id") for _, _, body, status in answered
                       if 200 <= status < 300 for e in json.loads(body)["events"])
            return got
        busy = sinks.add(f"trim_busy_{unique}", f"trim-busy-{unique}", tables=[t])
        joined = rows_until_shared(pg, [t], 0, [slow, busy])
        wait_for(lambda: len(delivered()) >= joined, timeout=60, what="the slow sink delivering")
        at = log_segments(pg)[-1]  # the segment both read (they are at the log's end)
        hook.delay = 0.5
        logged = server_log_size()
        # 27 transactions of 1,000 rows of 1,800 bytes (stored as they are, below TOAST's threshold):
        # about 50 MB of WAL, three of the log's 16 MB segments.
        rows = 27_000
        with connect() as c:
            for i in range(joined, joined + rows, 1_000):
                c.execute(f"INSERT INTO {t} SELECT g, repeat('x', 1800) FROM generate_series(%s::int, %s::int) g",
                          (i, i + 999))
        ids = range(joined + rows)
        assert_exactly_once(consume(f"trim-busy-{unique}", joined + rows, timeout=180), ids)
        wait_for(lambda: (s := log_segments(pg)) and s[0] >= at + 2, timeout=90,
                 what="the log trimmed past the segment after the slow member's")
        assert len(delivered()) < joined + 8_000, "the slow sink is still inside its segment"
        hook.delay = 0
        wait_for(lambda: delivered() >= set(ids), timeout=180, what="the slow sink delivering every row")
        text = server_log(logged)
        assert "cannot read the shared decoding's log" not in text, text[-3000:]
        assert f'sink "{slow}": the shared decoding\'s log no longer holds what it reads next' in text, \
            "the slow sink met the trimmed segment (else this test proves nothing)"
        assert sink_state(pg, slow)[0] == "running"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_no_slot_left_for_the_group_is_named_and_the_sinks_go_on(pg, sinks, unique):
    """Every replication slot in use (physical slots fill what the sink left): the decoder cannot
    make _cdc_group. Its WARNING names max_replication_slots, the sink keeps delivering from its own
    slot meanwhile, and once a slot is free the decoder makes the group's slot and the sink shares.
    Regression: a decoder that had taken its place but opened no log yet published the log of the
    decoder before it (left on disk by the test before) as live; the sink read that dead log and
    delivered nothing more (10 of 20 rows)."""
    t = f"noslot_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(t, f"noslot-{unique}", tables=[t])
    insert_rows(t, 0, 10)
    consume(f"noslot-{unique}", 10)
    # A decoder and group slot left by the test before (with fewer than 10 sinks, auto lets them go).
    wait_for(lambda: decoder_pid(pg) is None and group_slot(pg) is None, timeout=60,
             what="no decoder and no group slot")
    fill = []
    try:
        free = pg.execute("SELECT current_setting('max_replication_slots')::int - count(*) FROM pg_replication_slots"
                          ).fetchone()[0]
        for i in range(free):
            fill.append(f"e2e_fill_{unique}_{i}")
            pg.execute("SELECT pg_create_physical_replication_slot(%s)", (fill[-1],))
        logged = server_log_size()
        with server_settings({"cdc.shared_decoding": "on"}):
            wait_for(lambda: "max_replication_slots, currently" in server_log(logged), timeout=60,
                     what="the decoder's WARNING naming max_replication_slots")
            insert_rows(t, 10, 10)
            assert_exactly_once(consume(f"noslot-{unique}", 20, timeout=60), range(20))
            assert not shared(pg, t)
            pg.execute("SELECT pg_drop_replication_slot(%s)", (fill.pop(),))
            # The decoder tries again within its backoff (at most 30 s).
            wait_for(lambda: (g := group_slot(pg)) and g[0] is not None, timeout=60,
                     what="the decoder holding the group's slot")
            rows_until_shared(pg, [t], 20, [t])
    finally:
        for name in fill:
            pg.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    pg.execute("SELECT cdc_disable(%s)", (t,))
