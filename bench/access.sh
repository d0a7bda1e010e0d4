#!/usr/bin/env bash
# Access-layer bench: `kubectl sandbox exec` and `kubectl sandbox cp` through the real API
# server's aggregation layer, against `docker exec` and `docker cp` of the same container, in
# one run. Brings the demo up (examples/demo.sh: the operator with the aggregated API
# registered, the demo Sandbox Ready), measures, and takes the demo down again.
#
# Figures (printed, and appended to target/bench/results.md when that directory exists):
#   exec: median of N runs of `kubectl sandbox exec demo -- true` / of `docker exec ID true`,
#         rounds interleaved; and the plugin back to back
#   resume: median of R execs on the demo Sandbox suspended by idleness / of plain execs
#   cp:   median of 7 uploads of a 64 MiB file, MiB/s, kubectl sandbox cp / docker cp, rounds
#         interleaved
set -euo pipefail
cd "$(dirname "$0")/.."
N=${BENCH_ACCESS_N:-30}
# The figures are of the release build, as the rest of `make bench` (bench/run.sh builds it).
export SANDBOX_DEMO_RELEASE=${SANDBOX_DEMO_RELEASE:-1}
NS=default
NAME=demo
WORK=$(mktemp -d)
# The APIService is cluster-wide: hold the lock the tests take (harness::aggregated::lock)
# for the whole run, so a test running meanwhile waits instead of losing its registration.
CACHE=${SANDBOX_CACHE:-$HOME/.cache/sandbox-operator}
mkdir -p "$CACHE"
exec 9>"$CACHE/aggregated-api.lock"
flock 9
trap 'bash examples/demo.sh down >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

bash examples/demo.sh >"$WORK/demo.log" 2>&1 || { tail -n 30 "$WORK/demo.log" >&2; exit 1; }
export KUBECONFIG=${KUBECONFIG:-$HOME/.cache/sandbox-operator/cluster/kubeconfig}
export PATH="$HOME/.cache/sandbox-operator/demo/bin:$PATH"
ID=$(kubectl get sbx "$NAME" -n "$NS" -o jsonpath='{.status.sandboxId}')
[[ -n $ID ]] || { echo "the demo Sandbox has no sandboxId" >&2; exit 1; }

# median of the seconds each run of "$@" took, over $1 runs
median() {
  local runs=$1 t0 t1
  shift
  for _ in $(seq "$runs"); do
    t0=$(date +%s.%N)
    "$@" >/dev/null
    t1=$(date +%s.%N)
    awk -v a="$t1" -v b="$t0" 'BEGIN {print a - b}'
  done | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'
}

# the median of the seconds on stdin, one per line
median_of() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# Rounds interleaved, as the other figures of `make bench`: both sides run on the same machine
# state, and an exec does not start on the heels of the previous one.
for _ in $(seq "$N"); do
  median 1 kubectl sandbox exec "$NAME" -n "$NS" -- true >>"$WORK/exec-plugin"
  median 1 docker exec "$ID" true >>"$WORK/exec-docker"
done
exec_plugin=$(median_of <"$WORK/exec-plugin")
exec_docker=$(median_of <"$WORK/exec-docker")
# Back to back: each exec starts as the previous one ends, sooner than the sandbox's next
# waiting process is started (an exec start here is ~60 ms), so some of them wait for one.
exec_b2b=$(median "$N" kubectl sandbox exec "$NAME" -n "$NS" -- true)
# What kubectl itself costs before our plugin runs (a no-op plugin found the same way), and
# the plugin run directly: the part of the exec figure this project owns.
printf '#!/bin/sh\nexit 0\n' >"$WORK/kubectl-noop" && chmod +x "$WORK/kubectl-noop"
launcher=$(PATH="$WORK:$PATH" median "$N" kubectl noop)
exec_direct=$(median "$N" kubectl-sandbox exec "$NAME" -n "$NS" -- true)
# Resume on demand: the demo Sandbox suspends after 2 s without traffic; each round waits until
# it is Sleeping, then times an exec, which wakes it and is answered in the same request.
R=${BENCH_ACCESS_RESUME_N:-15}
kubectl patch sbx "$NAME" -n "$NS" --type=merge -p '{"spec":{"idleAction":"suspend","idleTimeoutSeconds":2}}' >/dev/null
resume_times=()
for _ in $(seq "$R"); do
  deadline=$((SECONDS + 60))
  until [[ $(kubectl get sbx "$NAME" -n "$NS" -o jsonpath='{.status.phase}') == Sleeping ]]; do
    ((SECONDS < deadline)) || { echo "access: the demo Sandbox did not suspend within 60 s" >&2; exit 1; }
    sleep 0.2
  done
  resume_times+=("$(median 1 kubectl sandbox exec "$NAME" -n "$NS" -- true)")
done
kubectl patch sbx "$NAME" -n "$NS" --type=json \
  -p '[{"op":"remove","path":"/spec/idleAction"},{"op":"remove","path":"/spec/idleTimeoutSeconds"}]' >/dev/null
exec_resume=$(printf '%s\n' "${resume_times[@]}" | median_of)
head -c $((64 << 20)) /dev/urandom >"$WORK/blob"
# Rounds interleaved, as the exec rounds: each pair of uploads runs on the same machine state.
C=${BENCH_ACCESS_CP_N:-7}
for _ in $(seq "$C"); do
  median 1 kubectl sandbox cp "$WORK/blob" "$NS/$NAME:/tmp/blob" >>"$WORK/cp-plugin"
  median 1 docker cp "$WORK/blob" "$ID:/tmp/blob" >>"$WORK/cp-docker"
done
cp_plugin=$(median_of <"$WORK/cp-plugin")
cp_docker=$(median_of <"$WORK/cp-docker")

report=$(awk -v ep="$exec_plugin" -v ed="$exec_docker" -v cpp="$cp_plugin" -v cpd="$cp_docker" \
  -v la="$launcher" -v dx="$exec_direct" -v er="$exec_resume" -v rn="$R" -v bb="$exec_b2b" 'BEGIN {
  printf "access: kubectl sandbox exec -- true %.3f s vs docker exec %.3f s, rounds interleaved: %.2fx (target <= 1.3x)\n", ep, ed, ep / ed
  printf "access:   the same back to back (no pause between execs): %.3f s, %.2fx\n", bb, bb / ed
  printf "access:   of which kubectl launching a plugin %.3f s (a no-op plugin); kubectl-sandbox exec run directly %.3f s: %.2fx\n", la, dx, dx / ed
  printf "access: resume on demand: kubectl sandbox exec -- true on a suspended sandbox %.3f s (median of %d) vs on a running one %.3f s: %.2fx (target <= 2x)\n", er, rn, ep, er / ep
  printf "access: kubectl sandbox cp 64 MiB %.1f MiB/s vs docker cp %.1f MiB/s: %.2fx of its throughput (target >= 0.5x)\n", 64 / cpp, 64 / cpd, cpd / cpp
}')
echo "$report"
[[ -d target/bench ]] && printf '\n%s\n' "$report" >>target/bench/results.md
exit 0
