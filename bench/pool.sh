#!/usr/bin/env bash
# Warm-pool bench (issue: sandboxes in tens of milliseconds). Runs its own operator (instance
# `bench-pool`, release build) on Docker and then on the Kubernetes provider (the test
# cluster's kubelet nodes), measures with bench/pool.py, and removes what it made.
#
# Figures (printed, appended to target/bench/results.md; raw data target/bench/pool-*.json;
# plot target/bench/plots/claims.png, the claim latency CDF against the cold create):
#   claim -> Ready from a pool of P, median and p99, N claims one after another   (<= 30 / 100 ms)
#   the claim median against `docker run -d`'s, same run                          (>= 8x faster)
#   B claims at once from a pool of B -> all Ready, against B `docker run -d`
#     at the same concurrency                                                     (<= 0.2x)
#   Kubernetes provider: warm claim -> Ready, median                              (<= 50 ms)
#
# Env: BENCH_POOL_P [50], BENCH_POOL_N [50], BENCH_POOL_COLD_N [20], BENCH_POOL_BURST [200],
#      BENCH_POOL_K8S_N [20], BENCH_CONCURRENCY [32], BENCH_POOL_FIGURES ["claims burst k8s"].
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUT="$REPO/target/bench"
P=${BENCH_POOL_P:-50}
N=${BENCH_POOL_N:-50}
COLD_N=${BENCH_POOL_COLD_N:-20}
BURST=${BENCH_POOL_BURST:-200}
K8S_N=${BENCH_POOL_K8S_N:-20}
CONC=${BENCH_CONCURRENCY:-32}
FIGURES=${BENCH_POOL_FIGURES:-claims burst k8s}
NS=sandbox-bench-pool
PODS_NS=sandbox-bench-pool-pods
INSTANCE=bench-pool
IMAGE="${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}"
PY=(python3 "$REPO/bench/pool.py")
OP_PID=""

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf 'bench/pool: ERROR: %s\n' "$*" >&2; exit 1; }
has() { [[ " $FIGURES " == *" $1 "* ]]; }
mkdir -p "$OUT"

# shellcheck source=/dev/null
source "$REPO/tests/cluster/env.sh"
bash tests/setup/docker.sh
bash tests/setup/base-image.sh
eval "$(bash tests/cluster/up.sh)"
kubectl apply --server-side --force-conflicts --field-manager=sandbox-operator-bench -f crds/ >/dev/null
# As a cluster-wide chart install: the cleanup finalizer comes with admission.
bash tests/cluster/finalizer-policy.sh
for ns in "$NS" "$PODS_NS"; do kubectl get ns "$ns" >/dev/null 2>&1 || kubectl create ns "$ns" >/dev/null; done
# BENCH_BIN: an already built release binary (skips the build).
BIN="${BENCH_BIN:-}"
if [ -z "$BIN" ]; then
  cargo build --release --bin sandbox-operator
  BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/sandbox-operator"
fi

# start_operator NAME PROVIDER_YAML
start_operator() {
  local cfg="$OUT/operator-pool-$1.yaml" logf="$OUT/operator-pool-$1.log" metrics deadline
  printf 'instance: %s\nresyncSecs: 600\nproviderConcurrency: 32\nopenImages: ["%s"]\nproviders:\n%s\n' \
    "$INSTANCE" "$IMAGE" "$2" >"$cfg"
  metrics="127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  POD_NAMESPACE="$NS" NO_COLOR=1 "$BIN" run --config "$cfg" --namespace "$NS" --metrics-addr "$metrics" \
    --concurrency "$CONC" </dev/null >"$logf" 2>&1 &
  OP_PID=$!
  deadline=$((SECONDS + 60))
  until curl -sf --max-time 2 "http://$metrics/metrics" 2>/dev/null | grep -q '^sandbox_operator_leader 1'; do
    kill -0 "$OP_PID" 2>/dev/null || { tail -20 "$logf" >&2; die "operator exited (log $logf)"; }
    [ "$SECONDS" -lt "$deadline" ] || die "operator not leading after 60 s (log $logf)"
    sleep 0.2
  done
  log "operator $1 leading (log $logf)"
}

# Deletes the pools and Sandboxes this bench made, with the operator still running, then stops it.
stop_operator() {
  [ -n "$OP_PID" ] || return 0
  "${PY[@]}" cleanup --namespace "$NS" || true
  kubectl delete sbx --all -n "$NS" --timeout=300s >/dev/null 2>&1 || true
  # A pool's finalizer goes once its claimed members' Sandboxes have: let the operator see it.
  kubectl wait --for=delete sbxwp --all -n "$NS" --timeout=120s >/dev/null 2>&1 || true
  kill -TERM "$OP_PID" 2>/dev/null || true
  wait "$OP_PID" 2>/dev/null || true
  OP_PID=""
}
# The machine is left as it was found: no raw containers, and not the bench's namespaces.
trap 'stop_operator; docker ps -aq --filter label=sandboxes.dev/managed-by=bench-pool-raw | xargs -r docker rm -f >/dev/null;
  kubectl delete ns "$NS" "$PODS_NS" --ignore-not-found --timeout=120s >/dev/null 2>&1 || true' EXIT

DOCKER_PROVIDER='  - name: docker
    type: docker'
if has claims || has burst; then
  start_operator docker "$DOCKER_PROVIDER"
  ! has claims || "${PY[@]}" claims --namespace "$NS" --pool-size "$P" --n "$N" --cold-n "$COLD_N" \
    --out "$OUT/pool-claims.json"
  # The claims' Sandboxes go first: every sandbox of a namespace shares its network, whose
  # addresses (253 with the test set-up's pools) would not hold them and the burst's 200.
  if has claims && has burst; then
    "${PY[@]}" cleanup --namespace "$NS"
    kubectl delete sbx --all -n "$NS" --timeout=300s >/dev/null
  fi
  ! has burst || "${PY[@]}" burst --namespace "$NS" --n "$BURST" --concurrency "$CONC" --out "$OUT/pool-burst.json"
  stop_operator
fi
if has k8s; then
  # The kubelet nodes the Pods run on (idempotent: running nodes are left alone).
  bash tests/setup/node.sh
  # Pods need the namespace's default ServiceAccount, which the controller-manager makes.
  deadline=$((SECONDS + 60))
  until kubectl get sa default -n "$PODS_NS" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "no ServiceAccount default in $PODS_NS after 60 s"
    sleep 0.5
  done
  start_operator k8s "  - name: k8s
    type: kubernetes
    kubernetes:
      kubeconfig: $KUBECONFIG
      namespace: $PODS_NS
      runtimeClassName: runc"
  # No cold creates here: the claimed members and the refilled pool already take the test
  # nodes' CPU (a cold Pod would wait, unschedulable, for one of them to go).
  "${PY[@]}" claims --namespace "$NS" --provider k8s --pool-size "$K8S_N" --n "$K8S_N" --cold-n 0 \
    --out "$OUT/pool-k8s.json"
  stop_operator
fi
# The plot needs matplotlib: the bench's own virtualenv (as bench/run.sh makes it).
VENV="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}/bench-venv"
if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check 'matplotlib>=3.8,<4'
fi
"$VENV/bin/python" bench/pool_report.py "$OUT"
