"""The webhook sink against a real HTTP server (Python's http.server, in this process): signed batches
in commit order, Retry-After honoured, 4xx as an error an operator sees, and at-least-once through a
SIGKILL of the worker (duplicates allowed, identified by their id, byte-identical, never out of order).

The oracle is the source table (SELECT) and what the server received: nothing of the worker's state."""
import hashlib
import hmac
import http.server
import json
import threading
import time

import psycopg
import pytest

from conftest import connect, delivery_status, secret_in_data_dir, sigkill_while_writing, sink_state, wait_for

SECRET = b"e2e-webhook-secret"


class Hook:
    """An HTTP server that records every POST and answers with `policy(n)` -> (status, headers, body)
    for the n-th request (0-based)."""

    def __init__(self):
        self.requests = []  # (time, headers dict, body bytes, status)
        self.started = 0    # requests received, answered or not
        self.policy = lambda n: (200, {}, b"")
        self.delay = 0.0
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                hook.started += 1
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if hook.delay:
                    time.sleep(hook.delay)
                status, headers, text = hook.policy(len(hook.requests))
                hook.requests.append((time.time(), {k.lower(): v for k, v in self.headers.items()}, body, status))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/cdc?token=t0ps3cret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def delivered(self):
        """Records of the requests answered 2xx, in arrival order."""
        return [r for _, _, body, status in self.requests if 200 <= status < 300 for r in json.loads(body)["events"]]

    def close(self):
        self.server.shutdown()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


@pytest.fixture
def secret_file(pg):
    """The signing secret in a file in the data directory (with the newline `echo` would add)."""
    with secret_in_data_dir(pg, "e2e_hook", SECRET + b"\n") as name:
        yield name


@pytest.fixture
def hooks(pg):
    names = []
    yield names
    with connect() as c:
        for n in names:
            c.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (n, n))


def add(pg, hooks, name, url, **extra):
    pg.execute("SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)", (name, json.dumps({"url": url, **extra})))
    hooks.append(name)
    return name


def captured(pg, t):
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    return t


def assert_at_least_once_in_order(hook, pg, t):
    """Every source row arrived; a record seen twice is byte-identical; first arrivals are in commit order."""
    first, seen = [], {}
    for r in hook.delivered():
        raw = json.dumps(r["event"], sort_keys=True)
        if r["id"] in seen:
            assert seen[r["id"]] == raw, f"record {r['id']} differs on its second send"
            continue
        seen[r["id"]] = raw
        first.append(r)
    positions = [(r["commit_lsn"], r["event_index"]) for r in first]
    assert positions == sorted(positions), "records arrived out of commit order"
    ids = {r["event"]["after"]["id"] for r in first if r["event"]["after"]}
    src = {row[0] for row in pg.execute(f"SELECT id FROM {t}").fetchall()}
    assert ids == src, f"missing {sorted(src - ids)[:10]}, extra {sorted(ids - src)[:10]}"
    return len(hook.delivered()) - len(first)


def test_signed_batches_arrive_in_commit_order(pg, hooks, hook, secret_file, unique):
    t = captured(pg, f"wh_{unique}")
    name = add(pg, hooks, f"wh_{unique}", hook.url, secret_file=secret_file, batch_max_events=7,
               headers={"Authorization": "Bearer e2e"})
    for i in range(5):
        with pg.transaction():
            for j in range(6):
                pg.execute(f"INSERT INTO {t} VALUES (%s, 'x')", (i * 6 + j,))
    pg.execute(f"UPDATE {t} SET v = 'y' WHERE id = 3")
    wait_for(lambda: len(hook.delivered()) >= 31, what="31 events posted")
    for _, headers, body, _ in hook.requests:
        expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["x-pg-cdc-signature"], expected)
        assert headers["authorization"] == "Bearer e2e" and headers["content-type"] == "application/json"
        assert len(json.loads(body)["events"]) <= 7
    records = hook.delivered()
    assert [r["event"]["after"]["id"] for r in records[:30]] == list(range(30))
    assert records[-1]["event"]["metadata"]["operation"] == "UPDATE" and records[-1]["key"] == {"id": 3}
    assert records[0]["id"] == f"{records[0]['commit_lsn']}-1" and records[0]["table"] == f"public.{t}"
    assert assert_at_least_once_in_order(hook, pg, t) == 0
    status = wait_for(lambda: (s := delivery_status(pg, name))["delivered"]["events"] >= 31
                      and s["state"] == "running" and s, what="counted and running")
    assert status["delivery_mode"] == "at_least_once" and status["state"] == "running"
    assert status["sink_type"] == "webhook" and status["transaction_status"]["committed_transactions"] is None
    assert status["delivered"]["events"] == 31
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_retry_after_is_honoured_and_a_4xx_is_an_error_until_fixed(pg, hooks, hook, unique):
    t = captured(pg, f"whr_{unique}")
    hook.policy = lambda n: (503, {"Retry-After": "3"}, b"busy") if n == 0 else (200, {}, b"")
    name = add(pg, hooks, f"whr_{unique}", hook.url)
    pg.execute(f"INSERT INTO {t} VALUES (1, 'x')")
    state = wait_for(lambda: (s := sink_state(pg, name))[0] == "retrying" and s, what="retrying")
    assert "HTTP 503" in state[1] and "t0ps3cret" not in state[1] and "/cdc" not in state[1], state
    wait_for(lambda: len(hook.delivered()) >= 1, what="delivered after the wait")
    assert hook.requests[1][0] - hook.requests[0][0] >= 2.9, "a request came before Retry-After"

    hook.policy = lambda n: (400, {}, b"schema mismatch: field v")
    pg.execute(f"INSERT INTO {t} VALUES (2, 'x')")
    state = wait_for(lambda: (s := sink_state(pg, name))[0] == "error" and s, what="error")
    assert state[1].endswith("HTTP 400: schema mismatch: field v"), state
    hook.policy = lambda n: (200, {}, b"")
    wait_for(lambda: sink_state(pg, name)[0] == "running" and len(hook.delivered()) >= 2, timeout=60,
             what="delivering again once the endpoint accepts")
    assert_at_least_once_in_order(hook, pg, t)
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_sigkill_during_delivery_loses_nothing(pg, hooks, hook, unique):
    """kill -9 of the worker while it posts: every committed row arrives; what arrives twice is
    identical and identified by its id; nothing arrives before an earlier event of the stream."""
    t = captured(pg, f"whk_{unique}")
    hook.delay = 0.02
    add(pg, hooks, f"whk_{unique}", hook.url, batch_max_events=20)
    sigkill_while_writing(pg, t, 10, ready=lambda: len(hook.requests) > 5, pause=0.01)
    with connect() as c:
        total = c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        wait_for(lambda: len({r["id"] for r in hook.delivered()}) >= total, timeout=120, what="every row posted")
        time.sleep(1.0)
        assert_at_least_once_in_order(hook, c, t)
        c.execute("SELECT cdc_disable(%s)", (t,))


