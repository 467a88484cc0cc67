-- What PostgreSQL itself answers differently between the versions pg_cdc runs on: expected/pg_versions.out
-- is PostgreSQL 15's answer, expected/pg_versions_1.out 18's, expected/pg_versions_2.out 16's (pg_regress
-- takes whichever matches). pg_cdc's own answers are the same on every version and are in the other tests.

-- A table in a schema that does not exist: the regclass argument refuses it before pg_cdc runs, as a
-- missing schema (15, SQLSTATE 3F000) or as a missing relation (16 and 18, 42P01).
SELECT cdc_enable('no_such_schema.orders'); \echo SQLSTATE :SQLSTATE
-- Nothing was recorded.
SELECT count(*) AS recorded FROM _cdc_publications WHERE table_name = 'no_such_schema.orders';

-- Readiness for a failover on this primary (no sink, no standby named): on 15 and 16 only the version
-- (their standbys keep no logical slot), on 18 the version, wal_level, and synchronized_standby_slots
-- left empty. Each row that is not ok says what to change.
SELECT item, ok, detail ~ 'ALTER SYSTEM SET synchronized_standby_slots' AS says_how,
       detail ~ 'drop and re-add each sink' AS says_what_happens
  FROM cdc_check_failover();
