-- pg_cdc 0.9.0 -> 0.10.0 (ALTER EXTENSION pg_cdc UPDATE). Keeps every sink, slot, offset and snapshot;
-- the worker delivers throughout. pg_test/sql/upgrade.sql checks that the result has exactly the
-- objects of a fresh 0.10.0 install.

-- Capture and sinks as a declared state: a spec reconciled against the live objects, and the live
-- objects exported as a spec. Superusers only (a spec drops what it leaves out, whoever added it).
CREATE FUNCTION @extschema@.cdc_reconcile(spec jsonb, dry_run boolean DEFAULT true) RETURNS jsonb
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_reconcile_wrapper';
CREATE FUNCTION @extschema@.cdc_export_spec() RETURNS jsonb STRICT
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_export_spec_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_reconcile(jsonb, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_export_spec() FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.cdc_reconcile(jsonb, boolean) IS 'pg_cdc: brings capture and sinks to a declared spec (dry run by default: returns the plan); drops are guarded, force_drop lifts the guard';
COMMENT ON FUNCTION @extschema@.cdc_export_spec() IS 'pg_cdc: the captured tables and sinks as a spec for cdc_reconcile, secrets as "(unchanged)"';

-- The accuracy verifier: a captured table against what a sink's destination holds.
CREATE FUNCTION @extschema@.cdc_verify(sink_name text, table_name regclass, max_differences integer DEFAULT 10,
                                       timeout_ms integer DEFAULT 60000) RETURNS jsonb
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_verify_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_verify(text, regclass, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.cdc_verify(text, regclass, integer, integer) TO cdc_admin;
COMMENT ON FUNCTION @extschema@.cdc_verify(text, regclass, integer, integer) IS 'pg_cdc: compares a captured table, encoded as the sink writes it, with what the sink''s destination holds once it delivered past the read: counts, checksums, the rows that differ';
