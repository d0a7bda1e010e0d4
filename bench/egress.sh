#!/usr/bin/env bash
# Egress gateway bench: connection setup and bulk throughput from a sandbox through the
# egress gateway, against the same requests over the engine's plain bridge, in one run.
#
# Topology (all local): a "fake internet" network with a file server container (host
# python3's http.server, mounted read-only into the base image; the name `files.bench` is a
# network alias, so the gateway resolves it through the engine's embedded DNS); an internal
# network with the gateway (`sandbox-operator gateway serve`, the built binary mounted) and a
# sandbox behind it; and a sandbox on the fake internet directly (the "direct bridge" side).
#
# Figures (printed, and appended to target/bench/results.md when that directory exists):
#   setup: median of N sequential `curl` of a 1 KiB file (connect + request + response)
#   bulk:  median of 5 downloads of a 64 MiB file, MiB/s
set -euo pipefail
cd "$(dirname "$0")/.."
N=${BENCH_EGRESS_N:-50}
BIN=${BENCH_EGRESS_BIN:-}
if [[ -z $BIN ]]; then
  for c in target/release/sandbox-operator "${CARGO_TARGET_DIR:-target}/release/sandbox-operator" "${CARGO_TARGET_DIR:-target}/debug/sandbox-operator"; do
    [[ -x $c ]] && { BIN=$(realpath "$c"); break; }
  done
fi
[[ -x $BIN ]] || { echo "no operator binary: build it (cargo build --release)" >&2; exit 1; }
IMG=${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}
P=bench-egress-$$
WORK=$(mktemp -d)
cleanup() {
  docker rm -f "$P-srv" "$P-gw" "$P-behind" "$P-direct" >/dev/null 2>&1 || true
  docker network rm "$P-int" "$P-inet" >/dev/null 2>&1 || true
  docker volume rm "$P-policy" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

head -c 1024 /dev/zero > "$WORK/small"
head -c $((64 << 20)) /dev/zero > "$WORK/big"
PY=$(readlink -f /usr/bin/python3)
LIB=/usr/lib/x86_64-linux-gnu
docker network create "$P-inet" >/dev/null
docker network create --internal -o com.docker.network.bridge.inhibit_ipv4=true \
  --subnet 10.250.$((RANDOM % 200)).0/24 "$P-int" >/dev/null
SUBNET=$(docker network inspect "$P-int" -f '{{(index .IPAM.Config 0).Subnet}}')
GWIP=${SUBNET%.0/24}.2
docker network rm "$P-int" >/dev/null
docker network create --internal -o com.docker.network.bridge.inhibit_ipv4=true \
  --subnet "$SUBNET" --ip-range "${SUBNET%.0/24}.128/25" "$P-int" >/dev/null

docker run -d --name "$P-srv" --network "$P-inet" --network-alias files.bench \
  -v "$PY:/usr/bin/python3:ro" -v "/usr/lib/python3.11:/usr/lib/python3.11:ro" \
  -v "$LIB/libexpat.so.1:$LIB/libexpat.so.1:ro" -v "$LIB/libz.so.1:$LIB/libz.so.1:ro" \
  -v "$WORK:/srv:ro" -w /srv "$IMG" python3 -m http.server 80 >/dev/null

docker volume create "$P-policy" >/dev/null
docker create --name "$P-gw" --network "$P-int" --ip "$GWIP" --user 65532:65532 \
  --cap-drop ALL --security-opt no-new-privileges --read-only \
  --sysctl net.ipv4.ip_unprivileged_port_start=0 \
  -v "$P-policy:/policy" -v "$BIN:/opt/so:ro" --entrypoint /opt/so "$IMG" \
  gateway serve --listen "$GWIP" --policy-dir /policy --ports 80 >/dev/null
docker network connect "$P-inet" "$P-gw"
docker start "$P-gw" >/dev/null
docker run -d --name "$P-behind" --network "$P-int" --dns "$GWIP" "$IMG" sleep infinity >/dev/null
docker run -d --name "$P-direct" --network "$P-inet" "$IMG" sleep infinity >/dev/null
echo "{\"allowed\":[\"files.bench\"]}" > "$WORK/$P-behind.json"
docker cp "$WORK/$P-behind.json" "$P-gw:/policy/$P-behind.json"

# Wait (bounded) until both sides fetch the small file.
for side in behind direct; do
  for _ in $(seq 60); do
    docker exec "$P-$side" curl -sf -o /dev/null -m 2 http://files.bench/small && break
    sleep 0.5
  done
done

measure() { # side → "setup_median_ms bulk_median_MiBps"
  docker exec "$P-$1" sh -c '
    for i in $(seq '"$N"'); do curl -s -o /dev/null -w "%{time_total}\n" http://files.bench/small; done | sort -n | awk "{a[NR]=\$1} END {printf \"%.2f \", a[int((NR+1)/2)]*1000}"
    for i in 1 2 3 4 5; do curl -s -o /dev/null -w "%{speed_download}\n" http://files.bench/big; done | sort -n | awk "{a[NR]=\$1} END {printf \"%.0f\n\", a[3]/1048576}"'
}
read -r DS DB < <(measure direct)
read -r GS GB < <(measure behind)
REPORT=$(cat <<EOT

## Egress gateway (bench/egress.sh, $(basename "$(dirname "$BIN")") build of the operator binary)

| figure | through the gateway | direct bridge | ratio |
|---|---|---|---|
| request setup + 1 KiB response, median of $N (ms) | $GS | $DS | $(awk "BEGIN{printf \"%.2f\", $GS/$DS}")× |
| bulk download of 64 MiB, median of 5 (MiB/s) | $GB | $DB | $(awk "BEGIN{printf \"%.2f\", $GB/$DB}")× |
EOT
)
echo "$REPORT"
[[ -d target/bench ]] && echo "$REPORT" >> target/bench/results.md
exit 0
