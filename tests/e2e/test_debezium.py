"""format: debezium through the real Kafka, read as a Kafka Connect sink over a Debezium topic reads
it: Kafka Connect's own JsonConverter (schemas checked) and Debezium's ExtractNewRecordState, run
by the Java harness in bench/debezium (class ConnectRead, built with Maven once). The field-by-field
comparison with Debezium's own output is in the unit tests (crates/cdc-sinks/src/format/
debezium_tests.rs); here: what reaches Kafka, tombstones included, and that Connect reads it."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import create_topic, read_messages, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def connect_classpath():
    """The harness's classpath (built into the cache once; a rebuild only when its sources change)."""
    import os

    sys.path.insert(0, str(REPO / "bench"))
    from e2e_bench import Debezium

    harness = Debezium(SimpleNamespace(env=SimpleNamespace(cache=Path(os.environ["PG_CDC_CACHE"]))))
    harness.build()
    return harness.classpath


def records(topic, count):
    """Every record of a one-partition topic in order: (key, value) parsed, a tombstone's value None."""
    msgs = read_messages(topic, count)
    msgs.sort(key=lambda m: m.offset())
    return [(json.loads(m.key()) if m.key() else None, json.loads(m.value()) if m.value() is not None else None)
            for m in msgs]


def connect_read(classpath, recs):
    """What a Kafka Connect sink with the unwrap transform receives: one (key, row) per record kept."""
    lines = "".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in recs)
    out = subprocess.run(["java", "-cp", classpath, "io.pgcdc.bench.ConnectRead", "t"], input=lines, text=True,
                         capture_output=True, timeout=120, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    errors = [r for r in rows if "error" in r]
    assert not errors, errors
    return [(r["key"], r["value"]) for r in rows]


def test_debezium_records_are_read_by_kafka_connect(pg, sinks, unique, connect_classpath):
    """Snapshot row, insert, update, delete (with its tombstone) and TRUNCATE of a table with
    decimals, timestamps, arrays and json reach Kafka in Debezium's envelope with schemas; Kafka
    Connect's JsonConverter accepts every key and value against its schema, and the unwrap
    transform gives the rows' states with the exact decimals."""
    t, topic = f"dbz_{unique}", f"dbz-{unique}"
    create_topic(topic)
    pg.execute(f"""CREATE TABLE {t} (id int PRIMARY KEY, total numeric(10,2) NOT NULL, note text,
                   at timestamptz, tags text[], doc jsonb)""")
    pg.execute(f"""INSERT INTO {t} VALUES (1, 1.00, 'gone', NULL, NULL, NULL),
                   (3, 150.00, 'old', '2024-03-15 14:23:45.5+00', '{{a,b}}', '{{"k": 1}}')""")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(f"dbz_{unique}", topic, tables=[t], format="debezium", debezium={"topic_prefix": "shop"})
    # The snapshot first (a row changed, or truncated, before its chunk is delivered is left to its
    # changes: the latest state wins).
    wait_for(lambda: pg.execute("SELECT state FROM cdc_snapshots WHERE sink_name = %s", (f"dbz_{unique}",))
             .fetchone() == ("done",), what="the initial snapshot")
    pg.execute(f"INSERT INTO {t} VALUES (2, 10.50, 'new', NULL, NULL, NULL)")
    pg.execute(f"UPDATE {t} SET total = 0.01, note = 'changed' WHERE id = 2")
    pg.execute(f"DELETE FROM {t} WHERE id = 1")
    pg.execute(f"TRUNCATE {t}")
    recs = records(topic, 7)
    assert [v["payload"]["op"] if v else None for _, v in recs] == ["r", "r", "c", "u", "d", None, "t"], recs
    snapshot, changes = recs[:2], recs[2:]
    assert [v["payload"]["source"]["snapshot"] for _, v in snapshot] == ["true", "true"]
    key, value = changes[0]
    assert key == {"schema": {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}],
                              "optional": False, "name": f"shop.public.{t}.Key"}, "payload": {"id": 2}}
    assert value["schema"]["name"] == f"shop.public.{t}.Envelope"
    source = value["payload"]["source"]
    assert (source["connector"], source["name"], source["db"], source["schema"], source["table"], source["snapshot"]) \
        == ("postgresql", "shop", "postgres", "public", t, "false")
    version = pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc'").fetchone()[0]
    assert source["version"] == f"pg_cdc-{version}"
    after = {f["field"]: f for f in value["schema"]["fields"][1]["fields"]}
    assert after["total"]["optional"] is False and after["note"]["optional"] is True, "NOT NULL from the history"
    assert changes[3] == (changes[2][0], None), "a tombstone with the deleted row's key follows the delete"
    assert changes[4][0] is None, "a truncate has no key"

    rows = connect_read(connect_classpath, snapshot + changes[:4])
    assert rows == [
        ({"id": 1}, {"id": 1, "total": 1.00, "note": "gone", "at": None, "tags": None, "doc": None}),
        ({"id": 3}, {"id": 3, "total": 150.00, "note": "old", "at": "2024-03-15T14:23:45.500000Z",
                     "tags": ["a", "b"], "doc": "{\"k\": 1}"}),
        ({"id": 2}, {"id": 2, "total": 10.50, "note": "new", "at": None, "tags": None, "doc": None}),
        ({"id": 2}, {"id": 2, "total": 0.01, "note": "changed", "at": None, "tags": None, "doc": None}),
        ({"id": 1}, None),
    ], rows


