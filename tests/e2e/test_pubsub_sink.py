"""The Pub/Sub sink against Google's own fake Pub/Sub server (pstest, started by scripts/pubsub.sh): seed
example 5's Pub/Sub sink as written, per-key order and each event's identity, failed publishes, at-least-once
through a SIGKILL of the worker, and the errors an operator must see.

The oracles are the source tables (SELECT) and what Google's Python client (an independent client) pulls
from a subscription with message ordering: nothing of the worker's state. The server fails every third
Publish request to a topic named *flaky* (and logs it), so the retry path runs against the real client."""
import json
import os
import subprocess
import time

import psycopg
import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1

from conftest import check_keyed_at_least_once, connect, delivery_status, sigkill_while_writing, sink_state, typed_sinks, wait_for

PROJECT = "helios-analytics"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def clients():
    assert os.environ.get("PUBSUB_EMULATOR_HOST"), "scripts/env.sh exports PUBSUB_EMULATOR_HOST"
    return pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()


@pytest.fixture
def pubsub_sinks(pg):
    with typed_sinks(pg, "pubsub") as s:
        yield s


def add(pg, sinks, name, config):
    return sinks.add(name, config)


def fresh_topic(clients, topic, subscription=True):
    """Creates the topic (dropped first: the server keeps topics until it stops) and an ordered
    subscription that sees everything published from now on."""
    pub, sub = clients
    t, s = pub.topic_path(PROJECT, topic), sub.subscription_path(PROJECT, f"{topic}-reader")
    for drop in (lambda: sub.delete_subscription(subscription=s), lambda: pub.delete_topic(topic=t)):
        try:
            drop()
        except gexc.NotFound:
            pass
    pub.create_topic(name=t)
    if subscription:
        sub.create_subscription(request={"name": s, "topic": t, "enable_message_ordering": True})
    return s


class Reader:
    """Pulls (and acknowledges) everything of a subscription, in the order the server delivers it."""

    def __init__(self, clients, subscription):
        self.sub, self.subscription, self.got = clients[1], subscription, []

    def pull(self, rounds=None):
        """Pulls until the subscription has nothing more (or `rounds` pulls); returns all pulled so far."""
        while rounds is None or rounds > 0:
            rounds = None if rounds is None else rounds - 1
            r = self.sub.pull(subscription=self.subscription, max_messages=1000, timeout=10)
            if not r.received_messages:
                return self.got
            for m in r.received_messages:
                self.got.append({"key": m.message.ordering_key, "attrs": dict(m.message.attributes),
                                 "raw": m.message.data, "event": json.loads(m.message.data)})
            self.sub.acknowledge(subscription=self.subscription, ack_ids=[m.ack_id for m in r.received_messages])
        return self.got

    def until(self, done, timeout=90, what="messages"):
        return wait_for(lambda: done(self.pull()) and self.got, timeout=timeout, what=what)


def check_at_least_once(messages, expected_ids, table):
    """Pub/Sub's messages are told apart by their `id` attribute and ordered per ordering key."""
    return check_keyed_at_least_once(messages, expected_ids, table, key=lambda m: m["key"],
                                     ident=lambda m: m["attrs"]["id"])


def injected_faults():
    out = subprocess.run([f"{ROOT}/scripts/pubsub.sh", "logs", "-n", "100000"], capture_output=True, text=True)
    return out.stdout.count("injected UNAVAILABLE")


