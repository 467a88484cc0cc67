-- schema_history: the versions of a captured table (cdc_schema_history), the compatibility check
-- of each ALTER TABLE (a WARNING, or with "enforce" an ERROR that rolls the DDL back), and
-- cdc_force_schema_break, cdc_create_version_topic. The product description's example 3, then the other kinds of change.
\set SHOW_CONTEXT never
CREATE SCHEMA cdc_schema;
SET search_path = cdc_schema, public;
-- History rows without the times and positions that change from run to run.
CREATE FUNCTION history(t regclass) RETURNS TABLE (version int, fields jsonb, changes jsonb, compatibility text,
                                                   checked_against text, forced boolean)
LANGUAGE sql AS $$
    SELECT (v->>'version')::int, v->'fields', v->'changes', v->>'compatibility', v->>'checked_against',
           (v->>'forced')::boolean
      FROM jsonb_array_elements(cdc_schema_history(t)->'schema_versions') v
$$;

CREATE TABLE orders (
    order_id VARCHAR(50) PRIMARY KEY,
    customer_id VARCHAR(50),
    total DECIMAL(10,2),
    status VARCHAR(20)
);
SELECT cdc_enable('orders', '{
    "schema_evolution": {
        "enabled": true,
        "compatibility_mode": "full",
        "schema_registry": "http://schema-registry:8081",
        "auto_register": true
    }
}'::jsonb) IS NOT NULL AS enabled;

-- Backward compatible (and forward: an old reader ignores the new field).
ALTER TABLE orders ADD COLUMN shipping_method VARCHAR(50) DEFAULT 'standard';
SELECT * FROM history('orders');
SELECT cdc_schema_history('orders') - 'schema_versions' AS rest;

-- A breaking change: a WARNING with the ways out, and the DDL commits.
ALTER TABLE orders ADD COLUMN required_field VARCHAR(50) NOT NULL;
SELECT version, changes, compatibility FROM history('orders') WHERE version = 3;

-- Under enforcement the same kind of change is an ERROR and rolls back: no column, no version.
SELECT cdc_enable('orders', '{"schema_evolution": {"compatibility_mode": "full", "enforce": true}}') IS NOT NULL AS enabled;
ALTER TABLE orders ADD COLUMN priority VARCHAR(10) NOT NULL; \echo SQLSTATE :SQLSTATE
SELECT count(*) AS priority_columns FROM pg_attribute WHERE attrelid = 'orders'::regclass AND attname = 'priority';
SELECT max(version) AS versions FROM history('orders');
-- A type that widens breaks forward; one that narrows, backward; a new encoding, both.
ALTER TABLE orders ALTER COLUMN total TYPE numeric(10,3); \echo SQLSTATE :SQLSTATE
ALTER TABLE orders ALTER COLUMN status TYPE varchar(10); \echo SQLSTATE :SQLSTATE
-- Compatible both ways: a longer varchar, a default changed, a nullable column dropped.
ALTER TABLE orders ALTER COLUMN status TYPE varchar(40);
ALTER TABLE orders ALTER COLUMN status SET DEFAULT 'new';
ALTER TABLE orders DROP COLUMN shipping_method;
-- Statements that change no column leave no version.
ALTER TABLE orders ADD CONSTRAINT total_positive CHECK (total >= 0);
ALTER TABLE orders SET (fillfactor = 90);
SELECT version, changes, compatibility FROM history('orders') WHERE version > 3;

-- cdc_force_schema_break lets the next breaking change through once, and the version says so.
SELECT cdc_force_schema_break('orders') -> 'next_break_allowed' AS allowed;
ALTER TABLE orders RENAME COLUMN status TO state;
SELECT version, changes, compatibility, forced FROM history('orders') WHERE version = 7;
ALTER TABLE orders RENAME COLUMN state TO status; \echo SQLSTATE :SQLSTATE
SELECT cdc_schema_history('orders') ? 'next_break_allowed' AS still_allowed;

