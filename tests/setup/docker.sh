#!/usr/bin/env bash
# Make sure a Docker engine answers `docker info`.
#
# Idempotent and fast when already done:
#   1. `docker info` answers (DOCKER_HOST respected)  -> exit 0 immediately.
#   2. otherwise install Debian's docker.io (+ iptables) with apt-get if dockerd is missing,
#   3. start dockerd in the background (own session, survives this script), storage driver
#      overlay2, log + pidfile in ${XDG_CACHE_HOME:-~/.cache}/sandbox-operator/,
#   4. poll `docker info` until it answers or SANDBOX_DOCKER_TIMEOUT (default 60 s) passes.
#
# Env:
#   DOCKER_HOST              if set to unix:///path, dockerd is started listening there;
#                            a tcp:// or ssh:// host is never started by this script.
#   SANDBOX_DOCKER_TIMEOUT   seconds to wait for the daemon (default 60).
#   SANDBOX_DOCKERD_ARGS     extra arguments for dockerd (word-split), e.g. "--iptables=false".
set -euo pipefail

log() { printf 'docker.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-operator"
LOG_FILE="$CACHE_DIR/dockerd.log"
PID_FILE="$CACHE_DIR/dockerd.pid"

# Answering, and not a dockerd of ours started (by an older version of this script) without
# the address pools below: every test namespace takes a network of its own now, and the
# engine's built-in pools hold about thirty. `--bip` keeps docker0 (where s3.sh listens) at
# the engine's usual address, outside those pools.
pools_ok() {
    local pid
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    local args
    args="$(tr '\0' ' ' <"/proc/$pid/cmdline")"
    [[ "$args" == *--default-address-pool* && "$args" == *--bip* ]]
}
docker_ok() { docker info >/dev/null 2>&1 && pools_ok; }

# Fast path: nothing to do.
if command -v docker >/dev/null 2>&1 && docker_ok; then
    exit 0
fi

LOCK_FILE="$CACHE_DIR/docker.lock"
TIMEOUT="${SANDBOX_DOCKER_TIMEOUT:-60}"
mkdir -p "$CACHE_DIR"

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "not root and sudo is missing: cannot install or start dockerd"
    SUDO=(sudo -n)
fi

# Where should the daemon listen?
DOCKERD_HOST_ARGS=()
if [ -n "${DOCKER_HOST:-}" ]; then
    case "$DOCKER_HOST" in
        unix://*) DOCKERD_HOST_ARGS=(-H "$DOCKER_HOST") ;;
        *) die "DOCKER_HOST=$DOCKER_HOST does not answer 'docker info' and is not a local unix socket; start that engine yourself or unset DOCKER_HOST" ;;
    esac
fi

# Serialise concurrent callers (parallel test setups) so only one starts dockerd.
# While waiting, keep checking: the lock holder may bring the engine up meanwhile.
exec 9>"$LOCK_FILE"
lock_deadline=$((SECONDS + TIMEOUT))
until flock -n 9; do
    if command -v docker >/dev/null 2>&1 && docker_ok; then exit 0; fi
    [ "$SECONDS" -lt "$lock_deadline" ] \
        || die "timed out after ${TIMEOUT}s waiting for lock $LOCK_FILE (another docker.sh stuck?)"
    sleep 0.2
done
# Someone else may have started it just before we got the lock.
if command -v docker >/dev/null 2>&1 && docker_ok; then
    exit 0
fi

apt_wait_lock() {
    # Another apt-get/dpkg (e.g. a provisioning job) may be running: wait for it, don't race it.
    local deadline=$((SECONDS + 600))
    while pgrep -x apt-get >/dev/null 2>&1 || pgrep -x dpkg >/dev/null 2>&1 \
        || { command -v fuser >/dev/null 2>&1 && fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1; }; do
        [ "$SECONDS" -lt "$deadline" ] || die "apt-get/dpkg still busy after 600 s"
        log "waiting for another apt-get/dpkg to finish..."
        sleep 2
    done
}

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1 \
    || ! command -v iptables >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "dockerd is not installed and apt-get is unavailable"
    apt_wait_lock
    # The waited-for apt run may have installed it.
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1 \
        || ! command -v iptables >/dev/null 2>&1; then
        log "installing docker.io and iptables with apt-get..."
        export DEBIAN_FRONTEND=noninteractive
        if ! "${SUDO[@]}" apt-get install -y --no-install-recommends docker.io iptables >>"$CACHE_DIR/apt.log" 2>&1; then
            log "apt-get install failed; running apt-get update once and retrying"
            "${SUDO[@]}" apt-get update >>"$CACHE_DIR/apt.log" 2>&1 || die "apt-get update failed (see $CACHE_DIR/apt.log)"
            "${SUDO[@]}" apt-get install -y --no-install-recommends docker.io iptables >>"$CACHE_DIR/apt.log" 2>&1 \
                || { tail -n 20 "$CACHE_DIR/apt.log" >&2; die "apt-get install docker.io iptables failed (see $CACHE_DIR/apt.log)"; }
        fi
    fi
