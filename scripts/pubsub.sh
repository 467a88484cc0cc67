#!/usr/bin/env bash
# A local Pub/Sub server for pg_cdc's end-to-end tests.
#
# It is pstest, the fake Pub/Sub server Google publishes in its Go client module
# (cloud.google.com/go/pubsub/v2/pstest), served over gRPC on $PUBSUB_PORT by the small program in
# scripts/pubsub-fake (its go.mod and go.sum pin the module). It is built with Go from the Go module
# proxy, once, into $PG_CDC_CACHE. Topics, subscriptions and messages live in its memory only; any
# project is accepted, with no credentials (as Google's emulator). Publish requests to a topic whose
# name contains "flaky" fail every third time with UNAVAILABLE (the tests' fault injection).
#
#   scripts/pubsub.sh install   build the server into $PG_CDC_CACHE/pubsub-fake-<hash> (once)
#   scripts/pubsub.sh start     install if needed, start, wait until it accepts connections
#   scripts/pubsub.sh stop      SIGTERM, SIGKILL after a grace period
#   scripts/pubsub.sh kill      SIGKILL at once (fault injection)
#   scripts/pubsub.sh status    exit 0 running and answering, 1 running but not answering, 3 stopped
#   scripts/pubsub.sh logs [tail args]   e.g. `logs -n 200` or `logs -f`
#   scripts/pubsub.sh reset     stop: everything lives in the server's memory, so this drops it
#   scripts/pubsub.sh create-topic PROJECT TOPIC [SUBSCRIPTION]   create a topic, and an ordered
#                               subscription to it, as an operator would, unless they exist (Google's
#                               own Python client)
#
# Clients reach it as Google's reach an emulator: PUBSUB_EMULATOR_HOST=127.0.0.1:$PUBSUB_PORT
# (scripts/env.sh exports it); pg_cdc through cdc.pubsub_endpoint = $PUBSUB_ENDPOINT (scripts/pg.sh).
#
# Every command is idempotent. Runtime files live in $PG_CDC_RUN/pubsub.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"

PUBSUB_USER="${PUBSUB_USER:-postgres}"
PUBSUB_START_TIMEOUT="${PUBSUB_START_TIMEOUT:-30}"
PUBSUB_STOP_TIMEOUT="${PUBSUB_STOP_TIMEOUT:-10}"

src_dir="$here/pubsub-fake"
# The build is named after its sources: a change to them builds a new one.
src_hash="$(cat "$src_dir/main.go" "$src_dir/go.mod" "$src_dir/go.sum" | sha256sum | cut -c1-12)"
build_dir="$PG_CDC_CACHE/pubsub-fake-$src_hash"
binary="$build_dir/pubsub-fake"
run_dir="$PG_CDC_RUN/pubsub"
log_file="$run_dir/pubsub.log"
pid_file="$run_dir/pubsub.pid"

