"""pg_cdc in servers that are not a primary in normal operation, on a scratch cluster of the PostgreSQL that
PG_BIN names: the temporary servers pg_upgrade starts (binary-upgrade mode) run no pg_cdc worker, and a
server that does not preload pg_cdc can still load the library (pg_upgrade's check that every library
loads does that).

Regressions: in binary-upgrade mode the launcher and sink workers ran, delivered from the old cluster
during `pg_upgrade --check`, and held a connection to cdc.database that made the new cluster's restore
fail ("database is being accessed by other users"); loading without preloading ended the session FATAL
("cannot create PGC_POSTMASTER variables after startup").
"""
import os
import shutil
import subprocess
import time

import psycopg
import pytest

from conftest import wait_for

PG_BIN = os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")
RUN = os.path.join(os.environ.get("PG_CDC_RUN", "/var/tmp/pg_cdc"), "server-modes")
# Below Linux's ephemeral range (32768-60999), which a client connection may hold a port of.
PORT = 25460


def as_pg(*args, check=True):
    return subprocess.run(["runuser", "-u", "postgres", "--", *args], check=check, capture_output=True, text=True)


def pg_ctl(*args, check=True):
    return as_pg(f"{PG_BIN}/pg_ctl", "-D", os.path.join(RUN, "data"), *args, check=check)


@pytest.fixture(scope="module")
def scratch():
    """An initdb'd cluster (stopped) whose settings `start` writes."""
    if os.path.exists(os.path.join(RUN, "data", "postmaster.pid")):
        pg_ctl("-m", "immediate", "-w", "stop", check=False)
    shutil.rmtree(RUN, ignore_errors=True)
    os.makedirs(RUN)
    shutil.chown(RUN, "postgres", "postgres")
    as_pg(f"{PG_BIN}/initdb", "-D", os.path.join(RUN, "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8",
          "--locale=C.UTF-8")
    yield
    pg_ctl("-m", "immediate", "-w", "stop", check=False)
    shutil.rmtree(RUN, ignore_errors=True)


def start(*, preload, binary_upgrade=False):
    conf = [f"port = {PORT}", "listen_addresses = '127.0.0.1'", f"unix_socket_directories = '{RUN}'",
            "wal_level = logical", "cdc.database = 'postgres'"]
    if preload:
        conf.append("shared_preload_libraries = 'pg_cdc'")
    path = os.path.join(RUN, "data", "postgresql.auto.conf")
    with open(path, "w") as f:
        f.write("\n".join(conf) + "\n")
    shutil.chown(path, "postgres", "postgres")
    opts = ["-o", "-b"] if binary_upgrade else []
    r = pg_ctl(*opts, "-l", os.path.join(RUN, "server.log"), "-w", "-t", "60", "start", check=False)
    assert r.returncode == 0, r.stderr + open(os.path.join(RUN, "server.log")).read()[-3000:]


def stop():
    pg_ctl("-m", "fast", "-w", "stop")


def connect():
    return psycopg.connect(f"host=127.0.0.1 port={PORT} user=postgres dbname=postgres", autocommit=True)


def pg_cdc_processes():
    with connect() as c:
        return c.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'pg_cdc%'").fetchone()[0]


def test_a_server_in_binary_upgrade_mode_runs_no_pg_cdc_worker(scratch):
    start(preload=True, binary_upgrade=True)
    try:
        # The launcher starts within a second of the server accepting connections (the control below).
        time.sleep(3)
        assert pg_cdc_processes() == 0
        with connect() as c:
            assert c.execute("SELECT current_setting('cdc.database')").fetchone()[0] == "postgres"
    finally:
        stop()
    # Control: the same server out of binary-upgrade mode runs the launcher.
    start(preload=True)
    try:
        wait_for(lambda: pg_cdc_processes() >= 1, timeout=30, what="the pg_cdc launcher")
    finally:
        stop()


def test_loading_pg_cdc_without_preloading_it_keeps_the_session(scratch):
    start(preload=False)
    try:
        with connect() as c:
            c.execute("LOAD 'pg_cdc'")
            assert c.execute("SELECT 1").fetchone()[0] == 1
            c.execute("CREATE EXTENSION pg_cdc")
            c.execute("CREATE TABLE t (id int PRIMARY KEY)")
            # Configuring capture is refused, with the setting to change.
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="shared_preload_libraries"):
                c.execute("SELECT cdc_enable('t')")
            assert c.execute("SELECT 1").fetchone()[0] == 1
    finally:
        stop()
