#!/usr/bin/env bash
# Test control-plane environment. Either source it:
#     source tests/cluster/env.sh
# or evaluate its output:
#     eval "$(tests/cluster/env.sh)"
# It sets KUBECONFIG=$CACHE/cluster/kubeconfig and puts $CACHE/bin (kubectl,
# helm, kube-apiserver, etcd at the pinned versions) first on PATH, ahead of
# any system kubectl. It does not start anything: run tests/cluster/up.sh.
# (No `set -euo pipefail` at top level: that would change the sourcing shell.)

_sandbox_cluster_env() {
  local cache="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
  SANDBOX_CLUSTER_BIN="$cache/bin"
  SANDBOX_CLUSTER_KUBECONFIG="$cache/cluster/kubeconfig"
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  # sourced
  _sandbox_cluster_env
  export KUBECONFIG="$SANDBOX_CLUSTER_KUBECONFIG"
  case ":$PATH:" in
    *":$SANDBOX_CLUSTER_BIN:"*) ;;
    *) export PATH="$SANDBOX_CLUSTER_BIN:$PATH" ;;
  esac
  unset -f _sandbox_cluster_env
  unset SANDBOX_CLUSTER_BIN SANDBOX_CLUSTER_KUBECONFIG
else
  # executed: print shell code
  set -euo pipefail
  _sandbox_cluster_env
  printf 'export KUBECONFIG=%q\n' "$SANDBOX_CLUSTER_KUBECONFIG"
  # shellcheck disable=SC2016 # $PATH is meant to expand in the evaluating shell
  printf 'export PATH=%q:"$PATH"\n' "$SANDBOX_CLUSTER_BIN"
fi
