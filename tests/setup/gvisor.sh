#!/usr/bin/env bash
# Register gVisor (`runsc`) with the test Docker engine, idempotently, without restarting it.
#
#   1. install Debian's runsc package if /usr/bin/runsc is missing;
#   2. install the wrapper /usr/local/libexec/sandbox-operator/runsc (see below);
#   3. merge `runtimes.runsc` = {path: the wrapper, runtimeArgs: ["--platform=ptrace"]} into
#      the engine's daemon.json (SANDBOX_DOCKER_CONFIG, default /etc/docker/daemon.json),
#      keeping every other key;
#   4. only when that file changed: SIGHUP dockerd, which reloads `runtimes` live — no
#      restart, so the containers other tests run keep running — and wait until
#      `docker info` lists the runtime.
# When everything is in place this takes a few milliseconds.
#
# Why the wrapper: Debian's runsc (2022-12 build) decides whether it was handed the host's
# network namespace by checking that /proc/sys/net/core/rmem_default exists, which was true
# only in the initial namespace on older kernels. Newer kernels show that file in every
# network namespace, so runsc refuses every Docker network ("cannot run with network enabled
# in root network namespace"). The wrapper runs runsc in a private mount namespace whose
# /proc/sys is a tmpfs holding only kernel/, vm/ and fs/ (bind mounts of the real ones):
# the probe then answers "not the root namespace" and networking works. Only runsc's own
# view of /proc/sys changes; the sandbox's kernel is gVisor's and mounts its own /proc.
set -euo pipefail

log() { printf 'gvisor.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

CONFIG="${SANDBOX_DOCKER_CONFIG:-/etc/docker/daemon.json}"
WRAPPER=/usr/local/libexec/sandbox-operator/runsc
CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-operator"
PID_FILE="$CACHE_DIR/dockerd.pid"
TIMEOUT="${SANDBOX_DOCKER_TIMEOUT:-60}"

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "not root and sudo is missing"
    SUDO=(sudo -n)
fi

docker info >/dev/null 2>&1 || die "the Docker engine does not answer; run tests/setup/docker.sh first"

if [ ! -x /usr/bin/runsc ]; then
    log "installing Debian's runsc with apt-get..."
    export DEBIAN_FRONTEND=noninteractive
    mkdir -p "$CACHE_DIR"
    "${SUDO[@]}" apt-get install -y --no-install-recommends runsc >>"$CACHE_DIR/apt.log" 2>&1 \
        || { "${SUDO[@]}" apt-get update >>"$CACHE_DIR/apt.log" 2>&1 \
             && "${SUDO[@]}" apt-get install -y --no-install-recommends runsc >>"$CACHE_DIR/apt.log" 2>&1; } \
        || die "apt-get install runsc failed (see $CACHE_DIR/apt.log)"
fi

wrapper_text='#!/bin/sh
# Installed by tests/setup/gvisor.sh (sandbox-operator): runs runsc with a /proc/sys that has
# no net/ directory, so runsc does not mistake a container network namespace for the host'"'"'s.
exec unshare --mount --propagation slave sh -c '"'"'
set -e
keep=$(mktemp -d /run/sbx-runsc.XXXXXX)
mount --bind /proc/sys "$keep"
mount -t tmpfs -o size=4k,mode=0755 sbx-procsys /proc/sys
for d in kernel vm fs; do mkdir /proc/sys/$d; mount --rbind "$keep/$d" /proc/sys/$d; done
umount -l "$keep"; rmdir "$keep"
exec /usr/bin/runsc "$@"'"'"' runsc "$@"
'
if [ "$(cat "$WRAPPER" 2>/dev/null || true)" != "$(printf '%s' "$wrapper_text")" ]; then
    "${SUDO[@]}" mkdir -p "$(dirname "$WRAPPER")"
    printf '%s' "$wrapper_text" | "${SUDO[@]}" tee "$WRAPPER.new" >/dev/null
    "${SUDO[@]}" chmod 755 "$WRAPPER.new"
    "${SUDO[@]}" mv -f "$WRAPPER.new" "$WRAPPER"
    log "installed $WRAPPER"
fi

# Merge the runtime into daemon.json; prints "changed" when the file was rewritten.
changed="$("${SUDO[@]}" python3 - "$CONFIG" "$WRAPPER" <<'PY'
import json, os, sys
path, wrapper = sys.argv[1], sys.argv[2]
try:
    with open(path) as f:
        config = json.load(f)
except FileNotFoundError:
    config = {}
want = {"path": wrapper, "runtimeArgs": ["--platform=ptrace"]}
if config.get("runtimes", {}).get("runsc") != want:
    config.setdefault("runtimes", {})["runsc"] = want
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".new", "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    os.replace(path + ".new", path)
    print("changed")
PY
)"

has_runtime() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

if [ "$changed" = "changed" ] || ! has_runtime; then
    pid=""
    [ -s "$PID_FILE" ] && pid="$(cat "$PID_FILE")"
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then pid="$(pgrep -xo dockerd || true)"; fi
    [ -n "$pid" ] || die "no dockerd to reload (the engine answers, but from elsewhere?)"
    log "reloading dockerd (pid $pid) with SIGHUP to pick up the runsc runtime"
    "${SUDO[@]}" kill -HUP "$pid"
    deadline=$((SECONDS + TIMEOUT))
    until has_runtime; do
        [ "$SECONDS" -lt "$deadline" ] || die "dockerd did not list the runsc runtime within ${TIMEOUT}s (is $CONFIG the file it reads?)"
        sleep 0.2
    done
fi
