-- pg_cdc 0.3.0 -> 0.4.0 (ALTER EXTENSION pg_cdc UPDATE). Keeps every sink, slot, offset and lookup
-- copy; the worker delivers throughout. pg_test/sql/upgrade.sql checks that the result has exactly
-- the objects of a fresh 0.4.0 install.

-- Snapshots (a sink's snapshot_mode initial): which rows of each table were delivered as READ
-- events, and the chunk in flight (see cdc_core::snapshot).
CREATE TABLE @extschema@._cdc_snapshots (
    snapshot_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink_id          uuid NOT NULL REFERENCES @extschema@._cdc_sinks ON DELETE CASCADE,
    table_oid        oid NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('initial', 'added', 'requested')),
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'done', 'skipped', 'cancelled')),
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

-- A sink delivering its snapshot is 'snapshotting'; an initial_only sink that delivered it is 'finished'.
ALTER TABLE @extschema@._cdc_sinks DROP CONSTRAINT _cdc_sinks_state_check,
    ADD CONSTRAINT _cdc_sinks_state_check
        CHECK (state IN ('creating_slot', 'starting', 'snapshotting', 'running', 'retrying', 'error', 'finished'));
COMMENT ON COLUMN @extschema@._cdc_sinks.state IS 'creating_slot | starting | snapshotting | running | retrying | error | finished, set by the worker (docs/sql-reference.md)';

-- Snapshots on request (cdc_snapshot) and of tables added to a sink.
CREATE FUNCTION @extschema@.cdc_snapshot(table_name regclass, sink_name text DEFAULT NULL, wait boolean DEFAULT false)
RETURNS SETOF bigint VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_snapshot_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_snapshot(regclass, text, boolean) FROM PUBLIC;
CREATE FUNCTION @extschema@.cdc_cancel_snapshot(table_name regclass, sink_name text DEFAULT NULL)
RETURNS SETOF bigint VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_cancel_snapshot_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_cancel_snapshot(regclass, text) FROM PUBLIC;

-- Progress of every snapshot: rows delivered of the table's estimated rows, the rate since it started,
-- and when it should end at that rate. Monitoring roles may read it (no config in it).
CREATE VIEW @extschema@.cdc_snapshots AS
SELECT s.snapshot_id, k.sink_name, coalesce(p.table_name, s.table_oid::regclass::text) AS table_name,
       s.kind, s.state, s.rows_done, s.rows_estimate,
       CASE WHEN s.state = 'done' THEN 100.0
            WHEN s.rows_estimate > 0 THEN round(least(100.0 * s.rows_done / s.rows_estimate, 99.9), 1) END AS percent_done,
       r.rows_per_second,
       CASE WHEN s.state = 'running' AND r.rows_per_second > 0
            THEN make_interval(secs => round(greatest(s.rows_estimate - s.rows_done, 0) / r.rows_per_second)) END AS eta,
       s.requested_at, s.started_at, s.finished_at, s.note
  FROM @extschema@._cdc_snapshots s
  JOIN @extschema@._cdc_sinks k USING (sink_id)
  LEFT JOIN @extschema@._cdc_publications p ON p.table_oid = s.table_oid
 CROSS JOIN LATERAL (SELECT round(s.rows_done / nullif(extract(epoch FROM coalesce(s.finished_at, now()) - s.started_at), 0), 1)
                            AS rows_per_second) r
 ORDER BY s.snapshot_id;
GRANT SELECT ON @extschema@.cdc_snapshots TO pg_monitor;