READ_TURN_CLASSES = (6513763, 6513764)  # advisory-lock classes of the read turns (src/worker/source.rs)


def test_a_sink_waiting_on_its_destination_holds_no_read_turn(pg, hooks, hook, unique):
    """A webhook sink posts from inside its read once a batch is full. While the server takes its time to
    answer, the worker must hold no read turn (cdc.max_concurrent_reads, 1 by default): with the turn held
    for the whole read, every other sink of its pool waited behind the slow destination (seed example 1's
    busy sink waited up to a minute behind its Kinesis sink). Oracles: pg_locks, sampled while the post
    is in flight (the server counts the requests it received), and a table sink on another table, which
    must deliver meanwhile."""
    t, other, events = captured(pg, f"whturn_{unique}"), captured(pg, f"whturn_o_{unique}"), f"whturn_ev_{unique}"
    hook.delay = 15.0
    name = add(pg, hooks, f"whturn_{unique}", hook.url, batch_max_events=5)
    pg.execute("SELECT cdc_add_sink(%s, 'table', %s::jsonb)",
               (f"whturn_t_{unique}", json.dumps({"table": events, "tables": [other]})))
    hooks.append(f"whturn_t_{unique}")
    wait_for(lambda: sink_state(pg, name)[0] == "running" and sink_state(pg, f"whturn_t_{unique}")[0] == "running",
             what="both sinks running")
    pid = pg.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_cdc worker' "
                     "AND application_name LIKE %s", (f"%: {name}",)).fetchone()[0]
    with pg.transaction():
        for i in range(20):
            pg.execute(f"INSERT INTO {t} VALUES (%s, 'x')", (i,))
    try:
        wait_for(lambda: hook.started >= 1, timeout=30, what="the webhook sink's first post")
        pg.execute(f"INSERT INTO {other} VALUES (1, 'meanwhile')")
        # Sampled for 2 s at least, and until the table sink delivered (10 s at most; the post takes 15).
        held, start = [], time.monotonic()
        while time.monotonic() - start < 10:
            held += pg.execute("SELECT classid::int, objid::int FROM pg_locks WHERE pid = %s AND locktype = 'advisory' "
                               "AND granted AND classid::int = ANY(%s)", (pid, list(READ_TURN_CLASSES))).fetchall()
            other_delivered = pg.execute(f"SELECT count(*) FROM {events}").fetchone()[0] >= 1
            if other_delivered and time.monotonic() - start > 2:
                break
            time.sleep(0.1)
        assert hook.started == 1 and not hook.requests, "the sampling must run while the first post is in flight"
        assert held == [], f"the webhook sink held a read turn while waiting for its server: {sorted(set(held))}"
        assert pg.execute(f"SELECT count(*) FROM {events}").fetchone()[0] == 1, \
            "the table sink did not deliver while the webhook sink waited for its server"
    finally:
        hook.delay = 0.0
        with connect() as c:
            c.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s",
                      (f"whturn_t_{unique}",) * 2)
            c.execute(f"DROP TABLE IF EXISTS {events}")
    wait_for(lambda: len({r["id"] for r in hook.delivered()}) >= 20, timeout=60, what="every row posted")


def test_config_errors(pg, unique):
    def sqlstate(cfg):
        with pytest.raises(psycopg.Error) as e:
            pg.execute("SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)", (f"whe_{unique}", json.dumps(cfg)))
        return e.value.sqlstate, e.value.diag.message_primary

    assert sqlstate({})[0] == "22023"
    assert sqlstate({"url": "https://example.com/x", "exactly_once": True})[0] == "22023"
    code, msg = sqlstate({"url": "https://example.com/x", "secret_file": "no_such_file.key"})
    assert code == "55000" and "no_such_file.key" in msg
