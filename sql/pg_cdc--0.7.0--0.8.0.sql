-- pg_cdc 0.7.0 -> 0.8.0 (ALTER EXTENSION pg_cdc UPDATE). Keeps every sink, slot, offset and snapshot;
-- the worker delivers throughout. pg_test/sql/upgrade.sql checks that the result has exactly the
-- objects of a fresh 0.8.0 install.

-- cdc_status gains four columns (a function's result type cannot change in place): whether a
-- sink's slot follows a failover, why PostgreSQL invalidated it, when PostgreSQL 18's idle timeout
-- would, and which standby of synchronized_standby_slots holds its delivery back.
DROP FUNCTION @extschema@.cdc_status();

-- The physical slots `synchronized_standby_slots` (PostgreSQL 17+) names, in its order: what each
-- standby confirmed (its slot's restart position), whether a standby streams from it now and how far
-- behind in time its flushes are (pg_stat_replication.flush_lag), and what makes it unusable (then
-- failover slots deliver nothing: pg_cdc waits as walsenders do). No rows before 17 or while the
-- setting is empty.
CREATE FUNCTION @extschema@._cdc_standby_slots() RETURNS TABLE (slot_name text, confirmed_lsn pg_lsn, streaming boolean,
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
REVOKE EXECUTE ON FUNCTION @extschema@._cdc_standby_slots() FROM PUBLIC;

-- One overview row per sink (pipeline): state, slot health, lag, delivery and end-to-end latency,
-- and what PostgreSQL 17/18 may do to its slot: whether it follows a failover, when the idle
-- timeout would invalidate it, and which standby holds its delivery back.
-- SECURITY DEFINER, and granted to pg_monitor: monitoring roles see figures and states, never the
-- sink configs (they may hold credentials). Columns PostgreSQL 15/16 lack are read through to_jsonb
-- (NULL there), so one definition serves every version.
CREATE FUNCTION @extschema@.cdc_status() RETURNS TABLE (
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
CREATE FUNCTION @extschema@.cdc_check_failover() RETURNS TABLE (item text, ok boolean, detail text)
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

REVOKE EXECUTE ON FUNCTION @extschema@.cdc_status(), @extschema@.cdc_check_failover() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.cdc_status(), @extschema@.cdc_check_failover() TO pg_monitor, cdc_admin;
COMMENT ON FUNCTION @extschema@.cdc_status() IS 'pg_cdc: one row per sink: its state, lag, events delivered, latencies, last error, missing tables, and its slot''s failover, idle timeout and standby wait';
COMMENT ON FUNCTION @extschema@.cdc_check_failover() IS 'pg_cdc: whether this server (primary or standby) is ready for a failover, setting by setting, with what to change';
COMMENT ON FUNCTION @extschema@._cdc_standby_slots() IS 'pg_cdc internal: the standbys'' slots synchronized_standby_slots names, what each confirmed and whether it is usable';
