"""The PostgreSQL apply sink: the stream applied to tables of another database of the same cluster, through
the sink's own libpq connection as a role that must give a password (SCRAM; scripts/pg.sh puts its pg_hba
line first), read from a password file.

The oracle is PostgreSQL itself: every row of the source table and of the target table as the row's text
output (`t::text`, so numeric scale, json whitespace, array and timestamp text must match exactly), and each
column's type as format_type prints it. Nothing of the sink's own bookkeeping is trusted."""
import contextlib
import json
import os
import random
import stat
import tempfile
import time

import psycopg
import pytest

from conftest import PG_DSN, connect, sigkill_while_writing, sink_state, typed_sinks, wait_for

ROLE = "cdc_apply_test"
PASSWORD = "apply-secret-9f3b"


@pytest.fixture(scope="module")
def target():
    """A database owned by the apply role, and a password file the server's OS user can read."""
    db = "pg_cdc_apply_target"
    with connect() as c:
        if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone():
            c.execute(f"CREATE ROLE {ROLE} LOGIN")
        c.execute("SET password_encryption = 'scram-sha-256'")
        c.execute(f"ALTER ROLE {ROLE} PASSWORD '{PASSWORD}'")
        c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {db} OWNER {ROLE}")
        c.execute("SELECT pg_reload_conf()")
    d = tempfile.mkdtemp(prefix="pg_cdc_apply_")
    os.chmod(d, 0o755)
    passfile = os.path.join(d, "pgpass")
    host, port = os.environ.get("PGHOST", "127.0.0.1"), os.environ.get("PGPORT", "55432")
    with open(passfile, "w") as f:
        f.write(f"{host}:{port}:{db}:{ROLE}:{PASSWORD}\n")
    os.chmod(passfile, stat.S_IRUSR | stat.S_IWUSR)
    os.system(f"chown postgres {passfile}")
    conninfo = f"host={host} port={port} dbname={db} user={ROLE} passfile={passfile}"
    yield {"db": db, "conninfo": conninfo, "dsn": PG_DSN.replace("dbname=postgres", f"dbname={db}")}
    with connect() as c:
        c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


@pytest.fixture
def apply_sinks(pg):
    with typed_sinks(pg, "postgres") as s:
        yield s


def add(pg, sinks, name, config):
    return sinks.add(name, config)


def rows_of(dsn, table, order="id"):
    with psycopg.connect(dsn, autocommit=True) as c:
        return [r[0] for r in c.execute(f"SELECT t::text FROM {table} t ORDER BY {order}").fetchall()]


def types_of(dsn, table):
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                         "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                         (table,)).fetchall()


def differences(source, target):
    """Rows in one and not the other (as text), both ways."""
    s, t = set(source), set(target)
    return sorted(s - t)[:5], sorted(t - s)[:5]


def converged(target, table, what, timeout=90, order="id", tick=None):
    def same():
        if tick:
            tick()
        try:
            return rows_of(PG_DSN, table, order) == rows_of(target["dsn"], f"public.{table}", order)
        except psycopg.errors.UndefinedTable:
            return False
    try:
        wait_for(same, timeout=timeout, what=what)
    except AssertionError:
        with connect() as c:
            states = c.execute("SELECT sink_name, state, last_error FROM _cdc_sinks").fetchall()
        raise AssertionError(f"{what}: source-only, target-only rows: "
                             f"{differences(rows_of(PG_DSN, table, order), rows_of(target['dsn'], table, order))}; "
                             f"sinks: {states}")


