-- privileges: a role that was granted nothing can neither call the pg_cdc functions nor read or
-- change its catalog, not even for a table it owns.
\set SHOW_CONTEXT never
CREATE SCHEMA cdc_regress;
SET search_path = cdc_regress, public;
CREATE TABLE orders (id int PRIMARY KEY);
SELECT cdc_enable('orders') IS NOT NULL AS enabled;
SELECT cdc_add_sink('regress_priv', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}') IS NOT NULL AS added;

CREATE ROLE regress_cdc_nobody NOLOGIN;
GRANT USAGE, CREATE ON SCHEMA cdc_regress TO regress_cdc_nobody;
SET ROLE regress_cdc_nobody;
CREATE TABLE own_table (id int PRIMARY KEY);

-- Every function: 42501.
SELECT cdc_enable('own_table'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"operations": ["INSERT"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_disable('orders'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_nobody', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_drop_sink('regress_priv'); \echo SQLSTATE :SQLSTATE
SELECT cdc_delivery_status('regress_priv'); \echo SQLSTATE :SQLSTATE
-- Invalid input does not reveal anything either: the privilege check comes first.
SELECT cdc_add_sink('regress_nobody', 'kafak', '[]'); \echo SQLSTATE :SQLSTATE

-- The catalog tables (sink configs may hold credentials): 42501 for reads and writes.
SELECT sink_name, config FROM _cdc_sinks; \echo SQLSTATE :SQLSTATE
SELECT table_name FROM _cdc_publications; \echo SQLSTATE :SQLSTATE
SELECT sink_name FROM _cdc_offsets; \echo SQLSTATE :SQLSTATE
DELETE FROM _cdc_sinks; \echo SQLSTATE :SQLSTATE
UPDATE _cdc_publications SET config = '{}'; \echo SQLSTATE :SQLSTATE
INSERT INTO _cdc_offsets (sink_name, table_name, table_oid) VALUES ('regress_priv', 'orders', 0); \echo SQLSTATE :SQLSTATE

-- The same privileges, as the catalogs report them.
SELECT p.proname, has_function_privilege('regress_cdc_nobody', p.oid, 'EXECUTE') AS can_execute
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'cdc\_%'
 ORDER BY 1;
SELECT c.relname,
       has_table_privilege('regress_cdc_nobody', c.oid, 'SELECT') AS can_select,
       has_table_privilege('regress_cdc_nobody', c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE') AS can_write
  FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE '\_cdc\_%' AND c.relkind = 'r'
 ORDER BY 1;
RESET ROLE;

-- Nothing changed.
SELECT table_name, config FROM _cdc_publications ORDER BY 1;
SELECT sink_name FROM _cdc_sinks ORDER BY 1;

-- Clean up.
SELECT cdc_drop_sink('regress_priv');
SELECT cdc_disable('orders');
SET client_min_messages = warning;
DROP SCHEMA cdc_regress CASCADE;
RESET client_min_messages;
DROP ROLE regress_cdc_nobody;
-- The catalog is empty again for the tests that follow.
SELECT (SELECT count(*) FROM _cdc_publications) AS publications,
       (SELECT count(*) FROM _cdc_sinks) AS sinks,
       (SELECT count(*) FROM _cdc_offsets) AS offsets;
