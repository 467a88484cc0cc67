-- enable_relations: which relations cdc_enable accepts. Tables without a primary key need an
-- identity unless only inserts are captured; relations whose changes are not logically decoded,
-- or that are not tables, are refused.
\set SHOW_CONTEXT never
CREATE SCHEMA cdc_regress;
SET search_path = cdc_regress, public;

-- No primary key: refused, because PostgreSQL would then refuse the application's own UPDATE and
-- DELETE on the published table.
CREATE TABLE clicks (user_id int, url text);
SELECT cdc_enable('clicks'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('clicks', '{"operations": ["INSERT", "UPDATE"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('clicks', '{"key_columns": ["user_id"]}'); \echo SQLSTATE :SQLSTATE
-- A unique index that is not the replica identity is not enough either.
CREATE UNIQUE INDEX clicks_user_url ON clicks (user_id, url);
SELECT cdc_enable('clicks', '{"operations": ["DELETE"]}'); \echo SQLSTATE :SQLSTATE
SELECT count(*) AS captured FROM _cdc_publications;
SELECT relreplident FROM pg_class WHERE oid = 'clicks'::regclass;

-- Accepted: inserts only (TRUNCATE needs no identity either) ...
SELECT cdc_enable('clicks', '{"operations": ["INSERT"]}') IS NOT NULL AS enabled;
SELECT cdc_enable('clicks', '{"operations": ["INSERT", "TRUNCATE"]}') IS NOT NULL AS enabled;
SELECT table_name, key_columns FROM _cdc_publications WHERE table_name = 'clicks';
-- An insert-only table goes into _cdc_publication_inserts, which publishes no updates or deletes,
-- so the application's own UPDATE and DELETE on it keep working.
SELECT pubname FROM pg_publication_tables WHERE tablename = 'clicks' AND pubname LIKE '\_cdc%';
UPDATE clicks SET url = url; \echo SQLSTATE :SQLSTATE
DELETE FROM clicks WHERE false; \echo SQLSTATE :SQLSTATE
-- ... or with before images (REPLICA IDENTITY FULL) ...
SELECT cdc_enable('clicks', '{"include_before_image": true}') IS NOT NULL AS enabled;
SELECT table_name, key_columns, previous_replica_identity AS prev_ri FROM _cdc_publications WHERE table_name = 'clicks';
SELECT cdc_disable('clicks');
SELECT relreplident FROM pg_class WHERE oid = 'clicks'::regclass;
-- ... or REPLICA IDENTITY USING INDEX, whose columns become the key ...
ALTER TABLE clicks ALTER user_id SET NOT NULL, ALTER url SET NOT NULL;
ALTER TABLE clicks REPLICA IDENTITY USING INDEX clicks_user_url;
SELECT cdc_enable('clicks') IS NOT NULL AS enabled;
SELECT table_name, key_columns FROM _cdc_publications WHERE table_name = 'clicks';
SELECT cdc_disable('clicks');
-- ... or REPLICA IDENTITY FULL set by the owner (no key columns unless given).
ALTER TABLE clicks REPLICA IDENTITY FULL;
SELECT cdc_enable('clicks') IS NOT NULL AS enabled;
SELECT cdc_enable('clicks', '{"key_columns": ["url", "user_id"]}') IS NOT NULL AS enabled;
SELECT table_name, key_columns FROM _cdc_publications WHERE table_name = 'clicks';
SELECT cdc_disable('clicks');
SELECT relreplident FROM pg_class WHERE oid = 'clicks'::regclass;

-- Tables whose changes are not written to the WAL.
CREATE UNLOGGED TABLE scratch (id int PRIMARY KEY);
SELECT cdc_enable('scratch'); \echo SQLSTATE :SQLSTATE
CREATE TEMPORARY TABLE tmp_orders (id int PRIMARY KEY);
SELECT cdc_enable('tmp_orders'); \echo SQLSTATE :SQLSTATE

-- A primary key under REPLICA IDENTITY NOTHING identifies nothing: refused like no key at all.
CREATE TABLE ri_nothing (k text PRIMARY KEY, n int);
ALTER TABLE ri_nothing REPLICA IDENTITY NOTHING;
SELECT cdc_enable('ri_nothing'); \echo SQLSTATE :SQLSTATE
DROP TABLE ri_nothing;

-- Inheritance: enabling the parent captures the parent only (ADD TABLE ONLY); a child's own
-- UPDATEs keep working and the child can be captured on its own.
CREATE TABLE parent_t (id int PRIMARY KEY, v int);
CREATE TABLE child_t (x int) INHERITS (parent_t);
INSERT INTO child_t VALUES (1, 1, 1);
SELECT cdc_enable('parent_t') IS NOT NULL AS enabled;
SELECT tablename FROM pg_publication_tables WHERE pubname = '_cdc_publication' AND tablename IN ('parent_t', 'child_t') ORDER BY 1;
UPDATE parent_t SET v = 3; \echo SQLSTATE :SQLSTATE
SELECT cdc_disable('parent_t');
DROP TABLE child_t, parent_t;

-- A captured table that is dropped leaves no catalog row behind (event trigger).
CREATE TABLE dropped_t (id int PRIMARY KEY, gone text);
SELECT cdc_enable('dropped_t') IS NOT NULL AS enabled;
-- Regression: dropping one of its columns is not dropping the table (capture used to be forgotten).
ALTER TABLE dropped_t DROP COLUMN gone;
SELECT count(*) AS still_captured FROM _cdc_publications WHERE table_name = 'dropped_t';
DROP TABLE dropped_t;
SELECT count(*) AS leftover FROM _cdc_publications WHERE table_name = 'dropped_t';

-- An OID that names no relation.
SELECT cdc_enable(4294967294::oid::regclass); \echo SQLSTATE :SQLSTATE

-- Relations that are not tables.
CREATE TABLE orders (id int PRIMARY KEY, amount numeric);
CREATE VIEW big_orders AS SELECT * FROM orders WHERE amount > 100;
SELECT cdc_enable('big_orders'); \echo SQLSTATE :SQLSTATE
CREATE MATERIALIZED VIEW order_totals AS SELECT sum(amount) AS total FROM orders;
SELECT cdc_enable('order_totals'); \echo SQLSTATE :SQLSTATE
CREATE FOREIGN DATA WRAPPER regress_cdc_dummy;
CREATE SERVER regress_cdc_remote FOREIGN DATA WRAPPER regress_cdc_dummy;
CREATE FOREIGN TABLE remote_orders (id int) SERVER regress_cdc_remote;
SELECT cdc_enable('remote_orders'); \echo SQLSTATE :SQLSTATE
CREATE SEQUENCE order_ids;
SELECT cdc_enable('order_ids'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders_pkey'); \echo SQLSTATE :SQLSTATE
CREATE TYPE money_pair AS (a numeric, b numeric);
SELECT cdc_enable('money_pair'); \echo SQLSTATE :SQLSTATE

-- Partitioned tables: the parent is refused, its partitions can be captured one by one.
CREATE TABLE measurements (id int, taken date, value numeric, PRIMARY KEY (id, taken))
  PARTITION BY RANGE (taken);
CREATE TABLE measurements_2024 PARTITION OF measurements
  FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
SELECT cdc_enable('measurements'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('measurements_2024') IS NOT NULL AS enabled;
SELECT table_name, key_columns FROM _cdc_publications WHERE table_name = 'measurements_2024';
SELECT cdc_disable('measurements_2024');

-- System catalogs and pg_cdc's own catalog.
SELECT cdc_enable('pg_class'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('pg_catalog.pg_namespace'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('information_schema.sql_features'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('_cdc_sinks'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('public._cdc_publications'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('_cdc_offsets'); \echo SQLSTATE :SQLSTATE

-- Tables that do not exist: the regclass argument refuses them before pg_cdc runs (a table in a
-- schema that does not exist is in pg_versions: PostgreSQL's answer differs between versions).
SELECT cdc_enable('no_such_table'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('"Orders"'); \echo SQLSTATE :SQLSTATE

-- Nothing refused above was recorded or published.
SELECT count(*) AS captured FROM _cdc_publications;
SELECT count(*) AS published_tables FROM pg_publication_tables WHERE pubname = '_cdc_publication';

-- A table that captures user context has a trigger on pg_cdc's function: DROP EXTENSION without
-- CASCADE is refused (2BP01) until it is cdc_disable'd (the sql-reference says so).
CREATE TABLE with_context (id int PRIMARY KEY);
SELECT cdc_enable('with_context', '{"include_user_context": true}') IS NOT NULL AS enabled;
BEGIN;
\set VERBOSITY terse
DROP EXTENSION pg_cdc; \echo SQLSTATE :SQLSTATE
\set VERBOSITY default
ROLLBACK;
SELECT cdc_disable('with_context');
DROP TABLE with_context;

-- Clean up.
SET client_min_messages = warning;
DROP SCHEMA cdc_regress CASCADE;
DROP TABLE tmp_orders;
DROP FOREIGN DATA WRAPPER regress_cdc_dummy CASCADE;
RESET client_min_messages;
