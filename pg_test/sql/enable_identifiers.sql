-- enable_identifiers: tables and columns whose names need quoting work everywhere (catalog row,
-- publication, REPLICA IDENTITY changes), and names that look like SQL are only names.
\set SHOW_CONTEXT never
CREATE SCHEMA "CDC Regress";
CREATE SCHEMA cdc_regress;
SET search_path = cdc_regress, public;

-- Mixed case and spaces, in a schema that needs quoting too.
CREATE TABLE "CDC Regress"."Order Items" ("Item ID" int PRIMARY KEY, "Unit Price" numeric, "select" text);
SELECT cdc_enable('"CDC Regress"."Order Items"', '{
    "include_columns": ["Item ID", "Unit Price", "select"],
    "key_columns": ["Item ID"],
    "partition_key": "Unit Price",
    "include_before_image": true
  }') IS NOT NULL AS enabled;
SELECT relreplident FROM pg_class WHERE oid = '"CDC Regress"."Order Items"'::regclass;
-- Column names are matched exactly, as PostgreSQL stores them.
SELECT cdc_enable('"CDC Regress"."Order Items"', '{"key_columns": ["item id"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('"CDC Regress"."Order Items"', '{"key_columns": ["\"Item ID\""]}'); \echo SQLSTATE :SQLSTATE

-- Unicode names.
CREATE TABLE "Bestellungen_größe" ("Schlüssel" int PRIMARY KEY, "Größe" text, "注文" text);
SELECT cdc_enable('"Bestellungen_größe"', '{"exclude_columns": ["注文"], "partition_key": "Größe"}') IS NOT NULL AS enabled;
SELECT cdc_enable('"Bestellungen_größe"', '{"exclude_columns": ["Grösse"]}'); \echo SQLSTATE :SQLSTATE

-- A table whose name is an SQL injection attempt: only a name, quoted wherever pg_cdc builds SQL.
CREATE TABLE victims (id int PRIMARY KEY);
CREATE TABLE "evil""; DROP TABLE victims; --" (id int PRIMARY KEY, v text);
SELECT cdc_enable('"evil""; DROP TABLE victims; --"', '{"include_before_image": true}') IS NOT NULL AS enabled;

SELECT table_name, key_columns, previous_replica_identity AS prev_ri,
       table_oid = table_name::regclass::oid AS name_resolves
  FROM _cdc_publications ORDER BY table_name COLLATE "C";
SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = '_cdc_publication'
 ORDER BY schemaname COLLATE "C", tablename COLLATE "C";

-- Column names that are injection attempts are unknown columns, and nothing is executed.
SELECT cdc_enable('victims', '{"include_columns": ["id\"; DROP TABLE victims; --"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('victims', '{"key_columns": ["id) ; DROP TABLE victims; --"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('victims', '{"partition_key": "''; DROP TABLE victims; --"}'); \echo SQLSTATE :SQLSTATE
-- A table name that is an injection attempt is not a valid name for the regclass argument.
SELECT cdc_enable('victims; DROP TABLE victims'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('victims''); DROP TABLE victims; --'); \echo SQLSTATE :SQLSTATE
SELECT to_regclass('victims') IS NOT NULL AS victims_still_there;

-- cdc_disable restores the replica identity of the odd names too.
SELECT cdc_disable('"CDC Regress"."Order Items"');
SELECT cdc_disable('"Bestellungen_größe"');
SELECT cdc_disable('"evil""; DROP TABLE victims; --"');
SELECT relname, relreplident FROM pg_class
 WHERE oid IN ('"CDC Regress"."Order Items"'::regclass, '"evil""; DROP TABLE victims; --"'::regclass)
 ORDER BY relname COLLATE "C";
SELECT count(*) AS captured FROM _cdc_publications;
SELECT count(*) AS published_tables FROM pg_publication_tables WHERE pubname = '_cdc_publication';

-- Clean up.
SET client_min_messages = warning;
DROP SCHEMA cdc_regress CASCADE;
DROP SCHEMA "CDC Regress" CASCADE;
RESET client_min_messages;
