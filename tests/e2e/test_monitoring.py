"""Monitoring from SQL and Prometheus: cdc_metrics, cdc_status, the seed's _cdc_offsets query and
cdc_prometheus_metrics, checked against a known workload and against an independent measure."""
import json
import statistics
import time
from datetime import datetime

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from conftest import BOOTSTRAP, connect, consume, server_log, server_settings, wait_for
from test_dropped_tables import GatedHook
from test_shared_decoding import rows_until_shared


def delivered(pg, sink, n):
    """Waits until the sink's _cdc_offsets count `n` events (delivered and confirmed)."""
    wait_for(lambda: pg.execute("SELECT coalesce(sum(events_published), 0) FROM _cdc_offsets WHERE sink_name = %s",
                                (sink,)).fetchone()[0] == n, what=f"{n} events confirmed")


def test_figures_of_a_known_workload_are_exact(pg, sinks, unique):
    t, topic = f"orders_{unique}", f"orders-metrics-{unique}"
    pg.execute(f"CREATE TABLE {t} (order_id int PRIMARY KEY, customer_region text, total numeric(10,2))")
    pg.execute("SELECT cdc_enable(%s, '{\"partition_key\": \"customer_region\"}')", (t,))
    name = sinks.add(f"kafka_metrics_{unique}", topic)
    # 5 transactions of 20 rows, then 10 one-row transactions: 110 events in 15 transactions.
    for b in range(5):
        pg.execute(f"INSERT INTO {t} SELECT i, 'us-east', i FROM generate_series({b * 20 + 1}, {b * 20 + 20}) i")
    for i in range(101, 111):
        pg.execute(f"INSERT INTO {t} VALUES ({i}, 'eu-west', 1)")
    assert len(consume(topic, 110)) == 110
    delivered(pg, name, 110)

    m = pg.execute("SELECT cdc_metrics(%s)", (t,)).fetchone()[0]
    src, snk, e2e = m["source_metrics"], m["sink_metrics"][name], m["end_to_end_latency"]
    assert m["table"] == t
    assert (src["transactions_processed"], src["events_captured"]) == (15, 110)
    assert snk["events_published"] == 110 and snk["state"] == "running"
    assert e2e["samples"] == 110, "one latency per event"
    assert 0 <= src["capture_latency_p50_ms"] <= src["capture_latency_p99_ms"] <= e2e["max_ms"]
    assert 0 < e2e["p50_ms"] <= e2e["p99_ms"] <= e2e["p999_ms"] <= e2e["max_ms"]
    assert 0 < snk["publish_latency_p50_ms"] <= snk["publish_latency_p99_ms"]
    assert isinstance(snk["lag_events"], int) and 0 <= snk["lag_events"] <= 5, "an estimate: caught up"
    assert isinstance(src["wal_lag_bytes"], int) and src["wal_lag_bytes"] >= 0

    row = pg.execute("""SELECT state, last_error, wal_status, retained_wal_bytes, lag_bytes, events_published,
                               end_to_end_p50_ms, end_to_end_p99_ms, last_delivered_at IS NOT NULL
                          FROM cdc_status() WHERE sink_name = %s""", (name,)).fetchone()
    assert row[:3] == ("running", None, "reserved")
    assert row[3] > 0 and row[4] >= 0 and row[5] == 110 and row[8]
    assert row[6] == e2e["p50_ms"] and row[7] == e2e["p99_ms"], "one sink: its histogram is the table's"

    # The seed's query, exactly as written.
    rows = pg.execute(f"""SELECT sink_name, events_published, last_timestamp, NOW() - last_timestamp as lag
                          FROM _cdc_offsets WHERE table_name = '{t}'""").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(name, 110)]
    assert rows[0][3].total_seconds() >= 0
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_end_to_end_percentiles_agree_with_the_broker_timestamps(pg, sinks, unique):
    """pg_cdc's end-to-end latency (commit -> Kafka commit acknowledged) against an independent
    measure: the broker's append time of each record (LogAppendTime) minus the commit time the event
    carries. The broker appends before the transaction commits, so the independent figure is a little
    lower; the tolerance is 100 ms plus 50 % at p50 (the Kafka commit round trip, and 1 ms rounding).
    At p99 a single slow Kafka commit (the broker writes the transaction markers) lifts pg_cdc's figure
    for every event of that transaction and not the broker's: one such stall of 265 ms failed a CI run
    with the p50 tolerance, so p99 may differ by 300 ms plus the broker's own p99 (a wrong clock or a
    miscounted histogram is off by far more)."""
    t, topic = f"ticks_{unique}", f"ticks-latency-{unique}"
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(topic, 1, 1, config={"message.timestamp.type": "LogAppendTime"})])[topic].result(30)
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    name = sinks.add(f"kafka_latency_{unique}", topic)
    pg.execute(f"INSERT INTO {t} VALUES (0, 'warm-up')")  # opens the producer
    consume(topic, 1)
    n = 200
    for i in range(1, n + 1):  # about 50 transactions a second
        pg.execute(f"INSERT INTO {t} VALUES ({i}, 'x')")
        time.sleep(0.02)
    msgs = consume(topic, n + 1)
    delivered(pg, name, n + 1)
    assert len(msgs) == n + 1
    theirs = sorted(m["timestamp"] - commit_ms(m["value"]["metadata"]["timestamp"]) for m in msgs[1:])
    ours = pg.execute("SELECT cdc_metrics(%s)", (t,)).fetchone()[0]["end_to_end_latency"]
    assert ours["samples"] == n + 1
    their_p50, their_p99 = statistics.median(theirs), theirs[int(0.99 * len(theirs)) - 1]
    for label, mine, other, tolerance in [("p50", ours["p50_ms"], their_p50, 100 + 0.5 * their_p50),
                                          ("p99", ours["p99_ms"], their_p99, 300 + their_p99)]:
        assert abs(mine - other) <= tolerance, f"{label}: pg_cdc {mine} ms, broker {other} ms"
    print(f"end to end p50 {ours['p50_ms']} ms (broker {their_p50} ms), p99 {ours['p99_ms']} ms (broker {their_p99} ms)")
    pg.execute("SELECT cdc_disable(%s)", (t,))


