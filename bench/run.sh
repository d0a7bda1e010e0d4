#!/usr/bin/env bash
# `make bench`: the performance figures of docs/architecture.md, each as a ratio against the raw provider
# measured in the same run. Self-contained: starts Docker + the base image + the test control
# plane (or uses a reachable $KUBECONFIG), builds the operator in release mode, runs its own
# operator (instance `bench`, namespace `sandbox-bench`), cleans up. Not run in CI.
#
#   bash bench/run.sh                 all figures (about half an hour on 2 cores)
#   BENCH_FIGURES="a b" bash bench/run.sh    only some of them (a b f c d e)
#
# Results: target/bench/results.md (also printed), raw data target/bench/*.json, operator
# logs target/bench/operator-*.log.
#
# Env (defaults in brackets):
#   BENCH_FIGURES        [a b f c d e]  which figures
#   BENCH_A_N            [30]       figure a rounds
#   BENCH_B_N            [1000]     figure b burst size (above 1,000 both sides run without a
#                                   network; 2,000 wedged dockerd 20.10 while removing them)
#   BENCH_CONCURRENCY    [32]       operator --concurrency and xargs -P for figure b
#   BENCH_PROVIDER_CONCURRENCY [32] operator config providerConcurrency (shipped default: 16)
#   BENCH_C_DOCKER_N     [1000]     figure c: Docker-backed stopped Sandboxes (0 = skip)
#   BENCH_C_STALLED_N    [0]        figure c: Sandboxes naming an unconfigured provider (0 = skip;
#                                   figure d measures those at 1k-20k)
#   BENCH_D_LEVELS       [1000,5000,10000,20000]  figure d object counts
#   BENCH_E_LEVELS       [1000,10000]  figure e container counts
#   BENCH_F_N            [100]      figure f creates
#   BENCH_IDLE_SECS      [60]       figure c idle window
#   BENCH_SWEEP_SECS     [120]      figure c sweeper interval (the idle window is placed between passes)
#   BENCH_TIMEOUT        [1200]     bound on each wait (seconds)
#   BENCH_NAMESPACE      [sandbox-bench]  namespace of the benchmark objects (created if
#                                   missing, emptied at the end, not deleted)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$REPO/target/bench"
FIGURES="${BENCH_FIGURES:-a b f c d e}"
A_N="${BENCH_A_N:-30}"
B_N="${BENCH_B_N:-1000}"
CONC="${BENCH_CONCURRENCY:-32}"
PCONC="${BENCH_PROVIDER_CONCURRENCY:-32}"
C_DOCKER_N="${BENCH_C_DOCKER_N:-1000}"
C_STALLED_N="${BENCH_C_STALLED_N:-0}"
D_LEVELS="${BENCH_D_LEVELS:-1000,5000,10000,20000}"
E_LEVELS="${BENCH_E_LEVELS:-1000,10000}"
F_N="${BENCH_F_N:-100}"
IDLE_SECS="${BENCH_IDLE_SECS:-60}"
SWEEP_SECS="${BENCH_SWEEP_SECS:-120}"
TIMEOUT="${BENCH_TIMEOUT:-1200}"
INSTANCE=bench
RESYNC=600
NS="${BENCH_NAMESPACE:-sandbox-bench}"
IMAGE="${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}"
PY=(python3 "$REPO/bench/bench.py")

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf 'bench: ERROR: %s\n' "$*" >&2; exit 1; }

has() { [[ " $FIGURES " == *" $1 "* ]]; }
mkdir -p "$OUT"
rm -f "$OUT/results.md" "$OUT/env.json"
! has a || rm -f "$OUT/a-single.json"
! has b || rm -f "$OUT/b-burst.json"
! has c || rm -f "$OUT"/c-idle-*.json "$OUT"/engine-requests-*.json
! has d || rm -f "$OUT/d-scale.json"
! has e || rm -f "$OUT/e-sweep.json"
! has f || rm -f "$OUT/f-counts.json"
rm -rf "$OUT/plots"
T0=$SECONDS

# ---- infrastructure --------------------------------------------------------------------------
say "Infrastructure: Docker engine, base image, Kubernetes API"
USER_KUBECONFIG="${KUBECONFIG:-}"
# shellcheck source=/dev/null
source "$REPO/tests/cluster/env.sh"
bash "$REPO/tests/setup/docker.sh"
bash "$REPO/tests/setup/base-image.sh"
if [ -n "$USER_KUBECONFIG" ] && [ "$USER_KUBECONFIG" != "$KUBECONFIG" ] &&
  KUBECONFIG="$USER_KUBECONFIG" kubectl --request-timeout=5s get --raw /readyz >/dev/null 2>&1; then
  export KUBECONFIG="$USER_KUBECONFIG"
  log "using KUBECONFIG=$KUBECONFIG"
