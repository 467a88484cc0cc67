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
    keyless_until    pg_lsn,
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
COMMENT ON COLUMN @extschema@._cdc_snapshots.keyless_until IS 'a table without a key: its rows were read with the snapshot of a slot''s consistent point, this position; its changes in transactions that commit before it are not delivered (the rows hold them)';
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

-- Schema history (issue 15): versions of each captured table, and cdc_force_schema_break's permits.

CREATE TABLE @extschema@._cdc_schema_versions (
    table_oid        oid NOT NULL,
    version          integer NOT NULL CHECK (version > 0),
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    lsn              pg_lsn NOT NULL,
    fields           jsonb NOT NULL,
    changes          jsonb NOT NULL DEFAULT '[]',
    compatibility    text CHECK (compatibility IN ('FULL', 'BACKWARD', 'FORWARD', 'NONE')),
    mode             text NOT NULL CHECK (mode IN ('backward', 'forward', 'full', 'none')),
    forced           boolean NOT NULL DEFAULT false,
    recorded_by      name NOT NULL DEFAULT current_user,
    schema_ids       jsonb NOT NULL DEFAULT '[]',
    PRIMARY KEY (table_oid, version)
);
COMMENT ON TABLE @extschema@._cdc_schema_versions IS 'pg_cdc: the schema history of each captured table: version 1 at cdc_enable, one more for each DDL that changes its columns';
COMMENT ON COLUMN @extschema@._cdc_schema_versions.lsn IS 'the WAL insert position when the version was recorded (before the DDL commits)';
COMMENT ON COLUMN @extschema@._cdc_schema_versions.fields IS 'the columns (attnum, name, type, type_oid, typmod, not_null, default, missing)';
COMMENT ON COLUMN @extschema@._cdc_schema_versions.changes IS 'what changed from the version before (ADD_FIELD, DROP_FIELD, RENAME_FIELD, CHANGE_TYPE, SET_REQUIRED, SET_OPTIONAL, CHANGE_DEFAULT)';
COMMENT ON COLUMN @extschema@._cdc_schema_versions.compatibility IS 'FULL, BACKWARD, FORWARD or NONE against the version before (NULL for version 1)';
COMMENT ON COLUMN @extschema@._cdc_schema_versions.mode IS 'the table''s compatibility_mode when the version was recorded';
COMMENT ON COLUMN @extschema@._cdc_schema_versions.forced IS 'a change the mode forbids, let through by cdc_force_schema_break';
COMMENT ON COLUMN @extschema@._cdc_schema_versions.schema_ids IS 'the ids schema registries gave this version''s Avro schema ([{registry, subject, schema_id}], written by the worker when it registers)';

CREATE TABLE @extschema@._cdc_schema_breaks (
    table_oid        oid PRIMARY KEY,
    allowed_by       name NOT NULL DEFAULT current_user,
    allowed_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE @extschema@._cdc_schema_breaks IS 'pg_cdc: tables whose next change that breaks their compatibility_mode is let through (cdc_force_schema_break)';
CREATE TABLE @extschema@._cdc_version_topics (
    table_oid        oid NOT NULL,
    version          integer NOT NULL CHECK (version > 1),
    requested_by     name NOT NULL DEFAULT current_user,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_oid, version)
);
COMMENT ON TABLE @extschema@._cdc_version_topics IS 'pg_cdc: table versions whose events (and those of the versions after them) go to a topic of their own, <topic>.v<version> (cdc_create_version_topic); a row for the next version arms it';
REVOKE ALL ON @extschema@._cdc_schema_versions, @extschema@._cdc_schema_breaks, @extschema@._cdc_version_topics FROM PUBLIC;

-- Schema history (cdc_core::schema): the columns of a table as a version records them. Generated
-- columns are left out (PostgreSQL 15 does not publish them). "missing" is the value rows older
-- than an ADD COLUMN ... DEFAULT read (attmissingval).
CREATE FUNCTION @extschema@._cdc_table_fields(table_oid oid) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
               'attnum', a.attnum, 'name', a.attname, 'type', format_type(a.atttypid, a.atttypmod),
               'type_oid', a.atttypid::bigint, 'typmod', a.atttypmod, 'not_null', a.attnotnull,
               'default', pg_get_expr(d.adbin, d.adrelid),
               'missing', CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END))
           ORDER BY a.attnum), '[]')
      FROM pg_attribute a
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
$$;
REVOKE EXECUTE ON FUNCTION @extschema@._cdc_table_fields(oid) FROM PUBLIC;

-- Every ALTER TABLE of a captured table: a new schema version when its columns changed, checked
-- against the table's compatibility_mode (a WARNING, or with "enforce" an ERROR that rolls the DDL
-- back). SECURITY DEFINER: the table's owner needs no right on the catalog. Local only: no
-- network call while the DDL holds its lock.
CREATE FUNCTION @extschema@._cdc_schema_changes() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    oids oid[];
BEGIN
    IF to_regclass('@extschema@._cdc_schema_versions') IS NULL THEN
        RETURN;
    END IF;
    -- The tables the statement names, the tables of a composite type it alters (CREATE TABLE ...
    -- OF type), and their inheritance children and partitions: an ALTER TABLE of a parent changes
    -- their columns too, and reports only the parent.
    WITH RECURSIVE altered(oid) AS (
        SELECT c.objid FROM pg_event_trigger_ddl_commands() c WHERE c.classid = 'pg_class'::regclass
        UNION
        SELECT r.oid FROM pg_event_trigger_ddl_commands() c
          JOIN pg_class r ON r.reloftype = CASE WHEN c.classid = 'pg_type'::regclass THEN c.objid
                                                ELSE (SELECT t.reltype FROM pg_class t WHERE t.oid = c.objid) END
         WHERE c.classid IN ('pg_type'::regclass, 'pg_class'::regclass)
        UNION
        SELECT i.inhrelid FROM pg_inherits i JOIN altered a ON i.inhparent = a.oid
    )
    SELECT array_agg(DISTINCT a.oid ORDER BY a.oid) INTO oids
      FROM altered a
      JOIN @extschema@._cdc_publications p ON p.table_oid = a.oid;
    IF oids IS NOT NULL THEN
        PERFORM @extschema@._cdc_schema_changed(oids);
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION @extschema@._cdc_schema_changes() FROM PUBLIC;
CREATE EVENT TRIGGER _cdc_schema_changes ON ddl_command_end WHEN TAG IN ('ALTER TABLE', 'ALTER TYPE')
    EXECUTE FUNCTION @extschema@._cdc_schema_changes();

