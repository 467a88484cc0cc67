#!/usr/bin/env bash
# A local Kinesis-compatible server for pg_cdc's end-to-end tests.
#
# It is kinesis-mock (the one LocalStack uses), as published on npm as `kinesis-local`: one
# Scala.js file run by node. It speaks the Kinesis API (JSON 1.1 and CBOR) over plain HTTP on
# $KINESIS_PORT (so $KINESIS_ENDPOINT) and over HTTPS, with its own self-signed certificate, on
# $KINESIS_TLS_PORT. It only fetches the package from the npm registry; nothing else.
# kinesis-mock has no bind-address setting: both ports listen on every interface, not just 127.0.0.1.
#
#   scripts/kinesis.sh install   npm install kinesis-local into $PG_CDC_CACHE/kinesis-local-<version> (once)
#   scripts/kinesis.sh start     install if needed, start, wait until it answers ListStreams
#   scripts/kinesis.sh stop      SIGTERM, SIGKILL after a grace period
#   scripts/kinesis.sh kill      SIGKILL at once (fault injection)
#   scripts/kinesis.sh status    exit 0 running and answering, 1 running but not answering, 3 stopped
#   scripts/kinesis.sh logs [tail args]   e.g. `logs -n 200` or `logs -f`
#   scripts/kinesis.sh reset     stop: every stream lives in the server's memory only, so this drops them
#   scripts/kinesis.sh create-stream NAME [SHARDS]   create a stream (2 shards) as an operator would,
#                                unless it exists; waits until it is ACTIVE (AWS's own SDK, boto3)
#
# Clients need any access key and secret (signatures are parsed but never checked) and a region;
# requests need an Authorization header and X-Amz-Date, as any AWS SDK sends. The access key id
# picks the account: a 12-digit key is that account id, anything else is $KINESIS_ACCOUNT_ID.
# Streams become ACTIVE after $KINESIS_OP_DURATION (0ms: at once); no throughput limits are
# simulated (PutRecords never returns ProvisionedThroughputExceededException).
# A start whose settings differ from the running server's restarts it.
#
# Every command is idempotent. Runtime files live in $PG_CDC_RUN/kinesis (see paths below).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"

KINESIS_LOCAL_VERSION="${KINESIS_LOCAL_VERSION:-0.6.2}"
KINESIS_TLS_PORT="${KINESIS_TLS_PORT:-4567}"
# The server runs as an ordinary user, like Kafka and Postgres in the tests.
KINESIS_USER="${KINESIS_USER:-postgres}"
KINESIS_REGION="${KINESIS_REGION:-us-east-1}"            # default region (a request's own wins)
KINESIS_ACCOUNT_ID="${KINESIS_ACCOUNT_ID:-000000000000}"  # default account
# How long CreateStream, DeleteStream, SplitShard, MergeShards, UpdateShardCount, ... stay in their
# transitional status (CREATING, DELETING, UPDATING). kinesis-mock's default is 500ms.
KINESIS_OP_DURATION="${KINESIS_OP_DURATION:-0ms}"
KINESIS_SHARD_LIMIT="${KINESIS_SHARD_LIMIT:-1000}"        # per account and region; default 50
KINESIS_ON_DEMAND_LIMIT="${KINESIS_ON_DEMAND_LIMIT:-100}" # on-demand streams; default 10
KINESIS_LOG_LEVEL="${KINESIS_LOG_LEVEL:-INFO}"            # ERROR WARN INFO DEBUG TRACE (TRACE logs bodies)
KINESIS_START_TIMEOUT="${KINESIS_START_TIMEOUT:-30}"      # seconds until the server must answer
KINESIS_STOP_TIMEOUT="${KINESIS_STOP_TIMEOUT:-10}"        # seconds of grace after SIGTERM

