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
    ]
    for sink_type, cfg, state in cases:
        with pytest.raises(psycopg.Error) as e:
            pg.execute("SELECT cdc_add_sink('dbz_refused', %s, %s::jsonb)", (sink_type, json.dumps(cfg)))
        assert e.value.sqlstate == state, (cfg, e.value)
