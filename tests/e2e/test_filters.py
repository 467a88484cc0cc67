"""Row filters, computed columns, masks and enrichment through Kafka (seed example 4 and the
seed's CDC configuration block), cdc_filter_metrics and cdc_preview."""
import json
import re
import time

import psycopg
import pytest

from conftest import (connect, consume, delivery_status, hold_worker, restart_worker, server_settings, sink_state,
                      wait_for, worker_pid)


def example_4(sensors):
    """Seed example 4's config, its lookup table named `sensors`."""
    return json.dumps({
        "capture_mode": "filtered",
        "filter_expression": "reading_value > threshold OR alert_level = 'critical'",
        "transformations": [
            {"type": "enrich", "source_column": "sensor_id", "lookup_table": sensors,
             "lookup_column": "sensor_id", "add_columns": ["location", "sensor_type", "owner"]},
            {"type": "compute", "name": "deviation_pct",
             "expression": "ABS(reading_value - baseline) / baseline * 100"},
            {"type": "mask", "column": "internal_calibration", "method": "remove"},
        ],
        "partition_key": "sensor_type",
    })


def create_sensor_readings(pg, t):
    """The readings table `t` and its lookup table `t`_sensors (returned), with three sensors."""
    pg.execute(f"""CREATE TABLE {t} (reading_id text PRIMARY KEY, sensor_id text, reading_value numeric(6,1),
                   threshold numeric(6,1), alert_level text, "timestamp" timestamptz, baseline numeric(6,1),
                   internal_calibration numeric)""")
    s = f"{t}_sensors"
    pg.execute(f"CREATE TABLE {s} (sensor_id text PRIMARY KEY, location text, sensor_type text, owner text)")
    pg.execute(f"""INSERT INTO {s} VALUES ('SENS-001', 'Building A, Floor 3', 'temperature', 'Facilities Team'),
                   ('SENS-002', 'Building B', 'humidity', 'Facilities Team'),
                   ('SENS-003', 'Roof', 'pressure', 'Operations')""")
    return s


