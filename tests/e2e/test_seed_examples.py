"""The product description's five examples run from examples/seed/ with psql, as a user would run them,
against the peers `make up` starts; what arrived is read back with each destination's own client
(a Kafka consumer, boto3, Google's Pub/Sub client, a SASL_SSL Kafka consumer for Event Hubs), never
from pg_cdc's own state. Each example is cleaned up before and after (sinks, schema, topics, streams),
so a rerun passes."""
import json
import os
import subprocess

import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1

from conftest import connect, consume, delete_topics, drop_schema, read_messages, server_settings, wait_for
from test_eventhub_sink import sasl_client
from test_kinesis_sink import kinesis, read_stream
from test_pubsub_sink import Reader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGISTRY = os.environ.get("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081")

# What each example makes: its sinks, Kafka topics (on the plain listener; Event Hubs' is the same
# broker), Kinesis streams and Pub/Sub (project, topic, subscription).
MADE = {
    1: {"sinks": ["kafka_fulfillment", "kafka_analytics", "kinesis_fraud"],
        "topics": ["orders.fulfillment", "orders.analytics"], "streams": ["orders-fraud-detection"]},
    2: {"sinks": ["kafka_compliance", "kinesis_fraud_ml"], "topics": ["transactions.audit"],
        "streams": ["transactions-fraud-ml"]},
    3: {"sinks": [], "topics": []},
    4: {"sinks": ["kafka_iot_alerts"], "topics": ["iot.critical-readings"]},
    5: {"sinks": ["aws_kinesis", "azure_eventhub", "gcp_pubsub"], "topics": ["customers-europe"],
        "streams": ["customers-americas"], "pubsub": ("helios-analytics", "customers-asia", "customers-asia-reader")},
}


def file_of(n):
    (name,) = [f for f in os.listdir(os.path.join(ROOT, "examples", "seed")) if f.startswith(f"{n}_")]
    return os.path.join("examples", "seed", name)


def clean(n):
    made = MADE[n]
    with connect() as c:
        for s in made["sinks"]:
            c.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (s, s))
        drop_schema(c, f"seed_example_{n}")
    delete_topics(made["topics"], wait=True)
    k = kinesis()
    for s in made.get("streams", []):
        try:
            k.delete_stream(StreamName=s, EnforceConsumerDeletion=True)
            wait_for(lambda s=s: s not in k.list_streams()["StreamNames"], what=f"stream {s} deleted")
        except k.exceptions.ResourceNotFoundException:
            pass
    if "pubsub" in made:
        project, topic, sub = made["pubsub"]
        pub, subs = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
        for drop in (lambda: subs.delete_subscription(subscription=subs.subscription_path(project, sub)),
                     lambda: pub.delete_topic(topic=pub.topic_path(project, topic))):
            try:
                drop()
            except gexc.NotFound:
                pass


@pytest.fixture
def example(request):
    """Runs examples/seed/<n>_*.sql with psql (cdc.schema_registry set to the local registry for the
    run) and returns its output; cleans up what the example made, before and after."""
    ran = []

    def run(n):
        ran.append(n)
        clean(n)
        out = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-f", file_of(n)], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"example {n}: {out.stderr}"
        return out.stdout + out.stderr

    with server_settings({"cdc.schema_registry": REGISTRY}):
        yield run
    for n in ran:
        clean(n)


def test_example_1_order_pipeline(example):
    out = example(1)
    assert "source_metrics" in out, "cdc_metrics('orders') answered"
    analytics = [m["value"] for m in consume("orders.analytics", 2)]
    assert [e["metadata"]["operation"] for e in analytics] == ["INSERT", "UPDATE"]
    assert analytics[1]["diff"] == {"status": {"from": "pending", "to": "confirmed"}}
    assert analytics[1]["before"]["status"] == "pending" and analytics[1]["after"]["customer_region"] == "us-east"
    assert analytics[1]["metadata"]["transaction"]["event_count"] == 1
    fulfillment = read_messages("orders.fulfillment", 2)
    assert all(m.value()[0] == 0 for m in fulfillment), "Avro in the registry's wire format (magic byte 0)"
    records = wait_for(lambda: len(r := read_stream("orders-fraud-detection")) >= 2 and r, what="kinesis records")
    assert [r["event"]["metadata"]["operation"] for r in records] == ["INSERT", "UPDATE"]
    assert {r["pk"] for r in records} == {'{"customer_region":"us-east"}'}, "partition_key customer_region"