def commit_ms(iso):
    """Unix milliseconds of an event's `metadata.timestamp` (ISO 8601, UTC, milliseconds)."""
    return round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def test_prometheus_text_parses_and_counts(pg, sinks, unique):
    t, topic = f"prom_{unique}", f"prom-{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    name = sinks.add(f"kafka_prom_{unique}", topic)
    pg.execute(f"INSERT INTO {t} SELECT i, 'x' FROM generate_series(1, 25) i")
    consume(topic, 25)
    delivered(pg, name, 25)
    text = pg.execute("SELECT cdc_prometheus_metrics()").fetchone()[0]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    mine = lambda fam, **labels: [s for s in families[fam].samples  # noqa: E731
                                  if all(s.labels.get(k) == v for k, v in labels.items())]
    assert families["pg_cdc_events_published"].type == "counter"
    assert [s.value for s in mine("pg_cdc_events_published", sink=name, table=t)] == [25]
    assert [s.value for s in mine("pg_cdc_sink_state", sink=name, state="running")] == [1]
    assert families["pg_cdc_end_to_end_latency_seconds"].type == "histogram"
    count = [s.value for s in mine("pg_cdc_end_to_end_latency_seconds", sink=name) if s.name.endswith("_count")]
    assert count == [25]
    buckets = [s for s in mine("pg_cdc_end_to_end_latency_seconds", sink=name) if s.name.endswith("_bucket")]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 25
    assert all(a.value <= b.value for a, b in zip(buckets, buckets[1:])), "cumulative"
    table_count = [s.value for s in mine("pg_cdc_capture_latency_seconds", table=t) if s.name.endswith("_count")]
    assert table_count == [25]
    assert mine("pg_cdc_slot_retained_wal_bytes", sink=name)[0].value > 0
    # Figures are named by sink type, not in Kafka-only words.
    assert [s.value for s in mine("pg_cdc_sink_info", sink=name, type="kafka", delivery_mode="exactly_once")] == [1]
    assert mine("pg_cdc_sink_transactions_committed", sink=name)[0].value >= 1
    assert "pg_cdc_kafka_transactions_committed" not in families
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_monitoring_role_sees_figures_and_nothing_else(pg, unique):
    mon, nobody = f"cdc_mon_{unique}", f"cdc_nobody_{unique}"
    pg.execute(f"CREATE ROLE {mon} IN ROLE pg_monitor")
    pg.execute(f"CREATE ROLE {nobody}")
    t = f"privs_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    try:
        with connect() as c:
            c.execute(f"SET ROLE {mon}")
            c.execute("SELECT * FROM cdc_status()").fetchall()
            assert c.execute("SELECT cdc_metrics(%s)", (t,)).fetchone()[0]["table"] == t
            assert "# TYPE pg_cdc_sink_state gauge" in c.execute("SELECT cdc_prometheus_metrics()").fetchone()[0]
            # Every status function (0.7.0 granted the last three): none shows a sink config.
            assert c.execute("SELECT cdc_filter_metrics(%s)", (t,)).fetchone()[0]["table"] == t
            c.execute("SELECT * FROM cdc_multicloud_status()").fetchall()
            with pytest.raises(psycopg.errors.UndefinedObject):
                c.execute("SELECT cdc_delivery_status('x')")  # allowed: it looks for the sink
            for forbidden in ["SELECT config FROM _cdc_sinks", "SELECT * FROM _cdc_lookup_rows",
                              f"SELECT cdc_disable('{t}')", f"SELECT cdc_preview('{t}')"]:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(forbidden)
            c.execute(f"SET ROLE {nobody}")
            for call in ["SELECT * FROM cdc_status()", f"SELECT cdc_metrics('{t}')", "SELECT cdc_prometheus_metrics()",
                         "SELECT cdc_delivery_status('x')", f"SELECT cdc_filter_metrics('{t}')",
                         "SELECT * FROM cdc_multicloud_status()"]:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(call)
    finally:
        pg.execute("SELECT cdc_disable(%s)", (t,))
        pg.execute(f"DROP ROLE {mon}")
        pg.execute(f"DROP ROLE {nobody}")


