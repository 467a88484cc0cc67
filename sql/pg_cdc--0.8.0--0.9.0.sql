-- pg_cdc 0.8.0 -> 0.9.0 (ALTER EXTENSION pg_cdc UPDATE). Keeps every sink, slot, offset and snapshot;
-- the worker delivers throughout. pg_test/sql/upgrade.sql checks that the result has exactly the
-- objects of a fresh 0.9.0 install.

-- A sink may be paused (cdc_pause_sink): the only state a person sets, never written over by the
-- worker.
ALTER TABLE @extschema@._cdc_sinks DROP CONSTRAINT _cdc_sinks_state_check,
    ADD CONSTRAINT _cdc_sinks_state_check
        CHECK (state IN ('creating_slot', 'starting', 'snapshotting', 'running', 'retrying', 'error', 'finished', 'paused'));
COMMENT ON COLUMN @extschema@._cdc_sinks.state IS 'creating_slot | starting | snapshotting | running | retrying | error | finished (set by the worker) | paused (cdc_pause_sink) (docs/sql-reference.md)';

-- A sink's config changes in place (cdc_alter_sink); a sink may be paused and resumed.
CREATE FUNCTION @extschema@.cdc_alter_sink(sink_name text, config jsonb) RETURNS jsonb
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_alter_sink_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_alter_sink(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.cdc_alter_sink(text, jsonb) TO cdc_admin;
COMMENT ON FUNCTION @extschema@.cdc_alter_sink(text, jsonb) IS 'pg_cdc: changes a sink''s config in place (the keys given; null removes one), keeping its position and guarantee; tables added are back-filled';
CREATE FUNCTION @extschema@.cdc_pause_sink(sink_name text) RETURNS boolean
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_pause_sink_wrapper';
CREATE FUNCTION @extschema@.cdc_resume_sink(sink_name text) RETURNS boolean
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_resume_sink_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_pause_sink(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_resume_sink(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.cdc_pause_sink(text), @extschema@.cdc_resume_sink(text) TO cdc_admin;
COMMENT ON FUNCTION @extschema@.cdc_pause_sink(text) IS 'pg_cdc: pauses a sink: its worker stops, its slot keeps its position (and the WAL after it) until cdc_resume_sink';
COMMENT ON FUNCTION @extschema@.cdc_resume_sink(text) IS 'pg_cdc: resumes a paused sink from its slot''s position, with its delivery guarantee';

-- Whether each sink is ready: running and at most max_lag_bytes behind the WAL, or paused or
-- finished (on purpose); otherwise why not. For cdc_ready and pg_cdc_sink_ready.
CREATE FUNCTION @extschema@._cdc_sink_readiness(max_lag_bytes bigint) RETURNS TABLE (sink_name text, reason text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.sink_name,
           CASE WHEN s.state IN ('paused', 'finished') THEN NULL
                WHEN s.state <> 'running'
                THEN format('sink %s is %s', s.sink_name, s.state) || coalesce(': ' || s.last_error, '')
                WHEN r.slot_name IS NULL THEN format('sink %s: its slot %s does not exist', s.sink_name, s.slot_name)
                WHEN pg_current_wal_lsn() - r.confirmed_flush_lsn > max_lag_bytes
                THEN format('sink %s is %s bytes behind the WAL (more than %s)', s.sink_name,
                            (pg_current_wal_lsn() - r.confirmed_flush_lsn)::bigint, max_lag_bytes) END
      FROM @extschema@._cdc_sinks s
      LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name
     ORDER BY s.sink_name
$$;
REVOKE EXECUTE ON FUNCTION @extschema@._cdc_sink_readiness(bigint) FROM PUBLIC;

-- Whether every sink is ready (see _cdc_sink_readiness), with the reasons of those that are not:
-- a probe for a load balancer or an orchestrator. max_lag_bytes NULL: cdc.ready_max_lag.
CREATE FUNCTION @extschema@.cdc_ready(max_lag_bytes bigint DEFAULT NULL) RETURNS TABLE (ready boolean, reasons text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bound bigint := coalesce(max_lag_bytes, pg_size_bytes(coalesce(current_setting('cdc.ready_max_lag', true), '16MB')));
BEGIN
    IF bound < 0 THEN
        RAISE EXCEPTION 'max_lag_bytes must not be negative, not %', bound USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
        SELECT count(x.reason) = 0, coalesce(array_agg(x.reason ORDER BY x.sink_name) FILTER (WHERE x.reason IS NOT NULL), '{}')
          FROM @extschema@._cdc_sink_readiness(bound) x;
END $$;
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_ready(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.cdc_ready(bigint) TO pg_monitor;

-- Announces each change of a sink's state on channel cdc_sink_state (LISTEN cdc_sink_state), when
-- the transaction that made it commits: {"sink", "old_state", "new_state", "reason"} (reason: its
-- last_error; old_state null for a sink added, new_state null for one dropped).
CREATE FUNCTION @extschema@._cdc_sink_state_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('cdc_sink_state', jsonb_build_object('sink', NEW.sink_name, 'old_state', NULL,
                          'new_state', NEW.state, 'reason', NULL)::text);
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('cdc_sink_state', jsonb_build_object('sink', OLD.sink_name, 'old_state', OLD.state,
                          'new_state', NULL, 'reason', 'dropped')::text);
    ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
        -- A notification's payload is at most 8000 bytes.
        PERFORM pg_notify('cdc_sink_state', jsonb_build_object('sink', NEW.sink_name, 'old_state', OLD.state,
                          'new_state', NEW.state, 'reason', left(NEW.last_error, 4000))::text);
    END IF;
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION @extschema@._cdc_sink_state_notify() FROM PUBLIC;
CREATE TRIGGER _cdc_sink_state_notify AFTER INSERT OR DELETE OR UPDATE OF state ON @extschema@._cdc_sinks
    FOR EACH ROW EXECUTE FUNCTION @extschema@._cdc_sink_state_notify();
GRANT EXECUTE ON FUNCTION @extschema@.cdc_ready(bigint) TO cdc_admin;
COMMENT ON FUNCTION @extschema@.cdc_ready(bigint) IS 'pg_cdc: whether every sink is running and caught up (or paused or finished), and why not: a readiness probe';
COMMENT ON FUNCTION @extschema@._cdc_sink_readiness(bigint) IS 'pg_cdc internal: per sink, why it is not ready (NULL: ready), for cdc_ready and cdc_prometheus_metrics';
COMMENT ON FUNCTION @extschema@._cdc_sink_state_notify() IS 'pg_cdc internal: trigger that announces each sink state change on channel cdc_sink_state';
