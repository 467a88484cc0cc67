#!/usr/bin/env bash
# The schema registry of pg_cdc's tests: a STAND-IN (tests/schema_registry/standin.py), not
# Confluent's Schema Registry. No Confluent-compatible registry can be installed on these machines
# (see the README's "Schema evolution"); the stand-in speaks the part of its REST API that pg_cdc and
# consumers use, and confluent-kafka's own client, AvroSerializer and AvroDeserializer are tested
# against it (tests/e2e/test_schema_registry_standin.py). It needs only python3's standard library.
# It listens on 127.0.0.1:$SCHEMA_REGISTRY_PORT ($SCHEMA_REGISTRY_URL) and keeps its subjects and ids
# in $PG_CDC_RUN/schema-registry/state.json, so a restart keeps them (as the real one does).
#
#   scripts/schema-registry.sh start     start, wait until it answers GET /subjects
#   scripts/schema-registry.sh stop      SIGTERM, SIGKILL after a grace period
#   scripts/schema-registry.sh kill      SIGKILL at once (fault injection)
#   scripts/schema-registry.sh status    exit 0 running and answering, 1 running but not answering, 3 stopped
#   scripts/schema-registry.sh logs [tail args]
#   scripts/schema-registry.sh reset     stop and forget every subject and id
#
# Every command is idempotent.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"

run_dir="$PG_CDC_RUN/schema-registry"
state_file="$run_dir/state.json"
log_file="$run_dir/registry.log"
pid_file="$run_dir/registry.pid"
standin="$(cd "$here/../tests/schema_registry" && pwd)/standin.py"

log() { printf '[schema-registry] %s\n' "$*"; }
die() { printf '[schema-registry] ERROR: %s\n' "$*" >&2; exit 1; }

source "$here/service.sh"
service_what="registry stand-in"
service_where="$SCHEMA_REGISTRY_URL"
start_timeout=15
stop_timeout=10

# The pid of the running stand-in, if the pid file names a live `python3 .../standin.py`.
service_pid() {
  pid_matching 'schema_registry/standin\.py'
}

service_answers() {
  port_open 127.0.0.1 "$SCHEMA_REGISTRY_PORT" || return 1
  python3 - "$SCHEMA_REGISTRY_URL/subjects" 2>/dev/null <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
}

cmd_start() {
  local pid
  mkdir -p "$run_dir"
  if pid="$(service_pid)"; then
    if service_answers; then
      log "already running (pid $pid) and answering on $SCHEMA_REGISTRY_URL"
      return 0
    fi
    wait_ready "$pid"
    log "ready on $SCHEMA_REGISTRY_URL (pid $pid)"
    return 0
  fi
  rm -f "$pid_file"
  if port_open 127.0.0.1 "$SCHEMA_REGISTRY_PORT"; then
    die "127.0.0.1:$SCHEMA_REGISTRY_PORT is already in use by another process (ss -ltnp 'sport = :$SCHEMA_REGISTRY_PORT')"
  fi
  command -v python3 >/dev/null || die "python3 not found"
  echo "==== $(date -Is) start ====" >>"$log_file"
  # setsid: its own session, so it outlives this script; --wait: the pid file is written on return.
  # shellcheck disable=SC2016  # $1, $@ and $! belong to the inner shell
  setsid --wait bash -c '
    pid_file="$1"; shift
    "$@" &
    echo $! >"$pid_file"
  ' _ "$pid_file" python3 "$standin" --host 127.0.0.1 --port "$SCHEMA_REGISTRY_PORT" --state "$state_file" \
    </dev/null >>"$log_file" 2>&1
  pid="$(cat "$pid_file")"
  wait_ready "$pid"
  log "stand-in ready on $SCHEMA_REGISTRY_URL (pid $pid, log $log_file)"
}

cmd_reset() {
  cmd_stop
  rm -f "$state_file"
  log "state forgotten"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  kill) cmd_kill ;;
  status) cmd_status ;;
  logs) shift; cmd_logs "$@" ;;
  reset) cmd_reset ;;
  *) usage ;;
esac
