#!/usr/bin/env bash
# Builds pg_cdc in release mode and installs it into the lib and extension folders of the PostgreSQL that
# PG_VERSION names (15 by default; see env.sh).
# cargo's own cache makes a second run a no-op build (a few seconds).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"
cd "$here/.."
cargo pgrx install --release --no-default-features --features "pg$PG_VERSION" --pg-config "$PG_BIN/pg_config"
# Install scripts of earlier releases (cargo pgrx installs the current one and the upgrade scripts
# sql/pg_cdc--<old>--<new>.sql): CREATE EXTENSION pg_cdc VERSION '<old>' then works, which the
# upgrade tests (pg_test/sql/upgrade.sql, tests/e2e/test_upgrade.py) rely on.
install -m 644 sql/history/pg_cdc--*.sql "$("$PG_BIN/pg_config" --sharedir)/extension/"
