"""The Kinesis sink against a real Kinesis-compatible server (kinesis-mock, started by scripts/kinesis.sh):
the seed's Kinesis sinks as written, per-key order through throttled and failed records, at-least-once
through a SIGKILL of the worker, and the errors an operator must see.

The oracles are the source tables (SELECT), what boto3 (an independent client) reads back from every
shard, and what a fault-injecting proxy saw on the wire: nothing of the worker's state. kinesis-mock
simulates no throughput limits, so the proxy between pg_cdc and the server fails records the way
Kinesis does (it forwards the others, then answers ProvisionedThroughputExceededException for the ones it
held back), and fails whole requests (throttled, 500)."""
import http.client
import http.server
import json
import os
import random
import threading
import time

import boto3
import psycopg
import pytest

from conftest import check_keyed_at_least_once, connect, delivery_status, sigkill_while_writing, sink_state, typed_sinks, wait_for

ENDPOINT = os.environ.get("KINESIS_ENDPOINT", "http://127.0.0.1:4568")


def kinesis():
    return boto3.client("kinesis", endpoint_url=ENDPOINT, region_name="us-east-1",
                        aws_access_key_id="e2e", aws_secret_access_key="e2e")


CREATED = []


@pytest.fixture(autouse=True)
def drop_streams():
    """Deletes the streams a test created, so the server the tests share stays small."""
    yield
    k = kinesis()
    while CREATED:
        try:
            k.delete_stream(StreamName=CREATED.pop(), EnforceConsumerDeletion=True)
        except k.exceptions.ResourceNotFoundException:
            pass


def fresh_stream(name, shards=2):
    """Creates the stream (dropping one of that name first: the server keeps streams until it stops)."""
    CREATED.append(name)
    k = kinesis()
    try:
        k.delete_stream(StreamName=name, EnforceConsumerDeletion=True)
        wait_for(lambda: name not in k.list_streams()["StreamNames"], what=f"stream {name} deleted")
    except k.exceptions.ResourceNotFoundException:
        pass
    k.create_stream(StreamName=name, ShardCount=shards)
    wait_for(lambda: k.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamStatus"]
             == "ACTIVE", what=f"stream {name} active")
    return name


