#!/usr/bin/env bash
# `make bench`, runtime figure: what gVisor costs a sandbox's life. For runc and runsc (each
# registered with the engine: tests/setup/gvisor.sh), BENCH_RT_N rounds [10] of
#   create+start  `docker run -d` of the base image with the provider's hardened defaults,
#                 until the engine answers (the CLI returns once the container runs);
#   exec          BENCH_RT_EXECS [10] `docker exec <c> true` on the running container.
# Medians and p90 in milliseconds, printed and written to target/bench/runtimes.md. Every
# container carries the label sandboxes.bench/runtimes and is removed at the end.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$REPO/target/bench"
N="${BENCH_RT_N:-10}"
EXECS="${BENCH_RT_EXECS:-10}"
IMAGE="${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}"
LABEL="sandboxes.bench/runtimes=$$"
mkdir -p "$OUT"

bash "$REPO/tests/setup/docker.sh"
bash "$REPO/tests/setup/base-image.sh"
bash "$REPO/tests/setup/gvisor.sh"

cleanup() {
    ids="$(docker ps -aq --filter "label=$LABEL")"
    # shellcheck disable=SC2086
    [ -z "$ids" ] || docker rm -f $ids >/dev/null
}
trap cleanup EXIT

ms_now() { date +%s%N; }
# Median and p90 of the numbers on stdin (milliseconds, one decimal).
summary() { sort -n | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; p=a[int(NR*0.9+0.999)]; printf "%.1f | %.1f", m/1e6, p/1e6}'; }

HARDENING=(--cap-drop ALL --security-opt no-new-privileges:true --pids-limit 4096)
for cap in CHOWN DAC_OVERRIDE FOWNER FSETID KILL NET_BIND_SERVICE SETGID SETUID; do
    HARDENING+=(--cap-add "$cap")
done

{
    echo "| runtime | create+start median ms | p90 ms | exec median ms | p90 ms |"
    echo "|---|---|---|---|---|"
} >"$OUT/runtimes.md"
for runtime in runc runsc; do
    starts=()
    execs=()
    for _ in $(seq "$N"); do
        t0=$(ms_now)
        c=$(docker run -d --runtime "$runtime" --label "$LABEL" "${HARDENING[@]}" "$IMAGE" sleep infinity)
        starts+=($(( $(ms_now) - t0 )))
        for _ in $(seq "$EXECS"); do
            t0=$(ms_now)
            docker exec "$c" true
            execs+=($(( $(ms_now) - t0 )))
        done
        docker rm -f "$c" >/dev/null
    done
    s="$(printf '%s\n' "${starts[@]}" | summary)"
    e="$(printf '%s\n' "${execs[@]}" | summary)"
    echo "| $runtime | $s | $e |" >>"$OUT/runtimes.md"
done
cat "$OUT/runtimes.md"