-- A column the events never carry does not concern consumers.
SELECT cdc_enable('orders', '{"exclude_columns": ["customer_id"], "schema_evolution": {"compatibility_mode": "full", "enforce": true}}') IS NOT NULL AS enabled;
ALTER TABLE orders ALTER COLUMN customer_id TYPE integer USING 0;
SELECT version, changes, compatibility FROM history('orders') WHERE version = 8;

-- "enabled": false: the history is kept, nothing is checked.
SELECT cdc_enable('orders', '{"schema_evolution": {"enabled": false}}') IS NOT NULL AS enabled;
ALTER TABLE orders ADD COLUMN quantity integer NOT NULL;
SELECT version, compatibility, checked_against FROM history('orders') WHERE version = 9;

-- Without a schema_evolution block: backward, warned about.
CREATE TABLE items (id int PRIMARY KEY, sku text NOT NULL, qty int);
SELECT cdc_enable('items') IS NOT NULL AS enabled;
ALTER TABLE items ALTER COLUMN qty SET NOT NULL;
ALTER TABLE items ALTER COLUMN qty TYPE bigint;
SELECT version, changes, compatibility, checked_against FROM history('items');

-- cdc_check_compatibility: the product description's check, then one that passes and several at
-- once; nothing changes.
SELECT jsonb_pretty(cdc_check_compatibility(table_name => 'orders', proposed_change => 'ADD COLUMN priority VARCHAR(10) NOT NULL'));
SELECT cdc_enable('orders', '{"schema_evolution": {"compatibility_mode": "full"}}') IS NOT NULL AS enabled;
SELECT jsonb_pretty(cdc_check_compatibility('orders', 'ADD COLUMN priority VARCHAR(10) NOT NULL'));
SELECT c->'compatibility_check' AS check, c->'compatibility' AS compatibility, c->'recommendation' AS recommendation
  FROM cdc_check_compatibility('orders', 'ADD COLUMN priority VARCHAR(10) DEFAULT ''normal''') c;
SELECT c->'compatibility_check' AS check, jsonb_path_query_array(c, '$.changes[*].type') AS changes,
       jsonb_path_query_array(c, '$.issues[*].issue') AS issues
  FROM cdc_check_compatibility('orders', 'DROP COLUMN total, RENAME COLUMN state TO status, ALTER COLUMN quantity TYPE bigint') c;
SELECT max(version) AS versions_unchanged FROM history('orders');
SELECT cdc_check_compatibility('orders', 'ADD CONSTRAINT c CHECK (total > 0)'); \echo SQLSTATE :SQLSTATE
SELECT cdc_check_compatibility('orders', 'ADD COLUMN x int; DROP TABLE orders'); \echo SQLSTATE :SQLSTATE
SELECT cdc_check_compatibility('orders', 'ADD COLUM x int'); \echo SQLSTATE :SQLSTATE
SELECT cdc_check_compatibility('orders', 'DROP COLUMN nope'); \echo SQLSTATE :SQLSTATE
SELECT cdc_check_compatibility('orders', 'ADD COLUMN x widget'); \echo SQLSTATE :SQLSTATE
SELECT cdc_check_compatibility('orders', NULL); \echo SQLSTATE :SQLSTATE

-- An ALTER TABLE of a parent changes its inheritance children and partitions too, and reports
-- only the parent: each captured child gets its version all the same. So do the tables of a
-- composite type altered with ALTER TYPE.
CREATE TABLE parent (id int, note text);
CREATE TABLE child (extra int) INHERITS (parent);
ALTER TABLE child ADD PRIMARY KEY (id);
SELECT cdc_enable('child') IS NOT NULL AS enabled;
ALTER TABLE parent RENAME COLUMN note TO remark;
ALTER TABLE parent ADD COLUMN flag boolean DEFAULT false;
SELECT version, changes FROM history('child');
CREATE TABLE measurements (id int, at date, v int) PARTITION BY RANGE (at);
CREATE TABLE measurements_2026 PARTITION OF measurements FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
ALTER TABLE measurements_2026 ADD PRIMARY KEY (id, at);
SELECT cdc_enable('measurements_2026') IS NOT NULL AS enabled;
ALTER TABLE measurements ADD COLUMN unit text;
SELECT version, changes FROM history('measurements_2026');
DROP TABLE parent CASCADE;
DROP TABLE measurements;
CREATE TYPE reading AS (id int, value numeric);
CREATE TABLE readings OF reading (PRIMARY KEY (id));
SELECT cdc_enable('readings') IS NOT NULL AS enabled;
ALTER TYPE reading RENAME ATTRIBUTE value TO amount CASCADE;
ALTER TYPE reading ADD ATTRIBUTE unit text CASCADE;
SELECT version, changes FROM history('readings');
DROP TABLE readings;
DROP TYPE reading;