def test_debezium_without_schemas_in_string_mode_without_tombstones(pg, sinks, unique):
    """`schemas: false` writes the payloads alone, `decimal_handling_mode: string` the exact text,
    `tombstones_on_delete: false` no tombstone; the LSN in source lets cdc_schema_history place a
    consumer group on a Debezium topic too."""
    t, topic = f"dbzs_{unique}", f"dbzs-{unique}"
    create_topic(topic)
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, amount numeric, price numeric(6,2))")
    pg.execute("SELECT cdc_enable(%s, '{\"operations\": [\"INSERT\", \"UPDATE\", \"DELETE\"]}')", (t,))
    sinks.add(f"dbzs_{unique}", topic, tables=[t], format="debezium", snapshot_mode="never",
              debezium={"schemas": False, "decimal_handling_mode": "string", "tombstones_on_delete": False})
    pg.execute(f"INSERT INTO {t} VALUES (1, 'NaN', 1.50), (2, -123.4500, 9999.99)")
    pg.execute(f"DELETE FROM {t} WHERE id = 1")
    pg.execute(f"TRUNCATE {t}")
    recs = records(topic, 3)
    assert [k for k, _ in recs] == [{"id": 1}, {"id": 2}, {"id": 1}]
    assert [v["op"] for _, v in recs] == ["c", "c", "d"]
    assert (recs[0][1]["after"], recs[1][1]["after"]) == (
        {"id": 1, "amount": "NAN", "price": "1.50"}, {"id": 2, "amount": "-123.4500", "price": "9999.99"})
    assert recs[2][1]["before"] == {"id": 1, "amount": None, "price": None}
    assert isinstance(recs[2][1]["source"]["lsn"], int)


def test_debezium_format_is_refused_where_it_does_not_fit(pg):
    """Only Kafka sinks take the Debezium format; its settings need it and are checked."""
    import psycopg

    cases = [
        ("table", {"table": "x_events", "format": "debezium"}, "0A000"),
        ("kafka", {"topic": "x", "debezium": {"schemas": False}}, "22023"),
        ("kafka", {"topic": "x", "format": "debezium", "debezium": {"decimal_handling_mode": "exact"}}, "22023"),
        ("kafka", {"topic": "x", "format": "debezium", "debezium": {"topic_prefix": "a b"}}, "22023"),
        ("kafka", {"topic": "x", "format": "debezium", "debezium": {"tombstones": True}}, "22023"),
        ("kafka", {"topic": "x", "format": "debezium", "debezium": {"converter": "xml"}}, "22023"),
        ("kafka", {"topic": "x", "format": "debezium", "debezium": {"converter": "avro", "schemas": True}}, "22023"),
        ("kafka", {"topic": "x", "format": "debezium", "schema_registry": "http://r:8081"}, "22023"),
    ]
    for sink_type, cfg, state in cases:
        with pytest.raises(psycopg.Error) as e:
            pg.execute("SELECT cdc_add_sink('dbz_refused', %s, %s::jsonb)", (sink_type, json.dumps(cfg)))
        assert e.value.sqlstate == state, (cfg, e.value)


