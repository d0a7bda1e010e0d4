#!/usr/bin/env bash
# Smoke-test the control plane from up.sh with the pinned kubectl and helm:
# CRD with a CEL validation rule and a status subresource (server-side apply,
# kubectl wait for Established, CEL rejection, status patch), RBAC via
# `kubectl auth can-i --as`, the default namespace, and a helm install.
# Cleans up what it creates. Exit status 0 = all good.
#
#   tests/cluster/smoke.sh        (runs up.sh first; cheap if already up)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
eval "$("$here/up.sh")"
# shellcheck source=env.sh
source "$here/env.sh"
k() { kubectl --request-timeout=20s "$@"; }
step() { echo "--- $*" >&2; }
fail() { echo "smoke.sh: FAIL: $*" >&2; exit 1; }

work="$(mktemp -d)"
cleanup() {
  kubectl delete --ignore-not-found --wait=false -f "$work/crd.yaml" >/dev/null 2>&1 || true
  helm uninstall smoke-chart --namespace default >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

step "versions"
k version
helm version --short

step "default namespace exists"
k get namespace default -o name

cat >"$work/crd.yaml" <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.cluster-smoke.example.com
spec:
  group: cluster-smoke.example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [replicas, maxReplicas]
            properties:
              replicas: {type: integer}
              maxReplicas: {type: integer}
            x-kubernetes-validations:
            - rule: "self.replicas <= self.maxReplicas"
              message: "replicas must not exceed maxReplicas"
          status:
            type: object
            properties:
              phase: {type: string}
EOF

step "CRD: server-side apply + wait Established"
k apply --server-side --field-manager=smoke -f "$work/crd.yaml"
k wait --for=condition=Established --timeout=60s crd/widgets.cluster-smoke.example.com

step "CR: server-side apply (valid)"
cat <<'EOF' | k apply --server-side --field-manager=smoke -f -
apiVersion: cluster-smoke.example.com/v1
kind: Widget
metadata: {name: ok, namespace: default}
spec: {replicas: 1, maxReplicas: 3}
EOF

step "CR: CEL rule rejects an invalid object"
if out="$(cat <<'EOF' | k apply --server-side --field-manager=smoke -f - 2>&1
apiVersion: cluster-smoke.example.com/v1
kind: Widget
metadata: {name: bad, namespace: default}
spec: {replicas: 5, maxReplicas: 3}
EOF
)"; then fail "invalid Widget was accepted"; fi
echo "$out"
grep -q "replicas must not exceed maxReplicas" <<<"$out" || fail "unexpected rejection: $out"

step "status subresource"
k patch widget ok --subresource=status --type=merge -p '{"status":{"phase":"Ready"}}'
[ "$(k get widget ok -o jsonpath='{.status.phase}')" = Ready ] || fail "status not stored"
# a main-resource update must not change status
k patch widget ok --type=merge -p '{"status":{"phase":"Ignored"}}' >/dev/null
[ "$(k get widget ok -o jsonpath='{.status.phase}')" = Ready ] || fail "status changed via main resource"

step "RBAC: admin yes, unbound service account no"
[ "$(k auth can-i get pods)" = yes ] || fail "admin cannot get pods"
if ans="$(k auth can-i --as system:serviceaccount:default:foo get pods)"; then
  fail "service account foo can get pods ($ans)"
fi
echo "system:serviceaccount:default:foo get pods: $ans"
[ "$ans" = no ] || fail "unexpected can-i answer: $ans"

step "helm install/list/uninstall"
mkdir -p "$work/chart/templates"
cat >"$work/chart/Chart.yaml" <<'EOF'
apiVersion: v2
name: smoke-chart
version: 0.1.0
EOF
cat >"$work/chart/templates/cm.yaml" <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata: {name: smoke-chart}
data: {hello: "{{ .Values.hello | default "world" }}"}
EOF
helm install smoke-chart "$work/chart" --namespace default --set hello=there >/dev/null
[ "$(k get configmap smoke-chart -o jsonpath='{.data.hello}')" = there ] || fail "helm release not applied"
helm list --namespace default
helm uninstall smoke-chart --namespace default

step "cleanup: delete CRD"
k delete -f "$work/crd.yaml" --timeout=60s
echo "smoke.sh: OK" >&2
