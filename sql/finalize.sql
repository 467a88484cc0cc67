-- Configuring capture is for superusers and roles they grant it to: REVOKE the default EXECUTE
-- from PUBLIC on every pg_cdc function.
REVOKE EXECUTE ON FUNCTION cdc_enable(regclass, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_disable(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_add_sink(text, text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_drop_sink(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_delivery_status(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_filter_metrics(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_preview(regclass, jsonb, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_create_tokenization_key() FROM PUBLIC;

-- The trigger of tables that capture user context: emits the sealed context of each statement,
-- before its rows, inside the writing transaction. SECURITY DEFINER so writers need no right on
-- pg_logical_emit_message; session_user (what the context reports) is unaffected.
CREATE FUNCTION _cdc_context_trigger() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pg_logical_emit_message(true, 'pg_cdc.context', @extschema@._cdc_context_message(TG_ARGV[0]::boolean));
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION _cdc_context_message(boolean) FROM PUBLIC;

-- A captured table that is dropped leaves no catalog rows behind (its publication membership goes
-- with it). Only whole tables: ALTER TABLE ... DROP COLUMN reports the column as a pg_class object
-- with its attribute number in objsubid, and must not make pg_cdc forget the table. During DROP
-- EXTENSION the catalog is already gone: nothing to do then.
CREATE FUNCTION _cdc_forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    IF to_regclass('@extschema@._cdc_publications') IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM @extschema@._cdc_offsets o USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = o.table_oid;
    -- Copies of a dropped lookup table, and of the lookups of a dropped captured table.
    DELETE FROM @extschema@._cdc_lookups l USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid IN (l.table_oid, l.lookup_oid);
    DELETE FROM @extschema@._cdc_publications p USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = p.table_oid;
END $$;
REVOKE EXECUTE ON FUNCTION _cdc_forget_dropped_tables() FROM PUBLIC;
CREATE EVENT TRIGGER _cdc_forget_dropped_tables ON sql_drop EXECUTE FUNCTION _cdc_forget_dropped_tables();

-- One overview row per sink (pipeline): state, slot health, lag, delivery and end-to-end latency.
-- SECURITY DEFINER, and granted to pg_monitor: monitoring roles see figures and states, never the
-- sink configs (they may hold credentials).
CREATE FUNCTION cdc_status() RETURNS TABLE (
    sink_name text, sink_type text, delivery_mode text, state text, last_error text, since timestamptz,
    slot_name text, wal_status text, retained_wal_bytes bigint, safe_wal_size bigint, lag_bytes bigint,
    last_delivered_at timestamptz, events_published bigint,
    end_to_end_p50_ms double precision, end_to_end_p99_ms double precision, end_to_end_p999_ms double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.sink_name, s.sink_type, s.delivery_mode, s.state, s.last_error, s.state_since,
           s.slot_name::text, r.wal_status,
           (pg_current_wal_lsn() - r.restart_lsn)::bigint, r.safe_wal_size,
           (pg_current_wal_lsn() - r.confirmed_flush_lsn)::bigint,
           o.last_delivered_at, coalesce(o.events, 0)::bigint,
           (l.v ->> 'p50_ms')::float8, (l.v ->> 'p99_ms')::float8, (l.v ->> 'p999_ms')::float8
      FROM @extschema@._cdc_sinks s
      LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name
      LEFT JOIN LATERAL (SELECT max(last_timestamp) AS last_delivered_at, sum(events_published) AS events
                           FROM @extschema@._cdc_offsets WHERE sink_name = s.sink_name) o ON true
      CROSS JOIN LATERAL (SELECT @extschema@._cdc_sink_latency(s.sink_id::text) AS v) l
     ORDER BY s.sink_name
$$;
REVOKE EXECUTE ON FUNCTION cdc_status() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION _cdc_sink_latency(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_metrics(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_prometheus_metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cdc_status(), cdc_metrics(regclass), cdc_prometheus_metrics() TO pg_monitor;
