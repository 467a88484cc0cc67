-- upgrade: ALTER EXTENSION pg_cdc UPDATE from the previous release (0.1.0) keeps the sinks, their
-- slots and offsets, and delivery goes on; the result has exactly the objects of a fresh install.
-- Needs the dev Kafka broker (cdc.kafka_bootstrap_servers): delivery is waited for through
-- _cdc_offsets, which the worker updates once the broker acknowledged.
\set SHOW_CONTEXT never
SET client_min_messages = warning;

-- Every object of the extension, with what defines it (functions: signature, result, volatility,
-- strictness, security, settings, body or symbol, privileges, comment; tables: columns, defaults,
-- constraints, indexes, comments, privileges; event triggers).
CREATE FUNCTION pg_temp.cdc_objects() RETURNS TABLE (object text, definition text) LANGUAGE sql AS $$
    SELECT pg_describe_object(d.classid, d.objid, 0),
           CASE d.classid
           WHEN 'pg_proc'::regclass THEN (
               SELECT concat_ws(' | ', pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),
                                p.provolatile, p.proisstrict, p.prosecdef, p.proconfig::text, p.prosrc, p.probin,
                                p.proacl::text, obj_description(p.oid, 'pg_proc'))
                 FROM pg_proc p WHERE p.oid = d.objid)
           WHEN 'pg_class'::regclass THEN (
               SELECT concat_ws(' | ', c.relkind, c.relacl::text, obj_description(c.oid, 'pg_class'),
                        (SELECT string_agg(concat_ws(' ', a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                                                     pg_get_expr(ad.adbin, ad.adrelid), col_description(c.oid, a.attnum)),
                                           ', ' ORDER BY a.attnum)
                           FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                          WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                        (SELECT string_agg(x.conname || ' ' || pg_get_constraintdef(x.oid), ', ' ORDER BY x.conname)
                           FROM pg_constraint x WHERE x.conrelid = c.oid),
                        (SELECT string_agg(pg_get_indexdef(i.indexrelid), ', ' ORDER BY pg_get_indexdef(i.indexrelid))
                           FROM pg_index i WHERE i.indrelid = c.oid))
                 FROM pg_class c WHERE c.oid = d.objid)
           WHEN 'pg_event_trigger'::regclass THEN (
               SELECT concat_ws(' | ', t.evtevent, t.evtfoid::regproc::text, t.evtenabled)
                 FROM pg_event_trigger t WHERE t.oid = d.objid)
           END
      FROM pg_depend d
     WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
       AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_cdc')
$$;

-- Waits (up to 60 s) until the sink has published `n` events of upgrade_orders.
CREATE FUNCTION pg_temp.wait_published(n bigint, sink text DEFAULT 'regress_upgrade') RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..600 LOOP
        IF (SELECT coalesce(sum(events_published), 0) FROM _cdc_offsets WHERE sink_name = sink) >= n THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.1);
    END LOOP;
    RETURN false;
END $$;

