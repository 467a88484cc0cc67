"""Writes the results of bench/e2e_bench.py: e2e.csv (every figure), e2e.md (tables, the goals,
the method and every setting) and e2e.png (charts). Only figures measured in the run are printed;
a figure that is missing (a section not run, a system that failed) shows as n/a."""
import csv
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

WORKLOADS = ("insert_200B", "insert_1KB", "update", "mixed")
EO, ALO, DBZ = "pg_cdc (exactly-once)", "pg_cdc (at-least-once)", "Debezium"
DBZ0 = "Debezium (linger.ms 0)"   # the latency section only
PEEK, RECV, PRODUCER, LOAD = "decoding alone (SQL peek)", "pg_recvlogical", "Kafka producer alone", "load alone"
THROUGHPUT_SYSTEMS = (EO, ALO, DBZ, PEEK, RECV, PRODUCER)
OVERHEAD_MODES = ("capture off", "pg_cdc", "Debezium")
# The goals of the read-path issue (docs/ARCHITECTURE.md, "The read path").
GOALS = {
    "ratio_debezium": 5.0,      # pg_cdc >= 5x Debezium throughput on every workload
    "ratio_limits": 0.8,        # pg_cdc >= 80 % of min(decoding alone, Kafka producer alone)
    "wal_decoded_ratio": 1.0,   # WAL decoded per WAL written (every record once; the issue: <= 2 MB again per batch)
    "p99_ms": {1000: 20.0, 5000: 30.0},   # exactly-once p99 at these rates
    "cpu_s_per_100k": 0.3,      # CPU seconds of pg_cdc's processes per 100,000 events (throughput workloads)
    "overhead_pct": 5.0,        # pgbench TPS overhead, pinned
    "worker_mib": 40.0,         # worker private memory at steady state
    "big_tx_mib": 64.0,         # ... and during the one large transaction
    "steady_cores": 0.15,       # pg_cdc's processes at the steady rate, one sink alone
    # One decoding shared by many sinks (issue 44, item 5); CPU ratios are CPU s per 100k events
    # of every pg_cdc process against the same with the busy sink alone.
    "idle_p99_ratio": 1.5,      # the busy sink's p99 with idle sinks / alone
    "idle_cpu_ratio": 1.2,      # pg_cdc's CPU with idle sinks / alone
    "identical_cpu_ratio": 1.3,  # ... with three identical sinks on the busy table / alone
    "example_cpu_ratio": 2.5,   # ... with seed example 1's three different sinks on it / alone
}
# The steady section's configurations (the "system" of its rows).
STEADY_ALONE, STEADY_IDENTICAL, STEADY_EXAMPLE = "alone", "3 identical sinks", "example 1's 3 sinks"
# The busy sink alone with the worker's catalog caches dropped at every read, as every read did
# before they were kept (cdc.test_reset_caches_each_read): what keeping them saves, side by side.
STEADY_RESET_CACHES = "alone, catalog caches dropped at every read"


def steady_idle_label(n):
    return f"{n} idle sinks"


def steady_members_poll_label(n):
    """The configuration with n idle sinks sharing one decoding, its members looking for new publishes
    as before the decoder woke them (cdc.test_members_poll_publishes): what waking them saves, side by side."""
    return f"{n} idle sinks, shared decoding, members polling as before"


def shared_label(label):
    """The label of a steady configuration run with cdc.shared_decoding on."""
    return f"{label}, shared decoding"


def steady_labels(sizes):
    plain = [STEADY_ALONE] + [steady_idle_label(n) for n in sizes.steady_idle] + [STEADY_IDENTICAL, STEADY_EXAMPLE]
    labels = [shared_label(p) if on else p for p in plain for on in sizes.steady_shared]
    labels += [STEADY_RESET_CACHES] if sizes.steady_reset_caches else []
    if sizes.steady_members_poll and sizes.steady_idle and True in sizes.steady_shared:
        labels.append(steady_members_poll_label(max(sizes.steady_idle)))
    return labels