def test_retained_wal_past_the_threshold_is_a_warning(pg, sinks, unique):
    t = f"wal_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    # A broker that never answers: the slot stays where it is while the WAL grows.
    name = f"kafka_dead_{unique}"
    pg.execute("SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)",
               (name, json.dumps({"bootstrap_servers": "127.0.0.1:1", "topic": f"dead-{unique}"})))
    sinks.names.append(name)
    with server_settings({"cdc.wal_warning_bytes": "1"}):
        pg.execute(f"INSERT INTO {t} SELECT i, repeat('x', 200) FROM generate_series(1, 20000) i")
        line = wait_for(lambda: next((ln for ln in server_log().splitlines()
                                      if "WARNING" in ln and f'sink "{name}"' in ln and "retains" in ln), None),
                        timeout=30, what="retained WAL warning")
    assert "cdc.wal_warning_bytes = 1 MB" in line, line
    retained = pg.execute("SELECT retained_wal_bytes FROM cdc_status() WHERE sink_name = %s", (name,)).fetchone()[0]
    assert retained > 1 << 20
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_offsets_and_snapshots_name_tables_by_schema_and_name_one_row_per_table(pg, sinks, unique):
    """_cdc_offsets has one row per sink and table, keyed by its OID: `table_name` is the bare name (the
    seed's `WHERE table_name = 'orders'` matches that name in every schema), `table_schema` the schema,
    and a RENAME renames the row instead of starting a second one. cdc_snapshots names tables the same
    way, by their current names, and a dropped one by the names it had."""
    a, b, rel, topic, name = f"sa_{unique}", f"sb_{unique}", f"named_{unique}", f"named-{unique}", f"named_{unique}"
    for s in (a, b):
        pg.execute(f"CREATE SCHEMA {s}")
        pg.execute(f"CREATE TABLE {s}.{rel} (id int PRIMARY KEY)")
        pg.execute(f"INSERT INTO {s}.{rel} VALUES (0)")
        pg.execute(f"SELECT cdc_enable('{s}.{rel}')")
    sinks.add(name, topic, tables=[f"{a}.{rel}", f"{b}.{rel}"])
    pg.execute(f"INSERT INTO {a}.{rel} VALUES (1)")
    pg.execute(f"INSERT INTO {b}.{rel} VALUES (1), (2)")
    delivered(pg, name, 5)
    rows = pg.execute(f"""SELECT table_schema, events_published FROM _cdc_offsets
                          WHERE table_name = '{rel}' ORDER BY 1""").fetchall()
    assert rows == [(a, 2), (b, 3)], "one row per table of that name, whatever its schema"

    pg.execute(f"ALTER TABLE {a}.{rel} RENAME TO {rel}_new")
    pg.execute(f"ALTER SCHEMA {b} RENAME TO {b}_new")
    pg.execute(f"INSERT INTO {a}.{rel}_new VALUES (3)")
    pg.execute(f"INSERT INTO {b}_new.{rel} VALUES (3)")
    delivered(pg, name, 7)
    rows = pg.execute("SELECT table_schema, table_name, events_published FROM _cdc_offsets WHERE sink_name = %s "
                      "ORDER BY 1", (name,)).fetchall()
    assert rows == [(a, f"{rel}_new", 3), (f"{b}_new", rel, 4)], "renamed rows, counts kept, no second row"

    snaps = pg.execute("SELECT table_schema, table_name, state FROM cdc_snapshots WHERE sink_name = %s ORDER BY 1",
                       (name,)).fetchall()
    assert [s[:2] for s in snaps] == [(a, f"{rel}_new"), (f"{b}_new", rel)]
    pg.execute(f"DROP TABLE {a}.{rel}_new")
    snaps = pg.execute("SELECT table_schema, table_name FROM cdc_snapshots WHERE sink_name = %s ORDER BY 1",
                       (name,)).fetchall()
    assert snaps == [(a, f"{rel}_new"), (f"{b}_new", rel)], "a dropped table keeps the names it had"
    pg.execute(f"DROP SCHEMA {a} CASCADE")
    pg.execute(f"DROP SCHEMA {b}_new CASCADE")


