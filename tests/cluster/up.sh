#!/usr/bin/env bash
# Start (or reuse) the test control plane: a real etcd + kube-apiserver on
# loopback, built by build.sh from pinned Go modules. Idempotent:
#   - builds the binaries first if they are missing (slow once, then cached);
#   - if the control plane from an earlier up.sh is running and /readyz is ok,
#     it only prints the kubeconfig and exits;
#   - otherwise (re)starts whatever is not running, detached (setsid), and
#     waits for /readyz and the `default` namespace.
#
# State lives in $CACHE/cluster (CACHE=$SANDBOX_CACHE or ~/.cache/sandbox-operator):
#   pki/ (CA, serving cert, SA key; generated once), tokens.csv, admin.token,
#   etcd/ (data), etcd.log, kube-apiserver.log, *.pid, kubeconfig
#
# Ports (override with env): SANDBOX_ETCD_PORT=23790 (client, loopback),
# SANDBOX_ETCD_PEER_PORT=23800 (loopback), SANDBOX_APISERVER_PORT=16443. The API server
# listens on every address and advertises this host's IP (SANDBOX_NODE_IP, default: the
# source address towards the default route), so that Pods on the test nodes reach it
# through the `kubernetes` Service (an operator installed with Helm runs as such a Pod;
# Endpoints refuse loopback addresses).
# Readiness deadline: SANDBOX_UP_TIMEOUT seconds (default 180).
#
# stdout is exactly one line: `export KUBECONFIG=<path>`; messages go to stderr.
# Stop with tests/cluster/down.sh [--wipe].
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
BIN="$CACHE/bin"
DIR="$CACHE/cluster"
PKI="$DIR/pki"
ETCD_PORT="${SANDBOX_ETCD_PORT:-23790}"
ETCD_PEER_PORT="${SANDBOX_ETCD_PEER_PORT:-23800}"
API_PORT="${SANDBOX_APISERVER_PORT:-16443}"
TIMEOUT="${SANDBOX_UP_TIMEOUT:-180}"
SERVER="https://127.0.0.1:$API_PORT"
ETCD_URL="http://127.0.0.1:$ETCD_PORT"
KUBECONFIG_OUT="$DIR/kubeconfig"
NODE_IP="${SANDBOX_NODE_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')}"

