#!/usr/bin/env bash
# A real single-node Apache Pulsar broker ("standalone") for pg_cdc's end-to-end tests.
#
# One JVM runs the broker, one embedded BookKeeper bookie and a RocksDB metadata store (no ZooKeeper,
# no function worker, no stream storage), all on 127.0.0.1. The jars come from Maven Central through
# pulsar/pom.xml; nothing is downloaded from elsewhere.
#
#   scripts/pulsar.sh install   resolve the jars into $PG_CDC_CACHE/pulsar-$PULSAR_VERSION/libs (once)
#   scripts/pulsar.sh start     install if needed, start, wait until it answers
#   scripts/pulsar.sh stop      SIGTERM (clean shutdown of broker and bookie), SIGKILL after a grace period
#   scripts/pulsar.sh kill      SIGKILL at once (fault injection)
#   scripts/pulsar.sh status    exit 0 running and answering, 1 running but not answering, 3 stopped
#   scripts/pulsar.sh logs [tail args]   e.g. `logs -n 200` or `logs -f`
#   scripts/pulsar.sh reset     stop and wipe the data directory (topics, subscriptions, dedup state)
#
# Clients: binary protocol at $PULSAR_SERVICE_URL (pulsar://127.0.0.1:6650), admin REST at
# $PULSAR_ADMIN_URL (http://127.0.0.1:8080/admin/v2/...). No TLS, no authentication, no authorization.
# Cluster `standalone`, tenant `public`, namespace `public/default` (made by the broker on first start).
# Topics are created on first use (non-partitioned). Broker-side deduplication is on for every topic:
# a producer with a fixed name whose message carries a sequence id not above the last one stored for
# that name is acknowledged but not stored again. Retention is on (see write_config), so a consumer
# that subscribes after the messages were produced still reads them from Earliest.
# "Answering" means the admin API lists public/default and /admin/v2/brokers/health (a produce and
# consume through the broker and the bookie) says ok. A start whose generated config differs from
# the running broker's restarts it.
#
# Every command is idempotent. Runtime files live in $PG_CDC_RUN/pulsar (see paths below).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"

# The bookie listens on loopback only. Its address is recorded in its cookie (in the data directory
# and the metadata store) the first time: changing PULSAR_BOOKIE_PORT later needs a reset.
PULSAR_BOOKIE_PORT="${PULSAR_BOOKIE_PORT:-3181}"
# The broker runs as an ordinary user, never as root (like Kafka and Postgres in the tests).
PULSAR_USER="${PULSAR_USER:-postgres}"
# Heap, plus direct memory for Netty, the bookie's write/read caches and the broker's entry cache
# (sized explicitly in write_config so that they fit).
PULSAR_HEAP_OPTS="${PULSAR_HEAP_OPTS:--Xmx512m -Xms128m -XX:MaxDirectMemorySize=256m}"
# More JVM flags. By default the JIT stops at C1: on the 2-core test machine that starts the broker
# about 30% sooner with about a third less CPU, and a test broker needs no peak throughput.
# Set PULSAR_EXTRA_OPTS= (empty) for a benchmark.
PULSAR_EXTRA_OPTS="${PULSAR_EXTRA_OPTS--XX:TieredStopAtLevel=1}"
PULSAR_START_TIMEOUT="${PULSAR_START_TIMEOUT:-90}"   # seconds until the broker must answer
PULSAR_STOP_TIMEOUT="${PULSAR_STOP_TIMEOUT:-30}"     # seconds of grace after SIGTERM

pulsar_home="$PG_CDC_CACHE/pulsar-$PULSAR_VERSION"
libs="$pulsar_home/libs"
marker="$pulsar_home/.installed"     # holds install_stamp; present only once libs/ is complete
run_dir="$PG_CDC_RUN/pulsar"
data_dir="$run_dir/data"
tmp_dir="$run_dir/tmp"               # the JVM's java.io.tmpdir (native libraries are unpacked there)
conf="$run_dir/standalone.conf"
log4j_conf="$run_dir/log4j2.properties"
rocksdb_conf="$run_dir/ledger_metadata_rocksdb.conf"
log_file="$run_dir/pulsar.log"
pid_file="$run_dir/pulsar.pid"

