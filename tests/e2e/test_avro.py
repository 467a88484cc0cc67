"""The avro format end to end: pg_cdc registers each table version's schema with the registry (the
STAND-IN of tests/schema_registry, see the README) and writes Confluent's wire format; every event is
read back with confluent-kafka's own SchemaRegistryClient and AvroDeserializer, and compared field by
field with what the same change says through a JSON sink (parsed with exact decimals) and with the
rows in PostgreSQL. The seed's Avro sinks (examples 1 and 2) run as written, their registry coming
from the server setting cdc.schema_registry."""
import datetime
import json
import os
import re
import subprocess
import uuid
from decimal import Decimal

import pytest
from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from conftest import (BOOTSTRAP, consume, create_topic, hold_worker, read_messages, server_settings, sink_state,
                      wait_for, wait_setting)
from test_compliance import SEED_CONFIG as SEED_2_CONFIG, create_transactions, token, token_key  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
REGISTRY_SCRIPT = os.path.join(HERE, "..", "..", "scripts", "schema-registry.sh")
URL = os.environ.get("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081")


@pytest.fixture(scope="module", autouse=True)
def registry_up():
    subprocess.run([REGISTRY_SCRIPT, "start"], check=True, capture_output=True)
    yield
    subprocess.run([REGISTRY_SCRIPT, "start"], check=True, capture_output=True)


@pytest.fixture
def server_registry(pg):
    """The seed's Avro sinks name no registry: the server setting gives it."""
    with server_settings({"cdc.schema_registry": URL}):
        wait_setting(pg, "cdc.schema_registry", URL)
        yield URL


def consume_avro(topic, count, timeout=40.0):
    """`count` messages of `topic` (read_committed), decoded with confluent-kafka's AvroDeserializer
    (which fetches each writer schema from the registry by the id in the message), in commit order."""
    client = SchemaRegistryClient({"url": URL})
    values, keys = AvroDeserializer(client), AvroDeserializer(client)
    out = read_messages(topic, count, timeout)
    assert len(out) == count, f"{len(out)} of {count} messages on {topic}"
    res = []
    for m in out:
        assert m.value()[0] == 0, "Confluent's magic byte"
        value = values(m.value(), SerializationContext(topic, MessageField.VALUE))
        key = keys(m.key(), SerializationContext(topic, MessageField.KEY)) if m.key() else None
        res.append({"value": value, "key": key, "raw": m.value(), "raw_key": m.key(),
                    "id": int.from_bytes(m.value()[1:5], "big"), "partition": m.partition(), "offset": m.offset()})
    res.sort(key=lambda e: (e["value"]["metadata"]["commit_lsn"], e["value"]["metadata"]["lsn"]))
    return res


def commit_positions(group, topic, msgs):
    """Commits, for consumer group `group`, the offsets just past `msgs` (per partition), as a
    consumer that read them would."""
    from confluent_kafka import TopicPartition
    last = {}
    for m in msgs:
        last[m["partition"]] = max(last.get(m["partition"], -1), m["offset"])
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o + 1) for p, o in last.items()], asynchronous=False)
    finally:
        c.close()


def exact(msgs):
    """JSON events again, numbers parsed exactly (Decimal), as the Avro ones are compared with them."""
    return [{**m, "value": json.loads(m["raw"], parse_float=Decimal),
             "key": json.loads(json.dumps(m["key"]), parse_float=Decimal)} for m in msgs]


