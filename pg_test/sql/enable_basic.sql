-- enable_basic: cdc_enable / cdc_disable on ordinary tables: the catalog row, key columns, the
-- publication, REPLICA IDENTITY FULL for before images and its restoration.
\set SHOW_CONTEXT never
CREATE SCHEMA cdc_regress;
SET search_path = cdc_regress, public;

CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, amount numeric(10,2), note text);
CREATE TABLE order_lines (order_id int, line_no int, sku text NOT NULL, qty int,
                          PRIMARY KEY (line_no, order_id));
-- No primary key, but a replica identity index.
CREATE TABLE events (event_no bigint NOT NULL, source text NOT NULL, payload jsonb);
CREATE UNIQUE INDEX events_source_no ON events (source, event_no);
ALTER TABLE events REPLICA IDENTITY USING INDEX events_source_no;
-- Already REPLICA IDENTITY FULL by its owner.
CREATE TABLE audit (id int PRIMARY KEY, what text);
ALTER TABLE audit REPLICA IDENTITY FULL;
-- A primary key and REPLICA IDENTITY NOTHING.
CREATE TABLE counters (name text PRIMARY KEY, n bigint);
ALTER TABLE counters REPLICA IDENTITY NOTHING;
-- In a schema that is not on the search_path.
CREATE SCHEMA cdc_regress_other;
CREATE TABLE cdc_regress_other.items (id int PRIMARY KEY);

-- The default config: every operation, every column, the primary key as message key.
SELECT cdc_enable('orders') IS NOT NULL AS enabled;
-- Named arguments; a composite primary key keeps its index order.
SELECT cdc_enable(table_name => 'order_lines', config => '{"operations": ["insert", "Update"]}') IS NOT NULL AS enabled;
-- key_columns taken from the replica identity index.
SELECT cdc_enable('events', '{"include_transaction_info": true}') IS NOT NULL AS enabled;
-- A qualified name is stored as regclass::text prints it.
SELECT cdc_enable('cdc_regress_other.items', '{"key_columns": ["id"], "capture_mode": "all_changes"}') IS NOT NULL AS enabled;

SELECT table_name, config, status, key_columns, previous_replica_identity AS prev_ri,
       previous_replica_identity_index IS NULL AS no_prev_index,
       publication_id IS NOT NULL AS has_id, created_at IS NOT NULL AS has_created_at,
       table_oid = table_name::regclass::oid AS oid_matches
  FROM _cdc_publications
 ORDER BY table_name;

-- Captured tables are in the publication; the others are not.
SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = '_cdc_publication'
 ORDER BY 1, 2;

-- Explicit key columns, include/exclude lists, partition_key and the planned keys' "off" values.
-- (Key columns outside the replica identity need before images: see enable_errors.)
SELECT cdc_enable('orders', '{
    "operations": ["INSERT", "UPDATE", "DELETE", "TRUNCATE"],
    "include_columns": ["id", "customer", "amount"],
    "exclude_columns": ["amount"],
    "key_columns": ["id"],
    "partition_key": "customer",
    "include_transaction_info": false,
    "include_user_context": false,
    "include_query_text": false,
    "compliance": {"redact_pii": false},
    "exactly_once": {"enabled": true, "checkpoint_interval_ms": 1000},
    "schema_evolution": {"enabled": false},
    "transformations": []
  }') IS NOT NULL AS enabled;
SELECT table_name, key_columns, config -> 'include_columns' AS include_columns
  FROM _cdc_publications WHERE table_name = 'orders';

-- Re-enabling replaces the config (NOTICE), keeps the publication_id, and keeps the table once in
-- the publication.
SELECT publication_id AS orders_id FROM _cdc_publications WHERE table_name = 'orders' \gset
SELECT cdc_enable('orders', '{"operations": ["INSERT"]}') = :'orders_id' AS same_id;
SELECT table_name, config, key_columns FROM _cdc_publications WHERE table_name = 'orders';
-- Insert-only now: the table moves to the publication that publishes no updates or deletes.
SELECT pubname FROM pg_publication_tables
 WHERE pubname LIKE '\_cdc\_publication%' AND schemaname = 'cdc_regress' AND tablename = 'orders';

