-- sink_errors: every malformed cdc_add_sink call is refused with a SQLSTATE, the JSON path and a
-- HINT; secrets in the config never appear in a message; nothing is recorded.
\set SHOW_CONTEXT never
CREATE SCHEMA cdc_regress;
SET search_path = cdc_regress, public;
CREATE TABLE orders (id int PRIMARY KEY);
SELECT cdc_enable('orders') IS NOT NULL AS enabled;
SELECT cdc_add_sink('regress_sink', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "orders"}') IS NOT NULL AS added;

-- Names.
SELECT cdc_add_sink('regress_sink', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "other"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink(repeat('x', 201), 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_drop_sink('no_such_sink'); \echo SQLSTATE :SQLSTATE
SELECT cdc_drop_sink('REGRESS_SINK'); \echo SQLSTATE :SQLSTATE
SELECT cdc_drop_sink(''); \echo SQLSTATE :SQLSTATE

-- Sink types: unknown (22023, with the valid types), misspelt (did you mean), planned (0A000).
SELECT cdc_add_sink('regress_bad', 'mqtt', '{"topic": "t"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafak', '{"topic": "t"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'Kafka', '{"topic": "t"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', '', '{"topic": "t"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kinesis', '{"stream": "s"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kinesis', '{"stream_name": "s", "exactly_once": true}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kinesis', '{"stream_name": "orders/cdc"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'eventhub', '{}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'pubsub', '{}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'pulsar', '{}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'webhook', '{}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'postgres', '{}'); \echo SQLSTATE :SQLSTATE
-- The apply sink's connection string never holds a password (a password file or service file does).
SELECT cdc_add_sink('regress_bad', 'postgres', '{"connection": "host=/tmp password=hunter2"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'postgres', '{"connection": "postgresql://u:hunter2@h/db"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'table', '{}'); \echo SQLSTATE :SQLSTATE

-- Webhooks: a URL, at-least-once, a readable secret file, headers pg_cdc does not own.
SELECT cdc_add_sink('regress_bad', 'webhook', '{"url": "ftp://example.com/x"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'webhook', '{"url": "https://example.com/x", "exactly_once": true}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'webhook', '{"url": "https://example.com/x", "secret_file": "regress_no_such.key"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'webhook', '{"url": "https://example.com/x", "headers": {"X-Pg-Cdc-Signature": "forged"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'webhook', '{"url": "https://example.com/x", "headers": {"Authorization": 7}}'); \echo SQLSTATE :SQLSTATE

-- The config: not an object, unknown keys.
SELECT cdc_add_sink('regress_bad', 'kafka', '[]'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '"orders"'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topc": "orders"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "orders", "bootstrap.servers": "127.0.0.1:1"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "orders", "retries": 3}'); \echo SQLSTATE :SQLSTATE

-- Topic: missing, empty, wrong type, characters Kafka refuses, template placeholders, length.
SELECT cdc_add_sink('regress_bad', 'kafka', '{"bootstrap_servers": "127.0.0.1:1"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": null}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": ""}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": ["orders"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "orders cdc"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "cdc/{table}"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "commandes-été"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "cdc.{tabel}"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "cdc.{}"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "cdc.{table"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "cdc.table}"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', format('{"topic": "%s"}', repeat('t', 250))::jsonb); \echo SQLSTATE :SQLSTATE
-- A valid template, and the longest name Kafka allows.
SELECT cdc_add_sink('regress_template', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "{schema}.{table}"}') IS NOT NULL AS added;
SELECT cdc_add_sink('regress_long_topic', 'kafka', format('{"bootstrap_servers": "127.0.0.1:1", "topic": "%s"}', repeat('t', 249))::jsonb) IS NOT NULL AS added;

-- Delivery settings.
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "acks": 0}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "acks": "0"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "acks": "2"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "acks": true}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "compression": "brotli"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "compression": 1}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "batch_size": "16384"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "batch_size": 0}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "batch_size": 16384.5}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "batch_size": 2147483648}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "linger_ms": -1}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "bootstrap_servers": ""}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "bootstrap_servers": ["127.0.0.1:1"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "format": "xml"}'); \echo SQLSTATE :SQLSTATE

-- The protobuf format is for the Kafka-protocol sinks: 0A000 elsewhere.
SELECT cdc_add_sink('regress_bad', 'webhook', '{"url": "http://127.0.0.1:1/", "format": "protobuf"}'); \echo SQLSTATE :SQLSTATE
-- The debezium format is for Kafka sinks (0A000 elsewhere); its settings need it and are checked (22023).
SELECT cdc_add_sink('regress_bad', 'webhook', '{"url": "http://127.0.0.1:1/", "format": "debezium"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "debezium": {"schemas": false}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "format": "debezium", "debezium": {"decimal_handling_mode": "exact"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "format": "debezium", "debezium": {"topic_prefix": "a b"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "format": "debezium", "debezium": {"schema": true}}'); \echo SQLSTATE :SQLSTATE
-- The avro format: a registry URL that does not parse is 22023 (credentials never echoed), a
-- registry without avro too, and avro is for the Kafka-protocol sinks (0A000 elsewhere).
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "schema_registry": "http://127.0.0.1:1"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "format": "avro", "schema_registry": "schema-registry:8081"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "format": "avro", "schema_registry": "http://:8081"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "format": "avro", "schema_registry": "http://registry:99999"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "format": "avro", "schema_registry": "http://user:s3cret@registry:80x"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "format": "avro", "schema_registry": "http://registry:8081/?x=1"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'webhook', '{"url": "http://127.0.0.1:1/", "format": "avro"}'); \echo SQLSTATE :SQLSTATE
-- Snapshot modes: initial (the default), initial_only and never, spelled so; a chunk holds 1 to 1,000,000 rows.
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "snapshot_mode": "Initial_Only"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "snapshot_mode": "always"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "snapshot_chunk_size": 0}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "exactly_once": "yes"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "exactly_once": false, "transactional_id": "tx-1"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "transactional_id": ""}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "partition_key": 7}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "include_transformations": "yes"}'); \echo SQLSTATE :SQLSTATE

