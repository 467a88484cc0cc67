-- delegation: a member of cdc_admin manages capture and sinks without being a superuser, and
-- without REPLICATION or any right on the catalog, but only within limits: tables it may SELECT
-- (whole, no row-level security hiding rows), sinks that list their tables, no file while
-- cdc.admin_file_dir is not set, no librdkafka property that runs code, a postgres sink with its
-- own password file. pg_monitor reads every status function. Sinks point at 127.0.0.1:1.
\set SHOW_CONTEXT never
CREATE SCHEMA cdc_regress;
SET search_path = cdc_regress, public;
CREATE TABLE granted (id int PRIMARY KEY, note text);
CREATE TABLE secret (id int PRIMARY KEY, ssn text);
CREATE TABLE columns_only (id int PRIMARY KEY, note text);
CREATE TABLE guarded (id int PRIMARY KEY, owner name);
ALTER TABLE guarded ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON guarded USING (owner = current_user);
CREATE TABLE regions (code text PRIMARY KEY, name text);
INSERT INTO granted VALUES (1, 'one');

CREATE ROLE regress_cdc_admin NOLOGIN;
GRANT cdc_admin TO regress_cdc_admin;
GRANT USAGE, CREATE ON SCHEMA cdc_regress TO regress_cdc_admin;
GRANT SELECT ON granted, guarded TO regress_cdc_admin;
GRANT SELECT (id) ON columns_only TO regress_cdc_admin;
-- A table captured by a superuser that the admin may not read.
SELECT cdc_enable('secret') IS NOT NULL AS enabled;

-- The role itself: no superuser, no REPLICATION, nothing on the catalog.
SELECT rolsuper, rolreplication, rolcanlogin FROM pg_roles WHERE rolname = 'cdc_admin';
SELECT has_table_privilege('regress_cdc_admin', '_cdc_sinks', 'SELECT') AS reads_sinks,
       has_table_privilege('regress_cdc_admin', '_cdc_publications', 'INSERT') AS writes_publications;

SET ROLE regress_cdc_admin;

-- What it may do: capture a table it may read, add a sink carrying it (its slot made without
-- REPLICATION), see it, preview it, drop it.
SELECT cdc_enable('granted', '{"operations": ["INSERT", "UPDATE"]}') IS NOT NULL AS enabled;
-- (Before its Kafka sink exists: the history asks each Kafka sink's brokers for its consumers.)
SELECT jsonb_array_length(cdc_schema_history('granted') -> 'schema_versions') AS versions;
SELECT (cdc_force_schema_break('granted') ->> 'next_break_allowed')::boolean AS break_allowed;
SELECT cdc_add_sink('regress_admin_sink', 'kafka',
                    '{"bootstrap_servers": "127.0.0.1:1", "topic": "t", "tables": ["granted"]}') IS NOT NULL AS added;
SELECT sink_name, slot_name IS NOT NULL AS has_slot FROM cdc_status() WHERE sink_name = 'regress_admin_sink';
SELECT (cdc_delivery_status('regress_admin_sink') ->> 'sink') AS delivery_status;
SELECT jsonb_array_length(cdc_preview('granted') -> 'previews') AS previewed;
SELECT cdc_check_compatibility('granted', 'ADD COLUMN extra int') ->> 'compatibility_check' AS compatibility_check;
SELECT cdc_enable_multicloud('granted', '{"regional_routing": {"enabled": true, "routing_column": "note",
    "routes": {"one": ["regress_admin_sink"]}}}') IS NOT NULL AS routed;
SET client_min_messages = warning;  -- its NOTICE names the snapshot's id, which earlier tests move
SELECT count(*) AS snapshots_requested FROM cdc_snapshot('granted', 'regress_admin_sink', false);
RESET client_min_messages;
SELECT count(*) AS snapshots_cancelled FROM cdc_cancel_snapshot('granted', 'regress_admin_sink');
-- Its own name is recorded, not the superuser it acts as.
RESET ROLE;
SELECT allowed_by FROM _cdc_schema_breaks WHERE table_oid = 'granted'::regclass;
SELECT added_by::regrole AS added_by FROM _cdc_sinks WHERE sink_name = 'regress_admin_sink';
SELECT count(*) AS slots FROM pg_replication_slots s JOIN _cdc_sinks k USING (slot_name)
 WHERE k.sink_name = 'regress_admin_sink';
SET ROLE regress_cdc_admin;

-- A table sink's event table is the admin's own, created where its search_path says.
SELECT cdc_add_sink('regress_admin_table', 'table', '{"table": "admin_events", "tables": ["granted"]}') IS NOT NULL AS added;
RESET ROLE;
SELECT c.relnamespace::regnamespace AS schema, c.relowner::regrole AS owner FROM pg_class c WHERE c.relname = 'admin_events';
SET ROLE regress_cdc_admin;
SELECT cdc_drop_sink('regress_admin_table');

-- Refused (42501): a table it may not read, for each use of a table.
SELECT cdc_enable('secret', '{"operations": ["INSERT"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('columns_only'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('guarded'); \echo SQLSTATE :SQLSTATE
SELECT cdc_disable('secret'); \echo SQLSTATE :SQLSTATE
SELECT cdc_preview('secret'); \echo SQLSTATE :SQLSTATE
SELECT cdc_snapshot('secret'); \echo SQLSTATE :SQLSTATE
SELECT cdc_cancel_snapshot('secret'); \echo SQLSTATE :SQLSTATE
SELECT cdc_force_schema_break('secret'); \echo SQLSTATE :SQLSTATE
SELECT cdc_create_version_topic('secret', 2); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_refused', 'kafka',
                    '{"bootstrap_servers": "127.0.0.1:1", "topic": "t", "tables": ["granted", "secret"]}'); \echo SQLSTATE :SQLSTATE