def test_seed_example_4_filtered_readings_with_computed_and_masked_columns(pg, sinks, unique):
    t, topic = f"sensor_readings_{unique}", f"iot-critical-readings-{unique}"
    s = create_sensor_readings(pg, t)
    pg.execute("SELECT cdc_enable(table_name => %s, config => %s::jsonb)", (t, example_4(s)))
    sinks.add(f"kafka_iot_alerts_{unique}", topic, include_transformations=True)
    pg.execute(f"""INSERT INTO {t} VALUES
        ('READ-847293', 'SENS-001', 95.5, 80.0, 'warning', '2024-03-15 14:23:45+00', 80.0, 0.997),
        ('READ-000001', 'SENS-002', 50.0, 80.0, 'normal', '2024-03-15 14:23:46+00', 60.0, 1.002),
        ('READ-000002', 'SENS-003', 10.0, 80.0, 'critical', '2024-03-15 14:23:47+00', 40.0, 1.000)""")
    msgs = consume(topic, 2)
    assert len(msgs) == 2, "the normal reading is filtered out"
    first, second = msgs[0]["value"], msgs[1]["value"]
    assert first["metadata"]["operation"] == "INSERT"
    assert first["metadata"]["filter_matched"] == "reading_value > threshold"
    assert second["metadata"]["filter_matched"] == "alert_level = 'critical'"
    # The seed's sample event, field by field: the row, the enriched fields, the computed one.
    assert first["after"] == {
        "reading_id": "READ-847293", "sensor_id": "SENS-001", "reading_value": 95.5, "threshold": 80.0,
        "alert_level": "warning", "timestamp": "2024-03-15T14:23:45Z", "baseline": 80.0,
        "location": "Building A, Floor 3", "sensor_type": "temperature", "owner": "Facilities Team",
        "deviation_pct": 19.375,
    }
    assert b'"deviation_pct":19.375' in msgs[0]["raw"], "exact decimal, as the seed shows"
    assert b"internal_calibration" not in msgs[0]["raw"] + msgs[1]["raw"]
    assert second["after"]["deviation_pct"] == 75
    assert second["after"]["sensor_type"] == "pressure" and second["after"]["owner"] == "Operations"
    assert msgs[0]["key"] == {"sensor_type": "temperature"}, "partition_key names an enriched column"

    # An UPDATE that moves a reading out of the filter is a DELETE of what the consumer has.
    pg.execute(f"UPDATE {t} SET alert_level = 'resolved' WHERE reading_id = 'READ-000002'")
    # ... which needs the before image: without one the change is dropped (documented).
    pg.execute(f"INSERT INTO {t} VALUES ('READ-000003', 'SENS-004', 99.0, 80.0, 'warning', now(), 90.0, 1)")
    msgs = consume(topic, 3)
    assert [m["value"]["after"]["reading_id"] for m in msgs] == ["READ-847293", "READ-000002", "READ-000003"]
    unknown = msgs[2]["value"]["after"]
    assert (unknown["location"], unknown["sensor_type"], unknown["owner"]) == (None, None, None), "no such sensor"
    assert msgs[2]["key"] == {"sensor_type": None}

    metrics = wait_for(lambda: (m := pg.execute("SELECT cdc_filter_metrics(%s)", (t,)).fetchone()[0])
                       and m["filtering"]["total_changes"] == 5 and m, what="filter metrics")
    f, tr = metrics["filtering"], metrics["transformations"]
    assert metrics["table"] == t
    assert (f["filter_matched"], f["filter_excluded"]) == (3, 2)
    assert abs(f["filter_ratio"] - 0.6) < 1e-9
    # Two dropped events (one INSERT, one UPDATE): their encoded size, not an estimate.
    assert 400 < f["bandwidth_saved_bytes"] < 4000, f
    assert (tr["computations_performed"], tr["masks_applied"], tr["expression_errors"]) == (3, 3, 0)
    assert (tr["enrichments_applied"], tr["enrichment_lookups"]) == (3, 3)
    # The worker's memory starts empty: three different sensors, three reads of the sink's copy.
    assert tr["enrichment_cache_hits"] == 0 and tr["enrichment_cache_hit_rate"] == 0, tr
    assert list(metrics["sinks"]) == [f"kafka_iot_alerts_{unique}"]
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_enrichment_uses_the_lookup_row_as_of_the_commit(pg, sinks, unique):
    t, topic = f"sensor_readings_{unique}", f"iot-asof-{unique}"
    s = create_sensor_readings(pg, t)
    name = sinks.add(f"kafka_asof_{unique}", topic)
    pg.execute("SELECT cdc_enable(table_name => %s, config => %s::jsonb)", (t, example_4(s)))
    reading = f"INSERT INTO {t} VALUES (%s, 'SENS-001', 95.5, 80.0, 'warning', now(), 80.0, 1)"
    pg.execute(reading, ("R-0",))
    assert consume(topic, 1)[0]["value"]["after"]["owner"] == "Facilities Team"

    # Hold the worker at its next catalog read, so both changes below commit before it reads either.
    with hold_worker(pg):
        pg.execute(reading, ("R-1",))
        pg.execute(f"UPDATE {s} SET owner = 'Night Shift', location = 'Building C' WHERE sensor_id = 'SENS-001'")
    got = consume(topic, 2)[1]["value"]["after"]
    assert (got["reading_id"], got["owner"], got["location"]) == ("R-1", "Facilities Team", "Building A, Floor 3"), \
        "the values in force when the reading committed, not when the worker read it"
    pg.execute(reading, ("R-2",))
    assert consume(topic, 3)[2]["value"]["after"]["owner"] == "Night Shift"

    # A restarted worker starts with empty memory and reads the sink's copy, which has the update.
    wait_for(lambda: pg.execute("SELECT events_published FROM _cdc_offsets WHERE sink_name = %s",
                                (name,)).fetchone() == (3,), what="R-2 confirmed")
    restart_worker(pg)
    pg.execute(reading, ("R-3",))
    got = consume(topic, 4)[3]["value"]["after"]
    assert (got["reading_id"], got["owner"], got["location"]) == ("R-3", "Night Shift", "Building C")
    tr = wait_for(lambda: (m := pg.execute("SELECT cdc_filter_metrics(%s)", (t,)).fetchone()[0]["transformations"])
                  and m["enrichment_lookups"] == 4 and m, what="lookups counted")
    # R-0 read the copy; R-1 hit; R-2 hit the row the update put in memory; R-3 read the copy again.
    assert (tr["enrichments_applied"], tr["enrichment_cache_hits"], tr["enrichment_cache_hit_rate"]) == (4, 2, 0.5)
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_a_sink_that_lists_its_tables_gets_their_lookup_changes_and_no_others(pg, sinks, unique):
    """A sink with `tables` has the changes of every other table dropped in its decoding session,
    before pgoutput formats them; its tables' lookup tables must still reach it. Oracles: the rows
    the test wrote (the other table's changes counted as skipped, none in the topic) and the
    lookup value in force at each reading's commit (a dropped lookup change would leave the old
    owner in the second event)."""
    t, topic, other = f"sensor_readings_{unique}", f"iot-listed-{unique}", f"other_{unique}"
    s = create_sensor_readings(pg, t)
    pg.execute(f"CREATE TABLE {other} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(table_name => %s, config => %s::jsonb)", (t, example_4(s)))
    pg.execute("SELECT cdc_enable(%s)", (other,))
    name = sinks.add(f"kafka_listed_{unique}", topic, tables=[t], include_transformations=True)
    reading = f"INSERT INTO {t} VALUES (%s, 'SENS-001', 95.5, 80.0, 'warning', now(), 80.0, 1)"
    pg.execute(reading, ("R-0",))
    assert consume(topic, 1)[0]["value"]["after"]["owner"] == "Facilities Team"
    skipped = delivery_status(pg, name)["decoding"]["changes_skipped"]

    pg.execute(f"INSERT INTO {other} SELECT generate_series(1, 500)")
    pg.execute(f"UPDATE {s} SET owner = 'Night Shift' WHERE sensor_id = 'SENS-001'")
    pg.execute(f"UPDATE {other} SET id = -id WHERE id <= 100")
    pg.execute(reading, ("R-1",))
    got = consume(topic, 2)
    assert [m["value"]["after"]["reading_id"] for m in got] == ["R-0", "R-1"], "nothing of the other table"
    assert got[1]["value"]["after"]["owner"] == "Night Shift", "the lookup change reached the sink"
    # 500 inserts and 100 updates of the other table, whatever else the worker decoded meanwhile.
    wait_for(lambda: delivery_status(pg, name)["decoding"]["changes_skipped"] - skipped >= 600,
             what="the other table's changes counted as skipped")
    assert delivery_status(pg, name)["decoding"]["changes_skipped"] - skipped < 700
    pg.execute("SELECT cdc_disable(%s)", (t,))
    pg.execute("SELECT cdc_disable(%s)", (other,))


