# Process helpers shared by tests/cluster/up.sh and tests/setup/node.sh (sourced).
# A daemon <name> keeps its pid in $DIR/<name>.pid and its log in $DIR/<name>.log.
# A pid counts as the daemon's only while /proc/<pid>/comm is still the program's
# name (guards against pid reuse); the program is <name> unless given.
# The caller defines log(), die() and TIMEOUT (seconds, for wait_for).

# running_pid <name> [program]: the daemon's pid if it is running, else empty.
running_pid() {
  local pid comm="${2:-$1}"
  pid="$(cat "$DIR/$1.pid" 2>/dev/null || true)"
  [ -n "$pid" ] || return 0
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${comm:0:15}" ]; then echo "$pid"; fi
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_for <name> <check-fn> [program]: poll until check succeeds, the daemon
# dies, or TIMEOUT passes; on failure show the end of its log and exit 1.
wait_for() {
  local name="$1" check="$2" comm="${3:-$1}" deadline=$((SECONDS + TIMEOUT))
  until "$check"; do
    if [ -z "$(running_pid "$name" "$comm")" ]; then
      log "$name exited; last lines of $DIR/$name.log:"
      tail -n 30 "$DIR/$name.log" >&2 || true
      exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "$name not ready after ${TIMEOUT}s; last lines of $DIR/$name.log:"
      tail -n 30 "$DIR/$name.log" >&2 || true
      exit 1
    fi
    sleep 0.2
  done
}

# stop_pid <name> <pid>: TERM, wait up to 30s, then KILL; removes the pidfile.
stop_pid() {
  local name="$1" pid="$2" deadline=$((SECONDS + 30))
  kill -TERM "$pid" 2>/dev/null || return 0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then kill -KILL "$pid" 2>/dev/null || true; break; fi
    sleep 0.1
  done
  rm -f "$DIR/$name.pid"
}

# start <name> <binary> args...: detached in its own session, no inherited
# stdio or lock fds (7, 9), log to $DIR/<name>.log, pid to $DIR/<name>.pid.
start() {
  local name="$1"; shift
  local comm pid deadline=$((SECONDS + 10))
  comm="$(basename "$1")"
  # No job control in scripts, so the background child is not a process-group
  # leader and setsid(1) execs in place: $! is the daemon's own pid.
  setsid "$@" </dev/null >>"$DIR/$name.log" 2>&1 7>&- 9>&- &
  pid=$!
  disown
  echo "$pid" >"$DIR/$name.pid"
  # until the child has exec'd, /proc/<pid>/comm still says bash/setsid
  until [ -n "$(running_pid "$name" "$comm")" ]; do
    kill -0 "$pid" 2>/dev/null || break
    [ "$SECONDS" -lt "$deadline" ] || die "$name (pid $pid) did not start"
    sleep 0.05
  done
}
