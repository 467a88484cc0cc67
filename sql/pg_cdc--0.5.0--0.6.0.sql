-- pg_cdc 0.5.0 -> 0.6.0 (ALTER EXTENSION pg_cdc UPDATE). Keeps every sink, slot, offset and snapshot;
-- the worker delivers throughout. pg_test/sql/upgrade.sql checks that the result has exactly the
-- objects of a fresh 0.6.0 install.

-- Names a user can query: _cdc_offsets has one row per sink and table (keyed by the table's OID, so a
-- RENAME renames the row instead of starting a second one), its table_name without the schema, as the
-- product description's `WHERE table_name = 'orders'` expects, and the schema in table_schema.
ALTER TABLE @extschema@._cdc_offsets ADD COLUMN table_schema text;
-- A table renamed under 0.5.0 has a row per name it had: they become one, with every event counted.
UPDATE @extschema@._cdc_offsets o
   SET events_published = m.n, last_lsn = m.l, last_timestamp = m.t
  FROM (SELECT sink_name, table_oid, sum(events_published) AS n, max(last_lsn) AS l, max(last_timestamp) AS t
          FROM @extschema@._cdc_offsets GROUP BY sink_name, table_oid HAVING count(*) > 1) m
 WHERE o.sink_name = m.sink_name AND o.table_oid = m.table_oid;
DELETE FROM @extschema@._cdc_offsets o USING @extschema@._cdc_offsets k
 WHERE o.sink_name = k.sink_name AND o.table_oid = k.table_oid AND o.ctid > k.ctid;
UPDATE @extschema@._cdc_offsets o SET table_name = c.relname, table_schema = n.nspname
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid = o.table_oid;
-- A row whose table is gone (the drop trigger deletes them; none should be left) names nothing.
DELETE FROM @extschema@._cdc_offsets WHERE table_schema IS NULL;
ALTER TABLE @extschema@._cdc_offsets ALTER COLUMN table_schema SET NOT NULL,
    DROP CONSTRAINT _cdc_offsets_pkey, ADD PRIMARY KEY (sink_name, table_oid);
COMMENT ON COLUMN @extschema@._cdc_offsets.table_name IS 'the table''s name without its schema (table_schema), as of its last delivery: one row per table, a RENAME renames it';
COMMENT ON COLUMN @extschema@._cdc_offsets.table_schema IS 'the schema of the table, as of its last delivery';

-- cdc_snapshots names a table by its current schema and name, and a dropped one by those it had (the
-- drop trigger records them; a table dropped before the update has none).
ALTER TABLE @extschema@._cdc_snapshots ADD COLUMN dropped_schema text, ADD COLUMN dropped_name text;
COMMENT ON COLUMN @extschema@._cdc_snapshots.dropped_schema IS 'the schema of the table when it was dropped (cdc_snapshots shows the table''s current names while it exists)';
COMMENT ON COLUMN @extschema@._cdc_snapshots.dropped_name IS 'the name of the table when it was dropped';
CREATE OR REPLACE FUNCTION @extschema@._cdc_forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    dropped oid[];
    r record;
BEGIN
    IF to_regclass('@extschema@._cdc_publications') IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(d.objid) INTO dropped FROM pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0;
    IF dropped IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM @extschema@._cdc_offsets o WHERE o.table_oid = ANY (dropped);
    DELETE FROM @extschema@._cdc_route_offsets o WHERE o.table_oid = ANY (dropped);
    -- Snapshots of a dropped table keep its names for cdc_snapshots.
    UPDATE @extschema@._cdc_snapshots s SET dropped_schema = d.schema_name, dropped_name = d.object_name
      FROM pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND s.table_oid = d.objid;
    -- Copies of the lookups of a dropped captured table.
    DELETE FROM @extschema@._cdc_lookups l WHERE l.table_oid = ANY (dropped);
    -- A dropped lookup table: its copies lose their rows and stand for no table (OID 0), so the
    -- events that enrich from it find no row, as of their commit, until it is bound again.
    DELETE FROM @extschema@._cdc_lookup_rows x USING @extschema@._cdc_lookups l
     WHERE l.lookup_oid = ANY (dropped)
       AND (x.sink_id, x.table_oid, x.position) = (l.sink_id, l.table_oid, l.position);
    UPDATE @extschema@._cdc_lookups SET lookup_oid = 0 WHERE lookup_oid = ANY (dropped);
    FOR r IN SELECT p.table_name, string_agg(u.n, ', ' ORDER BY u.i) AS names
               FROM @extschema@._cdc_publications p, unnest(p.lookup_oids, p.lookup_names) WITH ORDINALITY u(o, n, i)
              WHERE u.o = ANY (dropped) AND NOT p.table_oid = ANY (dropped)
              GROUP BY p.table_name ORDER BY p.table_name LOOP
        RAISE NOTICE 'table % enriches from the dropped table %: its events find no row there until cdc_enable of that name binds a new table', r.table_name, r.names;
    END LOOP;
    UPDATE @extschema@._cdc_publications p
       SET lookup_oids = ARRAY(SELECT CASE WHEN u.o = ANY (dropped) THEN 0::oid ELSE u.o END
                                 FROM unnest(p.lookup_oids) WITH ORDINALITY u(o, i) ORDER BY u.i)
     WHERE p.lookup_oids && dropped;
    DELETE FROM @extschema@._cdc_schema_versions v WHERE v.table_oid = ANY (dropped);
    DELETE FROM @extschema@._cdc_schema_breaks b WHERE b.table_oid = ANY (dropped);
    DELETE FROM @extschema@._cdc_version_topics t WHERE t.table_oid = ANY (dropped);
    DELETE FROM @extschema@._cdc_publications p WHERE p.table_oid = ANY (dropped);
    -- A sink limited to a dropped table waits for it by name.
    FOR r IN SELECT s.sink_name, string_agg(u.n, ', ' ORDER BY u.i) AS names
               FROM @extschema@._cdc_sinks s, unnest(s.table_oids, s.table_names) WITH ORDINALITY u(o, n, i)
              WHERE u.o = ANY (dropped)
              GROUP BY s.sink_name ORDER BY s.sink_name LOOP
        RAISE NOTICE 'sink "%" carries the dropped table %: it goes on with its other tables, and carries a new table of that name once cdc_enable binds it', r.sink_name, r.names;
    END LOOP;
    UPDATE @extschema@._cdc_sinks s
       SET table_oids = ARRAY(SELECT CASE WHEN u.o = ANY (dropped) THEN 0::oid ELSE u.o END
                                FROM unnest(s.table_oids) WITH ORDINALITY u(o, i) ORDER BY u.i)
     WHERE s.table_oids && dropped;
