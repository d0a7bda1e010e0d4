#!/usr/bin/env bash
# The README's first command (`make demo`): on a fresh machine, from nothing to a running
# sandbox you can reach.
#
#   examples/demo.sh             build the operator, start Docker + the base image, use the
#                                cluster in $KUBECONFIG (when set and reachable) or start the
#                                test control plane, install the CRDs, (re)start the operator
#                                serving the aggregated API (subresources.sandboxes.dev,
#                                registered by an APIService), apply examples/sandbox.yaml,
#                                wait for Ready, run commands inside it with the
#                                `kubectl sandbox` plugin (built here, put on PATH) and reach
#                                its published port.
#   examples/demo.sh down        delete the Sandbox (the operator removes its container before
#                                the finalizer goes), delete the APIService, stop the operator. The control plane and
#                                dockerd keep running.
#   examples/demo.sh down --all  the same, then stop the test control plane (tests/cluster/down.sh)
#                                when the demo started it. dockerd is left running.
#
# Idempotent: running it again rebuilds (a no-op when nothing changed), restarts the operator
# on the fresh binary and re-applies the unchanged Sandbox.
#
# State: ${SANDBOX_CACHE:-~/.cache/sandbox-operator}/demo/ — operator.log, operator.pid,
# config.yaml, kubeconfig (the path of the cluster the demo used), access.crt/access.key (the
# aggregated API's self-signed serving certificate), bin/kubectl-sandbox (the plugin).
#
# Env:
#   SANDBOX_DEMO_METRICS_ADDR  operator /metrics, /healthz, /readyz (default 127.0.0.1:18080)
#   SANDBOX_DEMO_ACCESS_PORT   the aggregated API's port on every address (default 18443)
#   SANDBOX_NODE_IP            this host's address the API server dials (default: the source
#                              address towards the default route)
#   SANDBOX_DEMO_RELEASE=1     build and run the release binary instead of the debug one
#   RUST_LOG                   operator log filter (e.g. info,sandbox_operator=debug)
#   DEMO_DOWN_ALL=1            same as `down --all` (so `make demo-down DEMO_DOWN_ALL=1` works)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
DEMO_DIR="$CACHE/demo"
LOG="$DEMO_DIR/operator.log"
PIDFILE="$DEMO_DIR/operator.pid"
CONFIG="$DEMO_DIR/config.yaml"
KUBECONFIG_RECORD="$DEMO_DIR/kubeconfig"
METRICS_ADDR="${SANDBOX_DEMO_METRICS_ADDR:-127.0.0.1:18080}"
INSTANCE=demo
NS=default           # examples/sandbox.yaml's namespace
NAME=demo            # examples/sandbox.yaml's name
MANIFEST="$REPO/examples/sandbox.yaml"
CRDS=(crd/sandboxes.sandboxes.dev crd/sandboxvolumes.sandboxes.dev crd/sandboxtemplates.sandboxes.dev)
# The aggregated API (kubectl sandbox's server), served by the operator as a host process.
ACCESS_PORT="${SANDBOX_DEMO_ACCESS_PORT:-18443}"
APISERVICE=v1alpha1.subresources.sandboxes.dev
ACCESS_NS=sandbox-demo-access
ACCESS_SVC=sandbox-operator-access
ACCESS_CERT="$DEMO_DIR/access.crt"
ACCESS_KEY="$DEMO_DIR/access.key"
PLUGIN_DIR="$DEMO_DIR/bin"

if [ -t 1 ]; then B=$'\e[1m'; G=$'\e[32m'; Y=$'\e[33m'; R=$'\e[31m'; N=$'\e[0m'; else B='' G='' Y='' R='' N=''; fi
step_no=0
step() { step_no=$((step_no + 1)); printf '\n%s==> [%d] %s%s\n' "$B" "$step_no" "$*" "$N"; }
info() { printf '    %s\n' "$*"; }
ok() { printf '    %s✓%s %s\n' "$G" "$N" "$*"; }
warn() { printf '    %s!%s %s\n' "$Y" "$N" "$*" >&2; }
die() { printf '\n%sdemo: ERROR: %s%s\n' "$R" "$*" "$N" >&2; exit 1; }
# run CMD...: show it (k is shown as kubectl), run it, indent its output; keeps its exit status.
run() {
  local shown="$*"
  [ "$1" = k ] && shown="kubectl ${*:2}"
  printf '    $ %s\n' "$shown"
  "$@" 2>&1 | sed 's/^/      /'
  return "${PIPESTATUS[0]}"
}

