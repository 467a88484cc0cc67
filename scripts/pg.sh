#!/usr/bin/env bash
# The dev/test PostgreSQL cluster of PG_VERSION (15 by default, 16 or 18; env.sh gives each version its own
# binaries, data directory and port): wal_level=logical, pg_cdc preloaded, trust auth on loopback,
# run by the `postgres` user (initdb refuses root).
# Kinesis sinks find the local Kinesis server (scripts/kinesis.sh) through cdc.kinesis_endpoint and
# cdc.aws_region, and their credentials the usual AWS way: the server runs with AWS_CONFIG_FILE and
# AWS_SHARED_CREDENTIALS_FILE pointing at $PG_CDC_RUN/aws, test keys the local server accepts (it checks
# no signature), with profiles `default` and `local` — never the postgres user's own ~/.aws.
# Pub/Sub sinks find Google's fake Pub/Sub server (scripts/pubsub.sh) through cdc.pubsub_endpoint (an http://
# endpoint: an emulator, reached without credentials).
#
#   scripts/pg.sh start     initdb the first time, then start and wait until it accepts connections
#   scripts/pg.sh start-fresh  start, restarting first if the installed pg_cdc library differs from the loaded one
#                           or pg_cdc.conf (below) differs from the one the server read at its start
#   scripts/pg.sh stop      fast shutdown (idempotent)
#   scripts/pg.sh restart   stop + start (after installing a new build of the extension)
#   scripts/pg.sh crash     pg_ctl stop -m immediate (fault injection), then start
#   scripts/pg.sh status    exit 0 when running
#   scripts/pg.sh reset     stop and wipe the data directory
#   scripts/pg.sh logs      tail the server log
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"

PGDATA_DIR="$PG_CDC_PGDATA"
LOG_FILE="$PG_CDC_RUN/postgresql-$PGPORT.log"
LIB="$("$PG_BIN/pg_config" --pkglibdir)/pg_cdc.so"
LOADED="$PG_CDC_RUN/pg_cdc-$PGPORT.so.sha256"   # checksum of the library the running server loaded
LOADED_CONF="$PG_CDC_RUN/pg_cdc-$PGPORT.conf.sha256"   # ... and of the pg_cdc.conf it read at its start
as_pg() { runuser -u postgres -- "$@"; }
log() { printf '[pg] %s\n' "$*"; }

ensure_dirs() {
  mkdir -p "$PG_CDC_RUN"
  chmod a+rx "$PG_CDC_RUN"
  mkdir -p "$PG_CDC_RUN/sock"
  chown postgres:postgres "$PG_CDC_RUN/sock"
  touch "$LOG_FILE"
  chown postgres:postgres "$LOG_FILE"
  mkdir -p "$PG_CDC_RUN/aws"
  printf '[default]\naws_access_key_id = pgcdclocal\naws_secret_access_key = pgcdclocalsecret\n\n[local]\naws_access_key_id = pgcdclocal\naws_secret_access_key = pgcdclocalsecret\n' \
    >"$PG_CDC_RUN/aws/credentials"
  printf '[default]\n\n[profile local]\n' >"$PG_CDC_RUN/aws/config"
  chown -R postgres:postgres "$PG_CDC_RUN/aws"
  chmod 700 "$PG_CDC_RUN/aws"
  chmod 600 "$PG_CDC_RUN/aws/credentials" "$PG_CDC_RUN/aws/config"
}

init_cluster() {
  [ -f "$PGDATA_DIR/PG_VERSION" ] && return 0
  log "initdb $PGDATA_DIR"
  mkdir -p "$PGDATA_DIR"
  chown postgres:postgres "$PGDATA_DIR"
  chmod 700 "$PGDATA_DIR"
  as_pg "$PG_BIN/initdb" -D "$PGDATA_DIR" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
}

