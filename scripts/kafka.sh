#!/usr/bin/env bash
# A real single-node Apache Kafka broker for pg_cdc's end-to-end tests.
#
# One JVM plays both KRaft roles (broker + controller) on 127.0.0.1, with every internal topic at
# replication factor 1 so that transactions (exactly-once producers) work on one node.
# The jars come from Maven Central through kafka/pom.xml; nothing is downloaded from elsewhere.
#
#   scripts/kafka.sh install   resolve the jars into $PG_CDC_CACHE/kafka-$KAFKA_VERSION/libs (once)
#   scripts/kafka.sh start     install if needed, format storage the first time, start, wait until it answers
#   scripts/kafka.sh stop      SIGTERM (controlled shutdown), SIGKILL after a grace period
#   scripts/kafka.sh kill      SIGKILL at once (fault injection)
#   scripts/kafka.sh status    exit 0 running and answering, 1 running but not answering, 3 stopped
#   scripts/kafka.sh logs [tail args]   e.g. `logs -n 200` or `logs -f`
#   scripts/kafka.sh reset     stop and wipe the data directory (topics, offsets, transactions)
#
# Besides PLAINTEXT on $KAFKA_PORT it has a SASL_SSL listener on $KAFKA_SASL_PORT (PLAIN over TLS, as
# Azure Event Hubs speaks it): user `$ConnectionString`, password the test connection string in
# $PG_CDC_RUN/kafka/eventhub.connection, certificate signed by the test CA $PG_CDC_RUN/kafka/tls/ca.pem.
# Both are made once by `start`. A start whose generated config differs from the running broker's
# restarts it.
#
# Every command is idempotent. Runtime files live in $PG_CDC_RUN/kafka (see paths below).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"

KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
KAFKA_SASL_PORT="${KAFKA_SASL_PORT:-9094}"
# The broker runs as an ordinary user, never as root (the tests also run Postgres as `postgres`).
KAFKA_USER="${KAFKA_USER:-postgres}"
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx512m -Xms256m}"
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"   # seconds until the broker must answer
KAFKA_STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"     # seconds of grace after SIGTERM

kafka_home="$PG_CDC_CACHE/kafka-$KAFKA_VERSION"
libs="$kafka_home/libs"
marker="$kafka_home/.installed"      # holds install_stamp; present only once libs/ is complete
run_dir="$PG_CDC_RUN/kafka"
data_dir="$run_dir/data"
conf="$run_dir/server.properties"
log4j_conf="$run_dir/log4j2.yaml"
log_file="$run_dir/kafka.log"
pid_file="$run_dir/kafka.pid"
tls_dir="$run_dir/tls"
eventhub_file="$run_dir/eventhub.connection"