log() { echo "up.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

"$here/build.sh"

mkdir -p "$DIR"
# Serialise concurrent up.sh/down.sh runs. Started daemons must not inherit fd 9.
exec 9>"$DIR/.lock"
flock 9

# ---- process helpers (running_pid, port_busy, wait_for, stop_pid, start) --------
# shellcheck source=daemon.sh
source "$here/daemon.sh"

etcd_healthy() {
  curl -sf --max-time 2 "$ETCD_URL/health" 2>/dev/null | grep -q '"health":"true"'
}

api_get() { # path -> body (fails on non-2xx)
  curl -sf --max-time 3 --cacert "$PKI/ca.crt" \
    -H "Authorization: Bearer $(cat "$DIR/admin.token")" "$SERVER$1" 2>/dev/null
}

api_ready() { [ "$(api_get /readyz)" = ok ] && api_get /api/v1/namespaces/default >/dev/null; }

print_result() {
  log "control plane ready at $SERVER (etcd $ETCD_URL); logs in $DIR"
  echo "export KUBECONFIG=$KUBECONFIG_OUT"
}

# ---- kube-apiserver flags ----------------------------------------------------------
# Node,RBAC + NodeRestriction and the kubelet client certificate are for the test
# node(s) of tests/setup/node.sh: kubelets authenticate as system:node:<name>, and
# the API server authenticates to kubelets (exec, logs, port-forward) with its
# kubelet-client certificate, reaching them at their InternalIP (all test nodes
# share one host, so their host names do not tell them apart).
# An API server already running with other flags is restarted (a few seconds).
API_ARGS=(
  --bind-address=0.0.0.0
  --advertise-address="${NODE_IP:-127.0.0.1}"
  --secure-port="$API_PORT"
  --etcd-servers="$ETCD_URL"
  --tls-cert-file="$PKI/apiserver.crt"
  --tls-private-key-file="$PKI/apiserver.key"
  --client-ca-file="$PKI/ca.crt"
  --token-auth-file="$DIR/tokens.csv"
  --authorization-mode=Node,RBAC
  --service-account-issuer="https://kubernetes.default.svc.cluster.local"
  --service-account-key-file="$PKI/sa.pub"
  --service-account-signing-key-file="$PKI/sa.key"
  --service-cluster-ip-range=10.0.0.0/24
  --enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,DefaultTolerationSeconds,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,ResourceQuota,NodeRestriction
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt"
  --kubelet-client-key="$PKI/apiserver-kubelet-client.key"
  --kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP
  --allow-privileged=true
  --profiling=false
  # The aggregation layer (subresources.sandboxes.dev, served by the operator): the
  # front proxy's CA and client certificate, the headers it asserts the user in, and
  # routing to the APIService's endpoint IP (the operator runs as a host process).
  --requestheader-client-ca-file="$PKI/front-proxy/ca.crt"
  --requestheader-allowed-names=front-proxy-client
  --requestheader-username-headers=X-Remote-User
  --requestheader-group-headers=X-Remote-Group
  --requestheader-extra-headers-prefix=X-Remote-Extra-
  --requestheader-uid-headers=X-Remote-Uid
  --proxy-client-cert-file="$PKI/front-proxy/front-proxy-client.crt"
  --proxy-client-key-file="$PKI/front-proxy/front-proxy-client.key"
  --enable-aggregator-routing=true
)

# true when the running kube-apiserver has exactly API_ARGS
api_args_current() {
  local pid
  pid="$(running_pid kube-apiserver)"
  [ -n "$pid" ] &&
    [ "$(tr '\0' '\n' <"/proc/$pid/cmdline" | tail -n +2)" = "$(printf '%s\n' "${API_ARGS[@]}")" ]
}

# ---- fast path: already up ---------------------------------------------------
if [ -n "$(running_pid etcd)" ] && [ -n "$(running_pid kube-apiserver)" ] &&
  [ -f "$DIR/admin.token" ] && [ -f "$KUBECONFIG_OUT" ] && api_args_current && api_ready; then
  print_result
  exit 0
fi

# ---- credentials (generated once) --------------------------------------------
gen_pki() {
  local tmp
  tmp="$(mktemp -d "$DIR/.pki.XXXXXX")"
  (
    cd "$tmp"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
      -keyout ca.key -out ca.crt -subj "/CN=sandbox-operator-test-ca" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout apiserver.key -out apiserver.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    cat >apiserver.ext <<'EOF'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -sha256 -days 3650 -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    # service-account token signing key pair
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f apiserver.csr apiserver.ext ca.srl
  )
  rm -rf "$PKI" && mv "$tmp" "$PKI"
  log "generated CA, serving cert and service-account key in $PKI"
}
[ -f "$PKI/sa.pub" ] || gen_pki
# shellcheck source=pki.sh
source "$here/pki.sh"
# the API server's identity towards kubelets (bound to system:kubelet-api-admin by node.sh)
issue_client_cert "$PKI" apiserver-kubelet-client kube-apiserver-kubelet-client
# the front proxy's own CA and the client certificate it presents to aggregated APIs
issue_ca "$PKI/front-proxy" front-proxy-ca
issue_client_cert "$PKI/front-proxy" front-proxy-client front-proxy-client

if [ ! -f "$DIR/tokens.csv" ] || [ ! -f "$DIR/admin.token" ]; then
  (
    umask 077
    openssl rand -hex 32 >"$DIR/admin.token"
    # token,user,uid,"groups"
    printf '%s,admin,admin,"system:masters"\n' "$(cat "$DIR/admin.token")" >"$DIR/tokens.csv"
  )
fi

write_kubeconfig() {
  local tmp="$KUBECONFIG_OUT.tmp.$$"
  (
    umask 077
    cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sandbox-test
  cluster:
    server: $SERVER
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: sandbox-test-admin
  user:
    token: $(cat "$DIR/admin.token")
contexts:
- name: sandbox-test
  context:
    cluster: sandbox-test
    user: sandbox-test-admin
    namespace: default
current-context: sandbox-test
EOF
  )
  mv "$tmp" "$KUBECONFIG_OUT"
}
write_kubeconfig

# ---- etcd --------------------------------------------------------------------
if [ -z "$(running_pid etcd)" ] || ! etcd_healthy; then
  if pid="$(running_pid etcd)" && [ -n "$pid" ]; then
    log "etcd (pid $pid) is running but unhealthy; restarting it"
    stop_pid etcd "$pid"
  fi
  # an apiserver without its etcd is useless; restart it too
  if pid="$(running_pid kube-apiserver)" && [ -n "$pid" ]; then stop_pid kube-apiserver "$pid"; fi
  for p in "$ETCD_PORT" "$ETCD_PEER_PORT"; do
    ! port_busy "$p" || die "127.0.0.1:$p is in use by another process (set SANDBOX_ETCD_PORT / SANDBOX_ETCD_PEER_PORT)"
  done
  log "starting etcd on $ETCD_URL (data $DIR/etcd)"
  mkdir -p "$DIR/etcd" && chmod 700 "$DIR/etcd"
  # --unsafe-no-fsync: test data only; much faster on slow disks.
  start etcd "$BIN/etcd" \
    --name=sandbox-test \
    --data-dir="$DIR/etcd" \
    --listen-client-urls="$ETCD_URL" \
    --advertise-client-urls="$ETCD_URL" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="sandbox-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync \
    --log-level=warn
  wait_for etcd etcd_healthy
fi

# ---- kube-apiserver ----------------------------------------------------------
if pid="$(running_pid kube-apiserver)" && [ -n "$pid" ]; then
  if ! api_args_current; then
    log "kube-apiserver (pid $pid) runs with other flags than this script's; restarting it"
    stop_pid kube-apiserver "$pid"
  elif ! api_ready; then
    # Running but not (yet) ready: give it the deadline, then restart it.
    log "kube-apiserver (pid $pid) is running but not ready; waiting"
    if ! (TIMEOUT=30 wait_for kube-apiserver api_ready) 2>/dev/null; then
      log "restarting kube-apiserver"
      stop_pid kube-apiserver "$pid"
    fi
  fi
fi
if [ -z "$(running_pid kube-apiserver)" ]; then
  # the port may take a moment to be released after a restart
  deadline=$((SECONDS + 10))
  while port_busy "$API_PORT"; do
    [ "$SECONDS" -lt "$deadline" ] || die "127.0.0.1:$API_PORT is in use by another process (set SANDBOX_APISERVER_PORT)"
    sleep 0.1
  done
  log "starting kube-apiserver on $SERVER"
  start kube-apiserver "$BIN/kube-apiserver" "${API_ARGS[@]}"
  wait_for kube-apiserver api_ready
fi

print_result
