"""A DBA who is not a superuser: a member of cdc_admin (no REPLICATION, no right on pg_cdc's catalog)
captures and streams a table it may read; the files its sink configs name stay inside
cdc.admin_file_dir; a PostgreSQL sink it adds reaches no server without a password, and never this
server as a superuser. The refusals of the SQL functions themselves are in pg_test/sql/delegation.sql.

Oracles: Kafka read back by an independent consumer; the apply target read with its own connection;
for each refusal, the same config added by a superuser works (so it is the adder that was refused, not
a broken config)."""
import json
import os
import shutil
import stat
import tempfile
import uuid

import psycopg
import pytest

from conftest import BOOTSTRAP, connect, consume, delete_topics, server_settings, sink_state, wait_for, wait_setting

ADMIN = "cdc_e2e_admin"
SUPER = "cdc_super_test"  # scripts/pg.sh puts a SCRAM pg_hba line first for it
SUPER_PASSWORD = "super-secret-51c2"
APPLY = "cdc_apply_test"  # likewise; not a superuser
APPLY_PASSWORD = "apply-secret-9f3b"


@pytest.fixture(scope="module")
def admin():
    """A role that is a member of cdc_admin and nothing more, with a schema of its own."""
    schema = "cdc_e2e_delegation"
    with connect() as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_cdc")
        if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ADMIN,)).fetchone():
            c.execute(f"CREATE ROLE {ADMIN} NOLOGIN")
        c.execute(f"GRANT cdc_admin TO {ADMIN}")
        c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        c.execute(f"CREATE SCHEMA {schema}")
        c.execute(f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {ADMIN}")
        row = c.execute("SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = %s", (ADMIN,)).fetchone()
        assert row == (False, False)
    yield schema
    with connect() as c:
        for (name,) in c.execute("SELECT sink_name FROM _cdc_sinks WHERE added_by = %s::regrole", (ADMIN,)).fetchall():
            c.execute("SELECT cdc_drop_sink(%s)", (name,))
        c.execute("SELECT cdc_disable(table_oid::regclass) FROM _cdc_publications p JOIN pg_class c ON c.oid = p.table_oid "
                  "WHERE c.relnamespace = %s::regnamespace", (schema,))
        c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        c.execute(f"DROP OWNED BY {ADMIN}")
        c.execute(f"DROP ROLE IF EXISTS {ADMIN}")


@pytest.fixture(scope="module")
def admin_dir():
    """cdc.admin_file_dir: a directory the server's user reads, set for the module."""
    d = tempfile.mkdtemp(prefix="pg_cdc_admin_files_")
    os.chmod(d, 0o755)
    os.system(f"chown postgres {d}")
    with server_settings({"cdc.admin_file_dir": d}):
        yield d
    shutil.rmtree(d, ignore_errors=True)


def set_admin_dir(conn, value):
    """Sets cdc.admin_file_dir (the fixture resets it) and waits until `conn` has it."""
    conn.execute(f"ALTER SYSTEM SET cdc.admin_file_dir = '{value}'")
    conn.execute("SELECT pg_reload_conf()")
    wait_setting(conn, "cdc.admin_file_dir", value)


def as_admin(conn, sql, params=()):
    """Runs `sql` as the admin role, back to the superuser afterwards."""
    conn.execute(f"SET ROLE {ADMIN}")
    try:
        return conn.execute(sql, params)
    finally:
        conn.execute("RESET ROLE")


def private_file(path, content):
    with open(path, "w") as f:
        f.write(content)
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    os.system(f"chown postgres {path}")
    return path


def test_an_admin_that_is_not_a_superuser_streams_a_table_it_may_read(admin, unique):
    table, sink, topic = f"{admin}.orders_{unique}", f"e2e_admin_{unique}", f"e2e-admin-{unique}"
    with connect() as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, note text)")
        c.execute(f"GRANT SELECT ON {table} TO {ADMIN}")
        c.execute(f"INSERT INTO {table} VALUES (1, 'before')")
        try:
            as_admin(c, "SELECT cdc_enable(%s)", (table,))
            as_admin(c, "SELECT cdc_add_sink(%s, 'kafka', %s::jsonb)",
                     (sink, json.dumps({"bootstrap_servers": BOOTSTRAP, "topic": topic, "tables": [table]})))
            # Its slot was made although the role has no REPLICATION.
            assert c.execute("SELECT count(*) FROM pg_replication_slots s JOIN _cdc_sinks k USING (slot_name) "
                             "WHERE k.sink_name = %s", (sink,)).fetchone()[0] == 1
            c.execute(f"INSERT INTO {table} VALUES (2, 'after')")
            got = consume(topic, 2, timeout=60)
            ids = sorted(m["value"]["after"]["id"] for m in got)
            assert ids == [1, 2], "the snapshot row and the change"
            # What it may see of its sink, and what it may not change.
            assert as_admin(c, "SELECT state FROM cdc_status() WHERE sink_name = %s", (sink,)).fetchone() is not None
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                as_admin(c, "SELECT config FROM _cdc_sinks")
        finally:
            as_admin(c, "SELECT cdc_drop_sink(%s) FROM cdc_status() WHERE sink_name = %s", (sink, sink))
            as_admin(c, "SELECT cdc_disable(%s)", (table,))
            delete_topics([topic])