else
  eval "$(bash "$REPO/tests/cluster/up.sh")"
fi
kubectl apply --server-side --force-conflicts --field-manager=sandbox-operator-bench -f "$REPO/crds/" >/dev/null
# As a cluster-wide chart install: the cleanup finalizer comes with admission.
bash "$REPO/tests/cluster/finalizer-policy.sh"
kubectl wait --for=condition=Established --timeout=60s \
  crd/sandboxes.sandboxes.dev crd/sandboxvolumes.sandboxes.dev crd/sandboxtemplates.sandboxes.dev >/dev/null

say "Plotting: matplotlib in the bench's own virtualenv (cached outside the checkout)"
VENV="${SANDBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-operator}/bench-venv"
if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check 'matplotlib>=3.8,<4'
fi
"$VENV/bin/python" -c 'import matplotlib; print("matplotlib", matplotlib.__version__)'

say "Building the operator (release)"
cargo build --release --bin sandbox-operator
BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/sandbox-operator"
[ -x "$BIN" ] || die "no release binary at $BIN"

# ---- the namespace, and leftovers of an interrupted earlier run ------------------------------------
say "Namespace $NS"
phase="$(kubectl get ns "$NS" -o jsonpath='{.status.phase}' 2>/dev/null || true)"
if [ "$phase" = Terminating ]; then
  # A control plane without kube-controller-manager never finishes deleting a namespace.
  NS="$NS-$(date +%s)"
  log "the namespace is Terminating (deleted by hand?); using $NS instead"
  phase=""
fi
if [ -z "$phase" ]; then
  kubectl create ns "$NS" >/dev/null
  log "created namespace $NS (kept afterwards, empty; delete it with kubectl delete ns $NS)"
else
  left="$(kubectl get sbx -n "$NS" -o name)"
  if [ -n "$left" ]; then
    log "dropping the finalizers of $(wc -l <<<"$left") leftover Sandboxes and deleting them"
    while read -r s; do
      kubectl patch -n "$NS" "$s" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    done <<<"$left"
    kubectl delete sbx --all -n "$NS" --wait=false >/dev/null 2>&1 || true
  fi
fi
for label in "sandboxes.dev/managed-by=$INSTANCE" "sandboxes.dev/managed-by=bench-raw"; do
  ids="$(docker ps -aq --filter "label=$label")"
  if [ -n "$ids" ]; then
    log "removing $(wc -w <<<"$ids") leftover containers labelled $label"
    xargs -P 16 -n 20 docker rm -f -v <<<"$ids" >/dev/null
  fi
done

# ---- operator lifecycle ----------------------------------------------------------------------------
OP_PID=""
PROXY_PID=""
METRICS=""

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_operator NAME [ENGINE_SOCKET] [SWEEP_SECS]
start_operator() {
  local name="$1" endpoint="${2:-}" sweep="${3:-}" cfg="$OUT/operator-$1.yaml" logf="$OUT/operator-$1.log" deadline
  {
    echo "instance: $INSTANCE"
    echo "resyncSecs: $RESYNC"
    echo "providerConcurrency: $PCONC"
    echo "openImages: [\"$IMAGE\"]"
    echo "providers:"
    echo "  - name: docker"
    echo "    type: docker"
    if [ -n "$endpoint" ]; then
      echo "    docker:"
      echo "      endpoint: unix://$endpoint"
    fi
    if [ -n "$sweep" ]; then
      echo "sweeper:"
      echo "  intervalSecs: $sweep"
    fi
  } >"$cfg"
  METRICS="127.0.0.1:$(free_port)"
  POD_NAMESPACE="$NS" NO_COLOR=1 "$BIN" run --config "$cfg" --namespace "$NS" --metrics-addr "$METRICS" \
    --concurrency "$CONC" </dev/null >"$logf" 2>&1 &
  OP_PID=$!
  deadline=$((SECONDS + 60))
  until curl -sf --max-time 2 "http://$METRICS/metrics" 2>/dev/null | grep -q '^sandbox_operator_leader 1'; do
    kill -0 "$OP_PID" 2>/dev/null || { tail -20 "$logf" >&2; die "operator exited (log $logf)"; }
    [ "$SECONDS" -lt "$deadline" ] || { tail -20 "$logf" >&2; die "operator not leading after 60 s (log $logf)"; }
    sleep 0.2
  done
  log "operator '$name' pid $OP_PID leading; metrics http://$METRICS; log $logf"
}

