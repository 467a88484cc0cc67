#!/usr/bin/env bash
# Golden SQL tests of pg_cdc's SQL surface (pg_test/): runs pg_regress against the cluster that is
# already running (scripts/pg.sh start), in database $PGDATABASE (= cdc.database, where the pg_cdc
# worker runs and the SQL functions work). The tests are listed, in order, in pg_test/schedule.
#
#   scripts/regress.sh                 run every test of the schedule
#   scripts/regress.sh enable_basic    run only the named tests (the first one should be install)
#
# New expected output: run, review pg_test/results/<test>.out line by line, then copy it to
# pg_test/expected/<test>.out.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"
dir="$(cd "$here/../pg_test" && pwd)"

pg_regress="$("$PG_BIN/pg_config" --pkglibdir)/pgxs/src/test/regress/pg_regress"
if [ ! -x "$pg_regress" ]; then
  echo "regress: $pg_regress not found (PostgreSQL 15: install postgresql-server-dev-15; 16 or 18: scripts/pgwheel.sh <version> fetch)" >&2
  exit 1
fi
if ! "$PG_BIN/pg_isready" -q -h "$PGHOST" -p "$PGPORT"; then
  echo "regress: no PostgreSQL on $PGHOST:$PGPORT; start it first (scripts/pg.sh start)" >&2
  exit 1
fi

if [ "$#" -gt 0 ]; then
  tests=("$@")
  selection=("$@")
else
  # "test: a b c" lines; comments and blank lines are ignored.
  mapfile -t tests < <(sed -n 's/^test:[[:space:]]*//p' "$dir/schedule" | tr -s ' \t' '\n' | sed '/^$/d')
  selection=(--schedule="$dir/schedule")
fi

# Output of an earlier run must not be mistaken for this one's.
rm -rf "$dir/results" "$dir/regression.diffs" "$dir/regression.out"

cd "$dir"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
# psql must print messages in English and the same way on every machine.
LC_MESSAGES=C PGOPTIONS="${PGOPTIONS:-} -c lc_messages=C" \
"$pg_regress" --use-existing --dbname="$PGDATABASE" \
  --host="$PGHOST" --port="$PGPORT" --user="$PGUSER" --bindir="$PG_BIN" \
  --inputdir="$dir" --outputdir="$dir" "${selection[@]}" 2>&1 | tee "$log" || status=$?

# pg_regress 15 prints "test <name> ... ok" per passing test, 16 and later "ok <n> - <name>" (TAP); a test
# it could not run or compare counts as failed.
total="${#tests[@]}"
passed="$(grep -c -E '(\.\.\. ok( |$))|(^ok [0-9]+ +[-+] )' "$log" || true)"
failed=$((total - passed))
if [ "$status" -ne 0 ] || [ "$failed" -ne 0 ]; then
  if [ -s "$dir/regression.diffs" ]; then
    echo "---- $dir/regression.diffs ----"
    cat "$dir/regression.diffs"
  fi
  [ "$failed" -gt 0 ] || failed=1
  echo "$passed passed, $failed failed"
  exit 1
fi
echo "$passed passed, 0 failed"
