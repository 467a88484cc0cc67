-- sink_basic: cdc_add_sink / cdc_drop_sink: the catalog row, the replication slot, tables lists,
-- topic templates. Every sink points at 127.0.0.1:1, where no broker listens; the columns the
-- worker writes (state, last_error, state_since) are never shown.
\set SHOW_CONTEXT never
CREATE SCHEMA cdc_regress;
SET search_path = cdc_regress, public;
CREATE TABLE orders (id int PRIMARY KEY, amount numeric);
CREATE TABLE customers (id int PRIMARY KEY, name text);

-- A sink before any table is captured: accepted, with a NOTICE.
SELECT cdc_add_sink('regress_first', 'kafka',
                    '{"bootstrap_servers": "127.0.0.1:1", "topic": "regress-orders"}') IS NOT NULL AS added;

SELECT cdc_enable('orders') IS NOT NULL AS enabled;
SELECT cdc_enable('customers') IS NOT NULL AS enabled;

-- Named arguments, a topic template, every Kafka setting that is built, properties passed through.
SELECT cdc_add_sink(sink_name => 'regress_full', sink_type => 'kafka', config => '{
    "bootstrap_servers": "127.0.0.1:1",
    "topic": "{database}.{schema}.{table}",
    "format": "json",
    "acks": "1",
    "compression": "zstd",
    "batch_size": 16384,
    "linger_ms": 5,
    "exactly_once": false,
    "include_transformations": false,
    "tables": ["orders", "cdc_regress.customers"],
    "properties": {"client.id": "regress", "message.max.bytes": 1000000, "socket.keepalive.enable": true}
  }') IS NOT NULL AS added;
-- acks spelled in each accepted way; null means "not given".
SELECT cdc_add_sink('regress_acks_all', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "{schema}.{table}", "acks": "all"}') IS NOT NULL AS added;
SELECT cdc_add_sink('regress_acks_minus_one', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t-1", "acks": -1, "compression": null}') IS NOT NULL AS added;
SELECT cdc_add_sink('regress_acks_one', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t_1", "acks": 1, "linger_ms": 0, "exactly_once": false}') IS NOT NULL AS added;
-- Exactly-once (the default) needs acks=all.
SELECT cdc_add_sink('regress_bad', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t_1", "acks": 1}'); \echo SQLSTATE :SQLSTATE

-- The catalog rows.
SELECT sink_name, sink_type, delivery_mode, config, table_oids IS NULL AS all_tables,
       sink_id IS NOT NULL AS has_id, created_at IS NOT NULL AS has_created_at
  FROM _cdc_sinks ORDER BY sink_name;
-- config.tables is resolved to OIDs, in the order given.
SELECT sink_name, table_oids = ARRAY['orders'::regclass::oid, 'customers'::regclass::oid] AS tables_resolved
  FROM _cdc_sinks WHERE sink_name = 'regress_full';
-- Each sink has its own logical slot, named after the sink id and created right away.
SELECT s.sink_name, s.slot_name = '_cdc_' || replace(s.sink_id::text, '-', '') AS slot_named_after_id,
       r.plugin, r.slot_type, r.database, r.temporary
  FROM _cdc_sinks s JOIN pg_replication_slots r ON r.slot_name = s.slot_name
 ORDER BY s.sink_name;

-- Names are case-sensitive and may contain anything (they are data, never SQL).
SELECT cdc_add_sink('Regress_First', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}') IS NOT NULL AS added;
SELECT cdc_add_sink('regress ''; DROP TABLE orders; --', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}') IS NOT NULL AS added;
SELECT cdc_add_sink('regress_ünïcødé_シンク', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}') IS NOT NULL AS added;
SELECT sink_name FROM _cdc_sinks ORDER BY sink_name COLLATE "C";
SELECT to_regclass('orders') IS NOT NULL AS orders_still_there;

-- A sink added in a transaction that already wrote: the worker creates its slot after COMMIT,
-- and its snapshot covers what commits in between. Rolled back, it leaves nothing behind.
BEGIN;
CREATE TABLE regress_tx_marker (id int);
SELECT cdc_add_sink('regress_in_tx', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}') IS NOT NULL AS added;
ROLLBACK;
-- Without a snapshot that would be a silent gap: refused.
BEGIN;
CREATE TABLE regress_tx_marker (id int);
SELECT cdc_add_sink('regress_in_tx', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t", "snapshot_mode": "never"}');
ROLLBACK;
SELECT count(*) AS in_catalog FROM _cdc_sinks WHERE sink_name = 'regress_in_tx';
-- Rolled back after the slot was created: the catalog row goes away with the transaction.
BEGIN;
SELECT cdc_add_sink('regress_rolled_back', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}') IS NOT NULL AS added;
ROLLBACK;
SELECT count(*) AS in_catalog FROM _cdc_sinks WHERE sink_name = 'regress_rolled_back';

-- Dropping: the catalog rows go at once (the worker drops the slots after COMMIT).
SELECT cdc_drop_sink('regress_first');
SELECT cdc_drop_sink('Regress_First');
SELECT cdc_drop_sink('regress ''; DROP TABLE orders; --');
SELECT cdc_drop_sink('regress_ünïcødé_シンク');
SELECT cdc_drop_sink('regress_full');
SELECT cdc_drop_sink('regress_acks_all');
SELECT cdc_drop_sink('regress_acks_minus_one');
SELECT cdc_drop_sink('regress_acks_one');
SELECT count(*) AS sinks FROM _cdc_sinks;
-- Dropped twice.
SELECT cdc_drop_sink('regress_first'); \echo SQLSTATE :SQLSTATE
-- A dropped name can be used again.
SELECT cdc_add_sink('regress_first', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "again"}') IS NOT NULL AS added;
-- The state is typed: only the worker's labels can be stored (a CHECK constraint, 23514).
\set VERBOSITY terse
UPDATE _cdc_sinks SET state = 'stopped' WHERE sink_name = 'regress_first'; \echo SQLSTATE :SQLSTATE
\set VERBOSITY default
SELECT state IN ('creating_slot', 'starting', 'snapshotting', 'running', 'retrying', 'error') AS known_state
  FROM _cdc_sinks WHERE sink_name = 'regress_first';
SELECT cdc_drop_sink('regress_first');

-- NULL arguments are errors (22004), never a silent no-op.
SELECT cdc_add_sink('regress_null', 'kafka', NULL); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink(NULL, 'kafka', '{"topic": "t"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_null', NULL, '{"topic": "t"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_drop_sink(NULL); \echo SQLSTATE :SQLSTATE
SELECT count(*) AS sinks FROM _cdc_sinks;

-- Clean up.
SELECT cdc_disable('orders');
SELECT cdc_disable('customers');
SET client_min_messages = warning;
DROP SCHEMA cdc_regress CASCADE;
RESET client_min_messages;