def test_a_small_enrichment_cache_answers_from_the_copy(pg, sinks, unique):
    t, topic = f"sensor_readings_{unique}", f"iot-small-cache-{unique}"
    s = create_sensor_readings(pg, t)
    pg.execute(f"INSERT INTO {s} SELECT 'S-' || i, 'Hall ' || i, 'temperature', 'Team ' || i FROM generate_series(1, 300) i")
    pg.execute("SELECT cdc_enable(table_name => %s, config => %s::jsonb)", (t, example_4(s)))
    sinks.add(f"kafka_small_cache_{unique}", topic)
    with server_settings({"cdc.enrich_cache_rows": "10"}):
        time.sleep(1.0)  # the worker re-reads its settings at its next tick
        # Every sensor twice, in two rounds: far more sensors than the worker keeps in memory.
        pg.execute(f"""INSERT INTO {t} SELECT 'R-' || r || '-' || i, 'S-' || i, 95.5, 80.0, 'warning', now(), 80.0, 1
                       FROM generate_series(1, 2) r, generate_series(1, 300) i""")
        msgs = consume(topic, 600, timeout=60)
    assert len(msgs) == 600
    for m in msgs:
        after = m["value"]["after"]
        i = after["sensor_id"].removeprefix("S-")
        assert (after["location"], after["owner"]) == (f"Hall {i}", f"Team {i}"), after
    tr = pg.execute("SELECT cdc_filter_metrics(%s)", (t,)).fetchone()[0]["transformations"]
    assert tr["enrichment_lookups"] == 600
    assert tr["enrichment_cache_hits"] < 300, "most lookups went to the copy: the cache is bounded"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_updates_entering_and_leaving_the_filter_with_before_images(pg, sinks, unique):
    t, topic = f"orders_{unique}", f"orders-cdc-{unique}"
    pg.execute(f"""CREATE TABLE {t} (order_id int PRIMARY KEY, customer_id int, total numeric(10,2), status text,
                   updated_at timestamptz, internal_notes text)""")
    # The seed's "CDC Configuration" block.
    pg.execute("""SELECT cdc_enable(table_name => %s, config => '{
        "capture_mode": "all_changes",
        "include_columns": ["order_id", "customer_id", "total", "status", "updated_at"],
        "exclude_columns": ["internal_notes"],
        "filter": "status != ''draft''",
        "key_columns": ["order_id"],
        "before_image": true}')""", (t,))
    sinks.add(f"kafka_orders_{unique}", topic)
    pg.execute(f"INSERT INTO {t} VALUES (1, 7, 10.00, 'draft', now(), 'x')")           # dropped
    pg.execute(f"UPDATE {t} SET status = 'pending' WHERE order_id = 1")                # enters
    pg.execute(f"UPDATE {t} SET total = 12.50 WHERE order_id = 1")                     # stays in
    pg.execute(f"UPDATE {t} SET status = 'draft' WHERE order_id = 1")                  # leaves
    pg.execute(f"UPDATE {t} SET total = 13.00 WHERE order_id = 1")                     # stays out: dropped
    msgs = consume(topic, 3)
    got = [(m["value"]["metadata"]["operation"], m["value"]["metadata"].get("filter_transition")) for m in msgs]
    assert got == [("UPDATE", "entered"), ("UPDATE", None), ("DELETE", "left")]
    assert msgs[0]["value"]["after"]["status"] == "pending"
    assert "filter_matched" not in msgs[0]["value"]["metadata"], "filter_matched is for capture_mode filtered"
    left = msgs[2]["value"]
    assert left["before"]["status"] == "pending" and left["before"]["total"] == 12.50
    assert left["after"] is None and msgs[2]["key"] == {"order_id": 1}
    assert all(b"internal_notes" not in m["raw"] and b'"draft"' not in m["raw"] for m in msgs)
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_preview_shows_the_event_without_publishing(pg, unique):
    t = f"preview_{unique}"
    s = create_sensor_readings(pg, t)
    pg.execute("SELECT cdc_enable(table_name => %s, config => %s::jsonb)", (t, example_4(s)))
    pg.execute(f"INSERT INTO {t} VALUES ('R-1', 'SENS-002', 95.5, 80.0, 'warning', '2024-03-15 14:23:45+00', 80.0, 0.997)")
    p = pg.execute("SELECT cdc_preview(%s)", (t,)).fetchone()[0]
    assert p["table"] == t and p["operation"] == "INSERT" and len(p["previews"]) == 1
    one = p["previews"][0]
    assert one["published"] is True and one["filter_matched"] == "reading_value > threshold"
    assert one["key"] == {"sensor_type": "humidity"}
    assert one["event"]["after"]["deviation_pct"] == 19.375
    assert one["event"]["after"]["location"] == "Building B", "enriched from the lookup table as it is now"
    assert "internal_calibration" not in one["event"]["after"]
    assert one["event"]["metadata"]["table"] == t
    # A row that is not in the table yet, and one the filter drops.
    p = pg.execute("SELECT cdc_preview(%s, sample => %s::jsonb)",
                   (t, '{"reading_id": "R-2", "reading_value": 1, "threshold": 80, "alert_level": "normal"}')).fetchone()[0]
    assert p["previews"][0]["published"] is False
    assert "reading_value > threshold OR alert_level = 'critical'" in p["previews"][0]["reason"]
    # The session's own settings do not change what the worker would send.
    pg.execute("SET DateStyle = 'German'")
    p = pg.execute("SELECT cdc_preview(%s)", (t,)).fetchone()[0]
    assert p["previews"][0]["event"]["after"]["timestamp"] == "2024-03-15T14:23:45Z"
    assert pg.execute("SHOW DateStyle").fetchone()[0] == "German, DMY", "the caller's setting is left as it was"
    pg.execute("RESET DateStyle")
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_ddl_that_breaks_a_filter_stops_the_tables_sinks_until_it_is_enabled_again(pg, sinks, unique):
    """Without schema enforcement, DROP COLUMN of a column the filter reads commits. The sinks that
    carry the table then stop in state error with the reason (never a silently different filter);
    a sink that does not carry it goes on; cdc_enable with a config that fits lets them go on, and
    nothing committed meanwhile is lost."""
    t, other = f"ddl_{unique}", f"ddlother_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, amount int, note text)")
    pg.execute(f"CREATE TABLE {other} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s, %s::jsonb)", (t, json.dumps({"filter": "amount > 10"})))
    pg.execute("SELECT cdc_enable(%s)", (other,))
    carrier = sinks.add(f"ddlcarrier_{unique}", f"ddlcarrier-{unique}", tables=[t, other])
    sinks.add(f"ddlbystander_{unique}", f"ddlbystander-{unique}", tables=[other])
    pg.execute(f"INSERT INTO {t} VALUES (1, 20, 'kept'), (2, 5, 'filtered out')")
    assert [m["value"]["after"]["id"] for m in consume(f"ddlcarrier-{unique}", 1)] == [1]

    pg.execute(f"ALTER TABLE {t} DROP COLUMN amount")
    after_ddl = pg.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
    pg.execute(f"INSERT INTO {t} VALUES (3, 'after the drop')")
    pg.execute(f"INSERT INTO {other} VALUES (1)")
    state = wait_for(lambda: (s := sink_state(pg, carrier)) and s[0] == "error" and s, what="error state")
    assert f"public.{t}" in state[1] and "no longer fits" in state[1] and "amount" in state[1], state[1]
    # It names the position from which the config no longer fits: the first change after the DDL.
    at = re.search(r"from LSN ([0-9A-F]+/[0-9A-F]+)", state[1])
    assert at and pg.execute("SELECT %s::pg_lsn >= %s::pg_lsn", (at.group(1), after_ddl)).fetchone()[0], state[1]
    assert [m["value"]["after"]["id"] for m in consume(f"ddlbystander-{unique}", 1)] == [1]
    assert sink_state(pg, f"ddlbystander_{unique}")[0] == "running"

    pg.execute("SELECT cdc_enable(%s, %s::jsonb)", (t, json.dumps({"filter": "note IS NOT NULL"})))
    msgs = consume(f"ddlcarrier-{unique}", 3, timeout=90)
    got = sorted((m["value"]["metadata"]["table"], m["value"]["after"]["id"]) for m in msgs)
    assert got == sorted([(t, 1), (t, 3), (other, 1)]), got
    wait_for(lambda: sink_state(pg, carrier)[0] == "running", what="running again")
    for x in (t, other):
        pg.execute("SELECT cdc_disable(%s)", (x,))


