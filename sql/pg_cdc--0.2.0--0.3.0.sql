-- pg_cdc 0.2.0 -> 0.3.0 (ALTER EXTENSION pg_cdc UPDATE). Keeps every sink, slot, offset and lookup
-- copy; the worker delivers throughout (it reads nothing this script changes). pg_test/sql/upgrade.sql
-- checks that the result has exactly the objects of a fresh 0.3.0 install.

-- The in-database sinks (sink type `table`): the table each writes its events to, and the
-- checkpoint written in the same transaction as the events (exactly-once; see cdc-sinks table/).
CREATE TABLE @extschema@._cdc_table_sinks (
    sink_id          uuid PRIMARY KEY REFERENCES @extschema@._cdc_sinks ON DELETE CASCADE,
    event_table      oid NOT NULL,
    checkpoint       jsonb,
    trimmed_upto     bigint NOT NULL DEFAULT 0
);
COMMENT ON TABLE @extschema@._cdc_table_sinks IS 'pg_cdc: per in-database sink, its event table and delivery checkpoint';
COMMENT ON COLUMN @extschema@._cdc_table_sinks.event_table IS 'the table cdc_add_sink created for the events (renames are harmless)';
COMMENT ON COLUMN @extschema@._cdc_table_sinks.checkpoint IS 'end LSN of the last transaction whose events are in the table, written with them';
COMMENT ON COLUMN @extschema@._cdc_table_sinks.trimmed_upto IS 'events with event_id up to this were removed by retention';

-- The consumers of in-database sinks (cdc_consume): how far each has consumed.
CREATE TABLE @extschema@._cdc_consumers (
    sink_id          uuid NOT NULL REFERENCES @extschema@._cdc_sinks ON DELETE CASCADE,
    consumer         text NOT NULL CHECK (consumer <> ''),
    position         bigint NOT NULL DEFAULT 0,
    consumed_at      timestamptz,
    PRIMARY KEY (sink_id, consumer)
);
COMMENT ON TABLE @extschema@._cdc_consumers IS 'pg_cdc: per in-database sink and consumer name, the last event_id cdc_consume returned';

REVOKE ALL ON @extschema@._cdc_table_sinks, @extschema@._cdc_consumers FROM PUBLIC;

-- Consumes an in-database sink's events in commit order: returns up to max_events events after
-- what this consumer consumed, and records them as consumed when the caller's transaction commits
-- (a rolled-back transaction gets the same events again). Calls of one consumer wait for each
-- other, so each event goes to one call; each consumer name reads every event once.
CREATE FUNCTION @extschema@.cdc_consume(sink_name text, max_events integer DEFAULT 1000, consumer text DEFAULT 'default')
RETURNS TABLE (event_id bigint, commit_lsn pg_lsn, event_index integer, lsn pg_lsn, table_name text,
               operation text, event_key jsonb, event jsonb, delivered_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    sink uuid;
    tbl regclass;
    trimmed bigint;
    pos bigint;
    upto bigint;
BEGIN
    IF sink_name IS NULL OR consumer IS NULL OR max_events IS NULL THEN
        RAISE EXCEPTION 'sink_name, max_events and consumer must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF max_events < 1 THEN
        RAISE EXCEPTION 'max_events must be at least 1, not %', max_events USING ERRCODE = '22023';
    END IF;
    IF consumer = '' THEN
        RAISE EXCEPTION 'consumer must not be empty' USING ERRCODE = '22023';
    END IF;
    SELECT s.sink_id, c.oid::regclass, t.trimmed_upto INTO sink, tbl, trimmed
      FROM @extschema@._cdc_sinks s
      JOIN @extschema@._cdc_table_sinks t ON t.sink_id = s.sink_id
      LEFT JOIN pg_class c ON c.oid = t.event_table
     WHERE s.sink_name = cdc_consume.sink_name;
    IF sink IS NULL THEN
        IF EXISTS (SELECT 1 FROM @extschema@._cdc_sinks s WHERE s.sink_name = cdc_consume.sink_name) THEN
            RAISE EXCEPTION 'sink "%" is not a table sink', cdc_consume.sink_name USING ERRCODE = '42809',
                HINT = 'cdc_consume reads the events of sinks of type table; the other sinks deliver elsewhere.';
        END IF;
        RAISE EXCEPTION 'sink "%" does not exist', cdc_consume.sink_name USING ERRCODE = '42704',
            HINT = 'SELECT sink_name, sink_type FROM cdc_status() lists the sinks.';
    END IF;
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'the event table of sink "%" was dropped', cdc_consume.sink_name USING ERRCODE = '55000',
            HINT = 'Drop and re-add the sink: cdc_add_sink creates its table again.';
    END IF;
    INSERT INTO @extschema@._cdc_consumers AS k (sink_id, consumer) VALUES (sink, cdc_consume.consumer)
        ON CONFLICT (sink_id, consumer) DO NOTHING;
    SELECT k.position INTO pos FROM @extschema@._cdc_consumers k
     WHERE k.sink_id = sink AND k.consumer = cdc_consume.consumer FOR UPDATE;
    IF pos < trimmed THEN
        RAISE WARNING 'consumer "%" of sink "%" missed events: those up to event_id % were removed by retention before it consumed them',
            cdc_consume.consumer, cdc_consume.sink_name, trimmed;
    END IF;
    EXECUTE format('SELECT max(e.event_id) FROM (SELECT event_id FROM %s WHERE event_id > $1 ORDER BY event_id LIMIT $2) e', tbl)
       INTO upto USING pos, max_events;
    IF upto IS NULL THEN
        RETURN;
    END IF;
    UPDATE @extschema@._cdc_consumers k SET position = upto, consumed_at = now()
     WHERE k.sink_id = sink AND k.consumer = cdc_consume.consumer;
    RETURN QUERY EXECUTE format(
        'SELECT event_id, commit_lsn, event_index, lsn, table_name, operation, event_key, event, delivered_at
           FROM %s WHERE event_id > $1 AND event_id <= $2 ORDER BY event_id', tbl) USING pos, upto;
END $$;
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_consume(text, integer, text) FROM PUBLIC;
