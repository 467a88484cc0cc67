#!/usr/bin/env python3
"""Reads pg_cdc events from Kafka with an independent client (confluent-kafka, read_committed)
and prints them: the demo's proof that events really reached the broker.

    scripts/consume.py --topic orders-cdc --count 3 [--timeout 30] [--compact]
"""
import argparse
import json
import os
import sys
import time
import uuid

from confluent_kafka import Consumer


class Number(str):
    """A JSON number kept as its exact text (numeric 150.00 must print as 150.00, not 150.0)."""


def render(v, indent=0):
    """Pretty JSON that writes numbers exactly as received."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(v, Number):
        return str(v)
    if isinstance(v, dict):
        if not v:
            return "{}"
        items = ",\n".join(f"{inner}{json.dumps(k)}: {render(x, indent + 1)}" for k, x in v.items())
        return "{\n" + items + "\n" + pad + "}"
    if isinstance(v, list):
        if not v:
            return "[]"
        return "[\n" + ",\n".join(inner + render(x, indent + 1) for x in v) + "\n" + pad + "]"
    return json.dumps(v, ensure_ascii=False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=1, help="stop after this many messages")
    p.add_argument("--timeout", type=float, default=30.0, help="give up after this many seconds")
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--compact", action="store_true", help="one line per event")
    p.add_argument("--quiet", action="store_true", help="print only how many arrived")
    a = p.parse_args()
    c = Consumer({
        "bootstrap.servers": a.bootstrap,
        "group.id": "pg_cdc-consume-" + uuid.uuid4().hex,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
    })
    c.subscribe([a.topic])
    got = 0
    deadline = time.time() + a.timeout
    try:
        while got < a.count and time.time() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            got += 1
            key = m.key().decode() if m.key() else None
            where = f"{m.topic()}[{m.partition()}]@{m.offset()}"
            if a.quiet:
                continue
            if a.compact:
                print(f"{where} key={key} {m.value().decode()}")
            else:
                value = json.loads(m.value(), parse_float=Number, parse_int=Number)
                print(f"--- {where}  key={key}")
                print(render(value))
    finally:
        c.close()
    if a.quiet:
        print(f"{got} events read back from {a.topic}")
    if got < a.count:
        print(f"only {got} of {a.count} messages arrived on {a.topic} within {a.timeout}s", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