def same(avro, js, what):
    """Whether an Avro-decoded value says what the JSON event's value says."""
    if js is None or avro is None:
        assert avro is None and js is None, f"{what}: {avro!r} vs {js!r}"
    elif isinstance(avro, datetime.datetime):
        text = js.replace("Z", "+00:00")
        assert avro == datetime.datetime.fromisoformat(text), f"{what}: {avro!r} vs {js!r}"
    elif isinstance(avro, datetime.date):
        assert avro == datetime.date.fromisoformat(js), f"{what}: {avro!r} vs {js!r}"
    elif isinstance(avro, uuid.UUID):
        assert avro == uuid.UUID(js), what
    elif isinstance(avro, Decimal):
        assert avro == Decimal(str(js)) and str(avro) == str(js), f"{what}: {avro!r} vs {js!r} (exact, same scale)"
    elif isinstance(avro, str) and isinstance(js, (dict, list)):
        # json and jsonb: the JSON text in Avro, embedded in the JSON event.
        assert json.loads(avro, parse_float=Decimal) == js, f"{what}: {avro!r} vs {js!r}"
    elif isinstance(avro, float) and isinstance(js, str):
        # NaN and the infinities: strings in JSON, IEEE values in Avro.
        assert str(avro).lower() in (js.lower(), js.lower()[:3]), f"{what}: {avro!r} vs {js!r}"
    elif isinstance(avro, dict):
        assert set(avro) >= set(js), f"{what}: {sorted(avro)} vs {sorted(js)}"
        for k in avro:
            same(avro[k], js.get(k), f"{what}.{k}")
    elif isinstance(avro, list):
        assert len(avro) == len(js), what
        for i, (a, j) in enumerate(zip(avro, js)):
            same(a, j, f"{what}[{i}]")
    else:
        assert avro == js, f"{what}: {avro!r} vs {js!r}"


def compare(avro_events, json_events):
    assert len(avro_events) == len(json_events)
    for a, j in zip(avro_events, json_events):
        av, jv = a["value"], j["value"]
        meta = jv["metadata"]
        assert (av["metadata"]["commit_lsn"], av["metadata"]["lsn"]) == (meta["commit_lsn"], meta["lsn"])
        for k in ("source", "database", "schema", "table", "operation", "transaction_id", "transaction"):
            same(av["metadata"][k], meta.get(k), f"metadata.{k}")
        assert av["metadata"]["timestamp"] == datetime.datetime.fromisoformat(meta["timestamp"].replace("Z", "+00:00"))
        for image in ("before", "after"):
            same(av[image], jv[image], image)
        same(a["key"], j["key"], "key")


SEED_1_CONFIG = """{
    "capture_mode": "all_changes",
    "operations": ["INSERT", "UPDATE", "DELETE"],
    "include_before_image": true,
    "include_transaction_info": true,
    "partition_key": "customer_region"
}"""


