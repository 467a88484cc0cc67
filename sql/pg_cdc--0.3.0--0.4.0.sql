-- pg_cdc 0.3.0 -> 0.4.0 (ALTER EXTENSION pg_cdc UPDATE). Keeps every sink, slot, offset and lookup
-- copy; the worker delivers throughout. pg_test/sql/upgrade.sql checks that the result has exactly
-- the objects of a fresh 0.4.0 install.

-- Snapshots (a sink's snapshot_mode initial): which rows of each table were delivered as READ
-- events, and the chunk in flight (see cdc_core::snapshot).
CREATE TABLE @extschema@._cdc_snapshots (
    snapshot_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink_id          uuid NOT NULL REFERENCES @extschema@._cdc_sinks ON DELETE CASCADE,
    table_oid        oid NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('initial')),
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'done', 'skipped')),
    chunk_key        text[],
    last_key         text[],
    rows_done        bigint NOT NULL DEFAULT 0,
    rows_estimate    bigint,
    chunk_watermark  pg_lsn,
    chunk_last_key   text[],
    chunk_rows       bigint,
    chunk_last       boolean,
    note             text,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
);
CREATE INDEX _cdc_snapshots_sink ON @extschema@._cdc_snapshots (sink_id);
COMMENT ON TABLE @extschema@._cdc_snapshots IS 'pg_cdc: per sink and table, a snapshot of the rows the table holds (READ events), read in chunks by key';
COMMENT ON COLUMN @extschema@._cdc_snapshots.chunk_key IS 'the columns chunks are read by: the replica identity index when the table has one, else the primary key';
COMMENT ON COLUMN @extschema@._cdc_snapshots.last_key IS 'key of the last row of the last delivered chunk (NULL: from the start)';
COMMENT ON COLUMN @extschema@._cdc_snapshots.chunk_watermark IS 'the chunk read and not known delivered: the end of its watermark message';
COMMENT ON COLUMN @extschema@._cdc_snapshots.chunk_last_key IS 'key of that chunk''s last row';
COMMENT ON COLUMN @extschema@._cdc_snapshots.chunk_last IS 'that chunk read fewer rows than a chunk holds: the table is done once it is delivered';
REVOKE ALL ON @extschema@._cdc_snapshots FROM PUBLIC;

-- A sink delivering its snapshot is 'snapshotting'.
ALTER TABLE @extschema@._cdc_sinks DROP CONSTRAINT _cdc_sinks_state_check,
    ADD CONSTRAINT _cdc_sinks_state_check
        CHECK (state IN ('creating_slot', 'starting', 'snapshotting', 'running', 'retrying', 'error'));
COMMENT ON COLUMN @extschema@._cdc_sinks.state IS 'creating_slot | starting | snapshotting | running | retrying | error, set by the worker (docs/sql-reference.md)';
