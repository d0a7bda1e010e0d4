#!/usr/bin/env bash
# Starts (or reuses) a real image registry for the image-pull tests: Debian's `docker-registry`
# (the distribution registry) on loopback, with htpasswd (bcrypt) basic auth. No TLS: the Docker
# engine treats registries on 127.0.0.0/8 as insecure-allowed, so plain HTTP on loopback needs
# no daemon configuration.
#
# Writes $CACHE/registry/env with
#   SANDBOX_REGISTRY           host:port of the registry (127.0.0.1:15000)
#   SANDBOX_REGISTRY_USER      the one htpasswd user
#   SANDBOX_REGISTRY_PASSWORD  its password (a test credential, nothing else)
#   SANDBOX_REGISTRY_LOG       the registry's log, one line per request (tests count blob GETs)
#   SANDBOX_REGISTRY_HTPASSWD  the htpasswd file, for tests that start a registry of their own
#   SANDBOX_REGISTRY_BIN       the registry binary
# and prints its path. Idempotent; well under a second when already running.
set -euo pipefail

CACHE="${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}"
ROOT="$CACHE/registry"
PORT="${SANDBOX_REGISTRY_PORT:-15000}"
ADDR="127.0.0.1:$PORT"
USER_NAME="sandbox-test"
PASSWORD="sandbox-test-registry-password"
BIN=/usr/bin/docker-registry
mkdir -p "$ROOT/data"

here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/docker.sh" >&2

if [ ! -x "$BIN" ] || ! command -v htpasswd >/dev/null 2>&1; then
  echo "registry.sh: installing docker-registry and apache2-utils (once)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends docker-registry apache2-utils >&2 \
    || { apt-get update >&2 && apt-get install -y --no-install-recommends docker-registry apache2-utils >&2; }
fi

# One caller at a time decides whether to start the server (tests call this concurrently).
exec 9>"$ROOT/registry.lock"
flock 9

if [ ! -s "$ROOT/htpasswd" ]; then
  htpasswd -Bbn "$USER_NAME" "$PASSWORD" > "$ROOT/htpasswd.tmp"
  mv -f "$ROOT/htpasswd.tmp" "$ROOT/htpasswd"
fi

# The access log (Apache combined format, one line per request) goes to stdout with the
# registry's own log; tests count `GET /v2/<repo>/blobs/` lines in it.
cat > "$ROOT/config.yml.tmp" <<YAML
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: $ROOT/data
  delete:
    enabled: true
http:
  addr: $ADDR
  headers:
    X-Content-Type-Options: [nosniff]
auth:
  htpasswd:
    realm: sandbox-operator-tests
    path: $ROOT/htpasswd
YAML
mv -f "$ROOT/config.yml.tmp" "$ROOT/config.yml"

# /v2/ answers 401 without credentials once the registry is up.
healthy() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$ADDR/v2/" | grep -qE '^(200|401)$'; }

pidfile="$ROOT/registry.pid"
# The pid must still be our server's (`running_pid`: after a new machine session the recorded
# pid may belong to an unrelated process, which would pass for a server that never answers).
# shellcheck source=../cluster/daemon.sh
source "$here/../cluster/daemon.sh"
running() { [ -n "$(DIR="$ROOT" running_pid registry docker-registry)" ]; }
if ! running; then
  setsid nohup "$BIN" serve "$ROOT/config.yml" >> "$ROOT/registry.log" 2>&1 < /dev/null 9>&- &
  echo $! > "$pidfile"
fi
# A running registry that is merely slow (a loaded machine) is waited for, never restarted.
if ! healthy; then
  deadline=$((SECONDS + 30))
  until healthy; do
    if [ $SECONDS -ge $deadline ]; then
      echo "registry.sh: the registry did not answer at http://$ADDR/v2/ within 30 s; log:" >&2
      tail -20 "$ROOT/registry.log" >&2
      exit 1
    fi
    sleep 0.2
  done
fi

cat > "$ROOT/env.tmp.$$" <<ENV
SANDBOX_REGISTRY=$ADDR
SANDBOX_REGISTRY_USER=$USER_NAME
SANDBOX_REGISTRY_PASSWORD=$PASSWORD
SANDBOX_REGISTRY_LOG=$ROOT/registry.log
SANDBOX_REGISTRY_HTPASSWD=$ROOT/htpasswd
SANDBOX_REGISTRY_BIN=$BIN
ENV
mv -f "$ROOT/env.tmp.$$" "$ROOT/env"
echo "$ROOT/env"
