#!/usr/bin/env bash
# Stop the test control plane started by up.sh (by pidfile; only processes
# whose pid still belongs to that program are signalled).
#
#   tests/cluster/down.sh           stop kube-apiserver and etcd, keep data
#   tests/cluster/down.sh --wipe    also delete the etcd data (next up.sh starts empty)
#
# Certificates, tokens and the kubeconfig in $CACHE/cluster are kept either way.
set -euo pipefail

CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
DIR="$CACHE/cluster"
wipe=0
case "${1:-}" in
  --wipe) wipe=1 ;;
  "") ;;
  *) echo "usage: $0 [--wipe]" >&2; exit 2 ;;
esac

log() { echo "down.sh: $*" >&2; }

[ -d "$DIR" ] || { log "nothing to stop ($DIR does not exist)"; exit 0; }
exec 9>"$DIR/.lock"
flock 9

stop() { # name: TERM, wait up to 30s for exit, then KILL
  local name="$1" pid deadline
  pid="$(cat "$DIR/$name.pid" 2>/dev/null || true)"
  if [ -z "$pid" ]; then log "$name: no pidfile"; return 0; fi
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "${name:0:15}" ]; then
    log "$name: pid $pid is not running (stale pidfile)"
    rm -f "$DIR/$name.pid"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "$name: pid $pid ignored SIGTERM for 30s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
  rm -f "$DIR/$name.pid"
  log "$name: stopped (pid $pid)"
}

stop kube-apiserver
stop etcd
if [ "$wipe" = 1 ]; then
  rm -rf "$DIR/etcd"
  log "wiped etcd data ($DIR/etcd)"
fi
