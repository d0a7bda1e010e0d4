#!/usr/bin/env bash
# The official E2B Python SDK (`e2b` from PyPI, pinned below) in a virtualenv outside the
# checkout, which tests/e2b_api.rs drives the operator's E2B-compatible API with:
#
#   $CACHE/e2b-py/<version>/bin/python   with `e2b==$E2B_PY_VERSION` installed
#
# CACHE is $SANDBOX_CACHE, default ~/.cache/sandbox-operator. When the venv already holds the
# pinned version this takes a few ms.
# Usage: tests/setup/e2b-py.sh [--force]   (--force recreates the venv)
set -euo pipefail

E2B_PY_VERSION=2.63.0
CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
VENV="$CACHE/e2b-py/$E2B_PY_VERSION"

log() { echo "e2b-py.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case "${1:-}" in
  --force) rm -rf "$VENV" ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

installed() {
  [ -x "$VENV/bin/python" ] &&
    [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("e2b"))' 2>/dev/null)" = "$E2B_PY_VERSION" ]
}

installed && exit 0
command -v python3 >/dev/null 2>&1 || die "python3 is missing (Debian: apt-get install python3 python3-venv)"
mkdir -p "$CACHE/e2b-py"
# Serialise with a concurrent run of this script; re-check under the lock.
exec 8>"$CACHE/e2b-py/.lock"
flock -w 600 8 || die "timed out waiting for $CACHE/e2b-py/.lock"
installed && exit 0
log "creating $VENV with e2b==$E2B_PY_VERSION ..."
rm -rf "$VENV"
python3 -m venv "$VENV" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "e2b==$E2B_PY_VERSION" >"$CACHE/e2b-py/pip.log" 2>&1 ||
  die "pip install e2b==$E2B_PY_VERSION failed (see $CACHE/e2b-py/pip.log)"
installed || die "e2b $E2B_PY_VERSION still missing after pip install"
log "ready: $VENV/bin/python"
