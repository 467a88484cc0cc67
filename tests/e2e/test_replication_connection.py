"""The replication connection (crates/cdc-repl) against the real walsender.

The oracle is PostgreSQL itself: the messages streamed over START_REPLICATION must be, LSN for LSN
and byte for byte, what pg_logical_slot_peek_binary_changes returns for the same slot; a confirm
must move the slot's confirmed_flush_lsn to the end of the last transaction read, and nothing
before it is returned again. Authentication is tried as a DBA would set it up: a role with a
SCRAM password and a pg_hba line for replication connections."""
import os
import subprocess
import uuid

import pytest

from conftest import connect, wait_for

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# Where cargo builds (scripts/env.sh sets CARGO_TARGET_DIR to the cache).
PROBE = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "examples", "stream_probe")
SOCK = os.path.join(os.environ.get("PG_CDC_RUN", "/var/tmp/pg_cdc"), "sock")
PORT = os.environ.get("PGPORT", "55432")
DB = os.environ.get("PGDATABASE", "postgres")


@pytest.fixture(scope="module")
def probe():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "cdc-repl", "--example", "stream_probe"],
                   cwd=ROOT, check=True)
    return PROBE


@pytest.fixture
def slot(pg):
    tag = uuid.uuid4().hex[:8]
    table, pub, slot = f"repl_{tag}", f"repl_pub_{tag}", f"repl_slot_{tag}"
    pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, note text, amount numeric)")
    pg.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    yield table, pub, slot
    pg.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    pg.execute(f"DROP PUBLICATION {pub}")
    pg.execute(f"DROP TABLE {table}")


def peek(pg, slot, pub):
    return [(int(lsn), data.hex()) for lsn, data in pg.execute(
        "SELECT lsn - '0/0'::pg_lsn, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s, 'messages', 'true')", (slot, pub)).fetchall()]


def run_probe(probe, user, slot, pub, changes, *extra, password=None):
    env = dict(os.environ)
    env.pop("PGPASSWORD", None)
    if password is not None:
        env["PGPASSWORD"] = password
    return subprocess.run([probe, SOCK, PORT, user, DB, slot, pub, str(changes), *extra],
                          capture_output=True, text=True, env=env, timeout=60)


def write_changes(pg, table):
    pg.execute(f"INSERT INTO {table} SELECT g, 'row ' || g, g * 1.5 FROM generate_series(1, 500) g")
    with pg.transaction():
        pg.execute(f"UPDATE {table} SET note = note || ' changed' WHERE id <= 100")
        pg.execute(f"DELETE FROM {table} WHERE id > 450")
    # One message larger than the client's first read buffer (256 KiB).
    pg.execute(f"INSERT INTO {table} VALUES (1000, repeat('x', 700000), 1)")
    pg.execute("SELECT pg_logical_emit_message(true, 'pg_cdc.test', 'hello')")