-- tables: wrong type, names that resolve to nothing.
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "tables": "orders"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "tables": [""]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "tables": []}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "checkpoint_interval_ms": 0}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "tables": ["orders", "orders"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t", "tables": ["orders", "no_such_table"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t", "tables": ["no_such_schema.orders"]}'); \echo SQLSTATE :SQLSTATE
-- A malformed name is refused before any lookup, with its path; so are relations that are not tables.
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "tables": ["o1; drop table o1"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "tables": ["pg_class"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": ".."}'); \echo SQLSTATE :SQLSTATE

-- properties: pg_cdc's own librdkafka settings cannot be overridden; values must be scalars.
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "properties": {"bootstrap.servers": "127.0.0.1:9092"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "properties": {"acks": "0"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "properties": {"enable.idempotence": false}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "properties": {"transactional.id": "x"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "properties": {"client.id": ["a"]}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', '{"topic": "t", "properties": "security.protocol=SSL"}'); \echo SQLSTATE :SQLSTATE

-- A secret in the config never appears in a message, whatever else is wrong.
\set secret 'Sup3r-S3cret-Passw0rd'
SELECT cdc_add_sink('regress_bad', 'kafka', format('{"topic": "t", "properties": {"sasl.password": "%s", "bootstrap.servers": "x"}}', :'secret')::jsonb); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', format('{"topic": "t", "properties": {"sasl.password": {"value": "%s"}}}', :'secret')::jsonb); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', format('{"topic": "t", "properties": {"sasl.password": "%s"}, "acks": 0}', :'secret')::jsonb); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', format('{"topic": "t", "propertes": {"sasl.password": "%s"}}', :'secret')::jsonb); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_sink', 'kafka', format('{"topic": "t", "properties": {"sasl.password": "%s"}}', :'secret')::jsonb); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_bad', 'kafka', format('{"topic": "t", "tables": ["nope"], "properties": {"sasl.password": "%s"}}', :'secret')::jsonb); \echo SQLSTATE :SQLSTATE
-- The same, checked by machine: no message, DETAIL or HINT of these errors contains the secret.
SELECT set_config('regress.secret', :'secret', false) IS NOT NULL AS secret_set;
DO $$
DECLARE
  secret text := current_setting('regress.secret');
  tmpl text;
  cfg jsonb;
  msg text; det text; hnt text;
  errors int := 0; leaks int := 0;
BEGIN
  FOREACH tmpl IN ARRAY ARRAY[
      '{"topic": "t", "properties": {"sasl.password": "@", "bootstrap.servers": "x"}}',
      '{"topic": "t", "properties": {"sasl.password": {"v": "@"}}}',
      '{"topic": "t", "properties": {"sasl.password": ["@"]}}',
      '{"topic": "t", "properties": {"sasl.password": "@"}, "acks": 0}',
      '{"topic": "t", "properties": {"sasl.password": "@"}, "batch_size": 0}',
      '{"topic": "t", "properties": {"sasl.password": "@"}, "compression": "brotli"}',
      '{"topic": "t", "properties": {"sasl.password": "@"}, "tables": ["nope"]}',
      '{"topic": "t", "properties": {"sasl.password": "@"}, "format": "xml"}',
      '{"topic": "t", "properties": {"sasl.password": "@"}, "unknown": 1}',
      '{"topic": "bad topic", "properties": {"sasl.password": "@"}}',
      '{"properties": {"sasl.password": "@"}}'
    ]::text[] LOOP
    cfg := replace(tmpl, '@', secret)::jsonb;
    BEGIN
      PERFORM cdc_add_sink('regress_bad', 'kafka', cfg);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
      errors := errors + 1;
      IF strpos(concat_ws(' ', msg, det, hnt), secret) > 0 THEN
        leaks := leaks + 1;
      END IF;
    END;
  END LOOP;
  RAISE NOTICE 'configs refused: %, messages showing the secret: %', errors, leaks;
END
$$;
SELECT set_config('regress.secret', '', false) = '' AS secret_cleared;

-- Accepted with a secret: it is kept in the catalog, which only its owner can read.
SELECT cdc_add_sink('regress_secret', 'kafka', format('{"bootstrap_servers": "127.0.0.1:1", "topic": "t", "properties": {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "cdc", "sasl.password": "%s"}}', :'secret')::jsonb) IS NOT NULL AS added;
SELECT config #>> '{properties,sasl.password}' = :'secret' AS stored FROM _cdc_sinks WHERE sink_name = 'regress_secret';

-- cdc_snapshot: the table must be captured, have a key to read chunks by, and be carried by the
-- sink named (or by some sink); a sink already snapshotting the table keeps that snapshot.
CREATE TABLE keyless (v int);
SELECT cdc_enable('keyless', '{"operations": ["insert"]}') IS NOT NULL AS enabled;
CREATE TABLE uncaptured (id int PRIMARY KEY);
SELECT cdc_add_sink('regress_other', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t", "tables": ["keyless"]}') IS NOT NULL AS added;
SELECT cdc_snapshot(NULL); \echo SQLSTATE :SQLSTATE
SELECT cdc_snapshot('uncaptured'); \echo SQLSTATE :SQLSTATE
SELECT cdc_snapshot('keyless'); \echo SQLSTATE :SQLSTATE
SELECT cdc_snapshot('orders', 'no_such_sink'); \echo SQLSTATE :SQLSTATE
SELECT cdc_snapshot('orders', 'regress_other'); \echo SQLSTATE :SQLSTATE
SELECT cdc_snapshot('orders', wait => NULL); \echo SQLSTATE :SQLSTATE
-- Waiting follows what the worker commits: not inside a transaction block, nor in REPEATABLE READ.
BEGIN;
SELECT cdc_snapshot('orders', wait => true); \echo SQLSTATE :SQLSTATE
ROLLBACK;
SET default_transaction_isolation = 'repeatable read';
SELECT cdc_snapshot('orders', wait => true); \echo SQLSTATE :SQLSTATE
RESET default_transaction_isolation;
SET client_min_messages = warning;
SELECT count(*) AS snapshots FROM cdc_snapshot('orders');
RESET client_min_messages;
SELECT sink_name, table_name, kind, state FROM cdc_snapshots ORDER BY sink_name, table_name;
-- cdc_cancel_snapshot: cancels the table's snapshots under way (all sinks', or one sink's) and
-- returns their ids; with none under way, a NOTICE and no row.
SELECT cdc_cancel_snapshot(NULL); \echo SQLSTATE :SQLSTATE
SELECT cdc_cancel_snapshot('orders', 'no_such_sink'); \echo SQLSTATE :SQLSTATE
SELECT count(*) AS cancelled FROM cdc_cancel_snapshot('orders');
SELECT cdc_cancel_snapshot('orders');
SELECT sink_name, table_name, kind, state, note LIKE 'cancelled by %' AS noted, finished_at IS NOT NULL AS finished
  FROM cdc_snapshots WHERE table_name = 'orders' ORDER BY sink_name;
SELECT cdc_drop_sink('regress_other');
SELECT cdc_disable('keyless');

-- Delivery status: NULL and unknown sinks are errors; a known sink answers in its documented shape
-- (its counters move only once the worker delivers, which these tests do not wait for).
SELECT cdc_delivery_status(NULL); \echo SQLSTATE :SQLSTATE
SELECT cdc_delivery_status('no_such_sink'); \echo SQLSTATE :SQLSTATE
SELECT s ->> 'sink' AS sink, s ->> 'delivery_mode' AS mode,
       (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(s) k) AS keys,
       (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(s -> 'transaction_status') k) AS transaction_status,
       (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(s -> 'offset_tracking') k) AS offset_tracking,
       (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(s -> 'deduplication') k) AS deduplication
  FROM cdc_delivery_status('regress_sink') s;

-- Only the sinks added above were recorded.
SELECT sink_name FROM _cdc_sinks ORDER BY 1;

-- Clean up.
SELECT cdc_drop_sink('regress_sink');
SELECT cdc_drop_sink('regress_template');
SELECT cdc_drop_sink('regress_long_topic');
SELECT cdc_drop_sink('regress_secret');
SELECT cdc_disable('orders');
SELECT count(*) AS sinks FROM _cdc_sinks;
SET client_min_messages = warning;
DROP SCHEMA cdc_regress CASCADE;
RESET client_min_messages;