def test_every_type_arrives_as_it_is_in_the_source(pg, apply_sinks, target, unique):
    """A table of many types, created in the target from the source's schema, its rows inserted, updated,
    deleted and truncated: each row's text output and each column's type are the source's."""
    t = f"ap_types_{unique}"
    with psycopg.connect(target["dsn"], autocommit=True) as c:
        c.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    pg.execute("DO $$ BEGIN CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy'); "
               "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    pg.execute(f"""CREATE TABLE {t} (
        id bigint PRIMARY KEY, n numeric(30,10), big numeric, f8 float8, f4 real, s text, vc varchar(20),
        b bytea, ts timestamptz, tsl timestamp, d date, iv interval, u uuid, j json, jb jsonb,
        ai int[], at text[], a2 int[][], ok bool, m mood, ip inet, tm time, ab bytea[])""")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    add(pg, apply_sinks, f"ap_types_{unique}", {"connection": target["conninfo"], "tables": [t]})
    rows = [
        (1, "12345678901234567890.0123456789", "3.14159265358979323846264338327950288419716939937510", 1.5e300,
         -0.25, "plain", "x", b"\x00\x01\xff", "2024-03-15 14:23:45.123456+00", "2024-03-15 14:23:45",
         "2024-02-29", "1 year 2 mons 3 days 04:05:06.789", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
         '{"b": 1,   "a": [1, 2.50]}', '{"z": {"y": [true, null]}, "a": 1.10}', [1, None, 3],
         ["a,b", 'q"uote', "back\\slash", None, "NULL", ""], [[1, 2], [3, 4]], True, "happy", "10.1.2.3/8",
         "23:59:59.999999", [b"\x00", None]),
        (2, "-0.0000000001", "NaN", float("inf"), float("-inf"), "ünïcødé ✓ 'single' \"double\"", "",
         b"", "0044-03-15 12:00:00+00 BC", "infinity", "4713-01-01 BC", "-1 days", None, "[]", '"str"',
         [], [], None, False, "sad", "::1", "00:00", []),
        (3, None, "0", float("nan"), 0.0, None, None, None, "-infinity", None, None, None, None, None, None,
         None, None, None, None, None, None, None, None),
    ]
    cols = "id, n, big, f8, f4, s, vc, b, ts, tsl, d, iv, u, j, jb, ai, at, a2, ok, m, ip, tm, ab"
    marks = ", ".join(["%s"] * 23)
    with pg.transaction():
        for r in rows:
            pg.execute(f"INSERT INTO {t} ({cols}) VALUES ({marks})", r)
    pg.execute(f"UPDATE {t} SET n = n * 2, jb = jb || '{{\"new\": 1}}', at = array_append(at, 'x') WHERE id = 1")
    pg.execute(f"UPDATE {t} SET id = 20 WHERE id = 2")  # the key moves
    pg.execute(f"INSERT INTO {t} (id, s) SELECT g, 'bulk ' || g FROM generate_series(100, 400) g")
    pg.execute(f"DELETE FROM {t} WHERE id BETWEEN 100 AND 150")
    converged(target, t, "the target has the source's rows")
    assert types_of(PG_DSN, t) == types_of(target["dsn"], f"public.{t}")
    pg.execute(f"TRUNCATE {t}")
    pg.execute(f"INSERT INTO {t} (id, s) VALUES (7, 'after the truncate')")
    converged(target, t, "truncated, then one row")
    assert len(rows_of(target["dsn"], t)) == 1
    pg.execute("SELECT cdc_disable(%s)", (t,))


def shuffled_run(pg, apply_sinks, target, unique, seed, name, one_transaction=False):
    """A random workload on 200 keys (inserts, updates, deletes, key moves, one TRUNCATE) applied by a
    sink that reorders and repeats what it is sent (cdc.test_apply_shuffle). Returns the table and a
    function that commits a small transaction of the sink's other table (a flush, which lets what the
    sink held back go). `one_transaction`: the 400 transactions' statements in one transaction, so the
    sink is sent them in a few large pieces whatever the speed of its reads."""
    t, ticks = f"{name}_{unique}", f"{name}_tick_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int, note text, tags text[], doc jsonb)")
    pg.execute(f"CREATE TABLE {ticks} (id int PRIMARY KEY, n int)")
    for x in (t, ticks):
        pg.execute("SELECT cdc_enable(%s)", (x,))
    # Read when the sink opens (which may be after it is "running"): the caller resets it at its end.
    pg.execute(f"ALTER SYSTEM SET cdc.test_apply_shuffle = {seed}")
    pg.execute("SELECT pg_reload_conf()")
    time.sleep(0.5)
    add(pg, apply_sinks, f"{name}_{unique}", {"connection": target["conninfo"], "tables": [t, ticks]})
    wait_for(lambda: sink_state(pg, f"{name}_{unique}")[0] == "running", what="sink running")
    rnd = random.Random(abs(seed))
    outer = pg.transaction() if one_transaction else contextlib.nullcontext()
    with outer:
        _shuffled_workload(pg, t, rnd)

    def tick():
        pg.execute(f"INSERT INTO {ticks} VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET n = {ticks}.n + 1")
    return t, ticks, tick


def _shuffled_workload(pg, t, rnd):
    for n in range(400):
        with pg.transaction():
            for _ in range(rnd.randint(1, 8)):
                k, op = rnd.randrange(200), rnd.random()
                if op < 0.45:
                    pg.execute(f"INSERT INTO {t} VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
                               "SET v = EXCLUDED.v, note = EXCLUDED.note",
                               (k, n, f"n{n}", [f"t{n}", None], json.dumps({"n": n, "k": [k, 1.50]})))
                elif op < 0.75:
                    pg.execute(f"UPDATE {t} SET v = v + 1, doc = doc || %s WHERE id = %s",
                               (json.dumps({"u": n}), k))
                elif op < 0.92:
                    pg.execute(f"DELETE FROM {t} WHERE id = %s", (k,))
                else:
                    pg.execute(f"UPDATE {t} SET id = %s WHERE id = %s AND NOT EXISTS "
                               f"(SELECT 1 FROM {t} WHERE id = %s)", (k + 1000, k, k + 1000))
        if n == 200:
            pg.execute(f"TRUNCATE {t}")


def test_a_shuffled_and_repeated_stream_leaves_the_source_table(pg, apply_sinks, target, unique):
    """The sink applies its stream reordered, with repeats, some changes held back for later units (the
    test setting cdc.test_apply_shuffle): the row versions and tombstones leave the target equal to the
    source. Negative control: the same with the versions ignored (a negative seed) leaves it different,
    so the shuffle happened and the oracle sees what it does. The control's workload is one transaction:
    sent transaction by transaction (a sink that reads as fast as they commit), a change held back was
    let go before the next change of its key came, and the control passed by chance."""
    try:
        t, ticks, tick = shuffled_run(pg, apply_sinks, target, unique, 7919, "ap_shuf")
        converged(target, t, "the shuffled stream converged", timeout=120, tick=tick)
        assert len(rows_of(PG_DSN, t)) > 50
        for x in (t, ticks):
            pg.execute("SELECT cdc_disable(%s)", (x,))

        bad, bad_ticks, tick_bad = shuffled_run(pg, apply_sinks, target, unique, -7919, "ap_nover",
                                                one_transaction=True)
        with pytest.raises(AssertionError, match="source-only, target-only rows"):
            converged(target, bad, "versions ignored", timeout=15, tick=tick_bad)
        for x in (bad, bad_ticks):
            pg.execute("SELECT cdc_disable(%s)", (x,))
    finally:
        pg.execute("ALTER SYSTEM RESET cdc.test_apply_shuffle")
        pg.execute("SELECT pg_reload_conf()")


def test_the_target_follows_the_sources_ddl(pg, apply_sinks, target, unique):
    """ADD COLUMN with a default (rows already there read it), RENAME COLUMN, a type widened, DROP COLUMN:
    the target table follows the schema history, its rows and column types the source's; then the table
    renamed: its target table follows by the source table's OID."""
    t = f"ap_ddl_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, qty int, old_name text, gone text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    add(pg, apply_sinks, f"ap_ddl_{unique}", {"connection": target["conninfo"], "tables": [t]})
    pg.execute(f"INSERT INTO {t} SELECT g, g, 'n' || g, 'x' FROM generate_series(1, 20) g")
    converged(target, t, "rows before the DDL")
    pg.execute(f"ALTER TABLE {t} ADD COLUMN status text DEFAULT 'new'")
    pg.execute(f"ALTER TABLE {t} RENAME COLUMN old_name TO name")
    pg.execute(f"ALTER TABLE {t} ALTER COLUMN qty TYPE bigint")
    pg.execute(f"ALTER TABLE {t} DROP COLUMN gone")
    pg.execute(f"INSERT INTO {t} (id, qty, name) VALUES (21, 9000000000, 'big')")
    pg.execute(f"UPDATE {t} SET status = 'old' WHERE id <= 3")
    converged(target, t, "rows after the DDL")
    assert types_of(PG_DSN, t) == types_of(target["dsn"], f"public.{t}")
    # The source table renamed: its target table is renamed with it, rows and versions kept.
    renamed = f"ap_ren_{unique}"
    pg.execute(f"ALTER TABLE {t} RENAME TO {renamed}")
    pg.execute(f"UPDATE {renamed} SET name = 'after rename' WHERE id = 5")
    pg.execute(f"DELETE FROM {renamed} WHERE id = 6")
    converged(target, renamed, "rows after the table's rename")
    with psycopg.connect(target["dsn"], autocommit=True) as c:
        assert c.execute("SELECT to_regclass(%s)", (f"public.{t}",)).fetchone()[0] is None
    # Disabled and enabled again, the table's history starts over at version 1: its next DDL is
    # still followed (the target's recorded version belongs to the old history). Four times: the
    # worker may read its catalog between the disable and the enable, and the changes after the
    # enable must not be decoded with that copy (regression: about one round in three lost the
    # column, its changes and the added snapshot's rows; see the capture message in pipeline.rs).
    for n in range(4):
        pg.execute("SELECT cdc_disable(%s)", (renamed,))
        pg.execute("SELECT cdc_enable(%s)", (renamed,))
        pg.execute(f"ALTER TABLE {renamed} ADD COLUMN late{n} text")
        pg.execute(f"UPDATE {renamed} SET late{n} = 'yes' WHERE id <= 2 + {n}")
        converged(target, renamed, f"rows after the history started over ({n + 1})", timeout=30)
        assert types_of(PG_DSN, renamed) == types_of(target["dsn"], f"public.{renamed}")
    pg.execute("SELECT cdc_disable(%s)", (renamed,))


