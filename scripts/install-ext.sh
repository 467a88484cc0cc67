#!/usr/bin/env bash
# Builds pg_cdc in release mode and installs it into PostgreSQL 15's lib and extension folders.
# cargo's own cache makes a second run a no-op build (a few seconds).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"
cd "$here/.."
cargo pgrx install --release --pg-config "$PG_BIN/pg_config"
