"""Seed example 5: one table routed by region to Kinesis, Event Hubs and Pub/Sub at once
(cdc_enable_multicloud), each peer the real one the project's scripts start, read back with its own
independent client (boto3, a SASL_SSL Kafka consumer, Google's Pub/Sub client).

The oracle is this file's own model of the workload: which row was in which region when, so which
changes each cloud must get (a row that moves reaches its old route's sinks as a DELETE and its new
route's as an INSERT; a sink in both gets the UPDATE), and how many changes each route saw. Nothing of
the worker's state. The negative control runs the same oracle with two routes swapped: it must fail."""
import collections
import json

import pytest

from conftest import consume, typed_sinks, wait_for
from test_eventhub_sink import CA, SASL, connection_string, sasl_client
from test_kinesis_sink import drop_streams, fresh_stream, read_stream  # noqa: F401 (drop_streams: autouse)
from test_pubsub_sink import Reader, clients, fresh_topic  # noqa: F401 (clients: a fixture)
from conftest import secret_in_data_dir  # noqa: E402

ROUTES = {
    "americas": ["aws_kinesis", "azure_eventhub"],
    "europe": ["azure_eventhub", "gcp_pubsub"],
    "asia": ["gcp_pubsub", "aws_kinesis"],
}


def expected(changes, routes):
    """Per sink, the (operation, id, region) it must get, per id in order; per route, the changes it saw
    (a move counts for both routes)."""
    per_sink = collections.defaultdict(lambda: collections.defaultdict(list))
    per_route = collections.Counter()
    for op, rid, old, new in changes:
        in_old = {s for s in routes.get(old, [])} if old else set()
        in_new = {s for s in routes.get(new, [])} if new else set()
        for r in {old, new} & set(routes):
            per_route[r] += 1
        for s in in_old | in_new:
            if op in ("INSERT", "READ"):
                per_sink[s][rid].append((op, new))
            elif op == "DELETE":
                per_sink[s][rid].append(("DELETE", old))
            elif s in in_old and s in in_new:
                per_sink[s][rid].append(("UPDATE", new))
            elif s in in_old:
                per_sink[s][rid].append(("DELETE", old))
            else:
                per_sink[s][rid].append(("INSERT", new))
    return {s: dict(v) for s, v in per_sink.items()}, per_route


def received(events):
    """(operation, id, region) per id, in arrival order (each cloud keeps per-key order)."""
    out = collections.defaultdict(list)
    for e in events:
        image = e["after"] or e["before"]
        out[image["id"]].append((e["metadata"]["operation"], image["customer_region"]))
    return dict(out)


@pytest.fixture
def three_clouds(pg, unique):
    with secret_in_data_dir(pg, "e2e_multicloud_eh", connection_string().encode() + b"\n") as conn_file, \
            typed_sinks(pg, "kinesis") as k, typed_sinks(pg, "eventhub") as e, typed_sinks(pg, "pubsub") as p:
        yield k, e, p, conn_file