def test_seed_example_1_avro_sink_says_what_the_json_sink_says(pg, sinks, unique, server_registry):
    t = f"orders_{unique}"
    pg.execute(f"""CREATE TABLE {t} (order_id bigint PRIMARY KEY, customer_id text, customer_region text,
                   total numeric(10,2), status varchar(20), tags text[], ref uuid, placed date,
                   created_at timestamptz, local_at timestamp, weight float8, qty int, paid bool, doc jsonb)""")
    pg.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
    pg.execute("SELECT cdc_enable(table_name => %s, config => %s::jsonb)", (t, SEED_1_CONFIG))
    fulfillment, analytics = f"orders.fulfillment-{unique}", f"orders.analytics-{unique}"
    # Seed example 1's sinks, as written (the test's broker and tables added).
    sinks.add(f"kafka_fulfillment_{unique}", fulfillment, format="avro", tables=[t])
    sinks.add(f"kafka_analytics_{unique}", analytics, format="json", tables=[t])
    # BC dates and infinities are written too (the unit tests read them back with apache-avro), but
    # Python's datetime, which the deserializer returns, cannot hold them.
    pg.execute(f"""INSERT INTO {t} VALUES
        (1, 'C-1', 'us-east', 150.00, 'pending', '{{a,NULL,"b c"}}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
         '2024-02-29', '2024-03-15 14:23:45.123456+00', '2024-03-15 14:23:45.5', 2.5, 3, true, '{{"k": [1, 2.50]}}'),
        (2, 'C-2', 'eu-west', -0.01, 'draft', NULL, NULL, '0001-01-01', '1969-12-31 23:59:59.999999+00',
         '9999-12-31 23:59:59', 'Infinity', NULL, NULL, NULL)""")
    with pg.transaction():
        pg.execute(f"UPDATE {t} SET total = 99999999.99, status = 'shipped' WHERE order_id = 1")
        pg.execute(f"DELETE FROM {t} WHERE order_id = 2")
    avro = consume_avro(fulfillment, 4)
    js = exact(consume(analytics, 4))
    compare(avro, js)
    ins = avro[0]["value"]
    assert ins["after"]["total"] == Decimal("150.00") and ins["after"]["ref"] == uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert ins["after"]["created_at"] == datetime.datetime(2024, 3, 15, 14, 23, 45, 123456, tzinfo=datetime.timezone.utc)
    assert ins["after"]["tags"] == ["a", None, "b c"]
    assert avro[0]["key"] == {"customer_region": "us-east"}, "partition_key keys the events"
    # The rows in PostgreSQL, as the oracle for the values the JSON sink and the Avro sink agree on.
    assert avro[2]["value"]["after"]["total"] == pg.execute(f"SELECT total FROM {t} WHERE order_id = 1").fetchone()[0]
    assert avro[2]["value"]["before"]["total"] == Decimal("150.00")
    assert avro[3]["value"]["metadata"]["operation"] == "DELETE" and avro[3]["value"]["after"] is None
    # One topic for several tables: the subjects are the records' names, scoped by the topic.
    client = SchemaRegistryClient({"url": URL})
    db = pg.execute("SELECT current_database()").fetchone()[0]
    value_subject = f"{fulfillment}-{db}.public.{t}.Envelope"
    assert value_subject in client.get_subjects() and f"{fulfillment}-{db}.public.{t}.Key" in client.get_subjects()
    latest = client.get_latest_version(value_subject)
    assert latest.schema_id == avro[0]["id"] and client.get_versions(value_subject) == [1]
    assert client.get_compatibility(value_subject) == "BACKWARD", "the table's mode (backward by default)"
    # The registered schema documents the types.
    fields = {f["name"]: f["type"][1] for f in
              next(f for f in json.loads(latest.schema.schema_str)["fields"] if f["name"] == "before")["type"][1]["fields"]}
    assert fields["total"] == {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
    assert fields["created_at"] == {"type": "long", "logicalType": "timestamp-micros"}


def test_seed_example_2_compliance_stream_in_avro_hides_what_json_hides(pg, sinks, unique, token_key, server_registry):
    t, topic = f"transactions_{unique}", f"transactions.audit-{unique}"
    create_transactions(pg, t)
    pg.execute("SELECT cdc_enable(table_name => %s, config => %s::jsonb)", (t, SEED_2_CONFIG))
    # Seed example 2's Avro sink, as written (the test's broker and tables added).
    sinks.add(f"kafka_compliance_{unique}", topic, format="avro", exactly_once=True,
              transactional_id=f"pg-cdc-compliance-{unique}", tables=[t])
    pg.execute(f"""INSERT INTO {t} VALUES ('TXN-847293', 'ACC-1234', '123-45-6789', 15000.00, 'wire_transfer',
                   'ACC-5678', '2024-03-15 14:23:45+00')""")
    pg.execute(f"UPDATE {t} SET amount = 15500.00, ssn = '987-65-4321' WHERE transaction_id = 'TXN-847293'")
    msgs = consume_avro(topic, 2)
    raw = b"".join(m["raw"] + (m["raw_key"] or b"") for m in msgs)
    for secret in (b"ACC-1234", b"123-45-6789", b"987-65-4321"):
        assert secret not in raw, f"{secret!r} reached the stream"
    ins, upd = msgs[0]["value"], msgs[1]["value"]
    assert ins["after"]["account_number"] == token("ACC-1234") and ins["after"]["ssn"] == token("123-45-6789")
    assert ins["after"]["amount"] == Decimal("15000.00")
    assert ins["metadata"]["user"] == "postgres" and ins["metadata"]["transaction"]["event_count"] == 1
    comp = ins["compliance"]
    assert comp["pii_tokenized"] == ["account_number", "ssn"] and comp["key_version"] == 7
    committed = ins["metadata"]["timestamp"].date()
    assert comp["retention_until"] == committed + datetime.timedelta(days=2555)
    assert upd["before"]["ssn"] == token("123-45-6789") and upd["after"]["ssn"] == token("987-65-4321")
    assert msgs[0]["key"] == {"transaction_id": "TXN-847293"}


def test_a_new_table_version_is_registered_and_a_v1_consumer_reads_v2_events(pg, sinks, unique):
    """Seed example 3 with the avro format: the table's schema_evolution names the registry; each
    event is written with the schema of its LSN, even when the worker reads it after the ALTER."""
    t = f"evo_{unique}"
    pg.execute(f"""CREATE TABLE {t} (order_id varchar(50) PRIMARY KEY, customer_id varchar(50),
                   total decimal(10,2), status varchar(20))""")
    pg.execute("SELECT cdc_enable(%s, %s::jsonb)", (t, json.dumps({"schema_evolution": {
        "enabled": True, "compatibility_mode": "full", "schema_registry": URL, "auto_register": True}})))
    topic = f"evo-{unique}.{{table}}"
    real_topic = f"evo-{unique}.{t}"
    create_topic(real_topic)  # one partition: the consumers' positions below are in one order
    sinks.add(f"evo_{unique}", topic, format="avro", tables=[t])
    sinks.topics.append(real_topic)
    pg.execute(f"INSERT INTO {t} VALUES ('ORD-0', 'C-0', 1.00, 'new')")
    consume_avro(real_topic, 1)
    # Written before the ALTER, read by the worker after it: still version 1.
    with hold_worker(pg):
        pg.execute(f"INSERT INTO {t} VALUES ('ORD-1', 'C-1', 150.00, 'pending')")
        pg.execute(f"ALTER TABLE {t} ADD COLUMN shipping_method VARCHAR(50) DEFAULT 'standard'")
        pg.execute(f"INSERT INTO {t} VALUES ('ORD-2', 'C-2', 20.50, 'pending', 'air')")
    msgs = consume_avro(real_topic, 3)
    v1, v1b, v2 = msgs
    assert v1["id"] == v1b["id"] != v2["id"]
    assert "shipping_method" not in v1b["value"]["after"]
    assert v2["value"]["after"]["shipping_method"] == "air"
    client = SchemaRegistryClient({"url": URL})
    subject = f"{real_topic}-value"
    assert client.get_versions(subject) == [1, 2]
    assert client.get_compatibility(subject) == "FULL"
    assert f"{real_topic}-key" in client.get_subjects()
    # A consumer holding version 1 (its reader schema) reads version 2 events: the new field is left out.
    v1_schema = client.get_schema(v1["id"]).schema_str
    old_reader = AvroDeserializer(SchemaRegistryClient({"url": URL}), v1_schema)
    read = old_reader(v2["raw"], SerializationContext(real_topic, MessageField.VALUE))
    assert read["after"] == {"order_id": "ORD-2", "customer_id": "C-2", "total": Decimal("20.50"), "status": "pending"}
    # The history records the change.
    # Two consumer groups: one read everything, one only what was written under version 1. The
    # history's consumers come from their committed offsets.
    commit_positions("fulfillment_service", real_topic, msgs)
    commit_positions("legacy_system", real_topic, [v1, v1b])
    # The history records the change, and the ids the registry gave each version's schema.
    history = wait_for(lambda: (h := pg.execute("SELECT cdc_schema_history(%s)", (t,)).fetchone()[0])
                       ["schema_versions"][1].get("schema_id") and h, what="the ids recorded")
    assert [v["version"] for v in history["schema_versions"]] == [1, 2]
    assert [v["schema_id"] for v in history["schema_versions"]] == [v1["id"], v2["id"]]
    assert history["schema_versions"][1]["registered"] == [{"registry": URL, "subject": subject, "schema_id": v2["id"]}]
    consumers = history["consumers"]
    assert "consumers_unavailable" not in history, history
    assert consumers["fulfillment_service"]["using_version"] == 2 and consumers["fulfillment_service"]["caught_up"]
    # Version 2 is FULL compatible with 1: a reader of version 1 reads its events.
    assert consumers["legacy_system"]["using_version"] == 1 and consumers["legacy_system"]["status"] == "compatible"
    assert not consumers["legacy_system"]["caught_up"] and consumers["legacy_system"]["lag_offsets"] >= 1
    assert consumers["legacy_system"]["sinks"] == [{"sink": f"evo_{unique}", "topic": real_topic}]


def test_a_version_with_a_topic_of_its_own_breaks_no_consumer(pg, sinks, unique):
    """Seed example 3's third option: under enforcement a breaking ALTER is refused, its ERROR names
    cdc_create_version_topic; once called, the ALTER commits and its version's events, and those
    of the versions after it, go to <topic>.v<N> (made with the table topic's partitions) with
    subjects of their own, so the registry accepts a schema its mode would refuse on the table's
    subject. The consumers of the table's topic see only the versions they read; the history
    reads the groups of both topics."""
    import psycopg

    t = f"vt_{unique}"
    pg.execute(f"CREATE TABLE {t} (order_id varchar(50) PRIMARY KEY, total decimal(10,2))")
    pg.execute("SELECT cdc_enable(%s, %s::jsonb)", (t, json.dumps({"schema_evolution": {
        "compatibility_mode": "full", "enforce": True, "schema_registry": URL}})))
    real_topic = f"vt-{unique}.{t}"
    create_topic(real_topic, partitions=3)
    sinks.add(f"vt_{unique}", f"vt-{unique}.{{table}}", format="avro", tables=[t])
    version_topic = f"{real_topic}.v2"
    sinks.topics += [real_topic, version_topic]
    pg.execute(f"INSERT INTO {t} VALUES ('ORD-0', 1.00)")
    consume_avro(real_topic, 1)
    # A new scale is a new encoding: it breaks both ways, and "enforce" refuses it.
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
        pg.execute(f"ALTER TABLE {t} ALTER COLUMN total TYPE numeric(12,3)")
    assert f"3. Create new topic: SELECT cdc_create_version_topic('{t}', 2)" in refused.value.diag.message_hint
    made = pg.execute("SELECT cdc_create_version_topic(%s, 2)", (t,)).fetchone()[0]
    assert made == {"table": t, "version": 2, "status": "armed",
                    "topics": [{"sink": f"vt_{unique}", "topic": version_topic}]}
    pg.execute(f"INSERT INTO {t} VALUES ('ORD-1', 2.00)")
    pg.execute(f"ALTER TABLE {t} ALTER COLUMN total TYPE numeric(12,3)")
    pg.execute(f"INSERT INTO {t} VALUES ('ORD-2', 3.125)")
    # A later compatible version stays on the version's topic.
    pg.execute(f"ALTER TABLE {t} ADD COLUMN note text")
    pg.execute(f"INSERT INTO {t} VALUES ('ORD-3', 4.5, 'n')")
    old = consume_avro(real_topic, 2)
    new = consume_avro(version_topic, 2)
    assert [m["value"]["after"]["order_id"] for m in old] == ["ORD-0", "ORD-1"], "the table's topic: version 1 only"
    assert [m["value"]["after"]["order_id"] for m in new] == ["ORD-2", "ORD-3"]
    assert new[0]["value"]["after"]["total"] == Decimal("3.125") and new[1]["value"]["after"]["note"] == "n"
    from confluent_kafka.admin import AdminClient
    meta = AdminClient({"bootstrap.servers": BOOTSTRAP}).list_topics(version_topic, timeout=15)
    assert len(meta.topics[version_topic].partitions) == 3, "as many partitions as the table's topic"
    client = SchemaRegistryClient({"url": URL})
    assert client.get_versions(f"{real_topic}-value") == [1]
    assert client.get_versions(f"{version_topic}-value") == [1, 2]
    # The table's subject holds only the schema of scale 2; the version's subject starts with the
    # schema of scale 3, which no reader of the table's subject meets.
    scales = lambda m: {int(x) for x in re.findall(r'"scale":\s*(\d+)', client.get_schema(m["id"]).schema_str)}  # noqa: E731
    assert scales(old[0]) == {2} and scales(new[0]) == {3}
    # The history: version 2 has a topic of its own; a group that read the table's topic to its end
    # reads version 1 and never meets version 2; one on the version's topic is on version 3.
    commit_positions(f"old_app_{unique}", real_topic, old)
    commit_positions(f"new_app_{unique}", version_topic, new[:1])
    history = pg.execute("SELECT cdc_schema_history(%s)", (t,)).fetchone()[0]
    assert [v.get("own_topic", False) for v in history["schema_versions"]] == [False, True, False]
    assert history["schema_versions"][1]["compatibility"] == "NONE"
    consumers = history["consumers"]
    assert "consumers_unavailable" not in history, history
    assert consumers[f"old_app_{unique}"]["using_version"] == 1
    assert consumers[f"old_app_{unique}"]["status"] == "compatible" and consumers[f"old_app_{unique}"]["caught_up"]
    assert consumers[f"old_app_{unique}"]["sinks"] == [{"sink": f"vt_{unique}", "topic": real_topic}]
    # Its last event is of version 2; when the partition holds nothing after it, what it reads next
    # is of the version in force now (ORD-3 may have gone to another of the 3 partitions).
    new_app = consumers[f"new_app_{unique}"]
    assert new_app["using_version"] == (3 if new_app["caught_up"] else 2), new_app
    assert consumers[f"new_app_{unique}"]["status"] == "compatible", "version 3 is FULL compatible with 2"
    assert consumers[f"new_app_{unique}"]["sinks"] == [{"sink": f"vt_{unique}", "topic": version_topic}]


def test_a_registry_that_is_down_is_retried_and_nothing_is_lost(pg, sinks, unique):
    t, topic = f"down_{unique}", f"down-{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    name = sinks.add(f"down_{unique}", topic, format="avro", schema_registry=URL, tables=[t])
    pg.execute(f"INSERT INTO {t} VALUES (1, 'a')")
    consume_avro(topic, 1)
    subprocess.run([REGISTRY_SCRIPT, "stop"], check=True, capture_output=True)
    try:
        # A new table version needs a new schema: the worker must reach the registry.
        pg.execute(f"ALTER TABLE {t} ADD COLUMN w int")
        pg.execute(f"INSERT INTO {t} SELECT g, 'b', g FROM generate_series(2, 4) g")
        # The worker may first show a short "retrying" while it reads the new schema version from
        # the history (its catalog copy is older than the ALTER); the registry's error comes next.
        wait_for(lambda: (s := sink_state(pg, name))[0] == "retrying" and "schema registry" in (s[1] or ""),
                 what="retrying on the schema registry")
    finally:
        subprocess.run([REGISTRY_SCRIPT, "start"], check=True, capture_output=True)
    msgs = consume_avro(topic, 4, timeout=90)
    assert [m["value"]["after"]["id"] for m in msgs] == [1, 2, 3, 4]
    assert [m["value"]["after"].get("w") for m in msgs] == [None, 2, 3, 4]
    wait_for(lambda: sink_state(pg, name)[0] == "running", what="running again")


def test_without_auto_register_an_unregistered_schema_stops_the_sink(pg, sinks, unique):
    t, topic = f"noreg_{unique}", f"noreg-{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s, %s::jsonb)", (t, json.dumps({"schema_evolution": {"auto_register": False}})))
    name = sinks.add(f"noreg_{unique}", topic, format="avro", schema_registry=URL, tables=[t])
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    state = wait_for(lambda: (s := sink_state(pg, name))[0] == "error" and s, what="error")
    assert "auto_register" in state[1] and "not registered" in state[1], state


def test_snapshot_rows_and_a_truncate_are_avro_events_too(pg, sinks, unique):
    t, topic = f"snap_{unique}", f"snap-{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, amount numeric(8,3))")
    pg.execute(f"INSERT INTO {t} SELECT g, g / 8.0 FROM generate_series(1, 3) g")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(f"snap_{unique}", topic, format="avro", schema_registry=URL, tables=[t])
    reads = consume_avro(topic, 3)
    assert sorted((m["value"]["metadata"]["operation"], m["value"]["after"]["id"], m["value"]["after"]["amount"])
                  for m in reads) == [("READ", 1, Decimal("0.125")), ("READ", 2, Decimal("0.250")), ("READ", 3, Decimal("0.375"))]
    pg.execute(f"TRUNCATE {t}")
    msgs = consume_avro(topic, 4)
    trunc = msgs[-1]
    assert trunc["key"] is None and trunc["value"]["metadata"]["operation"] == "TRUNCATE"
    assert trunc["value"]["metadata"]["truncate"] == {"cascade": False, "restart_identity": False}
    assert trunc["value"]["before"] is None and trunc["value"]["after"] is None
