#!/usr/bin/env bash
# The official E2B JS SDK (`e2b` from npm, pinned below) in a directory outside the checkout,
# which tests/e2b_api.rs drives the operator's E2B-compatible API with (tests/e2b/driver.mjs):
#
#   $CACHE/e2b-js/<version>/node_modules/e2b   with `e2b@$E2B_JS_VERSION` installed
#
# CACHE is $SANDBOX_CACHE, default ~/.cache/sandbox-operator. Needs Node.js >= 20.18.1 with
# npm, the SDK's `engines` (installed with apt-get when missing; Debian 12's own nodejs is 18,
# too old, so the apt source must offer a newer one, e.g. NodeSource's). When the directory
# already holds the pinned version this takes a few ms.
# Usage: tests/setup/e2b-js.sh [--force]   (--force reinstalls)
set -euo pipefail

E2B_JS_VERSION=2.51.0
CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
DIR="$CACHE/e2b-js/$E2B_JS_VERSION"
SUDO=()
[ "$(id -u)" -eq 0 ] || SUDO=(sudo -n)

log() { echo "e2b-js.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case "${1:-}" in
  --force) rm -rf "$DIR" ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

installed() {
  [ -f "$DIR/node_modules/e2b/package.json" ] &&
    [ "$(node -p 'require(process.argv[1]).version' "$DIR/node_modules/e2b/package.json" 2>/dev/null)" = "$E2B_JS_VERSION" ]
}

apt_wait_lock() {
  # Another apt-get/dpkg may be running: wait for it, don't race it.
  local deadline=$((SECONDS + 600))
  while pgrep -x apt-get >/dev/null 2>&1 || pgrep -x dpkg >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "apt-get/dpkg still busy after 600 s"
    sleep 2
  done
}

ensure_node() {
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || die "node and npm are missing and apt-get is unavailable"
  apt_wait_lock
  log "installing nodejs and npm with apt-get..."
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get install -y --no-install-recommends nodejs npm >>"$CACHE/e2b-js/apt.log" 2>&1 ||
    { "${SUDO[@]}" apt-get update >>"$CACHE/e2b-js/apt.log" 2>&1 &&
      "${SUDO[@]}" apt-get install -y --no-install-recommends nodejs npm >>"$CACHE/e2b-js/apt.log" 2>&1; } ||
    die "apt-get install nodejs npm failed (see $CACHE/e2b-js/apt.log)"
}

# The SDK's engines: node >= 20.18.1 (20.x) or >= 22.
node_new_enough() {
  node -e 'const [a, b, c] = process.versions.node.split(".").map(Number);
    process.exit(a >= 22 || (a === 20 && (b > 18 || (b === 18 && c >= 1))) ? 0 : 1)'
}

command -v node >/dev/null 2>&1 && installed && exit 0
mkdir -p "$CACHE/e2b-js"
# Serialise with a concurrent run of this script; re-check under the lock.
exec 8>"$CACHE/e2b-js/.lock"
flock -w 600 8 || die "timed out waiting for $CACHE/e2b-js/.lock"
ensure_node
node_new_enough || die "node $(node --version) is too old for e2b@$E2B_JS_VERSION (needs >= 20.18.1 or >= 22)"
installed && exit 0
log "installing e2b@$E2B_JS_VERSION into $DIR ..."
rm -rf "$DIR"
mkdir -p "$DIR"
echo '{"private": true}' >"$DIR/package.json"
npm install --prefix "$DIR" --no-audit --no-fund --save-exact "e2b@$E2B_JS_VERSION" >"$CACHE/e2b-js/npm.log" 2>&1 ||
  die "npm install e2b@$E2B_JS_VERSION failed (see $CACHE/e2b-js/npm.log)"
installed || die "e2b $E2B_JS_VERSION still missing after npm install"
log "ready: $DIR/node_modules/e2b"
