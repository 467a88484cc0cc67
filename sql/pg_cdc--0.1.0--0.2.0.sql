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