-- Waits (up to 60 s) until the sink's snapshots are done; returns their states (rows_done depends
-- on timing: rows changed before their chunk was read count there and arrive as their changes).
CREATE FUNCTION pg_temp.wait_snapshot(sink text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    got text;
BEGIN
    FOR i IN 1..600 LOOP
        SELECT string_agg(s.state, ', ' ORDER BY s.snapshot_id) INTO got
          FROM _cdc_snapshots s JOIN _cdc_sinks k USING (sink_id) WHERE k.sink_name = sink;
        IF got IS NOT NULL AND got NOT LIKE '%pending%' AND got NOT LIKE '%running%' THEN
            RETURN got;
        END IF;
        PERFORM pg_sleep(0.1);
    END LOOP;
    RETURN got;
END $$;

-- A fresh install of the current version.
DROP EXTENSION IF EXISTS pg_cdc CASCADE;
CREATE EXTENSION pg_cdc;
CREATE TEMP TABLE fresh AS SELECT * FROM pg_temp.cdc_objects();
SELECT count(*) > 20 AS objects FROM fresh;

-- The previous release, in use: a captured table, a sink with its slot, changes delivered.
DROP EXTENSION pg_cdc CASCADE;
CREATE EXTENSION pg_cdc VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc';
DROP TABLE IF EXISTS upgrade_orders;
CREATE TABLE upgrade_orders (id int PRIMARY KEY, note text);
SELECT cdc_enable('upgrade_orders') IS NOT NULL AS enabled;
SELECT cdc_add_sink('regress_upgrade', 'kafka',
                    '{"topic": "regress-upgrade", "tables": ["upgrade_orders"]}') IS NOT NULL AS added;
INSERT INTO upgrade_orders SELECT g, 'before the update' FROM generate_series(1, 5) g;
SELECT pg_temp.wait_published(5) AS delivered;
CREATE TEMP TABLE before_update AS
    SELECT s.sink_id, s.slot_name, (SELECT sum(events_published) FROM _cdc_offsets o WHERE o.sink_name = s.sink_name) AS published
      FROM _cdc_sinks s;

-- The new library runs on the old catalog until the update: what needs the new catalog says so.
\set VERBOSITY terse
SELECT cdc_add_sink('regress_upgrade_table', 'table', '{"table": "upgrade_events"}'); \echo SQLSTATE :SQLSTATE
\set VERBOSITY default

ALTER EXTENSION pg_cdc UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_cdc';

-- The same sink, its slot and its offsets; delivery goes on.
SELECT s.sink_id = b.sink_id AS same_sink, s.slot_name = b.slot_name AS same_slot,
       EXISTS (SELECT 1 FROM pg_replication_slots r WHERE r.slot_name = s.slot_name) AS slot_kept,
       (SELECT sum(events_published) FROM _cdc_offsets o WHERE o.sink_name = s.sink_name) = b.published AS offsets_kept
  FROM _cdc_sinks s JOIN before_update b USING (sink_id);
-- A table captured before the update has its schema history from it: version 1, its columns.
SELECT v->'version' AS version, v->'fields' AS fields
  FROM jsonb_array_elements(cdc_schema_history('upgrade_orders')->'schema_versions') v;
INSERT INTO upgrade_orders SELECT g, 'after the update' FROM generate_series(6, 10) g;
SELECT pg_temp.wait_published(10) AS delivered;
SELECT sink_name, state, last_error FROM _cdc_sinks;

-- Exactly the objects of a fresh install, defined the same way (both lists are empty).
CREATE TEMP TABLE updated AS SELECT * FROM pg_temp.cdc_objects();
SELECT 'only after the update' AS side, * FROM (SELECT * FROM updated EXCEPT SELECT * FROM fresh) x
UNION ALL
SELECT 'only in a fresh install', * FROM (SELECT * FROM fresh EXCEPT SELECT * FROM updated) y
ORDER BY 1, 2;

-- What 0.2.0 added works on the updated catalog: the sink state is typed.
\set VERBOSITY terse
UPDATE _cdc_sinks SET state = 'stopped'; \echo SQLSTATE :SQLSTATE
\set VERBOSITY default

-- What 0.3.0 and 0.4.0 added works on the updated catalog: an in-database sink, consumed with
-- cdc_consume, starting with its snapshot (the 10 rows it found, as READ events; the order of the
-- READ chunk among the 3 inserts depends on timing, so the events are shown sorted).
DROP TABLE IF EXISTS upgrade_events;
SELECT cdc_add_sink('regress_upgrade_table', 'table',
                    '{"table": "upgrade_events", "tables": ["upgrade_orders"]}') IS NOT NULL AS added;
INSERT INTO upgrade_orders SELECT g, 'to the table sink' FROM generate_series(11, 13) g;
SELECT pg_temp.wait_published(13, 'regress_upgrade_table') AS delivered;
SELECT operation, event_key, event -> 'after' AS after FROM cdc_consume('regress_upgrade_table')
 ORDER BY operation, (event_key ->> 'id')::int;
SELECT pg_temp.wait_snapshot('regress_upgrade_table') AS snapshot;
SELECT count(*) AS left_to_consume FROM cdc_consume('regress_upgrade_table');
SELECT cdc_drop_sink('regress_upgrade_table');
DROP TABLE upgrade_events;

-- What 0.5.0 added works on the updated catalog: the sink added on 0.1.0 knows the name of the table
-- its `tables` resolved to, lists it as missing once the table is dropped, and carries the table
-- created again under that name once cdc_enable binds it.
SELECT table_names FROM _cdc_sinks WHERE sink_name = 'regress_upgrade';
DROP TABLE upgrade_orders;
SELECT missing_tables FROM cdc_status() WHERE sink_name = 'regress_upgrade';
CREATE TABLE upgrade_orders (id int PRIMARY KEY, note text);
SELECT cdc_enable('upgrade_orders') IS NOT NULL AS enabled;
SELECT missing_tables FROM cdc_status() WHERE sink_name = 'regress_upgrade';
SELECT table_oids = ARRAY['upgrade_orders'::regclass::oid] AS bound FROM _cdc_sinks WHERE sink_name = 'regress_upgrade';

-- Clean up (the worker drops the slot after COMMIT).
SELECT cdc_drop_sink('regress_upgrade');
SELECT cdc_disable('upgrade_orders');
DROP TABLE upgrade_orders;
RESET client_min_messages;