END $$;

DROP VIEW @extschema@.cdc_snapshots;
CREATE VIEW @extschema@.cdc_snapshots AS
SELECT s.snapshot_id, k.sink_name, coalesce(n.nspname, s.dropped_schema) AS table_schema,
       coalesce(c.relname, s.dropped_name) AS table_name, s.kind, s.state, s.rows_done, s.rows_estimate,
       CASE WHEN s.state = 'done' THEN 100.0
            WHEN s.rows_estimate > 0 THEN round(least(100.0 * s.rows_done / s.rows_estimate, 99.9), 1) END AS percent_done,
       r.rows_per_second,
       CASE WHEN s.state = 'running' AND r.rows_per_second > 0
            THEN make_interval(secs => round(greatest(s.rows_estimate - s.rows_done, 0) / r.rows_per_second)) END AS eta,
       s.requested_at, s.started_at, s.finished_at, s.note
  FROM @extschema@._cdc_snapshots s
  JOIN @extschema@._cdc_sinks k USING (sink_id)
  LEFT JOIN pg_class c ON c.oid = s.table_oid
  LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
 CROSS JOIN LATERAL (SELECT round(s.rows_done / nullif(extract(epoch FROM coalesce(s.finished_at, now()) - s.started_at), 0), 1)
                            AS rows_per_second) r
 ORDER BY s.snapshot_id;
GRANT SELECT ON @extschema@.cdc_snapshots TO pg_monitor;
-- What a dropped sink leaves at its destination and pg_cdc deletes after the drop committed and the
-- sink's worker stopped (the launcher does it, and tries again while the destination is down): an
-- exactly-once Kafka or Event Hubs sink's progress topic.
CREATE TABLE @extschema@._cdc_cleanups (
    cleanup_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink_id          uuid NOT NULL,
    sink_name        text NOT NULL,
    sink_type        text NOT NULL,
    config           jsonb NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('progress_topic')),
    target           text NOT NULL,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    last_attempt_at  timestamptz,
    last_error       text
);
COMMENT ON TABLE @extschema@._cdc_cleanups IS 'pg_cdc: what dropped sinks left at their destination, deleted by the launcher once the drop committed and the sink''s worker stopped (a row stays while it fails)';
COMMENT ON COLUMN @extschema@._cdc_cleanups.config IS 'the dropped sink''s config, to reach its destination (it may hold credentials)';
COMMENT ON COLUMN @extschema@._cdc_cleanups.target IS 'what is deleted: the progress topic''s name';
COMMENT ON COLUMN @extschema@._cdc_cleanups.last_error IS 'why the last attempt failed; the next one comes after a pause that doubles with each attempt, up to 5 minutes';

REVOKE ALL ON @extschema@._cdc_cleanups FROM PUBLIC;

