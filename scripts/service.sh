# shellcheck shell=bash disable=SC2154,SC2034  # the sourcing script sets the variables listed below, and uses run_as_prefix
# What the scripts that run a local peer in the background share (kafka.sh, kinesis.sh, pubsub.sh,
# pulsar.sh, schema-registry.sh): installing jars from Maven Central, waiting for it, stopping, killing,
# status and logs. Sourced, never run. The sourcing script defines before
# using these:
#   log, die                 its messages
#   pid_file, log_file, run_dir   where the peer's pid, log and runtime files are
#   service_pid              prints the pid of the running peer (fails when none)
#   service_answers          true once the peer serves requests
#   service_what, service_where   "broker" / "server", and its address, for messages
#   start_timeout, stop_timeout   seconds until it must answer, and of grace after SIGTERM

# Resolves a Maven project's dependencies from Maven Central into HOME/libs, once per STAMP (the
# version and the pom's hash): resolved into a scratch directory and renamed, so an interrupted install
# never looks complete; every JAR glob must match afterwards; the jars are made readable by the peer's
# user; HOME/.installed then holds STAMP. Maven's own repository is $PG_CDC_CACHE/m2.
maven_install() {  # name version pom property home stamp jar-glob...
  local name="$1" version="$2" pom="$3" property="$4" home="$5" stamp="$6"
  shift 6
  local libs="$home/libs" marker="$home/.installed"
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$stamp" ]; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
  command -v java >/dev/null || die "java not found (apt-get install openjdk-17-jre-headless)"
  log "resolving $name $version from Maven Central into $libs"
  mkdir -p "$home"
  local tmp="$home/libs.tmp.$$" mvn_log="$home/mvn.log"
  rm -rf "$tmp"
  if ! mvn -q -B -f "$pom" -Dmaven.repo.local="$PG_CDC_CACHE/m2" -D"$property=$version" \
      dependency:copy-dependencies -DoutputDirectory="$tmp" >"$mvn_log" 2>&1; then
    cat "$mvn_log" >&2
    rm -rf "$tmp"
    die "maven could not resolve $name $version"
  fi
  local jar
  for jar in "$@"; do
    compgen -G "$tmp/$jar" >/dev/null || { rm -rf "$tmp"; die "$jar missing after resolution (see $mvn_log)"; }
  done
  rm -rf "$libs"
  mv "$tmp" "$libs"
  chmod -R a+rX "$home"
  printf '%s\n' "$stamp" >"$marker"
  log "installed $(find "$libs" -name '*.jar' | wc -l) jars ($(du -sh "$libs" | cut -f1))"
}

# Sets run_as_prefix to a command prefix that runs what follows as user $1 when we are root (empty
# otherwise), with HOME at $run_dir. setpriv execs in place (no PAM session, no extra parent
# process), so a pid taken before it is the pid of the final program.
set_run_as_prefix() {  # user
  run_as_prefix=()
  if [ "$(id -u)" -eq 0 ] && [ "$1" != root ]; then
    run_as_prefix=(setpriv --reuid="$(id -u "$1")" --regid="$(id -g "$1")"
      --init-groups env HOME="$run_dir" USER="$1" LOGNAME="$1")
  fi
}

# Prints the pid in $pid_file if that process is alive and its command line matches the extended
# regular expression $1: checking the command line guards against a stale pid file whose pid was
# reused by another program.
pid_matching() {  # cmdline-pattern
  [ -f "$pid_file" ] || return 1
  local pid
  pid="$(cat "$pid_file" 2>/dev/null)" || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE "$1" || return 1
  echo "$pid"
}

port_open() {  # host port
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

wait_gone() {  # pid seconds -> true once the process has exited
  local pid="$1" deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

show_log_tail() {
  if [ -f "$log_file" ]; then
    echo "---- last 60 lines of $log_file ----" >&2
    tail -n 60 "$log_file" >&2
    echo "----" >&2
  fi
}

# Waits until the peer answers; otherwise prints the log tail, stops it and exits non-zero.
wait_ready() {  # pid
  local pid="$1" deadline=$((SECONDS + start_timeout))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      show_log_tail
      rm -f "$pid_file"
      die "$service_what (pid $pid) exited during startup"
    fi
    if service_answers; then
      return 0
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      show_log_tail
      cmd_stop >&2 || true
      die "$service_what did not answer on $service_where within ${start_timeout}s"
    fi
    sleep 0.2
  done
}

cmd_stop() {
  local pid
  if ! pid="$(service_pid)"; then
    rm -f "$pid_file"
    log "not running"
    return 0
  fi
  log "stopping (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_gone "$pid" "$stop_timeout"; then
    log "still running after ${stop_timeout}s; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || die "pid $pid survived SIGKILL"
  fi
  rm -f "$pid_file"
  log "stopped"
}

cmd_kill() {
  local pid
  if ! pid="$(service_pid)"; then
    rm -f "$pid_file"
    log "not running"
    return 0
  fi
  log "SIGKILL (pid $pid)"
  kill -KILL "$pid" 2>/dev/null || true
  wait_gone "$pid" 10 || die "pid $pid survived SIGKILL"
  rm -f "$pid_file"
}

cmd_status() {
  local pid
  if ! pid="$(service_pid)"; then
    log "stopped"
    return 3
  fi
  if service_answers; then
    log "running (pid $pid), answering on $service_where"
    return 0
  fi
  log "running (pid $pid), NOT answering on $service_where"
  return 1
}

cmd_logs() {
  [ -f "$log_file" ] || die "no log yet ($log_file)"
  if [ $# -eq 0 ]; then set -- -n 100; fi
  tail "$@" "$log_file"
}

# Prints the sourcing script's header comment (its usage) and exits 2.
usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
  exit 2
}