def test_sigkill_during_delivery_loses_nothing(pg, apply_sinks, target, unique):
    """kill -9 of the worker while it applies: the target ends with exactly the source's rows (a unit
    applied twice is a no-op: the versions)."""
    t = f"ap_kill_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    add(pg, apply_sinks, f"ap_kill_{unique}", {"connection": target["conninfo"], "tables": [t]})

    def applied():
        try:
            return len(rows_of(target["dsn"], t)) > 50
        except psycopg.Error:
            return False
    sigkill_while_writing(pg, t, 10, ready=applied, pause=0.01)
    with connect() as c:
        converged(target, t, "every committed row, once", timeout=120)
        c.execute("SELECT cdc_disable(%s)", (t,))


def test_errors_an_operator_sees(pg, apply_sinks, target, unique):
    def refused(cfg):
        with pytest.raises(psycopg.Error) as e:
            pg.execute("SELECT cdc_add_sink(%s, 'postgres', %s::jsonb)", (f"apx_{unique}", json.dumps(cfg)))
        return e.value.sqlstate, e.value.diag.message_primary

    inline = target["conninfo"].split(" passfile=")[0] + f" password={PASSWORD}"
    state, msg = refused({"connection": inline})
    assert (state, msg) == ("22023", "config.connection must not hold a password")
    assert refused({})[0] == "22023"
    assert refused({"connection": "host='unterminated"})[0] == "22023"

    t, keyless = f"ape_{unique}", f"apk_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute(f"CREATE TABLE {keyless} (v int)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    pg.execute("SELECT cdc_enable(%s, '{\"include_before_image\": true}')", (keyless,))
    no_password = add(pg, apply_sinks, f"apn_{unique}", {
        "connection": target["conninfo"].split(" passfile=")[0] + " passfile=/nonexistent", "tables": [t]})
    no_table = add(pg, apply_sinks, f"apt_{unique}", {
        "connection": target["conninfo"], "tables": [t], "create_tables": False, "schema": "nowhere"})
    no_key = add(pg, apply_sinks, f"apk_{unique}", {"connection": target["conninfo"], "tables": [keyless]})
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    pg.execute(f"INSERT INTO {keyless} VALUES (1)")
    state = wait_for(lambda: (s := sink_state(pg, no_password))[0] == "retrying" and s, timeout=60,
                     what="no password: retrying")
    assert "password" in state[1] and PASSWORD not in state[1], state
    state = wait_for(lambda: (s := sink_state(pg, no_table))[0] == "error" and s, timeout=60,
                     what="missing target table: error")
    assert f"target table nowhere.{t} does not exist (create_tables is false)" in state[1], state
    state = wait_for(lambda: (s := sink_state(pg, no_key))[0] == "error" and s, timeout=60,
                     what="keyless table: error")
    assert "has no key" in state[1], state
    for x in (t, keyless):
        pg.execute("SELECT cdc_disable(%s)", (x,))