stop_operator() {
  [ -n "$OP_PID" ] || return 0
  if kill -0 "$OP_PID" 2>/dev/null; then
    kill -TERM "$OP_PID" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while kill -0 "$OP_PID" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    kill -KILL "$OP_PID" 2>/dev/null || true
  fi
  wait "$OP_PID" 2>/dev/null || true
  OP_PID=""
}

start_proxy() { # socket counts-file
  python3 "$REPO/bench/dockerproxy.py" --listen "$1" --counts "$2" \
    --upstream "$(d="${DOCKER_HOST:-unix:///var/run/docker.sock}"; echo "${d#unix://}")" &
  PROXY_PID=$!
  local deadline=$((SECONDS + 10))
  until [ -S "$1" ] && [ -f "$2" ]; do
    [ "$SECONDS" -lt "$deadline" ] || die "docker proxy did not start"
    sleep 0.1
  done
}

stop_proxy() {
  [ -n "$PROXY_PID" ] || return 0
  kill -TERM "$PROXY_PID" 2>/dev/null || true
  wait "$PROXY_PID" 2>/dev/null || true
  PROXY_PID=""
}

cleanup() {
  local rc=$?
  set +e
  if [ -n "$OP_PID" ] && kill -0 "$OP_PID" 2>/dev/null; then
    say "Cleaning up: deleting every Sandbox in $NS"
    "${PY[@]}" cleanup --namespace "$NS" --timeout 600
  fi
  stop_operator
  stop_proxy
  # whatever is left (an interrupted run): drop finalizers, remove containers by label
  for s in $(kubectl get sbx -n "$NS" -o name 2>/dev/null); do
    kubectl patch -n "$NS" "$s" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1
  done
  for label in "sandboxes.dev/managed-by=$INSTANCE" "sandboxes.dev/managed-by=bench-raw"; do
    ids="$(docker ps -aq --filter "label=$label")"
    [ -z "$ids" ] || xargs -P 16 -n 20 docker rm -f -v <<<"$ids" >/dev/null
  done
  log "total time $((SECONDS - T0)) s"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- environment record ----------------------------------------------------------------------------
python3 - "$OUT/env.json" <<EOF
import json, os, platform, subprocess, sys, datetime
def sh(*c):
    try: return subprocess.run(c, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception: return "?"
mem = int(open("/proc/meminfo").read().split()[1]) // 1024
git = sh("git", "-C", "$REPO", "rev-parse", "--short", "HEAD")
dirty = sh("git", "-C", "$REPO", "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock")
json.dump({
  "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
  "host": platform.node(), "cpus": os.cpu_count(), "mem": f"{mem} MiB", "kernel": platform.release(),
  "docker": sh("docker", "version", "--format", "{{.Server.Version}}"),
  "kube": json.loads(sh("kubectl", "version", "-o", "json") or "{}").get("serverVersion", {}).get("gitVersion", "?"),
  "operator": sh("$BIN", "version"), "git": git + (" + uncommitted changes in src/" if dirty else ""),
  "concurrency": $CONC, "provider_concurrency": $PCONC, "namespace": "$NS", "instance": "$INSTANCE", "resync": $RESYNC,
  "notes": [],
}, open(sys.argv[1], "w"), indent=2)
EOF

# ---- figures a and b: one operator with the shipped sweeper settings ------------------------------
if has a || has b; then
  say "Starting the operator for figures a and b"
  start_operator ab
fi
if has a; then
  say "Figure a: one sandbox, apply -> Ready vs docker run -d (median of $A_N, interleaved)"
  "${PY[@]}" single --namespace "$NS" --n "$A_N" --image "$IMAGE" --out "$OUT/a-single.json"
fi
if has b; then
  say "Figure b: $B_N Sandboxes in one kubectl apply vs $B_N docker run -d at -P $CONC"
  "${PY[@]}" burst --namespace "$NS" --n "$B_N" --concurrency "$CONC" --image "$IMAGE" --workdir "$OUT" \
    --metrics "$METRICS" --pid "$OP_PID" --timeout "$TIMEOUT" --out "$OUT/b-burst.json" || log "figure b failed (see above); continuing"
fi
stop_operator

# ---- figure f: work per create, engine requests counted by a socket proxy --------------------------
if has f; then
  say "Figure f: $F_N creates: reconciles, engine and API requests per create"
  sock="$OUT/docker-proxy.sock"
  counts="$OUT/engine-requests-f.json"
  start_proxy "$sock" "$counts"
  start_operator f "$sock" 3600
  "${PY[@]}" counts --namespace "$NS" --n "$F_N" --image "$IMAGE" --metrics "$METRICS" --pid "$OP_PID" \
    --proxy-counts "$counts" --timeout "$TIMEOUT" --out "$OUT/f-counts.json" || log "figure f failed (see above); continuing"
  stop_operator
  stop_proxy
fi

# ---- figure c: a fresh operator per variant, engine calls counted by a socket proxy -----------------
if has c; then
  for variant in docker stalled; do
    n="$C_DOCKER_N"; [ "$variant" = stalled ] && n="$C_STALLED_N"
    [ "$n" -gt 0 ] || continue
    say "Figure c ($variant): $n Sandboxes, then idle"
    sock="$OUT/docker-proxy.sock"
    counts="$OUT/engine-requests-$variant.json"
    start_proxy "$sock" "$counts"
    start_operator "c-$variant" "$sock" "$SWEEP_SECS"
    "${PY[@]}" idle --namespace "$NS" --variant "$variant" --n "$n" --image "$IMAGE" --metrics "$METRICS" --pid "$OP_PID" \
      --idle-secs "$IDLE_SECS" --proxy-counts "$counts" --sweep-interval "$SWEEP_SECS" --timeout "$TIMEOUT" \
      --keep --out "$OUT/c-idle-$variant.json" || log "figure c ($variant) failed (see above); continuing"
    if [ -f "$OUT/c-idle-$variant.json" ]; then
      say "Figure c ($variant): restarting the operator on the $n existing objects"
      stop_operator
      start_operator "c-$variant-restart" "$sock" "$SWEEP_SECS"
      "${PY[@]}" restart --namespace "$NS" --metrics "$METRICS" --pid "$OP_PID" --proxy-counts "$counts" \
        --timeout "$TIMEOUT" --out "$OUT/c-idle-$variant.json" || log "figure c ($variant) restart failed (see above); continuing"
    fi
    "${PY[@]}" cleanup --namespace "$NS" --timeout "$TIMEOUT" || true
    stop_operator
    stop_proxy
  done
fi

# ---- figure d: memory and idle API load against object count ------------------------------------------
if has d; then
  say "Figure d: Sandboxes at $D_LEVELS: VmRSS and API requests at idle"
  start_operator d
  "${PY[@]}" scale --namespace "$NS" --levels "$D_LEVELS" --idle-secs "$IDLE_SECS" --image "$IMAGE" --metrics "$METRICS" \
    --pid "$OP_PID" --timeout "$TIMEOUT" --out "$OUT/d-scale.json" || log "figure d failed (see above); continuing"
  "${PY[@]}" cleanup --namespace "$NS" --timeout "$TIMEOUT" || true
  stop_operator
fi

# ---- figure e: one sweep pass against one raw list call (no operator running) ---------------------------
if has e; then
  say "Figure e: sweep pass vs raw list at $E_LEVELS labelled containers"
  cfg="$OUT/sweep-e.yaml"
  printf 'instance: %s\nproviders:\n  - name: docker\n    type: docker\n' "$INSTANCE" >"$cfg"
  "${PY[@]}" sweep --namespace "$NS" --levels "$E_LEVELS" --image "$IMAGE" --binary "$BIN" --config "$cfg" \
    --instance "$INSTANCE" --out "$OUT/e-sweep.json" || log "figure e failed (see above); continuing"
  say "Figure e: removing the labelled containers"
  ids="$(docker ps -aq --filter "label=sandboxes.dev/managed-by=$INSTANCE")"
  [ -z "$ids" ] || xargs -P 8 -n 50 docker rm -f -v <<<"$ids" >/dev/null
fi

say "Results"
"$VENV/bin/python" "$REPO/bench/plot.py" --dir "$OUT" || log "plotting failed (see above); the tables are complete"
"${PY[@]}" report --dir "$OUT"
log "written: $OUT/results.md"
