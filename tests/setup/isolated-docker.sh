#!/usr/bin/env bash
# A private Docker engine for tests that must stop and restart "the" engine without touching the
# shared one other tests run on in parallel.
#
#   isolated-docker.sh start  NAME   start (or reuse) engine NAME; prints its DOCKER_HOST
#   isolated-docker.sh stop   NAME   stop the daemon only: with --live-restore its containers
#                                    keep running and are picked up again by the next `start`
#   isolated-docker.sh socket NAME   print its DOCKER_HOST (unix:///run/sandbox-docker-NAME.sock)
#   isolated-docker.sh down   NAME   remove its containers, stop it, delete its bridge (the data
#                                    root with the imported base image is kept for next time)
#
# Engine NAME ([a-z0-9-], at most 20 characters) is a second dockerd with everything of its own:
#   --data-root  ${SANDBOX_CACHE:-~/.cache/sandbox-operator}/docker-NAME/data
#   --exec-root  /run/sandbox-docker-NAME      (its own managed containerd lives under it)
#   --pidfile    ${SANDBOX_CACHE}/docker-NAME/dockerd.pid, log dockerd.log next to it
#   -H           unix:///run/sandbox-docker-NAME.sock
#   -b           a bridge created here (sbx<8 hex>) with 10.213.X.1/24, X derived from NAME
#                and moved on when that /24 is already routed
#   --live-restore, --iptables=false (no NAT: published ports go through docker-proxy),
#   --cgroup-parent /sandbox-docker-NAME, an empty --config-file.
# `start` imports the base image (${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}) from the
# cached rootfs tarball that tests/setup/base-image.sh made, with CMD ["sleep","infinity"].
#
# Every command is idempotent, serialised per NAME with flock, and waits with a deadline
# (SANDBOX_DOCKER_TIMEOUT, default 60 s).
set -euo pipefail