-- What \df+ and \dv+ show: every function and view of pg_cdc is described (pg_test's install test
-- fails for one that is not). The SQL reference (docs/sql-reference.md) has the whole story.
COMMENT ON FUNCTION @extschema@.cdc_enable(regclass, jsonb) IS 'pg_cdc: captures a table''s committed changes, with its capture config (filter, transformations, format, ...); re-run it to change the config';
COMMENT ON FUNCTION @extschema@.cdc_enable_multicloud(regclass, jsonb) IS 'pg_cdc: captures a table and routes its rows to sinks by a condition per route (routes may name sinks added later)';
COMMENT ON FUNCTION @extschema@.cdc_multicloud_status(regclass) IS 'pg_cdc: per routed table (or one), each route''s condition, sinks, events and lag';
COMMENT ON FUNCTION @extschema@.cdc_disable(regclass) IS 'pg_cdc: stops capturing a table and forgets its capture config and progress';
COMMENT ON FUNCTION @extschema@.cdc_add_sink(text, text, jsonb) IS 'pg_cdc: adds a destination (kafka, kinesis, eventhub, pubsub, pulsar, webhook, postgres, table) with its own slot; it starts with a snapshot of its tables';
COMMENT ON FUNCTION @extschema@.cdc_drop_sink(text) IS 'pg_cdc: drops a destination, its slot and its progress';
COMMENT ON FUNCTION @extschema@.cdc_snapshot(regclass, text, boolean) IS 'pg_cdc: asks for a new snapshot of a captured table (READ events of its rows) for one sink or every sink carrying it';
COMMENT ON FUNCTION @extschema@.cdc_cancel_snapshot(regclass, text) IS 'pg_cdc: cancels the pending or running snapshots of a table';
COMMENT ON FUNCTION @extschema@.cdc_schema_history(regclass) IS 'pg_cdc: the schema versions of a captured table, their changes and the registry ids they got';
COMMENT ON FUNCTION @extschema@.cdc_force_schema_break(regclass) IS 'pg_cdc: lets the table''s next schema change that its compatibility_mode forbids through, once';
COMMENT ON FUNCTION @extschema@.cdc_create_version_topic(regclass, integer) IS 'pg_cdc: gives a schema version of a captured table, and every later one, Kafka and Event Hubs topics of their own (<topic>.v<version>)';
COMMENT ON FUNCTION @extschema@.cdc_check_compatibility(regclass, text) IS 'pg_cdc: whether a proposed ALTER TABLE keeps the table''s schema compatible, before running it';
COMMENT ON FUNCTION @extschema@.cdc_consume(text, integer, text) IS 'pg_cdc: reads the next events of a table sink for a consumer, in commit order (consumed when the caller commits)';
COMMENT ON FUNCTION @extschema@.cdc_delivery_status(text) IS 'pg_cdc: how a sink''s delivery is doing: its state, slot, transactions in flight, and the last error';
COMMENT ON FUNCTION @extschema@.cdc_create_tokenization_key() IS 'pg_cdc: creates the key the tokenize transformation uses (once per cluster)';
COMMENT ON FUNCTION @extschema@.cdc_filter_metrics(regclass) IS 'pg_cdc: what a captured table''s filter and transformations did: changes matched and excluded, bandwidth saved, per transformation';
COMMENT ON FUNCTION @extschema@.cdc_preview(regclass, jsonb, integer) IS 'pg_cdc: the events rows of a captured table (or a sample row) would produce under its config, as the worker sends them; publishes nothing';
COMMENT ON FUNCTION @extschema@.cdc_metrics(regclass) IS 'pg_cdc: how capture of one table is doing: events, latencies and lag per sink';
COMMENT ON FUNCTION @extschema@.cdc_status() IS 'pg_cdc: one row per sink: its state, lag, events delivered, latencies, last error and missing tables';
COMMENT ON FUNCTION @extschema@.cdc_prometheus_metrics() IS 'pg_cdc: every figure in the Prometheus text exposition format';
COMMENT ON FUNCTION @extschema@._cdc_sink_latency(text) IS 'pg_cdc internal: a sink''s latency percentiles, for cdc_status';
COMMENT ON FUNCTION @extschema@._cdc_context_message(boolean) IS 'pg_cdc internal: the sealed context message (user, application, optionally the query) of the current statement, for the _cdc_context trigger';
COMMENT ON FUNCTION @extschema@._cdc_context_trigger() IS 'pg_cdc internal: trigger that emits the transaction context into the WAL before a captured table''s rows';
COMMENT ON FUNCTION @extschema@._cdc_forget_dropped_tables() IS 'pg_cdc internal: event trigger that forgets dropped captured tables and marks the dropped tables of sinks and lookups';
COMMENT ON FUNCTION @extschema@._cdc_table_fields(oid) IS 'pg_cdc internal: the columns of a table as a schema version records them';
COMMENT ON FUNCTION @extschema@._cdc_schema_changes() IS 'pg_cdc internal: event trigger that records a new schema version of a captured table after ALTER TABLE';
COMMENT ON FUNCTION @extschema@._cdc_schema_changed(oid[]) IS 'pg_cdc internal: records and checks new schema versions of the given tables';
COMMENT ON VIEW @extschema@.cdc_snapshots IS 'pg_cdc: progress of every snapshot, per sink and table';