log() { printf '[pulsar] %s\n' "$*"; }
die() { printf '[pulsar] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=service.sh source-path=SCRIPTDIR
source "$here/service.sh"
service_what=broker
service_where="$PULSAR_SERVICE_URL (admin $PULSAR_ADMIN_URL)"
start_timeout="$PULSAR_START_TIMEOUT"
stop_timeout="$PULSAR_STOP_TIMEOUT"

# ---------------------------------------------------------------------------------------------
# install

# Changes whenever the version or the pom changes, so editing the pom re-resolves the jars.
install_stamp() {
  printf '%s %s\n' "$PULSAR_VERSION" "$(sha256sum "$repo/pulsar/pom.xml" | cut -d' ' -f1)"
}

cmd_install() {
  maven_install Pulsar "$PULSAR_VERSION" "$repo/pulsar/pom.xml" pulsar.version "$pulsar_home" "$(install_stamp)" \
    "pulsar-broker-$PULSAR_VERSION.jar" "pulsar-metadata-$PULSAR_VERSION.jar" \
    'bookkeeper-server-*.jar' 'rocksdbjni-*.jar' 'log4j-slf4j2-impl-*.jar'
}

# ---------------------------------------------------------------------------------------------
# helpers

# The pid of the running broker, if the pid file names a live PulsarStandaloneStarter process.
# Checking the command line guards against a stale pid file whose pid was reused.
service_pid() {
  pid_matching ' org\.apache\.pulsar\.PulsarStandaloneStarter '
}

# True when the admin API lists the default namespace (made by the standalone right after the broker
# started, so clients can use public/default) and the broker's health check, which produces and
# consumes a message on its heartbeat topic (so the bookie and the metadata store work), says ok.
service_answers() {
  port_open "$PULSAR_HOST" "$PULSAR_PORT" || return 1
  local out
  # The tenant first: asking for the namespaces of a tenant not made yet logs an ERROR each time.
  out="$(curl -sf -m 5 "$PULSAR_ADMIN_URL/admin/v2/tenants" 2>/dev/null)" || return 1
  [[ $out == *'"public"'* ]] || return 1
  out="$(curl -sf -m 5 "$PULSAR_ADMIN_URL/admin/v2/namespaces/public" 2>/dev/null)" || return 1
  [[ $out == *'"public/default"'* ]] || return 1
  out="$(curl -sf -m 20 "$PULSAR_ADMIN_URL/admin/v2/brokers/health" 2>/dev/null)" || return 1
  [ "$out" = ok ]
}

# ---------------------------------------------------------------------------------------------
# start

# The JVM's flags, besides $PULSAR_HEAP_OPTS: those of Pulsar's own bin/pulsar for `standalone`
# (module opens for Netty and BookKeeper, IPv4, the BookKeeper metadata drivers for the Pulsar
# metadata store), without its asynchronous Log4j context selector (needs the LMAX disruptor, which
# the broker pom does not bring).
jvm_opts() {
  printf '%s\n' \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError -XX:+PerfDisableSharedMem \
    -Djava.awt.headless=true -Djava.net.preferIPv4Stack=true -Djava.io.tmpdir="$tmp_dir" \
    -Djute.maxbuffer=10485760 -Dio.netty.tryReflectionSetAccessible=true \
    --add-opens java.base/java.io=ALL-UNNAMED --add-opens java.base/java.util.zip=ALL-UNNAMED \
    --add-opens java.base/java.nio=ALL-UNNAMED --add-opens java.base/jdk.internal.misc=ALL-UNNAMED \
    --add-opens java.base/sun.net=ALL-UNNAMED --add-opens java.management/sun.management=ALL-UNNAMED \
    -Dbookkeeper.metadata.bookie.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver \
    -Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver \
    -Dlog4j.shutdownHookEnabled=false -Dlog4j2.is.webapp=false \
    -Dlog4j2.configurationFile="$log4j_conf"
}

# The standalone's arguments: where its data lives, the bookie's port, no function worker.
# --zookeeper-dir names a directory that never exists: PulsarStandalone falls back to ZooKeeper mode
# when it finds one, and uses the RocksDB metadata store (in --metadata-dir) otherwise.
standalone_args() {
  printf '%s\n' \
    --config "$conf" \
    --metadata-dir "$data_dir/metadata" \
    --bookkeeper-dir "$data_dir/bookkeeper" \
    --bookkeeper-port "$PULSAR_BOOKIE_PORT" \
    --zookeeper-dir "$data_dir/no-zookeeper" \
    --no-functions-worker --no-stream-storage
}

write_config() {  # file
  cat >"$1" <<EOF
# Generated by scripts/pulsar.sh at every start; edit the script, not this file.
# Read twice: by the broker (ServiceConfiguration) and by the embedded bookie (BookKeeper's
# ServerConfiguration); each ignores the other's keys. Unset keys take the built-in defaults.
# jars: $(install_stamp)
# jvm: $PULSAR_HEAP_OPTS $PULSAR_EXTRA_OPTS
# args: $(standalone_args | tr '\n' ' ')

clusterName=standalone
# metadataStoreUrl stays empty: the standalone uses rocksdb://<--metadata-dir>.
bindAddress=$PULSAR_HOST
advertisedAddress=$PULSAR_HOST
brokerServicePort=$PULSAR_PORT
webServicePort=$PULSAR_HTTP_PORT
webSocketServiceEnabled=false
functionsWorkerEnabled=false
transactionCoordinatorEnabled=false
authenticationEnabled=false
authorizationEnabled=false
statusFilePath=

# One broker: no load balancing, no bundle splits.
loadManagerClassName=org.apache.pulsar.broker.loadbalance.NoopLoadManager
loadBalancerEnabled=false
loadBalancerAutoBundleSplitEnabled=false
defaultNumberOfNamespaceBundles=1

# What the pg_cdc sink relies on.
allowAutoTopicCreation=true
allowAutoTopicCreationType=non-partitioned
allowAutoSubscriptionCreation=true
# Every topic deduplicates by producer name + sequence id (a namespace or topic policy can still
# turn it off). The state lives with the topic, so it survives broker restarts.
brokerDeduplicationEnabled=true
# Keep messages nobody subscribed to yet (a test's consumer often subscribes after the sink wrote),
# for a day or 1 GiB per topic, whichever is reached first.
defaultRetentionTimeInMinutes=1440
defaultRetentionSizeInMB=1024
# Don't delete idle topics (and their dedup state) behind a test's back.
brokerDeleteInactiveTopicsEnabled=false

# One bookie holds every ledger.
managedLedgerDefaultEnsembleSize=1
managedLedgerDefaultWriteQuorum=1
managedLedgerDefaultAckQuorum=1
# Direct-memory users, sized to fit -XX:MaxDirectMemorySize: the broker's entry cache ...
managedLedgerCacheSizeMB=32

# --- the embedded bookie ---
# Listen on loopback only, at 127.0.0.1:$PULSAR_BOOKIE_PORT (allowEphemeralPorts: take the given
# port instead of picking a random free one).
listeningInterface=lo
allowLoopback=true
allowEphemeralPorts=true
ledgerStorageClass=org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage
# ... and the bookie's write and read-ahead caches.
dbStorage_writeCacheMaxSizeMb=16
dbStorage_readAheadCacheMaxSizeMb=16
dbStorage_rocksDB_blockCacheSize=16777216
# RocksDB preallocates each write-ahead log at 1.1 x the write buffer: 71 MB apiece at the default
# 64 MB. 4 MB for the bookie's entry-location index (here) and its ledger index (that file). The
# metadata store's RocksDB keeps its defaults: the standalone opens it before reading this file.
dbStorage_rocksDB_writeBufferSizeMB=4
ledgerMetadataRocksdbConf=$rocksdb_conf
# Entries reach the journal before they are acknowledged, but without an fsync: a SIGKILL of the
# JVM loses nothing (the page cache survives it), only a machine crash could.
journalSyncData=false
journalMaxGroupWaitMSec=1
journalPreAllocSizeMB=4
# Small entry logs: test data is tiny and the disk is shared.
logSizeLimit=67108864
# The shared disk may be fuller than BookKeeper's default 95% without the bookie going read-only.
diskUsageThreshold=0.99
diskUsageWarnThreshold=0.99
EOF
}

# RocksDB options (its OPTIONS file format) for the bookie's ledger index, which otherwise takes
# RocksDB's defaults rather than the dbStorage_rocksDB_* keys of standalone.conf.
write_rocksdb_config() {  # file
  cat >"$1" <<'EOF'
# Generated by scripts/pulsar.sh: RocksDB options of the bookie's ledger index.
[DBOptions]
  create_if_missing=true
  info_log_level=INFO_LEVEL
  keep_log_file_num=5
[CFOptions "default"]
  write_buffer_size=4194304
EOF
}

write_log4j_config() {  # file
  cat >"$1" <<'EOF'
# Generated by scripts/pulsar.sh. Everything goes to stdout, which pulsar.sh appends to pulsar.log.
status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.target = SYSTEM_OUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c{1.})%n
rootLogger.level = ${sys:pulsar.root.level:-INFO}
rootLogger.appenderRef.stdout.ref = STDOUT
# One bookie, no racks: BookKeeper warns at every ledger it opens that it can't place 127.0.0.1.
logger.rack.name = org.apache.bookkeeper.client.TopologyAwareEnsemblePlacementPolicy
logger.rack.level = ERROR
EOF
}

