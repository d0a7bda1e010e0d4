#!/usr/bin/env python3
"""Warm-pool figures for `make bench` (driven by bench/pool.sh; standard library only).

Subcommands (each writes one JSON result file):

  claims  a SandboxWarmPool of P members, Ready; then N claims one after another (a Sandbox
          with `spec.warmPoolRef`, POST -> the watch sees Ready=True), each claim's
          `status.claim`; then, in the same run, N cold creates of the same shape through the
          operator and (Docker only) N `docker run -d` of the same image and command.
  burst   a pool of N members, Ready; then N claims at once (C client threads) -> all Ready,
          against N `docker run -d` through `xargs -P C` in the same run.

Kubernetes and Docker are reached as bench.py reaches them (its Kube and Watch).
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the sibling module: Kube, Watch, stats, the raw side)
from bench import COMMAND, GROUP, VERSION, Kube, Watch, log, now, quiet, rand, run, stats, write_json  # noqa: E402

POOLS = "sandboxwarmpools"
RAW = "sandboxes.dev/managed-by=bench-pool-raw"


def pool_path(kube: Kube, ns: str, name: str = "") -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{POOLS}" + (f"/{name}" if name else "")


def shape(a) -> dict:
    return {"provider": a.provider, "image": a.image, "command": COMMAND}


def make_pool(kube: Kube, a, name: str, replicas: int) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name, "namespace": a.namespace},
        "spec": {"replicas": replicas, "template": shape(a)},
    }
    kube.request("POST", pool_path(kube, a.namespace), body)
    deadline = now() + a.timeout
    while now() < deadline:
        _, p = kube.request("GET", pool_path(kube, a.namespace, name))
        status = p.get("status") or {}
        ready = status.get("readyReplicas") or 0
        if ready >= replicas:
            log(f"pool {name}: {ready}/{replicas} Ready")
            return
        stalled = [c for c in status.get("conditions") or [] if c.get("type") == "Stalled" and c.get("status") == "True"]
        if stalled:
            sys.exit(f"pool {name}: Stalled ({stalled[0].get('reason')}): {stalled[0].get('message')}")
        time.sleep(1.0)  # polling a status from outside, not synchronising the product
    sys.exit(f"pool {name}: not {replicas} Ready after {a.timeout:.0f} s")


def drop_pool(kube: Kube, ns: str, name: str) -> None:
    kube.request("DELETE", pool_path(kube, ns, name), ok=(200, 202, 404))


def claim(name: str, ns: str, pool: str) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name, "namespace": ns, "labels": {"bench.sandboxes.dev/phase": "pool"}},
        "spec": {"warmPoolRef": {"name": pool}, "env": [{"name": "TASK", "value": name}]},
    }


def cold(name: str, a) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name, "namespace": a.namespace, "labels": {"bench.sandboxes.dev/phase": "pool"}},
        "spec": shape(a),
    }


def timed_create(kube: Kube, w: Watch, obj: dict, timeout: float) -> float:
    name = obj["metadata"]["name"]
    t0 = now()
    kube.request("POST", kube.sbx_path(obj["metadata"]["namespace"]), obj)
    if not w.wait(lambda: name in w.ready, timeout, f"{name} Ready"):
        sys.exit(f"{name}: not Ready after {timeout:.0f} s ({w.reasons.get(name)})")
    return w.ready[name] - t0


def claim_modes(kube: Kube, ns: str, names: list[str]) -> dict:
    modes: dict[str, int] = {}
    for n in names:
        _, s = kube.request("GET", kube.sbx_path(ns, n))
        m = (s.get("status") or {}).get("claim") or "none"
        modes[m] = modes.get(m, 0) + 1
    return modes


def docker_runs(a, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = now()
        run(["docker", "run", "-d", "--label", RAW, a.image, *COMMAND])
        out.append(now() - t0)
    return out


def watching(ns: str) -> tuple[Kube, Watch]:
    """The API client, and a watch of this bench's Sandboxes that has listed them."""
    kube = Kube()
    w = Watch(kube, ns, "bench.sandboxes.dev/phase=pool")
    w.start()
    w.synced.wait(60)
    return kube, w


