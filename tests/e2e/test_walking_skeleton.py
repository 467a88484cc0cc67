"""A table's changes reach a real Kafka topic in the documented event shape."""
import json

from conftest import consume, sink_state, wait_for

SEED_CONFIG = {
    "include_columns": ["order_id", "customer_id", "total", "status", "updated_at"],
    "key_columns": ["order_id"],
    "include_before_image": True,
    "include_transaction_info": True,
}


def test_insert_update_delete_field_by_field(pg, sinks, unique):
    table, topic = f"orders_{unique}", f"orders-cdc-{unique}"
    pg.execute(f"""CREATE TABLE {table} (order_id text PRIMARY KEY, customer_id text, total numeric(10,2),
                   status text, updated_at timestamptz, internal_notes text)""")
    pg.execute("SELECT cdc_enable(table_name => %s, config => %s::jsonb)", (table, json.dumps(SEED_CONFIG)))
    assert pg.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (table,)).fetchone()[0] == "f"
    sinks.add(f"kafka_{unique}", topic)
    pg.execute(f"INSERT INTO {table} VALUES ('ORD-12345', 'CUST-789', 150.00, 'pending', '2024-03-15 14:23:45.123+00', 'secret')")
    pg.execute(f"UPDATE {table} SET status = 'confirmed' WHERE order_id = 'ORD-12345'")
    pg.execute(f"DELETE FROM {table} WHERE order_id = 'ORD-12345'")
    commits = pg.execute("SELECT now()").fetchone()[0]

    msgs = consume(topic, 3)
    assert len(msgs) == 3, [m["value"] for m in msgs]
    ins, upd, dele = (m["value"] for m in msgs)
    assert all(m["key"] == {"order_id": "ORD-12345"} for m in msgs)
    assert len({m["partition"] for m in msgs}) == 1, "same key, same partition"

    for ev, op in ((ins, "INSERT"), (upd, "UPDATE"), (dele, "DELETE")):
        md = ev["metadata"]
        assert md["source"] == "pg_cdc"
        assert md["database"] == "postgres"
        assert md["schema"] == "public"
        assert md["table"] == table
        assert md["operation"] == op
        assert isinstance(md["lsn"], int) and isinstance(md["commit_lsn"], int) and md["lsn"] <= md["commit_lsn"]
        assert isinstance(md["transaction_id"], int)
        assert md["timestamp"].endswith("Z") and md["timestamp"][:4] == str(commits.year)
        assert md["transaction"] == {"id": md["transaction_id"], "commit_lsn": md["commit_lsn"], "event_index": 1, "event_count": 1}
    assert ins["metadata"]["commit_lsn"] < upd["metadata"]["commit_lsn"] < dele["metadata"]["commit_lsn"]

    row = {"order_id": "ORD-12345", "customer_id": "CUST-789", "total": 150.00, "status": "pending",
           "updated_at": "2024-03-15T14:23:45.123Z"}
    assert ins["before"] is None
    assert ins["after"] == row
    assert b'"total":150.00' in msgs[0]["raw"], "numeric keeps its exact text"
    assert b"internal_notes" not in msgs[0]["raw"] and b"secret" not in msgs[0]["raw"]

    assert upd["before"] == row
    assert upd["after"] == {**row, "status": "confirmed"}
    assert upd["diff"] == {"status": {"from": "pending", "to": "confirmed"}}

    assert dele["before"] == {**row, "status": "confirmed"}
    assert dele["after"] is None
    assert "diff" not in dele

    # Progress is visible in SQL once the broker acknowledged, and the seed's lag query works.
    offs = wait_for(lambda: pg.execute(
        "SELECT sink_name, events_published, last_lsn, NOW() - last_timestamp AS lag FROM _cdc_offsets "
        "WHERE table_name = %s AND sink_name = %s", (table, f"kafka_{unique}")).fetchall(), what="offsets")
    assert offs[0][0] == f"kafka_{unique}" and offs[0][1] == 3 and offs[0][2] == dele["metadata"]["commit_lsn"]
    assert sink_state(pg, f"kafka_{unique}") == ("running", None)
    pg.execute("SELECT cdc_disable(%s)", (table,))
    assert pg.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (table,)).fetchone()[0] == "d"


