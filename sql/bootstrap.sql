-- pg_cdc catalog. Created in the extension's schema (default public) so the product's SQL runs
-- unqualified. Everything internal is keyed by OID; table names are kept as regclass::text prints them.

CREATE TABLE _cdc_publications (
    publication_id   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    table_name       text NOT NULL,
    config           jsonb NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now(),
    status           varchar(20) NOT NULL DEFAULT 'active',
    table_oid        oid NOT NULL UNIQUE,
    key_columns      text[] NOT NULL DEFAULT '{}',
    lookup_oids      oid[] NOT NULL DEFAULT '{}',
    previous_replica_identity "char",
    previous_replica_identity_index oid,
    routing_lsn      pg_lsn,
    lookup_names     text[] NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE _cdc_publications IS 'pg_cdc: one row per captured table (cdc_enable / cdc_disable)';
COMMENT ON COLUMN _cdc_publications.table_name IS 'the table as regclass::text printed it when capture was enabled';
COMMENT ON COLUMN _cdc_publications.config IS 'the capture config as given to cdc_enable (validated)';
COMMENT ON COLUMN _cdc_publications.table_oid IS 'the captured table; internal lookups use this, so renames are harmless';
COMMENT ON COLUMN _cdc_publications.key_columns IS 'resolved message key: key_columns, else the primary key, else the replica identity index';
COMMENT ON COLUMN _cdc_publications.lookup_oids IS 'the lookup table of each enrich transformation, in config order';
COMMENT ON COLUMN _cdc_publications.previous_replica_identity IS 'relreplident before include_before_image set FULL; cdc_disable restores it';
COMMENT ON COLUMN _cdc_publications.lookup_names IS 'the lookup tables of lookup_oids, schema-qualified, as cdc_enable resolved them: a dropped one''s OID becomes 0 there and its name stays, until cdc_enable of that name binds a new table (cdc_status lists it in missing_tables meanwhile)';
COMMENT ON COLUMN _cdc_publications.routing_lsn IS 'where the table''s regional_routing last changed (its pg_cdc_routing message); routing applies to changes after it';

CREATE TABLE _cdc_sinks (
    sink_id          uuid PRIMARY KEY,
    sink_name        text NOT NULL UNIQUE CHECK (sink_name <> ''),
    sink_type        text NOT NULL,
    config           jsonb NOT NULL,
    slot_name        name NOT NULL UNIQUE,
    table_oids       oid[],
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivery_mode    text NOT NULL,
    state            text NOT NULL DEFAULT 'starting',
    last_error       text,
    state_since      timestamptz NOT NULL DEFAULT now(),
    table_names      text[],
    added_by         oid,
    -- The labels of cdc_core::state::SinkState, the only strings ever stored here (a unit test
    -- compares the two lists).
    CONSTRAINT _cdc_sinks_state_check CHECK (state IN ('creating_slot', 'starting', 'snapshotting', 'running', 'retrying', 'error', 'finished', 'paused'))
);
COMMENT ON TABLE _cdc_sinks IS 'pg_cdc: one row per destination (cdc_add_sink / cdc_drop_sink); each has its own logical slot';
COMMENT ON COLUMN _cdc_sinks.slot_name IS 'the logical replication slot this sink reads (pgoutput over the _cdc_publication publication)';
COMMENT ON COLUMN _cdc_sinks.table_oids IS 'tables this sink is limited to (config.tables); NULL means every captured table; 0 stands for a dropped table (its name is in table_names) until cdc_enable of that name binds a new one';
COMMENT ON COLUMN _cdc_sinks.table_names IS 'the tables of table_oids, schema-qualified, as cdc_add_sink resolved config.tables (a rename does not change them; cdc_status lists those whose table was dropped in missing_tables)';
COMMENT ON COLUMN _cdc_sinks.state IS 'creating_slot | starting | snapshotting | running | retrying | error | finished (set by the worker) | paused (cdc_pause_sink) (docs/sql-reference.md)';
COMMENT ON COLUMN _cdc_sinks.last_error IS 'the last error the worker met for this sink (no secrets)';
COMMENT ON COLUMN _cdc_sinks.added_by IS 'the role that added the sink (NULL: added before 0.7.0, by a superuser); while it is not a superuser, a postgres sink''s connection must use a password and not be a superuser''s on this server';

CREATE TABLE _cdc_offsets (
    sink_name        text NOT NULL REFERENCES _cdc_sinks (sink_name) ON DELETE CASCADE,
    table_name       text NOT NULL,
    last_lsn         bigint,
    last_timestamp   timestamptz,
    events_published bigint NOT NULL DEFAULT 0,
    table_oid        oid NOT NULL,
    table_schema     text NOT NULL,
    PRIMARY KEY (sink_name, table_oid)
);
COMMENT ON TABLE _cdc_offsets IS 'pg_cdc: delivery progress per sink and table, updated after the broker acknowledged';
COMMENT ON COLUMN _cdc_offsets.table_name IS 'the table''s name without its schema (table_schema), as of its last delivery: one row per table, a RENAME renames it';
COMMENT ON COLUMN _cdc_offsets.table_schema IS 'the schema of the table, as of its last delivery';
COMMENT ON COLUMN _cdc_offsets.last_lsn IS 'commit LSN of the last delivered transaction that touched the table';
COMMENT ON COLUMN _cdc_offsets.last_timestamp IS 'commit time of that transaction';
COMMENT ON COLUMN _cdc_offsets.events_published IS 'events delivered for this table, acknowledged by the broker';

-- Each sink's own copy of the lookup tables its `enrich` transformations read, as of a WAL
-- position: cdc_enable / cdc_add_sink copy the table, the worker moves the copy forward with the
-- lookup table's changes from the sink's slot, so events get the lookup rows as of their commit.
CREATE TABLE _cdc_lookups (
    sink_id          uuid NOT NULL REFERENCES _cdc_sinks ON DELETE CASCADE,
    table_oid        oid NOT NULL,
    position         int NOT NULL,
    lookup_oid       oid NOT NULL,
    lookup_column    text NOT NULL,
    add_columns      text[] NOT NULL,
    add_types        oid[] NOT NULL,
    as_of_lsn        pg_lsn NOT NULL,
    PRIMARY KEY (sink_id, table_oid, position)
);
COMMENT ON TABLE _cdc_lookups IS 'pg_cdc: per sink, the copy of each lookup table an enrich transformation reads';
COMMENT ON COLUMN _cdc_lookups.table_oid IS 'the captured table whose events are enriched';
COMMENT ON COLUMN _cdc_lookups.position IS 'which of its enrich transformations (0-based, config order)';
COMMENT ON COLUMN _cdc_lookups.as_of_lsn IS 'the copy holds every change of the lookup table committed before this position';

CREATE TABLE _cdc_lookup_rows (
    sink_id          uuid NOT NULL,
    table_oid        oid NOT NULL,
    position         int NOT NULL,
    lookup_key       text NOT NULL,
    vals             text[] NOT NULL,
    PRIMARY KEY (sink_id, table_oid, position, lookup_key),
    FOREIGN KEY (sink_id, table_oid, position) REFERENCES _cdc_lookups ON DELETE CASCADE
);
COMMENT ON TABLE _cdc_lookup_rows IS 'pg_cdc: the rows of each copy in _cdc_lookups: key and added columns, as text';

-- The in-database sinks (sink type `table`): the table each writes its events to, and the
-- checkpoint written in the same transaction as the events (exactly-once; see cdc-sinks table/).
CREATE TABLE _cdc_table_sinks (
    sink_id          uuid PRIMARY KEY REFERENCES _cdc_sinks ON DELETE CASCADE,
    event_table      oid NOT NULL,
    checkpoint       jsonb,
    trimmed_upto     bigint NOT NULL DEFAULT 0
);
COMMENT ON TABLE _cdc_table_sinks IS 'pg_cdc: per in-database sink, its event table and delivery checkpoint';
COMMENT ON COLUMN _cdc_table_sinks.event_table IS 'the table cdc_add_sink created for the events (renames are harmless)';
COMMENT ON COLUMN _cdc_table_sinks.checkpoint IS 'end LSN of the last transaction whose events are in the table, written with them';
COMMENT ON COLUMN _cdc_table_sinks.trimmed_upto IS 'events with event_id up to this were removed by retention';

-- The consumers of in-database sinks (cdc_consume): how far each has consumed.
CREATE TABLE _cdc_consumers (
    sink_id          uuid NOT NULL REFERENCES _cdc_sinks ON DELETE CASCADE,
    consumer         text NOT NULL CHECK (consumer <> ''),
    position         bigint NOT NULL DEFAULT 0,
    consumed_at      timestamptz,
    PRIMARY KEY (sink_id, consumer)
);
COMMENT ON TABLE _cdc_consumers IS 'pg_cdc: per in-database sink and consumer name, the last event_id cdc_consume returned';

-- Snapshots (a sink's snapshot_mode initial): which rows of each table were delivered as READ
-- events, and the chunk in flight (see cdc_core::snapshot).
CREATE TABLE _cdc_snapshots (
    snapshot_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink_id          uuid NOT NULL REFERENCES _cdc_sinks ON DELETE CASCADE,
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
    finished_at      timestamptz,
    dropped_schema   text,
    dropped_name     text
);
CREATE INDEX _cdc_snapshots_sink ON _cdc_snapshots (sink_id);
COMMENT ON TABLE _cdc_snapshots IS 'pg_cdc: per sink and table, a snapshot of the rows the table holds (READ events), read in chunks by key';
COMMENT ON COLUMN _cdc_snapshots.chunk_key IS 'the columns chunks are read by: the replica identity index when the table has one, else the primary key';
COMMENT ON COLUMN _cdc_snapshots.last_key IS 'key of the last row of the last delivered chunk (NULL: from the start)';
COMMENT ON COLUMN _cdc_snapshots.chunk_watermark IS 'the chunk read and not known delivered: the end of its watermark message';
COMMENT ON COLUMN _cdc_snapshots.chunk_last_key IS 'key of that chunk''s last row';
COMMENT ON COLUMN _cdc_snapshots.chunk_last IS 'that chunk read fewer rows than a chunk holds: the table is done once it is delivered';
COMMENT ON COLUMN _cdc_snapshots.dropped_schema IS 'the schema of the table when it was dropped (cdc_snapshots shows the table''s current names while it exists)';
COMMENT ON COLUMN _cdc_snapshots.dropped_name IS 'the name of the table when it was dropped';
COMMENT ON COLUMN _cdc_snapshots.keyless_until IS 'a table without a key: its rows were read with the snapshot of a slot''s consistent point, this position; its changes in transactions that commit before it are not delivered (the rows hold them)';

CREATE TABLE _cdc_schema_versions (
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
COMMENT ON TABLE _cdc_schema_versions IS 'pg_cdc: the schema history of each captured table: version 1 at cdc_enable, one more for each DDL that changes its columns';
COMMENT ON COLUMN _cdc_schema_versions.lsn IS 'the WAL insert position when the version was recorded (before the DDL commits)';
COMMENT ON COLUMN _cdc_schema_versions.fields IS 'the columns (attnum, name, type, type_oid, typmod, not_null, default, missing)';
COMMENT ON COLUMN _cdc_schema_versions.changes IS 'what changed from the version before (ADD_FIELD, DROP_FIELD, RENAME_FIELD, CHANGE_TYPE, SET_REQUIRED, SET_OPTIONAL, CHANGE_DEFAULT)';
COMMENT ON COLUMN _cdc_schema_versions.compatibility IS 'FULL, BACKWARD, FORWARD or NONE against the version before (NULL for version 1)';
COMMENT ON COLUMN _cdc_schema_versions.mode IS 'the table''s compatibility_mode when the version was recorded';
COMMENT ON COLUMN _cdc_schema_versions.forced IS 'a change the mode forbids, let through by cdc_force_schema_break';
COMMENT ON COLUMN _cdc_schema_versions.schema_ids IS 'the ids schema registries gave this version''s Avro schema ([{registry, subject, schema_id}], written by the worker when it registers)';

CREATE TABLE _cdc_schema_breaks (
    table_oid        oid PRIMARY KEY,
    allowed_by       name NOT NULL DEFAULT current_user,
    allowed_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE _cdc_schema_breaks IS 'pg_cdc: tables whose next change that breaks their compatibility_mode is let through (cdc_force_schema_break)';

CREATE TABLE _cdc_version_topics (
    table_oid        oid NOT NULL,
    version          integer NOT NULL CHECK (version > 1),
    requested_by     name NOT NULL DEFAULT current_user,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_oid, version)
);
COMMENT ON TABLE _cdc_version_topics IS 'pg_cdc: table versions whose events (and those of the versions after them) go to a topic of their own, <topic>.v<version> (cdc_create_version_topic); a row for the next version arms it';

-- Per sink, table and regional_routing route: the events delivered since the routing took effect
-- (routing_lsn), for cdc_multicloud_status. Written with _cdc_offsets, in the same transaction.
CREATE TABLE _cdc_route_offsets (
    sink_name        text NOT NULL REFERENCES _cdc_sinks (sink_name) ON DELETE CASCADE,
    table_oid        oid NOT NULL,
    route            text NOT NULL,
    routing_lsn      pg_lsn NOT NULL,
    events           bigint NOT NULL DEFAULT 0,
    last_commit_at   timestamptz,
    last_acked_at    timestamptz,
    PRIMARY KEY (sink_name, table_oid, route)
);
COMMENT ON TABLE _cdc_route_offsets IS 'pg_cdc: events delivered per sink, table and regional_routing route since the routing took effect (cdc_multicloud_status)';
COMMENT ON COLUMN _cdc_route_offsets.routing_lsn IS 'the routing the counts belong to (_cdc_publications.routing_lsn); rows of an older routing start again from 0';
COMMENT ON COLUMN _cdc_route_offsets.last_commit_at IS 'commit time of the last delivered transaction with an event of the route';
COMMENT ON COLUMN _cdc_route_offsets.last_acked_at IS 'when the worker recorded that delivery, right after the sink acknowledged it';

-- What a dropped sink leaves at its destination and pg_cdc deletes after the drop committed and the
-- sink's worker stopped (the launcher does it, and tries again while the destination is down): an
-- exactly-once Kafka or Event Hubs sink's progress topic.
CREATE TABLE _cdc_cleanups (
    cleanup_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink_id          uuid NOT NULL,
    sink_name        text NOT NULL,
    sink_type        text NOT NULL,
    config           jsonb NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('progress_topic')),
    target           text NOT NULL,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    last_attempt_at  timestamptz,
    last_error       text
);
COMMENT ON TABLE _cdc_cleanups IS 'pg_cdc: what dropped sinks left at their destination, deleted by the launcher once the drop committed and the sink''s worker stopped (a row stays while it fails)';
COMMENT ON COLUMN _cdc_cleanups.config IS 'the dropped sink''s config, to reach its destination (it may hold credentials)';
COMMENT ON COLUMN _cdc_cleanups.target IS 'what is deleted: the progress topic''s name';
COMMENT ON COLUMN _cdc_cleanups.last_error IS 'why the last attempt failed; the next one comes after a pause that doubles with each attempt, up to 5 minutes';

-- Catalog rows hold sink configs that may carry credentials, and copies of lookup tables: nobody
-- but the owner reads them.
REVOKE ALL ON _cdc_publications, _cdc_sinks, _cdc_offsets, _cdc_lookups, _cdc_lookup_rows, _cdc_table_sinks,
    _cdc_consumers, _cdc_snapshots, _cdc_schema_versions, _cdc_schema_breaks, _cdc_version_topics, _cdc_route_offsets, _cdc_cleanups
    FROM PUBLIC;

-- The publication every sink's slot reads. It must exist before any slot is created, because
-- pgoutput looks it up as of the WAL position being decoded. A leftover from an earlier install is
-- replaced so its table list starts empty.
DROP PUBLICATION IF EXISTS _cdc_publication;
CREATE PUBLICATION _cdc_publication WITH (publish = 'insert, update, delete, truncate');
-- Insert-only captured tables live here: a table in a publication that publishes updates needs a
-- replica identity for the application's own UPDATEs, one that publishes only inserts does not.
DROP PUBLICATION IF EXISTS _cdc_publication_inserts;
CREATE PUBLICATION _cdc_publication_inserts WITH (publish = 'insert, truncate');