cmd_start() {
  cmd_install
  command -v curl >/dev/null || die "curl not found (apt-get install curl)"

  local pid
  mkdir -p "$run_dir"
  if pid="$(service_pid)"; then
    write_config "$conf.next"
    if ! cmp -s "$conf.next" "$conf"; then
      log "its configuration changed; restarting"
      rm -f "$conf.next"
      cmd_stop
      cmd_start
      return 0
    fi
    rm -f "$conf.next"
    if service_answers; then
      log "already running (pid $pid) and answering on $service_where"
      return 0
    fi
    log "running (pid $pid) but not answering yet; waiting"
    wait_ready "$pid"
    log "ready on $service_where (pid $pid)"
    return 0
  fi
  rm -f "$pid_file"

  # Someone else (an old broker whose pid file was lost, another service) holds our ports.
  for port in "$PULSAR_PORT" "$PULSAR_HTTP_PORT" "$PULSAR_BOOKIE_PORT"; do
    if port_open "$PULSAR_HOST" "$port"; then
      die "$PULSAR_HOST:$port is already in use by another process (ss -ltnp 'sport = :$port')"
    fi
  done

  id "$PULSAR_USER" >/dev/null 2>&1 ||
    die "user $PULSAR_USER does not exist (install postgresql, or set PULSAR_USER)"

  # $PG_CDC_RUN is shared with other services; only the pulsar/ part belongs to $PULSAR_USER.
  mkdir -p "$PG_CDC_RUN"
  chmod a+rx "$PG_CDC_RUN"
  # Unpacked native libraries (RocksDB's alone is ~20 MB) of earlier runs, which a SIGKILL leaves.
  rm -rf "$tmp_dir"
  mkdir -p "$data_dir" "$tmp_dir"
  touch "$log_file"
  write_config "$conf"
  write_log4j_config "$log4j_conf"
  write_rocksdb_config "$rocksdb_conf"
  if [ "$(id -u)" -eq 0 ]; then
    chown -R "$PULSAR_USER:" "$run_dir"
  fi

  log "starting Pulsar $PULSAR_VERSION standalone on $service_where (bookie :$PULSAR_BOOKIE_PORT) as $PULSAR_USER"
  echo "==== $(date -Is) start Pulsar $PULSAR_VERSION ====" >>"$log_file"
  # setsid: the broker gets its own session, so it outlives this script and the terminal or
  # CI step that ran it. The inner shell starts `pulsar.sh __exec_broker`, which execs (through
  # setpriv) into java, and records its pid: so the pid file names the JVM itself, however setsid
  # forks. --wait: return only once the pid file is written.
  # shellcheck disable=SC2016  # $1, $@ and $! belong to the inner shell
  setsid --wait bash -c '
    pid_file="$1"; shift
    "$@" &
    echo $! >"$pid_file"
  ' _ "$pid_file" \
    "$here/pulsar.sh" __exec_broker \
    </dev/null >>"$log_file" 2>&1

  # The pid file is written just before bash -c returns, so it is there now.
  pid="$(cat "$pid_file")"
  wait_ready "$pid"
  log "ready on $service_where (pid $pid, log $log_file)"
}