def test_applies_into_the_source_database_too(pg, apply_sinks, unique):
    """The target may be the source database itself (another schema): the sink's own writes are not
    captured, so they bring no new work."""
    t = f"ap_same_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v numeric)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    host, port = os.environ.get("PGHOST", "127.0.0.1"), os.environ.get("PGPORT", "55432")
    add(pg, apply_sinks, f"ap_same_{unique}", {
        "connection": f"host={host} port={port} dbname=postgres user=postgres", "tables": [t],
        "schema": f"replica_{unique}"})
    pg.execute(f"INSERT INTO {t} SELECT g, g / 3.0 FROM generate_series(1, 100) g")
    pg.execute(f"DELETE FROM {t} WHERE id > 90")
    copy = f"replica_{unique}.{t}"
    wait_for(lambda: pg.execute(f"SELECT to_regclass('{copy}') IS NOT NULL").fetchone()[0]
             and rows_of(PG_DSN, t) == rows_of(PG_DSN, copy), what="the copy in the same database")
    applied = pg.execute("SELECT applied_lsn FROM cdc_apply.pipelines WHERE sink = %s",
                         (f"ap_same_{unique}",)).fetchone()[0]
    time.sleep(2)  # nothing more to apply: the sink's own writes did not come back as work
    assert pg.execute("SELECT applied_lsn FROM cdc_apply.pipelines WHERE sink = %s",
                      (f"ap_same_{unique}",)).fetchone()[0] == applied
    pg.execute("SELECT cdc_drop_sink(%s)", (f"ap_same_{unique}",))
    pg.execute("SELECT cdc_disable(%s)", (t,))
    pg.execute(f"DROP SCHEMA replica_{unique} CASCADE")
    pg.execute("DROP SCHEMA cdc_apply CASCADE")