log() { printf '[kafka] %s\n' "$*"; }
die() { printf '[kafka] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=service.sh source-path=SCRIPTDIR
source "$here/service.sh"
service_what=broker
service_where="$KAFKA_BOOTSTRAP"
start_timeout="$KAFKA_START_TIMEOUT"
stop_timeout="$KAFKA_STOP_TIMEOUT"

# ---------------------------------------------------------------------------------------------
# install

# Changes whenever the version or the pom changes, so editing the pom re-resolves the jars.
install_stamp() {
  printf '%s %s\n' "$KAFKA_VERSION" "$(sha256sum "$repo/kafka/pom.xml" | cut -d' ' -f1)"
}

cmd_install() {
  maven_install Kafka "$KAFKA_VERSION" "$repo/kafka/pom.xml" kafka.version "$kafka_home" "$(install_stamp)" \
    "kafka_2.13-$KAFKA_VERSION.jar" "kafka-tools-$KAFKA_VERSION.jar" "kafka-clients-$KAFKA_VERSION.jar"
}

# ---------------------------------------------------------------------------------------------
# helpers


as_kafka_user() {
  set_run_as_prefix "$KAFKA_USER"
  "${run_as_prefix[@]}" "$@"
}

# Runs one of Kafka's command-line tools (a main class) quietly and with a quick-starting JVM.
kafka_tool() {
  as_kafka_user java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$log4j_conf" -Dkafka.root.level=WARN \
    -cp "$libs/*" "$@"
}

# The pid of the running broker, if the pid file names a live kafka.Kafka process.
# Checking the command line guards against a stale pid file whose pid was reused.
service_pid() {
  pid_matching ' kafka\.Kafka '
}

# True when the broker answers a metadata request and lists itself. Uses the Python client when
# the test venv exists (fast); falls back to kafka-topics (a JVM start, about 2 s).
service_answers() {
  port_open "$KAFKA_HOST" "$KAFKA_PORT" || return 1
  if [ -x "$PG_CDC_VENV/bin/python" ] &&
     "$PG_CDC_VENV/bin/python" -c 'import confluent_kafka' 2>/dev/null; then
    "$PG_CDC_VENV/bin/python" - "$KAFKA_BOOTSTRAP" 2>/dev/null <<'EOF'
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1]}).list_topics(timeout=5)
sys.exit(0 if 1 in md.brokers else 1)
EOF
  else
    kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_BOOTSTRAP" --list \
      >/dev/null 2>&1
  fi
}

# ---------------------------------------------------------------------------------------------
# start

# The test CA and the broker's certificate (for 127.0.0.1 and localhost), and the Event Hubs style
# connection string the SASL listener accepts. Made once; kept across restarts and resets.
make_secrets() {
  if [ ! -f "$tls_dir/server.pem" ]; then
    command -v openssl >/dev/null || die "openssl not found (apt-get install openssl)"
    log "making the test CA and broker certificate in $tls_dir"
    rm -rf "$tls_dir.tmp" && mkdir -p "$tls_dir.tmp"
    (
      cd "$tls_dir.tmp"
      openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=pg_cdc test CA" \
        -keyout ca.key -out ca.pem 2>/dev/null
      openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >san.ext
      openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile san.ext -out server.crt 2>/dev/null
      # Kafka reads a PEM keystore: the PKCS#8 key, then the certificate chain.
      openssl pkcs8 -topk8 -nocrypt -in server.key -out server.p8
      cat server.p8 server.crt ca.pem >server.pem
      rm -f ca.key ca.srl server.csr server.key server.p8 san.ext
    )
    rm -rf "$tls_dir" && mv "$tls_dir.tmp" "$tls_dir"
  fi
  if [ ! -f "$eventhub_file" ]; then
    local key
    key="$(head -c32 /dev/urandom | base64 | tr -d '\n')"
    printf 'Endpoint=sb://pgcdc-local.servicebus.windows.net/;SharedAccessKeyName=pg_cdc_test;SharedAccessKey=%s\n' \
      "$key" >"$eventhub_file.tmp"
    mv "$eventhub_file.tmp" "$eventhub_file"
  fi
  # The broker's key is for the broker only (the start below makes $KAFKA_USER own the run dir).
  chmod 0644 "$tls_dir/ca.pem" "$eventhub_file"
  chmod 0600 "$tls_dir/server.pem"
}

write_config() {  # file
  local eventhub
  eventhub="$(cat "$eventhub_file")"
  cat >"$1" <<EOF
# Generated by scripts/kafka.sh at every start; edit the script, not this file.
# KRaft combined mode: this one process is both the broker and the only controller.
process.roles=broker,controller
node.id=1
# A static quorum of one. (Kafka 4.x also offers a dynamic quorum, controller.quorum.bootstrap.servers
# + \`format --standalone\`, but that records the controller address in the metadata log, so changing
# KAFKA_CONTROLLER_PORT later would need a reset.)
controller.quorum.voters=1@$KAFKA_HOST:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://$KAFKA_HOST:$KAFKA_PORT,CONTROLLER://$KAFKA_HOST:$KAFKA_CONTROLLER_PORT,SASL_SSL://$KAFKA_HOST:$KAFKA_SASL_PORT
advertised.listeners=PLAINTEXT://${KAFKA_ADVERTISED_HOST:-$KAFKA_HOST}:$KAFKA_PORT,SASL_SSL://${KAFKA_ADVERTISED_HOST:-$KAFKA_HOST}:$KAFKA_SASL_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL

# The Event Hubs style listener: SASL PLAIN over TLS, one user, \$ConnectionString.
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_\$ConnectionString="$eventhub";
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$tls_dir/server.pem

log.dirs=$data_dir

# One node: every internal topic must fit on it, or transactions and consumer groups never start.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=5
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1

num.partitions=3
auto.create.topics.enable=true
# Consumers in tests join alone; don't wait 3 s for more members.
group.initial.rebalance.delay.ms=0

# Small files: test data is tiny and the disk is shared.
log.segment.bytes=16777216
log.index.size.max.bytes=1048576
log.retention.hours=24
log.retention.check.interval.ms=60000

# After a SIGKILL (scripts/kafka.sh kill) the restarted broker cannot register until the dead
# incarnation's session expires (default 9 s). 5 s keeps restarts quick while tolerating GC pauses
# and a busy 2-core machine.
broker.session.timeout.ms=5000
broker.heartbeat.interval.ms=1000

num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
EOF
}

format_storage() {
  # Still the Scala kafka.tools.StorageTool in 4.1 and 4.4, while most tools moved to
  # org.apache.kafka.tools; take the Java one if a later release ships it.
  local cls
  if grep -lq --binary-files=text 'org/apache/kafka/tools/StorageTool.class' "$libs"/*.jar; then
    cls=org.apache.kafka.tools.StorageTool
  else
    cls=kafka.tools.StorageTool
  fi
  # A cluster id is a base64url-encoded random UUID without padding, as `random-uuid` prints.
  local cluster_id
  cluster_id="$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
  log "formatting $data_dir (cluster id $cluster_id)"
  kafka_tool "$cls" format -t "$cluster_id" -c "$conf" >>"$log_file" 2>&1 || {
      show_log_tail
      die "formatting storage failed"
    }
}

cmd_start() {
  cmd_install

  local pid
  mkdir -p "$run_dir"
  make_secrets
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
      log "already running (pid $pid) and answering on $KAFKA_BOOTSTRAP"
      return 0
    fi
    log "running (pid $pid) but not answering yet; waiting"
    wait_ready "$pid"
    log "ready on $KAFKA_BOOTSTRAP (pid $pid)"
    return 0
  fi
  rm -f "$pid_file"

  # Someone else (an old broker whose pid file was lost, another service) holds our ports.
  for port in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SASL_PORT"; do
    if port_open "$KAFKA_HOST" "$port"; then
      die "$KAFKA_HOST:$port is already in use by another process (ss -ltnp 'sport = :$port')"
    fi
  done

  id "$KAFKA_USER" >/dev/null 2>&1 ||
    die "user $KAFKA_USER does not exist (install postgresql, or set KAFKA_USER)"

  # $PG_CDC_RUN is shared with other services; only the kafka/ part belongs to $KAFKA_USER.
  mkdir -p "$PG_CDC_RUN"
  chmod a+rx "$PG_CDC_RUN"
  mkdir -p "$data_dir"
  touch "$log_file"
  if [ "$(id -u)" -eq 0 ]; then
    chown -R "$KAFKA_USER:" "$run_dir"
  fi

  write_config "$conf"
  install -m 0644 "$repo/kafka/log4j2.yaml" "$log4j_conf"

  if [ ! -f "$data_dir/meta.properties" ]; then
    format_storage
  fi

  log "starting Kafka $KAFKA_VERSION on $KAFKA_BOOTSTRAP (controller :$KAFKA_CONTROLLER_PORT) as $KAFKA_USER"
  echo "==== $(date -Is) start Kafka $KAFKA_VERSION ====" >>"$log_file"
  # setsid: the broker gets its own session, so it outlives this script and the terminal or
  # CI step that ran it. The inner shell starts `kafka.sh __exec_broker`, which execs (through
  # setpriv) into java, and records its pid: so the pid file names the JVM itself, however setsid
  # forks. --wait: return only once the pid file is written.
  # shellcheck disable=SC2016  # $1, $@ and $! belong to the inner shell
  setsid --wait bash -c '
    pid_file="$1"; shift
    "$@" &
    echo $! >"$pid_file"
  ' _ "$pid_file" \
    "$here/kafka.sh" __exec_broker \
    </dev/null >>"$log_file" 2>&1

  # The pid file is written just before bash -c returns, so it is there now.
  pid="$(cat "$pid_file")"
  wait_ready "$pid"
  log "ready on $KAFKA_BOOTSTRAP (pid $pid, log $log_file)"
}

# Internal: becomes the broker JVM (exec, so the pid cmd_start recorded is the JVM's), as
# $KAFKA_USER. Called only by cmd_start; stdout/stderr are already the log file.
cmd_exec_broker() {
  set_run_as_prefix "$KAFKA_USER"
  # shellcheck disable=SC2086  # KAFKA_HEAP_OPTS is a list of JVM flags
  exec "${run_as_prefix[@]}" java $KAFKA_HEAP_OPTS \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$log4j_conf" \
    -Dkafka.logs.dir="$run_dir" \
    -cp "$libs/*" kafka.Kafka "$conf"
}

# ---------------------------------------------------------------------------------------------
# stop / kill / status / logs / reset

cmd_reset() {
  cmd_stop
  log "wiping $data_dir"
  rm -rf "$data_dir"
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
