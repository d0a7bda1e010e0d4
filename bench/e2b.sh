#!/usr/bin/env bash
# E2B bench: the official Python SDK's `Sandbox.create()` + first `commands.run("true")`
# through the operator's E2B API on Docker, against `docker run -d` + `docker exec true` of the
# same image, interleaved in one run (target <= 1.5x); and the same create naming a
# SandboxWarmPool, a claim (target <= 100 ms at the median). Runs its own operator (instance
# `bench-e2b`, release build) and removes what it made.
#
# Env: BENCH_E2B_N [20]. Results: printed, appended to target/bench/results.md, raw data
# target/bench/e2b.json, operator log target/bench/operator-e2b.log.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUT="$REPO/target/bench"
N=${BENCH_E2B_N:-20}
NS=sandbox-bench-e2b
IMAGE="${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}"
CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
mkdir -p "$OUT"
# shellcheck source=/dev/null
source tests/cluster/env.sh
bash tests/setup/docker.sh
bash tests/setup/base-image.sh
eval "$(bash tests/cluster/up.sh)"
bash tests/setup/e2b-py.sh >/dev/null
SDK_PY="$CACHE/e2b-py/$(sed -n 's/^E2B_PY_VERSION=//p' tests/setup/e2b-py.sh)/bin/python"
kubectl apply --server-side --force-conflicts --field-manager=sandbox-operator-bench -f crds/ >/dev/null
# As a cluster-wide chart install: the cleanup finalizer comes with admission.
bash tests/cluster/finalizer-policy.sh
kubectl get ns "$NS" >/dev/null 2>&1 || kubectl create ns "$NS" >/dev/null
# BENCH_BIN: an already built release binary (skips the build).
BIN="${BENCH_BIN:-}"
if [ -z "$BIN" ]; then
  cargo build --release --bin sandbox-operator
  BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/sandbox-operator"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
API_PORT=$(free_port)
METRICS="127.0.0.1:$(free_port)"
KEY="e2b_bench_$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
cat >"$OUT/operator-e2b.yaml" <<YAML
instance: bench-e2b
resyncSecs: 600
openImages: ["$IMAGE"]
providers:
  - name: docker
    type: docker
e2bApi:
  enabled: true
  address: 127.0.0.1:$API_PORT
  domain: e2b.bench
  templates:
    base: "$IMAGE"
YAML
kubectl apply -n "$NS" -f - >/dev/null <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: bench-agent}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: bench-agent}
rules:
  - apiGroups: [sandboxes.dev]
    resources: [sandboxes, sandboxtemplates, sandboxwarmpools]
    verbs: [get, list, watch, create, patch, update, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bench-agent}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: bench-agent}
subjects: [{kind: ServiceAccount, name: bench-agent, namespace: $NS}]
---
apiVersion: v1
kind: Secret
metadata: {name: bench-e2b-key}
type: sandboxes.dev/e2b-api-key
stringData: {apiKey: $KEY, serviceAccount: bench-agent}
---
apiVersion: sandboxes.dev/v1alpha1
kind: SandboxWarmPool
metadata: {name: bench-e2b}
spec:
  replicas: 5
  template: {provider: docker, image: "$IMAGE", command: [perl, -e, "\$SIG{TERM} = sub { exit 0 }; sleep"]}
YAML
POD_NAMESPACE="$NS" NO_COLOR=1 "$BIN" run --config "$OUT/operator-e2b.yaml" --namespace "$NS" \
  --metrics-addr "$METRICS" </dev/null >"$OUT/operator-e2b.log" 2>&1 &
OP_PID=$!
trap 'kubectl delete sbx,sbxwp --all -n "$NS" --timeout=120s >/dev/null 2>&1 || true; kill "$OP_PID" 2>/dev/null; wait "$OP_PID" 2>/dev/null; docker ps -aq --filter label=sandboxes.dev/managed-by=bench-e2b-raw | xargs -r docker rm -f >/dev/null' EXIT
deadline=$((SECONDS + 60))
until curl -sf --max-time 2 "http://$METRICS/metrics" 2>/dev/null | grep -q '^sandbox_operator_leader 1' &&
  curl -s --max-time 2 -o /dev/null "http://127.0.0.1:$API_PORT/health"; do
  kill -0 "$OP_PID" 2>/dev/null || { tail -20 "$OUT/operator-e2b.log" >&2; exit 1; }
  [ "$SECONDS" -lt "$deadline" ] || { echo "bench/e2b: operator not up after 60 s" >&2; exit 1; }
  sleep 0.2
done
kubectl wait -n "$NS" --for=jsonpath='{.status.readyReplicas}'=5 sbxwp/bench-e2b --timeout=300s >/dev/null

E2B_API_URL="http://127.0.0.1:$API_PORT" E2B_SANDBOX_URL="http://127.0.0.1:$API_PORT" E2B_DOMAIN=e2b.bench \
  E2B_API_KEY="$KEY" "$SDK_PY" bench/e2b_bench.py --n "$N" --image "$IMAGE" --pool bench-e2b --namespace "$NS" \
  --out "$OUT/e2b.json"

report=$(python3 - "$OUT/e2b.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s, d, p = r["sdk"]["median"], r["docker"]["median"], r["pool"]
print(f"e2b: SDK Sandbox.create() + commands.run('true') {s:.3f} s vs docker run -d + docker exec {d:.3f} s: "
      f"{s / d:.2f}x ({'meets' if s / d <= 1.5 else 'misses'} target <= 1.5x; median of {r['sdk']['n']})")
if p:
    m = p["median"]
    print(f"e2b: the same through a warm pool (a claim) {m * 1000:.0f} ms ({'meets' if m <= 0.1 else 'misses'} target <= 100 ms)")
c = r.get("create_only") or {}
if c.get("sdk") and c.get("pool"):
    print(f"e2b:   of which Sandbox.create() alone: {c['sdk']['median'] * 1000:.0f} ms cold, {c['pool']['median'] * 1000:.0f} ms from the pool")
else:
    print(f"e2b: through a warm pool: not measured ({r['pool_error']})")
PY
)
echo "$report"
[[ -f "$OUT/results.md" ]] && printf '\n%s\n' "$report" >>"$OUT/results.md"
exit 0
