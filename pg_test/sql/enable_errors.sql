-- enable_errors: every malformed cdc_enable config is refused with a SQLSTATE, the JSON path and a
-- HINT, and nothing is recorded.
\set SHOW_CONTEXT never
CREATE SCHEMA cdc_regress;
SET search_path = cdc_regress, public;
CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, amount numeric(10,2),
                     total numeric GENERATED ALWAYS AS (amount * 2) STORED);

-- The config is not a JSON object, or not JSON at all.
SELECT cdc_enable('orders', '[]'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '"operations"'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '42'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', 'null'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"operations": ["INSERT"]'); \echo SQLSTATE :SQLSTATE

-- Unknown keys: a likely typo gets "did you mean", anything else the list of keys.
SELECT cdc_enable('orders', '{"include_colums": ["id"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"Operations": ["INSERT"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"banana": 1}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"exactly_once": {"enabeld": false}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"compliance": {"redact": true}}'); \echo SQLSTATE :SQLSTATE

-- Wrong types name the JSON path.
SELECT cdc_enable('orders', '{"operations": "INSERT"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"operations": ["INSERT", 1]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"operations": ["INSERT", ""]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"include_columns": "id"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"exclude_columns": [["amount"]]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"key_columns": [null]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"include_before_image": "yes"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"before_image": 1}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"include_transaction_info": "true"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"partition_key": ["customer"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"partition_key": ""}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"capture_mode": 1}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"compliance": true}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"exactly_once": true}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"exactly_once": {"checkpoint_interval_ms": "1000"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"exactly_once": {"checkpoint_interval_ms": 0}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"exactly_once": {"checkpoint_interval_ms": 1.5}}'); \echo SQLSTATE :SQLSTATE
-- A message key outside the replica identity: deletes and key changes would not carry it (55000).
SELECT cdc_enable('orders', '{"key_columns": ["customer", "id"]}'); \echo SQLSTATE :SQLSTATE
-- full_audit judges the set of operations, not the length of the list.
SELECT cdc_enable('orders', '{"capture_mode": "full_audit", "operations": ["INSERT", "insert", "UPDATE"]}'); \echo SQLSTATE :SQLSTATE
-- PII columns without a word on redact_pii are ambiguous.
SELECT cdc_enable('orders', '{"compliance": {"pii_columns": ["customer"]}}'); \echo SQLSTATE :SQLSTATE
-- A computed column may not read a column the config leaves out.
SELECT cdc_enable('orders', '{"exclude_columns": ["customer"], "transformations": [{"type": "compute", "name": "n", "expression": "upper(customer)"}]}'); \echo SQLSTATE :SQLSTATE
-- Delivery is a property of the sink: a table cannot turn exactly-once off (the HINT names the sink setting).
SELECT cdc_enable('orders', '{"exactly_once": {"enabled": false, "checkpoint_interval_ms": 1000}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": {}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": 5}'); \echo SQLSTATE :SQLSTATE

-- Bad values.
SELECT cdc_enable('orders', '{"operations": ["INSERT", "UPSERT"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"operations": []}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"operations": ["INSERT", "INSERT"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"include_columns": []}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"key_columns": []}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"include_columns": ["id", "id"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"capture_mode": "everything"}'); \echo SQLSTATE :SQLSTATE

-- Columns that do not exist: 42703, with "did you mean" or the list of columns.
SELECT cdc_enable('orders', '{"include_columns": ["id", "amout"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"exclude_columns": ["zzz"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"key_columns": ["ID"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"key_columns": ["ctid"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"partition_key": "custmer"}'); \echo SQLSTATE :SQLSTATE
-- A generated column is not published by pgoutput, so it cannot be listed.
SELECT cdc_enable('orders', '{"include_columns": ["id", "total"]}'); \echo SQLSTATE :SQLSTATE

-- Two names of the same setting given together.
SELECT cdc_enable('orders', '{"before_image": true, "include_before_image": true}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"before_image": false, "include_before_image": true}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": "amount > 0", "filter_expression": "amount > 0"}'); \echo SQLSTATE :SQLSTATE

-- schema_evolution: one of Avro's four modes, and nothing to enforce without one.
SELECT cdc_enable('orders', '{"schema_evolution": {"compatibility_mode": "transitive"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"schema_evolution": {"compatibility_mode": "none", "enforce": true}}'); \echo SQLSTATE :SQLSTATE

