"""cdc_reconcile and cdc_export_spec: capture and sinks as a declared state. Oracles: the catalog
(sinks, captured tables, slots), what the table sinks' event tables hold (each row once), and the
refusals' SQLSTATEs; never the plan alone.

Each test starts from the cluster as the suite leaves it between tests (no sink, no captured table of
another test), and builds its spec on top of cdc_export_spec(), so what it does not declare is what
it finds."""
import json

import psycopg
import pytest

from conftest import connect, wait_for


def reconcile(pg, spec, apply=False):
    return pg.execute("SELECT cdc_reconcile(%s::jsonb, %s)", (json.dumps(spec), not apply)).fetchone()[0]


def export(pg):
    return pg.execute("SELECT cdc_export_spec()").fetchone()[0]


def with_objects(pg, tables=(), sinks=(), force_drop=None):
    """The live spec plus these tables and sinks (replacing those of the same name)."""
    return plus(export(pg), tables, sinks, force_drop)


def plus(spec, tables=(), sinks=(), force_drop=None):
    """`spec` plus these tables and sinks (replacing those of the same name)."""
    spec = dict(spec)
    names = {unqualified(t["name"]) for t in tables}
    spec["tables"] = [t for t in spec["tables"] if unqualified(t["name"]) not in names] + list(tables)
    names = {s["name"] for s in sinks}
    spec["sinks"] = [s for s in spec["sinks"] if s["name"] not in names] + list(sinks)
    if force_drop:
        spec["force_drop"] = force_drop
    return spec


def unqualified(name):
    """A table's name without its schema (the tests' tables are in public)."""
    return name.removeprefix("public.")


def without(spec, sinks=(), tables=()):
    return {**spec, "sinks": [s for s in spec["sinks"] if s["name"] not in sinks],
            "tables": [t for t in spec["tables"] if unqualified(t["name"]) not in tables]}


def events(pg, event_table, table=None):
    """(operation, id) of each event of an event table (of one source table), in delivery order."""
    rows = pg.execute(f"SELECT operation, (event -> 'after' ->> 'id')::int, table_name FROM {event_table} "
                      "ORDER BY event_id").fetchall()
    return [(op, i) for op, i, t in rows if table is None or t.endswith(table)]


def slots(pg):
    return {r[0] for r in pg.execute("SELECT slot_name FROM pg_replication_slots").fetchall()}


def sink_names(pg):
    return {r[0] for r in pg.execute("SELECT sink_name FROM _cdc_sinks").fetchall()}


@pytest.fixture
def cleanup(pg):
    """Sinks and event tables a test declares, dropped after it."""
    made = {"sinks": [], "tables": []}
    yield made
    with connect() as c:
        for n in made["sinks"]:
            c.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (n, n))
        for t in made["tables"]:
            c.execute(f"DROP TABLE IF EXISTS {t}")


def table_sink(name, event_table, tables=None, **extra):
    config = {"table": event_table, **extra}
    if tables is not None:
        config["tables"] = tables
    return {"name": name, "type": "table", "config": config}