mkdir -p "$DEMO_DIR"

# ---- the pinned kubectl / which cluster ------------------------------------------------------
# Remember a KUBECONFIG the user set before env.sh replaces it with the test cluster's.
USER_KUBECONFIG="${KUBECONFIG:-}"
# shellcheck source=/dev/null
source "$REPO/tests/cluster/env.sh"   # pinned kubectl/helm first on PATH, KUBECONFIG=test cluster
TEST_KUBECONFIG="$KUBECONFIG"

k() { kubectl --request-timeout=30s "$@"; }
reachable() { KUBECONFIG="$1" kubectl --request-timeout=5s get --raw /readyz >/dev/null 2>&1; }

# ---- the operator process ----------------------------------------------------------------------
# Our operator's pid from the pidfile, only while that pid is still a sandbox-operator process.
operator_pid() {
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [ -n "$pid" ] || return 0
  if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'sandbox-operator run'; then echo "$pid"; fi
}

stop_operator() {
  local pid deadline
  pid="$(operator_pid)"
  if [ -z "$pid" ]; then rm -f "$PIDFILE"; info "operator: not running"; return 0; fi
  info "stopping operator (pid $pid) with SIGTERM (it releases its leader Lease)"
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      warn "operator ignored SIGTERM for 30 s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  rm -f "$PIDFILE"
  ok "operator stopped"
}

metrics() { curl -sf --max-time 3 "http://$METRICS_ADDR/metrics"; }

start_operator() { # binary
  local bin="$1" pid deadline
  if (exec 3<>"/dev/tcp/${METRICS_ADDR%:*}/${METRICS_ADDR##*:}") 2>/dev/null; then
    die "$METRICS_ADDR is already in use by another process; set SANDBOX_DEMO_METRICS_ADDR=127.0.0.1:<free port>"
  fi
  cat >"$CONFIG" <<EOF
# Written by examples/demo.sh (format: src/config.rs).
instance: $INSTANCE
openImages: ["${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}"]
providers:
  - name: docker
    type: docker
access:
  enabled: true
  address: "0.0.0.0:$ACCESS_PORT"
  tlsCertFile: $ACCESS_CERT
  tlsKeyFile: $ACCESS_KEY
EOF
  {
    echo
    echo "===== $(date -u +%FT%TZ) examples/demo.sh starting $bin ====="
  } >>"$LOG"
  # Own session, no inherited stdio: it keeps running after this script ends.
  KUBECONFIG="$KUBECONFIG" POD_NAMESPACE="$NS" NO_COLOR=1 setsid "$bin" run \
    --config "$CONFIG" --namespace "$NS" --metrics-addr "$METRICS_ADDR" \
    </dev/null >>"$LOG" 2>&1 &
  pid=$!
  disown
  echo "$pid" >"$PIDFILE"
  info "operator pid $pid, instance '$INSTANCE', watching namespace '$NS', metrics http://$METRICS_ADDR"
  info "log: $LOG"
  deadline=$((SECONDS + 60))
  until grep -q '^sandbox_operator_leader 1' <<<"$(metrics 2>/dev/null || true)"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$LOG" | sed 's/^/      /' >&2
      die "the operator exited; see $LOG"
    fi
    [ "$SECONDS" -lt "$deadline" ] || { tail -n 30 "$LOG" | sed 's/^/      /' >&2; die "the operator did not become leader within 60 s; see $LOG"; }
    sleep 0.3
  done
  ok "operator is up and leading (sandbox_operator_leader 1)"
  deadline=$((SECONDS + 30))
  until curl -sf --max-time 3 "http://$METRICS_ADDR/readyz" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || { warn "/readyz is not ok yet: $(curl -s --max-time 3 "http://$METRICS_ADDR/readyz")"; return 0; }
    sleep 0.3
  done
  ok "/readyz ok"
}

operator_binary() {
  local target="${CARGO_TARGET_DIR:-$REPO/target}"
  # Cargo reads a relative CARGO_TARGET_DIR from the working directory; the plugin's symlink
  # needs an absolute path.
  case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
  if [ "${SANDBOX_DEMO_RELEASE:-0}" = 1 ]; then echo "$target/release/sandbox-operator"; else echo "$target/debug/sandbox-operator"; fi
}

# ---- the aggregated API (what `kubectl sandbox` talks to) -------------------------------------
# This host's address towards the default route: the API server dials it (Endpoints refuse
# loopback addresses, so the operator's listener is registered at this address).
host_ip() {
  if [ -n "${SANDBOX_NODE_IP:-}" ]; then echo "$SANDBOX_NODE_IP"; return; fi
  ip -4 route get 1.1.1.1 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit } }'
}

