-- install: a fresh pg_cdc, its objects, its catalog, its publication and its privileges.
-- Errors print their SQLSTATE with "\echo SQLSTATE :SQLSTATE" (psql sets it after every statement;
-- 00000 means the statement succeeded). CONTEXT lines are left out: they name internal functions.
\set SHOW_CONTEXT never

-- Leftovers of an earlier, interrupted run. Dropping the extension drops its catalog; the worker
-- then drops the replication slots of sinks that no longer exist.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS pg_cdc CASCADE;
DROP SCHEMA IF EXISTS cdc_regress, cdc_regress_other, "CDC Regress" CASCADE;
DROP ROLE IF EXISTS regress_cdc_nobody;
DROP DATABASE IF EXISTS regress_cdc_other;
DROP FOREIGN DATA WRAPPER IF EXISTS regress_cdc_dummy CASCADE;
RESET client_min_messages;

CREATE EXTENSION pg_cdc;

-- Everything the extension owns. PostgreSQL 18 also records its tables' row types (and their array
-- types) as members: they come and go with the tables, so they are left out on every version.
SELECT pg_describe_object(classid, objid, objsubid) AS object
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_cdc')
   AND deptype = 'e'
   AND NOT (classid = 'pg_type'::regclass
            AND objid IN (SELECT t.oid FROM pg_type t
                           WHERE t.typrelid <> 0
                              OR t.typelem IN (SELECT e.oid FROM pg_type e WHERE e.typrelid <> 0)))
 ORDER BY 1;

SELECT e.extname, n.nspname AS schema, e.extrelocatable
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'pg_cdc';

-- The SQL functions: signatures, defaults, volatility, strictness, security.
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result,
       p.provolatile, p.proisstrict, p.prosecdef
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'cdc\_%'
 ORDER BY 1;

-- \df+ and \dv+ describe every function and view of the extension (COMMENT ON, in finalize.sql and
-- each upgrade script): a function or view added without a description is listed here.
SELECT pg_describe_object(d.classid, d.objid, 0) AS undescribed
  FROM pg_depend d
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_cdc')
   AND (d.classid = 'pg_proc'::regclass
        OR d.classid = 'pg_class'::regclass AND (SELECT relkind FROM pg_class WHERE oid = d.objid) = 'v')
   AND obj_description(d.objid, d.classid::regclass::name) IS NULL
 ORDER BY 1;
SELECT p.proname, obj_description(p.oid, 'pg_proc') AS description
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'cdc\_%'
 ORDER BY 1;

-- Catalog tables and their columns.
SELECT table_name, column_name, data_type, is_nullable, column_default IS NOT NULL AS has_default
  FROM information_schema.columns
 WHERE table_schema = 'public' AND table_name IN ('_cdc_publications', '_cdc_sinks', '_cdc_offsets')
 ORDER BY table_name, ordinal_position;

-- NOT NULL is in the columns above; PostgreSQL 18 also lists it as a constraint (contype 'n').
SELECT conrelid::regclass AS "table", conname, pg_get_constraintdef(oid) AS definition
  FROM pg_constraint
 WHERE conrelid IN ('_cdc_publications'::regclass, '_cdc_sinks'::regclass, '_cdc_offsets'::regclass)
   AND contype <> 'n'
 ORDER BY 1, 2;

-- The catalog starts empty.
SELECT (SELECT count(*) FROM _cdc_publications) AS publications,
       (SELECT count(*) FROM _cdc_sinks) AS sinks,
       (SELECT count(*) FROM _cdc_offsets) AS offsets;

-- The publication every sink's slot reads exists, publishes every operation and holds no table.
SELECT pubname, puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot
  FROM pg_publication
 WHERE pubname = '_cdc_publication';
SELECT count(*) AS published_tables FROM pg_publication_tables WHERE pubname = '_cdc_publication';

-- Nobody but the owner may execute the functions (EXECUTE revoked from PUBLIC) ...
SELECT p.proname,
       EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                WHERE a.grantee = 0) AS public_can_execute
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'cdc\_%'
 ORDER BY 1;

-- ... or read the catalog tables, which hold sink configs with credentials.
SELECT c.relname,
       EXISTS (SELECT 1 FROM aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
                WHERE a.grantee = 0) AS public_has_privileges
  FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE '\_cdc\_%' AND c.relkind = 'r'
 ORDER BY 1;

-- Server prerequisites the functions check.
SELECT current_setting('wal_level') AS wal_level,
       current_setting('cdc.database') = current_database() AS in_worker_database,
       'pg_cdc' = ANY (string_to_array(current_setting('shared_preload_libraries'), ',')) AS preloaded;

-- CREATE EXTENSION twice, and a second install in another database: the functions that configure
-- capture refuse every database but cdc.database, where the worker runs.
CREATE EXTENSION pg_cdc; \echo SQLSTATE :SQLSTATE
\set regress_db :DBNAME
CREATE DATABASE regress_cdc_other;
\c regress_cdc_other
\set SHOW_CONTEXT never
CREATE EXTENSION pg_cdc;
CREATE TABLE other_t (id int PRIMARY KEY);
SELECT cdc_enable('other_t'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('other_sink', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}'); \echo SQLSTATE :SQLSTATE
-- Nothing was recorded.
SELECT (SELECT count(*) FROM _cdc_publications) AS publications, (SELECT count(*) FROM _cdc_sinks) AS sinks;
\c :regress_db
\set SHOW_CONTEXT never
DROP DATABASE regress_cdc_other;
