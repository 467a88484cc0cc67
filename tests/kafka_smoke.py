#!/usr/bin/env python3
"""Smoke test of the test broker started by scripts/kafka.sh: Kafka transactions work on one node.

1. A transactional producer commits 10 messages and aborts 5 (which it first flushes, so they
   really are in the log).
2. A read_committed consumer sees exactly the 10 committed ones; a read_uncommitted one sees all 15.
3. Fencing: a second producer with the same transactional.id calls init_transactions; the first
   producer's next commit must fail with a fencing error, and the new producer can commit.

Uses a fresh topic and transactional.id on every run. Exit status 0 only if every check passed.
Run with the test venv:  $PG_CDC_VENV/bin/python tests/kafka_smoke.py
"""
import os
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
TIMEOUT = 30.0  # seconds, for each blocking call
PARTITIONS = 3

run_id = uuid.uuid4().hex[:12]
topic = f"pg_cdc_smoke_{run_id}"
txn_id = f"pg_cdc_smoke_{run_id}"
results = []  # (name, ok, detail)


def check(name, ok, detail=""):
    results.append((name, ok, detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def producer():
    return Producer({
        "bootstrap.servers": BOOTSTRAP,
        "transactional.id": txn_id,
        "linger.ms": 5,
    })


def produce(p, values):
    delivery_errors = []

    def on_delivery(err, _msg):
        if err is not None:
            delivery_errors.append(err)

    for v in values:
        p.produce(topic, value=v.encode(), key=v.encode(), on_delivery=on_delivery)
    p.flush(TIMEOUT)
    return delivery_errors


def read_all(isolation):
    """Every value in the topic as seen with the given isolation level, read to the end."""
    c = Consumer({
        "bootstrap.servers": BOOTSTRAP,
        "group.id": f"pg_cdc_smoke_{run_id}_{isolation}",
        "isolation.level": isolation,
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    })
    try:
        # assign(), not subscribe(): no group rebalance to wait for, and every partition from 0.
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        values, at_eof = [], set()
        deadline = time.monotonic() + TIMEOUT
        while len(at_eof) < PARTITIONS:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{isolation}: only partitions {sorted(at_eof)} reached the end")
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_eof.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            at_eof.discard(msg.partition())
            values.append(msg.value().decode())
        return values
    finally:
        c.close()


def main():
    started = time.monotonic()
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    # Create the topic up front (auto-creation would work too) so both consumers see all partitions.
    for fut in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        fut.result(TIMEOUT)

    committed = [f"committed-{i}" for i in range(10)]
    aborted = [f"aborted-{i}" for i in range(5)]

    p1 = producer()
    p1.init_transactions(TIMEOUT)

    p1.begin_transaction()
    errs = produce(p1, committed)
    p1.commit_transaction(TIMEOUT)
    check("commit 10 in a transaction", not errs, f"delivery errors {errs}" if errs else "")

    p1.begin_transaction()
    errs = produce(p1, aborted)  # flushed: the records reach the log before the abort marker
    p1.abort_transaction(TIMEOUT)
    check("abort 5 in a transaction", not errs, f"delivery errors {errs}" if errs else "")

    seen = read_all("read_committed")
    check("read_committed sees exactly the 10 committed",
          sorted(seen) == sorted(committed),
          f"got {len(seen)}" + ("" if sorted(seen) == sorted(committed) else f": {sorted(seen)}"))

    seen = read_all("read_uncommitted")
    check("read_uncommitted sees all 15 (aborted ones are really in the log)",
          sorted(seen) == sorted(committed + aborted), f"got {len(seen)}")

    # Fencing: a new instance with the same transactional.id bumps the producer epoch.
    print("(librdkafka now logs a FATAL '_FENCED' error on stderr: that is the expected outcome)")
    p2 = producer()
    p2.init_transactions(TIMEOUT)
    fenced_error = None
    try:
        p1.begin_transaction()
        produce(p1, ["zombie-0"])
        p1.commit_transaction(TIMEOUT)
    except KafkaException as e:
        fenced_error = e.args[0]
    fencing_codes = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
    check("old producer's commit fails fenced after a new init_transactions",
          fenced_error is not None and fenced_error.code() in fencing_codes,
          f"{fenced_error.name()} (fatal={fenced_error.fatal()})" if fenced_error else "commit succeeded")

    p2.begin_transaction()
    errs = produce(p2, ["successor-0"])
    p2.commit_transaction(TIMEOUT)
    seen = read_all("read_committed")
    check("new producer commits; the fenced one's message never shows",
          not errs and sorted(seen) == sorted(committed + ["successor-0"]),
          f"got {len(seen)}" + (", zombie-0 visible" if "zombie-0" in seen else ""))

    # Leave the broker clean; the topic name is unique anyway, so a failure here is only a warning.
    try:
        for fut in admin.delete_topics([topic]).values():
            fut.result(TIMEOUT)
    except KafkaException as e:
        print(f"warning: could not delete {topic}: {e}", file=sys.stderr)

    passed = sum(ok for _, ok, _ in results)
    failed = len(results) - passed
    print(f"kafka_smoke: {BOOTSTRAP} topic {topic} in {time.monotonic() - started:.1f}s")
    print(f"kafka_smoke: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a broker that is down or misconfigured: say what, fail
        print(f"FAIL kafka_smoke: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
