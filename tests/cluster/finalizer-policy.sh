#!/usr/bin/env bash
# Applies the chart's finalizer policy (templates/finalizer-policy.yaml, as a cluster-wide
# install renders it) to the test cluster, so the tests and benches run the operator as the
# chart installs it: each Sandbox gets its cleanup finalizer at admission. Idempotent.
# Usage: finalizer-policy.sh [OBJECT_SELECTOR_JSON]   (the policy's finalizerPolicy.objectSelector)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=/dev/null
source "$REPO/tests/cluster/env.sh"
args=(template sandbox-tests "$REPO/charts/sandbox-operator" --namespace sandbox-tests
  --api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy
  --show-only templates/finalizer-policy.yaml)
[ -z "${1:-}" ] || args+=(--set-json "finalizerPolicy.objectSelector=$1")
helm "${args[@]}" | kubectl apply --server-side --force-conflicts --field-manager=sandbox-tests -f - >/dev/null
