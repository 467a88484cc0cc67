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
        self.policy = lambda n: (200, {}, b"")
        self.delay = 0.0
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
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


def test_config_errors(pg, unique):
    def sqlstate(cfg):
        with pytest.raises(psycopg.Error) as e:
            pg.execute("SELECT cdc_add_sink(%s, 'webhook', %s::jsonb)", (f"whe_{unique}", json.dumps(cfg)))
        return e.value.sqlstate, e.value.diag.message_primary

    assert sqlstate({})[0] == "22023"
    assert sqlstate({"url": "https://example.com/x", "exactly_once": True})[0] == "22023"
    code, msg = sqlstate({"url": "https://example.com/x", "secret_file": "no_such_file.key"})
    assert code == "55000" and "no_such_file.key" in msg
