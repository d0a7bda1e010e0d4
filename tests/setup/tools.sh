#!/usr/bin/env bash
# Tools the GitOps tests run, installed or built idempotently:
#
#   lua5.4, lua5.1
#            Debian's Lua interpreters (apt), which run the Argo CD health check
#            deploy/argocd/health.lua on sample and real objects (tests/gitops.rs); 5.1 is
#            the language version of gopher-lua, the interpreter embedded in Argo CD.
#   kstatus  a tiny Go program over sigs.k8s.io/cli-utils/pkg/kstatus/status — the library Flux
#            and kpt read health with — built from tests/tools/kstatus (checked-in go.mod/go.sum)
#            into $CACHE/bin/kstatus-<stamp>/kstatus, linked as $CACHE/bin/kstatus.
#
# CACHE is $SANDBOX_CACHE, default ~/.cache/sandbox-operator (outside the checkout).
# When both are present and the kstatus build matches its sources, this takes a few ms.
# Usage: tests/setup/tools.sh [--force]   (--force rebuilds kstatus)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/../tools/kstatus" && pwd)"
CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
BIN="$CACHE/bin"
# Bump when the build recipe below changes, to force a rebuild.
RECIPE=1

force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

log() { echo "tools.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---- lua5.4, lua5.1 -----------------------------------------------------------
LUA_PACKAGES=(lua5.4 lua5.1)
lua_present() {
  local p
  for p in "${LUA_PACKAGES[@]}"; do command -v "$p" >/dev/null 2>&1 || return 1; done
}

install_lua() {
  lua_present && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "${LUA_PACKAGES[*]} missing and installing needs root (no sudo)"
    sudo=(sudo -n)
  fi
  mkdir -p "$CACHE"
  # Serialise with other set-up scripts' apt runs; re-check under the lock.
  exec 7>"$CACHE/apt.lock"
  flock -w 900 7 || die "timed out waiting for $CACHE/apt.lock"
  lua_present && return 0
  log "installing ${LUA_PACKAGES[*]} with apt-get ..."
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get install -y --no-install-recommends "${LUA_PACKAGES[@]}" >>"$CACHE/apt.log" 2>&1 ||
    { "${sudo[@]}" apt-get update >>"$CACHE/apt.log" 2>&1 &&
      "${sudo[@]}" apt-get install -y --no-install-recommends "${LUA_PACKAGES[@]}" >>"$CACHE/apt.log" 2>&1; } ||
    die "could not install ${LUA_PACKAGES[*]} (see $CACHE/apt.log)"
  lua_present || die "${LUA_PACKAGES[*]} still missing after apt-get install"
}

# ---- kstatus ----------------------------------------------------------------
stamp() {
  printf 'recipe=%s\n' "$RECIPE"
  cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -d' ' -f1
}

kstatus_built() {
  local stamp_now dir
  stamp_now="$(stamp)"
  dir="$BIN/kstatus-$(printf '%s' "$stamp_now" | sha256sum | cut -c1-12)"
  [ "$force" = 0 ] && [ -x "$dir/kstatus" ] && [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$stamp_now" ]
}

build_kstatus() {
  local stamp_now id dir out go start=$SECONDS
  stamp_now="$(stamp)"
  id="$(printf '%s' "$stamp_now" | sha256sum | cut -c1-12)"
  dir="$BIN/kstatus-$id"
  if ! kstatus_built; then
    go="$(command -v go || true)"
    [ -n "$go" ] || go=/usr/local/go/bin/go
    [ -x "$go" ] || die "go not found (need Go >= 1.24 to build tests/tools/kstatus)"
    mkdir -p "$BIN"
    exec 8>"$CACHE/.tools-build.lock"
    flock -w 900 8 || die "timed out waiting for $CACHE/.tools-build.lock"
    if ! kstatus_built; then
      log "building kstatus from $src ..."
      out="$BIN/.kstatus-$id.tmp.$$"
      rm -rf "$out" && mkdir -p "$out"
      # -mod=readonly: the checked-in go.sum is the truth; nothing is written to the checkout.
      (cd "$src" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
        "$go" build -trimpath -ldflags='-s -w' -o "$out/kstatus" .)
      printf '%s' "$stamp_now" >"$out/.stamp"
      rm -rf "$dir" && mv "$out" "$dir"
      log "built kstatus in $((SECONDS - start))s -> $dir"
    fi
  fi
  if [ "$(readlink "$BIN/kstatus" 2>/dev/null)" != "kstatus-$id/kstatus" ]; then
    ln -sfn "kstatus-$id/kstatus" "$BIN/kstatus"
  fi
}

install_lua
build_kstatus
