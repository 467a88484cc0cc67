-- pg_cdc 0.1.0 -> 0.2.0 (ALTER EXTENSION pg_cdc UPDATE). Keeps every sink, slot, offset and lookup
-- copy; the worker delivers throughout (it reads nothing this script changes). pg_test/sql/upgrade.sql
-- checks that the result has exactly the objects of a fresh 0.2.0 install.

-- The sink state is typed: the labels of cdc_core::state::SinkState are the only values allowed.
-- A row with any other value (none is ever written by 0.1.0) makes the update fail, rolled back.
ALTER TABLE @extschema@._cdc_sinks
    ADD CONSTRAINT _cdc_sinks_state_check CHECK (state IN ('creating_slot', 'starting', 'running', 'retrying', 'error'));
COMMENT ON COLUMN @extschema@._cdc_sinks.state IS 'creating_slot | starting | running | retrying | error, set by the worker (docs/sql-reference.md)';

-- A tokenization key without settings: pg_cdc_token.key in the data directory.
CREATE FUNCTION @extschema@."cdc_create_tokenization_key"() RETURNS TEXT
STRICT VOLATILE
LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_create_tokenization_key_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_create_tokenization_key() FROM PUBLIC;

-- Fix: ALTER TABLE ... DROP COLUMN of a captured table made pg_cdc forget the table (the sql_drop
-- event trigger took the dropped column for the table): only whole tables are forgotten now.
CREATE OR REPLACE FUNCTION @extschema@._cdc_forget_dropped_tables() RETURNS event_trigger
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