def test_example_2_financial_audit(example):
    out = example(2)
    assert '"delivery_mode": "exactly_once"' in out, "cdc_delivery_status('kafka_compliance') answered"
    (audit,) = read_messages("transactions.audit", 1)
    assert audit.value()[0] == 0, "Avro in the registry's wire format"
    assert b"123-45-6789" not in audit.value() and b"1234567890" not in audit.value(), "PII tokenized"
    (record,) = wait_for(lambda: (r := read_stream("transactions-fraud-ml")) and r, what="kinesis record")
    assert record["pk"] == '{"account_id":"ACC-1"}', "partition_key account_id"
    after = record["event"]["after"]
    assert after["account_number"].startswith("tok_") and after["ssn"].startswith("tok_")
    assert b"123-45-6789" not in record["raw"]
    assert set(record["event"]["compliance"]["pii_tokenized"]) == {"ssn", "account_number"}
    assert "teller_system" in json.dumps(record["event"]["metadata"]), "user context"


def test_example_3_schema_evolution(example, pg):
    out = example(3)
    assert "required_field" in out and "WARNING" in out, out
    assert "FAILED" in out
    history = pg.execute("SELECT cdc_schema_history('seed_example_3.orders')").fetchone()[0]
    versions = history["schema_versions"]
    assert [v["version"] for v in versions] == [1, 2, 3]
    assert versions[1]["fields"] == ["order_id", "customer_id", "total", "status", "shipping_method"]
    check = pg.execute("SELECT cdc_check_compatibility('seed_example_3.orders', "
                       "'ADD COLUMN priority VARCHAR(10) NOT NULL')").fetchone()[0]
    assert check["compatibility_check"] == "FAILED"


def test_example_4_filtered_iot(example):
    example(4)
    msgs = consume("iot.critical-readings", 2)
    got = {m["value"]["after"]["reading_id"]: m for m in msgs}
    assert set(got) == {"READ-847293", "READ-847295"}, "the filter keeps the reading over its threshold and the critical one"
    a = got["READ-847293"]["value"]["after"]
    assert (a["location"], a["sensor_type"], a["owner"]) == ("Building A, Floor 3", "temperature", "Facilities Team")
    assert a["deviation_pct"] == 19.375 and "internal_calibration" not in a
    assert got["READ-847293"]["key"] == {"sensor_type": "temperature"}


def test_example_5_multicloud_in_the_seed_order(example, pg):
    out = example(5)
    assert "do not exist yet" in out, "the routing names sinks added after it"
    # Row 1 moves from the Americas to Asia while the sinks' snapshots run: a sink whose snapshot chunk
    # was read before the move gets its READ first; one read after gets only the change (the snapshot
    # leaves out rows changed since the sink's stream started). Either is right.
    want = {
        "aws_kinesis": [("READ", 3), ("UPDATE", 1)],
        "azure_eventhub": [("READ", 2), ("INSERT", 4), ("DELETE", 1)],
        "gcp_pubsub": [("READ", 2), ("READ", 3), ("INSERT", 4), ("INSERT", 1)],
    }
    maybe = {"aws_kinesis": ("READ", 1), "azure_eventhub": ("READ", 1)}

    def seen(events):
        return sorted((e["metadata"]["operation"], (e["after"] or e["before"])["customer_id"]) for e in events)

    def as_routed(sink, events):
        got = seen(events)
        if maybe.get(sink) in got:
            got.remove(maybe[sink])
        return got == sorted(want[sink])

    reader = Reader((pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()),
                    "projects/helios-analytics/subscriptions/customers-asia-reader")
    reads = {
        "aws_kinesis": lambda: [r["event"] for r in read_stream("customers-americas")],
        "azure_eventhub": lambda: [m["value"] for m in consume("customers-europe", 3, extra=sasl_client())],
        "gcp_pubsub": lambda: [m["event"] for m in reader.pull()],
    }
    for sink, read in reads.items():
        wait_for(lambda sink=sink, read=read: as_routed(sink, read()), timeout=60, what=f"{sink}'s routed events")
    # Every sink of every route is there and healthy (no route waits for a sink any more). The routes'
    # counts may differ by the optional READ, so the sync status is not asked for.
    def statuses():
        (d,) = pg.execute("SELECT * FROM cdc_multicloud_status('seed_example_5.global_customers')").fetchone()
        return {(r, s): v["status"] for r, x in d["regional_distribution"].items() for s, v in x["sinks"].items()}

    wait_for(lambda: set(statuses().values()) == {"healthy"}, what="every routed sink healthy")
    assert len(statuses()) == 6