def test_a_spec_is_applied_exported_and_reconciled_again_as_a_no_op(pg, cleanup, unique):
    t1, t2 = f"rec_a_{unique}", f"rec_b_{unique}"
    for t in (t1, t2):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
        pg.execute(f"INSERT INTO {t} SELECT g, 'r' FROM generate_series(1, 20) g")
    e1, e2, s1, s2 = f"rec_e1_{unique}", f"rec_e2_{unique}", f"rec_s1_{unique}", f"rec_s2_{unique}"
    cleanup["sinks"] += [s1, s2]
    cleanup["tables"] += [e1, e2]
    spec = with_objects(pg, tables=[{"name": f"public.{t1}"}, {"name": f"public.{t2}",
                                                               "config": {"operations": ["INSERT"]}}],
                        sinks=[table_sink(s1, e1, tables=[t1]), table_sink(s2, e2, tables=[t1, t2])])
    before = slots(pg)

    plan = reconcile(pg, spec)
    assert plan["dry_run"] is True and plan["applied"] is False and plan["changes"] == 4, plan
    assert {(s["sink"], s["action"]) for s in plan["sinks"]} == {(s1, "create"), (s2, "create")}, plan
    assert sorted((s["sink"], s["table"], s["kind"]) for s in plan["snapshots"]) == sorted(
        [(s1, f"public.{t1}", "initial"), (s2, f"public.{t1}", "initial"), (s2, f"public.{t2}", "initial")])
    # A dry run changes nothing.
    assert not {s1, s2} & sink_names(pg) and slots(pg) == before
    assert pg.execute("SELECT count(*) FROM _cdc_publications WHERE table_oid IN (%s::regclass, %s::regclass)",
                      (t1, t2)).fetchone()[0] == 0

    applied = reconcile(pg, spec, apply=True)
    assert applied == {**plan, "dry_run": False, "applied": True}, applied
    assert {s1, s2} <= sink_names(pg)
    assert len(slots(pg) - before) == 2, "each new sink has its slot, made by the call"
    wait_for(lambda: len(events(pg, e2)) == 40, timeout=60, what="the snapshots delivered")
    pg.execute(f"INSERT INTO {t1} VALUES (21, 'c')")
    pg.execute(f"INSERT INTO {t2} VALUES (21, 'c')")
    wait_for(lambda: len(events(pg, e2)) == 42 and len(events(pg, e1)) == 21, timeout=60, what="the changes")
    # Each row once, as a READ of the snapshot or as its INSERT after it.
    assert sorted(events(pg, e1)) == sorted([("READ", i) for i in range(1, 21)] + [("INSERT", 21)])
    for t in (t1, t2):
        assert sorted(events(pg, e2, t)) == sorted([("READ", i) for i in range(1, 21)] + [("INSERT", 21)])

    # The export round-trips: reconciling it, or the spec again, changes nothing.
    exported = export(pg)
    again = reconcile(pg, exported, apply=True)
    assert again["changes"] == 0 and again["applied"] is False, again
    assert all(o["action"] == "nothing" for o in again["tables"] + again["sinks"]), again
    assert reconcile(pg, spec, apply=True)["changes"] == 0