def test_multi_row_transaction_is_whole_and_ordered(pg, sinks, unique):
    table, topic = f"multi_{unique}", f"multi-{unique}"
    pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s, '{\"include_transaction_info\": true}')", (table,))
    sinks.add(f"multi_{unique}", topic)
    with pg.transaction():
        for i in range(50):
            pg.execute(f"INSERT INTO {table} VALUES (%s, 'x')", (i,))
        pg.execute(f"INSERT INTO {table} VALUES (1000, 'rolled back')")
        pg.execute(f"DELETE FROM {table} WHERE id = 1000")
    try:
        with pg.transaction():
            pg.execute(f"INSERT INTO {table} VALUES (2000, 'aborted')")
            raise RuntimeError("abort")
    except RuntimeError:
        pass
    msgs = consume(topic, 52)
    assert len(msgs) == 52
    txs = {m["value"]["metadata"]["transaction_id"] for m in msgs}
    assert len(txs) == 1
    idx = sorted(m["value"]["metadata"]["transaction"]["event_index"] for m in msgs)
    assert idx == list(range(1, 53))
    assert all(m["value"]["metadata"]["transaction"]["event_count"] == 52 for m in msgs)
    assert not any(m["value"]["after"] and m["value"]["after"]["v"] == "aborted" for m in msgs)
    pg.execute("SELECT cdc_disable(%s)", (table,))


def test_truncate_and_topic_template(pg, sinks, unique):
    table = f"trunc_{unique}"
    pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (table,))
    sinks.add(f"tmpl_{unique}", "cdc.{database}.{schema}.{table}")
    pg.execute(f"INSERT INTO {table} VALUES (1)")
    pg.execute(f"TRUNCATE {table}")
    msgs = consume(f"cdc.postgres.public.{table}", 2)
    assert [m["value"]["metadata"]["operation"] for m in msgs] == ["INSERT", "TRUNCATE"]
    assert msgs[1]["key"] is None
    assert msgs[1]["value"]["metadata"]["truncate"] == {"cascade": False, "restart_identity": False}
    assert msgs[1]["value"]["before"] is None and msgs[1]["value"]["after"] is None
    pg.execute("SELECT cdc_disable(%s)", (table,))


def test_seed_example_1_order_pipeline_to_two_sinks(pg, sinks, unique):
    """Seed example 1 with its exact capture config, to two Kafka JSON sinks (fulfillment and analytics;
    the avro and kinesis sinks of the seed come with their issues): the seed's sample UPDATE field by field."""
    t = f"orders_{unique}"
    pg.execute(f"""CREATE TABLE {t} (order_id text PRIMARY KEY, customer_id text, total numeric(10,2), status text,
                   customer_region text)""")
    pg.execute("""SELECT cdc_enable(table_name => %s, config => '{
        "capture_mode": "all_changes",
        "operations": ["INSERT", "UPDATE", "DELETE"],
        "include_before_image": true,
        "include_transaction_info": true,
        "partition_key": "customer_region"
    }'::jsonb)""", (t,))
    topics = [f"orders-fulfillment-{unique}", f"orders-analytics-{unique}"]
    sinks.add(f"kafka_fulfillment_{unique}", topics[0])
    sinks.add(f"kafka_analytics_{unique}", topics[1])
    pg.execute(f"INSERT INTO {t} VALUES ('ORD-12345', 'CUST-789', 150.00, 'pending', 'us-east')")
    pg.execute(f"UPDATE {t} SET status = 'confirmed' WHERE order_id = 'ORD-12345'")
    for topic in topics:
        msgs = consume(topic, 2)
        assert len(msgs) == 2
        upd = msgs[1]["value"]
        md = upd["metadata"]
        assert (md["source"], md["database"], md["table"], md["operation"]) == ("pg_cdc", "postgres", t, "UPDATE")
        assert md["timestamp"].endswith("Z") and isinstance(md["lsn"], int) and isinstance(md["transaction_id"], int)
        assert upd["before"] == {"order_id": "ORD-12345", "customer_id": "CUST-789", "total": 150.00,
                                 "status": "pending", "customer_region": "us-east"}
        assert upd["after"] == {"order_id": "ORD-12345", "customer_id": "CUST-789", "total": 150.00,
                                "status": "confirmed", "customer_region": "us-east"}
        assert upd["diff"] == {"status": {"from": "pending", "to": "confirmed"}}
        assert b'"total":150.00' in msgs[1]["raw"]
        assert md["transaction"]["event_count"] == 1
        assert all(m["key"] == {"customer_region": "us-east"} for m in msgs), "partition_key keys the messages"
    want = [(f"kafka_analytics_{unique}", 2), (f"kafka_fulfillment_{unique}", 2)]
    wait_for(lambda: pg.execute("SELECT sink_name, events_published FROM _cdc_offsets WHERE table_name = %s ORDER BY 1",
                                (t,)).fetchall() == want, what="_cdc_offsets of both sinks")
    pg.execute("SELECT cdc_disable(%s)", (t,))
