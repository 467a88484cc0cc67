#!/usr/bin/env bash
# Captures real pgoutput bytes from the running PostgreSQL 15 into golden files for the decoder
# tests of crates/cdc-core. For each workload crates/cdc-core/tests/golden/<name>.sql it:
#   1. creates a scratch database, runs the part of the file before "-- @capture" (the schema),
#   2. creates a publication for all tables and a logical slot (pgoutput),
#   3. runs the rest (the changes), then peeks the slot with the worker's session settings,
#   4. writes <name>.frames ("<lsn>\t<hex of the pgoutput message>" per line) and <name>.types.json
#      (the pg_type rows of every column type, as the worker reads them).
# The files are generated, never edited by hand. Run with `make golden` after `make up`;
# `scripts/capture-golden.sh enrich` captures only the named workloads.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"
dir="$here/../crates/cdc-core/tests/golden"
db=pg_cdc_golden
export PGOPTIONS="-c client_min_messages=warning"
settings="SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'iso_8601'; SET TimeZone = 'UTC'; SET extra_float_digits = 1; SET bytea_output = 'hex';"

workloads=("$dir"/*.sql)
if [ "$#" -gt 0 ]; then
  workloads=()
  for name in "$@"; do workloads+=("$dir/$name.sql"); done
fi
for sql in "${workloads[@]}"; do
  name="$(basename "$sql" .sql)"
  echo "[golden] $name"
  psql -qX -d postgres -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'pg_cdc_golden'" >/dev/null
  psql -qX -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
  schema_part="$(sed '/^-- @capture/,$d' "$sql")"
  change_part="$(sed -n '/^-- @capture/,$p' "$sql")"
  psql -qX -v ON_ERROR_STOP=1 -d "$db" -c "$schema_part" >/dev/null
  psql -qX -v ON_ERROR_STOP=1 -d "$db" \
    -c "CREATE PUBLICATION golden FOR ALL TABLES" \
    -c "SELECT pg_create_logical_replication_slot('pg_cdc_golden', 'pgoutput')" >/dev/null
  # Each statement in its own transaction unless the file groups them.
  psql -qX -v ON_ERROR_STOP=1 -d "$db" <<<"$change_part" >/dev/null
  psql -qXAt -v ON_ERROR_STOP=1 -d "$db" -F $'\t' >"$dir/$name.frames" <<SQL
$settings
SELECT (lsn - '0/0'::pg_lsn)::int8, encode(data, 'hex')
  FROM pg_logical_slot_peek_binary_changes('pg_cdc_golden', NULL, NULL,
       'proto_version', '1', 'publication_names', 'golden', 'messages', 'true');
SQL
  psql -qXAt -v ON_ERROR_STOP=1 -d "$db" >"$dir/$name.types.json" <<'SQL'
SELECT coalesce(jsonb_pretty(jsonb_agg(jsonb_build_object(
         'oid', t.oid::bigint, 'typtype', t.typtype::text, 'typcategory', t.typcategory::text,
         'typelem', t.typelem::bigint, 'typbasetype', t.typbasetype::bigint, 'typdelim', t.typdelim::text,
         'enum_labels', (SELECT jsonb_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid))
         ORDER BY t.oid)), '[]')
  FROM pg_type t
 WHERE t.oid IN (SELECT a.atttypid FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                  JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0)
    OR t.oid IN (SELECT e.typelem FROM pg_type e WHERE e.oid IN (SELECT a.atttypid FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0))
    OR t.oid IN (SELECT d.typbasetype FROM pg_type d WHERE d.typtype = 'd');
SQL
  psql -qX -d "$db" -c "SELECT pg_drop_replication_slot('pg_cdc_golden')" >/dev/null
  psql -qX -d postgres -c "DROP DATABASE $db" >/dev/null
  echo "[golden] $name: $(wc -l <"$dir/$name.frames") frames"
done