def test_seed_example_5_routes_each_region_to_its_clouds(pg, three_clouds, clients, unique):  # noqa: F811
    kinesis_sinks, eventhub_sinks, pubsub_sinks, conn_file = three_clouds
    table = f"global_customers_{unique}"
    pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text, customer_region text)")
    fresh_stream("customers-americas")
    hub = f"customers-europe-{unique}"
    subscription = fresh_topic(clients, "customers-asia")
    # The seed's order: the routing first, naming sinks that do not exist yet (a WARNING names them).
    warnings = []
    pg.add_notice_handler(lambda d: d.severity == "WARNING" and warnings.append(d.message_primary))
    pg.execute(f"""SELECT cdc_enable_multicloud(
    table_name => '{table}',
    config => '{{
        "regional_routing": {{
            "enabled": true,
            "routing_column": "customer_region",
            "routes": {{
                "americas": ["aws_kinesis", "azure_eventhub"],
                "europe": ["azure_eventhub", "gcp_pubsub"],
                "asia": ["gcp_pubsub", "aws_kinesis"]
            }}
        }}
    }}'::jsonb
)""")
    assert any("do not exist yet" in w and all(f'"{n}"' in w for n in ("aws_kinesis", "azure_eventhub", "gcp_pubsub"))
               for w in warnings), warnings
    (waiting,) = pg.execute("SELECT * FROM cdc_multicloud_status(%s)", (table,)).fetchone()
    assert {s: v["status"] for d in waiting["regional_distribution"].values() for s, v in d["sinks"].items()} == \
        dict.fromkeys(["aws_kinesis", "azure_eventhub", "gcp_pubsub"], "waiting_for_sink")
    # Rows written before the sinks exist reach them as their snapshot (READ), by route.
    regions = ["americas", "europe", "asia", "africa"]
    region, changes = {}, []
    for i in range(100, 108):
        r = regions[i % 4]
        pg.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (i, f"c{i}", r))
        region[i] = r
        changes.append(("READ", i, None, r))
    kinesis_sinks.add("aws_kinesis", '{"stream_name": "customers-americas", "region": "us-east-1"}')
    eventhub_sinks.add("azure_eventhub", {"namespace": "helios-cdc", "eventhub": hub, "bootstrap_servers": SASL,
                                          "connection_string_file": conn_file,
                                          "properties": {"ssl.ca.location": CA}})
    pubsub_sinks.add("gcp_pubsub", '{"project": "helios-analytics", "topic": "customers-asia"}')
    # The workload, and the oracle's record of it: (op, id, region before, region after).
    for i in range(24):
        r = regions[i % 4]
        pg.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (i, f"c{i}", r))
        region[i] = r
        changes.append(("INSERT", i, None, r))
    for i in range(0, 24, 3):
        new = regions[(regions.index(region[i]) + 1) % 4]
        pg.execute(f"UPDATE {table} SET customer_region = %s WHERE id = %s", (new, i))
        changes.append(("UPDATE", i, region[i], new))
        region[i] = new
    for i in range(1, 24, 5):
        pg.execute(f"UPDATE {table} SET name = name || '!' WHERE id = %s", (i,))
        changes.append(("UPDATE", i, region[i], region[i]))
    for i in range(2, 24, 7):
        pg.execute(f"DELETE FROM {table} WHERE id = %s", (i,))
        changes.append(("DELETE", i, region[i], None))
    want, route_counts = expected(changes, ROUTES)
    totals = {s: sum(len(v) for v in want[s].values()) for s in want}

    kin = wait_for(lambda: (r := read_stream("customers-americas")) and len(r) >= totals["aws_kinesis"] and r,
                   timeout=90, what="kinesis records")
    eh = consume(hub, totals["azure_eventhub"], timeout=90, extra=sasl_client())
    ps = Reader(clients, subscription).until(lambda got: len(got) >= totals["gcp_pubsub"], what="pub/sub messages")
    got = {
        "aws_kinesis": received(r["event"] for r in kin),
        "azure_eventhub": received(m["value"] for m in eh),
        "gcp_pubsub": received(m["event"] for m in ps),
    }
    for sink in ROUTES["americas"] + ["gcp_pubsub"]:
        assert got[sink] == want[sink], f"{sink} got what its routes do not say"
    # Negative control: the oracle with two routes swapped must not accept what arrived.
    swapped, _ = expected(changes, {**ROUTES, "americas": ROUTES["asia"], "asia": ROUTES["americas"]})
    assert any(got[s] != swapped.get(s, {}) for s in got), "the oracle cannot tell routes apart"

    # The status, figure by figure, against the oracle's counts.
    def status():
        docs = [r[0] for r in pg.execute("SELECT * FROM cdc_multicloud_status(%s)", (table,)).fetchall()]
        return docs[0] if docs and docs[0]["cross_cloud_consistency"]["sync_status"] == "synchronized" else None

    s = wait_for(status, timeout=60, what="synchronized")
    assert s["table"] == table and s["routing_column"] == "customer_region"
    for route, sinks in ROUTES.items():
        dist = s["regional_distribution"][route]
        assert dist["event_count"] == route_counts[route], route
        for sink in sinks:
            assert dist["sinks"][sink]["status"] == "healthy"
            assert dist["sinks"][sink]["event_count"] == route_counts[route]
            assert 0 <= dist["sinks"][sink]["lag_ms"] < 60_000
    assert s["cross_cloud_consistency"]["divergence_events"] == 0
    assert s["cross_cloud_consistency"]["max_lag_ms"] == max(
        v["lag_ms"] for d in s["regional_distribution"].values() for v in d["sinks"].values())
    pg.execute("SELECT cdc_disable(%s)", (table,))
    # Disabled, the table's route counts go with its capture config (regression: they stayed).
    left = pg.execute("SELECT count(*) FROM _cdc_route_offsets WHERE table_oid = %s::regclass", (table,)).fetchone()[0]
    assert left == 0, left
    pg.execute(f"DROP TABLE {table}")