# Internal: becomes the broker JVM (exec, so the pid cmd_start recorded is the JVM's), as
# $PULSAR_USER, in $run_dir. Called only by cmd_start; stdout/stderr are already the log file.
cmd_exec_broker() {
  set_run_as_prefix "$PULSAR_USER"
  cd "$run_dir"
  local opts args
  mapfile -t opts < <(jvm_opts)
  mapfile -t args < <(standalone_args)
  # shellcheck disable=SC2086  # PULSAR_HEAP_OPTS and PULSAR_EXTRA_OPTS are lists of JVM flags
  exec "${run_as_prefix[@]}" java $PULSAR_HEAP_OPTS $PULSAR_EXTRA_OPTS "${opts[@]}" \
    -cp "$libs/*" org.apache.pulsar.PulsarStandaloneStarter "${args[@]}"
}

# ---------------------------------------------------------------------------------------------
# stop / kill / status / logs / reset

cmd_reset() {
  cmd_stop
  log "wiping $data_dir"
  rm -rf "$data_dir" "$tmp_dir"
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  kill) cmd_kill ;;
  status) cmd_status ;;
  logs) shift; cmd_logs "$@" ;;
  reset) cmd_reset ;;
  __exec_broker) cmd_exec_broker ;;
  *) usage ;;
esac