log() { printf 'isolated-docker.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() { die "usage: $0 start|stop|socket|down NAME"; }
[ $# -eq 2 ] || usage
CMD="$1"
NAME="$2"
[[ "$NAME" =~ ^[a-z0-9][a-z0-9-]{0,19}$ ]] || die "NAME must match [a-z0-9][a-z0-9-]{0,19}, got '$NAME'"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_DIR="${SANDBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-operator}"
STATE="$CACHE_DIR/docker-$NAME"
DATA_ROOT="$STATE/data"
EXEC_ROOT="/run/sandbox-docker-$NAME"
SOCK="/run/sandbox-docker-$NAME.sock"
HOST="unix://$SOCK"
PID_FILE="$STATE/dockerd.pid"
LOG_FILE="$STATE/dockerd.log"
CONFIG_FILE="$STATE/daemon.json"
TIMEOUT="${SANDBOX_DOCKER_TIMEOUT:-60}"
TAG="${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}"
HASH="$(printf '%s' "$NAME" | sha256sum | cut -c1-8)"
BRIDGE="sbx$HASH"

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "not root and sudo is missing"
    SUDO=(sudo -n)
fi

dk() { docker -H "$HOST" "$@"; }
answers() { dk version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# The pid of our dockerd, if it runs.
daemon_pid() {
    local pid
    [ -s "$PID_FILE" ] || return 1
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -qa -- "$SOCK" "/proc/$pid/cmdline" 2>/dev/null \
        && printf '%s\n' "$pid"
}

# An unused 10.213.X.0/24 for the bridge: keep the one the bridge already has, else derive X from
# NAME and step on while that subnet is routed on this host.
bridge_cidr() {
    local have x i
    have="$(ip -4 -o addr show dev "$BRIDGE" 2>/dev/null | awk '{print $4}' | head -n1)"
    if [ -n "$have" ]; then printf '%s\n' "$have"; return 0; fi
    x=$(( 16#${HASH:0:2} ))
    for i in $(seq 0 255); do
        local cand=$(( (x + i) % 256 ))
        if ! ip -4 route show | grep -q "^10\.213\.$cand\.0/24 "; then
            printf '10.213.%s.1/24\n' "$cand"
            return 0
        fi
    done
    die "no free 10.213.X.0/24 for bridge $BRIDGE"
}

ensure_bridge() {
    if ! ip link show dev "$BRIDGE" >/dev/null 2>&1; then
        "${SUDO[@]}" ip link add name "$BRIDGE" type bridge 2>/dev/null \
            || ip link show dev "$BRIDGE" >/dev/null 2>&1 || die "cannot create bridge $BRIDGE"
    fi
    if [ -z "$(ip -4 -o addr show dev "$BRIDGE" 2>/dev/null)" ]; then
        "${SUDO[@]}" ip addr add "$(bridge_cidr)" dev "$BRIDGE"
    fi
    "${SUDO[@]}" ip link set dev "$BRIDGE" up
}

wait_answer() {
    local pid="$1" deadline=$((SECONDS + TIMEOUT)) from="$2"
    until answers; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -c +$((from + 1)) "$LOG_FILE" | tail -n 30 >&2 || true
            die "dockerd $NAME exited during startup (log above: $LOG_FILE)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -c +$((from + 1)) "$LOG_FILE" | tail -n 30 >&2 || true
            die "dockerd $NAME did not answer at $HOST within ${TIMEOUT}s (log: $LOG_FILE)"
        fi
        sleep 0.2
    done
}

# The rootfs tarball base-image.sh caches (empty when there is none yet).
cached_rootfs() {
    local f
    for f in "$CACHE_DIR"/rootfs-*.tar; do
        if [ -s "$f" ]; then printf '%s\n' "$f"; return 0; fi
    done
}

ensure_image() {
    if dk image inspect "$TAG" >/dev/null 2>&1; then return 0; fi
    local tarball
    tarball="$(cached_rootfs)"
    if [ -z "$tarball" ]; then
        # No cached rootfs yet: base-image.sh builds it (and the image on the shared engine).
        "$HERE/base-image.sh" >&2
        tarball="$(cached_rootfs)"
        [ -n "$tarball" ] || die "no cached rootfs tarball in $CACHE_DIR after base-image.sh"
    fi
    log "importing $tarball as $TAG into engine $NAME"
    dk import --change 'CMD ["sleep","infinity"]' --change 'LABEL sandboxes.dev/base=true' \
        "$tarball" "$TAG" >/dev/null || die "docker import into engine $NAME failed"
}

start_daemon() {
    local pid from
    if pid="$(daemon_pid)"; then
        wait_answer "$pid" "$(stat -c %s "$LOG_FILE" 2>/dev/null || echo 0)"
        return 0
    fi
    command -v dockerd >/dev/null 2>&1 || "$HERE/docker.sh"
    mkdir -p "$DATA_ROOT"
    "${SUDO[@]}" mkdir -p "$EXEC_ROOT"
    [ -s "$CONFIG_FILE" ] || printf '{}\n' >"$CONFIG_FILE"
    ensure_bridge
    # A socket left by a daemon that died uncleanly makes the new one fail to listen.
    "${SUDO[@]}" rm -f "$SOCK" "$PID_FILE"
    from="$(stat -c %s "$LOG_FILE" 2>/dev/null || echo 0)"
    printf '\n===== %s: isolated-docker.sh start %s =====\n' "$(date -Is)" "$NAME" >>"$LOG_FILE"
    # setsid: survives the caller; 9>&-: must not hold the lock forever.
    "${SUDO[@]}" setsid nohup dockerd \
        --config-file "$CONFIG_FILE" \
        --storage-driver overlay2 \
        --data-root "$DATA_ROOT" \
        --exec-root "$EXEC_ROOT" \
        --pidfile "$PID_FILE" \
        -H "$HOST" \
        -b "$BRIDGE" \
        --iptables=false \
        --ip-masq=false \
        --live-restore \
        --cgroup-parent "/sandbox-docker-$NAME" \
        </dev/null >>"$LOG_FILE" 2>&1 9>&- &
    pid=$!
    wait_answer "$pid" "$from"
}

do_start() {
    start_daemon
    ensure_image
    printf '%s\n' "$HOST"
}

do_stop() {
    local pid deadline
    pid="$(daemon_pid)" || return 0
    "${SUDO[@]}" kill -TERM "$pid"
    deadline=$((SECONDS + TIMEOUT))
    while kill -0 "$pid" 2>/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || die "dockerd $NAME (pid $pid) did not exit within ${TIMEOUT}s"
        sleep 0.1
    done
    # Nothing may answer on the socket any more.
    ! answers || die "something still answers at $HOST after stopping dockerd $NAME"
}

do_down() {
    local ids cpid deadline mp
    # Never started (or already taken down): nothing runs, nothing to remove.
    if [ -d "$DATA_ROOT" ] && { daemon_pid >/dev/null || [ -d "$EXEC_ROOT" ]; }; then
        # Containers outlive a stopped live-restore daemon: bring it back to remove them.
        start_daemon
        ids="$(dk ps -aq)"
        # shellcheck disable=SC2086
        [ -z "$ids" ] || dk rm -f -v $ids >/dev/null
        ids="$(dk volume ls -q)"
        # shellcheck disable=SC2086
        [ -z "$ids" ] || dk volume rm -f $ids >/dev/null
    fi
    do_stop
    # The managed containerd normally exits with dockerd; make sure it is gone.
    if [ -s "$EXEC_ROOT/containerd/containerd.pid" ]; then
        cpid="$(cat "$EXEC_ROOT/containerd/containerd.pid")"
        if [ -n "$cpid" ] && kill -0 "$cpid" 2>/dev/null && grep -qa containerd "/proc/$cpid/cmdline"; then
            "${SUDO[@]}" kill -TERM "$cpid"
            deadline=$((SECONDS + TIMEOUT))
            while kill -0 "$cpid" 2>/dev/null; do
                [ "$SECONDS" -lt "$deadline" ] || die "containerd of $NAME (pid $cpid) did not exit"
                sleep 0.1
            done
        fi
    fi
    # What dockerd leaves mounted: network namespaces under the exec root, the data root's
    # private bind mount. The data itself (the imported image) is kept for the next start.
    while read -r mp; do
        "${SUDO[@]}" umount -l "$mp" 2>/dev/null || true
    done < <(findmnt -rn -o TARGET | grep -E "^($EXEC_ROOT|$DATA_ROOT)(/|\$)" | sort -r)
    "${SUDO[@]}" rm -rf --one-file-system "$EXEC_ROOT"
    if ip link show dev "$BRIDGE" >/dev/null 2>&1; then
        "${SUDO[@]}" ip link del dev "$BRIDGE"
    fi
}

case "$CMD" in
    socket) printf '%s\n' "$HOST"; exit 0 ;;
    start | stop | down) ;;
    *) usage ;;
esac

mkdir -p "$STATE"
exec 9>"$STATE/lock"
flock -w "$TIMEOUT" 9 || die "timed out waiting for lock $STATE/lock"
case "$CMD" in
    start) do_start ;;
    stop) do_stop ;;
    down) do_down ;;
esac