-- ... and an enrich lookup table it may not read.
SELECT cdc_enable('granted', '{"transformations": [{"type": "enrich", "source_column": "note",
    "lookup_table": "regions", "lookup_column": "code", "add_columns": ["name"]}]}'); \echo SQLSTATE :SQLSTATE
-- A sink without tables would carry every captured table, secret too.
SELECT cdc_add_sink('regress_refused', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t"}'); \echo SQLSTATE :SQLSTATE
-- librdkafka properties that run a command or load code.
SELECT cdc_add_sink('regress_refused', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t", "tables": ["granted"],
    "properties": {"sasl.kerberos.kinit.cmd": "touch /tmp/pwned"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_refused', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t", "tables": ["granted"],
    "properties": {"plugin.library.paths": "/tmp/evil.so"}}'); \echo SQLSTATE :SQLSTATE
-- Files, while cdc.admin_file_dir is not set (a superuser's setting, hidden from the role): none.
-- (PostgreSQL words this refusal differently from version 16 on: only its SQLSTATE is shown.)
\set VERBOSITY sqlstate
SHOW cdc.admin_file_dir; \echo SQLSTATE :SQLSTATE
\set VERBOSITY default
RESET ROLE;
SHOW cdc.admin_file_dir;
SET ROLE regress_cdc_admin;
SELECT cdc_add_sink('regress_refused', 'kafka', '{"bootstrap_servers": "127.0.0.1:1", "topic": "t", "tables": ["granted"],
    "properties": {"ssl.ca.location": "/etc/ssl/certs/ca-certificates.crt"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_refused', 'webhook', '{"url": "http://127.0.0.1:1/x", "secret_file": "/etc/passwd",
    "tables": ["granted"]}'); \echo SQLSTATE :SQLSTATE
-- A postgres sink: its own password file, no service file.
SELECT cdc_add_sink('regress_refused', 'postgres', '{"connection": "host=127.0.0.1 dbname=postgres user=postgres",
    "tables": ["granted"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_add_sink('regress_refused', 'postgres', '{"connection": "service=analytics passfile=/x/pgpass",
    "tables": ["granted"]}'); \echo SQLSTATE :SQLSTATE
-- cdc_alter_sink checks the new config as cdc_add_sink checks one: a table it may not read, every
-- table (no "tables"), a property that runs code are refused, and change nothing; a topic changes.
SELECT cdc_alter_sink('regress_admin_sink', '{"tables": ["granted", "secret"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_alter_sink('regress_admin_sink', '{"tables": null}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_alter_sink('regress_admin_sink', '{"properties": {"plugin.library.paths": "/tmp/evil.so"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_alter_sink('regress_admin_sink', '{"topic": "t2"}') -> 'changed' AS changed;
-- It pauses and resumes its sink.
SELECT cdc_pause_sink('regress_admin_sink') AS paused, cdc_resume_sink('regress_admin_sink') AS resumed;
-- What stays with superusers.
SELECT cdc_create_tokenization_key(); \echo SQLSTATE :SQLSTATE
SELECT * FROM cdc_consume('regress_admin_sink'); \echo SQLSTATE :SQLSTATE
SET cdc.admin_file_dir = '/'; \echo SQLSTATE :SQLSTATE
RESET ROLE;

-- Nothing of the refused calls was recorded.
SELECT sink_name FROM _cdc_sinks ORDER BY 1;
SELECT table_name, config FROM _cdc_publications ORDER BY 1;

-- pg_monitor reads every status function, and changes nothing.
CREATE ROLE regress_cdc_monitor NOLOGIN;
GRANT pg_monitor TO regress_cdc_monitor;
GRANT USAGE ON SCHEMA cdc_regress TO regress_cdc_monitor;  -- to name the table
SET ROLE regress_cdc_monitor;
SELECT count(*) > 0 AS status FROM cdc_status();
SELECT (cdc_delivery_status('regress_admin_sink') ->> 'sink') AS delivery_status;
SELECT cdc_filter_metrics('granted') ? 'filtering' AS filter_metrics;
SELECT count(*) AS multicloud_rows FROM cdc_multicloud_status();
SELECT count(*) AS multicloud_rows FROM cdc_multicloud_status('granted');
SELECT cdc_metrics('granted') ? 'sink_metrics' AS metrics;
SELECT length(cdc_prometheus_metrics()) > 0 AS prometheus;
SELECT count(*) >= 0 AS snapshots FROM cdc_snapshots;
SELECT cdc_drop_sink('regress_admin_sink'); \echo SQLSTATE :SQLSTATE
RESET ROLE;

-- Every function's grants, as the catalogs report them.
SELECT p.proname,
       has_function_privilege('regress_cdc_admin', p.oid, 'EXECUTE') AS admin,
       has_function_privilege('regress_cdc_monitor', p.oid, 'EXECUTE') AS monitor
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'cdc\_%'
 ORDER BY 1;

-- Clean up.
SET ROLE regress_cdc_admin;
SELECT cdc_drop_sink('regress_admin_sink');
SELECT cdc_disable('granted');
RESET ROLE;
SELECT cdc_disable('secret');
SET client_min_messages = warning;
DROP SCHEMA cdc_regress CASCADE;
RESET client_min_messages;
DROP ROLE regress_cdc_admin;
DROP ROLE regress_cdc_monitor;
SELECT (SELECT count(*) FROM _cdc_publications) AS publications,
       (SELECT count(*) FROM _cdc_sinks) AS sinks,
       (SELECT count(*) FROM _cdc_offsets) AS offsets,
       (SELECT count(*) FROM _cdc_schema_breaks) AS breaks;
