"""One process per sink: a destination that stops answering holds back no other sink.

Two sinks on one table: a Kafka sink and an in-database (table) sink. The Kafka broker is frozen
(SIGSTOP: its connections stay open and nothing answers, as with a hung or partitioned broker) while
the Kafka sink has a delivery in flight. The oracle is counts, not times: the table sink's event
table (read with SELECT) must receive every row written during the freeze while the Kafka sink has
acknowledged none of them. With one worker serving both sinks in turn, the table sink waited behind
the Kafka sink's commit until the broker timed out (30 s for delivery reports, 30 s more for the
commit), longer than this test waits. After the broker answers again, the Kafka topic holds every
row exactly once."""
import json
import os
import signal
import time

from conftest import connect, consume, delivery_status, server_settings, wait_for
from test_shared_decoding import rows_until_shared

KAFKA_PID = os.path.join(os.environ.get("PG_CDC_RUN", "/var/tmp/pg_cdc"), "kafka", "kafka.pid")


def delivered(pg, sink):
    return delivery_status(pg, sink)["delivered"]["events"]


def test_a_frozen_broker_holds_back_only_its_own_sink(pg, sinks, unique):
    table, topic, events = f"iso_{unique}", f"iso-{unique}", f"iso_events_{unique}"
    kafka_sink, table_sink = f"iso_kafka_{unique}", f"iso_table_{unique}"
    pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (table,))
    sinks.add(kafka_sink, topic, tables=[table])
    pg.execute("SELECT cdc_add_sink(%s, 'table', %s::jsonb)", (table_sink, json.dumps({"table": events, "tables": [table]})))
    broker = int(open(KAFKA_PID).read().strip())
    frozen = False
    try:
        _run(pg, table, events, kafka_sink, table_sink, topic, broker)
    finally:
        with connect() as c:
            c.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (table_sink, table_sink))
            c.execute(f"DROP TABLE IF EXISTS {events}")


def _run(pg, table, events, kafka_sink, table_sink, topic, broker):
    frozen = False
    try:
        for i in range(20):
            pg.execute(f"INSERT INTO {table} VALUES (%s, 'before')", (i,))
        wait_for(lambda: delivered(pg, kafka_sink) == 20 and delivered(pg, table_sink) == 20, what="both sinks running")
        wait_for(lambda: [r[0] for r in pg.execute("SELECT state FROM _cdc_sinks WHERE sink_name IN (%s, %s)",
                                                   (kafka_sink, table_sink)).fetchall()] == ["running", "running"],
                 what="both sinks running")

        os.kill(broker, signal.SIGSTOP)
        frozen = True
        # Each row its own transaction: the Kafka sink starts a delivery with the first and waits.
        for i in range(20, 120):
            pg.execute(f"INSERT INTO {table} VALUES (%s, 'during')", (i,))
        wait_for(lambda: pg.execute(f"SELECT count(*) FROM {events}").fetchone()[0] == 120, timeout=25,
                 what="the table sink delivering while the broker is frozen")
        assert delivered(pg, table_sink) == 120
        # Negative control: the Kafka sink really is held (it acknowledged nothing written since).
        assert delivered(pg, kafka_sink) == 20
    finally:
        if frozen:
            os.kill(broker, signal.SIGCONT)
    wait_for(lambda: delivered(pg, kafka_sink) == 120, timeout=120, what="the Kafka sink catching up")
    ids = sorted(m["value"]["after"]["id"] for m in consume(topic, 120, timeout=60))
    assert ids == list(range(120))


IDLE_TURNS = 6513763   # advisory-lock class of the read turns of sinks with nothing to deliver (src/worker/source.rs)


def test_a_delivering_sink_never_waits_behind_the_reads_of_idle_sinks(pg, sinks, unique):
    """Every slot decodes all WAL, so an idle sink next to a busy table reads as often as the busy
    one; with one pool of read turns (cdc.max_concurrent_reads) the busy sink queued behind every
    idle sink's read. Sinks that sent something in the last second now take turns apart. The test
    holds every turn of the idle pool, as idle sinks' reads would, and checks by counts that a
    delivering sink goes on delivering. Control: a sink that had nothing to send, given a row
    meanwhile, waits for that pool's turn and delivers nothing until it is free."""
    # Read turns are for sinks that decode their own slots (a sink reading the shared decoding's log
    # takes none).
    with server_settings({"cdc.shared_decoding": "off"}):
        _read_turns(pg, sinks, unique)


