-- Configuring capture is for superusers and roles they grant it to: REVOKE the default EXECUTE
-- from PUBLIC on every pg_cdc function.
REVOKE EXECUTE ON FUNCTION cdc_enable(regclass, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_disable(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_add_sink(text, text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_drop_sink(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_delivery_status(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_filter_metrics(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_preview(regclass, jsonb, integer) FROM PUBLIC;

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
-- with it). During DROP EXTENSION the catalog is already gone: nothing to do then.
CREATE FUNCTION _cdc_forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    IF to_regclass('@extschema@._cdc_publications') IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM @extschema@._cdc_offsets o USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objid = o.table_oid;
    -- Copies of a dropped lookup table, and of the lookups of a dropped captured table.
    DELETE FROM @extschema@._cdc_lookups l USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objid IN (l.table_oid, l.lookup_oid);
    DELETE FROM @extschema@._cdc_publications p USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objid = p.table_oid;
END $$;
REVOKE EXECUTE ON FUNCTION _cdc_forget_dropped_tables() FROM PUBLIC;
CREATE EVENT TRIGGER _cdc_forget_dropped_tables ON sql_drop EXECUTE FUNCTION _cdc_forget_dropped_tables();
