#!/usr/bin/env bash
# Real Kubernetes node(s) for the tests, next to the control plane of
# tests/cluster/up.sh (which this script starts too). Idempotent: what runs and
# matches its configuration is left alone; the rest is (re)started. Ends when
# every node is Ready.
#
#   - kubelet, kube-scheduler, kube-controller-manager from Go modules
#     (tests/cluster/build.sh kubernetes-node; version and why in versions.env);
#   - per node: its own containerd (Debian's containerd 1.6 and runc; own root,
#     state, socket, config; Docker's containerd is never touched), the bridge
#     CNI config over Debian's containernetworking-plugins, its own cgroup
#     parent, kubelet root dir, ports and pod CIDR;
#   - a pause image built here (tests/cluster/tools/pause) and the local base
#     image (sandbox-operator/base:bookworm) imported into every node's
#     containerd, so Pods start with imagePullPolicy IfNotPresent or Never;
#   - the RuntimeClass `runc` (handler runc);
#   - NetworkPolicy enforced by kube-router's firewall (build.sh kube-router, ipset).
#
# Nodes: sbx-node-1 .. sbx-node-$SANDBOX_NODE_COUNT (default 2), all on this
# host and its IP. Node i: kubelet port 10250+10(i-1), pod CIDR 10.244.(i-1).0/24
# on bridge sbxbr<i>; pod IPs are routed from the host. One kube-proxy and one
# kube-router (NetworkPolicy only) serve every node.
#
# Env: SANDBOX_CACHE (default ~/.cache/sandbox-operator), SANDBOX_NODE_COUNT,
# SANDBOX_NODE_IP (default: the host's source address towards the default
# route), SANDBOX_NODE_TIMEOUT (seconds to wait per step, default 180).
# State and logs: $CACHE/node (logs: *.log); runtime state under
# /run/sandbox-operator/node. Stop with tests/setup/node-down.sh.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cluster="$(cd "$here/../cluster" && pwd)"
CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
export SANDBOX_CACHE="$CACHE"
BIN="$CACHE/bin"
DIR="$CACHE/node"
PKI="$CACHE/cluster/pki"
ADMIN_KUBECONFIG="$CACHE/cluster/kubeconfig"
RUN="/run/sandbox-operator/node"
NODE_COUNT="${SANDBOX_NODE_COUNT:-2}"
TIMEOUT="${SANDBOX_NODE_TIMEOUT:-180}"
BASE_IMAGE="${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}"
PAUSE_IMAGE="docker.io/sandbox-operator/pause:local"
SCHEDULER_PORT=10259
CONTROLLER_MANAGER_PORT=10257
PROXY_HEALTHZ_PORT=10256
PROXY_METRICS_PORT=10249
NETPOL_HEALTHZ_PORT=20244
CNI_BIN=/usr/lib/cni
# Bump when the pause image recipe changes, to force a rebuild.
PAUSE_RECIPE=1

