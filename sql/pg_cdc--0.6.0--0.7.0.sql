-- pg_cdc 0.6.0 -> 0.7.0 (ALTER EXTENSION pg_cdc UPDATE). Keeps every sink, slot, offset and snapshot;
-- the worker delivers throughout. pg_test/sql/upgrade.sql checks that the result has exactly the
-- objects of a fresh 0.7.0 install.

-- Who added a sink: a postgres sink added by a role that is not a superuser may not connect without
-- a password, nor as a superuser of this server. Sinks of earlier versions were added by superusers
-- (only they could write the catalog): NULL, and they keep working as they are.
ALTER TABLE @extschema@._cdc_sinks ADD COLUMN added_by oid;
COMMENT ON COLUMN @extschema@._cdc_sinks.added_by IS 'the role that added the sink (NULL: added before 0.7.0, by a superuser); while it is not a superuser, a postgres sink''s connection must use a password and not be a superuser''s on this server';

-- cdc_admin: a role that manages capture and sinks without being a superuser (see finalize.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'cdc_admin') THEN
        CREATE ROLE cdc_admin NOLOGIN;
        COMMENT ON ROLE cdc_admin IS 'pg_cdc: manages capture and sinks without being a superuser (GRANT cdc_admin TO <role>)';
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION @extschema@.cdc_enable(regclass, jsonb), @extschema@.cdc_enable_multicloud(regclass, jsonb),
    @extschema@.cdc_disable(regclass), @extschema@.cdc_add_sink(text, text, jsonb), @extschema@.cdc_drop_sink(text),
    @extschema@.cdc_snapshot(regclass, text, boolean), @extschema@.cdc_cancel_snapshot(regclass, text),
    @extschema@.cdc_schema_history(regclass), @extschema@.cdc_force_schema_break(regclass),
    @extschema@.cdc_create_version_topic(regclass, integer), @extschema@.cdc_check_compatibility(regclass, text),
    @extschema@.cdc_preview(regclass, jsonb, integer), @extschema@.cdc_delivery_status(text),
    @extschema@.cdc_filter_metrics(regclass), @extschema@.cdc_multicloud_status(regclass), @extschema@.cdc_status(),
    @extschema@.cdc_metrics(regclass), @extschema@.cdc_prometheus_metrics() TO cdc_admin;
GRANT SELECT ON @extschema@.cdc_snapshots TO cdc_admin;
-- Monitoring roles read every status function (none shows a sink config).
GRANT EXECUTE ON FUNCTION @extschema@.cdc_delivery_status(text), @extschema@.cdc_filter_metrics(regclass),
    @extschema@.cdc_multicloud_status(regclass) TO pg_monitor;
