#!/usr/bin/env python3
"""The E2B bench's client side, run with the pinned SDK's Python (tests/setup/e2b-py.sh).

N rounds, interleaved: `Sandbox.create()` + the first `commands.run("true")` through the
operator's E2B API, against `docker run -d` + `docker exec ID true` of the same image; with
`--pool NAME`, also the SDK create naming a SandboxWarmPool (a claim) + the first command.
The SDK reads E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and E2B_DOMAIN from the environment.
Writes one JSON file.

    e2b_bench.py --n 20 --image IMAGE --out target/bench/e2b.json [--pool bench-e2b]
"""

import argparse
import json
import statistics
import subprocess
import time

from e2b import Sandbox

COMMAND = ["perl", "-e", "$SIG{TERM} = sub { exit 0 }; sleep"]
RAW = "sandboxes.dev/managed-by=bench-e2b-raw"
POOL_SIZE = 5  # the SandboxWarmPool's replicas (bench/e2b.sh)


def sdk_round(template: str, split: list[float] | None = None) -> float:
    """One create + first command; `split` gets the create's own share (where the time goes)."""
    t0 = time.monotonic()
    sbx = Sandbox.create(template=template, timeout=300)
    t1 = time.monotonic()
    r = sbx.commands.run("true")
    t = time.monotonic() - t0
    assert r.exit_code == 0, r
    sbx.kill()
    if split is not None:
        split.append(t1 - t0)
    return t


def docker_round(image: str) -> float:
    t0 = time.monotonic()
    cid = subprocess.run(["docker", "run", "-d", "--label", RAW, image, *COMMAND], check=True,
                         capture_output=True, text=True).stdout.strip()
    subprocess.run(["docker", "exec", cid, "true"], check=True)
    t = time.monotonic() - t0
    subprocess.run(["docker", "rm", "-f", cid], check=True, capture_output=True)
    return t


def refilled(namespace: str, pool: str) -> None:
    """Waits (untimed) until the pool has replaced the member just claimed: its refill is a
    sandbox start, which would otherwise land on the next round's cold create alone."""
    subprocess.run(["kubectl", "wait", "-n", namespace, "--timeout=120s",
                    f"--for=jsonpath={{.status.readyReplicas}}={POOL_SIZE}", f"sbxwp/{pool}"],
                   check=True, capture_output=True)


def summary(xs: list[float]) -> dict:
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else {}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--image", required=True)
    p.add_argument("--pool", default="")
    p.add_argument("--namespace", default="")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    sdk, raw, pooled, pool_error = [], [], [], None
    sdk_create, pool_create = [], []
    sdk_round("base")  # the first create pays for the key watch and connections: not counted
    for _ in range(a.n):
        sdk.append(sdk_round("base", sdk_create))
        raw.append(docker_round(a.image))
        if a.pool and pool_error is None:
            try:
                pooled.append(sdk_round(a.pool, pool_create))
                refilled(a.namespace, a.pool)
            except Exception as e:  # reported, not hidden: the pool variant is then "not measured"
                pool_error = f"{type(e).__name__}: {e}"
    out = {"sdk": summary(sdk), "docker": summary(raw), "pool": summary(pooled), "pool_error": pool_error,
           "create_only": {"sdk": summary(sdk_create), "pool": summary(pool_create)},
           "raw": {"sdk": sdk, "docker": raw, "pool": pooled}}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
