"""The protobuf format end to end: every event is parsed with the Python classes protoc generates
from the published contract (proto/pg_cdc/v1/event.proto, compiled here with grpcio-tools; none of
pg_cdc's code), and compared field by field with what the same change says through a JSON sink
(numbers as their exact text). With a schema registry (the STAND-IN of tests/schema_registry, see the
README), the records are in Confluent's wire format and read with confluent-kafka's own
ProtobufDeserializer."""
import base64
import datetime
import importlib
import json
import os
import subprocess
import sys

import pytest

from conftest import create_topic, read_messages

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, "..", "..", "proto")
REGISTRY_SCRIPT = os.path.join(HERE, "..", "..", "scripts", "schema-registry.sh")
URL = os.environ.get("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081")
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """The contract's generated Python module (protoc from grpcio-tools)."""
    out = tmp_path_factory.mktemp("pb")
    from grpc_tools import protoc

    rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--python_out={out}", "pg_cdc/v1/event.proto"])
    assert rc == 0, "protoc failed on the published contract"
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("pg_cdc.v1.event_pb2")
    finally:
        sys.path.remove(str(out))


def micros(iso):
    """An ISO timestamp of the JSON event as microseconds since 1970 (UTC when it has a zone)."""
    t = datetime.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    d = t - EPOCH
    return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds


def check(value, expected, path):
    """A Value of the contract against the JSON event's value (numbers as their raw text)."""
    kind = value.WhichOneof("kind")
    got = getattr(value, kind)
    if expected is None:
        assert kind == "null_value", (path, kind)
    elif kind == "bool_value":
        assert got is expected, path
    elif kind == "int_value":
        assert got == int(expected), (path, got, expected)
    elif kind == "double_value":
        assert repr(got) == repr(float(expected)) if expected not in ("NaN",) else got != got, (path, got, expected)
    elif kind == "decimal_value":
        assert got == expected, (path, got, expected)  # exact text on both sides
    elif kind in ("string_value", "uuid_value"):
        assert got == expected, (path, got, expected)
    elif kind == "bytes_value":
        assert got == base64.b64decode(expected), path
    elif kind == "json_value":
        assert json.loads(got, parse_float=str, parse_int=str) == expected, (path, got, expected)
    elif kind == "date_value":
        assert got == (datetime.date.fromisoformat(expected) - EPOCH.date()).days, (path, got, expected)
    elif kind in ("timestamp_value", "local_timestamp_value"):
        assert got == micros(expected), (path, got, expected)
    elif kind == "time_value":
        h, m, s = expected.split(":")
        assert got == round(((int(h) * 60 + int(m)) * 60 + float(s)) * 1e6), (path, got, expected)
    elif kind == "array_value":
        assert len(got.values) == len(expected), path
        for i, (v, e) in enumerate(zip(got.values, expected)):
            check(v, e, f"{path}[{i}]")
    else:
        raise AssertionError(f"{path}: unexpected kind {kind}")


def check_row(row, image, path):
    assert [c.name for c in row.columns] == list(image), path
    for c in row.columns:
        check(c.value, image[c.name], f"{path}.{c.name}")


def raw_numbers(text):
    """A JSON event with every number as its exact text."""
    return json.loads(text, parse_float=str, parse_int=str)


TABLE = """(id int PRIMARY KEY, amount numeric(12,4), price numeric, ratio float8, note text, flag bool,
           born date, at timestamptz, local timestamp, t time, doc jsonb, raw bytea, tags text[], u uuid, m money)"""
ROW_1 = """(1, 150.0000, 12345678901234567890.123456789, 0.1, 'multi
line "q"', true, '2024-02-29', '2024-03-15 14:23:45.123456+00', '1999-12-31 23:59:59.5', '14:23:45.25',
'{"a": [1, 2.50]}', '\\xdeadbeef', '{x,NULL,"y z"}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 12.34)"""