log() { printf '[pubsub] %s\n' "$*"; }
die() { printf '[pubsub] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=service.sh source-path=SCRIPTDIR
source "$here/service.sh"
service_what=server
service_where="127.0.0.1:$PUBSUB_PORT"
start_timeout="$PUBSUB_START_TIMEOUT"
stop_timeout="$PUBSUB_STOP_TIMEOUT"

find_go() {
  if command -v go >/dev/null; then command -v go; return; fi
  if [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go; return; fi
  die "go not found: install Go 1.26 or later (https://go.dev/dl, or the Go this machine image has in /usr/local/go)"
}

cmd_install() {
  [ -x "$binary" ] && return 0
  local go
  go="$(find_go)"
  log "building Google's pstest (cloud.google.com/go/pubsub/v2) from the Go module proxy into $build_dir"
  mkdir -p "$PG_CDC_CACHE/go"
  local tmp="$build_dir.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  # The module cache and build cache live in $PG_CDC_CACHE, so a second build is quick and offline.
  if ! (cd "$src_dir" && GOPATH="$PG_CDC_CACHE/go" GOMODCACHE="$PG_CDC_CACHE/go/mod" \
        GOCACHE="$PG_CDC_CACHE/go/build-cache" GOTOOLCHAIN=local GOFLAGS=-mod=readonly \
        "$go" build -o "$tmp/pubsub-fake" . ) >"$tmp/build.log" 2>&1; then
    cat "$tmp/build.log" >&2
    rm -rf "$tmp"
    die "could not build scripts/pubsub-fake"
  fi
  rm -rf "$build_dir"
  mv "$tmp" "$build_dir"
  chmod -R a+rX "$build_dir"
  log "built $binary"
}

# The pid of the running server, if the pid file names a live pubsub-fake.
service_pid() {
  pid_matching 'pubsub-fake -addr'
}

service_answers() {
  port_open 127.0.0.1 "$PUBSUB_PORT"
}

cmd_start() {
  cmd_install
  local pid
  mkdir -p "$run_dir"
  if pid="$(service_pid)"; then
    if [ "$(tr '\0' ' ' <"/proc/$pid/cmdline")" != "$binary -addr 127.0.0.1:$PUBSUB_PORT " ]; then
      log "another build or port is running; restarting"
      cmd_stop
      cmd_start
      return 0
    fi
    wait_ready "$pid"
    log "already running (pid $pid) on 127.0.0.1:$PUBSUB_PORT"
    return 0
  fi
  rm -f "$pid_file"
  if port_open 127.0.0.1 "$PUBSUB_PORT"; then
    die "127.0.0.1:$PUBSUB_PORT is already in use by another process (ss -ltnp 'sport = :$PUBSUB_PORT')"
  fi
  id "$PUBSUB_USER" >/dev/null 2>&1 || die "user $PUBSUB_USER does not exist (install postgresql, or set PUBSUB_USER)"
  mkdir -p "$PG_CDC_RUN"
  chmod a+rx "$PG_CDC_RUN"
  touch "$log_file"
  if [ "$(id -u)" -eq 0 ]; then
    chown -R "$PUBSUB_USER:" "$run_dir"
  fi
  log "starting pstest on 127.0.0.1:$PUBSUB_PORT as $PUBSUB_USER"
  echo "==== $(date -Is) start pubsub-fake ($src_hash) ====" >>"$log_file"
  # setsid: its own session, so it outlives this script; the inner shell records the pid of the
  # server itself (`pubsub.sh __exec_server` execs into it).
  # shellcheck disable=SC2016  # $1, $@ and $! belong to the inner shell
  setsid --wait bash -c '
    pid_file="$1"; shift
    "$@" &
    echo $! >"$pid_file"
  ' _ "$pid_file" "$here/pubsub.sh" __exec_server </dev/null >>"$log_file" 2>&1
  pid="$(cat "$pid_file")"
  wait_ready "$pid"
  log "ready on 127.0.0.1:$PUBSUB_PORT (pid $pid, log $log_file)"
}

cmd_exec_server() {
  set_run_as_prefix "$PUBSUB_USER"
  cd "$run_dir"
  exec "${run_as_prefix[@]}" "$binary" -addr "127.0.0.1:$PUBSUB_PORT"
}

# An operator's topic (and subscription for its consumer), through Google's client in the tests' venv.
cmd_create_topic() {
  local usage="usage: scripts/pubsub.sh create-topic PROJECT TOPIC [SUBSCRIPTION]"
  "$PG_CDC_VENV/bin/python" - "${1:?$usage}" "${2:?$usage}" "${3:-}" <<'PY'
import sys
from google.api_core import exceptions
from google.cloud import pubsub_v1
project, topic, subscription = sys.argv[1:4]
pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
t = pub.topic_path(project, topic)
try:
    pub.create_topic(name=t)
    print(f"[pubsub] created topic {t}")
except exceptions.AlreadyExists:
    print(f"[pubsub] topic {t} exists")
if subscription:
    s = sub.subscription_path(project, subscription)
    try:
        sub.create_subscription(request={"name": s, "topic": t, "enable_message_ordering": True})
        print(f"[pubsub] created subscription {s}")
    except exceptions.AlreadyExists:
        print(f"[pubsub] subscription {s} exists")
PY
}

case "${1:-}" in
  install) cmd_install ;;
  create-topic) shift; cmd_create_topic "$@" ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  kill) cmd_kill ;;
  status) cmd_status ;;
  logs) shift; cmd_logs "$@" ;;
  reset) cmd_stop ;;
  __exec_server) cmd_exec_server ;;
  *) usage ;;
esac
