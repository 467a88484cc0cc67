"""The schema registry STAND-IN (tests/schema_registry/standin.py, started by
scripts/schema-registry.sh) counts only if confluent-kafka's own SchemaRegistryClient, AvroSerializer
and AvroDeserializer work against it unchanged. These tests use nothing but those, and the oracle is
the records the test serialized: what comes back out must be them, field by field.

It also keeps what a real registry keeps across a restart (ids are global and never reused), and
answers errors the way the client understands them (SchemaRegistryError with Confluent's codes)."""
import json
import os
import subprocess
import uuid

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "schema-registry.sh")
URL = os.environ.get("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081")

V1 = {"type": "record", "name": "orders", "namespace": "pg_cdc.test",
      "fields": [{"name": "order_id", "type": "string"},
                 {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
                 {"name": "status", "type": ["null", "string"], "default": None}]}
# Version 2: a field added with a default (backward compatible).
V2 = {**V1, "fields": V1["fields"] + [{"name": "shipping_method", "type": "string", "default": "standard"}]}


@pytest.fixture(scope="module")
def registry():
    subprocess.run([SCRIPT, "start"], check=True, capture_output=True)
    return SchemaRegistryClient({"url": URL})


@pytest.fixture
def topic():
    return f"standin-{uuid.uuid4().hex[:10]}"


def test_serializer_and_deserializer_round_trip_through_the_stand_in(registry, topic):
    from decimal import Decimal
    ctx = SerializationContext(topic, MessageField.VALUE)
    ser = AvroSerializer(registry, json.dumps(V1))
    record = {"order_id": "ORD-1", "total": Decimal("150.00"), "status": "pending"}
    data = ser(record, ctx)
    # Confluent's wire format: magic byte 0, then the schema id, big-endian.
    assert data[0] == 0
    schema_id = int.from_bytes(data[1:5], "big")
    assert registry.get_schema(schema_id).schema_str and json.loads(registry.get_schema(schema_id).schema_str) == V1
    # A consumer that knows no schema fetches it by the id.
    assert AvroDeserializer(SchemaRegistryClient({"url": URL}))(data, ctx) == record
    subject = f"{topic}-value"
    assert subject in registry.get_subjects()
    assert registry.get_versions(subject) == [1]
    latest = registry.get_latest_version(subject)
    assert (latest.schema_id, latest.version, latest.subject) == (schema_id, 1, subject)
    assert registry.lookup_schema(subject, Schema(json.dumps(V1), "AVRO")).schema_id == schema_id
    # Registering the same schema again (other whitespace) gives the same id and no new version.
    assert registry.register_schema(subject, Schema(json.dumps(V1, indent=2), "AVRO")) == schema_id
    assert SchemaRegistryClient({"url": URL}).get_versions(subject) == [1]


def test_a_consumer_holding_v1_reads_v2_events_and_v2_reads_v1(registry, topic):
    from decimal import Decimal
    ctx = SerializationContext(topic, MessageField.VALUE)
    subject = f"{topic}-value"
    registry.set_compatibility(subject, "BACKWARD")
    assert registry.get_compatibility(subject) == "BACKWARD"
    old = AvroSerializer(registry, json.dumps(V1))({"order_id": "A", "total": Decimal("1.00"), "status": None}, ctx)
    new = AvroSerializer(registry, json.dumps(V2))(
        {"order_id": "B", "total": Decimal("2.50"), "status": "open", "shipping_method": "air"}, ctx)
    assert registry.get_versions(subject) == [1, 2]
    assert int.from_bytes(new[1:5], "big") != int.from_bytes(old[1:5], "big")
    # A consumer that holds v1 (its reader schema) reads v2 events: the new field is dropped.
    v1_reader = AvroDeserializer(SchemaRegistryClient({"url": URL}), json.dumps(V1))
    assert v1_reader(new, ctx) == {"order_id": "B", "total": Decimal("2.50"), "status": "open"}
    # A consumer on v2 reads v1 events: the new field takes its default.
    v2_reader = AvroDeserializer(SchemaRegistryClient({"url": URL}), json.dumps(V2))
    assert v2_reader(old, ctx) == {"order_id": "A", "total": Decimal("1.00"), "status": None,
                                   "shipping_method": "standard"}


def test_errors_are_confluent_errors(registry, topic):
    with pytest.raises(SchemaRegistryError) as e:
        registry.get_latest_version(f"{topic}-nothing")
    assert (e.value.http_status_code, e.value.error_code) == (404, 40401)
    with pytest.raises(SchemaRegistryError) as e:
        registry.get_schema(10_000_000)
    assert (e.value.http_status_code, e.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as e:
        registry.register_schema(f"{topic}-value", Schema("{not json", "AVRO"))
    assert e.value.http_status_code == 422
    with pytest.raises(SchemaRegistryError) as e:
        registry.set_compatibility(f"{topic}-value", "SIDEWAYS")
    assert e.value.http_status_code == 422


def test_ids_survive_a_restart_and_deleted_subjects_go(registry, topic):
    subject = f"{topic}-value"
    sid = registry.register_schema(subject, Schema(json.dumps(V1), "AVRO"))
    registry.set_compatibility(subject, "FULL")
    subprocess.run([SCRIPT, "stop"], check=True, capture_output=True)
    subprocess.run([SCRIPT, "start"], check=True, capture_output=True)
    fresh = SchemaRegistryClient({"url": URL})
    assert json.loads(fresh.get_schema(sid).schema_str) == V1
    assert fresh.get_compatibility(subject) == "FULL"
    # A new schema gets a new id, above every id given before the restart.
    other = fresh.register_schema(f"{topic}-key", Schema(json.dumps({"type": "string"}), "AVRO"))
    assert other > sid
    assert fresh.delete_subject(subject) == [1]
    assert subject not in fresh.get_subjects()
