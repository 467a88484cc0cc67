"""Where exactly-once latency's tail comes from: Kafka transactions begun right after the last commit.

An exactly-once sink commits one Kafka transaction per pass, and under a steady load the next pass
produces as soon as the last commit returns. The broker answers that commit before it has written the
transaction's markers; a transaction that registers its partitions (AddPartitionsToTxn) meanwhile gets
CONCURRENT_TRANSACTIONS, and librdkafka retries it after a fixed 20 ms (rdkafka_txnmgr.c). This runs
one transactional producer (Python's confluent-kafka, librdkafka underneath, as in the worker) against
the local broker: N small transactions (a record to a 3-partition topic and one to a 1-partition topic,
as a unit and its progress record) for each gap between a commit and the next transaction, and prints
how long each took and how many CONCURRENT_TRANSACTIONS answers librdkafka logged (debug=eos).

    $PG_CDC_VENV/bin/python bench/kafka_txn_gap.py [--n 300] [--out bench/results/kafka_txn_gap.md]
"""
import argparse
import datetime
import logging
import os
import time
import uuid

from confluent_kafka import Producer, libversion
from confluent_kafka.admin import AdminClient, NewTopic

GAPS_MS = (0, 2, 5, 10)


class ConcurrentCount(logging.Handler):
    """Counts librdkafka's debug lines for an AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        m = record.getMessage()
        if "AddPartitionsToTxn response" in m and "concurrent" in m:
            self.count += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="transactions per gap")
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    ap.add_argument("--out", default="bench/results/kafka_txn_gap.md")
    a = ap.parse_args()
    u = uuid.uuid4().hex[:8]
    data, progress = f"txgap-{u}", f"txgap-p-{u}"
    admin = AdminClient({"bootstrap.servers": a.bootstrap})
    for f in admin.create_topics([NewTopic(data, 3, 1), NewTopic(progress, 1, 1)]).values():
        f.result()
    counter = ConcurrentCount()
    log = logging.getLogger("kafka_txn_gap")
    log.setLevel(logging.DEBUG)
    log.addHandler(counter)
    log.propagate = False
    p = Producer({"bootstrap.servers": a.bootstrap, "transactional.id": f"txgap-{u}", "linger.ms": 0,
                  "debug": "eos", "enable.idempotence": True, "acks": "all"}, logger=log)
    p.init_transactions(30)
    rows = []
    try:
        for gap_ms in GAPS_MS:
            counter.count = 0
            times = []
            for i in range(a.n):
                if gap_ms:
                    time.sleep(gap_ms / 1000)
                t0 = time.perf_counter()
                p.begin_transaction()
                p.produce(data, key=str(i).encode(), value=b"x" * 200)
                p.produce(progress, key=b"checkpoint", value=str(i).encode())
                p.commit_transaction(30)
                times.append((time.perf_counter() - t0) * 1000)
                p.poll(0)  # serves the log lines
            times.sort()
            q = lambda f: times[min(len(times) - 1, int(f * len(times)))]  # noqa: E731
            rows.append((gap_ms, q(0.5), q(0.9), q(0.99), times[-1], sum(t >= 20 for t in times), counter.count))
            print(f"gap {gap_ms:2d} ms: p50 {q(0.5):.1f} ms, p90 {q(0.9):.1f}, p99 {q(0.99):.1f}, max {times[-1]:.1f}; "
                  f"{rows[-1][5]}/{a.n} took 20 ms or more; CONCURRENT_TRANSACTIONS answers: {counter.count}",
                  flush=True)
    finally:
        admin.delete_topics([data, progress])
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with open(a.out, "w") as f:
        f.write(f"# Kafka transactions begun right after the last commit\n\n`bench/kafka_txn_gap.py`, {when}, "
                f"librdkafka {libversion()[0]}, the local broker of `make up`, {a.n} transactions per gap, one run "
                f"(load average {load} at the end). A transaction is begin, one 200-byte record to a 3-partition "
                f"topic, one to a 1-partition topic, commit.\n\n"
                "| gap after the last commit | p50 | p90 | p99 | max | took >= 20 ms | CONCURRENT_TRANSACTIONS |\n"
                "|---:|---:|---:|---:|---:|---:|---:|\n")
        for g, p50, p90, p99, mx, slow, conc in rows:
            f.write(f"| {g} ms | {p50:.1f} ms | {p90:.1f} | {p99:.1f} | {mx:.1f} | {slow}/{a.n} | {conc} |\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
