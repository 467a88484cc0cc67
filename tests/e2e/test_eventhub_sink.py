"""The Event Hubs sink against the local broker's SASL_SSL listener (PLAIN over TLS, user
$ConnectionString, as Azure Event Hubs speaks the Kafka protocol; started by scripts/kafka.sh), read back
with an independent client over the same listener. Also the Kafka sink's authentication error against
that real broker, instead of librdkafka's mock."""
import collections
import json
import os
import uuid

import psycopg
import pytest

from conftest import (connect, consume, delete_topics, delivery_status, secret_in_data_dir, server_log,
                      sigkill_while_writing, sink_state, wait_for)

RUN = os.environ.get("PG_CDC_RUN", "/var/tmp/pg_cdc")
CA = os.path.join(RUN, "kafka", "tls", "ca.pem")
SASL = f"{os.environ.get('KAFKA_HOST', '127.0.0.1')}:{os.environ.get('KAFKA_SASL_PORT', '9094')}"


def connection_string():
    with open(os.path.join(RUN, "kafka", "eventhub.connection")) as f:
        return f.read().strip()


def sasl_client(extra=None):
    """An independent client of the SASL_SSL listener."""
    return {"bootstrap.servers": SASL, "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
            "sasl.username": "$ConnectionString", "sasl.password": connection_string(), "ssl.ca.location": CA,
            **(extra or {})}


@pytest.fixture
def connection_file(pg):
    """The connection string in a file in the data directory."""
    with secret_in_data_dir(pg, "e2e_eventhub", connection_string().encode() + b"\n") as name:
        yield name


@pytest.fixture
def hubs(pg):
    added = []  # (sink, topic)
    yield added
    with connect() as c:
        topics = []
        for name, topic in added:
            slot = c.execute("SELECT slot_name FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()
            if slot:
                topics.append("pg_cdc.progress." + slot[0].removeprefix("_cdc_"))
            c.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (name, name))
            topics.append(topic)
    delete_topics(topics)


def add(pg, hubs, name, dest, sink_type="eventhub", **cfg):
    """Adds a sink writing to the topic (event hub) `dest`."""
    if sink_type == "eventhub":
        cfg = {"bootstrap_servers": SASL, "eventhub": dest, "properties": {"ssl.ca.location": CA}, **cfg}
    pg.execute("SELECT cdc_add_sink(%s, %s, %s::jsonb)", (name, sink_type, json.dumps(cfg)))
    hubs.append((name, dest))
    return name


def captured(pg, t):
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    return t


def test_events_arrive_over_sasl_ssl_at_least_once_by_default(pg, hubs, connection_file, unique):
    t = captured(pg, f"eh_{unique}")
    name = add(pg, hubs, f"eh_{unique}", f"eh-{unique}", connection_string_file=connection_file)
    for i in range(3):
        with pg.transaction():
            for j in range(5):
                pg.execute(f"INSERT INTO {t} VALUES (%s, 'x')", (i * 5 + j,))
    msgs = consume(f"eh-{unique}", 15, extra=sasl_client())
    assert sorted(m["value"]["after"]["id"] for m in msgs) == list(range(15))
    assert {json.dumps(m["key"]) for m in msgs} == {json.dumps({"id": i}) for i in range(15)}
    status = wait_for(lambda: (s := delivery_status(pg, name))["delivered"]["events"] >= 15 and s, what="counted")
    assert status["sink_type"] == "eventhub" and status["delivery_mode"] == "at_least_once"
    assert connection_string() not in server_log()
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_exactly_once_on_request(pg, hubs, connection_file, unique):
    """Kafka transactions through the Event Hubs listener: a read_committed consumer sees each row once."""
    t = captured(pg, f"eheo_{unique}")
    name = add(pg, hubs, f"eheo_{unique}", f"eheo-{unique}", connection_string_file=connection_file, exactly_once=True)
    pg.execute(f"INSERT INTO {t} SELECT g, 'x' FROM generate_series(1, 20) g")
    msgs = consume(f"eheo-{unique}", 20, extra=sasl_client())
    assert sorted(m["value"]["after"]["id"] for m in msgs) == list(range(1, 21))
    assert pg.execute("SELECT delivery_mode FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()[0] == "exactly_once"
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_refused_credentials_stop_the_sink_with_a_reason_and_never_show_the_secret(pg, hubs, unique):
    """A wrong key (the real broker refuses it): state error at once, not 'retrying' after a 30 s
    delivery timeout; neither the message nor the server log holds the key. The Kafka sink with a
    wrong SASL password in its properties behaves the same against the real broker."""
    t = captured(pg, f"ehbad_{unique}")
    canary = "canary" + uuid.uuid4().hex
    wrong = f"Endpoint=sb://pgcdc-local.servicebus.windows.net/;SharedAccessKeyName=pg_cdc_test;SharedAccessKey={canary}"
    hub = add(pg, hubs, f"ehbad_{unique}", f"ehbad-{unique}", connection_string=wrong)
    kafka = add(pg, hubs, f"kbad_{unique}", f"kbad-{unique}", sink_type="kafka", topic=f"kbad-{unique}",
                bootstrap_servers=SASL, exactly_once=False,
                properties={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "ssl.ca.location": CA,
                            "sasl.username": "$ConnectionString", "sasl.password": canary})
    pg.execute(f"INSERT INTO {t} VALUES (1, 'x')")
    for name in (hub, kafka):
        state = wait_for(lambda: (s := sink_state(pg, name))[0] == "error" and s, timeout=25, what=f"{name} in error")
        assert "refused the sink's credentials" in state[1] and "Invalid username or password" in state[1], state
        assert canary not in state[1]
    assert canary not in server_log()
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_sigkill_during_delivery_loses_nothing(pg, hubs, connection_file, unique):
    """kill -9 of the worker while it delivers (at-least-once): every committed row arrives; a row
    that arrives twice is the same event (same commit_lsn and lsn, same bytes)."""
    t = captured(pg, f"ehkill_{unique}")
    topic = f"ehkill-{unique}"
    add(pg, hubs, f"ehkill_{unique}", topic, connection_string_file=connection_file)
    sigkill_while_writing(pg, t, 10)
    with connect() as c:
        src = {r[0] for r in c.execute(f"SELECT id FROM {t}").fetchall()}
        msgs = consume(topic, len(src), timeout=120, extra=sasl_client())
        seen = collections.defaultdict(set)
        for m in msgs:
            md = m["value"]["metadata"]
            seen[(md["commit_lsn"], md["lsn"])].add(m["raw"])
        assert all(len(v) == 1 for v in seen.values()), "a re-sent event differs from its first send"
        assert {m["value"]["after"]["id"] for m in msgs} == src
        c.execute("SELECT cdc_disable(%s)", (t,))


def test_config_errors(pg, unique):
    def sqlstate(cfg):
        with pytest.raises(psycopg.Error) as e:
            pg.execute("SELECT cdc_add_sink(%s, 'eventhub', %s::jsonb)", (f"ehe_{unique}", json.dumps(cfg)))
        return e.value.sqlstate, e.value.diag.message_primary

    assert sqlstate({"namespace": "n"})[0] == "22023"
    code, msg = sqlstate({"namespace": "n", "eventhub": "e", "connection_string_file": "no_such.conn"})
    assert code == "55000" and "no_such.conn" in msg
    code, msg = sqlstate({"namespace": "n", "eventhub": "e", "connection_string": "Endpoint=sb://x/;SharedAccessKey=zz"})
    assert code == "22023" and "zz" not in msg
