"""cdc_alter_sink: a sink's config changed in place keeps its slot, so its position and its guarantee.
Oracles: what a read_committed consumer finds in the topics (every row once, across the old and the
new topic), the catalog's slot and snapshot rows, and the refusals' SQLSTATEs."""
import json
import time

import psycopg
import pytest

from conftest import connect, consume, read_messages, sink_state, wait_for
from test_exactly_once import assert_exactly_once, ids_of
from test_pause import Writer, captured, in_topic


def alter(pg, name, patch):
    return pg.execute("SELECT cdc_alter_sink(%s, %s::jsonb)", (name, json.dumps(patch))).fetchone()[0]


def test_a_new_topic_under_load_takes_every_row_after_the_old_one_exactly_once(pg, sinks, unique):
    t = captured(pg, unique, "alter")
    name, old, new = f"alter_{unique}", f"alter-a-{unique}", f"alter-b-{unique}"
    sinks.add(name, old, tables=[t])
    sinks.topics.append(new)
    before = pg.execute("SELECT sink_id, slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()
    writer = Writer(t)
    try:
        consume(old, 50, timeout=60)
        out = alter(pg, name, {"topic": new, "linger_ms": 10})
        assert out == {"sink": name, "changed": {"linger_ms": {"from": None, "to": 10},
                                                 "topic": {"from": old, "to": new}},
                       "snapshots": [], "no_longer_carried": []}, out
        # The worker reopens the destination with the new topic at its next pass.
        wait_for(lambda: in_topic(new) > 50, timeout=60, what="rows in the new topic")
        moved_at = in_topic(old)
        time.sleep(2)
    finally:
        n = writer.finish()
    assert in_topic(old) == moved_at, "nothing more in the old topic once the new one is used"
    # Every row once, in one topic or the other; each topic in commit order.
    a = consume(old, moved_at, timeout=30)
    b = consume(new, n - moved_at, timeout=90)
    assert_exactly_once(a + b, range(1, n + 1))
    assert max(ids_of(a)) < min(ids_of(b)), "the new topic starts where the old one ended"
    assert all(m["value"]["metadata"]["operation"] != "READ" for m in b), "no snapshot again"
    assert pg.execute("SELECT sink_id, slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone() == before
    assert sink_state(pg, name)[0] == "running"


def test_tables_added_are_back_filled_and_tables_removed_stop(pg, sinks, unique):
    t1, t2 = captured(pg, unique, "alter_t1"), captured(pg, unique, "alter_t2")
    pg.execute(f"INSERT INTO {t1} SELECT g, 'a' FROM generate_series(1, 5) g")
    pg.execute(f"INSERT INTO {t2} SELECT g, 'b' FROM generate_series(1, 30) g")
    name, topic = f"alter_tables_{unique}", f"alter-tables-{unique}"
    sinks.add(name, topic, tables=[t1])
    consume(topic, 5)
    out = alter(pg, name, {"tables": [t1, t2]})
    assert out["snapshots"] == [t2] and out["no_longer_carried"] == [], out
    assert out["changed"] == {"tables": {"from": [t1], "to": [t1, t2]}}, out
    pg.execute(f"INSERT INTO {t2} VALUES (31, 'b')")
    got = consume(topic, 5 + 31, timeout=60)
    of_t2 = [m["value"] for m in got if m["value"]["metadata"]["table"] == t2]
    assert sorted(v["after"]["id"] for v in of_t2) == list(range(1, 32)), of_t2
    assert sum(1 for v in of_t2 if v["metadata"]["operation"] == "READ") == 30, "its rows as READ events"
    wait_for(lambda: pg.execute("SELECT state FROM cdc_snapshots WHERE sink_name = %s AND table_name = %s",
                                (name, t2)).fetchone() == ("done",), what="the back-fill done")

    out = alter(pg, name, {"tables": [t2]})
    assert out["no_longer_carried"] == [t1] and out["snapshots"] == [], out
    time.sleep(2)
    pg.execute(f"INSERT INTO {t1} VALUES (100, 'a')")
    pg.execute(f"INSERT INTO {t2} VALUES (100, 'b')")  # the control: still carried
    got = consume(topic, 5 + 31 + 1, timeout=60)
    tables_of_100 = [m["value"]["metadata"]["table"] for m in got if m["value"]["after"]["id"] == 100]
    assert tables_of_100 == [t2], tables_of_100


def test_alter_refuses_what_would_break_the_guarantee_and_never_shows_secrets(pg, sinks, unique):
    t = captured(pg, unique, "alter_refused")
    name = f"alter_refused_{unique}"
    sinks.add(name, f"alter-refused-{unique}", tables=[t], properties={"client.id": "one"})
    for patch, hint in [({"exactly_once": False}, "add a sink"), ({"transactional_id": "x"}, "add a sink"),
                        ({"snapshot_mode": "never"}, "cdc_snapshot")]:
        with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
            alter(pg, name, patch)
        assert f"config.{next(iter(patch))}" in e.value.diag.message_primary
        assert hint in e.value.diag.message_hint, e.value.diag.message_hint
    with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
        alter(pg, name, {"topci": "x"})
    assert "topic" in (e.value.diag.message_hint or "")
    with pytest.raises(psycopg.errors.UndefinedTable):
        alter(pg, name, {"tables": [t, f"no_such_table_{unique}"]})
    with pytest.raises(psycopg.errors.UndefinedObject):
        alter(pg, f"no_such_sink_{unique}", {"topic": "x"})
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        pg.execute("SELECT cdc_alter_sink(%s, NULL)", (name,))
    # Nothing was applied by the refused calls.
    cfg = pg.execute("SELECT config FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
    assert cfg["topic"] == f"alter-refused-{unique}" and "exactly_once" not in cfg, cfg
    # The same values: nothing to change.
    assert alter(pg, name, {"topic": f"alter-refused-{unique}"})["changed"] == {}
    # A secret-holding key shows that it changed, never its value.
    out = alter(pg, name, {"properties": {"client.id": "two"}})
    assert out["changed"] == {"properties": {"from": "(secret)", "to": "(secret)"}}, out
    assert "two" not in json.dumps(out)


def test_a_sink_whose_table_was_dropped_can_still_be_altered_and_keeps_waiting_for_it(pg, sinks, unique):
    """Unchanged `tables` are not resolved again: a dropped table stays listed (missing_tables) and the
    other keys change."""
    t1, t2 = captured(pg, unique, "alter_kept1"), captured(pg, unique, "alter_kept2")
    name, old, new = f"alter_kept_{unique}", f"alter-kept-a-{unique}", f"alter-kept-b-{unique}"
    sinks.add(name, old, tables=[t1, t2])
    sinks.topics.append(new)
    pg.execute(f"DROP TABLE {t2}")
    out = alter(pg, name, {"topic": new})
    assert out["changed"] == {"topic": {"from": old, "to": new}}, out
    assert pg.execute("SELECT missing_tables FROM cdc_status() WHERE sink_name = %s", (name,)).fetchone()[0] == \
        [f"public.{t2}"]
    time.sleep(2)
    pg.execute(f"INSERT INTO {t1} VALUES (1, 'a')")
    assert ids_of(consume(new, 1, timeout=60)) == [1]
    # Changing `tables` resolves them again: the dropped one must go (or exist again).
    with pytest.raises(psycopg.errors.UndefinedTable):
        alter(pg, name, {"tables": [t2, t1]})
    assert alter(pg, name, {"tables": [t1]})["changed"] == {"tables": {"from": [t1, t2], "to": [t1]}}
    assert pg.execute("SELECT missing_tables FROM cdc_status() WHERE sink_name = %s", (name,)).fetchone()[0] == []


def test_a_sink_in_error_for_its_config_is_fixed_in_place_and_loses_nothing(pg, sinks, unique):
    """A Kafka property the client refuses puts the sink in error (an operator's fix); cdc_alter_sink
    removes it, the sink runs from its slot's position, and the rows written meanwhile arrive once."""
    t = captured(pg, unique, "alter_fix")
    name, topic = f"alter_fix_{unique}", f"alter-fix-{unique}"
    sinks.add(name, topic, tables=[t], properties={"message.max.bytes": "not-a-number"})
    pg.execute(f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(1, 10) g")
    state = wait_for(lambda: (s := sink_state(pg, name)) and s[0] == "error" and s, timeout=60,
                     what="the sink in error")
    assert "message.max.bytes" in state[1], state
    out = alter(pg, name, {"properties": None})
    assert out["changed"] == {"properties": {"from": "(secret)", "to": None}}, out
    pg.execute(f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(11, 20) g")
    assert_exactly_once(consume(topic, 20, timeout=90), range(1, 21))
    wait_for(lambda: sink_state(pg, name) == ("running", None), what="the sink running, its error gone")
