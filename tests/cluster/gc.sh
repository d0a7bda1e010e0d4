#!/usr/bin/env bash
# Remove what finished test processes left behind: every namespace of the test control plane,
# and every Docker container and volume (the SaaS doubles' sandboxes), that carries the
# harness's pid label (test.sandboxes.dev/pid) and whose process no longer runs. Anything
# whose process runs (another test run may be going on) or without the label is kept.
#
#   tests/cluster/gc.sh            namespaces, containers and volumes of exited test processes
#   tests/cluster/gc.sh --legacy   also unlabelled namespaces (from runs before the label
#                                  existed), keeping default, kube-* and the ones named in
#                                  $SANDBOX_GC_KEEP
#
# Our CRs carry finalizers that only a running operator removes; the test's operator is gone,
# so the finalizers are dropped first (provider resources are each test's own guard's business
# and were removed by it). The namespaces are then deleted; the test control plane's
# kube-controller-manager (when it runs) empties them, otherwise they are emptied and finalized
# here. Runs at the end of `make test`; safe to run at any time.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
LABEL=test.sandboxes.dev/pid
CRS=sandboxes.sandboxes.dev,sandboxvolumes.sandboxes.dev,sandboxtemplates.sandboxes.dev,sandboxwarmpools.sandboxes.dev,sandboxbudgets.sandboxes.dev

log() { echo "gc.sh: $*" >&2; }

# Whether the process a pid label names no longer runs. A value that is not a pid names no
# process, as with the namespaces below.
pid_gone() {
  case "$1" in '' | '<none>' | *[!0-9]*) return 0 ;; esac
  ! kill -0 "$1" 2>/dev/null
}

# Containers (with their anonymous volumes) and volumes of exited test processes: the doubles
# remove theirs on shutdown or drop, which a killed test process never reaches.
gc_docker() {
  local listed id pid dead=()
  listed="$(docker ps -a --filter "label=$LABEL" --format "{{.ID}} {{.Label \"$LABEL\"}}" 2>/dev/null)" ||
    { log "no Docker engine; skipping containers and volumes"; return 0; }
  while read -r id pid; do
    if [ -n "$id" ] && pid_gone "$pid"; then dead+=("$id"); fi
  done <<<"$listed"
  if [ "${#dead[@]}" -gt 0 ]; then
    log "removing ${#dead[@]} leftover test container(s)"
    docker rm -f -v "${dead[@]}" >/dev/null || log "some containers could not be removed"
  fi
  dead=()
  listed="$(docker volume ls --filter "label=$LABEL" --format "{{.Name}} {{.Label \"$LABEL\"}}")" ||
    { log "could not list volumes; skipping them"; return 0; }
  while read -r id pid; do
    if [ -n "$id" ] && pid_gone "$pid"; then dead+=("$id"); fi
  done <<<"$listed"
  if [ "${#dead[@]}" -gt 0 ]; then
    log "removing ${#dead[@]} leftover test volume(s)"
    docker volume rm -f "${dead[@]}" >/dev/null || log "some volumes could not be removed"
  fi
  # Per-namespace sandbox networks that no container uses any more (tests that drive the
  # provider directly leave them; each takes one of the engine's address pools). A network in
  # use is never removed, and the provider recreates one it finds gone.
  docker network prune -f --filter "label=sandboxes.dev/component=namespace-network" >/dev/null ||
    log "could not prune unused sandbox networks"
}
gc_docker

kubectl version --request-timeout=5s >/dev/null 2>&1 || { log "no control plane; nothing to do"; exit 0; }

# The aggregated API's APIService left by an aborted test: one whose backend does not answer
# blocks the deletion of every namespace, so it goes first unless it is Available.
APISERVICE=v1alpha1.subresources.sandboxes.dev
if [ "$(kubectl get apiservice "$APISERVICE" --ignore-not-found \
  -o jsonpath='{.status.conditions[?(@.type=="Available")].status}' 2>/dev/null)" = False ]; then
  log "removing the unavailable APIService $APISERVICE"
  kubectl delete apiservice "$APISERVICE" --wait=false >/dev/null 2>&1 || true
fi

doomed=()
while read -r ns pid; do
  [ -n "$ns" ] || continue
  if [ -n "$pid" ] && [ "$pid" != "<none>" ] && kill -0 "$pid" 2>/dev/null; then continue; fi
  doomed+=("$ns")
done < <(kubectl get ns -l "$LABEL" --no-headers \
  -o "custom-columns=NAME:.metadata.name,PID:.metadata.labels.test\.sandboxes\.dev/pid")

if [ "${1:-}" = "--legacy" ]; then
  while read -r ns; do
    case "$ns" in default|kube-*|"") continue ;; esac
    case " ${SANDBOX_GC_KEEP:-} " in *" $ns "*) continue ;; esac
    doomed+=("$ns")
  done < <(kubectl get ns -l "!$LABEL" --no-headers -o custom-columns=NAME:.metadata.name)
fi

[ "${#doomed[@]}" -gt 0 ] || { log "no leftover test namespaces"; exit 0; }
log "removing ${#doomed[@]} leftover test namespace(s)"

for ns in "${doomed[@]}"; do
  # Drop our finalizers: the operator that would have removed them is gone.
  kubectl get "$CRS" -n "$ns" -o name 2>/dev/null | while read -r obj; do
    kubectl patch "$obj" -n "$ns" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  done
done
kubectl delete ns "${doomed[@]}" --wait=false --ignore-not-found >/dev/null

cache="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
cm_pid="$(cat "$cache/node/kube-controller-manager.pid" 2>/dev/null || true)"
# By its name too: after a reboot the recorded pid may be an unrelated process.
if [ -n "$cm_pid" ] && [ "$(cat "/proc/$cm_pid/comm" 2>/dev/null)" = "kube-controller" ]; then
  exit 0 # its namespace controller empties and removes them
fi
# No namespace controller: empty each namespace of what tests create, then finalize it.
kinds="$CRS,secrets,configmaps,serviceaccounts,roles,rolebindings,leases.coordination.k8s.io,events,services,pods,deployments.apps,networkpolicies.networking.k8s.io,resourcequotas"
for ns in "${doomed[@]}"; do
  kubectl delete "$kinds" --all -n "$ns" --wait=false >/dev/null 2>&1 || true
  kubectl get --raw "/api/v1/namespaces/$ns" >/dev/null 2>&1 || continue
  printf '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"%s"},"spec":{"finalizers":[]}}' "$ns" |
    kubectl replace --raw "/api/v1/namespaces/$ns/finalize" -f - >/dev/null 2>&1 || true
done