def test_the_files_an_admin_names_stay_inside_the_admin_directory(admin, admin_dir, unique):
    inside = private_file(os.path.join(admin_dir, f"hook_{unique}"), "hook-secret")
    data = None
    with connect() as c:
        wait_setting(c, "cdc.admin_file_dir", admin_dir)
        data = c.execute("SHOW data_directory").fetchone()[0]
        outside = private_file(os.path.join(data, f"hook_outside_{unique}"), "hook-secret")
        link = os.path.join(admin_dir, f"link_{unique}")
        os.symlink(outside, link)
        table = f"{admin}.hooks_{unique}"
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        c.execute(f"GRANT SELECT ON {table} TO {ADMIN}")

        def config(secret_file):
            return json.dumps({"url": "http://127.0.0.1:1/hook", "secret_file": secret_file, "tables": [table]})

        added = []
        try:
            for name, path in [("inside", inside), ("relative", os.path.relpath(inside, data))]:
                sink = f"e2e_file_{name}_{unique}"
                as_admin(c, "SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)", (sink, config(path)))
                added.append(sink)
            for name, path in [("outside", outside), ("link", link), ("data_dir_relative", os.path.basename(outside)),
                               ("dotdot", os.path.join(admin_dir, "..", os.path.basename(admin_dir), "..", "x"))]:
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                    as_admin(c, "SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)", (f"e2e_file_{name}_{unique}", config(path)))
                assert "config.secret_file" in str(e.value), name
            # Negative control: a superuser may name the file outside, as before.
            sink = f"e2e_file_super_{unique}"
            c.execute("SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)", (sink, config(outside)))
            added.append(sink)
            # Not set: no file at all for the admin.
            set_admin_dir(c, "")
            try:
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
                    as_admin(c, "SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)", (f"e2e_file_unset_{unique}", config(inside)))
                assert "cdc.admin_file_dir is not set" in str(e.value)
            finally:
                set_admin_dir(c, admin_dir)
        finally:
            for s in added:
                c.execute("SELECT cdc_drop_sink(%s)", (s,))
            os.unlink(outside)
            os.unlink(link)
            os.unlink(inside)


def apply_sink(c, *, name, table, conninfo, by_admin, state_schema, schema=None):
    cfg = {"connection": conninfo, "tables": [table], "state_schema": state_schema}
    if schema:
        cfg["schema"] = schema
    cfg = json.dumps(cfg)
    if by_admin:
        as_admin(c, "SELECT cdc_add_sink(%s, 'postgres', %s::jsonb)", (name, cfg))
    else:
        c.execute("SELECT cdc_add_sink(%s, 'postgres', %s::jsonb)", (name, cfg))


