"""A secret written inline in a config never reaches the server log under the default settings.

PostgreSQL attaches the client's whole statement to every message at or above
`log_min_error_statement` (`error` by default; LOG ranks above it in the server log): the LOG of a new
slot's consistent point, which every `cdc_add_sink` that makes its slot writes, and the ERROR of a
refused call. The functions that take a config keep their statement out of the log.

Each statement is sent by psql, as a DBA would, with the canary as a literal in its text. The oracle is
the server log file itself; the controls run a statement of the same shape that is not pg_cdc's and
must find the canary there (so the log would show it, and the test is not blind)."""
import json
import os
import subprocess
import uuid

from conftest import server_log, server_log_size, wait_for


def psql(sql):
    """Runs `sql` with psql -c (the simple query protocol: the literal is in the statement text)."""
    return subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=0", "-c", sql], capture_output=True, text=True,
                          env={**os.environ, "PGOPTIONS": "-c client_min_messages=warning"})


def eventhub_config(canary, **extra):
    return {"namespace": "pgcdc-test", "eventhub": "orders", "bootstrap_servers": "127.0.0.1:1",
            "connection_string": "Endpoint=sb://pgcdc-test.servicebus.windows.net/;"
                                 f"SharedAccessKeyName=send;SharedAccessKey={canary}", **extra}


def literal(config):
    return "'" + json.dumps(config).replace("'", "''") + "'"


def test_an_accepted_cdc_add_sink_with_an_inline_secret_leaves_it_out_of_the_log(pg, unique):
    canary = f"CANARY{uuid.uuid4().hex}"
    name, t = f"sl_{unique}", f"sl_a_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    since = server_log_size()
    try:
        out = psql(f"SELECT cdc_add_sink('{name}', 'eventhub', {literal(eventhub_config(canary, tables=[t]))})")
        assert out.returncode == 0 and "ERROR" not in out.stderr, out.stderr
        # The slot was made while the call waited: its LOG line is there, without the statement.
        wait_for(lambda: "logical decoding found consistent point" in server_log(since), what="the slot's LOG")
        log = server_log(since)
        assert canary not in log, "the inline secret is in the server log"
        assert "cdc_add_sink" not in log, "the statement is in the server log"
    finally:
        pg.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (name, name))
        pg.execute(f"DROP TABLE {t}")


def test_a_refused_cdc_add_sink_with_an_inline_secret_leaves_it_out_of_the_log(pg, unique):
    canary = f"CANARY{uuid.uuid4().hex}"
    since = server_log_size()
    # A typo in another key: refused (22023) after the secret was parsed.
    out = psql(f"SELECT cdc_add_sink('sl_refused_{unique}', 'eventhub', "
               f"{literal(eventhub_config(canary, tabels=['x']))})")
    assert "22023" in out.stderr or "unknown key" in out.stderr, out.stderr
    wait_for(lambda: "unknown key" in server_log(since), what="the ERROR in the log")
    log = server_log(since)
    assert canary not in log and "cdc_add_sink" not in log, "the refused statement is in the server log"
    assert not pg.execute("SELECT EXISTS (SELECT 1 FROM _cdc_sinks WHERE sink_name = %s)",
                          (f"sl_refused_{unique}",)).fetchone()[0]


def test_a_refused_cdc_enable_leaves_its_statement_out_of_the_log(pg, unique):
    canary = f"CANARY{uuid.uuid4().hex}"
    t = f"sl_t_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, note text)")
    since = server_log_size()
    out = psql(f"SELECT cdc_enable('{t}', {literal({'filter': f'note = ' + repr(canary), 'tabels': 1})})")
    assert "ERROR" in out.stderr, out.stderr
    wait_for(lambda: "ERROR" in server_log(since), what="the ERROR in the log")
    assert canary not in server_log(since)
    pg.execute(f"DROP TABLE {t}")


def test_control_the_log_shows_a_canary_in_a_statement_that_is_not_pg_cdcs(pg, unique):
    """The controls: the same canary in a refused statement and next to a slot's creation, outside
    pg_cdc's functions, is written to the log with the statement (so the checks above can see it)."""
    canary = f"CANARY{uuid.uuid4().hex}"
    since = server_log_size()
    psql(f"SELECT '{canary}' || (1 / 0)::text")
    wait_for(lambda: canary in server_log(since), what="the refused statement, with the canary, in the log")
    slot = f"sl_control_{unique}"
    canary2 = f"CANARY{uuid.uuid4().hex}"
    since = server_log_size()
    psql(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput'), '{canary2}'")
    try:
        wait_for(lambda: canary2 in server_log(since), what="the slot's LOG line, with its statement and canary")
    finally:
        pg.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
