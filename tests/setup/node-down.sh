#!/usr/bin/env bash
# Stop the test node(s) started by tests/setup/node.sh: kubelets, the pods'
# containers, each node's containerd, kube-proxy, kube-router, kube-scheduler and
# kube-controller-manager
# (by pidfile; only processes whose pid still belongs to that program).
# The control plane of tests/cluster/up.sh keeps running.
#
#   tests/setup/node-down.sh          stop; keep images, node state and Node objects
#   tests/setup/node-down.sh --wipe   also delete the Node objects, each node's
#                                     containerd root and kubelet dir, its bridge
#                                     and cgroup parent (next node.sh starts afresh)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cluster="$(cd "$here/../cluster" && pwd)"
CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
BIN="$CACHE/bin"
DIR="$CACHE/node"
RUN="/run/sandbox-operator/node"
TIMEOUT=30
wipe=0
case "${1:-}" in
  --wipe) wipe=1 ;;
  "") ;;
  *) echo "usage: $0 [--wipe]" >&2; exit 2 ;;
esac

log() { echo "node-down.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ -d "$DIR" ] || { log "nothing to stop ($DIR does not exist)"; exit 0; }
# shellcheck source=../cluster/daemon.sh
source "$cluster/daemon.sh"
exec 9>"$DIR/.lock"
flock 9

stop() { # name program
  local pid
  pid="$(running_pid "$1" "$2")"
  if [ -z "$pid" ]; then rm -f "$DIR/$1.pid"; return 0; fi
  stop_pid "$1" "$pid"
  log "$1: stopped (pid $pid)"
}

# Every node directory node.sh made, whatever SANDBOX_NODE_COUNT was then.
nodes=()
for d in "$DIR"/sbx-node-*/; do [ -d "$d" ] && nodes+=("$(basename "$d")"); done

for name in "${nodes[@]}"; do stop "kubelet-$name" kubelet; done
for name in "${nodes[@]}"; do
  sock="$RUN/$name/containerd.sock"
  if [ -n "$(running_pid "containerd-$name" containerd)" ]; then
    # The pods' processes outlive containerd (each has its own shim): kill them.
    ctr_=(ctr --address "$sock" --namespace k8s.io)
    for task in $("${ctr_[@]}" tasks ls -q 2>/dev/null); do
      "${ctr_[@]}" tasks delete --force "$task" >/dev/null 2>&1 || log "$name: could not remove task $task"
    done
  fi
  stop "containerd-$name" containerd
done
stop kube-proxy kube-proxy
stop kube-router kube-router
stop kube-scheduler kube-scheduler
stop kube-controller-manager kube-controller-manager

[ "$wipe" = 1 ] || exit 0

# kube-proxy's iptables rules (Services) are host-wide: remove them.
if [ -x "$BIN/kube-proxy" ]; then
  "$BIN/kube-proxy" --cleanup --proxy-mode=iptables >/dev/null 2>&1 || log "kube-proxy --cleanup failed"
fi

for name in "${nodes[@]}"; do
  if [ -f "$CACHE/cluster/kubeconfig" ] && [ -x "$BIN/kubectl" ]; then
    "$BIN/kubectl" --kubeconfig "$CACHE/cluster/kubeconfig" delete node "$name" \
      --ignore-not-found --wait=false >/dev/null 2>&1 || log "$name: could not delete the Node object"
  fi
  # kubelet and containerd leave mounts (volumes, rootfs, its own bind mount): deepest first.
  awk -v a="$DIR/$name/" -v b="$RUN/$name/" 'index($2, a) == 1 || index($2, b) == 1 { print $2 }' \
    /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "${DIR:?}/$name" "${RUN:?}/$name"
  i="${name#sbx-node-}"
  ! ip link show "sbxbr$i" >/dev/null 2>&1 || ip link delete "sbxbr$i" || true
  for d in /sys/fs/cgroup/*/"$name"; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  log "$name: wiped"
done