def test_debezium_over_avro_is_read_by_confluents_avro_deserializer(pg, sinks, unique):
    """`converter: avro`: Debezium's key and envelope as Kafka Connect's Avro converter writes them,
    registered with the registry (the STAND-IN of tests/schema_registry) under the topic's subjects;
    confluent-kafka's own AvroDeserializer reads every record back, and each says what the same
    change says through the JSON converter, the decimals exact."""
    import base64
    from decimal import Decimal

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from test_avro import URL

    subprocess.run([str(REPO / "scripts" / "schema-registry.sh"), "start"], check=True, capture_output=True)
    t, topic, json_topic = f"dbza_{unique}", f"dbza-{unique}", f"dbzj-{unique}"
    create_topic(topic)
    create_topic(json_topic)
    pg.execute(f"""CREATE TABLE {t} (id int PRIMARY KEY, total numeric(10,2) NOT NULL, qty smallint,
                   note text, at timestamptz, tags text[])""")
    pg.execute("SELECT cdc_enable(%s, '{\"operations\": [\"INSERT\", \"UPDATE\", \"DELETE\"]}')", (t,))
    sinks.add(f"dbza_{unique}", topic, tables=[t], format="debezium", snapshot_mode="never",
              schema_registry=URL, debezium={"topic_prefix": "shop", "converter": "avro"})
    sinks.add(f"dbzj_{unique}", json_topic, tables=[t], format="debezium", snapshot_mode="never",
              debezium={"topic_prefix": "shop", "schemas": False})
    pg.execute(f"INSERT INTO {t} VALUES (1, 10.50, 3, 'new', '2024-03-15 14:23:45.5+00', '{{a,NULL}}')")
    pg.execute(f"UPDATE {t} SET total = -0.01, note = NULL WHERE id = 1")
    pg.execute(f"DELETE FROM {t} WHERE id = 1")
    msgs = read_messages(topic, 4)
    msgs.sort(key=lambda m: m.offset())
    client = SchemaRegistryClient({"url": URL})
    values, keys = AvroDeserializer(client), AvroDeserializer(client)
    got = []
    for m in msgs:
        assert m.key()[0] == 0 and (m.value() is None or m.value()[0] == 0), "Confluent's magic byte"
        key = keys(m.key(), SerializationContext(topic, MessageField.KEY))
        value = values(m.value(), SerializationContext(topic, MessageField.VALUE)) if m.value() is not None else None
        got.append((key, value))
    assert [v["op"] if v else None for _, v in got] == ["c", "u", "d", None], "a tombstone after the delete"
    assert all(k == {"id": 1} for k, _ in got)
    # The topic carries no {table}: record-name subjects, as the Avro format uses for such a topic.
    value_subject, key_subject = f"{topic}-shop.public.{t}.Envelope", f"{topic}-shop.public.{t}.Key"
    assert {value_subject, key_subject} <= set(client.get_subjects())
    schema = json.loads(client.get_latest_version(value_subject).schema.schema_str)
    assert (schema["name"], schema["namespace"], schema["connect.name"]) == ("Envelope", f"shop.public.{t}",
                                                                               f"shop.public.{t}.Envelope")
    # The same changes through the JSON converter, decimals decoded from their unscaled bytes.
    expected = [v for _, v in records(json_topic, 4) if v is not None]

    def exact(row):
        if row is None:
            return None
        unscaled = int.from_bytes(base64.b64decode(row["total"]), "big", signed=True)
        return {**row, "total": Decimal(unscaled).scaleb(-2)}

    for (_, a), j in zip(got, expected):
        assert a["before"] == exact(j["before"]) and a["after"] == exact(j["after"]), (a, j)
        for f in ("connector", "name", "db", "schema", "table", "snapshot", "txId", "lsn"):
            assert a["source"][f] == j["source"][f], f
    assert got[0][1]["after"]["total"] == Decimal("10.50") and got[1][1]["after"]["total"] == Decimal("-0.01")
    assert got[0][1]["after"]["tags"] == ["a", None] and got[0][1]["after"]["qty"] == 3
    # The history records the id the registry gave the version's schema.
    history = wait_for(lambda: (h := pg.execute("SELECT cdc_schema_history(%s)", (t,)).fetchone()[0])
                       ["schema_versions"][0].get("registered") and h, what="the registration recorded")
    value_id = int.from_bytes(msgs[0].value()[1:5], "big")
    assert history["schema_versions"][0]["registered"] == [{"registry": URL, "subject": value_subject,
                                                            "schema_id": value_id}]
    # A consumer group that read the first record: the history reads that record's LSN with its
    # writer schema from the registry, and places the group on version 1.
    from confluent_kafka import Consumer, TopicPartition

    from conftest import BOOTSTRAP
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"dbza_reader_{unique}", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, msgs[0].offset() + 1)], asynchronous=False)
    c.close()
    reader = pg.execute("SELECT cdc_schema_history(%s)", (t,)).fetchone()[0]["consumers"][f"dbza_reader_{unique}"]
    assert reader["using_version"] == 1 and not reader["caught_up"] and "unknown_partitions" not in reader, reader