def test_protobuf_events_say_what_the_json_events_say(pg, sinks, unique, pb):
    """The same changes through a JSON sink and a protobuf sink: every event, parsed with protoc's
    classes, has the JSON event's metadata, images and values, each with the kind of its column."""
    t, jt, pt = f"pb_{unique}", f"pbj-{unique}", f"pbp-{unique}"
    create_topic(jt)
    create_topic(pt)
    pg.execute(f"CREATE TABLE {t} {TABLE}")
    pg.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
    pg.execute("SELECT cdc_enable(%s, '{\"include_before_image\": true}')", (t,))
    sinks.add(f"pbj_{unique}", jt, tables=[t], snapshot_mode="never")
    sinks.add(f"pbp_{unique}", pt, tables=[t], format="protobuf", snapshot_mode="never")
    pg.execute(f"INSERT INTO {t} VALUES {ROW_1}")
    pg.execute(f"INSERT INTO {t} (id, price, ratio) VALUES (2, 'NaN', 'Infinity')")
    pg.execute(f"UPDATE {t} SET note = 'changed', amount = -0.0001 WHERE id = 1")
    pg.execute(f"DELETE FROM {t} WHERE id = 2")
    pg.execute(f"TRUNCATE {t}")
    js = sorted(read_messages(jt, 5), key=lambda m: m.offset())
    ps = sorted(read_messages(pt, 5), key=lambda m: m.offset())
    ops = {pb.INSERT: "INSERT", pb.UPDATE: "UPDATE", pb.DELETE: "DELETE", pb.TRUNCATE: "TRUNCATE", pb.READ: "READ"}
    for j, p in zip(js, ps):
        want = raw_numbers(j.value())
        ev = pb.Event()
        ev.ParseFromString(p.value())
        m, wm = ev.metadata, want["metadata"]
        assert (m.source, m.database, m.schema, m.table, ops[m.operation]) == \
            (wm["source"], wm["database"], wm["schema"], wm["table"], wm["operation"])
        assert (m.lsn, m.commit_lsn, m.transaction_id) == (int(wm["lsn"]), int(wm["commit_lsn"]),
                                                           int(wm["transaction_id"]))
        assert m.timestamp_ms == micros(wm["timestamp"]) // 1000
        for image in ("before", "after"):
            if want.get(image) is None:
                assert not ev.HasField(image), image
            else:
                check_row(getattr(ev, image), want[image], f"{want['metadata']['operation']}.{image}")
        if m.operation == pb.TRUNCATE:
            assert m.HasField("truncate") and p.key() is None
        else:
            key = pb.Row()
            key.ParseFromString(p.key())
            check_row(key, raw_numbers(j.key()), "key")
    # The decimals kept their exact text, the money its text output.
    after = {c.name: c.value for c in pb.Event.FromString(ps[0].value()).after.columns}
    assert (after["amount"].decimal_value, after["price"].decimal_value, after["m"].decimal_value) == \
        ("150.0000", "12345678901234567890.123456789", "$12.34")


def test_protobuf_with_a_registry_is_read_by_confluents_deserializer(pg, sinks, unique, pb):
    """With a registry, pg_cdc registers the contract (schemaType PROTOBUF) under the topic's value and
    key subjects and frames each record as Confluent's serializer does; confluent-kafka's
    ProtobufDeserializer reads values as Event and keys as Row."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    subprocess.run([REGISTRY_SCRIPT, "start"], check=True, capture_output=True)
    t, topic = f"pbr_{unique}", f"pbr-{unique}"
    create_topic(topic)
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, amount numeric(10,2))")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(f"pbr_{unique}", topic, tables=[t], format="protobuf", schema_registry=URL, snapshot_mode="never")
    pg.execute(f"INSERT INTO {t} VALUES (1, 10.50), (2, 0.01)")
    pg.execute(f"DELETE FROM {t} WHERE id = 1")
    msgs = sorted(read_messages(topic, 3), key=lambda m: m.offset())
    values = ProtobufDeserializer(pb.Event, {"use.deprecated.format": False})
    keys = ProtobufDeserializer(pb.Row, {"use.deprecated.format": False})
    got = []
    for m in msgs:
        assert m.value()[0] == 0, "Confluent's magic byte"
        ev = values(m.value(), SerializationContext(topic, MessageField.VALUE))
        key = keys(m.key(), SerializationContext(topic, MessageField.KEY))
        image = ev.after if ev.HasField("after") else ev.before
        got.append((ev.metadata.operation, key.columns[0].value.int_value,
                    {c.name: c.value.WhichOneof("kind") for c in image.columns},
                    [c.value.decimal_value for c in image.columns if c.name == "amount"]))
    assert got == [
        (pb.INSERT, 1, {"id": "int_value", "amount": "decimal_value"}, ["10.50"]),
        (pb.INSERT, 2, {"id": "int_value", "amount": "decimal_value"}, ["0.01"]),
        (pb.DELETE, 1, {"id": "int_value"}, []),  # the old key only (REPLICA IDENTITY DEFAULT)
    ], got
    client = SchemaRegistryClient({"url": URL})
    for subject in (f"{topic}-value", f"{topic}-key"):
        latest = client.get_latest_version(subject)
        assert latest.schema.schema_type == "PROTOBUF"
        assert "message Event" in latest.schema.schema_str
    value_id = int.from_bytes(msgs[0].value()[1:5], "big")
    assert client.get_latest_version(f"{topic}-value").schema_id == value_id