-- include_before_image sets REPLICA IDENTITY FULL (NOTICE) and remembers the previous setting.
SELECT cdc_enable('orders', '{"include_before_image": true}') IS NOT NULL AS enabled;
SELECT relreplident FROM pg_class WHERE oid = 'orders'::regclass;
SELECT previous_replica_identity AS prev_ri FROM _cdc_publications WHERE table_name = 'orders';
-- Re-enabling with before images again changes nothing more.
SELECT cdc_enable('orders', '{"before_image": true, "operations": ["UPDATE", "DELETE"]}') IS NOT NULL AS enabled;
SELECT relreplident FROM pg_class WHERE oid = 'orders'::regclass;
SELECT previous_replica_identity AS prev_ri FROM _cdc_publications WHERE table_name = 'orders';
-- Re-enabling without before images puts back what pg_cdc changed.
SELECT cdc_enable('orders') IS NOT NULL AS enabled;
SELECT relreplident FROM pg_class WHERE oid = 'orders'::regclass;
SELECT previous_replica_identity AS prev_ri FROM _cdc_publications WHERE table_name = 'orders';

-- REPLICA IDENTITY USING INDEX: FULL while before images are captured, the index again after
-- cdc_disable.
SELECT cdc_enable('events', '{"include_before_image": true}') IS NOT NULL AS enabled;
SELECT relreplident FROM pg_class WHERE oid = 'events'::regclass;
SELECT previous_replica_identity AS prev_ri,
       previous_replica_identity_index = 'events_source_no'::regclass::oid AS prev_index_ok,
       key_columns
  FROM _cdc_publications WHERE table_name = 'events';
SELECT cdc_disable('events');
SELECT c.relreplident, i.indexrelid::regclass AS replica_identity_index
  FROM pg_class c LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisreplident
 WHERE c.oid = 'events'::regclass;

-- REPLICA IDENTITY NOTHING is restored too.
SELECT cdc_enable('counters', '{"include_before_image": true}') IS NOT NULL AS enabled;
SELECT relreplident FROM pg_class WHERE oid = 'counters'::regclass;
SELECT cdc_disable('counters');
SELECT relreplident FROM pg_class WHERE oid = 'counters'::regclass;

-- A table that was FULL before pg_cdc: no NOTICE, nothing to restore, still FULL afterwards.
SELECT cdc_enable('audit', '{"include_before_image": true}') IS NOT NULL AS enabled;
SELECT previous_replica_identity IS NULL AS nothing_to_restore FROM _cdc_publications WHERE table_name = 'audit';
SELECT cdc_disable('audit');
SELECT relreplident FROM pg_class WHERE oid = 'audit'::regclass;

-- cdc_disable with REPLICA IDENTITY FULL set by pg_cdc restores DEFAULT.
SELECT cdc_enable('orders', '{"include_before_image": true}') IS NOT NULL AS enabled;
SELECT cdc_disable('orders');
SELECT relreplident FROM pg_class WHERE oid = 'orders'::regclass;

-- Disabled tables leave the catalog and the publication.
SELECT table_name FROM _cdc_publications ORDER BY 1;
SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = '_cdc_publication'
 ORDER BY 1, 2;

-- Disabling a table that is not captured, or does not exist.
SELECT cdc_disable('orders'); \echo SQLSTATE :SQLSTATE
SELECT cdc_disable('no_such_table'); \echo SQLSTATE :SQLSTATE

-- NULL arguments are errors (22004), never a silent no-op.
SELECT cdc_enable(NULL); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', NULL); \echo SQLSTATE :SQLSTATE
SELECT cdc_disable(NULL); \echo SQLSTATE :SQLSTATE
SELECT count(*) AS captured FROM _cdc_publications WHERE table_name = 'orders';

-- Clean up.
SELECT cdc_disable('order_lines');
SELECT cdc_disable('cdc_regress_other.items');
SELECT count(*) AS captured FROM _cdc_publications;
SELECT count(*) AS published_tables FROM pg_publication_tables WHERE pubname = '_cdc_publication';
SET client_min_messages = warning;
DROP SCHEMA cdc_regress CASCADE;
DROP SCHEMA cdc_regress_other CASCADE;
RESET client_min_messages;