def _read_turns(pg, sinks, unique):
    busy, idle = f"turn_busy_{unique}", f"turn_idle_{unique}"
    for t in (busy, idle):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
        pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(busy, f"turn-busy-{unique}", tables=[busy])
    sinks.add(idle, f"turn-idle-{unique}", tables=[idle])
    # The idle sink has read once: its decoding session holds its slot.
    wait_for(lambda: pg.execute("SELECT active_pid IS NOT NULL FROM pg_replication_slots JOIN _cdc_sinks "
                                "USING (slot_name) WHERE sink_name = %s", (idle,)).fetchone() == (True,),
             what="the idle sink reading")
    pg.execute(f"INSERT INTO {busy} VALUES (0)")
    wait_for(lambda: delivered(pg, busy) == 1, what="the busy sink's first delivery")
    turns = int(pg.execute("SELECT current_setting('cdc.max_concurrent_reads')").fetchone()[0])
    with connect() as holder:
        for k in range(turns):
            holder.execute("SELECT pg_advisory_lock(%s, %s)", (IDLE_TURNS, k))
        pg.execute(f"INSERT INTO {idle} VALUES (0)")
        # Rows keep coming, each well within a second of the one before.
        for i in range(1, 101):
            pg.execute(f"INSERT INTO {busy} VALUES (%s)", (i,))
            time.sleep(0.02)
        wait_for(lambda: delivered(pg, busy) == 101, timeout=30, what="the busy sink delivering meanwhile")
        wait_for(lambda: pg.execute("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                                    "WHERE l.locktype = 'advisory' AND l.classid = %s AND NOT l.granted "
                                    "AND a.backend_type = 'pg_cdc worker'", (IDLE_TURNS,)).fetchone()[0] == 1,
                 what="the idle sink waiting for a read turn of the idle pool")
        assert delivered(pg, idle) == 0
    wait_for(lambda: delivered(pg, idle) == 1, what="the idle sink's delivery once the turn is free")
    ids = sorted(m["value"]["after"]["id"] for m in consume(f"turn-busy-{unique}", 101))
    assert ids == list(range(101))


def test_a_frozen_broker_holds_back_only_its_own_sink_among_20_sharing_a_decoding(pg, sinks, unique):
    """cdc.shared_decoding: 19 table sinks and a Kafka sink read one decoding of one table. The broker
    is frozen (SIGSTOP) with the Kafka sink's delivery in flight; its own slot and position hold, and
    the 19 others go on reading the shared log and delivering. Oracles: counts in the 19 event tables
    (every row written during the freeze) while the Kafka sink acknowledged none, each sink's
    `decoding.shared`, and after the thaw every row once in the topic (read_committed)."""
    table, topic, kafka_sink = f"iso20_{unique}", f"iso20-{unique}", f"iso20_kafka_{unique}"
    table_sinks = [f"iso20_t{i}_{unique}" for i in range(19)]
    pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (table,))
    broker = int(open(KAFKA_PID).read().strip())
    frozen = False
    try:
        with server_settings({"cdc.shared_decoding": "on"}):
            sinks.add(kafka_sink, topic, tables=[table])
            for name in table_sinks:
                pg.execute("SELECT cdc_add_sink(%s, 'table', %s::jsonb)",
                           (name, json.dumps({"table": f"{name}_events", "tables": [table]})))
            everyone = [kafka_sink] + table_sinks

            before = rows_until_shared(pg, [table], 0, everyone)
            wait_for(lambda: all(delivered(pg, n) == before for n in everyone), timeout=60,
                     what="every sink delivering")

            os.kill(broker, signal.SIGSTOP)
            frozen = True
            for i in range(before, before + 100):
                pg.execute(f"INSERT INTO {table} VALUES (%s, 'during')", (i,))
            total = before + 100
            for name in table_sinks:
                wait_for(lambda name=name: pg.execute(f"SELECT count(*) FROM {name}_events").fetchone()[0] == total,
                         timeout=60, what=f"{name} delivering while the broker is frozen")
            assert all(delivery_status(pg, n)["decoding"]["shared"] for n in table_sinks), \
                "the table sinks left the shared log"
            # Negative control: the Kafka sink really is held.
            assert delivered(pg, kafka_sink) == before
            os.kill(broker, signal.SIGCONT)
            frozen = False
            wait_for(lambda: delivered(pg, kafka_sink) == total, timeout=120, what="the Kafka sink catching up")
            ids = sorted(m["value"]["after"]["id"] for m in consume(topic, total, timeout=60))
            assert ids == list(range(total))
    finally:
        if frozen:
            os.kill(broker, signal.SIGCONT)
        with connect() as c:
            for name in table_sinks:
                c.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (name, name))
                c.execute(f"DROP TABLE IF EXISTS {name}_events")
        pg.execute("SELECT cdc_disable(%s)", (table,))
