"""A dropped sink leaves nothing at its destination that pg_cdc made for itself: an exactly-once Kafka
sink's progress topic (pg_cdc.progress.<id>) is deleted by the launcher once the drop committed and the
sink's worker stopped; when the broker cannot be reached then, the _cdc_cleanups row stays, with the
error, and the launcher finishes the deletion later."""
import json
import time

from confluent_kafka.admin import AdminClient

from conftest import BOOTSTRAP, consume, server_log, server_log_size, server_settings, wait_for
from test_eventhub_sink import CA, SASL, connection_string


def topics():
    return set(AdminClient({"bootstrap.servers": BOOTSTRAP}).list_topics(timeout=15).topics)


def progress_topic(pg, sink):
    slot = pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (sink,)).fetchone()[0]
    return "pg_cdc.progress." + slot.removeprefix("_cdc_")


def pending(pg, sink):
    return pg.execute("SELECT attempts, last_error FROM _cdc_cleanups WHERE sink_name = %s", (sink,)).fetchone()


def test_cdc_drop_sink_deletes_the_progress_topic(pg, sinks, unique):
    t, topic = f"dsk_{unique}", f"dsk-{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    eo = sinks.add(f"dsk_eo_{unique}", topic, tables=[t])
    alo = sinks.add(f"dsk_alo_{unique}", topic + "-alo", tables=[t], exactly_once=False)
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    consume(topic, 1)
    progress = progress_topic(pg, eo)
    assert progress in topics(), "the exactly-once sink made its progress topic"

    pg.execute("SELECT cdc_drop_sink(%s)", (alo,))
    assert pending(pg, alo) is None, "an at-least-once sink has no progress topic"
    pg.execute("SELECT cdc_drop_sink(%s)", (eo,))
    wait_for(lambda: progress not in topics(), timeout=60, what=f"{progress} deleted")
    wait_for(lambda: pending(pg, eo) is None, what="its cleanup done")
    assert topic in topics(), "the events' topic is the user's: kept"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_broker_down_at_the_drop_leaves_a_cleanup_the_launcher_finishes_later(pg, sinks, unique):
    t, topic = f"dsl_{unique}", f"dsl-{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    name = sinks.add(f"dsl_{unique}", topic, tables=[t])
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    consume(topic, 1)
    progress = progress_topic(pg, name)
    logged = server_log_size()
    with server_settings({"cdc.test_failpoint": f"cleanup_unreachable:{name}"}):
        wait_for(lambda: f"pg_cdc launcher: test failpoint cleanup_unreachable:{name} armed" in server_log(logged),
                 what="the launcher armed the failpoint")
        pg.execute("SELECT cdc_drop_sink(%s)", (name,))
        row = wait_for(lambda: (p := pending(pg, name)) and p[0] >= 2 and p, timeout=60, what="two failed attempts")
        assert "failpoint cleanup_unreachable" in row[1]
        # Control: while the broker is taken as down, the topic stays and so does its row.
        assert progress in topics()
    wait_for(lambda: progress not in topics(), timeout=90, what=f"{progress} deleted once the broker is back")
    wait_for(lambda: pending(pg, name) is None, what="its cleanup done")
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_sinks_dropped_while_they_open_crash_nothing(pg, unique):
    """Regression: a sink worker that exited while a thread of it was still opening its destination (an
    Event Hubs or SASL_SSL Kafka producer: librdkafka and OpenSSL threads) crashed in exit()'s cleanup
    (SIGSEGV), and the postmaster restarted every backend. Sinks added and dropped 20 to 300 ms later,
    twenty rounds: the worker now waits for its opening threads before it exits. Before the fix this
    crashed the server within a few rounds here, though not on every run: the crash needs a thread
    inside the library at the moment of exit."""
    t = f"dsopen_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    configs = [
        ("eventhub", {"namespace": "contoso", "eventhub": f"dsopen-{unique}", "bootstrap_servers": SASL,
                      "connection_string": connection_string(), "properties": {"ssl.ca.location": CA}}),
        ("kafka", {"topic": f"dsopen-{unique}", "properties": {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                                             "sasl.username": "app", "sasl.password": "x"}}),
        ("kafka", {"topic": f"dsopen-{unique}"}),
    ]
    logged = server_log_size()
    for rnd in range(20):
        names = []
        for i, (kind, cfg) in enumerate(configs):
            names.append(f"dsopen_{unique}_{rnd}_{i}")
            pg.execute("SELECT cdc_add_sink(%s, %s, %s::jsonb)", (names[-1], kind, json.dumps({**cfg, "tables": [t]})))
        time.sleep((0.02, 0.05, 0.1, 0.2, 0.3)[rnd % 5])
        for n in names:
            pg.execute("SELECT cdc_drop_sink(%s)", (n,))
    time.sleep(6)  # an exiting worker waits at most 5 s for its opening threads
    assert "terminated by signal" not in server_log(logged), "a sink worker crashed"
    assert pg.execute("SELECT 1").fetchone() == (1,), "the test's own connection survived"
    pg.execute("SELECT cdc_disable(%s)", (t,))
