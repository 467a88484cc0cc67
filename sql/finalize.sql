-- Configuring capture is for superusers and roles they grant it to: REVOKE the default EXECUTE
-- from PUBLIC on every pg_cdc function.
REVOKE EXECUTE ON FUNCTION cdc_enable(regclass, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_disable(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_add_sink(text, text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_drop_sink(text) FROM PUBLIC;
