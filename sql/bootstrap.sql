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
    previous_replica_identity "char",
    previous_replica_identity_index oid
);
COMMENT ON TABLE _cdc_publications IS 'pg_cdc: one row per captured table (cdc_enable / cdc_disable)';
COMMENT ON COLUMN _cdc_publications.table_name IS 'the table as regclass::text printed it when capture was enabled';
COMMENT ON COLUMN _cdc_publications.config IS 'the capture config as given to cdc_enable (validated)';
COMMENT ON COLUMN _cdc_publications.table_oid IS 'the captured table; internal lookups use this, so renames are harmless';
COMMENT ON COLUMN _cdc_publications.key_columns IS 'resolved message key: key_columns, else the primary key, else the replica identity index';
COMMENT ON COLUMN _cdc_publications.previous_replica_identity IS 'relreplident before include_before_image set FULL; cdc_disable restores it';

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
    state_since      timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE _cdc_sinks IS 'pg_cdc: one row per destination (cdc_add_sink / cdc_drop_sink); each has its own logical slot';
COMMENT ON COLUMN _cdc_sinks.slot_name IS 'the logical replication slot this sink reads (pgoutput over the _cdc_publication publication)';
COMMENT ON COLUMN _cdc_sinks.table_oids IS 'tables this sink is limited to (config.tables); NULL means every captured table';
COMMENT ON COLUMN _cdc_sinks.state IS 'starting | running | retrying | error, set by the worker';
COMMENT ON COLUMN _cdc_sinks.last_error IS 'the last error the worker met for this sink (no secrets)';

CREATE TABLE _cdc_offsets (
    sink_name        text NOT NULL REFERENCES _cdc_sinks (sink_name) ON DELETE CASCADE,
    table_name       text NOT NULL,
    last_lsn         bigint,
    last_timestamp   timestamptz,
    events_published bigint NOT NULL DEFAULT 0,
    table_oid        oid NOT NULL,
    PRIMARY KEY (sink_name, table_name)
);
COMMENT ON TABLE _cdc_offsets IS 'pg_cdc: delivery progress per sink and table, updated after the broker acknowledged';
COMMENT ON COLUMN _cdc_offsets.last_lsn IS 'commit LSN of the last delivered transaction that touched the table';
COMMENT ON COLUMN _cdc_offsets.last_timestamp IS 'commit time of that transaction';
COMMENT ON COLUMN _cdc_offsets.events_published IS 'events delivered for this table, acknowledged by the broker';

-- Catalog rows hold sink configs that may carry credentials: nobody but the owner reads them.
REVOKE ALL ON _cdc_publications, _cdc_sinks, _cdc_offsets FROM PUBLIC;

-- The publication every sink's slot reads. It must exist before any slot is created, because
-- pgoutput looks it up as of the WAL position being decoded. A leftover from an earlier install is
-- replaced so its table list starts empty.
DROP PUBLICATION IF EXISTS _cdc_publication;
CREATE PUBLICATION _cdc_publication WITH (publish = 'insert, update, delete, truncate');
-- Insert-only captured tables live here: a table in a publication that publishes updates needs a
-- replica identity for the application's own UPDATEs, one that publishes only inserts does not.
DROP PUBLICATION IF EXISTS _cdc_publication_inserts;
CREATE PUBLICATION _cdc_publication_inserts WITH (publish = 'insert, truncate');
