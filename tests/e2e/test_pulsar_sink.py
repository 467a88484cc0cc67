"""The Pulsar sink against a real Apache Pulsar standalone broker (4.2.4 from Maven Central, started by
scripts/pulsar.sh with broker-side deduplication on): events keyed and identified, at-least-once through
a SIGKILL of the worker, a restarted worker's messages not dropped as duplicates, and the errors an
operator must see.

The oracles are the source tables (SELECT) and what Apache Pulsar's own Python client (an independent
client) reads from the topics: nothing of the worker's state."""
import json
import os
import time

import pulsar
import pytest

from conftest import check_keyed_at_least_once, connect, delivery_status, restart_worker, sigkill_while_writing, sink_state, typed_sinks, wait_for

SERVICE_URL = os.environ.get("PULSAR_SERVICE_URL", "pulsar://127.0.0.1:6650")


@pytest.fixture(scope="module")
def client():
    c = pulsar.Client(SERVICE_URL, operation_timeout_seconds=30)
    yield c
    c.close()


@pytest.fixture
def pulsar_sinks(pg):
    with typed_sinks(pg, "pulsar") as s:
        yield s


class Reader:
    """Everything a topic holds, from its start, in the order the broker stored it."""

    def __init__(self, client, topic):
        self.consumer = client.subscribe(topic, f"e2e-{os.urandom(4).hex()}",
                                         initial_position=pulsar.InitialPosition.Earliest)
        self.got = []

    def pull(self, seconds=5.0):
        """Receives until the topic has nothing more (or for `seconds` while messages keep coming)."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                m = self.consumer.receive(timeout_millis=1000)
            except pulsar.Timeout:
                return self.got
            self.got.append({"key": m.partition_key(), "props": m.properties(), "raw": m.data(),
                             "event": json.loads(m.data()), "producer": m.producer_name()})
            self.consumer.acknowledge(m)
        return self.got

    def until(self, done, timeout=90, what="messages"):
        return wait_for(lambda: done(self.pull()) and self.got, timeout=timeout, what=what)


def captured(pg, t):
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    return t


def check_at_least_once(messages, expected_ids):
    """Pulsar's messages are told apart by their `id` property and ordered per partition key."""
    return check_keyed_at_least_once(messages, expected_ids, key=lambda m: m["key"], ident=lambda m: m["props"]["id"])


def test_events_arrive_keyed_with_their_identity(pg, pulsar_sinks, client, unique):
    t = captured(pg, f"pulsar_{unique}")
    pulsar_sinks.add(f"pulsar_{unique}", {"service_url": SERVICE_URL, "topic": "cdc.{schema}.{table}"})
    reader = Reader(client, f"persistent://public/default/cdc.public.{t}")
    with pg.transaction():
        for i in range(20):
            pg.execute(f"INSERT INTO {t} VALUES (%s, 0)", (i,))
    for r in range(1, 4):
        pg.execute(f"UPDATE {t} SET v = %s WHERE id %% 2 = 0", (r,))
    pg.execute(f"DELETE FROM {t} WHERE id >= 15")
    got = reader.until(lambda g: len(g) >= 20 + 30 + 5, what="every change")
    assert len(got) == 55, "nothing twice without a failure"
    assert check_at_least_once(got, range(20)) == 0
    first = got[0]
    md = first["event"]["metadata"]
    assert first["key"] == json.dumps({"id": first["event"]["after"]["id"]}, separators=(",", ":"))
    assert first["props"]["table"] == f"public.{t}" and first["props"]["operation"] == md["operation"]
    assert first["props"]["commit_lsn"] == str(md["commit_lsn"])
    assert {m["props"]["id"] for m in got if m["props"]["operation"] == "INSERT"} == \
        {f"{md['commit_lsn']}-{i}" for i in range(1, 21)}
    assert first["producer"].startswith(f"pg_cdc-pulsar_{unique}-")
    # Per row: its values in the order they were written, then its delete.
    by_key = {}
    for m in got:
        by_key.setdefault(m["key"], []).append(m["event"])
    for key, events in by_key.items():
        vs = [e["after"]["v"] for e in events if e["after"]]
        assert vs == sorted(vs), key
        assert (events[-1]["metadata"]["operation"] == "DELETE") == (json.loads(key)["id"] >= 15)
    status = wait_for(lambda: (s := delivery_status(pg, f"pulsar_{unique}"))["delivered"]["events"] >= 55
                      and s["state"] == "running" and s, what="counted and running")
    assert status["sink_type"] == "pulsar" and status["delivery_mode"] == "at_least_once"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def restart_delivers_everything(pg, pulsar_sinks, client, unique, name):
    """Delivers 30 rows, restarts the worker, delivers 30 more: the rows the topic holds."""
    t = captured(pg, f"{name}_{unique}")
    pulsar_sinks.add(f"{name}_{unique}", {"service_url": SERVICE_URL, "topic": f"{name}-{unique}",
                                          "producer_name": f"{name}-{unique}"})
    reader = Reader(client, f"persistent://public/default/{name}-{unique}")
    for i in range(30):
        pg.execute(f"INSERT INTO {t} VALUES (%s, 0)", (i,))
    reader.until(lambda g: len(g) >= 30, what="the first rows")
    restart_worker(pg)
    for i in range(30, 60):
        pg.execute(f"INSERT INTO {t} VALUES (%s, 0)", (i,))
    wait_for(lambda: delivery_status(pg, f"{name}_{unique}")["delivered"]["events"] >= 30, what="delivered")
    wait_for(lambda: pg.execute("SELECT coalesce(sum(events_published), 0) FROM _cdc_offsets WHERE sink_name = %s",
                                (f"{name}_{unique}",)).fetchone()[0] >= 60, what="all 60 acknowledged")
    got = reader.pull()
    pg.execute("SELECT cdc_disable(%s)", (t,))
    return {m["event"]["after"]["id"] for m in got}