def test_refusals_change_nothing(pg, unique):
    table = f"mc_refused_{unique}"
    pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, region text)")
    cases = [
        ({"regional_routing": {"routing_column": "regio", "routes": {"eu": ["x"]}}}, "42703", 'Did you mean "region"'),
        ({"regional_routing": {"routing_column": "region", "routes": {}}}, "22023", "at least one route"),
        ({"regional_routing": {"routing_column": "region", "routes": {"eu": ["x"]}, "default_route": "us"}}, "22023",
         "not one of the routes"),
        ({"routing": {}}, "22023", 'unknown key "routing"'),
        ({}, "22023", "config.regional_routing is required"),
    ]
    for config, state, text in cases:
        with pytest.raises(Exception) as e:
            with pg.transaction():
                pg.execute("SELECT cdc_enable_multicloud(%s, %s::jsonb)", (table, json.dumps(config)))
        assert e.value.sqlstate == state, (config, e.value)
        assert text in str(e.value) + str(getattr(e.value.diag, "message_hint", "")), (config, e.value)
    assert pg.execute("SELECT count(*) FROM _cdc_publications WHERE table_oid = %s::regclass", (table,)).fetchone()[0] == 0
    pg.execute(f"DROP TABLE {table}")


def test_a_route_waits_for_a_sink_added_later_and_a_dropped_one(pg, sinks, unique):
    """A route may name a sink that does not exist yet (WARNING): cdc_multicloud_status shows it as
    waiting_for_sink; once added it gets the route's rows (its snapshot) and changes, and no other
    route's; dropped, it waits again."""
    table, topic, sink = f"mc_wait_{unique}", f"mc-wait-{unique}", f"mc_wait_{unique}"
    pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, region text)")
    pg.execute(f"INSERT INTO {table} VALUES (1, 'eu'), (2, 'us')")
    warnings = []
    pg.add_notice_handler(lambda d: d.severity == "WARNING" and warnings.append(d.message_primary))
    pg.execute("SELECT cdc_enable_multicloud(%s, %s::jsonb)",
               (table, json.dumps({"regional_routing": {"routing_column": "region", "routes": {"eu": [sink]}}})))
    assert any(f'sink "{sink}" does not exist yet' in w for w in warnings), warnings

    def status():
        (doc,) = pg.execute("SELECT * FROM cdc_multicloud_status(%s)", (table,)).fetchone()
        return doc["regional_distribution"]["eu"]["sinks"][sink]["status"]

    assert status() == "waiting_for_sink"
    sinks.add(sink, topic, tables=[table])
    pg.execute(f"INSERT INTO {table} VALUES (3, 'eu'), (4, 'us')")
    got = consume(topic, 2)
    # Order between keys depends on where the snapshot's chunk lands in the stream: compared as a set.
    assert sorted((m["value"]["metadata"]["operation"], m["value"]["after"]["id"]) for m in got) == \
        [("INSERT", 3), ("READ", 1)], "the route's rows, as its snapshot, and its changes; nothing of us"
    wait_for(lambda: status() == "healthy", what="the sink healthy in its route")
    pg.execute("SELECT cdc_drop_sink(%s)", (sink,))
    assert status() == "waiting_for_sink"
    pg.execute("SELECT cdc_disable(%s)", (table,))
    pg.execute(f"DROP TABLE {table}")
