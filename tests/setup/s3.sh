#!/usr/bin/env bash
# Starts (or reuses) a real S3-compatible server that verifies SigV4 signatures, for the
# template-store tests: s3s-fs (crates.io, pinned), listening on the Docker bridge gateway so
# both the host (the operator) and sandboxes (presigned transfers) reach it at one address —
# a SigV4 signature covers the Host header, so both sides must use the same one.
#
# Writes $CACHE/s3/env with SANDBOX_S3_ENDPOINT, SANDBOX_S3_ACCESS_KEY, SANDBOX_S3_SECRET_KEY
# and SANDBOX_S3_BUCKET, and prints its path. Idempotent; seconds when cached.
set -euo pipefail

CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
VERSION="0.14.1"
ROOT="$CACHE/s3"
BIN="$ROOT/install/bin/s3s-fs"
PORT="${SANDBOX_S3_PORT:-19000}"
ACCESS_KEY="sandbox-test-access"
SECRET_KEY="sandbox-test-secret-key-0123456789"
BUCKET="templates"
mkdir -p "$ROOT/data/$BUCKET"

here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/docker.sh" >&2

if [ ! -x "$BIN" ] || ! "$BIN" --version 2>/dev/null | grep -q "$VERSION"; then
  echo "s3.sh: building s3s-fs $VERSION (once; cached in $ROOT/install)" >&2
  cargo install s3s-fs --version "$VERSION" --features binary --locked --root "$ROOT/install" >&2
fi

HOST="$(docker network inspect bridge -f '{{(index .IPAM.Config 0).Gateway}}')"
# A freshly started engine may leave Gateway out of the default bridge's IPAM config; the
# bridge interface carries the same address.
if [ -z "$HOST" ]; then
  HOST="$(ip -4 -o addr show docker0 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')"
fi
[ -n "$HOST" ] || { echo "s3.sh: cannot find the Docker bridge gateway address" >&2; exit 1; }
ENDPOINT="http://$HOST:$PORT"

healthy() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$ENDPOINT/" | grep -qE '^(200|403)$'; }

# One caller at a time decides whether to start the server (tests call this concurrently).
exec 9>"$ROOT/s3.lock"
flock 9
pidfile="$ROOT/s3s-fs.pid"
# The pid must still be our server's (`running_pid`: after a new machine session the recorded
# pid may belong to an unrelated process, which would pass for a server that never answers).
# shellcheck source=../cluster/daemon.sh
source "$here/../cluster/daemon.sh"
running() { [ -n "$(DIR="$ROOT" running_pid s3s-fs s3s-fs)" ]; }
# s3s-fs resolves every object path against its working directory: a server started from a
# checkout that was deleted since (an earlier CI clone) answers 500 to everything. It is
# started from its own cache directory, and one left running from a deleted directory is
# replaced.
if running && [[ "$(readlink "/proc/$(cat "$pidfile")/cwd")" == *" (deleted)" ]]; then
  echo "s3.sh: the running s3s-fs works from a deleted directory; restarting it" >&2
  kill "$(cat "$pidfile")" 2>/dev/null || true
  for _ in $(seq 50); do running || break; sleep 0.1; done
fi
if ! running; then
  cd "$ROOT"
  setsid nohup "$BIN" --host "$HOST" --port "$PORT" --access-key "$ACCESS_KEY" --secret-key "$SECRET_KEY" \
    "$ROOT/data" > "$ROOT/s3s-fs.log" 2>&1 < /dev/null 9>&- &
  echo $! > "$pidfile"
fi
# A running server that is merely slow (a loaded machine) is waited for, never restarted.
if ! healthy; then
  deadline=$((SECONDS + 30))
  until healthy; do
    if [ $SECONDS -ge $deadline ]; then
      echo "s3.sh: s3s-fs did not answer at $ENDPOINT within 30 s; log:" >&2
      tail -20 "$ROOT/s3s-fs.log" >&2
      exit 1
    fi
    sleep 0.2
  done
fi

cat > "$ROOT/env.tmp.$$" <<ENV
SANDBOX_S3_ENDPOINT=$ENDPOINT
SANDBOX_S3_ACCESS_KEY=$ACCESS_KEY
SANDBOX_S3_SECRET_KEY=$SECRET_KEY
SANDBOX_S3_BUCKET=$BUCKET
ENV
mv -f "$ROOT/env.tmp.$$" "$ROOT/env"
echo "$ROOT/env"