write_conf() {
  # Rewritten at every start so a changed port or broker address takes effect (start-fresh restarts a
  # running server when it changed: most of these settings are read only at server start).
  # Slots and worker processes: one each per sink (plus the launcher), enough for bench-e2e's steady
  # section (50 idle + 3 busy sinks) and the test suites' own sinks and slots next to it.
  cat > "$PGDATA_DIR/pg_cdc.conf" <<CONF
listen_addresses = '$PGHOST'
port = $PGPORT
unix_socket_directories = '$PG_CDC_RUN/sock'
wal_level = logical
shared_preload_libraries = 'pg_cdc'
max_replication_slots = 96
max_wal_senders = 16
max_worker_processes = 128
cdc.database = '$PGDATABASE'
cdc.kafka_bootstrap_servers = '$KAFKA_BOOTSTRAP'
cdc.kinesis_endpoint = '$KINESIS_ENDPOINT'
cdc.pubsub_endpoint = '$PUBSUB_ENDPOINT'
cdc.aws_region = 'us-east-1'
log_min_messages = warning
log_line_prefix = '%m [%p] %b '
log_timezone = 'UTC'
CONF
  chown postgres:postgres "$PGDATA_DIR/pg_cdc.conf"
  # Loopback is trusted by initdb; PG_CDC_TRUST_CIDR (e.g. in the container) trusts one more network.
  if [ -n "${PG_CDC_TRUST_CIDR:-}" ] && ! grep -q "$PG_CDC_TRUST_CIDR" "$PGDATA_DIR/pg_hba.conf"; then
    echo "host all all $PG_CDC_TRUST_CIDR trust" >> "$PGDATA_DIR/pg_hba.conf"
  fi
  # The role the postgres sink's tests apply as must give a password (SCRAM), so they prove it comes
  # from a password file: that line goes before the trusted ones (the first match wins).
  # So does the superuser the delegation tests connect as (a sink a cdc_admin member adds must not
  # reach this server as a superuser, even with its password).
  for role in cdc_apply_test cdc_super_test; do
    if ! grep -q "$role" "$PGDATA_DIR/pg_hba.conf"; then
      { echo "host all $role all scram-sha-256"; cat "$PGDATA_DIR/pg_hba.conf"; } > "$PGDATA_DIR/pg_hba.conf.new"
      mv "$PGDATA_DIR/pg_hba.conf.new" "$PGDATA_DIR/pg_hba.conf"
      chown postgres:postgres "$PGDATA_DIR/pg_hba.conf"
    fi
  done
  grep -q "include_if_exists = 'pg_cdc.conf'" "$PGDATA_DIR/postgresql.conf" \
    || echo "include_if_exists = 'pg_cdc.conf'" >> "$PGDATA_DIR/postgresql.conf"
}

running() { as_pg "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; }

start() {
  ensure_dirs
  init_cluster
  write_conf
  if running; then
    log "already running on $PGHOST:$PGPORT"
    return 0
  fi
  # RUST_BACKTRACE in the server's environment would put Rust backtraces into clients' error DETAILs.
  env -u RUST_BACKTRACE AWS_CONFIG_FILE="$PG_CDC_RUN/aws/config" AWS_SHARED_CREDENTIALS_FILE="$PG_CDC_RUN/aws/credentials" \
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" -l "$LOG_FILE" -w -t 60 start >/dev/null \
    || { tail -n 30 "$LOG_FILE" >&2; exit 1; }
  if [ -f "$LIB" ]; then sha256sum <"$LIB" >"$LOADED"; fi
  sha256sum <"$PGDATA_DIR/pg_cdc.conf" >"$LOADED_CONF"
  log "running on $PGHOST:$PGPORT (data $PGDATA_DIR, log $LOG_FILE)"
}

stop() {
  if [ -f "$PGDATA_DIR/PG_VERSION" ] && running; then
    as_pg "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" -m fast -w -t 60 stop >/dev/null
    log "stopped"
  fi
}

case "${1:-}" in
  start) start ;;
  start-fresh)
    # Like start, but restarts a running server whose loaded pg_cdc library differs from the installed
    # one (shared_preload_libraries are loaded only at server start), or that read a pg_cdc.conf other
    # than the one this script writes now (max_replication_slots, max_worker_processes, ... need a
    # restart; a server started before the checksum was recorded counts as changed, once).
    # `cargo pgrx install` rewrites the file every time, so compare contents, not times.
    if [ -f "$PGDATA_DIR/PG_VERSION" ] && running; then
      write_conf
      if ! cmp -s <(sha256sum <"$LIB") "$LOADED"; then
        log "pg_cdc was reinstalled: restarting"
        stop
      elif ! cmp -s <(sha256sum <"$PGDATA_DIR/pg_cdc.conf") "$LOADED_CONF"; then
        log "pg_cdc.conf changed: restarting"
        stop
      fi
    fi
    start ;;
  stop) stop ;;
  restart) stop; start ;;
  crash)
    as_pg "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" -m immediate stop >/dev/null || true
    start ;;
  status) running ;;
  reset) stop; rm -rf "$PGDATA_DIR"; log "wiped $PGDATA_DIR" ;;
  logs) shift; tail "${@:--n 100}" "$LOG_FILE" ;;
  *) echo "usage: $0 start|stop|restart|crash|status|reset|logs" >&2; exit 2 ;;
esac