def test_export_hides_secrets_and_its_placeholder_keeps_them(pg, cleanup, unique):
    t = f"rec_sec_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    name = f"rec_sec_{unique}"
    cleanup["sinks"].append(name)
    secret = "s3cr3t-" + unique
    kafka = {"name": name, "type": "kafka",
             "config": {"bootstrap_servers": "127.0.0.1:1", "topic": f"rec-sec-{unique}", "tables": [t],
                        "properties": {"sasl.username": "app", "sasl.password": secret,
                                       "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}}}
    reconcile(pg, with_objects(pg, tables=[{"name": t}], sinks=[kafka]), apply=True)
    exported = export(pg)
    assert secret not in json.dumps(exported)
    mine = next(s for s in exported["sinks"] if s["name"] == name)
    assert mine["config"]["properties"] == "(unchanged)" and mine["config"]["topic"] == f"rec-sec-{unique}", mine
    assert reconcile(pg, exported, apply=True)["changes"] == 0
    stored = pg.execute("SELECT config FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
    assert stored["properties"]["sasl.password"] == secret, "the placeholder kept the live value"
    # A change next to the placeholder applies, and keeps the secret.
    mine["config"]["linger_ms"] = 7
    plan = reconcile(pg, exported, apply=True)
    changed = next(s for s in plan["sinks"] if s["sink"] == name)
    assert changed == {"sink": name, "type": "kafka", "action": "alter",
                       "diff": {"linger_ms": {"from": None, "to": 7}}}, changed
    stored = pg.execute("SELECT config FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]
    assert stored["properties"]["sasl.password"] == secret and stored["linger_ms"] == 7
    # A secret changed shows as changed, never its value.
    mine["config"]["properties"] = {**kafka["config"]["properties"], "sasl.password": "other-" + unique}
    plan = reconcile(pg, exported)
    assert "other-" + unique not in json.dumps(plan) and secret not in json.dumps(plan)
    assert next(s for s in plan["sinks"] if s["sink"] == name)["diff"]["properties"] == {
        "from": "(secret)", "to": "(secret)"}
    # The placeholder for a sink that does not exist yet is refused.
    other = {**mine, "name": f"rec_sec2_{unique}", "config": {**mine["config"], "properties": "(unchanged)"}}
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"spec\.sinks\[\d+\] .*does not exist yet"):
        reconcile(pg, with_objects(pg, sinks=[other]))


def test_a_changed_spec_alters_in_place_and_back_fills_what_a_sink_now_carries(pg, cleanup, unique):
    t1, t2 = f"rec_c1_{unique}", f"rec_c2_{unique}"
    for t in (t1, t2):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
        pg.execute(f"INSERT INTO {t} SELECT g, 'r' FROM generate_series(1, 10) g")
    name, et = f"rec_c_{unique}", f"rec_ce_{unique}"
    cleanup["sinks"].append(name)
    cleanup["tables"].append(et)
    tables = [{"name": t1}, {"name": t2}]
    reconcile(pg, with_objects(pg, tables=tables, sinks=[table_sink(name, et, tables=[t1])]), apply=True)
    wait_for(lambda: len(events(pg, et)) == 10, timeout=60, what="the first snapshot")
    slot = pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0]

    spec = with_objects(pg, tables=[{"name": t1, "config": {"operations": ["INSERT", "UPDATE"]}}, {"name": t2}],
                        sinks=[table_sink(name, et, tables=[t1, t2])])
    plan = reconcile(pg, spec, apply=True)
    mine = next(s for s in plan["sinks"] if s["sink"] == name)
    assert mine["action"] == "alter" and mine["diff"] == {"tables": {"from": [t1], "to": [t1, t2]}}, mine
    altered = next(t for t in plan["tables"] if t["table"] == f"public.{t1}")
    assert altered == {"table": f"public.{t1}", "action": "alter",
                       "diff": {"operations": {"from": None, "to": ["INSERT", "UPDATE"]}}}, altered
    assert [(s["sink"], s["kind"]) for s in plan["snapshots"]] == [(name, "added")], plan
    pg.execute(f"INSERT INTO {t2} VALUES (11, 'c')")
    wait_for(lambda: len(events(pg, et, t2)) == 11, timeout=60, what="the back-fill and the change")
    assert sorted(events(pg, et, t2)) == sorted([("READ", i) for i in range(1, 11)] + [("INSERT", 11)])
    assert len(events(pg, et, t1)) == 10, "the table it carried is not read again"
    assert pg.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0] == slot
    assert pg.execute("SELECT config FROM _cdc_publications WHERE table_oid = %s::regclass",
                      (t1,)).fetchone()[0] == {"operations": ["INSERT", "UPDATE"]}


def drop_entry(plan, sink):
    return next(s for s in plan["sinks"] if s["sink"] == sink)


def test_drops_are_guarded_and_force_drop_lifts_the_guard(pg, cleanup, unique):
    t, extra = f"rec_g_{unique}", f"rec_gx_{unique}"
    for x in (t, extra):
        pg.execute(f"CREATE TABLE {x} (id int PRIMARY KEY)")
    held, idle, et_h, et_i = f"rec_gh_{unique}", f"rec_gi_{unique}", f"rec_geh_{unique}", f"rec_gei_{unique}"
    cleanup["sinks"] += [held, idle]
    cleanup["tables"] += [et_h, et_i]
    full = with_objects(pg, tables=[{"name": t}],
                        sinks=[table_sink(held, et_h, tables=[t]), table_sink(idle, et_i, tables=[t])])
    reconcile(pg, full, apply=True)
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    wait_for(lambda: len(events(pg, et_h)) == 1 and len(events(pg, et_i)) == 1, timeout=60, what="delivered")
    # One sink holds a change it has not delivered: paused, then a row.
    pg.execute("SELECT cdc_pause_sink(%s)", (held,))
    wait_for(lambda: pg.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                (f"pg_cdc worker: {held}",)).fetchone()[0] == 0, what="its worker gone")
    pg.execute(f"INSERT INTO {t} VALUES (2)")
    wait_for(lambda: len(events(pg, et_i)) == 2, timeout=60, what="the other sink delivered it")

    # Leaving both out (and adding a table): refused whole, for the one that holds a change.
    spec = plus(without(full, sinks=[held, idle]), tables=[{"name": extra}])
    wait_for(lambda: "blocked" not in drop_entry(reconcile(pg, spec), idle), timeout=60,
             what="the delivering sink's slot confirmed (its drop not blocked)")
    plan = reconcile(pg, spec)
    assert "holds changes it has not delivered" in drop_entry(plan, held)["blocked"], plan
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=f'leaves out sink "{held}"'):
        reconcile(pg, spec, apply=True)
    assert {held, idle} <= sink_names(pg), "nothing applied"
    assert pg.execute("SELECT count(*) FROM _cdc_publications WHERE table_oid = %s::regclass",
                      (extra,)).fetchone()[0] == 0, "nothing applied"

    # A captured table a declared sink carries is not dropped either.
    keep_idle = {**without(full, sinks=[held], tables=[t]), "force_drop": {"sinks": [held]}}
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=f"sinks of the spec carry it: {idle}"):
        reconcile(pg, keep_idle, apply=True)

    # force_drop lifts the guard for what it names; the sink that delivered everything needs none.
    spec["force_drop"] = {"sinks": [held]}
    plan = reconcile(pg, spec, apply=True)
    assert plan["applied"] is True
    assert not {held, idle} & sink_names(pg)
    assert pg.execute("SELECT count(*) FROM _cdc_publications WHERE table_oid = %s::regclass",
                      (extra,)).fetchone()[0] == 1
    # The same spec again: nothing more to do (force_drop names a sink that is gone).
    assert reconcile(pg, spec, apply=True)["changes"] == 0


