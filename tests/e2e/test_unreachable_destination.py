"""A sink whose destination is down says so within seconds, naming the broker and the transport's error
(librdkafka reports each failed connection with the broker's address), instead of sitting in
`starting` with no error until a 30 s timeout says only "Timed out".

For Kafka exactly-once and at-least-once and for Event Hubs (its Kafka endpoint over SASL_SSL), against a
port nothing listens on and a host name that does not resolve. The oracle is `_cdc_sinks` as a DBA reads
it. The control: the same sink pointed at the running broker reaches `running` with no error."""
import json
import time

import pytest

from conftest import BOOTSTRAP, connect, wait_for
from test_eventhub_sink import connection_string

CLOSED = "127.0.0.1:1"
UNRESOLVABLE = "broker.pg-cdc-test.invalid:9092"


def configs(bootstrap):
    return {
        "kafka exactly-once": ("kafka", {"bootstrap_servers": bootstrap, "topic": "unreachable"}),
        "kafka at-least-once": ("kafka", {"bootstrap_servers": bootstrap, "topic": "unreachable",
                                          "exactly_once": False}),
        "eventhub": ("eventhub", {"namespace": "pgcdc-test", "eventhub": "unreachable", "bootstrap_servers": bootstrap,
                                  "connection_string": connection_string()}),
    }


@pytest.fixture
def added(pg):
    names = []
    yield names
    with connect() as c:
        for n in names:
            c.execute("SELECT cdc_drop_sink(%s) FROM _cdc_sinks WHERE sink_name = %s", (n, n))


def state_within(pg, name, seconds):
    """The sink's (state, last_error) once it left `starting`/`creating_slot`, or as it is after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        row = pg.execute("SELECT state, last_error FROM _cdc_sinks WHERE sink_name = %s", (name,)).fetchone()
        if row[0] not in ("starting", "creating_slot") or time.monotonic() > deadline:
            return row
        time.sleep(0.1)


@pytest.mark.parametrize("kind", ["kafka exactly-once", "kafka at-least-once", "eventhub"])
@pytest.mark.parametrize("where", [CLOSED, UNRESOLVABLE])
def test_an_unreachable_destination_is_named_within_five_seconds(pg, added, unique, kind, where):
    t = f"unr_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sink_type, config = configs(where)[kind]
    name = f"unr_{unique}"
    pg.execute("SELECT cdc_add_sink(%s, %s, %s::jsonb)", (name, sink_type, json.dumps({**config, "tables": [t]})))
    added.append(name)
    state, error = state_within(pg, name, 5.0)
    assert state == "retrying", f"{kind} -> {where}: still {state} after 5 s ({error})"
    assert where in (error or ""), f"the error names the broker: {error}"
    reason = "Connection refused" if where == CLOSED else "resolve"
    assert reason in error, f"the error names the transport's failure: {error}"
    pg.execute(f"DROP TABLE {t}")


def test_control_a_reachable_broker_runs_without_an_error(pg, added, unique):
    t = f"unr_ok_{unique}"
    pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    name = f"unr_ok_{unique}"
    sink_type, config = configs(BOOTSTRAP)["kafka exactly-once"]
    pg.execute("SELECT cdc_add_sink(%s, %s, %s::jsonb)", (name, sink_type, json.dumps({**config, "tables": [t]})))
    added.append(name)
    wait_for(lambda: state_within(pg, name, 0) == ("running", None), what="running without an error")
    pg.execute(f"DROP TABLE {t}")