# A self-signed serving certificate for the Service name the aggregator verifies (kept across runs).
serving_cert() {
  [ -s "$ACCESS_CERT" ] && [ -s "$ACCESS_KEY" ] && return 0
  command -v openssl >/dev/null 2>&1 || die "openssl is needed to make the aggregated API's serving certificate"
  local dns="$ACCESS_SVC.$ACCESS_NS.svc"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=$dns" -addext "subjectAltName=DNS:$dns" \
    -keyout "$ACCESS_KEY" -out "$ACCESS_CERT" >/dev/null 2>&1 || die "openssl could not make a serving certificate"
  ok "serving certificate for $dns: $ACCESS_CERT"
}

# Registers the operator's listener: a selector-less Service whose Endpoints/EndpointSlice is
# this host, and the APIService trusting our certificate; waits until it is Available.
register_access() {
  local ip ca
  ip="$(host_ip)"
  [ -n "$ip" ] || die "cannot tell this host's address; set SANDBOX_NODE_IP"
  ca="$(base64 -w0 <"$ACCESS_CERT")"
  info "APIService $APISERVICE -> $ip:$ACCESS_PORT (Service $ACCESS_NS/$ACCESS_SVC)"
  # A `demo down` just before leaves the namespace terminating: what is applied into it now
  # would be deleted with it, so wait until it is gone.
  if [ "$(k get namespace "$ACCESS_NS" -o jsonpath='{.status.phase}' 2>/dev/null)" = Terminating ]; then
    k wait --for=delete "namespace/$ACCESS_NS" --timeout=120s >/dev/null ||
      die "namespace $ACCESS_NS is still terminating after 120 s"
  fi
  k apply -f - >/dev/null <<EOF || die "registering the APIService failed"
apiVersion: v1
kind: Namespace
metadata: {name: $ACCESS_NS}
---
apiVersion: v1
kind: Service
metadata: {name: $ACCESS_SVC, namespace: $ACCESS_NS}
spec:
  ports: [{name: https, port: 443, targetPort: $ACCESS_PORT, protocol: TCP}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: $ACCESS_SVC, namespace: $ACCESS_NS}
subsets:
  - addresses: [{ip: "$ip"}]
    ports: [{name: https, port: $ACCESS_PORT, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: $ACCESS_SVC-host
  namespace: $ACCESS_NS
  labels: {kubernetes.io/service-name: $ACCESS_SVC}
addressType: IPv4
endpoints: [{addresses: ["$ip"], conditions: {ready: true}}]
ports: [{name: https, port: $ACCESS_PORT, protocol: TCP}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: $APISERVICE}
spec:
  group: subresources.sandboxes.dev
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  service: {namespace: $ACCESS_NS, name: $ACCESS_SVC, port: 443}
  caBundle: $ca
EOF
  if ! run kubectl wait --for=condition=Available "apiservice/$APISERVICE" --timeout=90s; then
    kubectl get apiservice "$APISERVICE" -o jsonpath='{.status.conditions[*].message}{"\n"}' 2>&1 | sed 's/^/      /'
    tail -n 20 "$LOG" | sed 's/^/      /' >&2
    die "the aggregated API is not Available (the API server must reach $ip:$ACCESS_PORT; see $LOG)"
  fi
  ok "aggregated API subresources.sandboxes.dev is Available"
}

# An APIService whose backend is gone blocks namespace deletion cluster-wide: it goes with the operator.
unregister_access() {
  k delete apiservice "$APISERVICE" --ignore-not-found >/dev/null 2>&1 || true
  k delete namespace "$ACCESS_NS" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  ok "APIService $APISERVICE removed"
}

# =================================================================================================
down() {
  local all=0
  [ "${DEMO_DOWN_ALL:-0}" = 1 ] && all=1
  for a in "$@"; do
    case "$a" in
      --all) all=1 ;;
      *) die "usage: $0 down [--all]" ;;
    esac
  done
  local kc=""
  kc="$(cat "$KUBECONFIG_RECORD" 2>/dev/null || true)"
  [ -n "$kc" ] || kc="$TEST_KUBECONFIG"
  export KUBECONFIG="$kc"

  step "Deleting Sandbox $NS/$NAME (the operator destroys its container before releasing the finalizer)"
  local up=1
  reachable "$kc" || up=0
  if [ "$up" = 0 ]; then
    warn "the cluster in $kc does not answer; skipping the Sandbox (its container, if any, stays — labelled sandboxes.dev/managed-by=$INSTANCE)"
  elif ! k get sbx "$NAME" -n "$NS" >/dev/null 2>&1; then
    ok "no Sandbox $NS/$NAME (nothing to delete)"
  else
    if [ -z "$(operator_pid)" ]; then
      info "the operator is not running, but the finalizer needs it: starting it for the cleanup"
      local bin
      bin="$(operator_binary)"
      [ -x "$bin" ] || die "no operator binary at $bin; run 'make demo' first (it builds it)"
      start_operator "$bin"
    fi
    run kubectl delete sbx "$NAME" -n "$NS" --wait=true --timeout=90s \
      || die "the Sandbox was not deleted within 90 s; see $LOG and 'kubectl describe sbx $NAME -n $NS'"
    ok "Sandbox deleted"
  fi
  [ "$up" = 0 ] || unregister_access
  local left
  left="$(docker ps -aq --filter "label=sandboxes.dev/managed-by=$INSTANCE" 2>/dev/null | wc -l || true)"
  if [ "${left:-0}" -eq 0 ]; then
    ok "no containers labelled sandboxes.dev/managed-by=$INSTANCE are left"
  else
    warn "$left container(s) labelled sandboxes.dev/managed-by=$INSTANCE are still there: docker ps -a --filter label=sandboxes.dev/managed-by=$INSTANCE"
  fi

  step "Stopping the operator"
  stop_operator

  if [ "$all" = 1 ]; then
    step "Stopping the test control plane"
    if [ "$kc" = "$TEST_KUBECONFIG" ]; then
      bash "$REPO/tests/cluster/down.sh"
      ok "kube-apiserver and etcd stopped (data kept; tests/cluster/down.sh --wipe deletes it)"
    else
      info "the demo used your cluster ($kc), not the test control plane: left alone"
    fi
    rm -f "$KUBECONFIG_RECORD"
  fi

  step "Done"
  if [ "$all" = 1 ]; then
    info "Left running: dockerd (started by tests/setup/docker.sh; it is shared with the tests)."
  else
    if [ "$up" = 1 ]; then
      info "Left running: the control plane ($kc) and dockerd."
      [ "$kc" != "$TEST_KUBECONFIG" ] || info "Stop the test control plane too with:  bash examples/demo.sh down --all   (or: make demo-down DEMO_DOWN_ALL=1)"
    else
      info "Left running: dockerd. The control plane ($kc) was not answering."
    fi
  fi
  [ "$all" = 1 ] || info "The CRDs stay installed; remove them with: kubectl delete -f crds/"
}