def test_a_dropped_lookup_table_is_missing_and_the_table_that_enriches_from_it_goes_on(pg, sinks, unique):
    """DROP TABLE of a lookup table: the sinks carrying a table that enriches from it go on (they used
    to stop in state error), its events find no lookup row (as of their commit the lookup table does not
    exist), `cdc_status().missing_tables` names the lookup table, a new sink carrying the table is
    accepted, and cdc_enable with a config without the enrich delivers without its columns."""
    t, topic = f"sensor_readings_{unique}", f"lookupdrop-{unique}"
    s = create_sensor_readings(pg, t)
    pg.execute("SELECT cdc_enable(table_name => %s, config => %s::jsonb)", (t, example_4(s)))
    name = sinks.add(f"lookupdrop_{unique}", topic, tables=[t])
    reading = f"INSERT INTO {t} VALUES (%s, 'SENS-001', 95.5, 80.0, 'warning', now(), 80.0, 1)"
    pg.execute(reading, ("R-1",))
    assert consume(topic, 1)[0]["value"]["after"]["owner"] == "Facilities Team"

    pg.execute(f"DROP TABLE {s}")
    pg.execute(reading, ("R-2",))
    msgs = consume(topic, 2)
    assert [m["value"]["after"]["reading_id"] for m in msgs] == ["R-1", "R-2"]
    assert msgs[1]["value"]["after"]["owner"] is None, "no lookup row as of its commit"
    missing = pg.execute("SELECT missing_tables FROM cdc_status() WHERE sink_name = %s", (name,)).fetchone()[0]
    assert missing == [f"public.{s} (lookup of {t})"], missing
    assert sink_state(pg, name) == ("running", None)
    late = sinks.add(f"lookuplate_{unique}", f"lookuplate-{unique}", tables=[t])
    wait_for(lambda: sink_state(pg, late) == ("running", None), what="the new sink running")

    pg.execute("SELECT cdc_enable(%s, '{}')", (t,))
    pg.execute(reading, ("R-3",))
    msgs = consume(topic, 3, timeout=90)
    assert [m["value"]["after"]["reading_id"] for m in msgs] == ["R-1", "R-2", "R-3"]
    assert "owner" not in msgs[2]["value"]["after"], "delivered under the config without the enrich"
    assert pg.execute("SELECT missing_tables FROM cdc_status() WHERE sink_name = %s", (name,)).fetchone()[0] == []
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_lookup_copies_hold_values_as_pgoutput_sends_them(pg, sinks, unique):
    """Regression: the lookup copy made when the sink is added held `col::text`, which is not what
    pgoutput sends for every type (`true::text` is 'true', pgoutput sends 't'; an inet's cast shows the
    netmask): an inet key found no copied row, and a copied boolean read as false. cdc_preview reads the
    lookup table the same way."""
    t, lk, topic = f"hosts_{unique}", f"nets_{unique}", f"hosts-{unique}"
    pg.execute(f"CREATE TABLE {lk} (addr inet PRIMARY KEY, trusted bool, label text)")
    pg.execute(f"INSERT INTO {lk} VALUES ('10.0.0.1', true, 'core')")
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, addr inet)")
    cfg = {"transformations": [{"type": "enrich", "source_column": "addr", "lookup_table": lk,
                                "lookup_column": "addr", "add_columns": ["trusted", "label"]}]}
    pg.execute("SELECT cdc_enable(%s, %s::jsonb)", (t, json.dumps(cfg)))
    sinks.add(f"hosts_{unique}", topic, tables=[t])  # its copy of the lookup table is made now
    pg.execute(f"INSERT INTO {t} VALUES (1, '10.0.0.1')")
    after = consume(topic, 1)[0]["value"]["after"]
    assert (after["trusted"], after["label"]) == (True, "core")
    (p,) = pg.execute("SELECT cdc_preview(%s) -> 'previews'", (t,)).fetchone()[0]
    assert (p["event"]["after"]["trusted"], p["event"]["after"]["label"]) == (True, "core")
    pg.execute("SELECT cdc_disable(%s)", (t,))
