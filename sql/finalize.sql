-- Configuring capture is for superusers and roles they grant it to: REVOKE the default EXECUTE
-- from PUBLIC on every pg_cdc function.
REVOKE EXECUTE ON FUNCTION cdc_enable(regclass, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_disable(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_add_sink(text, text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_drop_sink(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_alter_sink(text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_reconcile(jsonb, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_export_spec() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_verify(text, regclass, integer, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_pause_sink(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_resume_sink(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_delivery_status(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_filter_metrics(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_preview(regclass, jsonb, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_create_tokenization_key() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_snapshot(regclass, text, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_cancel_snapshot(regclass, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_schema_history(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_force_schema_break(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_create_version_topic(regclass, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_check_compatibility(regclass, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_enable_multicloud(regclass, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_multicloud_status(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION _cdc_schema_changed(oid[]) FROM PUBLIC;

-- Consumes an in-database sink's events in commit order: returns up to max_events events after
-- what this consumer consumed, and records them as consumed when the caller's transaction commits
-- (a rolled-back transaction gets the same events again). Calls of one consumer wait for each
-- other, so each event goes to one call; each consumer name reads every event once.
CREATE FUNCTION cdc_consume(sink_name text, max_events integer DEFAULT 1000, consumer text DEFAULT 'default')
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
REVOKE EXECUTE ON FUNCTION cdc_consume(text, integer, text) FROM PUBLIC;

-- The trigger of tables that capture user context: emits the sealed context of each statement,
-- before its rows, inside the writing transaction. SECURITY DEFINER so writers need no right on
-- pg_logical_emit_message; session_user (what the context reports) is unaffected.
CREATE FUNCTION _cdc_context_trigger() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pg_logical_emit_message(true, 'pg_cdc.context', @extschema@._cdc_context_message(TG_ARGV[0]::boolean));
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION _cdc_context_message(boolean) FROM PUBLIC;

-- A captured table that is dropped leaves no catalog rows behind (its publication membership goes
-- with it). Only whole tables: ALTER TABLE ... DROP COLUMN reports the column as a pg_class object
-- with its attribute number in objsubid, and must not make pg_cdc forget the table. During DROP
-- EXTENSION the catalog is already gone: nothing to do then. A dropped table a sink's `tables` named,
-- or the lookup table of an enrich transformation, keeps its name and stands as OID 0 until
-- cdc_enable of that name binds a new table (cdc_status lists it in missing_tables meanwhile).
-- SECURITY DEFINER: it runs for every DROP of every role, which need no right on the catalog.
CREATE FUNCTION _cdc_forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    dropped oid[];
    r record;
BEGIN
    IF to_regclass('@extschema@._cdc_publications') IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(d.objid) INTO dropped FROM pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0;
    IF dropped IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM @extschema@._cdc_offsets o WHERE o.table_oid = ANY (dropped);
    DELETE FROM @extschema@._cdc_route_offsets o WHERE o.table_oid = ANY (dropped);
    -- Snapshots of a dropped table keep its names for cdc_snapshots.
    UPDATE @extschema@._cdc_snapshots s SET dropped_schema = d.schema_name, dropped_name = d.object_name
      FROM pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND s.table_oid = d.objid;
    -- Copies of the lookups of a dropped captured table.
    DELETE FROM @extschema@._cdc_lookups l WHERE l.table_oid = ANY (dropped);
    -- A dropped lookup table: its copies lose their rows and stand for no table (OID 0), so the
    -- events that enrich from it find no row, as of their commit, until it is bound again.
    DELETE FROM @extschema@._cdc_lookup_rows x USING @extschema@._cdc_lookups l
     WHERE l.lookup_oid = ANY (dropped)
       AND (x.sink_id, x.table_oid, x.position) = (l.sink_id, l.table_oid, l.position);
    UPDATE @extschema@._cdc_lookups SET lookup_oid = 0 WHERE lookup_oid = ANY (dropped);
    FOR r IN SELECT p.table_name, string_agg(u.n, ', ' ORDER BY u.i) AS names
               FROM @extschema@._cdc_publications p, unnest(p.lookup_oids, p.lookup_names) WITH ORDINALITY u(o, n, i)
              WHERE u.o = ANY (dropped) AND NOT p.table_oid = ANY (dropped)
              GROUP BY p.table_name ORDER BY p.table_name LOOP
        RAISE NOTICE 'table % enriches from the dropped table %: its events find no row there until cdc_enable of that name binds a new table', r.table_name, r.names;
    END LOOP;
    UPDATE @extschema@._cdc_publications p
       SET lookup_oids = ARRAY(SELECT CASE WHEN u.o = ANY (dropped) THEN 0::oid ELSE u.o END
                                 FROM unnest(p.lookup_oids) WITH ORDINALITY u(o, i) ORDER BY u.i)
     WHERE p.lookup_oids && dropped;
    DELETE FROM @extschema@._cdc_schema_versions v WHERE v.table_oid = ANY (dropped);
    DELETE FROM @extschema@._cdc_schema_breaks b WHERE b.table_oid = ANY (dropped);
    DELETE FROM @extschema@._cdc_version_topics t WHERE t.table_oid = ANY (dropped);
    DELETE FROM @extschema@._cdc_publications p WHERE p.table_oid = ANY (dropped);
    -- A sink limited to a dropped table waits for it by name.
    FOR r IN SELECT s.sink_name, string_agg(u.n, ', ' ORDER BY u.i) AS names
               FROM @extschema@._cdc_sinks s, unnest(s.table_oids, s.table_names) WITH ORDINALITY u(o, n, i)
              WHERE u.o = ANY (dropped)
              GROUP BY s.sink_name ORDER BY s.sink_name LOOP
        RAISE NOTICE 'sink "%" carries the dropped table %: it goes on with its other tables, and carries a new table of that name once cdc_enable binds it', r.sink_name, r.names;
    END LOOP;
    UPDATE @extschema@._cdc_sinks s
       SET table_oids = ARRAY(SELECT CASE WHEN u.o = ANY (dropped) THEN 0::oid ELSE u.o END
                                FROM unnest(s.table_oids) WITH ORDINALITY u(o, i) ORDER BY u.i)
     WHERE s.table_oids && dropped;
END $$;
REVOKE EXECUTE ON FUNCTION _cdc_forget_dropped_tables() FROM PUBLIC;
CREATE EVENT TRIGGER _cdc_forget_dropped_tables ON sql_drop EXECUTE FUNCTION _cdc_forget_dropped_tables();

-- Schema history (cdc_core::schema): the columns of a table as a version records them. Generated
-- columns are left out (PostgreSQL 15 does not publish them). "missing" is the value rows older
-- than an ADD COLUMN ... DEFAULT read (attmissingval).
CREATE FUNCTION _cdc_table_fields(table_oid oid) RETURNS jsonb
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
REVOKE EXECUTE ON FUNCTION _cdc_table_fields(oid) FROM PUBLIC;

-- Every ALTER TABLE of a captured table: a new schema version when its columns changed, checked
-- against the table's compatibility_mode (a WARNING, or with "enforce" an ERROR that rolls the DDL
-- back). SECURITY DEFINER: the table's owner needs no right on the catalog. Local only: no
-- network call while the DDL holds its lock.
CREATE FUNCTION _cdc_schema_changes() RETURNS event_trigger
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
REVOKE EXECUTE ON FUNCTION _cdc_schema_changes() FROM PUBLIC;
CREATE EVENT TRIGGER _cdc_schema_changes ON ddl_command_end WHEN TAG IN ('ALTER TABLE', 'ALTER TYPE')
    EXECUTE FUNCTION _cdc_schema_changes();

-- The physical slots `synchronized_standby_slots` (PostgreSQL 17+) names, in its order: what each
-- standby confirmed (its slot's restart position), whether a standby streams from it now and how far
-- behind in time its flushes are (pg_stat_replication.flush_lag), and what makes it unusable (then
-- failover slots deliver nothing: pg_cdc waits as walsenders do). No rows before 17 or while the
-- setting is empty.
CREATE FUNCTION _cdc_standby_slots() RETURNS TABLE (slot_name text, confirmed_lsn pg_lsn, streaming boolean,
                                                flush_lag interval, problem text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT n.name, r.restart_lsn, coalesce(r.active, false),
           (SELECT w.flush_lag FROM pg_stat_replication w WHERE w.pid = r.active_pid),
           CASE WHEN r.slot_name IS NULL THEN 'does not exist'
                WHEN r.slot_type <> 'physical' THEN 'is a logical slot, not a standby''s physical slot'
                WHEN r.wal_status = 'lost' OR to_jsonb(r) ->> 'invalidation_reason' IS NOT NULL THEN 'was invalidated'
                WHEN r.restart_lsn IS NULL THEN 'has never been used by a standby' END
      FROM unnest(string_to_array(current_setting('synchronized_standby_slots', true), ',')) WITH ORDINALITY u(raw, i)
     CROSS JOIN LATERAL (SELECT btrim(btrim(u.raw), '"') AS name) n
      LEFT JOIN pg_replication_slots r ON r.slot_name = n.name
     WHERE n.name <> ''
     ORDER BY u.i
$$;
REVOKE EXECUTE ON FUNCTION _cdc_standby_slots() FROM PUBLIC;

-- One overview row per sink (pipeline): state, slot health, lag, delivery and end-to-end latency,
-- and what PostgreSQL 17/18 may do to its slot: whether it follows a failover, when the idle
-- timeout would invalidate it, and which standby holds its delivery back.
-- SECURITY DEFINER, and granted to pg_monitor: monitoring roles see figures and states, never the
-- sink configs (they may hold credentials). Columns PostgreSQL 15/16 lack are read through to_jsonb
-- (NULL there), so one definition serves every version.
CREATE FUNCTION cdc_status() RETURNS TABLE (
    sink_name text, sink_type text, delivery_mode text, state text, last_error text, since timestamptz,
    slot_name text, wal_status text, retained_wal_bytes bigint, safe_wal_size bigint, lag_bytes bigint,
    last_delivered_at timestamptz, events_published bigint,
    end_to_end_p50_ms double precision, end_to_end_p99_ms double precision, end_to_end_p999_ms double precision,
    missing_tables text[], slot_failover boolean, slot_invalidation_reason text, slot_idle_deadline timestamptz,
    standby_wait text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.sink_name, s.sink_type, s.delivery_mode, s.state, s.last_error, s.state_since,
           s.slot_name::text, r.wal_status,
           (pg_current_wal_lsn() - r.restart_lsn)::bigint, r.safe_wal_size,
           (pg_current_wal_lsn() - r.confirmed_flush_lsn)::bigint,
           o.last_delivered_at, coalesce(o.events, 0)::bigint,
           (l.v ->> 'p50_ms')::float8, (l.v ->> 'p99_ms')::float8, (l.v ->> 'p999_ms')::float8,
           -- Tables of its `tables` that were dropped, then the dropped lookup tables of the tables
           -- it carries: each waits for cdc_enable of its name.
           ARRAY(SELECT u.n FROM unnest(s.table_oids, s.table_names) WITH ORDINALITY u(o, n, i)
                  WHERE u.o = 0 ORDER BY u.i)
           || ARRAY(SELECT u.n || ' (lookup of ' || p.table_name || ')'
                      FROM @extschema@._cdc_publications p,
                           unnest(p.lookup_oids, p.lookup_names) WITH ORDINALITY u(o, n, i)
                     WHERE u.o = 0 AND (s.table_oids IS NULL OR p.table_oid = ANY (s.table_oids))
                     ORDER BY p.table_name, u.i),
           (j.slot ->> 'failover')::boolean, j.slot ->> 'invalidation_reason',
           -- PostgreSQL 18 invalidates a slot no process held for idle_replication_slot_timeout (at a
           -- checkpoint): a sink's slot is unheld while it retries or waits in error.
           CASE WHEN t.idle_secs > 0 AND NOT r.active AND r.wal_status IS DISTINCT FROM 'lost'
                THEN (j.slot ->> 'inactive_since')::timestamptz + make_interval(secs => t.idle_secs) END,
           w.standby_wait
      FROM @extschema@._cdc_sinks s
      LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name
     CROSS JOIN LATERAL (SELECT to_jsonb(r) AS slot) j
     CROSS JOIN LATERAL (SELECT (SELECT setting::int FROM pg_settings
                                  WHERE name = 'idle_replication_slot_timeout') AS idle_secs) t
      LEFT JOIN LATERAL (SELECT max(last_timestamp) AS last_delivered_at, sum(events_published) AS events
                           FROM @extschema@._cdc_offsets WHERE sink_name = s.sink_name) o ON true
     CROSS JOIN LATERAL (SELECT @extschema@._cdc_sink_latency(s.sink_id::text) AS v) l
      -- A failover slot is read only as far as every standby synchronized_standby_slots names has
      -- confirmed. Shown: a standby that is unusable; one behind the WAL that no standby streams from
      -- (down: the sink stops at its position, if it has not yet); one streaming more than a second
      -- behind (the sink goes at its pace), or behind WAL the sink has reached.
      LEFT JOIN LATERAL (
          SELECT string_agg(CASE WHEN x.problem IS NOT NULL
                                 THEN format('standby slot %s %s: nothing is delivered until it is fixed or '
                                             'synchronized_standby_slots no longer names it', x.slot_name, x.problem)
                                 ELSE format('waiting for standby slot %s (%s), which confirmed WAL up to %s, %s bytes '
                                             'behind', x.slot_name,
                                             CASE WHEN NOT x.streaming THEN 'no standby streaming: down?'
                                                  WHEN x.flush_lag IS NULL THEN 'streaming'
                                                  ELSE format('streaming, flushes %s s behind',
                                                              round(extract(epoch FROM x.flush_lag), 1)) END,
                                             x.confirmed_lsn, pg_current_wal_lsn() - x.confirmed_lsn) END,
                            '; ') AS standby_wait
            FROM @extschema@._cdc_standby_slots() x
           WHERE (j.slot ->> 'failover')::boolean
             AND (x.problem IS NOT NULL
                  OR (x.confirmed_lsn < pg_current_wal_lsn()
                      AND (NOT x.streaming OR x.flush_lag > interval '1 second'
                           OR x.confirmed_lsn <= r.confirmed_flush_lsn)))) w ON true
     ORDER BY s.sink_name
$$;

-- Whether this server is ready for a failover, setting by setting: run it on the primary and on each
-- standby that may be promoted. Each row names a setting or a slot, whether it is as a failover
-- needs, and what to change. Never shows primary_conninfo (it may hold a password).
CREATE FUNCTION cdc_check_failover() RETURNS TABLE (item text, ok boolean, detail text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    version int := current_setting('server_version_num')::int;
    standby boolean := pg_is_in_recovery();
    setting text;
    sink record;
    slot record;
BEGIN
    item := 'server_version';
    ok := version >= 170000;
    detail := CASE WHEN ok
        THEN format('PostgreSQL %s: a standby with sync_replication_slots = on keeps copies of the sinks'' failover '
                    'slots, and the sinks go on from them after its promotion', current_setting('server_version'))
        ELSE format('PostgreSQL %s: a standby keeps no logical slot, so after a promotion every sink stops in error '
                    'naming its missing slot; drop and re-add each sink there (its snapshot sends every row again). '
                    'Failover slots need PostgreSQL 17 or later', current_setting('server_version')) END;
    RETURN NEXT;
    IF version < 170000 THEN
        RETURN;
    END IF;

    item := 'wal_level';
    ok := current_setting('wal_level') = 'logical';
    detail := CASE WHEN ok THEN 'logical'
        ELSE format('is %s: ALTER SYSTEM SET wal_level = logical; then restart the server%s', current_setting('wal_level'),
                    CASE WHEN standby THEN ' (a standby keeps logical slots only with it)' ELSE '' END) END;
    RETURN NEXT;

    IF standby THEN
        item := 'sync_replication_slots';
        ok := current_setting('sync_replication_slots') = 'on';
        detail := CASE WHEN ok THEN 'on'
            ELSE 'is off: this standby keeps no copy of the sinks'' slots. ALTER SYSTEM SET sync_replication_slots = on; '
                 'SELECT pg_reload_conf();' END;
        RETURN NEXT;
        item := 'hot_standby_feedback';
        ok := current_setting('hot_standby_feedback') = 'on';
        detail := CASE WHEN ok THEN 'on'
            ELSE 'is off: the primary may remove catalog rows the synchronized slots need, which invalidates them. '
                 'ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf();' END;
        RETURN NEXT;
        item := 'primary_slot_name';
        setting := current_setting('primary_slot_name');
        ok := setting <> '';
        detail := CASE WHEN ok THEN format('''%s'': the primary names it in synchronized_standby_slots', setting)
            ELSE 'is empty: slot synchronization needs this standby to stream through a physical slot. On the primary: '
                 'SELECT pg_create_physical_replication_slot(''<name>''); here: ALTER SYSTEM SET primary_slot_name = '
                 '''<name>''; SELECT pg_reload_conf();' END;
        RETURN NEXT;
        item := 'primary_conninfo';
        setting := current_setting('primary_conninfo');
        ok := setting ~ '(^|\s)dbname\s*=\s*[^\s=]' OR setting ~ '^postgres(ql)?://[^/?]*/[^/?]+';
        detail := CASE WHEN ok THEN 'names a database'
            ELSE format('names no database, which slot synchronization connects to: add dbname=%s to it '
                        '(ALTER SYSTEM SET primary_conninfo = ''<what it has> dbname=%s''; SELECT pg_reload_conf();)',
                        current_database(), current_database()) END;
        RETURN NEXT;
    END IF;

    -- Each sink's slot: on a primary a failover slot (pg_cdc makes every sink's slot one on 17+; one made
    -- on an older server is not), on a standby synchronized from the primary.
    FOR sink IN SELECT s.sink_name, s.slot_name::text AS slot, to_jsonb(r) AS r
                  FROM @extschema@._cdc_sinks s LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name
                 WHERE s.state <> 'finished' ORDER BY s.sink_name LOOP
        item := format('slot %s (sink %s)', sink.slot, sink.sink_name);
        IF NOT standby THEN
            ok := (sink.r ->> 'failover')::boolean IS TRUE;
            detail := CASE WHEN sink.r IS NULL THEN 'does not exist: cdc_status().last_error says what to do'
                           WHEN ok THEN 'a failover slot'
                           ELSE format('is not a failover slot: standbys do not keep it. Over a replication connection '
                                       '(psql "dbname=%s replication=database"): ALTER_REPLICATION_SLOT %s (FAILOVER true)',
                                       current_database(), sink.slot) END;
        ELSE
            ok := (sink.r ->> 'synced')::boolean IS TRUE AND sink.r ->> 'invalidation_reason' IS NULL;
            detail := CASE
                WHEN sink.r IS NULL
                THEN 'not synchronized to this standby yet: promoted now, the sink would stop in error naming it'
                WHEN sink.r ->> 'invalidation_reason' IS NOT NULL
                THEN format('invalidated here (%s): promoted now, the sink would stop in error',
                            sink.r ->> 'invalidation_reason')
                WHEN NOT ok THEN 'is here but not synchronized from the primary'
                ELSE format('synchronized, confirmed up to %s', sink.r ->> 'confirmed_flush_lsn') END;
        END IF;
        RETURN NEXT;
    END LOOP;

    IF NOT standby THEN
        setting := coalesce(current_setting('synchronized_standby_slots', true), '');
        item := 'synchronized_standby_slots';
        ok := btrim(setting) <> '';
        detail := CASE WHEN ok THEN format('''%s'': sinks deliver only what these standbys confirmed', setting)
            ELSE format('is empty: a promoted standby may lack changes the sinks already delivered. Name the physical '
                        'slot of every standby that may be promoted: ALTER SYSTEM SET synchronized_standby_slots = '
                        '''%s''; SELECT pg_reload_conf();',
                        coalesce((SELECT string_agg(r.slot_name::text, ',' ORDER BY r.slot_name) FROM pg_replication_slots r
                                   WHERE r.slot_type = 'physical'), '<standby slot>')) END;
        RETURN NEXT;
        FOR slot IN SELECT * FROM @extschema@._cdc_standby_slots() LOOP
            item := format('standby slot %s', slot.slot_name);
            ok := slot.problem IS NULL AND slot.streaming;
            detail := CASE
                WHEN slot.problem IS NOT NULL
                THEN format('%s: failover sinks deliver nothing until it is fixed (create it and start its standby with '
                            'primary_slot_name = ''%s'', or remove it from synchronized_standby_slots)',
                            slot.problem, slot.slot_name)
                WHEN NOT slot.streaming
                THEN format('no standby streams from it (down?): failover sinks deliver nothing past %s until it is back '
                            'or synchronized_standby_slots no longer names it', slot.confirmed_lsn)
                ELSE format('streaming, confirmed up to %s', slot.confirmed_lsn) END;
            RETURN NEXT;
        END LOOP;
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION cdc_status() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_check_failover() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION _cdc_sink_latency(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_metrics(regclass) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION cdc_prometheus_metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cdc_status(), cdc_check_failover(), cdc_metrics(regclass), cdc_prometheus_metrics() TO pg_monitor;

-- Whether each sink is ready: running and at most max_lag_bytes behind the WAL, or paused or
-- finished (on purpose); otherwise why not. For cdc_ready and pg_cdc_sink_ready.
CREATE FUNCTION _cdc_sink_readiness(max_lag_bytes bigint) RETURNS TABLE (sink_name text, reason text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.sink_name,
           CASE WHEN s.state IN ('paused', 'finished') THEN NULL
                WHEN s.state <> 'running'
                THEN format('sink %s is %s', s.sink_name, s.state) || coalesce(': ' || s.last_error, '')
                WHEN r.slot_name IS NULL THEN format('sink %s: its slot %s does not exist', s.sink_name, s.slot_name)
                WHEN pg_current_wal_lsn() - r.confirmed_flush_lsn > max_lag_bytes
                THEN format('sink %s is %s bytes behind the WAL (more than %s)', s.sink_name,
                            (pg_current_wal_lsn() - r.confirmed_flush_lsn)::bigint, max_lag_bytes) END
      FROM @extschema@._cdc_sinks s
      LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name
     ORDER BY s.sink_name
$$;
REVOKE EXECUTE ON FUNCTION _cdc_sink_readiness(bigint) FROM PUBLIC;

-- Whether every sink is ready (see _cdc_sink_readiness), with the reasons of those that are not:
-- a probe for a load balancer or an orchestrator. max_lag_bytes NULL: cdc.ready_max_lag.
CREATE FUNCTION cdc_ready(max_lag_bytes bigint DEFAULT NULL) RETURNS TABLE (ready boolean, reasons text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bound bigint := coalesce(max_lag_bytes, pg_size_bytes(coalesce(current_setting('cdc.ready_max_lag', true), '16MB')));
BEGIN
    IF bound < 0 THEN
        RAISE EXCEPTION 'max_lag_bytes must not be negative, not %', bound USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
        SELECT count(x.reason) = 0, coalesce(array_agg(x.reason ORDER BY x.sink_name) FILTER (WHERE x.reason IS NOT NULL), '{}')
          FROM @extschema@._cdc_sink_readiness(bound) x;
END $$;
REVOKE EXECUTE ON FUNCTION cdc_ready(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cdc_ready(bigint) TO pg_monitor;

-- Announces each change of a sink's state on channel cdc_sink_state (LISTEN cdc_sink_state), when
-- the transaction that made it commits: {"sink", "old_state", "new_state", "reason"} (reason: its
-- last_error; old_state null for a sink added, new_state null for one dropped).
CREATE FUNCTION _cdc_sink_state_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('cdc_sink_state', jsonb_build_object('sink', NEW.sink_name, 'old_state', NULL,
                          'new_state', NEW.state, 'reason', NULL)::text);
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('cdc_sink_state', jsonb_build_object('sink', OLD.sink_name, 'old_state', OLD.state,
                          'new_state', NULL, 'reason', 'dropped')::text);
    ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
        -- A notification's payload is at most 8000 bytes.
        PERFORM pg_notify('cdc_sink_state', jsonb_build_object('sink', NEW.sink_name, 'old_state', OLD.state,
                          'new_state', NEW.state, 'reason', left(NEW.last_error, 4000))::text);
    END IF;
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION _cdc_sink_state_notify() FROM PUBLIC;
CREATE TRIGGER _cdc_sink_state_notify AFTER INSERT OR DELETE OR UPDATE OF state ON _cdc_sinks
    FOR EACH ROW EXECUTE FUNCTION _cdc_sink_state_notify();

-- Progress of every snapshot: the table by its current schema and name (as it was when dropped, for a
-- dropped one), rows delivered of the table's estimated rows, the rate since it started,
-- and when it should end at that rate. Monitoring roles may read it (no config in it).
CREATE VIEW cdc_snapshots AS
SELECT s.snapshot_id, k.sink_name, coalesce(n.nspname, s.dropped_schema) AS table_schema,
       coalesce(c.relname, s.dropped_name) AS table_name, s.kind, s.state, s.rows_done, s.rows_estimate,
       CASE WHEN s.state = 'done' THEN 100.0
            WHEN s.rows_estimate > 0 THEN round(least(100.0 * s.rows_done / s.rows_estimate, 99.9), 1) END AS percent_done,
       r.rows_per_second,
       CASE WHEN s.state = 'running' AND r.rows_per_second > 0
            THEN make_interval(secs => round(greatest(s.rows_estimate - s.rows_done, 0) / r.rows_per_second)) END AS eta,
       s.requested_at, s.started_at, s.finished_at, s.note
  FROM @extschema@._cdc_snapshots s
  JOIN @extschema@._cdc_sinks k USING (sink_id)
  LEFT JOIN pg_class c ON c.oid = s.table_oid
  LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
 CROSS JOIN LATERAL (SELECT round(s.rows_done / nullif(extract(epoch FROM coalesce(s.finished_at, now()) - s.started_at), 0), 1)
                            AS rows_per_second) r
 ORDER BY s.snapshot_id;
GRANT SELECT ON cdc_snapshots TO pg_monitor;

-- What \df+ and \dv+ show: every function and view of pg_cdc is described (pg_test's install test
-- fails for one that is not). The SQL reference (docs/sql-reference.md) has the whole story.
COMMENT ON FUNCTION cdc_enable(regclass, jsonb) IS 'pg_cdc: captures a table''s committed changes, with its capture config (filter, transformations, format, ...); re-run it to change the config';
COMMENT ON FUNCTION cdc_enable_multicloud(regclass, jsonb) IS 'pg_cdc: captures a table and routes its rows to sinks by a condition per route (routes may name sinks added later)';
COMMENT ON FUNCTION cdc_multicloud_status(regclass) IS 'pg_cdc: per routed table (or one), each route''s condition, sinks, events and lag';
COMMENT ON FUNCTION cdc_disable(regclass) IS 'pg_cdc: stops capturing a table and forgets its capture config and progress';
COMMENT ON FUNCTION cdc_add_sink(text, text, jsonb) IS 'pg_cdc: adds a destination (kafka, kinesis, eventhub, pubsub, pulsar, webhook, postgres, table) with its own slot; it starts with a snapshot of its tables';
COMMENT ON FUNCTION cdc_drop_sink(text) IS 'pg_cdc: drops a destination, its slot and its progress';
COMMENT ON FUNCTION cdc_alter_sink(text, jsonb) IS 'pg_cdc: changes a sink''s config in place (the keys given; null removes one), keeping its position and guarantee; tables added are back-filled';
COMMENT ON FUNCTION cdc_reconcile(jsonb, boolean) IS 'pg_cdc: brings capture and sinks to a declared spec (dry run by default: returns the plan); drops are guarded, force_drop lifts the guard';
COMMENT ON FUNCTION cdc_export_spec() IS 'pg_cdc: the captured tables and sinks as a spec for cdc_reconcile, secrets as "(unchanged)"';
COMMENT ON FUNCTION cdc_verify(text, regclass, integer, integer) IS 'pg_cdc: compares a captured table, encoded as the sink writes it, with what the sink''s destination holds once it delivered past the read: counts, checksums, the rows that differ';
COMMENT ON FUNCTION cdc_pause_sink(text) IS 'pg_cdc: pauses a sink: its worker stops, its slot keeps its position (and the WAL after it) until cdc_resume_sink';
COMMENT ON FUNCTION cdc_resume_sink(text) IS 'pg_cdc: resumes a paused sink from its slot''s position, with its delivery guarantee';
COMMENT ON FUNCTION cdc_snapshot(regclass, text, boolean) IS 'pg_cdc: asks for a new snapshot of a captured table (READ events of its rows) for one sink or every sink carrying it';
COMMENT ON FUNCTION cdc_cancel_snapshot(regclass, text) IS 'pg_cdc: cancels the pending or running snapshots of a table';
COMMENT ON FUNCTION cdc_schema_history(regclass) IS 'pg_cdc: the schema versions of a captured table, their changes and the registry ids they got';
COMMENT ON FUNCTION cdc_force_schema_break(regclass) IS 'pg_cdc: lets the table''s next schema change that its compatibility_mode forbids through, once';
COMMENT ON FUNCTION cdc_create_version_topic(regclass, integer) IS 'pg_cdc: gives a schema version of a captured table, and every later one, Kafka and Event Hubs topics of their own (<topic>.v<version>)';
COMMENT ON FUNCTION cdc_check_compatibility(regclass, text) IS 'pg_cdc: whether a proposed ALTER TABLE keeps the table''s schema compatible, before running it';
COMMENT ON FUNCTION cdc_consume(text, integer, text) IS 'pg_cdc: reads the next events of a table sink for a consumer, in commit order (consumed when the caller commits)';
COMMENT ON FUNCTION cdc_delivery_status(text) IS 'pg_cdc: how a sink''s delivery is doing: its state, slot, transactions in flight, and the last error';
COMMENT ON FUNCTION cdc_create_tokenization_key() IS 'pg_cdc: creates the key the tokenize transformation uses (once per cluster)';
COMMENT ON FUNCTION cdc_filter_metrics(regclass) IS 'pg_cdc: what a captured table''s filter and transformations did: changes matched and excluded, bandwidth saved, per transformation';
COMMENT ON FUNCTION cdc_preview(regclass, jsonb, integer) IS 'pg_cdc: the events rows of a captured table (or a sample row) would produce under its config, as the worker sends them; publishes nothing';
COMMENT ON FUNCTION cdc_metrics(regclass) IS 'pg_cdc: how capture of one table is doing: events, latencies and lag per sink';
COMMENT ON FUNCTION cdc_status() IS 'pg_cdc: one row per sink: its state, lag, events delivered, latencies, last error, missing tables, and its slot''s failover, idle timeout and standby wait';
COMMENT ON FUNCTION cdc_ready(bigint) IS 'pg_cdc: whether every sink is running and caught up (or paused or finished), and why not: a readiness probe';
COMMENT ON FUNCTION _cdc_sink_readiness(bigint) IS 'pg_cdc internal: per sink, why it is not ready (NULL: ready), for cdc_ready and cdc_prometheus_metrics';
COMMENT ON FUNCTION _cdc_sink_state_notify() IS 'pg_cdc internal: trigger that announces each sink state change on channel cdc_sink_state';
COMMENT ON FUNCTION cdc_check_failover() IS 'pg_cdc: whether this server (primary or standby) is ready for a failover, setting by setting, with what to change';
COMMENT ON FUNCTION _cdc_standby_slots() IS 'pg_cdc internal: the standbys'' slots synchronized_standby_slots names, what each confirmed and whether it is usable';
COMMENT ON FUNCTION cdc_prometheus_metrics() IS 'pg_cdc: every figure in the Prometheus text exposition format';
COMMENT ON FUNCTION _cdc_sink_latency(text) IS 'pg_cdc internal: a sink''s latency percentiles, for cdc_status';
COMMENT ON FUNCTION _cdc_context_message(boolean) IS 'pg_cdc internal: the sealed context message (user, application, optionally the query) of the current statement, for the _cdc_context trigger';
COMMENT ON FUNCTION _cdc_context_trigger() IS 'pg_cdc internal: trigger that emits the transaction context into the WAL before a captured table''s rows';
COMMENT ON FUNCTION _cdc_forget_dropped_tables() IS 'pg_cdc internal: event trigger that forgets dropped captured tables and marks the dropped tables of sinks and lookups';
COMMENT ON FUNCTION _cdc_table_fields(oid) IS 'pg_cdc internal: the columns of a table as a schema version records them';
COMMENT ON FUNCTION _cdc_schema_changes() IS 'pg_cdc internal: event trigger that records a new schema version of a captured table after ALTER TABLE';
COMMENT ON FUNCTION _cdc_schema_changed(oid[]) IS 'pg_cdc internal: records and checks new schema versions of the given tables';
COMMENT ON VIEW cdc_snapshots IS 'pg_cdc: progress of every snapshot, per sink and table';

-- cdc_admin: a role that manages capture and sinks without being a superuser. Members get EXECUTE
-- on the functions below and no right on the catalog: each function checks what such a role may
-- configure (tables it may SELECT, files in cdc.admin_file_dir, no librdkafka property that runs
-- code, a postgres sink with its own password file), then does the rest as the bootstrap superuser
-- (src/api/access.rs). Roles are the cluster's: the role outlives DROP EXTENSION and is shared by
-- a second install. cdc_create_tokenization_key and cdc_consume stay with superusers.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'cdc_admin') THEN
        CREATE ROLE cdc_admin NOLOGIN;
        COMMENT ON ROLE cdc_admin IS 'pg_cdc: manages capture and sinks without being a superuser (GRANT cdc_admin TO <role>)';
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION cdc_enable(regclass, jsonb), cdc_enable_multicloud(regclass, jsonb), cdc_disable(regclass),
    cdc_add_sink(text, text, jsonb), cdc_alter_sink(text, jsonb), cdc_drop_sink(text), cdc_pause_sink(text),
    cdc_resume_sink(text), cdc_snapshot(regclass, text, boolean),
    cdc_cancel_snapshot(regclass, text), cdc_schema_history(regclass), cdc_force_schema_break(regclass),
    cdc_create_version_topic(regclass, integer), cdc_check_compatibility(regclass, text),
    cdc_preview(regclass, jsonb, integer), cdc_verify(text, regclass, integer, integer), cdc_delivery_status(text), cdc_filter_metrics(regclass),
    cdc_multicloud_status(regclass), cdc_status(), cdc_check_failover(), cdc_ready(bigint), cdc_metrics(regclass),
    cdc_prometheus_metrics() TO cdc_admin;
GRANT SELECT ON cdc_snapshots TO cdc_admin;
-- Monitoring roles read every status function (none shows a sink config).
GRANT EXECUTE ON FUNCTION cdc_delivery_status(text), cdc_filter_metrics(regclass), cdc_multicloud_status(regclass)
    TO pg_monitor;
