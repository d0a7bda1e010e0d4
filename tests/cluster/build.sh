#!/usr/bin/env bash
# Build the test control-plane binaries (kube-apiserver, kubectl, etcd, helm)
# at the versions pinned in tests/cluster/versions.env, from Go modules, into
#
#   $CACHE/bin/<tool>-<version>/<binaries>      (real binaries + .stamp)
#   $CACHE/bin/{kube-apiserver,kubectl,etcd,helm}  (symlinks to the pinned ones)
#
# CACHE is $SANDBOX_CACHE, default ~/.cache/sandbox-operator (outside the checkout).
# Idempotent: when every pinned build is present and its stamp matches the
# checked-in tools module (tests/cluster/tools/<tool>/go.{mod,sum}), it only
# refreshes the symlinks and exits (a few ms). A cold build takes a long
# while on 2 cores; the Go build cache (~/.cache/go-build) makes rebuilds cheap.
#
#   tests/cluster/build.sh [--force] [tool...]
#
# tools: kubernetes (kube-apiserver, kubectl), etcd, helm — the default set,
# which up.sh needs — and kubernetes-node (kubelet, kube-scheduler,
# kube-controller-manager, kube-proxy) and kube-router (the nodes' NetworkPolicy
# enforcer), which only tests/setup/node.sh asks for.
# --force rebuilds the named (or default) tools.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
BIN="$CACHE/bin"
# Bump when the build recipe below changes (flags, ldflags, ...) to force rebuilds.
RECIPE=1

# tool name -> version, output binaries
declare -A VERSION=([kubernetes]="$KUBERNETES_VERSION" [etcd]="$ETCD_VERSION" [helm]="$HELM_VERSION"
  [kubernetes-node]="$KUBERNETES_NODE_VERSION" [kube-router]="$KUBE_ROUTER_VERSION")
declare -A OUTPUTS=([kubernetes]="kube-apiserver kubectl" [etcd]="etcd" [helm]="helm"
  [kubernetes-node]="kubelet kube-scheduler kube-controller-manager kube-proxy" [kube-router]="kube-router")

usage() { echo "usage: $0 [--force] [${!VERSION[*]}]..." >&2; exit 2; }
force=0
TOOLS=()
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    *) [ -n "${VERSION[$arg]:-}" ] || usage; TOOLS+=("$arg") ;;
  esac
done
[ ${#TOOLS[@]} -gt 0 ] || TOOLS=(kubernetes etcd helm)

stamp() { # tool -> content identifying this build's inputs
  local t="$1"
  printf 'recipe=%s version=%s\n' "$RECIPE" "${VERSION[$t]}"
  cat "$here/tools/$t/go.mod" "$here/tools/$t/go.sum" | sha256sum | cut -d' ' -f1
}

is_built() { # tool -> 0 if the pinned build is complete
  local t="$1" dir="$BIN/$1-${VERSION[$1]}" b
  [ "$force" = 0 ] || return 1
  [ -f "$dir/.stamp" ] || return 1
  for b in ${OUTPUTS[$t]}; do [ -x "$dir/$b" ] || return 1; done
  [ "$(cat "$dir/.stamp")" = "$(stamp "$t")" ]
}

link() { # point $BIN/<binary> at the pinned build of tool
  local t="$1" b
  for b in ${OUTPUTS[$t]}; do
    if [ "$(readlink "$BIN/$b" 2>/dev/null)" != "$t-${VERSION[$t]}/$b" ]; then
      ln -sfn "$t-${VERSION[$t]}/$b" "$BIN/$b"
    fi
  done
}

all_built() {
  local t
  for t in "${TOOLS[@]}"; do is_built "$t" || return 1; done
}

# ---- fast path: everything present ------------------------------------------
if all_built; then
  for t in "${TOOLS[@]}"; do link "$t"; done
  exit 0
fi

# ---- slow path: build what is missing ----------------------------------------
GO="$(command -v go || true)"
[ -n "$GO" ] || GO=/usr/local/go/bin/go
[ -x "$GO" ] || { echo "build.sh: go not found (need Go >= 1.26)" >&2; exit 1; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
# GOPROXY / GOMODCACHE / GOCACHE are taken from the environment (go env).

mkdir -p "$BIN" "$CACHE/src"
# Serialise concurrent build.sh runs (parallel test jobs on a fresh machine).
exec 9>"$CACHE/.build.lock"
flock 9

modtime() { # module@version -> its publication time (for buildDate)
  "$GO" mod download -json "$1" | sed -n 's/^\s*"Time": "\(.*\)",$/\1/p'
}

build_tool() {
  local t="$1" v="${VERSION[$1]}" src="$CACHE/src/$1-${VERSION[$1]}"
  local out="$BIN/.$t-$v.tmp.$$" dest="$BIN/$t-$v" ldflags pkgs start
  start=$SECONDS
  echo "build.sh: building $t $v (see go output below) ..." >&2

  grep -q " $v\$\| $v //" "$here/tools/$t/go.mod" ||
    { echo "build.sh: tools/$t/go.mod is not at $v; run tests/cluster/tools/regen.sh $t" >&2; exit 1; }
  # Build from a scratch copy of the checked-in module (never writes to the checkout).
  rm -rf "$src" && mkdir -p "$src"
  cp "$here/tools/$t/go.mod" "$here/tools/$t/go.sum" "$src/"

  ldflags="-s -w"
  case "$t" in
    kubernetes|kubernetes-node)
      local minor="${v#v1.}" date pkg b
      minor="${minor%%.*}"
      date="$(cd "$src" && modtime "k8s.io/kubernetes@$v")"
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
      done
      pkgs=""
      for b in ${OUTPUTS[$t]}; do pkgs+=" k8s.io/kubernetes/cmd/$b"; done ;;
    etcd)
      pkgs="go.etcd.io/etcd/server/v3" ;;
    helm)
      local kminor
      kminor="$(awk '$1 == "k8s.io/client-go" { print $2 }' "$src/go.mod")" # v0.37.0
      kminor="${kminor#v0.}"; kminor="${kminor%%.*}"
      ldflags+=" -X helm.sh/helm/v3/internal/version.version=$v"
      ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
      ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1"
      ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$kminor"
      ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1"
      ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kminor"
      pkgs="helm.sh/helm/v3/cmd/helm" ;;
    kube-router)
      ldflags+=" -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$v"
      pkgs="github.com/cloudnativelabs/kube-router/v2/cmd/kube-router" ;;
  esac

  rm -rf "$out" && mkdir -p "$out"
  # shellcheck disable=SC2086 # pkgs is a word list
  (cd "$src" && "$GO" build -trimpath -ldflags="$ldflags" -o "$out/" $pkgs)
  # etcd's main package is the module root go.etcd.io/etcd/server/v3 -> binary "server"
  if [ "$t" = etcd ]; then mv "$out/server" "$out/etcd"; fi
  stamp "$t" > "$out/.stamp"
  rm -rf "$dest" && mv "$out" "$dest"
  echo "build.sh: built $t $v in $((SECONDS - start))s -> $dest" >&2
}

total=$SECONDS
for t in "${TOOLS[@]}"; do
  is_built "$t" || build_tool "$t"
  link "$t"
done
echo "build.sh: done in $((SECONDS - total))s; binaries in $BIN" >&2