-- cdc_create_version_topic: the next version gets topics of its own (no sink here carries the
-- table, so the list is empty; test_schema.py runs it against Kafka), and a change that breaks
-- the mode is let through even under enforcement: it breaks nobody. The versions after it stay on
-- its topic.
CREATE TABLE invoices (id int PRIMARY KEY, amount numeric(10,2));
SELECT cdc_enable('invoices', '{"schema_evolution": {"compatibility_mode": "full", "enforce": true}}') IS NOT NULL AS enabled;
SELECT cdc_create_version_topic('invoices', 2);
SELECT cdc_schema_history('invoices') -> 'next_version_topic' AS armed;
ALTER TABLE invoices ADD COLUMN due date NOT NULL;
ALTER TABLE invoices ADD COLUMN note text;
SELECT v->'version' AS version, v->'own_topic' AS own_topic, v->'compatibility' AS compatibility
  FROM jsonb_array_elements(cdc_schema_history('invoices')->'schema_versions') v;
SELECT cdc_schema_history('invoices') ? 'next_version_topic' AS still_armed;
-- The version a DDL just recorded, in the DDL's own transaction (no sink can have read it yet).
SELECT cdc_enable('invoices', '{"schema_evolution": {"compatibility_mode": "full"}}') IS NOT NULL AS enabled;
BEGIN;
ALTER TABLE invoices DROP COLUMN due;
SELECT cdc_create_version_topic('invoices', 4) -> 'status' AS status;
COMMIT;
SELECT v->'version' AS version, v->'own_topic' AS own_topic FROM jsonb_array_elements(cdc_schema_history('invoices')->'schema_versions') v;
-- A committed version, an older one, one past the next, version 1, NULL.
SELECT cdc_create_version_topic('invoices', 4); \echo SQLSTATE :SQLSTATE
SELECT cdc_create_version_topic('invoices', 3); \echo SQLSTATE :SQLSTATE
SELECT cdc_create_version_topic('invoices', 7); \echo SQLSTATE :SQLSTATE
SELECT cdc_create_version_topic('invoices', 1); \echo SQLSTATE :SQLSTATE
SELECT cdc_create_version_topic('invoices', NULL); \echo SQLSTATE :SQLSTATE
DROP TABLE invoices;
SELECT count(*) AS version_topics_left FROM _cdc_version_topics;

-- Errors.
SELECT cdc_schema_history(NULL); \echo SQLSTATE :SQLSTATE
CREATE TABLE not_captured (id int PRIMARY KEY);
SELECT cdc_schema_history('not_captured'); \echo SQLSTATE :SQLSTATE
SELECT cdc_force_schema_break('not_captured'); \echo SQLSTATE :SQLSTATE
SELECT cdc_create_version_topic('not_captured', 2); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('items', '{"schema_evolution": {"compatibility_mode": "FULL"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('items', '{"schema_evolution": {"enabled": false, "enforce": true}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('items', '{"schema_evolution": {"schema_registry": "registry:8081"}}'); \echo SQLSTATE :SQLSTATE

-- cdc_disable and DROP TABLE forget the history.
SELECT cdc_disable('items');
SELECT count(*) AS item_versions FROM _cdc_schema_versions WHERE table_oid = 'items'::regclass;
DROP TABLE orders;
SELECT count(*) AS versions_left FROM _cdc_schema_versions;
DROP SCHEMA cdc_schema CASCADE;