CREATE FUNCTION @extschema@._cdc_schema_changed(table_oids oid[]) RETURNS void
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', '_cdc_schema_changed_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@._cdc_schema_changed(oid[]) FROM PUBLIC;
CREATE FUNCTION @extschema@.cdc_schema_history(table_name regclass) RETURNS jsonb
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_schema_history_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_schema_history(regclass) FROM PUBLIC;
CREATE FUNCTION @extschema@.cdc_force_schema_break(table_name regclass) RETURNS jsonb
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_force_schema_break_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_force_schema_break(regclass) FROM PUBLIC;
CREATE FUNCTION @extschema@.cdc_create_version_topic(table_name regclass, version integer) RETURNS jsonb
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_create_version_topic_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_create_version_topic(regclass, integer) FROM PUBLIC;
CREATE FUNCTION @extschema@.cdc_check_compatibility(table_name regclass, proposed_change text) RETURNS jsonb
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_check_compatibility_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_check_compatibility(regclass, text) FROM PUBLIC;

-- Regional routing (cdc_enable_multicloud): where a table's routing last changed, and the events
-- each sink delivered per route since.
ALTER TABLE @extschema@._cdc_publications ADD COLUMN routing_lsn pg_lsn;
COMMENT ON COLUMN @extschema@._cdc_publications.routing_lsn IS 'where the table''s regional_routing last changed (its pg_cdc_routing message); routing applies to changes after it';
CREATE TABLE @extschema@._cdc_route_offsets (
    sink_name        text NOT NULL REFERENCES @extschema@._cdc_sinks (sink_name) ON DELETE CASCADE,
    table_oid        oid NOT NULL,
    route            text NOT NULL,
    routing_lsn      pg_lsn NOT NULL,
    events           bigint NOT NULL DEFAULT 0,
    last_commit_at   timestamptz,
    last_acked_at    timestamptz,
    PRIMARY KEY (sink_name, table_oid, route)
);
COMMENT ON TABLE @extschema@._cdc_route_offsets IS 'pg_cdc: events delivered per sink, table and regional_routing route since the routing took effect (cdc_multicloud_status)';
COMMENT ON COLUMN @extschema@._cdc_route_offsets.routing_lsn IS 'the routing the counts belong to (_cdc_publications.routing_lsn); rows of an older routing start again from 0';
COMMENT ON COLUMN @extschema@._cdc_route_offsets.last_commit_at IS 'commit time of the last delivered transaction with an event of the route';
COMMENT ON COLUMN @extschema@._cdc_route_offsets.last_acked_at IS 'when the worker recorded that delivery, right after the sink acknowledged it';
REVOKE ALL ON @extschema@._cdc_route_offsets FROM PUBLIC;
CREATE FUNCTION @extschema@.cdc_enable_multicloud(table_name regclass, config jsonb) RETURNS uuid
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_enable_multicloud_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_enable_multicloud(regclass, jsonb) FROM PUBLIC;
CREATE FUNCTION @extschema@.cdc_multicloud_status(table_name regclass DEFAULT NULL) RETURNS SETOF jsonb
VOLATILE LANGUAGE c AS 'MODULE_PATHNAME', 'cdc_multicloud_status_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cdc_multicloud_status(regclass) FROM PUBLIC;

-- A dropped table's history goes with it.
CREATE OR REPLACE FUNCTION @extschema@._cdc_forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    IF to_regclass('@extschema@._cdc_publications') IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM @extschema@._cdc_offsets o USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = o.table_oid;
    DELETE FROM @extschema@._cdc_route_offsets o USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = o.table_oid;
    -- Copies of a dropped lookup table, and of the lookups of a dropped captured table.
    DELETE FROM @extschema@._cdc_lookups l USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid IN (l.table_oid, l.lookup_oid);
    DELETE FROM @extschema@._cdc_schema_versions v USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = v.table_oid;
    DELETE FROM @extschema@._cdc_schema_breaks b USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = b.table_oid;
    DELETE FROM @extschema@._cdc_version_topics t USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = t.table_oid;
    DELETE FROM @extschema@._cdc_publications p USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = p.table_oid;
END $$;

-- Version 1 of every table captured before the upgrade: its columns now.
INSERT INTO @extschema@._cdc_schema_versions (table_oid, version, lsn, fields, mode)
SELECT p.table_oid, 1, pg_current_wal_insert_lsn(), @extschema@._cdc_table_fields(p.table_oid),
       CASE WHEN p.config #>> '{schema_evolution,enabled}' = 'false' THEN 'none'
            ELSE coalesce(p.config #>> '{schema_evolution,compatibility_mode}', 'backward') END
  FROM @extschema@._cdc_publications p;