def read_stream(name):
    """Every record of every shard, in each shard's sequence order: dicts of partition key, shard, event."""
    k = kinesis()
    out = []
    for shard in k.list_shards(StreamName=name)["Shards"]:
        it = k.get_shard_iterator(StreamName=name, ShardId=shard["ShardId"],
                                  ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while it:
            r = k.get_records(ShardIterator=it, Limit=10000)
            out += [{"pk": rec["PartitionKey"], "shard": shard["ShardId"], "raw": rec["Data"],
                     "event": json.loads(rec["Data"])} for rec in r["Records"]]
            if not r["Records"] and r.get("MillisBehindLatest", 0) == 0:
                break
            it = r.get("NextShardIterator")
    return out


def identity(e):
    m = e["metadata"]
    return (m["commit_lsn"], m["lsn"], m["table"])


def check_at_least_once(records, expected_ids, table):
    """Kinesis records carry no id of their own: one is told apart by its event's position, and ordered
    per partition key."""
    return check_keyed_at_least_once(records, expected_ids, table, key=lambda r: r["pk"],
                                     ident=lambda r: identity(r["event"]))


class FaultProxy:
    """An HTTP proxy in front of the Kinesis server. `fail_records(recs)` gives the positions of a
    PutRecords request's records to fail (held back, answered ProvisionedThroughputExceededException);
    `fail_request(n)` gives (status, __type) to fail the n-th PutRecords request whole, or None. It
    records the partition keys of every PutRecords request it received."""

    def __init__(self):
        self.puts = []  # partition keys of each PutRecords request, as received
        self.failed_records = 0
        self.failed_requests = 0
        self.fail_records = lambda recs: []
        self.fail_request = lambda n: None
        self.lock = threading.Lock()
        up = ENDPOINT.removeprefix("http://")
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-length", "host")}
                target = self.headers.get("X-Amz-Target", "")
                held = []
                if target.endswith(".PutRecords"):
                    req = json.loads(body)
                    with proxy.lock:
                        n = len(proxy.puts)
                        proxy.puts.append([r["PartitionKey"] for r in req["Records"]])
                        whole = proxy.fail_request(n)
                        held = [] if whole else sorted(set(proxy.fail_records(req["Records"])))
                        proxy.failed_requests += bool(whole)
                        proxy.failed_records += len(held)
                    if whole:
                        status, kind = whole
                        return self.answer(status, json.dumps({"__type": kind, "message": "injected"}).encode())
                    if held:
                        req["Records"] = [r for i, r in enumerate(req["Records"]) if i not in held]
                        body = json.dumps(req).encode()
                conn = http.client.HTTPConnection(up, timeout=30)
                conn.request("POST", self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if held and resp.status == 200:
                    out = json.loads(data)
                    stored = iter(out["Records"])
                    total = len(out["Records"]) + len(held)
                    out["Records"] = [{"ErrorCode": "ProvisionedThroughputExceededException",
                                       "ErrorMessage": "Rate exceeded for shard (injected)"}
                                      if i in held else next(stored) for i in range(total)]
                    out["FailedRecordCount"] = out.get("FailedRecordCount", 0) + len(held)
                    data = json.dumps(out).encode()
                self.answer(resp.status, data, resp.getheader("Content-Type", "application/x-amz-json-1.1"))
                conn.close()

            def answer(self, status, data, ctype="application/x-amz-json-1.1"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def proxy():
    p = FaultProxy()
    yield p
    p.close()


@pytest.fixture
def kinesis_sinks(pg):
    with typed_sinks(pg, "kinesis") as s:
        yield s


def add(pg, sinks, name, config):
    return sinks.add(name, config)


def test_seed_examples_run_as_written(pg, kinesis_sinks, unique):
    """Seed examples 1 and 2's Kinesis sinks, their config text as written: example 1 names its region,
    example 2 takes it from cdc.aws_region and keys its records by account_id. The endpoint comes from
    cdc.kinesis_endpoint, the credentials from the server's AWS shared credentials file."""
    fresh_stream("orders-fraud-detection")
    fresh_stream("transactions-fraud-ml")
    orders, txns = f"orders_{unique}", f"transactions_{unique}"
    pg.execute(f"CREATE TABLE {orders} (order_id int PRIMARY KEY, customer_id int, total numeric)")
    pg.execute(f"CREATE TABLE {txns} (id int PRIMARY KEY, account_id text NOT NULL, amount numeric)")
    pg.execute("SELECT cdc_enable(%s)", (orders,))
    pg.execute("SELECT cdc_enable(%s)", (txns,))
    add(pg, kinesis_sinks, "kinesis_fraud", """{
    "stream_name": "orders-fraud-detection",
    "region": "us-east-1",
    "format": "json"
}""")
    add(pg, kinesis_sinks, "kinesis_fraud_ml", """{
    "stream_name": "transactions-fraud-ml",
    "format": "json",
    "partition_key": "account_id"
}""")
    for i in range(20):
        pg.execute(f"INSERT INTO {orders} VALUES (%s, %s, %s)", (i, i % 3, 10 + i))
    accounts = ["ACC-1", "ACC-2", "ACC-3"]
    with pg.transaction():
        for i in range(30):
            pg.execute(f"INSERT INTO {txns} VALUES (%s, %s, %s)", (i, accounts[i % 3], i))
    pg.execute(f"UPDATE {txns} SET amount = amount + 1 WHERE account_id = 'ACC-2'")

    def of(stream, table):
        return [r for r in read_stream(stream) if r["event"]["metadata"]["table"] == table]

    wait_for(lambda: len(of("orders-fraud-detection", orders)) >= 20
             and len(of("transactions-fraud-ml", txns)) >= 40, timeout=60, what="records in both streams")
    got = of("orders-fraud-detection", orders)
    assert sorted(r["event"]["after"]["order_id"] for r in got) == list(range(20))
    assert {r["pk"] for r in got} == {json.dumps({"order_id": i}, separators=(",", ":")) for i in range(20)}
    assert got[0]["event"]["metadata"]["operation"] == "INSERT" and got[0]["event"]["after"]["total"] is not None
    ml = of("transactions-fraud-ml", txns)
    pks = {a: json.dumps({"account_id": a}, separators=(",", ":")) for a in accounts}
    assert len(ml) == 40 and {r["pk"] for r in ml} == set(pks.values()), "keyed by account_id, the sink's partition_key"
    for acc in accounts:
        shards = {r["shard"] for r in ml if r["pk"] == pks[acc]}
        assert len(shards) == 1, f"{acc} spread over {shards}"
    check_at_least_once(ml, range(30), txns)
    acc2 = [r["event"] for r in ml if r["pk"] == pks["ACC-2"]]
    assert [e["metadata"]["operation"] for e in acc2] == ["INSERT"] * 10 + ["UPDATE"] * 10, "per-key commit order"
    for name in ("kinesis_fraud", "kinesis_fraud_ml"):
        # Events count once acknowledged; the state turns running once the slot is confirmed after.
        status = wait_for(lambda: (s := delivery_status(pg, name))["delivered"]["events"] > 0
                          and s["state"] == "running" and s, what="counted and running")
        assert status["sink_type"] == "kinesis" and status["delivery_mode"] == "at_least_once"
        assert status["state"] == "running"
    pg.execute("SELECT cdc_disable(%s)", (orders,))
    pg.execute("SELECT cdc_disable(%s)", (txns,))


def test_throttled_and_failed_records_keep_each_key_in_order(pg, kinesis_sinks, proxy, unique):
    """Every PutRecords fails a random quarter of its records (throttled shards) and every seventh
    request fails whole (throttled, or a 500): all rows arrive, each key's records in commit order, and
    no request ever held two records of one key."""
    stream = fresh_stream(f"e2e-throttle-{unique}", shards=3)
    t = f"kt_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    rng = random.Random(11)
    proxy.fail_records = lambda recs: [i for i in range(len(recs)) if rng.random() < 0.25]
    proxy.fail_request = lambda n: ((400, "ProvisionedThroughputExceededException") if n % 14 == 3
                                    else (500, "InternalFailure") if n % 14 == 10 else None)
    name = add(pg, kinesis_sinks, f"kt_{unique}", {"stream_name": stream, "endpoint": proxy.url,
                                                   "batch_max_records": 40})
    # 12 hot rows, each updated many times, in transactions of 20 changes: many records per key.
    pg.execute(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(1, 12) g")
    for i in range(30):
        with pg.transaction():
            for j in range(20):
                pg.execute(f"UPDATE {t} SET v = %s WHERE id = %s", (i * 20 + j, 1 + (i * 7 + j) % 12))
    expected = 12 + 600
    wait_for(lambda: len(read_stream(stream)) >= expected, timeout=120, what="every record")
    wait_for(lambda: sink_state(pg, name)[0] == "running", what="running")
    records = read_stream(stream)
    assert proxy.failed_records > 50 and proxy.failed_requests > 2, "the faults happened"
    assert all(len(keys) == len(set(keys)) for keys in proxy.puts), "a request held two records of one key"
    assert check_at_least_once(records, range(1, 13), t) == 0, "records retried in place are not duplicated"
    # Per key, the values arrive in the order they were written.
    by_key = {}
    for r in records:
        if r["event"]["metadata"]["operation"] == "UPDATE":
            by_key.setdefault(r["pk"], []).append(r["event"]["after"]["v"])
    assert sum(map(len, by_key.values())) == 600 and all(v == sorted(v) for v in by_key.values())

    # Negative control: the oracle sees a key's records swapped.
    i = next(i for i in range(1, len(records)) if records[i]["pk"] == records[i - 1]["pk"])
    swapped = records[:i - 1] + [records[i], records[i - 1]] + records[i + 1:]
    with pytest.raises(AssertionError, match="out of commit order"):
        check_at_least_once(swapped, range(1, 13), t)
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_no_progress_is_retrying_until_the_stream_accepts(pg, kinesis_sinks, proxy, unique):
    stream = fresh_stream(f"e2e-stall-{unique}", shards=1)
    t = f"ks_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    proxy.fail_records = lambda recs: list(range(len(recs)))
    name = add(pg, kinesis_sinks, f"ks_{unique}", {"stream_name": stream, "endpoint": proxy.url,
                                                   "retry_timeout_ms": 1000})
    pg.execute(f"INSERT INTO {t} SELECT g, g FROM generate_series(1, 50) g")
    state = wait_for(lambda: (s := sink_state(pg, name))[0] == "retrying" and s, what="retrying")
    assert "no progress for 1000 ms" in state[1] and "ProvisionedThroughputExceededException" in state[1], state
    proxy.fail_records = lambda recs: []
    wait_for(lambda: len(read_stream(stream)) >= 50, timeout=90, what="delivered once the stream accepts")
    check_at_least_once(read_stream(stream), range(1, 51), t)
    wait_for(lambda: sink_state(pg, name)[0] == "running", what="running again")
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_sigkill_during_delivery_loses_nothing(pg, kinesis_sinks, proxy, unique):
    """kill -9 of the worker while it puts records: every committed row arrives; a record that arrives
    twice is byte-identical and has the same (commit_lsn, lsn)."""
    stream = fresh_stream(f"e2e-kill-{unique}", shards=2)
    t = f"kk_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    add(pg, kinesis_sinks, f"kk_{unique}", {"stream_name": stream, "endpoint": proxy.url})
    # kinesis-mock stores a few thousand records a second at best: the writer paces itself below that.
    sigkill_while_writing(pg, t, 10, ready=lambda: len(proxy.puts) > 5, pause=0.02)
    with connect() as c:
        ids = [r[0] for r in c.execute(f"SELECT id FROM {t}").fetchall()]
        wait_for(lambda: len({identity(r["event"]) for r in read_stream(stream)}) >= len(ids), timeout=120,
                 what="every row in the stream")
        time.sleep(1.0)
        check_at_least_once(read_stream(stream), ids, t)
        c.execute("SELECT cdc_disable(%s)", (t,))


def test_errors_an_operator_sees(pg, kinesis_sinks, unique):
    def refused(cfg):
        with pytest.raises(psycopg.Error) as e:
            pg.execute("SELECT cdc_add_sink(%s, 'kinesis', %s::jsonb)", (f"kx_{unique}", json.dumps(cfg)))
        return e.value.sqlstate, e.value.diag.message_primary

    assert refused({}) == ("22023", "config.stream_name is required for a Kinesis sink")
    assert refused({"stream_name": "s", "exactly_once": True})[0] == "22023"
    assert refused({"stream_name": "s", "region": "Mars"})[0] == "22023"

    t = f"ke_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    missing = add(pg, kinesis_sinks, f"km_{unique}", {"stream_name": f"no-such-stream-{unique}", "tables": [t]})
    profile = add(pg, kinesis_sinks, f"kp_{unique}", {"stream_name": "s", "profile": "no_such_profile", "tables": [t]})
    down = add(pg, kinesis_sinks, f"kd_{unique}", {"stream_name": "s", "endpoint": "http://127.0.0.1:9",
                                                     "tables": [t]})
    pg.execute(f"INSERT INTO {t} VALUES (1)")
    state = wait_for(lambda: (s := sink_state(pg, missing))[0] == "error" and s, what="missing stream: error")
    assert f"no-such-stream-{unique}" in state[1] and "does not exist in region us-east-1" in state[1], state
    state = wait_for(lambda: (s := sink_state(pg, profile))[0] == "error" and s, timeout=60,
                     what="unknown profile: error")
    assert "no_such_profile" in state[1], state
    state = wait_for(lambda: (s := sink_state(pg, down))[0] == "retrying" and s, timeout=60,
                     what="unreachable endpoint: retrying")
    # Once the stream exists, the sink that was missing it delivers.
    fresh_stream(f"no-such-stream-{unique}", shards=1)
    wait_for(lambda: len(read_stream(f"no-such-stream-{unique}")) >= 1, timeout=90, what="delivered once created")
    pg.execute("SELECT cdc_disable(%s)", (t,))