def cmd_claims(a) -> None:
    kube, w = watching(a.namespace)
    pool = f"bench-pool-{rand()}"
    make_pool(kube, a, pool, a.pool_size)
    names = [f"claim-{rand()}-{i}" for i in range(a.n)]
    idle = {"claims": quiet("claims")}
    warm = [timed_create(kube, w, claim(n, a.namespace, pool), a.timeout) for n in names]
    modes = claim_modes(kube, a.namespace, names)
    log(f"claims: {stats(warm)} modes {modes}")
    idle["cold"] = quiet("cold creates")
    colds = [timed_create(kube, w, cold(f"cold-{rand()}-{i}", a), a.timeout) for i in range(a.cold_n)]
    idle["docker"] = quiet("docker run -d")
    raw = docker_runs(a, a.cold_n) if a.provider == "docker" else []
    drop_pool(kube, a.namespace, pool)
    write_json(a.out, {
        "provider": a.provider, "pool_size": a.pool_size, "n": a.n, "claims": warm, "modes": modes,
        "idle_before": idle,
        "claim": stats(warm), "cold_creates": colds, "cold": stats(colds) if colds else None,
        "docker_runs": raw, "docker": stats(raw) if raw else None,
    })


def cmd_burst(a) -> None:
    kube, w = watching(a.namespace)
    pool = f"bench-burst-{rand()}"
    make_pool(kube, a, pool, a.n)
    _, made = kube.request("GET", pool_path(kube, a.namespace, pool))
    pool_uid = made["metadata"]["uid"]
    names = [f"burst-{rand()}-{i}" for i in range(a.n)]
    idle = {"claims": quiet("burst claims")}
    t0 = now()
    with concurrent.futures.ThreadPoolExecutor(a.concurrency) as ex:
        list(ex.map(lambda n: kube.request("POST", kube.sbx_path(a.namespace), claim(n, a.namespace, pool)), names))
    if not w.wait(lambda: all(n in w.ready for n in names), a.timeout, f"{a.n} claims Ready"):
        sys.exit("burst: not all claims Ready")
    claims_s = max(w.ready[n] for n in names) - t0
    modes = claim_modes(kube, a.namespace, names)
    drop_pool(kube, a.namespace, pool)
    # The pool's refilled members go first (a container's removal is the kernel's work for
    # a while after), so that the engine's figure is not timed beside their clean-up; the
    # claimed ones stay with their Sandboxes.
    members = f"sandboxes.dev/owner-uid={pool_uid}"
    gone = w.wait(lambda: bench.docker_count(members) <= a.n, a.timeout, "the pool's unclaimed members gone")
    idle["docker"] = quiet("burst docker run -d")
    t1 = now()
    cmd = ["docker", "run", "-d", "--label", RAW, a.image, *COMMAND]
    subprocess.run(["xargs", "-P", str(a.concurrency), "-I{}", *cmd], input="\n".join(map(str, range(a.n))) + "\n",
                   text=True, check=True, stdout=subprocess.DEVNULL)
    raw_s = now() - t1
    log(f"burst: {a.n} claims {claims_s:.2f} s ({modes}); {a.n} docker run -d {raw_s:.2f} s")
    write_json(a.out, {"n": a.n, "concurrency": a.concurrency, "claims_s": claims_s, "docker_s": raw_s, "modes": modes,
                       "ready_s": sorted(w.ready[n] - t0 for n in names),
                       "idle_before": idle, "pool_members_gone": gone})


def cmd_cleanup(a) -> None:
    kube = Kube()
    _, ps = kube.request("GET", pool_path(kube, a.namespace))
    for p in ps.get("items", []):
        drop_pool(kube, a.namespace, p["metadata"]["name"])
    bench.docker_purge(RAW)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn in (("claims", cmd_claims), ("burst", cmd_burst), ("cleanup", cmd_cleanup)):
        s = sub.add_parser(name)
        s.set_defaults(fn=fn)
        s.add_argument("--namespace", required=True)
        s.add_argument("--provider", default="docker")
        s.add_argument("--image", default=os.environ.get("SANDBOX_BASE_IMAGE", "sandbox-operator/base:bookworm"))
        s.add_argument("--timeout", type=float, default=600)
        s.add_argument("--out", default="")
        s.add_argument("--n", type=int, default=50)
        s.add_argument("--pool-size", type=int, default=50)
        s.add_argument("--cold-n", type=int, default=20)
        s.add_argument("--concurrency", type=int, default=32)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