def test_a_bad_spec_is_refused_whole_with_the_path(pg, cleanup, unique):
    t = f"rec_bad_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    taken = f"rec_taken_{unique}"
    pg.execute(f"CREATE TABLE {taken} (id int)")
    cleanup["tables"].append(taken)
    base = export(pg)
    good = {"name": f"rec_bad_s_{unique}", "type": "table", "config": {"table": f"rec_bad_e_{unique}", "tables": [t]}}
    cases = [
        ({**base, "sink": []}, psycopg.errors.InvalidParameterValue, r'unknown key "sink" in spec'),
        (with_objects(pg, sinks=[{**good, "type": "kafak"}]), psycopg.errors.InvalidParameterValue,
         r'spec\.sinks\[\d+\] \("rec_bad_s_\w+"\): unknown sink type "kafak"'),
        (with_objects(pg, tables=[{"name": f"no_such_{unique}"}]), psycopg.errors.UndefinedTable,
         r'spec\.tables\[\d+\]\.name: relation "no_such_\w+" does not exist'),
        (with_objects(pg, tables=[{"name": t}, {"name": f"public.{t}"}]), psycopg.errors.DuplicateObject,
         r"declared twice"),
        ({**base, "sinks": base["sinks"] + [good, good]}, psycopg.errors.DuplicateObject, r"declared twice"),
        (with_objects(pg, tables=[{"name": t, "config": {"include_columns": ["idd"]}}]),
         psycopg.errors.UndefinedColumn, r'spec\.tables\[\d+\] \(".*"\): config\.include_columns\[0\]'),
        (with_objects(pg, sinks=[{**good, "config": {**good["config"], "tables": [f"no_such_{unique}"]}}]),
         psycopg.errors.UndefinedTable, r"spec\.sinks\[\d+\]\.config\.tables\[0\]"),
    ]
    before_slots, before_sinks = slots(pg), sink_names(pg)
    for spec, error, message in cases:
        for apply in (False, True):
            with pytest.raises(error, match=message):
                reconcile(pg, spec, apply=apply)
    # Refused when applied only: the event table exists. The slot the call made for the new sink
    # first is dropped again.
    spec = with_objects(pg, tables=[{"name": t}],
                        sinks=[good, {**good, "name": f"rec_bad_s2_{unique}", "config": {"table": taken}}])
    assert reconcile(pg, spec)["changes"] == 3
    with pytest.raises(psycopg.errors.DuplicateTable, match=r'spec\.sinks\[\d+\] \("rec_bad_s2_\w+"\)'):
        reconcile(pg, spec, apply=True)
    assert slots(pg) == before_slots and sink_names(pg) == before_sinks
    assert pg.execute("SELECT to_regclass(%s)", (good["config"]["table"],)).fetchone()[0] is None
    assert pg.execute("SELECT count(*) FROM _cdc_publications WHERE table_oid = %s::regclass",
                      (t,)).fetchone()[0] == 0
    # Applying inside a transaction block is refused; a dry run there is fine.
    with connect() as c:
        with pytest.raises(psycopg.errors.ActiveSqlTransaction):
            with c.transaction():
                c.execute("SELECT cdc_reconcile(%s::jsonb, false)", (json.dumps(base),))
        with c.transaction():
            assert c.execute("SELECT cdc_reconcile(%s::jsonb)", (json.dumps(base),)).fetchone()[0]["changes"] == 0