def test_a_restarted_worker_is_not_deduplicated_away(pg, pulsar_sinks, client, unique):
    """The Rust client numbers a new producer's messages from 0; the broker deduplicates by producer
    name and sequence id. Each producer's name of its own keeps a restarted worker's messages."""
    assert restart_delivers_everything(pg, pulsar_sinks, client, unique, "pdedup") == set(range(60))


def test_negative_control_a_reused_producer_name_loses_messages(pg, pulsar_sinks, client, unique):
    """The same with every producer named alike (cdc.test_pulsar_reuse_producer_name): the broker
    acknowledges the new producer's first 30 messages and drops them as duplicates."""
    pg.execute("ALTER SYSTEM SET cdc.test_pulsar_reuse_producer_name = on")
    pg.execute("SELECT pg_reload_conf()")
    try:
        got = restart_delivers_everything(pg, pulsar_sinks, client, unique, "preuse")
    finally:
        pg.execute("ALTER SYSTEM RESET cdc.test_pulsar_reuse_producer_name")
        pg.execute("SELECT pg_reload_conf()")
    assert got == set(range(30)), f"the control must lose rows 30-59, got {len(got)} rows"


def test_sigkill_during_delivery_loses_nothing(pg, pulsar_sinks, client, unique):
    """kill -9 of the worker while it sends: every committed row arrives; a message that arrives twice is
    byte-identical and carries the same id property."""
    t = f"pkill_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    pulsar_sinks.add(f"pkill_{unique}", {"service_url": SERVICE_URL, "topic": f"pkill-{unique}"})
    reader = Reader(client, f"persistent://public/default/pkill-{unique}")
    sigkill_while_writing(pg, t, 10, ready=lambda: len(reader.pull()) > 50, pause=0.01)
    with connect() as c:
        ids = [r[0] for r in c.execute(f"SELECT id FROM {t}").fetchall()]
        reader.until(lambda g: len({m["props"]["id"] for m in g}) >= len(ids), timeout=120, what="every row")
        dups = check_at_least_once(reader.pull(), ids)
        print(f"pulsar kill -9: {len(ids)} rows, {dups} messages delivered twice")
        c.execute("SELECT cdc_disable(%s)", (t,))


def test_errors_an_operator_sees(pg, pulsar_sinks, unique):
    for config, text in [
        ({"topic": "t"}, "service_url is required"),
        ({"service_url": "http://127.0.0.1:8080", "topic": "t"}, "not a Pulsar service URL"),
        ({"service_url": SERVICE_URL, "topic": "non-persistent://public/default/t"}, "only persistent topics"),
        ({"service_url": SERVICE_URL, "topic": "t", "exactly_once": True}, "at-least-once"),
    ]:
        with pytest.raises(Exception) as e:
            with pg.transaction():
                pg.execute("SELECT cdc_add_sink('perr', 'pulsar', %s::jsonb)", (json.dumps(config),))
        assert e.value.sqlstate == "22023" and text in str(e.value), (config, e.value)
    t = captured(pg, f"perr_{unique}")
    # Nothing listens there: retried.
    pulsar_sinks.add(f"pdown_{unique}", {"service_url": "pulsar://127.0.0.1:1", "topic": "t"})
    wait_for(lambda: sink_state(pg, f"pdown_{unique}")[0] == "retrying", what="retrying")
    # A tenant that does not exist: an operator must act.
    pulsar_sinks.add(f"ptenant_{unique}", {"service_url": SERVICE_URL, "topic": "persistent://no-such-tenant/ns/t"})
    pg.execute(f"INSERT INTO {t} VALUES (1, 1)")
    state, err = wait_for(lambda: (s := sink_state(pg, f"ptenant_{unique}"))[0] == "error" and s, timeout=60,
                          what="error")
    assert "no-such-tenant" in err, err
    pg.execute("SELECT cdc_disable(%s)", (t,))