@pytest.mark.parametrize("shared", [False, True], ids=["own_decoding", "shared_log"])
def test_lag_events_estimates_the_events_a_held_sink_has_still_to_deliver(pg, sinks, unique, shared):
    """lag_events is an estimate, not null: the WAL the slot has not confirmed times the table's events
    per WAL byte the sink read. A webhook sink delivers 200 rows, then its destination holds the next delivery
    while 100 more rows are written, one transaction each: about 100 events are behind (the estimate
    is checked within a factor of 3 either way; caught up it is near 0). Shared: the sink reads the
    shared decoding's log from its first read and decodes no WAL itself (regression: the rate was over
    its own sessions' WAL only, so a sink that only read the log had none and lag_events was null —
    every sink of a database with ten or more, where `auto` shares the decoding)."""
    t, name = f"lagev_{unique}", f"lagev_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    hook = GatedHook()
    hook.open.set()
    settings = {"cdc.shared_decoding": "on" if shared else "off"}
    try:
        with server_settings(settings):
            if shared:
                # A sink that already reads the log: the webhook sink then finds the log's decoder
                # running and reads the log from its first read.
                first = sinks.add(f"lagev_k_{unique}", f"lagev-k-{unique}", tables=[t])
                rows_until_shared(pg, [t], 1_000, [first])
            pg.execute("SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)",
                       (name, json.dumps({"url": hook.url, "tables": [t], "snapshot_mode": "never"})))
            for i in range(200):
                pg.execute(f"INSERT INTO {t} VALUES (%s, 'warm')", (i,))
            delivered(pg, name, 200)
            decoding = pg.execute("SELECT cdc_delivery_status(%s) -> 'decoding'", (name,)).fetchone()[0]
            if shared:
                assert decoding["shared"] and decoding["wal_decoded_bytes"] == 0, decoding
                assert decoding["log_wal_bytes"] > 0, decoding
            else:
                assert not decoding["shared"] and decoding["wal_decoded_bytes"] > 0, decoding
            _held_behind(pg, t, name, hook)
    finally:
        pg.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (name, name))
        hook.close()
        pg.execute("SELECT cdc_disable(%s)", (t,))


def _held_behind(pg, t, name, hook):
    """The rest of the lag_events test: near 0 caught up, about 100 with 100 rows held back."""
    lag = lambda: pg.execute("SELECT cdc_metrics(%s) -> 'sink_metrics' -> %s -> 'lag_events'",  # noqa: E731
                             (t, name)).fetchone()[0]
    # A sink reading the shared log moves its position over WAL with nothing for it (other sinks'
    # _cdc_offsets writes) at its next read of the log, within about a second.
    wait_for(lambda: lag() <= 5, timeout=10, what="lag_events near 0 caught up")
    hook.open.clear()
    hook.arrived.clear()
    for i in range(200, 300):
        pg.execute(f"INSERT INTO {t} VALUES (%s, 'held')", (i,))
    assert hook.arrived.wait(60), "a delivery is held at the destination"
    behind = lag()
    assert 33 <= behind <= 300, f"lag_events {behind} for 100 rows behind"
    hook.open.set()
    delivered(pg, name, 300)