# =================================================================================================
up() {
  [ $# -eq 0 ] || die "usage: $0 [down [--all]]"
  local t0=$SECONDS

  step "Building the operator and the kubectl sandbox plugin"
  command -v cargo >/dev/null 2>&1 || die "cargo is not installed (https://rustup.rs); the operator is built from this checkout"
  local bin
  bin="$(operator_binary)"
  if [ "${SANDBOX_DEMO_RELEASE:-0}" = 1 ]; then
    run cargo build --release --bin sandbox-operator --bin kubectl-sandbox || die "cargo build failed"
  else
    run cargo build --bin sandbox-operator --bin kubectl-sandbox || die "cargo build failed"
  fi
  [ -x "$bin" ] || die "no binary at $bin after the build"
  ok "$("$bin" version)  ($bin)"
  mkdir -p "$PLUGIN_DIR"
  ln -sf "$(dirname "$bin")/kubectl-sandbox" "$PLUGIN_DIR/kubectl-sandbox"
  [ -x "$PLUGIN_DIR/kubectl-sandbox" ] || die "no plugin binary at $(dirname "$bin")/kubectl-sandbox after the build"
  export PATH="$PLUGIN_DIR:$PATH"   # kubectl finds plugins on PATH by their name
  ok "kubectl sandbox: $(command -v kubectl-sandbox)"

  step "Docker engine and the base image"
  bash "$REPO/tests/setup/docker.sh" || die "tests/setup/docker.sh failed"
  ok "docker: engine $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"
  bash "$REPO/tests/setup/base-image.sh" || die "tests/setup/base-image.sh failed"
  ok "image: ${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}"

  step "Kubernetes API server"
  if [ -n "$USER_KUBECONFIG" ] && [ "$USER_KUBECONFIG" != "$TEST_KUBECONFIG" ] && reachable "$USER_KUBECONFIG"; then
    export KUBECONFIG="$USER_KUBECONFIG"
    ok "using your cluster: KUBECONFIG=$KUBECONFIG ($(kubectl config current-context 2>/dev/null || echo '?'))"
  else
    if [ -n "$USER_KUBECONFIG" ] && [ "$USER_KUBECONFIG" != "$TEST_KUBECONFIG" ]; then
      warn "KUBECONFIG=$USER_KUBECONFIG does not answer; using the test control plane instead"
    fi
    info "starting (or reusing) the test control plane: real etcd + kube-apiserver on loopback"
    info "(the first run builds them from source at pinned versions: several minutes)"
    local exported
    exported="$(bash "$REPO/tests/cluster/up.sh")" || die "tests/cluster/up.sh failed"
    eval "$exported"
    ok "KUBECONFIG=$KUBECONFIG"
  fi
  echo "$KUBECONFIG" >"$KUBECONFIG_RECORD"
  info "kubectl: $(command -v kubectl) ($(kubectl version --client 2>/dev/null | head -1))"

  step "Installing the CRDs (server-side apply of crds/)"
  run k apply --server-side --force-conflicts --field-manager=sandbox-operator-demo -f "$REPO/crds/" || die "installing the CRDs failed"
  run kubectl wait --for=condition=Established --timeout=60s "${CRDS[@]}" || die "CRDs are not Established"

  step "Starting the operator in the background (it also serves the aggregated API on :$ACCESS_PORT)"
  serving_cert
  stop_operator
  start_operator "$bin"
  register_access

  step "Applying examples/sandbox.yaml"
  run k apply -f "$MANIFEST" || die "kubectl apply failed"
  info "waiting for Ready (the operator creates the container, starts it, reads the published port back)"
  if ! run kubectl wait --for=condition=Ready "sbx/$NAME" -n "$NS" --timeout=120s; then
    kubectl describe sbx "$NAME" -n "$NS" 2>&1 | sed 's/^/      /' || true
    tail -n 30 "$LOG" | sed 's/^/      /' >&2
    die "Sandbox $NS/$NAME did not become Ready within 120 s (describe and the operator log above)"
  fi
  ok "Sandbox $NS/$NAME is Ready"

  step "kubectl get sbx"
  run k get sbx -n "$NS"
  run k get sbx -n "$NS" -o wide
  local ext id url
  ext="$(k get sbx "$NAME" -n "$NS" -o jsonpath='{.status.externalName}')"
  id="$(k get sbx "$NAME" -n "$NS" -o jsonpath='{.status.sandboxId}')"
  url="$(k get sbx "$NAME" -n "$NS" -o jsonpath='{.status.url}')"
  info "status.externalName=$ext  status.sandboxId=$id  status.url=$url"
  info "conditions:"
  k get sbx "$NAME" -n "$NS" \
    -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}): {.message}{"\n"}{end}' | sed 's/^/      /'

  step "Running commands inside the sandbox (kubectl sandbox exec $NAME …, your own identity through the API server)"
  run kubectl sandbox exec "$NAME" -n "$NS" -- uname -a || die "kubectl sandbox exec failed"
  printf '    $ kubectl sandbox exec %s -- cat /proc/1/cmdline   (NUL-separated argv of the main process)\n' "$NAME"
  kubectl sandbox exec "$NAME" -n "$NS" -- cat /proc/1/cmdline | tr '\0' '\n' | sed -n '1,4p' | sed 's/^/      /'
  info "  … (the perl script of examples/sandbox.yaml follows)"
  # shellcheck disable=SC2016 # shown as typed: the sandbox's shell expands it
  printf '    $ kubectl sandbox exec %s -- sh -c '"'"'echo "GREETING=$GREETING APP_ENV=$APP_ENV"; id'"'"'\n' "$NAME"
  kubectl sandbox exec "$NAME" -n "$NS" -- sh -c 'echo "GREETING=$GREETING APP_ENV=$APP_ENV"; id' 2>&1 | sed 's/^/      /'
  local code=0
  printf '    $ kubectl sandbox exec %s -- sh -c '"'"'exit 3'"'"'; echo $?\n' "$NAME"
  kubectl sandbox exec "$NAME" -n "$NS" -- sh -c 'exit 3' || code=$?
  printf '      %s\n' "$code"
  if [ "$code" = 3 ]; then ok "the remote exit code is kubectl sandbox's"; else warn "expected exit code 3, got $code"; fi
  info "container labels (set by the operator on every provider resource):"
  docker inspect "$ext" --format '{{range $k, $v := .Config.Labels}}{{$k}}={{$v}}{{"\n"}}{{end}}' \
    | grep '^sandboxes.dev/' | sed 's/^/      /'

  step "Reaching the published port"
  [ -n "$url" ] || die "status.url is empty"
  info "\$ curl -s \"\$(kubectl get sbx $NAME -o jsonpath='{.status.url}')\"    # $url"
  local body="" deadline=$((SECONDS + 15))
  # Ready means the container runs; give perl a moment to bind its socket.
  until body="$(curl -s --max-time 3 "$url")" && [ -n "$body" ]; do
    [ "$SECONDS" -lt "$deadline" ] || die "nothing answered at $url within 15 s"
    sleep 0.3
  done
  printf '      %s\n' "$body"
  if [ "$body" = "hello from sandbox" ]; then ok "the sandbox answered"; else warn "unexpected answer from $url"; fi

  step "Operator metrics (http://$METRICS_ADDR/metrics, lines of interest)"
  metrics | grep -E '^sandbox_operator_(build_info|leader|reconciles_total|reconcile_errors_total|provider_calls_total)' \
    | sed 's/^/      /' || true
  metrics | grep -E '^sandbox_operator_reconcile_duration_seconds_(sum|count)' | sed 's/^/      /' || true
  info "also: curl -s http://$METRICS_ADDR/healthz ; curl -s http://$METRICS_ADDR/readyz"

  step "Done in $((SECONDS - t0)) s"
  cat <<EOF
    Try:
      export KUBECONFIG=$KUBECONFIG PATH=$PLUGIN_DIR:$(dirname "$(command -v kubectl)"):\$PATH
      kubectl get sbx -o wide
      kubectl sandbox exec -it $NAME -- sh      # a shell in the sandbox (a TTY, resizes follow)
      kubectl sandbox cp ./some-dir $NAME:/tmp/some-dir   # and back: kubectl sandbox cp $NAME:/tmp/x ./x
      kubectl sandbox port-forward $NAME 9090:8080        # then: curl localhost:9090
      kubectl describe sbx $NAME           # conditions and events
      kubectl patch sbx $NAME --type=merge -p '{"spec":{"state":"Sleeping"}}'   # pause it
      docker ps --filter label=sandboxes.dev/managed-by=$INSTANCE
      tail -f $LOG

    Stop it all:
      make demo-down                     # deletes the Sandbox (and its container) and the APIService,
                                         # stops the operator;
                                         # the control plane and dockerd keep running
      bash examples/demo.sh down --all   # the same, and stops the test control plane too
EOF
}

case "${1:-up}" in
  up) shift || true; up "$@" ;;
  down) shift; down "$@" ;;
  -h | --help | help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" ;;
  *) die "usage: $0 [up | down [--all]]" ;;
esac