def test_streamed_messages_are_the_peek_byte_for_byte_and_a_confirm_moves_the_slot(pg, slot, probe, tmp_path):
    table, pub, slot_name = slot
    write_changes(pg, table)
    expected = peek(pg, slot_name, pub)
    changes = sum(1 for _, d in expected if d[:2] in ("49", "55", "44"))  # I, U, D
    assert changes == 500 + 100 + 50 + 1
    dump = tmp_path / "stream.tsv"

    r = run_probe(probe, "postgres", slot_name, pub, changes, "--dump", str(dump))
    assert r.returncode == 0, r.stderr
    streamed = [(int(lsn), data) for lsn, data in (line.split("\t") for line in dump.read_text().splitlines())]
    # The probe stops at the Commit of the last change; the stream goes on with the logical
    # message's transaction (Begin, Message, Commit), which it does not wait for.
    assert len(streamed) == len(expected) - 3
    assert [d for _, d in streamed] == [d for _, d in expected[:len(streamed)]]
    # Same LSNs, except that a walsender sends none (0) for a message that is not the last one
    # its output callback writes: the Relation message written before a change.
    for (s_lsn, data), (e_lsn, _) in zip(streamed, expected):
        assert s_lsn == e_lsn or (s_lsn == 0 and data[:2] == "52"), (s_lsn, e_lsn, data[:2])
    assert any(s_lsn == 0 for s_lsn, _ in streamed)
    # Nothing was confirmed: the slot still returns everything.
    assert peek(pg, slot_name, pub) == expected

    r = run_probe(probe, "postgres", slot_name, pub, changes, "--confirm")
    assert r.returncode == 0, r.stderr
    # The Commit of the transaction of the last change (the logical message's transaction follows).
    last_commit = expected[len(expected) - 4][0]
    assert expected[len(expected) - 4][1][:2] == "43"
    confirmed = pg.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                           (slot_name,)).fetchone()[0]
    assert int(confirmed) == last_commit
    # What was confirmed is never returned again: only what followed the last commit.
    rest = peek(pg, slot_name, pub)
    assert all(lsn > last_commit for lsn, _ in rest)
    assert [d[:2] for _, d in rest] == ["42", "4d", "43"]  # Begin, the logical message, Commit


def test_a_missing_slot_is_the_servers_error_with_its_sqlstate(probe):
    r = run_probe(probe, "postgres", "no_such_slot_for_sure", "p", 1)
    assert r.returncode == 1
    assert "42704" in r.stderr and "no_such_slot_for_sure" in r.stderr, r.stderr
    with connect() as c:
        assert c.execute("SELECT count(*) FROM pg_stat_replication WHERE application_name = 'pg_cdc_stream_probe'"
                         ).fetchone()[0] == 0


@pytest.fixture
def scram_role(pg, probe):
    role = f"repl_scram_{uuid.uuid4().hex[:8]}"
    pg.execute("SET password_encryption = 'scram-sha-256'")
    pg.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'correct horse'")
    hba = pg.execute("SHOW hba_file").fetchone()[0]
    original = open(hba).read()
    # First match wins: the line goes before the cluster's trust lines, as a DBA's would. A logical
    # replication connection matches by its database name, not by the `replication` keyword
    # (which is for physical replication only).
    with open(hba, "w") as f:
        f.write(f"local {DB} {role} scram-sha-256\n" + original)
    pg.execute("SELECT pg_reload_conf()")
    try:
        # The postmaster reloads pg_hba.conf when it gets to the signal: wait until a connection
        # without the password is refused.
        wait_for(lambda: run_probe(PROBE, role, "no_such_slot", "p", 1).returncode == 1
                 and "none is configured" in run_probe(PROBE, role, "no_such_slot", "p", 1).stderr,
                 timeout=10, what="pg_hba.conf reloaded")
        yield role
    finally:
        with open(hba, "w") as f:
            f.write(original)
        pg.execute("SELECT pg_reload_conf()")
        pg.execute(f"DROP ROLE {role}")


def test_scram_authentication_with_the_right_password_and_refusals_without_it(pg, probe, slot, scram_role):
    table, pub, slot_name = slot
    pg.execute(f"INSERT INTO {table} SELECT g, 'r', 1 FROM generate_series(1, 10) g")

    r = run_probe(probe, scram_role, slot_name, pub, 10, password="correct horse")
    assert r.returncode == 0, r.stderr

    r = run_probe(probe, scram_role, slot_name, pub, 10, password="wrong")
    assert r.returncode == 1
    assert "28P01" in r.stderr and "password authentication failed" in r.stderr, r.stderr

    r = run_probe(probe, scram_role, slot_name, pub, 10)
    assert r.returncode == 1
    assert f"role {scram_role}" in r.stderr and "scram-sha-256" in r.stderr and "none is configured" in r.stderr, r.stderr
    assert "correct horse" not in r.stderr