-- Enrichment: the lookup table must exist, be keyed by the lookup column (its replica identity),
-- have the added columns, and match the source column's type; the name is never spliced into SQL.
CREATE TABLE customers (cid text PRIMARY KEY, segment text, region text);
CREATE TABLE customers_nokey (cid text, segment text);
CREATE TABLE customers_int (cid int PRIMARY KEY, segment text);
CREATE TABLE customers_ins (cid text PRIMARY KEY, segment text);
SELECT cdc_enable('customers_ins', '{"operations": ["INSERT"]}') IS NOT NULL AS insert_only;
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "lookup_table": "customers"}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "customer", "lookup_table": "nope", "lookup_column": "cid", "add_columns": ["segment"]}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "customer", "lookup_table": "customers; DROP TABLE orders", "lookup_column": "cid", "add_columns": ["segment"]}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "custmer", "lookup_table": "customers", "lookup_column": "cid", "add_columns": ["segment"]}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "customer", "lookup_table": "customers", "lookup_column": "cid", "add_columns": ["segmnt"]}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "customer", "lookup_table": "customers", "lookup_column": "segment", "add_columns": ["region"]}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "customer", "lookup_table": "customers_nokey", "lookup_column": "cid", "add_columns": ["segment"]}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "customer", "lookup_table": "customers_int", "lookup_column": "cid", "add_columns": ["segment"]}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "customer", "lookup_table": "customers_ins", "lookup_column": "cid", "add_columns": ["segment"]}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "customer", "lookup_table": "customers", "lookup_column": "cid", "add_columns": ["amount"]}]}'); \echo SQLSTATE :SQLSTATE
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "customer", "lookup_table": "customers", "lookup_column": "cid", "add_columns": ["segment"]}]}'); \echo SQLSTATE :SQLSTATE
ROLLBACK;
-- None of them recorded anything or touched the publications.
SELECT table_name FROM _cdc_publications ORDER BY 1;
SELECT tablename FROM pg_publication_tables WHERE pubname LIKE '\_cdc%' ORDER BY 1;
-- A valid one puts the lookup table in the publication with every change; cdc_disable takes it out.
SELECT cdc_enable('orders', '{"transformations": [{"type": "enrich", "source_column": "customer", "lookup_table": "customers", "lookup_column": "cid", "add_columns": ["segment"]}], "partition_key": "segment"}') IS NOT NULL AS enabled;
SELECT pubname, tablename FROM pg_publication_tables WHERE pubname LIKE '\_cdc%' ORDER BY 2;
SELECT cdc_disable('orders');
SELECT cdc_disable('customers_ins');
SELECT pubname, tablename FROM pg_publication_tables WHERE pubname LIKE '\_cdc%' ORDER BY 2;

-- Filters and computed columns: parsed by a SQL parser and checked against the table; nothing
-- in them is ever run by PostgreSQL.
SELECT cdc_enable('orders', '{"filter": "amount >"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": "amount > 0; DROP TABLE orders"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter_expression": "amount > 0) OR (1 = 1"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": "amout > 0"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": "amount > (SELECT max(amount) FROM orders)"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": "sum(amount) > 0"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": "random() > 0.5"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": "pg_sleep(10) IS NULL"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": "other.amount > 0"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": "customer > 5"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"filter": "amount + 1"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "compute", "name": "customer", "expression": "1"}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "compute", "name": "x", "expression": "amout * 2"}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"compliance": {"redact_pii": true, "pii_columns": ["customer"]}, "transformations": [{"type": "compute", "name": "x", "expression": "upper(customer)"}]}'); \echo SQLSTATE :SQLSTATE

-- Capture modes, compliance and masks: mistakes name the path.
SELECT cdc_enable('orders', '{"exactly_once": {"enabled": "yes"}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"capture_mode": "filtered"}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"capture_mode": "full_audit", "exclude_columns": ["customer"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"capture_mode": "full_audit", "operations": ["INSERT"]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "mask", "column": "customer"}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "mask", "column": "customer", "method": "encrypt"}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "mask", "column": "id", "method": "remove"}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"transformations": [{"type": "mask", "column": "nope", "method": "hash"}]}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"compliance": {"redact_pii": true}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"compliance": {"redact_pii": true, "pii_columns": ["ssn"]}}'); \echo SQLSTATE :SQLSTATE
SELECT cdc_enable('orders', '{"compliance": {"redact_pii": true, "pii_columns": ["customer"]}, "transformations": [{"type": "mask", "column": "customer", "method": "hash"}]}'); \echo SQLSTATE :SQLSTATE

-- None of the above was recorded, and the table is not in the publication.
SELECT count(*) AS captured FROM _cdc_publications;
SELECT count(*) AS published_tables FROM pg_publication_tables WHERE pubname = '_cdc_publication';

-- The "off" values of planned keys are accepted; null means "not given".
SELECT cdc_enable('orders', '{
    "capture_mode": "all_changes",
    "include_query_text": false,
    "include_user_context": false,
    "exactly_once": {"enabled": true, "checkpoint_interval_ms": 1000},
    "compliance": {"redact_pii": false, "pii_columns": [], "redaction_method": "hash", "audit_retention_days": 30},
    "schema_evolution": {"enabled": false, "compatibility_mode": "BACKWARD"},
    "transformations": [],
    "schema_evolution": {},
    "operations": null,
    "filter": null
  }') IS NOT NULL AS enabled;
SELECT table_name, key_columns FROM _cdc_publications ORDER BY 1;
-- A rejected re-enable keeps the config that was there.
SELECT cdc_enable('orders', '{"operations": ["MERGE"]}'); \echo SQLSTATE :SQLSTATE
SELECT config ->> 'capture_mode' AS capture_mode FROM _cdc_publications WHERE table_name = 'orders';

-- The table's filter metrics and preview: NULL and tables that are not captured.
SELECT cdc_preview('orders', max_rows => -1); \echo SQLSTATE :SQLSTATE
SELECT cdc_preview('orders', max_rows => NULL); \echo SQLSTATE :SQLSTATE
SELECT cdc_disable('orders');
SELECT cdc_filter_metrics(NULL); \echo SQLSTATE :SQLSTATE
SELECT cdc_filter_metrics('orders'); \echo SQLSTATE :SQLSTATE
SELECT cdc_preview('orders'); \echo SQLSTATE :SQLSTATE

-- Clean up.
SET client_min_messages = warning;
DROP SCHEMA cdc_regress CASCADE;
RESET client_min_messages;
