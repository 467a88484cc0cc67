-- pg_cdc 0.4.0 -> 0.5.0 (ALTER EXTENSION pg_cdc UPDATE). Keeps every sink, slot, offset and lookup
-- copy; the worker delivers throughout. pg_test/sql/upgrade.sql checks that the result has exactly
-- the objects of a fresh 0.5.0 install.

-- A dropped table is never silent: a sink keeps the names its `tables` resolved to, a captured table
-- the names of its lookup tables; a dropped one stands as OID 0 until cdc_enable of its name binds a
-- new table, and cdc_status lists it in missing_tables meanwhile.
ALTER TABLE @extschema@._cdc_sinks ADD COLUMN table_names text[];
COMMENT ON COLUMN @extschema@._cdc_sinks.table_oids IS 'tables this sink is limited to (config.tables); NULL means every captured table; 0 stands for a dropped table (its name is in table_names) until cdc_enable of that name binds a new one';
COMMENT ON COLUMN @extschema@._cdc_sinks.table_names IS 'the tables of table_oids, schema-qualified, as cdc_add_sink resolved config.tables (a rename does not change them; cdc_status lists those whose table was dropped in missing_tables)';
-- The names of today's tables; a table dropped before the update (its OID names nothing now) becomes
-- 0 with the name its config gave.
UPDATE @extschema@._cdc_sinks s
   SET table_oids = n.oids, table_names = n.names
  FROM (SELECT k.sink_id,
               array_agg(coalesce(c.oid, 0::oid) ORDER BY u.i) AS oids,
               array_agg(coalesce(quote_ident(ns.nspname) || '.' || quote_ident(c.relname),
                                  k.config -> 'tables' ->> (u.i::int - 1)) ORDER BY u.i) AS names
          FROM @extschema@._cdc_sinks k
         CROSS JOIN LATERAL unnest(k.table_oids) WITH ORDINALITY u(o, i)
          LEFT JOIN pg_catalog.pg_class c ON c.oid = u.o AND c.relkind = 'r'
          LEFT JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
         GROUP BY k.sink_id) n
 WHERE n.sink_id = s.sink_id;

ALTER TABLE @extschema@._cdc_publications ADD COLUMN lookup_names text[] NOT NULL DEFAULT '{}';
COMMENT ON COLUMN @extschema@._cdc_publications.lookup_names IS 'the lookup tables of lookup_oids, schema-qualified, as cdc_enable resolved them: a dropped one''s OID becomes 0 there and its name stays, until cdc_enable of that name binds a new table (cdc_status lists it in missing_tables meanwhile)';
UPDATE @extschema@._cdc_publications p
   SET lookup_oids = n.oids, lookup_names = n.names
  FROM (SELECT q.table_oid,
               array_agg(coalesce(c.oid, 0::oid) ORDER BY u.i) AS oids,
               array_agg(coalesce(quote_ident(ns.nspname) || '.' || quote_ident(c.relname),
                                  (SELECT e.t ->> 'lookup_table'
                                     FROM jsonb_array_elements(q.config -> 'transformations') WITH ORDINALITY e(t, k)
                                    WHERE e.t ->> 'type' = 'enrich' ORDER BY e.k OFFSET u.i - 1 LIMIT 1)) ORDER BY u.i) AS names
          FROM @extschema@._cdc_publications q
         CROSS JOIN LATERAL unnest(q.lookup_oids) WITH ORDINALITY u(o, i)
          LEFT JOIN pg_catalog.pg_class c ON c.oid = u.o AND c.relkind = 'r'
          LEFT JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
         GROUP BY q.table_oid) n
 WHERE n.table_oid = p.table_oid;
-- Copies of a lookup table dropped before the update were deleted then; the worker makes them again
-- (empty, for OID 0).

-- Offsets written for a table after it was dropped were named by its bare OID: nothing names them.
DELETE FROM @extschema@._cdc_offsets o
 WHERE o.table_name ~ '^[0-9]+$' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = o.table_oid);

-- The drop trigger keeps the names, and runs for every role (SECURITY DEFINER): before, a role that
-- cannot write pg_cdc's catalog could not drop any table.
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
REVOKE EXECUTE ON FUNCTION @extschema@._cdc_forget_dropped_tables() FROM PUBLIC;

-- cdc_status gains missing_tables.
DROP FUNCTION @extschema@.cdc_status();
CREATE FUNCTION @extschema@.cdc_status() RETURNS TABLE (
    sink_name text, sink_type text, delivery_mode text, state text, last_error text, since timestamptz,
    slot_name text, wal_status text, retained_wal_bytes bigint, safe_wal_size bigint, lag_bytes bigint,
    last_delivered_at timestamptz, events_published bigint,
    end_to_end_p50_ms double precision, end_to_end_p99_ms double precision, end_to_end_p999_ms double precision,
    missing_tables text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.sink_name, s.sink_type, s.delivery_mode, s.state, s.last_error, s.state_since,
           s.slot_name::text, r.wal_status,
           (pg_current_wal_lsn() - r.restart_lsn)::bigint, r.safe_wal_size,
           (pg_current_wal_lsn() - r.confirmed_flush_lsn)::bigint,
           o.last_delivered_at, coalesce(o.events, 0)::bigint,
           (l.v ->> 'p50_ms')::float8, (l.v ->> 'p99_ms')::float8, (l.v ->> 'p999_ms')::float8,
           -- Tables of its `tables` that were dropped, then the dropped lookup tables of the tables
           -- it carries: each waits for cdc_enable of its name.
           ARRAY(SELECT u.n FROM unnest(s.table_oids, s.table_names) WITH ORDINALITY u(o, n, i)
                  WHERE u.o = 0 ORDER BY u.i)
           || ARRAY(SELECT u.n || ' (lookup of ' || p.table_name || ')'
                      FROM @extschema@._cdc_publications p,
                           unnest(p.lookup_oids, p.lookup_names) WITH ORDINALITY u(o, n, i)
                     WHERE u.o = 0 AND (s.table_oids IS NULL OR p.table_oid = ANY (s.table_oids))
                     ORDER BY p.table_name, u.i)
      FROM @extschema@._cdc_sinks s
      LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name
      LEFT JOIN LATERAL (SELECT max(last_timestamp) AS last_delivered_at, sum(events_published) AS events
                           FROM @extschema@._cdc_offsets WHERE sink_name = s.sink_name) o ON true
      CROSS JOIN LATERAL (SELECT @extschema@._cdc_sink_latency(s.sink_id::text) AS v) l
     ORDER BY s.sink_name
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_status() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.cdc_status() TO pg_monitor;