def test_an_admins_postgres_sink_needs_a_password_and_never_reaches_this_server_as_a_superuser(admin, admin_dir, unique):
    host, port = os.environ.get("PGHOST", "127.0.0.1"), os.environ.get("PGPORT", "55432")
    target_db = f"pg_cdc_deleg_{unique}"
    passfile = private_file(os.path.join(admin_dir, f"pgpass_{unique}"),
                            f"{host}:{port}:*:{SUPER}:{SUPER_PASSWORD}\n{host}:{port}:*:{APPLY}:{APPLY_PASSWORD}\n")
    table = f"{admin}.applied_{unique}"
    sinks = []
    with connect() as c:
        wait_setting(c, "cdc.admin_file_dir", admin_dir)
        c.execute("SET password_encryption = 'scram-sha-256'")
        for role, pw, sup in [(SUPER, SUPER_PASSWORD, "SUPERUSER"), (APPLY, APPLY_PASSWORD, "NOSUPERUSER")]:
            if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                c.execute(f"CREATE ROLE {role} LOGIN")
            c.execute(f"ALTER ROLE {role} {sup} PASSWORD '{pw}'")
        c.execute(f"DROP DATABASE IF EXISTS {target_db} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {target_db} OWNER {APPLY}")
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, note text)")
        c.execute(f"GRANT SELECT ON {table} TO {ADMIN}")
        c.execute(f"INSERT INTO {table} VALUES (1, 'one')")
        as_admin(c, "SELECT cdc_enable(%s)", (table,))
        target = f"host={host} port={port} dbname={target_db} passfile={passfile}"
        cases = {
            # trust: pg_hba trusts postgres on loopback, so no password is asked for.
            "trust": (f"{target} user=postgres", "did not ask for a password"),
            "superuser": (f"{target} user={SUPER}", "superuser's session on this"),
        }
        try:
            for case, (conninfo, why) in cases.items():
                admin_sink, super_sink = f"e2e_pg_{case}_admin_{unique}", f"e2e_pg_{case}_super_{unique}"
                apply_sink(c, name=admin_sink, table=table, conninfo=conninfo, by_admin=True, state_schema=f"st_a_{case}")
                sinks.append(admin_sink)
                state = wait_for(lambda: (s := sink_state(c, admin_sink)) and s[1] and why in s[1] and s,
                                 timeout=60, what=f"{case}: the admin's sink refused")
                assert state[0] in ("retrying", "error"), state
                # Negative control: the same connection, added by a superuser, applies the row.
                apply_sink(c, name=super_sink, table=table, conninfo=conninfo, by_admin=False, state_schema=f"st_s_{case}")
                sinks.append(super_sink)
            with psycopg.connect(f"host={host} port={port} dbname={target_db} user=postgres", autocommit=True) as t:
                bare = table.split(".")[1]
                wait_for(lambda: t.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{admin}.{bare}",)).fetchone()[0]
                         and t.execute(f"SELECT count(*) FROM {admin}.{bare}").fetchone()[0] == 1,
                         timeout=60, what="the superusers' sinks applied the row")
                # The admin's sinks wrote nothing there, not even their bookkeeping.
                assert t.execute("SELECT count(*) FROM pg_namespace WHERE nspname IN ('st_a_trust', 'st_a_superuser')"
                                 ).fetchone()[0] == 0
                # An ordinary role with its password: the admin's sink applies the snapshot row and a change.
                ok = f"e2e_pg_password_admin_{unique}"
                apply_sink(c, name=ok, table=table, conninfo=f"{target} user={APPLY}", by_admin=True,
                           state_schema="st_a_ok", schema="apply_ok")
                sinks.append(ok)
                c.execute(f"INSERT INTO {table} VALUES (2, 'two')")
                wait_for(lambda: t.execute("SELECT to_regclass(%s) IS NOT NULL", (f"apply_ok.{bare}",)).fetchone()[0]
                         and t.execute(f"SELECT array_agg(id ORDER BY id) FROM apply_ok.{bare}").fetchone()[0] == [1, 2],
                         timeout=60, what="the admin's password sink applied both rows")
        finally:
            for s in sinks:
                c.execute("SELECT cdc_drop_sink(%s)", (s,))
            c.execute("SELECT cdc_disable(%s)", (table,))
            c.execute(f"DROP DATABASE IF EXISTS {target_db} WITH (FORCE)")
            c.execute(f"ALTER ROLE {SUPER} NOSUPERUSER")
            os.unlink(passfile)


def test_a_trigger_on_an_admins_event_table_runs_with_the_admins_rights(admin, unique):
    """A table sink's event table belongs to the role that added the sink, who may put a trigger on it;
    the worker, a superuser, writes into it. It writes as the table's owner (a restricted operation), so
    the trigger never runs as the superuser."""
    table, sink = f"{admin}.trig_{unique}", f"e2e_trig_{unique}"
    events, log = f"{admin}.trig_ev_{unique}", f"{admin}.trig_log_{unique}"
    with connect() as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        c.execute(f"GRANT SELECT ON {table} TO {ADMIN}")
        c.execute(f"CREATE TABLE {log} (who text, su text)")
        c.execute(f"GRANT INSERT ON {log} TO PUBLIC")
        try:
            as_admin(c, "SELECT cdc_enable(%s)", (table,))
            as_admin(c, "SELECT cdc_add_sink(%s, 'table', %s::jsonb)",
                     (sink, json.dumps({"table": events, "tables": [table]})))
            as_admin(c, f"""CREATE FUNCTION {admin}.trig_fn_{unique}() RETURNS trigger LANGUAGE plpgsql AS $$
                            BEGIN
                                INSERT INTO {log}
                                SELECT current_user, rolsuper::text FROM pg_roles WHERE rolname = current_user;
                                RETURN NEW;
                            END $$""")
            as_admin(c, f"CREATE TRIGGER spy BEFORE INSERT ON {events} FOR EACH ROW EXECUTE FUNCTION {admin}.trig_fn_{unique}()")
            c.execute(f"INSERT INTO {table} VALUES (1)")
            wait_for(lambda: c.execute(f"SELECT count(*) FROM {events}").fetchone()[0] >= 1, timeout=60,
                     what="the event written")
            assert c.execute(f"SELECT DISTINCT who, su FROM {log}").fetchall() == [(ADMIN, "false")]
            assert c.execute("SELECT state, last_error FROM _cdc_sinks WHERE sink_name = %s", (sink,)).fetchone()[1] is None
        finally:
            c.execute("SELECT cdc_drop_sink(sink_name) FROM _cdc_sinks WHERE sink_name = %s", (sink,))
            c.execute("SELECT cdc_disable(table_oid::regclass) FROM _cdc_publications WHERE table_oid = to_regclass(%s)",
                      (table,))