def test_seed_example_5s_sink_as_written(pg, pubsub_sinks, clients, unique):
    """Seed example 5's Pub/Sub sink, its config text as written (the endpoint comes from
    cdc.pubsub_endpoint): each event is one message, its data the event, its ordering key the row's key,
    its attributes the event's identity, table and operation; each key's changes in commit order."""
    subscription = fresh_topic(clients, "customers-asia")
    t = f"global_customers_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, name text, customer_region text, balance numeric)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    add(pg, pubsub_sinks, "gcp_pubsub", """{
    "project": "helios-analytics",
    "topic": "customers-asia"
}""")
    with pg.transaction():
        for i in range(30):
            pg.execute(f"INSERT INTO {t} VALUES (%s, %s, 'asia', %s)", (i, f"c{i}", i * 10))
    for round_ in range(5):
        pg.execute(f"UPDATE {t} SET balance = balance + 1 WHERE id %% 3 = %s", (round_ % 3,))
    pg.execute(f"DELETE FROM {t} WHERE id >= 25")
    reader = Reader(clients, subscription)
    # 30 inserts, 5 rounds of 10 updates, 5 deletes.
    reader.until(lambda g: len({m["attrs"]["id"] for m in g if m["attrs"]["table"] == f"public.{t}"}) >= 85,
                 what="every change")
    got = [m for m in reader.got if m["attrs"]["table"] == f"public.{t}"]
    assert check_at_least_once(got, range(30), t) == 0
    first = got[0]
    m = first["event"]["metadata"]
    assert first["key"] == json.dumps({"id": first["event"]["after"]["id"]}, separators=(",", ":"))
    assert first["attrs"]["table"] == f"public.{t}" and first["attrs"]["operation"] == m["operation"]
    assert first["attrs"]["commit_lsn"] == str(m["commit_lsn"])
    # id is <commit_lsn>-<event_index>: the 30 inserts of one transaction numbered 1 to 30.
    inserts = {msg["attrs"]["id"] for msg in got if msg["attrs"]["operation"] == "INSERT"}
    commit = {msg["event"]["metadata"]["commit_lsn"] for msg in got if msg["attrs"]["operation"] == "INSERT"}
    assert len(commit) == 1 and inserts == {f"{c}-{i}" for c in commit for i in range(1, 31)}
    assert len({msg["attrs"]["id"] for msg in got}) == len(got)
    # Per row, the balances in the order they were written, then its delete.
    by_key = {}
    for msg in got:
        by_key.setdefault(msg["key"], []).append(msg["event"])
    for key, events in by_key.items():
        row_id = json.loads(key)["id"]
        balances = [e["after"]["balance"] for e in events if e["metadata"]["operation"] != "DELETE"]
        assert balances == sorted(balances, key=float), key
        assert (events[-1]["metadata"]["operation"] == "DELETE") == (row_id >= 25)
    status = wait_for(lambda: (s := delivery_status(pg, "gcp_pubsub"))["delivered"]["events"] >= 85
                      and s["state"] == "running" and s, what="counted and running")
    assert status["sink_type"] == "pubsub" and status["delivery_mode"] == "at_least_once"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_failed_publishes_keep_each_key_in_order(pg, pubsub_sinks, clients, unique):
    """Every third Publish request the server gets for this topic fails (UNAVAILABLE): every row arrives,
    each key's messages in commit order, and a message published twice is byte-identical."""
    topic = f"e2e-flaky-{unique}"
    subscription = fresh_topic(clients, topic)
    t = f"pf_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    before = injected_faults()
    add(pg, pubsub_sinks, f"pf_{unique}", {"project": PROJECT, "topic": topic})
    pg.execute(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(1, 12) g")
    for i in range(30):
        with pg.transaction():
            for j in range(20):
                pg.execute(f"UPDATE {t} SET v = %s WHERE id = %s", (i * 20 + j, 1 + (i * 7 + j) % 12))
    reader = Reader(clients, subscription)
    got = reader.until(lambda g: len({m["attrs"]["id"] for m in g}) >= 612, timeout=120, what="every change")
    assert injected_faults() - before > 3, "the server failed publishes"
    check_at_least_once(got, range(1, 13), t)
    by_key = {}
    seen = set()
    for m in got:
        if m["attrs"]["id"] in seen:
            continue
        seen.add(m["attrs"]["id"])
        if m["event"]["metadata"]["operation"] == "UPDATE":
            by_key.setdefault(m["key"], []).append(m["event"]["after"]["v"])
    assert sum(map(len, by_key.values())) == 600 and all(v == sorted(v) for v in by_key.values())

    # Negative control: the oracle sees a key's messages swapped.
    i = next(i for i in range(1, len(got)) if got[i]["key"] == got[i - 1]["key"]
             and got[i]["attrs"]["id"] != got[i - 1]["attrs"]["id"])
    swapped = got[:i - 1] + [got[i], got[i - 1]] + got[i + 1:]
    with pytest.raises(AssertionError, match="out of commit order"):
        check_at_least_once(swapped, range(1, 13), t)
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_sigkill_during_delivery_loses_nothing(pg, pubsub_sinks, clients, unique):
    """kill -9 of the worker while it publishes: every committed row arrives; a message that arrives
    twice is byte-identical and carries the same id attribute."""
    topic = f"e2e-kill-{unique}"
    subscription = fresh_topic(clients, topic)
    t = f"pk_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    add(pg, pubsub_sinks, f"pk_{unique}", {"project": PROJECT, "topic": topic})
    reader = Reader(clients, subscription)
    sigkill_while_writing(pg, t, 10, ready=lambda: len(reader.pull(rounds=1)) > 50, pause=0.01)
    with connect() as c:
        ids = [r[0] for r in c.execute(f"SELECT id FROM {t}").fetchall()]
        reader.until(lambda g: len({m["attrs"]["id"] for m in g}) >= len(ids), timeout=120, what="every row")
        time.sleep(1.0)
        check_at_least_once(reader.pull(), ids, t)
        c.execute("SELECT cdc_disable(%s)", (t,))


def test_errors_an_operator_sees(pg, pubsub_sinks, clients, unique):
    def refused(cfg):
        with pytest.raises(psycopg.Error) as e:
            pg.execute("SELECT cdc_add_sink(%s, 'pubsub', %s::jsonb)", (f"px_{unique}", json.dumps(cfg)))
        return e.value.sqlstate, e.value.diag.message_primary

    assert refused({"project": PROJECT}) == ("22023", "config.topic is required for a Pub/Sub sink")
    assert refused({"topic": "abc"}) == ("22023", "config.project is required for a Pub/Sub sink")
    assert refused({"project": PROJECT, "topic": "goog-x"})[0] == "22023"
    assert refused({"project": PROJECT, "topic": "abc", "exactly_once": True})[0] == "22023"
    assert refused({"project": PROJECT, "topic": "abc", "format": "avro"})[0] == "0A000"

    t = f"pe_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    topic = f"no-such-topic-{unique}"
    missing = add(pg, pubsub_sinks, f"pm_{unique}", {"project": PROJECT, "topic": topic, "tables": [t]})
    down = add(pg, pubsub_sinks, f"pd_{unique}", {"project": PROJECT, "topic": "abc", "tables": [t],
                                                   "endpoint": "http://127.0.0.1:9", "timeout_ms": 2000})
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    state = wait_for(lambda: (s := sink_state(pg, missing))[0] == "error" and s, what="missing topic: error")
    assert "the topic does not exist" in state[1] and topic in state[1], state
    state = wait_for(lambda: (s := sink_state(pg, down))[0] == "retrying" and s, timeout=60,
                     what="unreachable endpoint: retrying")
    # Once the topic exists, the sink that was missing it delivers.
    subscription = fresh_topic(clients, topic)
    reader = Reader(clients, subscription)
    reader.until(lambda g: len(g) >= 1, timeout=120, what="delivered once created")
    check_at_least_once(reader.pull(), [1], t)
    pg.execute("SELECT cdc_disable(%s)", (t,))