def write(results, out_dir, sizes, quick):
    """Writes e2e.csv, e2e.md and e2e.png into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "e2e.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["section", "workload", "system", "metric", "value", "unit"])
        w.writeheader()
        for r in results.rows:
            w.writerow({**r, "value": round(r["value"], 3) if isinstance(r["value"], float) else r["value"]})
    (out_dir / "e2e.md").write_text(Markdown(results, sizes, quick).render())
    chart(results, out_dir / "e2e.png")
    print(f"wrote {out_dir / 'e2e.md'}, e2e.csv, e2e.png", flush=True)


def fmt(value, unit=""):
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:,.1f}"
    else:
        text = f"{value:,.2f}"
    return text + unit


def whole(value):
    """A count (sinks, runs, events) without decimals."""
    return "n/a" if value is None else f"{value:,.0f}"


def ratio(a, b):
    return a / b if a is not None and b else None


def verdict(value, goal, at_least):
    if value is None:
        return "not measured"
    return "met" if (value >= goal if at_least else value <= goal) else "**not met**"


class Markdown:
    """The report as Markdown; each method renders one section."""

    def __init__(self, results, sizes, quick):
        self.r, self.sizes, self.quick = results, sizes, quick

    def v(self, section, workload, system, metric):
        return self.r.get(section, workload, system, metric)

    def tput(self, workload, system):
        return self.v("throughput", workload, system, "events_per_s")

    def overhead_means(self, section="overhead"):
        """Mean pgbench TPS per mode over the rounds of `section` (overhead or overhead_pinned)."""
        means = {}
        for mode in OVERHEAD_MODES:
            values = [r["value"] for r in self.r.rows if r["section"] == section and r["system"] == mode]
            means[mode] = statistics.mean(values) if values else None
        return means

    def overhead_pct(self, section):
        means = self.overhead_means(section)
        off, on = means["capture off"], means["pg_cdc"]
        return 100 * (1 - on / off) if on and off else None

    def render(self):
        parts = [self.header(), self.goals(), self.throughput(), self.latency(), self.steady(), self.overhead(),
                 self.memory(), self.backlog(),
                 self.method(), self.settings()]
        if self.r.notes:
            parts.append("## Notes from the run\n\n" + "\n".join(f"- {n}" for n in self.r.notes) + "\n")
        return "\n".join(parts)

    def header(self):
        s = self.r.settings
        machine, run = s["machine"], s["run"]
        quick = ("\n**Quick run (`--quick`): at these small sizes the JVM-based figures (Debezium, Kafka producer "
                 "alone) are\nfar from warmed up, so the ratios are not meaningful; use the default sizes for "
                 "figures.**\n" if self.quick else "")
        return f"""# pg_cdc end to end, side by side with Debezium