# Only this version's tarball is pinned; another KINESIS_LOCAL_VERSION is taken as npm serves it.
pinned_integrity_0_6_2="sha512-mFlmksPMQP/A3nT22N2E8WzUbJcbEdxkCnhNCx2lHj20CW4vzuVH8zn5ByRg5LS5es8tvnx2mY1DpbZ5kw9PPQ=="

kinesis_home="$PG_CDC_CACHE/kinesis-local-$KINESIS_LOCAL_VERSION"
pkg_dir="$kinesis_home/node_modules/kinesis-local"
main_js="$pkg_dir/main.js"
marker="$kinesis_home/.installed"    # holds the version; present only once the install is complete
run_dir="$PG_CDC_RUN/kinesis"
settings_file="$run_dir/kinesis.env"  # the environment the running server was started with
log_file="$run_dir/kinesis.log"
pid_file="$run_dir/kinesis.pid"

log() { printf '[kinesis] %s\n' "$*"; }
die() { printf '[kinesis] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=service.sh source-path=SCRIPTDIR
source "$here/service.sh"
service_what=server
service_where="$KINESIS_ENDPOINT"
start_timeout="$KINESIS_START_TIMEOUT"
stop_timeout="$KINESIS_STOP_TIMEOUT"

# ---------------------------------------------------------------------------------------------
# install

cmd_install() {
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$KINESIS_LOCAL_VERSION" ] && [ -f "$main_js" ]; then
    return 0
  fi
  command -v node >/dev/null || die "node not found (install nodejs)"
  command -v npm >/dev/null || die "npm not found (install npm)"
  log "installing kinesis-local $KINESIS_LOCAL_VERSION from npm into $kinesis_home"
  mkdir -p "$PG_CDC_CACHE"
  # Install into a scratch dir and rename, so an interrupted install never looks complete.
  local tmp="$kinesis_home.tmp.$$" npm_log="$PG_CDC_CACHE/kinesis-local-npm.log"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  if ! npm install --prefix "$tmp" --cache "$PG_CDC_CACHE/npm" --no-audit --no-fund \
      --no-update-notifier --save-exact "kinesis-local@$KINESIS_LOCAL_VERSION" >"$npm_log" 2>&1; then
    cat "$npm_log" >&2
    rm -rf "$tmp"
    die "npm could not install kinesis-local@$KINESIS_LOCAL_VERSION"
  fi
  for f in main.js server.json; do
    [ -f "$tmp/node_modules/kinesis-local/$f" ] || { rm -rf "$tmp"; die "$f missing after npm install"; }
  done
  if [ "$KINESIS_LOCAL_VERSION" = 0.6.2 ] &&
     ! grep -qF "\"integrity\": \"$pinned_integrity_0_6_2\"" "$tmp/package-lock.json"; then
    rm -rf "$tmp"
    die "kinesis-local 0.6.2 from npm does not have the pinned integrity $pinned_integrity_0_6_2"
  fi
  rm -rf "$kinesis_home"
  mv "$tmp" "$kinesis_home"
  # The server runs as $KINESIS_USER: make sure it can read the package whatever root's umask was.
  chmod -R a+rX "$kinesis_home"
  echo "$KINESIS_LOCAL_VERSION" >"$marker"
  log "installed $main_js"
}

# ---------------------------------------------------------------------------------------------
# helpers

# The server's environment (kinesis-mock reads its whole configuration from it), one VAR=value a
# line. See the README in $pkg_dir for every setting.
write_settings() {  # file
  local op
  {
    echo "KINESIS_MOCK_PLAIN_PORT=$KINESIS_PORT"
    echo "KINESIS_MOCK_TLS_PORT=$KINESIS_TLS_PORT"
    echo "KINESIS_MOCK_CERT_PATH=$pkg_dir/server.json"
    echo "AWS_REGION=$KINESIS_REGION"
    echo "AWS_ACCOUNT_ID=$KINESIS_ACCOUNT_ID"
    for op in CREATE_STREAM DELETE_STREAM REGISTER_STREAM_CONSUMER DEREGISTER_STREAM_CONSUMER \
        START_STREAM_ENCRYPTION STOP_STREAM_ENCRYPTION MERGE_SHARDS SPLIT_SHARD \
        UPDATE_SHARD_COUNT UPDATE_STREAM_MODE; do
      echo "${op}_DURATION=$KINESIS_OP_DURATION"
    done
    echo "SHARD_LIMIT=$KINESIS_SHARD_LIMIT"
    echo "ON_DEMAND_STREAM_COUNT_LIMIT=$KINESIS_ON_DEMAND_LIMIT"
    echo "LOG_LEVEL=$KINESIS_LOG_LEVEL"
    echo "SHOULD_PERSIST_DATA=false"
    echo "LOAD_DATA_IF_EXISTS=false"
  } >"$1"
}

# The pid of the running server, if the pid file names a live `node .../kinesis-local/main.js`.
# Checking the command line guards against a stale pid file whose pid was reused.
service_pid() {
  pid_matching 'kinesis-local/main\.js'
}

# True when the plain port answers a real, (dummy-)signed ListStreams with 200 and a stream list.
service_answers() {
  port_open 127.0.0.1 "$KINESIS_PORT" || return 1
  local url="http://127.0.0.1:$KINESIS_PORT/"
  local auth="AWS4-HMAC-SHA256 Credential=test/20260101/$KINESIS_REGION/kinesis/aws4_request, SignedHeaders=host, Signature=0"
  if command -v curl >/dev/null; then
    curl -sf --max-time 5 -X POST "$url" \
      -H 'X-Amz-Target: Kinesis_20131202.ListStreams' \
      -H 'Content-Type: application/x-amz-json-1.1' \
      -H 'X-Amz-Date: 20260101T000000Z' \
      -H "Authorization: $auth" \
      -d '{}' 2>/dev/null | grep -q '"StreamNames"'
  else
    python3 - "$url" "$auth" 2>/dev/null <<'EOF'
import sys, urllib.request
req = urllib.request.Request(sys.argv[1], data=b"{}", method="POST", headers={
    "X-Amz-Target": "Kinesis_20131202.ListStreams",
    "Content-Type": "application/x-amz-json-1.1",
    "X-Amz-Date": "20260101T000000Z",
    "Authorization": sys.argv[2],
})
with urllib.request.urlopen(req, timeout=5) as r:
    sys.exit(0 if r.status == 200 and b'"StreamNames"' in r.read() else 1)
EOF
  fi
}

elapsed_since() {  # $EPOCHREALTIME value -> seconds since then, 1 decimal
  local now="$EPOCHREALTIME"
  local ms=$(( (${now//[.,]/} - ${1//[.,]/}) / 1000 ))
  printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100))
}

# ---------------------------------------------------------------------------------------------
# start

cmd_start() {
  cmd_install

  local pid
  mkdir -p "$run_dir"
  if pid="$(service_pid)"; then
    write_settings "$settings_file.next"
    if ! cmp -s "$settings_file.next" "$settings_file"; then
      log "its settings changed; restarting"
      rm -f "$settings_file.next"
      cmd_stop
      cmd_start
      return 0
    fi
    rm -f "$settings_file.next"
    if service_answers; then
      log "already running (pid $pid) and answering on $KINESIS_ENDPOINT"
      return 0
    fi
    log "running (pid $pid) but not answering yet; waiting"
    wait_ready "$pid"
    log "ready on $KINESIS_ENDPOINT (pid $pid)"
    return 0
  fi
  rm -f "$pid_file"

  # Someone else (a server whose pid file was lost, LocalStack, ...) holds our ports.
  for port in "$KINESIS_PORT" "$KINESIS_TLS_PORT"; do
    if port_open 127.0.0.1 "$port"; then
      die "127.0.0.1:$port is already in use by another process (ss -ltnp 'sport = :$port')"
    fi
  done

  command -v node >/dev/null || die "node not found (install nodejs)"
  id "$KINESIS_USER" >/dev/null 2>&1 ||
    die "user $KINESIS_USER does not exist (install postgresql, or set KINESIS_USER)"

  # $PG_CDC_RUN is shared with other services; only the kinesis/ part belongs to $KINESIS_USER.
  mkdir -p "$PG_CDC_RUN"
  chmod a+rx "$PG_CDC_RUN"
  touch "$log_file"
  write_settings "$settings_file"
  if [ "$(id -u)" -eq 0 ]; then
    chown -R "$KINESIS_USER:" "$run_dir"
  fi

  log "starting kinesis-local $KINESIS_LOCAL_VERSION on $KINESIS_ENDPOINT (https :$KINESIS_TLS_PORT) as $KINESIS_USER"
  echo "==== $(date -Is) start kinesis-local $KINESIS_LOCAL_VERSION ====" >>"$log_file"
  # setsid: the server gets its own session, so it outlives this script and the terminal or CI
  # step that ran it. The inner shell starts `kinesis.sh __exec_server`, which execs (through
  # setpriv) into node, and records its pid: so the pid file names node itself.
  # --wait: return only once the pid file is written.
  # shellcheck disable=SC2016  # $1, $@ and $! belong to the inner shell
  setsid --wait bash -c '
    pid_file="$1"; shift
    "$@" &
    echo $! >"$pid_file"
  ' _ "$pid_file" \
    "$here/kinesis.sh" __exec_server \
    </dev/null >>"$log_file" 2>&1

  pid="$(cat "$pid_file")"
  local t0="$EPOCHREALTIME"
  wait_ready "$pid"
  log "ready on $KINESIS_ENDPOINT in $(elapsed_since "$t0")s (pid $pid, log $log_file)"
}

# Internal: becomes the server (exec, so the pid cmd_start recorded is node's), as $KINESIS_USER,
# in $run_dir (where kinesis-mock would put relative paths). Called only by cmd_start;
# stdout/stderr are already the log file.
cmd_exec_server() {
  set_run_as_prefix "$KINESIS_USER"
  cd "$run_dir"
  local settings=()
  mapfile -t settings <"$settings_file"
  exec "${run_as_prefix[@]}" env "${settings[@]}" node "$main_js"
}

# ---------------------------------------------------------------------------------------------
# stop / kill / status / logs / reset

# No persistent state: streams and records live in the server's memory (SHOULD_PERSIST_DATA=false),
# so stopping is all a reset needs. The next start begins empty.
cmd_reset() {
  cmd_stop
  log "no persistent state; streams are gone with the process"
}

# An operator's CreateStream, through boto3 (in the tests' venv), against the local server.
cmd_create_stream() {
  local name="${1:?usage: scripts/kinesis.sh create-stream NAME [SHARDS]}" shards="${2:-2}"
  "$PG_CDC_VENV/bin/python" - "$name" "$shards" <<'PY'
import sys, time, os
import boto3
name, shards = sys.argv[1], int(sys.argv[2])
k = boto3.client("kinesis", endpoint_url=os.environ["KINESIS_ENDPOINT"], region_name="us-east-1",
                 aws_access_key_id="operator", aws_secret_access_key="operator")
if name in k.list_streams()["StreamNames"]:
    print(f"[kinesis] stream {name} exists")
else:
    k.create_stream(StreamName=name, ShardCount=shards)
    print(f"[kinesis] created stream {name} ({shards} shards)")
for _ in range(100):
    if k.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
        break
    time.sleep(0.1)
else:
    sys.exit(f"[kinesis] stream {name} did not become ACTIVE")
PY
}

case "${1:-}" in
  install) cmd_install ;;
  create-stream) shift; cmd_create_stream "$@" ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  kill) cmd_kill ;;
  status) cmd_status ;;
  logs) shift; cmd_logs "$@" ;;
  reset) cmd_reset ;;
  __exec_server) cmd_exec_server ;;
  *) usage ;;
esac