fi
command -v dockerd >/dev/null 2>&1 || die "dockerd still not found on PATH after installation"

# Is a dockerd we started earlier still alive (e.g. still starting up)? Then just wait for it.
running_pid=""
if [ -s "$PID_FILE" ]; then
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null; then
        running_pid="$pid"
        log "dockerd (pid $pid) already running, waiting for it to answer"
    fi
fi

# Ours, but without the address pools (see pools_ok): restart it once (its containers are test
# leftovers; the set-up scripts recreate what they need).
if [ -n "$running_pid" ] && ! pools_ok; then
    log "restarting dockerd (pid $running_pid): it lacks --default-address-pool or --bip"
    "${SUDO[@]}" kill "$running_pid" || true
    stop_deadline=$((SECONDS + 60))
    while kill -0 "$running_pid" 2>/dev/null && [ "$SECONDS" -lt "$stop_deadline" ]; do sleep 0.2; done
    kill -0 "$running_pid" 2>/dev/null && die "dockerd (pid $running_pid) did not stop within 60s"
    running_pid=""
fi

# A dockerd we did not start (systemd, another script, another DOCKER_HOST): never start a
# second one next to it (they would fight over /var/lib/docker and docker0); wait for it instead.
if [ -z "$running_pid" ]; then
    other="$(pgrep -x dockerd | head -n1 || true)"
    if [ -n "$other" ]; then
        running_pid="$other"
        log "a dockerd (pid $other) is already running but not answering yet; waiting for it"
    fi
fi

log_start=0
if [ -z "$running_pid" ]; then
    log_start=$(stat -c %s "$LOG_FILE" 2>/dev/null || echo 0)
    # A stale default pidfile from a dead daemon makes dockerd refuse to start; ours is explicit,
    # but clean both when their process is gone.
    for f in "$PID_FILE" /var/run/docker.pid; do
        if [ -s "$f" ]; then
            p="$(cat "$f" 2>/dev/null || true)"
            if [ -z "$p" ] || ! kill -0 "$p" 2>/dev/null; then "${SUDO[@]}" rm -f "$f"; fi
        fi
    done

    # Only cgroup v1 "hybrid" hosts without systemd: dockerd handles it with cgroupfs.
    extra=()
    if [ -n "${SANDBOX_DOCKERD_ARGS:-}" ]; then
        # shellcheck disable=SC2206
        extra=($SANDBOX_DOCKERD_ARGS)
    fi
    log "starting dockerd (log: $LOG_FILE)"
    printf '\n===== %s: docker.sh starting dockerd =====\n' "$(date -Is)" >>"$LOG_FILE"
    # setsid: own session/process group, so it outlives this script and the caller's job control.
    # 9>&-: the daemon must not inherit (and so hold forever) the lock descriptor.
    "${SUDO[@]}" setsid nohup dockerd \
        --storage-driver overlay2 \
        --pidfile "$PID_FILE" \
        --bip 172.17.0.1/16 \
        --default-address-pool base=10.192.0.0/12,size=24 \
        "${DOCKERD_HOST_ARGS[@]}" \
        "${extra[@]}" \
        </dev/null >>"$LOG_FILE" 2>&1 9>&- &
    running_pid=$!
fi

deadline=$((SECONDS + TIMEOUT))
until docker_ok; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        log "dockerd (pid $running_pid) did not answer 'docker info' at ${DOCKER_HOST:-the default socket} within ${TIMEOUT}s; last lines of $LOG_FILE:"
        tail -c +$((log_start + 1)) "$LOG_FILE" | tail -n 30 >&2 || true
        die "docker engine not available"
    fi
    # If the daemon died, say so now instead of waiting for the deadline.
    if ! kill -0 "$running_pid" 2>/dev/null && ! pgrep -x dockerd >/dev/null 2>&1; then
        log "dockerd exited during startup; last lines of $LOG_FILE:"
        tail -c +$((log_start + 1)) "$LOG_FILE" | tail -n 30 >&2 || true
        die "dockerd failed to start (iptables/cgroup/storage problems show up in the log above)"
    fi
    sleep 0.2
done
log "docker engine is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