`make bench-e2e` (bench/e2e_bench.py), started {run['started']}, took {run['duration']}. Every figure
in this file comes from that one run; e2e.csv has all of them, e2e.png draws them.
{quick}
**The machine is shared and has 2 cores** ({machine['CPU model']}, {machine['memory']}): PostgreSQL,
the Kafka broker, the system under test, the load generator and the reading consumer all run on them,
and another engineer's builds and tests may have been running too (load average
{machine['load average at start']} at the start, {machine['load average at end']} at the end). Each figure is a single run (but for
the steady section's medians): differences of 10-15 % are within the noise.
"""

    def goals(self):
        def worst(values, at_least):
            known = [x for x in values if x is not None]
            return (max(known) if not at_least else min(known)) if known else None

        rows = []
        vs_dbz = [ratio(self.tput(w, EO), self.tput(w, DBZ)) for w in WORKLOADS]
        rows.append((f"pg_cdc >= {GOALS['ratio_debezium']:.0f}x Debezium throughput on every workload "
                     "(exactly-once vs Debezium's at-least-once)",
                     ", ".join(f"{w}: {fmt(x, 'x')}" for w, x in zip(WORKLOADS, vs_dbz)),
                     verdict(worst(vs_dbz, True), GOALS["ratio_debezium"], True)))
        vs_limits = [self.limit_ratio(w) for w in WORKLOADS]
        rows.append((f"pg_cdc >= {100 * GOALS['ratio_limits']:.0f} % of min(decoding alone, Kafka producer alone)",
                     ", ".join(f"{w}: {fmt(x and 100 * x, ' %')}" for w, x in zip(WORKLOADS, vs_limits)),
                     verdict(worst(vs_limits, True), GOALS["ratio_limits"], True)))
        decoded = [self.v("throughput", w, EO, "wal_decoded_ratio") for w in WORKLOADS]
        decoded += [self.v("latency", f"{rate} tx/s", EO, "wal_decoded_ratio") for rate in self.sizes.rates]
        rows.append(("every WAL record decoded once (WAL decoded / WAL written, throughput and latency runs; "
                     "1.00x rounds WAL of other activity)", f"at most {fmt(worst(decoded, False), 'x')}",
                     verdict(worst(decoded, False) and round(worst(decoded, False), 2),
                             GOALS["wal_decoded_ratio"], False)))
        for rate, goal in GOALS["p99_ms"].items():
            p99 = self.v("latency", f"{rate} tx/s", EO, "append_p99_ms")
            visible = self.v("latency", f"{rate} tx/s", EO, "visible_p99_ms")
            rows.append((f"exactly-once p99 <= {goal:.0f} ms at {rate} tx/s (broker LogAppendTime - commit time)",
                         f"{fmt(p99, ' ms')} (seen by a read_committed consumer: {fmt(visible, ' ms')})",
                         verdict(p99, goal, False)))
            dbz = [x for x in (self.v("latency", f"{rate} tx/s", s, "append_p99_ms") for s in (DBZ, DBZ0))
                   if x is not None]
            if dbz:
                rows.append((f"exactly-once p99 below Debezium's at {rate} tx/s (the better of linger.ms 5 and 0)",
                             f"{fmt(p99, ' ms')} vs {fmt(min(dbz), ' ms')}",
                             verdict(p99 and p99 / min(dbz), 1.0, False)))
        cpu = [self.v("throughput", w, EO, "cpu_s_per_100k") for w in WORKLOADS]
        rows.append((f"CPU <= {GOALS['cpu_s_per_100k']} s per 100k events (pg_cdc exactly-once, throughput workloads)",
                     ", ".join(f"{w}: {fmt(x, ' s')}" for w, x in zip(WORKLOADS, cpu)),
                     verdict(worst(cpu, False), GOALS["cpu_s_per_100k"], False)))
        pinned, shared = self.overhead_pct("overhead_pinned"), self.overhead_pct("overhead")
        rows.append((f"pgbench TPS overhead <= {GOALS['overhead_pct']:.0f} % pinned (pg_cdc on vs capture off)",
                     f"{fmt(pinned, ' %')} pinned ({fmt(shared, ' %')} on shared cores)",
                     verdict(pinned, GOALS["overhead_pct"], False)))
        top = f"{self.sizes.rates[-1]} tx/s"
        steady = self.v("memory", top, EO, "private_median_mib")
        rows.append((f"worker private memory <= {GOALS['worker_mib']:.0f} MiB at steady state (median at {top})",
                     fmt(steady, " MiB"), verdict(steady, GOALS["worker_mib"], False)))
        big = next((r["workload"] for r in self.r.rows if r["section"] == "memory" and r["workload"].endswith("-row tx")),
                   None)
        big_max = self.v("memory", big, EO, "private_max_mib") if big else None
        rows.append((f"worker private memory <= {GOALS['big_tx_mib']:.0f} MiB during one "
                     f"{big.replace('-row tx', '') if big else 'large'}-row transaction",
                     fmt(big_max, " MiB"), verdict(big_max, GOALS["big_tx_mib"], False)))
        rows += self.steady_goals()
        table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
        return f"## Goals\n\n| goal | measured | verdict |\n|---|---|---|\n{table}\n"

    def steady_ratio(self, label, metric):
        """(label's median / alone's median, label's, alone's) of a steady metric."""
        wl = f"{self.sizes.steady_rate} tx/s"
        value, alone = self.v("steady", wl, label, metric), self.v("steady", wl, STEADY_ALONE, metric)
        return ratio(value, alone), value, alone

    def steady_goals(self):
        rows = []
        n = self.sizes.steady_repeats
        wl = f"{self.sizes.steady_rate} tx/s"
        median = f"median of {n} runs" if n > 1 else "one run"
        cores = self.v("steady", wl, STEADY_ALONE, "cores")
        rows.append((f"pg_cdc's processes <= {GOALS['steady_cores']} of a core at a steady {wl}, one sink alone "
                     f"({median})", fmt(cores, " cores"), verdict(cores, GOALS["steady_cores"], False)))

        def cpu_row(label, goal, what):
            x, value, alone = self.steady_ratio(label, "cpu_s_per_100k")
            rows.append((f"pg_cdc's CPU {what} <= {goal}x the busy sink's alone (CPU s per 100k events of every "
                         f"pg_cdc process, {median}, steady {wl})",
                         f"{fmt(x, 'x')} ({fmt(value, ' s')} / {fmt(alone, ' s')})", verdict(x, goal, False)))
        for shared in self.sizes.steady_shared:
            name = shared_label if shared else (lambda label: label)
            how = ", sinks sharing one decoding" if shared else ""
            if shared:
                cores = self.v("steady", wl, name(STEADY_ALONE), "cores")
                rows.append((f"pg_cdc's processes <= {GOALS['steady_cores']} of a core at a steady {wl}, one sink "
                             f"alone{how} ({median})", fmt(cores, " cores"),
                             verdict(cores, GOALS["steady_cores"], False)))
            for idle in self.sizes.steady_idle:
                label = name(steady_idle_label(idle))
                x, value, alone = self.steady_ratio(label, "visible_p99_ms")
                rows.append((f"busy sink's p99 with {idle} idle sinks{how} <= {GOALS['idle_p99_ratio']}x its p99 "
                             f"alone ({median}, steady {wl})",
                             f"{fmt(x, 'x')} ({fmt(value, ' ms')} / {fmt(alone, ' ms')})",
                             verdict(x, GOALS["idle_p99_ratio"], False)))
                cpu_row(label, GOALS["idle_cpu_ratio"], f"with {idle} idle sinks{how}")
            cpu_row(name(STEADY_IDENTICAL), GOALS["identical_cpu_ratio"],
                    f"with three identical sinks on the busy table{how}")
            cpu_row(name(STEADY_EXAMPLE), GOALS["example_cpu_ratio"],
                    f"with seed example 1's three different sinks on it{how}")
        return rows

    def limit_ratio(self, w):
        limits = [x for x in (self.tput(w, PEEK), self.tput(w, PRODUCER)) if x is not None]
        return ratio(self.tput(w, EO), min(limits)) if limits else None

    def throughput(self):
        head = ("| workload | pg_cdc exactly-once | pg_cdc at-least-once | Debezium | pg_cdc / Debezium | "
                "decoding alone (SQL peek) | pg_recvlogical | Kafka producer alone | pg_cdc / min(limits) | "
                "load alone |\n|---|" + "---:|" * 9)
        lines = []
        for w in WORKLOADS:
            lines.append(f"| {w} | {fmt(self.tput(w, EO))} | {fmt(self.tput(w, ALO))} | {fmt(self.tput(w, DBZ))} | "
                         f"{fmt(ratio(self.tput(w, EO), self.tput(w, DBZ)), 'x')} | {fmt(self.tput(w, PEEK))} | "
                         f"{fmt(self.tput(w, RECV))} | {fmt(self.tput(w, PRODUCER))} | "
                         f"{fmt(self.limit_ratio(w) and 100 * self.limit_ratio(w), ' %')} | "
                         f"{fmt(self.tput(w, LOAD))} |")
        cost_head = ("| workload | CPU s / 100k events: pg_cdc EO | pg_cdc ALO | Debezium | cores busy: pg_cdc EO | "
                     "pg_cdc ALO | Debezium | event bytes: pg_cdc | Debezium | pg_cdc EO: WAL decoded / WAL written |"
                     "\n|---|" + "---:|" * 9)
        cost = [f"| {w} | " + " | ".join(fmt(self.v("throughput", w, system, metric)) for metric in
                                         ("cpu_s_per_100k", "cores") for system in (EO, ALO, DBZ))
                + f" | {fmt(self.v('throughput', w, EO, 'value_bytes'))} | {fmt(self.v('throughput', w, DBZ, 'value_bytes'))}"
                + f" | {fmt(self.v('throughput', w, EO, 'wal_decoded_ratio'), 'x')} |"
                for w in WORKLOADS]
        return f"""## Throughput (events/s)

{self.sizes.events:,} events per measurement (rounded up to whole transactions), after a warm-up of
{self.sizes.warmup:,} events that each system had to deliver first. Events/s = events / (start of the
load -> the moment a read_committed consumer has seen the last one). "load alone" is how fast the
loader committed them (the ceiling of what can be measured this way).

{head}
{chr(10).join(lines)}

Cost: CPU seconds of the capturing processes (pg_cdc: its launcher and sink workers, which also decode,
since each keeps its decoding session in-process; Debezium: the JVM plus the walsender decoding for it)
during the timed load, per 100,000 events, and the same CPU time divided by the wall time (cores busy on
average); the size of the JSON value each system wrote; and for pg_cdc the WAL its decoding session
decoded divided by the WAL written during the load (its `decoding.wal_decoded_bytes` counter against
pg_current_wal_lsn; 1.0x = every record once):

{cost_head}
{chr(10).join(cost)}
"""

    def latency(self):
        head = ("| rate | system | achieved (pgbench) | broker p50 | p99 | p99.9 | consumer p50 | p99 | p99.9 |\n"
                "|---|---|---:|---:|---:|---:|---:|---:|---:|")
        lines = []
        for rate in self.sizes.rates:
            wl = f"{rate} tx/s"
            for system in (EO, ALO, DBZ, DBZ0):
                if self.v("latency", wl, system, "achieved_tps") is None:
                    continue
                cells = [fmt(self.v("latency", wl, system, f"{kind}_{p}_ms"), " ms")
                         for kind in ("append", "visible") for p in ("p50", "p99", "p999")]
                lines.append(f"| {wl} | {system} | {fmt(self.v('latency', wl, system, 'achieved_tps'))} tx/s | "
                             + " | ".join(cells) + " |")
        redecode = [f"- {system} at {rate} tx/s: {fmt(self.v('latency', f'{rate} tx/s', system, 'wal_decoded_ratio'), 'x')}"
                    for rate in self.sizes.rates for system in (EO, ALO)
                    if self.v("latency", f"{rate} tx/s", system, "wal_decoded_ratio") is not None]
        return f"""## End-to-end latency at fixed rates

pgbench -R at each rate for {self.sizes.latency_seconds} s (8 clients), one single-row INSERT (~200-byte row)
per transaction, synchronous_commit on; 3 s of the same load first as a warm-up. For every event of the
timed run: broker = Kafka's LogAppendTime (topics created with message.timestamp.type=LogAppendTime)
minus the commit time in the event (pg_cdc: metadata.timestamp, millisecond precision; Debezium:
source.ts_us); consumer = when this script's read_committed consumer (fetch.wait.max.ms=5) received it
minus the same commit time. For an exactly-once sink the consumer figure includes the Kafka
transaction commit, which the broker timestamp does not. Measured from when the consumer has read the
warm-up's events. pg_cdc runs without lingering (linger_ms 0, its default) and without a snapshot
(snapshot_mode never, as Debezium's snapshot.mode no_data); Debezium with the Java producer's linger.ms 5
and again with 0.

{head}
{chr(10).join(lines)}

pg_cdc's sink worker keeps its decoding session open across reads, so each WAL record is decoded once
(until then every read was a peek that decoded again from the slot's restart_lsn). WAL the session decoded
divided by the WAL written during each run above (WAL written by anything else on the server counts too):

{chr(10).join(redecode)}
"""

    def overhead_table(self, section):
        rounds = sorted({r["workload"] for r in self.r.rows if r["section"] == section})
        lines = [f"| {rnd} | " + " | ".join(fmt(self.v(section, rnd, m, "tps")) for m in OVERHEAD_MODES) + " |"
                 for rnd in rounds]
        means = self.overhead_means(section)
        lines.append("| mean | " + " | ".join(fmt(means[m]) for m in OVERHEAD_MODES) + " |")
        off = means["capture off"]
        lines.append("| overhead | - | " + " | ".join(
            fmt(100 * (1 - means[m] / off) if means[m] and off else None, " %") for m in OVERHEAD_MODES[1:]) + " |")
        return "| round | capture off | pg_cdc | Debezium |\n|---|---:|---:|---:|\n" + "\n".join(lines)

    def overhead(self):
        return f"""## Source overhead (pgbench TPC-B, TPS)

pgbench -i -s {self.sizes.pgbench_scale}; each run pgbench -n -c 4 -j 2 -T {self.sizes.pgbench_seconds}
(the built-in TPC-B-like script: 3 UPDATEs and 1 INSERT per transaction), after VACUUM of branches and
tellers and TRUNCATE of history. "pg_cdc": the four tables captured (pgbench_history INSERT-only: it has
no key) and a pg_cdc exactly-once sink running; "Debezium": the harness streaming the same tables.
Modes alternate within each round. wal_level is logical throughout (changing it needs a restart), so
"capture off" already pays for logical WAL.

On shared cores the capturing processes compete with pgbench for the same 2 cores: that is most of the
overhead measured here.

{self.overhead_table("overhead")}

Pinned: the postmaster and every process it runs (so every backend, pgbench's included) and pgbench on
CPU 0; the Kafka broker, the capturing processes (pg_cdc's launcher and sink worker; Debezium's JVM and
its walsender) and this script's consumer on CPU 1 (sched_setaffinity on every thread, taskset for
pgbench). What is left is what capture costs PostgreSQL itself: the WAL it reads, the catalog and
locks it shares, the slot it holds.

{self.overhead_table("overhead_pinned")}
"""

    def steady(self):
        sz = self.sizes
        wl = f"{sz.steady_rate} tx/s"
        lines, runs = [], []
        for label in steady_labels(sz):
            if self.v("steady", wl, label, "events") is None:
                continue
            m = lambda metric: self.v("steady", wl, label, metric)  # noqa: E731
            p99_x, cpu_x = self.steady_ratio(label, "visible_p99_ms")[0], self.steady_ratio(label, "cpu_s_per_100k")[0]
            lines.append(f"| {label} | {whole(m('sinks'))} | {whole(m('runs'))} | {whole(m('events'))} | "
                         f"{fmt(m('visible_p50_ms'))} | {fmt(m('visible_p99_ms'))} | {fmt(p99_x, 'x')} | "
                         f"{fmt(m('cores'))} | {fmt(m('cpu_s_per_100k'))} | {fmt(cpu_x, 'x')} | "
                         f"{fmt(m('busiest_cores'))} | {fmt(m('busiest_cpu_s_per_100k'))} | {fmt(m('catch_up_s'))} | "
                         f"{fmt(m('idle_cores'))} | {fmt(m('worker_mib_median'))} | {m('load_each_run')} |")
        for r in self.r.rows:
            if r["section"] == "steady_runs" and r["metric"] == "events":
                m = lambda metric: self.v("steady_runs", r["workload"], r["system"], metric)  # noqa: E731
                runs.append(f"| {r['system']} | {whole(m('events'))} | {fmt(m('visible_p50_ms'))} | "
                            f"{fmt(m('visible_p99_ms'))} | {fmt(m('cores'))} | {fmt(m('cpu_s_per_100k'))} | "
                            f"{fmt(m('busiest_cores'))} | {fmt(m('load_start'))} | {fmt(m('load_end'))} |")
        idle = " and ".join(str(n) for n in sz.steady_idle)
        times = "once" if sz.steady_repeats == 1 else f"{sz.steady_repeats} times"
        return f"""## A steady small load: one sink alone, next to idle sinks, next to more sinks on its table

pgbench -R {sz.steady_rate} for {sz.steady_seconds} s (8 clients, after 3 s of warm-up), one single-row INSERT
per transaction into one table (bench_steady_busy) that one exactly-once Kafka sink (JSON) carries — the
busy sink, whose latency is measured — in these configurations:

- **alone**;
- next to **{idle} idle sinks**: exactly-once Kafka sinks, each on an idle table of its own;
- **3 identical sinks**: next to 2 more sinks on the busy table with the busy sink's config, each
  with its own topic;
- **example 1's 3 sinks**: seed example 1 (examples/seed/1_order_pipeline.sql) puts three different
  sinks on `orders`: kafka_fulfillment (Kafka, Avro with a schema registry), kafka_analytics (Kafka,
  JSON) and kinesis_fraud (Kinesis, JSON). The busy sink plays kafka_analytics; next to it on the
  busy table, kafka_fulfillment (Kafka, `"format": "avro"` with the registry stand-in of `make up`,
  exactly-once, Kafka's default) and kinesis_fraud (`"region": "us-east-1", "format": "json"`,
  at-least-once, the Kinesis sink's only mode) into the local Kinesis-compatible server
  (kinesis-mock, a stream of 2 shards, as scripts/kinesis.sh creates the example's). What differs
  from the example: the table is bench_steady_busy captured with `{{}}` (the example's `orders` is
  captured with include_before_image, include_transaction_info and partition_key customer_region),
  the same table and capture in every configuration so that only the sinks differ; each sink
  carries that table only (`"tables"`; the example's sinks carry every captured table); the
  endpoints are the local stand-ins (Kafka 127.0.0.1, the registry stand-in instead of Confluent's
  Schema Registry, kinesis-mock instead of AWS), and kinesis-mock (node) runs on the same 2 cores.
  kinesis-mock stores a few hundred records a second here, fewer than the {sz.steady_rate:,} offered: the
  Kinesis sink finishes the timed load long after the load ends (catch-up below), so in this
  configuration "cores" is diluted over that wait and CPU s per 100k events is the figure to compare;
  a busy-sink latency far above the other configurations' means the slow sink held the busy one back;
- **alone, catalog caches dropped at every read**: alone, with `cdc.test_reset_caches_each_read` on, so
  that each read drops the worker's catalog caches after decoding as every read did before they were
  kept between reads (ARCHITECTURE.md, "Caches"): the CPU against **alone** is what keeping them saves.
- **{max(sz.steady_idle, default=0)} idle sinks, shared decoding, members polling as before**: the configuration
  with the most idle sinks, sharing one decoding, with `cdc.test_members_poll_publishes` on, so that the sinks
  reading the log look for new publishes as they did before the decoder woke them (every 5 ms after a pass
  that read, doubling up to `cdc.naptime_ms`, whatever table changed): its CPU and p99 against the same
  configuration without it are what waking them saves.

Each sink has its own worker process and slot. The busy table is emptied before each run (a new sink
first snapshots the rows its table holds). Every sink is `running` (_cdc_sinks.state) before the warm-up,
and every sink on the busy table has delivered the warm-up before the clock starts. Latency: commit time
-> seen by a read_committed consumer of the busy sink's topic. CPU: every pg_cdc process (the launcher
and each sink's worker, utime + stime from /proc), summed and the busiest single process, from the start
of the timed load until the busy sink's consumer saw the last event and every other sink on the busy
table delivered it too ("catch-up": how long after the busy sink that took); as cores (CPU / that wall
time) and as CPU s per 100k events of the busy table; "idle sinks' workers" is the part of it the idle
sinks' workers took together (by each worker's application_name). Ratios: the configuration's median against the
median alone (p99; CPU s per 100k events). Each configuration ran {times}, in
rounds (every configuration once per round); the table gives medians, with the 1-minute load average
at the start-end of each run (the machine is shared: compare the loads before the figures).

| configuration | sinks | runs | events | p50 ms | p99 ms | p99 / alone | pg_cdc cores | CPU s per 100k events | CPU / alone | busiest process: cores | busiest: CPU s per 100k | catch-up s | idle sinks' workers: cores | worker private MiB (median of workers) | load average, each run |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|
{chr(10).join(lines)}

Every run:

| configuration, run | events | p50 ms | p99 ms | pg_cdc cores | CPU s per 100k events | busiest process: cores | load average at start | at end |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(runs)}
"""

    def memory(self):
        lines = []
        for rate in self.sizes.rates:
            wl = f"{rate} tx/s"
            for system, who in ((EO, "pg_cdc worker (exactly-once sink)"), (ALO, "pg_cdc worker (at-least-once sink)"),
                                (DBZ, "Debezium JVM")):
                med = self.v("memory", wl, system, "private_median_mib")
                if med is not None:
                    lines.append(f"| steady, {wl} | {who} | {fmt(med, ' MiB')} | "
                                 f"{fmt(self.v('memory', wl, system, 'private_max_mib'), ' MiB')} |")
        big = [r for r in self.r.rows if r["section"] == "memory" and r["workload"].endswith("-row tx")]
        big_text = ""
        if big:
            wl = big[0]["workload"]
            lines.append(f"| during one {wl.replace('-row tx', '')}-row transaction | pg_cdc worker | "
                         f"{fmt(self.v('memory', wl, EO, 'private_before_mib'), ' MiB')} before | "
                         f"{fmt(self.v('memory', wl, EO, 'private_max_mib'), ' MiB')} |")
            big_text = (f"The {wl.replace('-row tx', '')}-row INSERT committed after "
                        f"{fmt(self.v('memory', wl, EO, 'commit_s'), ' s')}; its last event was visible in Kafka "
                        f"{fmt(self.v('memory', wl, EO, 'delivered_s'), ' s')} after the INSERT started "
                        f"(one Kafka transaction).\n")
        history = ""
        if any(r["section"] == "throughput" for r in self.r.rows):
            history = ("\nThe fixed-rate runs came after the throughput section, in the same worker process, so "
                       "its\nsteady-state figure includes what its memory allocator kept from those bursts.")
        return f"""## Memory

Private memory = Private_Clean + Private_Dirty + Swap from /proc/PID/smaps_rollup (Swap is 0: the
machine has no swap), i.e. pages no other process maps — shared_buffers and the shared library pages
the postmaster mapped are not in it. Sampled every 0.5 s during the fixed-rate runs (steady state) and
every 0.1 s during the large transaction. The pg_cdc worker is the backend whose ps title is
"postgres: pg_cdc worker" (pg_stat_activity.backend_type).{history}

| when | process | median | max |
|---|---|---:|---:|
{chr(10).join(lines)}

{big_text}"""

    def backlog(self):
        rows = [r for r in self.r.rows if r["section"] == "backlog"]
        if not rows:
            return ""
        wl = rows[0]["workload"]
        systems = list(dict.fromkeys(r["system"] for r in rows))
        lines = [f"| {s} | {fmt(self.v('backlog', wl, s, 'drain_s'), ' s')} | "
                 f"{whole(self.v('backlog', wl, s, 'events_per_s'))} | {fmt(self.v('backlog', wl, s, 'cores'))} | "
                 f"{fmt(self.v('backlog', wl, s, 'cpu_s_per_100k'))} | "
                 f"{fmt(self.v('backlog', wl, s, 'max_private_mib'), ' MiB')} | "
                 f"{whole(self.v('backlog', wl, s, 'processes'))} |" for s in systems]
        return f"""## A backlog of {wl}

Written (transactions of 1,000 rows of about 100 bytes) while the sinks were held (each waiting for a
lock on _cdc_sinks at its next pass), then released; exactly-once Kafka sinks on the one table. The
clock runs from the release until every sink counted every event delivered (its Kafka transactions
committed; cdc_delivery_status, polled every 0.1 s); each topic is then read back (read_committed) to
check that it holds every event (reading the topics back is slower than pg_cdc writes them). CPU
and memory are of every pg_cdc process (sink workers, launcher, and the decoder when the decoding is
shared); memory is the largest private memory of any of them, sampled every 0.2 s. One run each.

| configuration | drain | events/s per sink | pg_cdc cores | CPU s per 100k events delivered | largest process | processes |
|---|---:|---:|---:|---:|---:|---:|
{chr(10).join(lines)}
"""

    def method(self):
        return """## How each figure was measured

- **Same everything**: one PostgreSQL 15 cluster, one Kafka broker, one set of tables; the systems run
  one at a time (each pg_cdc sink is dropped and each Debezium JVM stopped before the next measurement).
  Every topic has 3 partitions; consumers are read_committed.
- **Workloads** are server-side procedures committing one transaction per loop iteration, run from
  their own session with synchronous_commit = off so the loader outruns the systems under test.
- **pg_cdc**: `cdc_enable(table, '{}')` on every table, one `cdc_add_sink(..., 'kafka', ...)` per
  measurement (settings below); exactly-once is the default delivery mode, at-least-once is
  `"exactly_once": false`.
- **Debezium**: bench/debezium/ (DebeziumBench.java): the embedded engine (debezium-embedded's async
  engine) with the PostgreSQL connector, its own slot and publication on the same tables, in-memory
  offsets; each batch is sent with a KafkaProducer and every send is awaited before the batch is marked
  processed (at-least-once, as Debezium Server's Kafka sink does).
- **Decoding alone**: a slot created just before pg_cdc's timed load, peeked once afterwards with
  `SELECT count(*) FROM pg_logical_slot_peek_binary_changes(slot, NULL, NULL, 'proto_version', '1',
  'publication_names', '_cdc_publication,_cdc_publication_inserts')` (the same publications pg_cdc
  reads). **pg_recvlogical**: a second such slot streamed to /dev/null with
  `-o proto_version=1 -o publication_names=... --endpos <WAL end> --no-loop` (process wall time).
- **Kafka producer alone**: org.apache.kafka.tools.ProducerPerformance (Java, from the broker's own
  jars) sending as many records as the workload's events, each the average size of pg_cdc's events
  for that workload, with the Java producer settings below (not transactional).
"""

    def settings(self):
        out = ["## Machine, versions and settings\n"]
        for name, values in self.r.settings.items():
            out.append(f"**{name}**\n")
            out.extend(f"- {k}: `{v}`" for k, v in values.items())
            out.append("")
        return "\n".join(out)


def legend(ax, **kwargs):
    """A legend, unless the panel has nothing labelled (a section that was not run)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def chart(results, path):
    """Four panels: throughput per workload, latency percentiles, pgbench TPS, worker memory."""
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    fig.suptitle("pg_cdc vs Debezium end to end into Kafka (2 shared cores; one run)")

    ax = axes[0][0]
    width = 0.8 / len(THROUGHPUT_SYSTEMS)
    for i, system in enumerate(THROUGHPUT_SYSTEMS):
        values = [results.get("throughput", w, system, "events_per_s") or 0 for w in WORKLOADS]
        ax.bar([x + i * width for x in range(len(WORKLOADS))], [v / 1000 for v in values], width, label=system)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(WORKLOADS))], WORKLOADS)
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 8)   # room for the legend above the bars
    ax.set_ylabel("thousand events/s (log scale)")
    ax.set_title("Throughput")
    legend(ax, fontsize=8, ncol=3, loc="upper center")

    ax = axes[0][1]
    groups = [(wl, system) for wl in sorted({r["workload"] for r in results.rows if r["section"] == "latency"},
                                             key=lambda s: int(s.split()[0]))
              for system in (EO, ALO, DBZ, DBZ0) if results.get("latency", wl, system, "achieved_tps") is not None]
    bars = [(kind, p, color) for kind in ("append", "visible")
            for p, color in (("p50", "tab:blue"), ("p99", "tab:orange"), ("p999", "tab:green"))]
    width = 0.8 / len(bars)
    for i, (kind, p, color) in enumerate(bars):
        values = [results.get("latency", wl, system, f"{kind}_{p}_ms") or 0 for wl, system in groups]
        ax.bar([x + i * width for x in range(len(groups))], values, width, color=color,
               label=f"{'broker' if kind == 'append' else 'consumer'} {p}", hatch="//" if kind == "visible" else None)
    ax.axhline(GOALS["p99_ms"][1000], color="red", linestyle="--", linewidth=1, label="goal: p99 20 ms at 1000 tx/s")
    short = {EO: "pg_cdc EO", ALO: "pg_cdc ALO", DBZ: "Debezium", DBZ0: "Debezium\nlinger 0"}
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))], [f"{short[s]}\n{wl}" for wl, s in groups],
                  fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 8)
    ax.set_ylabel("ms after commit")
    ax.set_title("End-to-end latency")
    legend(ax, fontsize=7, ncol=4, loc="upper center")

    ax = axes[1][0]
    for j, (section, name) in enumerate((("overhead", "shared cores"), ("overhead_pinned", "pinned"))):
        for i, mode in enumerate(OVERHEAD_MODES):
            values = [r["value"] for r in results.rows if r["section"] == section and r["system"] == mode]
            if values:
                x = i + 0.4 * j
                ax.bar(x, statistics.mean(values), 0.35, color=("tab:blue", "tab:orange")[j],
                       label=name if i == 0 else None)
                ax.plot([x] * len(values), values, "k.", label="single runs" if i == 0 and j == 0 else None)
    ax.set_xticks([i + 0.2 for i in range(len(OVERHEAD_MODES))], OVERHEAD_MODES)
    ax.set_ylabel("pgbench TPS (TPC-B)")
    ax.set_title("Source overhead")
    legend(ax, fontsize=8)

    ax = axes[1][1]
    samples = results.series.get("big_tx_memory", [])
    if samples:
        ax.plot([t for t, _ in samples], [kib / 1024 for _, kib in samples], label="pg_cdc worker, large transaction")
    ax.axhline(GOALS["big_tx_mib"], color="red", linestyle="--", linewidth=1, label="64 MiB (goal in a large transaction)")
    ax.set_xlabel("seconds since the INSERT started")
    ax.set_ylabel("private MiB")
    ax.set_title("pg_cdc worker memory during one large transaction")
    legend(ax, fontsize=8)

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