log() { echo "node.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "a kubelet and containerd need root"
[[ "$NODE_COUNT" =~ ^[1-9]$ ]] || die "SANDBOX_NODE_COUNT must be 1..9, not '$NODE_COUNT'"

# shellcheck source=../cluster/daemon.sh
source "$cluster/daemon.sh"
# shellcheck source=../cluster/pki.sh
source "$cluster/pki.sh"

node_name() { echo "sbx-node-$1"; }
kubelet_port() { echo $((10250 + 10 * ($1 - 1))); }
healthz_port() { echo $((10248 + 10 * ($1 - 1))); }
pod_cidr() { echo "10.244.$(($1 - 1)).0/24"; }
socket() { echo "$RUN/$(node_name "$1")/containerd.sock"; }

kubectl() { "$BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }

# ---- packages (Debian) --------------------------------------------------------
packages_present() {
  command -v containerd >/dev/null && command -v ctr >/dev/null && command -v runc >/dev/null &&
    command -v containerd-shim-runc-v2 >/dev/null && [ -x "$CNI_BIN/bridge" ] &&
    command -v iptables >/dev/null && command -v ipset >/dev/null
}
install_packages() {
  packages_present && return 0
  mkdir -p "$CACHE"
  # Serialise with other set-up scripts' apt runs; re-check under the lock.
  exec 7>"$CACHE/apt.lock"
  flock -w 900 7 || die "timed out waiting for $CACHE/apt.lock"
  if ! packages_present; then
    local pkgs=(containerd runc containernetworking-plugins iptables ipset)
    log "installing ${pkgs[*]} with apt-get ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${pkgs[@]}" >>"$CACHE/apt.log" 2>&1 ||
      { apt-get update >>"$CACHE/apt.log" 2>&1 &&
        apt-get install -y --no-install-recommends "${pkgs[@]}" >>"$CACHE/apt.log" 2>&1; } ||
      die "could not install ${pkgs[*]} (see $CACHE/apt.log)"
    packages_present || die "${pkgs[*]} still missing after apt-get install"
  fi
  exec 7>&-
}

# ---- pause image ------------------------------------------------------------------
# An OCI image archive holding only the static pause binary, written by hand
# (no registry and no image builder needed): $BIN/pause-<stamp>/pause.tar.
pause_stamp() {
  { echo "recipe=$PAUSE_RECIPE"; cat "$cluster/tools/pause/go.mod" "$cluster/tools/pause/main.go"; } |
    sha256sum | cut -c1-12
}
PAUSE_DIR="$BIN/pause-$(pause_stamp)"
PAUSE_TAR="$PAUSE_DIR/pause.tar"

build_pause() {
  [ -f "$PAUSE_TAR" ] && return 0
  local go tmp layer config manifest ldigest cdigest mdigest
  go="$(command -v go || echo /usr/local/go/bin/go)"
  [ -x "$go" ] || die "go not found (need Go >= 1.26)"
  tmp="$(mktemp -d "$BIN/.pause.XXXXXX")"
  log "building the pause image -> $PAUSE_TAR"
  (cd "$cluster/tools/pause" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly \
    "$go" build -trimpath -ldflags="-s -w" -o "$tmp/rootfs/pause" .)
  mkdir -p "$tmp/oci/blobs/sha256"
  tar -C "$tmp/rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    -cf "$tmp/layer.tar" pause
  ldigest="$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)"
  mv "$tmp/layer.tar" "$tmp/oci/blobs/sha256/$ldigest"
  config="{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{\"Entrypoint\":[\"/pause\"],\"User\":\"65535:65535\"},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$ldigest\"]}}"
  printf '%s' "$config" >"$tmp/config.json"
  cdigest="$(sha256sum "$tmp/config.json" | cut -d' ' -f1)"
  mv "$tmp/config.json" "$tmp/oci/blobs/sha256/$cdigest"
  manifest="{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$cdigest\",\"size\":${#config}},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$ldigest\",\"size\":$(stat -c %s "$tmp/oci/blobs/sha256/$ldigest")}]}"
  printf '%s' "$manifest" >"$tmp/manifest.json"
  mdigest="$(sha256sum "$tmp/manifest.json" | cut -d' ' -f1)"
  mv "$tmp/manifest.json" "$tmp/oci/blobs/sha256/$mdigest"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s"}}]}' \
    "$mdigest" "${#manifest}" "$PAUSE_IMAGE" >"$tmp/oci/index.json"
  tar -C "$tmp/oci" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    -cf "$tmp/pause.tar" oci-layout index.json blobs
  mkdir -p "$PAUSE_DIR"
  mv "$tmp/pause.tar" "$PAUSE_TAR"
  rm -rf "$tmp"
}

# ---- files ------------------------------------------------------------------------
# put_file <path> <mode>: write stdin there if it differs; returns 0 if it changed.
put_file() {
  local path="$1" mode="$2" tmp
  tmp="$(mktemp "$path.XXXXXX")"
  cat >"$tmp"
  chmod "$mode" "$tmp"
  if cmp -s "$tmp" "$path"; then rm -f "$tmp"; return 1; fi
  mv "$tmp" "$path"
}

# kubeconfig <user-stem>: a kubeconfig for the client certificate $PKI/<stem>.{crt,key}
kubeconfig() {
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sandbox-test
  cluster:
    server: $SERVER
    certificate-authority: $PKI/ca.crt
users:
- name: $1
  user:
    client-certificate: $PKI/$1.crt
    client-key: $PKI/$1.key
contexts:
- name: sandbox-test
  context: {cluster: sandbox-test, user: $1}
current-context: sandbox-test
EOF
}

https_ok() { curl -skf --max-time 2 "https://127.0.0.1:$1/healthz" 2>/dev/null | grep -qx ok; }

# args_current <name> <binary> args...: true if the daemon runs with exactly this argv
args_current() {
  local name="$1" comm pid
  shift
  comm="$(basename "$1")"
  pid="$(running_pid "$name" "$comm")"
  [ -n "$pid" ] && [ "$(tr '\0' '\n' <"/proc/$pid/cmdline")" = "$(printf '%s\n' "$@")" ]
}

# ensure_daemon <name> <changed 0|1> <health-fn> <binary> args...: (re)start the
# daemon unless it runs with this argv and unchanged config files; then wait
# until <health-fn> succeeds.
ensure_daemon() {
  local name="$1" changed="$2" health="$3" comm pid
  shift 3
  comm="$(basename "$1")"
  pid="$(running_pid "$name" "$comm")"
  if [ -n "$pid" ] && { [ "$changed" = 1 ] || ! args_current "$name" "$@"; }; then
    log "$name: configuration changed; restarting it (pid $pid)"
    stop_pid "$name" "$pid"
    pid=""
  fi
  if [ -z "$pid" ]; then
    log "starting $name (log $DIR/$name.log)"
    printf '\n===== %s: node.sh starting %s =====\n' "$(date -Is)" "$name" >>"$DIR/$name.log"
    start "$name" "$@"
  fi
  wait_for "$name" "$health" "$comm"
}

# ---- control-plane controllers ---------------------------------------------------
scheduler_healthy() { https_ok "$SCHEDULER_PORT"; }
controller_manager_healthy() { https_ok "$CONTROLLER_MANAGER_PORT"; }

# controller_kubeconfig <name>: its client certificate and kubeconfig; prints 1 if
# the kubeconfig changed, else 0.
controller_kubeconfig() {
  issue_client_cert "$PKI" "$1" "system:$1"
  if kubeconfig "$1" | put_file "$DIR/$1.kubeconfig" 600; then echo 1; else echo 0; fi
}

start_controllers() {
  local kc="$DIR/kube-scheduler.kubeconfig" changed
  changed="$(controller_kubeconfig kube-scheduler)"
  ensure_daemon kube-scheduler "$changed" scheduler_healthy "$BIN/kube-scheduler" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" \
    --leader-elect=false --profiling=false
  kc="$DIR/kube-controller-manager.kubeconfig"
  changed="$(controller_kubeconfig kube-controller-manager)"
  # --use-service-account-credentials: each controller acts as its own service
  # account (as kubeadm runs it), so the manager's own user needs only its role.
  # No pod CIDR allocation: each node's CNI config carries its own fixed range.
  ensure_daemon kube-controller-manager "$changed" controller_manager_healthy \
    "$BIN/kube-controller-manager" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$CONTROLLER_MANAGER_PORT" \
    --leader-elect=false --profiling=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range=10.0.0.0/24
}

# ---- one node -----------------------------------------------------------------------
# cgroup_parent <name>: /<name> in every cgroup hierarchy, the node's cgroupRoot.
# Each node needs its own: a kubelet kills pods it finds under its cgroup root
# that it does not know. cpuset needs its cpus/mems seeded from the root (v1).
cgroup_parent() {
  local d
  for d in /sys/fs/cgroup/*/; do
    mountpoint -q "$d" || continue
    mkdir -p "$d$1"
    if [ -f "${d}cpuset.cpus" ]; then
      [ -n "$(cat "$d$1/cpuset.cpus")" ] || cat "${d}cpuset.cpus" >"$d$1/cpuset.cpus"
      [ -n "$(cat "$d$1/cpuset.mems")" ] || cat "${d}cpuset.mems" >"$d$1/cpuset.mems"
    fi
  done
}

containerd_config() { # i
  local name run home
  name="$(node_name "$1")"
  run="$RUN/$name" home="$DIR/$name"
  cat <<EOF
# containerd for test node $name (written by tests/setup/node.sh)
version = 2
root = "$home/containerd"
state = "$run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$(socket "$1")"

[plugins."io.containerd.internal.v1.opt"]
  path = "$home/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # This host withholds CAP_SYS_RESOURCE even from root: no process may lower
  # its oom_score_adj, so runc would fail on the -998 a pod sandbox asks for.
  # Capped at containerd's own value instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$run/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$home/cni"
  # the test registry of tests/setup/registry.sh speaks plain HTTP on loopback
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."127.0.0.1:15000"]
    endpoint = ["http://127.0.0.1:15000"]
EOF
}

# The bridge's subnet is routed from this host: pod IPs answer here directly.
# firewall: Docker's FORWARD policy is DROP; this plugin lets pod traffic through.
cni_config() { # i
  local name
  name="$(node_name "$1")"
  cat <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$name",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "sbxbr$1",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$(pod_cidr "$1")"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$RUN/$name/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "firewall"}
  ]
}
EOF
}

kubelet_config() { # i
  local name home
  name="$(node_name "$1")"
  home="$DIR/$name"
  cat <<EOF
# kubelet for test node $name (written by tests/setup/node.sh)
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host has cgroup v1 (hybrid); see tests/cluster/versions.env.
failCgroupV1: false
# containerd 1.6 cannot report its cgroup driver; there is no systemd here.
cgroupDriver: cgroupfs
cgroupRoot: /$name
containerRuntimeEndpoint: unix://$(socket "$1")
address: $NODE_IP
port: $(kubelet_port "$1")
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(healthz_port "$1")
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
# per node: a kubelet removes the log dirs of pods it does not know
podLogsDir: $home/pod-logs
# a shared test machine: never evict pods or collect images because others filled the disk
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
failSwapOn: false
maxPods: 50
rotateCertificates: false
serverTLSBootstrap: false
EOF
}

# health checks take the node index from these (wait_for calls them without args)
current_node=""
containerd_healthy() { ctr --address "$(socket "$current_node")" version >/dev/null 2>&1; }
kubelet_healthy() {
  curl -sf --max-time 2 "http://127.0.0.1:$(healthz_port "$current_node")/healthz" 2>/dev/null |
    grep -qx ok
}

# import_images <i>: the pause and base images into the node's containerd,
# again only when either changed (stamp) or went missing.
import_images() {
  local name want have ctr_=(ctr --address "$(socket "$1")" --namespace k8s.io)
  name="$(node_name "$1")"
  want="pause=$(pause_stamp) base=$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")"
  have="$("${ctr_[@]}" images ls -q)"
  if [ "$(cat "$DIR/$name/images.stamp" 2>/dev/null)" = "$want" ] &&
    grep -qx "$PAUSE_IMAGE" <<<"$have" && grep -qx "docker.io/$BASE_IMAGE" <<<"$have"; then
    return 0
  fi
  log "$name: importing $PAUSE_IMAGE and $BASE_IMAGE into its containerd"
  "${ctr_[@]}" images import "$PAUSE_TAR" >/dev/null
  docker save "$BASE_IMAGE" | "${ctr_[@]}" images import - >/dev/null
  echo "$want" >"$DIR/$name/images.stamp"
}

# containerd pins each pod's network namespace as a bind mount in /run/netns, which it
# first turns into a shared mount point by bind-mounting the directory onto itself when
# it is not one. Two containerds doing that at once stack two such mounts, and a pin
# that ends up under the lower one can never be removed ("unlinkat ... device or
# resource busy"): its pod hangs in Terminating. So it is done once, here, before any
# of them starts (this host's / is a private mount, so nothing else shares it).
netns_dir() {
  mkdir -p /run/netns
  mountpoint -q /run/netns && return 0
  mount --bind /run/netns /run/netns
  mount --make-shared /run/netns
}

start_node() { # i
  local name home run changed kc
  name="$(node_name "$1")"
  home="$DIR/$name" run="$RUN/$name" current_node="$1"
  mkdir -p "$home/cni" "$home/kubelet" "$home/pod-logs" "$run"
  cgroup_parent "$name"

  changed=0
  containerd_config "$1" | put_file "$home/containerd.toml" 644 && changed=1
  cni_config "$1" | put_file "$home/cni/10-$name.conflist" 644 && changed=1
  ensure_daemon "containerd-$name" "$changed" containerd_healthy \
    "$(command -v containerd)" --config "$home/containerd.toml"
  import_images "$1"

  issue_client_cert "$PKI" "kubelet-$name" "system:node:$name" system:nodes
  changed=0
  kc="$home/kubelet.kubeconfig"
  kubeconfig "kubelet-$name" | put_file "$kc" 600 && changed=1
  kubelet_config "$1" | put_file "$home/kubelet.yaml" 644 && changed=1
  ensure_daemon "kubelet-$name" "$changed" kubelet_healthy "$BIN/kubelet" \
    --config="$home/kubelet.yaml" --kubeconfig="$kc" --root-dir="$home/kubelet" \
    --hostname-override="$name" --node-ip="$NODE_IP" \
    --node-labels=sandboxes.dev/test-node=true --v=1
}

# ---- kube-proxy ----------------------------------------------------------------------
# One for the host: every node shares this host's network namespace, so one set
# of iptables rules serves them all. It makes ClusterIP (and NodePort on the
# node IP) Services answer from this host. Named after node 1 for its topology.
proxy_healthy() { curl -sf --max-time 2 "http://127.0.0.1:$PROXY_HEALTHZ_PORT/healthz" >/dev/null 2>&1; }

start_proxy() {
  local changed
  issue_client_cert "$PKI" kube-proxy system:kube-proxy
  changed=0
  kubeconfig kube-proxy | put_file "$DIR/kube-proxy.kubeconfig" 600 && changed=1
  # conntrack limits and timeouts: 0 = leave this shared host's sysctls alone.
  ensure_daemon kube-proxy "$changed" proxy_healthy "$BIN/kube-proxy" \
    --kubeconfig="$DIR/kube-proxy.kubeconfig" --hostname-override="$(node_name 1)" \
    --bind-address="$NODE_IP" --proxy-mode=iptables --cluster-cidr=10.244.0.0/16 \
    --nodeport-addresses=primary \
    --healthz-bind-address="127.0.0.1:$PROXY_HEALTHZ_PORT" \
    --metrics-bind-address="127.0.0.1:$PROXY_METRICS_PORT" \
    --conntrack-max-per-core=0 --conntrack-tcp-timeout-established=0 --v=1
}

# ---- NetworkPolicy --------------------------------------------------------------------
# The bridge CNI enforces no NetworkPolicy, so kube-router's firewall alone (no routing,
# no service proxy) does: iptables chains KUBE-ROUTER-* and KUBE-POD-FW-*, and ipsets, in
# this host's namespace. One for the host, like kube-proxy: every node shares this network
# namespace and IP, and kube-router takes every Pod whose hostIP is its node's IP for its
# own, so one instance covers the Pods of every node. Its RBAC is applied in main.
netpol_healthy() { curl -sf --max-time 2 "http://127.0.0.1:$NETPOL_HEALTHZ_PORT/healthz" >/dev/null 2>&1; }

start_netpol() {
  local changed
  issue_client_cert "$PKI" kube-router system:kube-router
  changed=0
  kubeconfig kube-router | put_file "$DIR/kube-router.kubeconfig" 600 && changed=1
  ensure_daemon kube-router "$changed" netpol_healthy "$BIN/kube-router" \
    --kubeconfig="$DIR/kube-router.kubeconfig" --hostname-override="$(node_name 1)" \
    --run-firewall=true --run-router=false --run-service-proxy=false \
    --service-cluster-ip-range=10.0.0.0/24 --health-port="$NETPOL_HEALTHZ_PORT" \
    --metrics-port=0 --v=1
}

node_ready() { # name
  [ "$(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# ---- main -------------------------------------------------------------------------
total=$SECONDS
install_packages
bash "$here/docker.sh"
bash "$here/base-image.sh" >/dev/null
bash "$cluster/up.sh" >/dev/null
bash "$cluster/build.sh" kubernetes-node kube-router
mkdir -p "$BIN" "$DIR" "$RUN"
build_pause
SERVER="https://127.0.0.1:${SANDBOX_APISERVER_PORT:-16443}"
NODE_IP="${SANDBOX_NODE_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')}"
[ -n "$NODE_IP" ] || die "could not find this host's IP (set SANDBOX_NODE_IP)"

# One node.sh/node-down.sh at a time. Started daemons must not inherit fd 9.
exec 9>"$DIR/.lock"
flock 9

# RBAC for the API server's kubelet client (exec, logs), and the RuntimeClass.
kubectl apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: sandbox-test:kube-apiserver-kubelet-client
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:kubelet-api-admin}
---
# kube-router's firewall (start_netpol) reads Pods, Namespaces, NetworkPolicies and its Node.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: sandbox-test:kube-router
rules:
- apiGroups: [""]
  resources: [pods, namespaces, nodes, services, endpoints]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: sandbox-test:kube-router
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: system:kube-router}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: sandbox-test:kube-router}
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: runc
handler: runc
EOF

start_controllers
netns_dir
for i in $(seq 1 "$NODE_COUNT"); do start_node "$i"; done
start_proxy
start_netpol

deadline=$((SECONDS + TIMEOUT))
for i in $(seq 1 "$NODE_COUNT"); do
  until node_ready "$(node_name "$i")"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "$(node_name "$i") not Ready after ${TIMEOUT}s; last lines of $DIR/kubelet-$(node_name "$i").log:"
      tail -n 30 "$DIR/kubelet-$(node_name "$i").log" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
done
log "$(seq -f 'sbx-node-%g' -s ' ' 1 "$NODE_COUNT") Ready (${SECONDS}s); logs in $DIR/*.log"
