"""Figures d, e and f of `make bench` (driven by bench/run.sh through bench.py):

  scale   figure d: Sandboxes naming an unconfigured provider, grown to each object count
          (1k, 5k, 10k, 20k): operator VmRSS once settled, and the Kubernetes API requests
          it makes while idle (its own kube_requests_total counter, the leader Lease apart).
  sweep   figure e: N labelled, never-started containers (1k, 10k): one sweep pass
          (`sandbox-operator sweep --dry-run`, the pass's own elapsed time) against one raw
          engine list call of the same containers.
  counts  figure f: N Sandboxes created and Ready: reconciles per create (operator metrics)
          and engine requests per create (a counting proxy on the engine socket).
"""

import concurrent.futures
import json
import re
import statistics
import subprocess
import threading
import time
import urllib.parse
import uuid

from bench import (Docker, Kube, Watch, create_many, delete_all, log, metric_sum, now, proc_status,
                   proxy_counts, scrape, stats, write_json, sandbox)

LEASE = "leases"


def kube_requests(m: dict) -> dict:
    """{'verb resource': count} from sandbox_operator_kube_requests_total."""
    out = {}
    for k, v in m.items():
        if k.startswith("sandbox_operator_kube_requests_total{"):
            verb = re.search(r'verb="([^"]*)"', k).group(1)
            res = re.search(r'resource="([^"]*)"', k).group(1)
            out[f"{verb} {res}"] = out.get(f"{verb} {res}", 0) + v
    return out


def settle(metrics: str, quiet: float = 15, bound: float = 600) -> bool:
    """Until the reconcile counter has not moved for `quiet` seconds (status writes echo back
    as watch events, so 'reconciled' is not yet 'quiet')."""
    last, since, deadline = None, now(), now() + bound
    while now() < deadline:
        cur = metric_sum(scrape(metrics), "sandbox_operator_reconciles_total")
        if cur != last:
            last, since = cur, now()
        elif now() - since >= quiet:
            return True
        time.sleep(1)
    return False


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = slope * x + intercept."""
    if len(xs) < 2:
        return 0.0, ys[0] if ys else 0.0
    slope, intercept = statistics.linear_regression(xs, ys)
    return slope, intercept


# ------------------------------------------------------------------------------------------
# figure d


def cmd_scale(a) -> None:
    kube = Kube()
    ns, phase = a.namespace, "d"
    levels = sorted({int(x) for x in a.levels.split(",") if x.strip()})
    sel = f"bench.sandboxes.dev/phase={phase}"
    res = {"figure": "d", "namespace": ns, "idle_seconds": a.idle_secs, "levels": [],
           "description": "Sandboxes naming spec.provider: not-configured (Stalled, ProviderNotConfigured; "
                          "cached, finalized and reconciled, no provider resource)"}
    w = Watch(kube, ns, sel)
    w.start()
    if not w.synced.wait(60):
        raise RuntimeError(f"cannot list Sandboxes: {w.error}")
    settle(a.metrics, quiet=5)
    res["rss_empty_kb"] = proc_status(a.pid)["VmRSS"]
    created = 0
    for level in levels:
        objs = [sandbox(f"bench-d-{i}", ns, phase, a.image, provider="not-configured") for i in range(created, level)]
        log(f"figure d: creating {len(objs)} Sandboxes to reach {level}")
        t0 = now()
        create_s = create_many(kube, objs)
        created = level
        ok = w.wait(lambda: len(w.stalled) >= level, a.timeout, f"{level} Stalled",
                    progress=lambda: f"  {len(w.stalled)}/{level} Stalled after {now() - t0:.0f}s "
                                     f"(operator VmRSS {proc_status(a.pid)['VmRSS'] // 1024} MiB)")
        reconciled_s = now() - t0
        settled = settle(a.metrics)
        m0, st0, t1 = scrape(a.metrics), proc_status(a.pid), now()
        # The measurement window itself: what the operator does while nothing changes.
        time.sleep(a.idle_secs)
        m1, st1 = scrape(a.metrics), proc_status(a.pid)
        seconds = now() - t1
        req = {k: v for k, v in {k: kube_requests(m1).get(k, 0) - kube_requests(m0).get(k, 0)
                                 for k in set(kube_requests(m0)) | set(kube_requests(m1))}.items() if v}
        api = sum(v for k, v in req.items() if not k.endswith(" " + LEASE))
        row = {"n": level, "complete": ok, "settled": settled, "create_seconds": create_s,
               "reconcile_all_seconds": reconciled_s, "rss_kb": st1["VmRSS"], "hwm_kb": st1["VmHWM"],
               "rss_anon_kb": st1.get("RssAnon"), "rss_window_start_kb": st0["VmRSS"], "idle_seconds": seconds,
               "api_requests": api, "api_requests_per_second": api / seconds, "requests_by_verb_resource": req,
               "reconciles_idle": metric_sum(m1, "sandbox_operator_reconciles_total") - metric_sum(m0, "sandbox_operator_reconciles_total")}
        res["levels"].append(row)
        log(f"figure d: {level} objects: VmRSS {row['rss_kb'] / 1024:.1f} MiB; idle {seconds:.0f}s: {api:.0f} API requests "
            f"without the Lease ({row['api_requests_per_second']:.3f}/s); all requests {req or 'none'}")
        write_json(a.out, res)  # partial results survive an interrupted run
    xs = [r["n"] for r in res["levels"]]
    slope, intercept = fit(xs, [r["rss_kb"] for r in res["levels"]])
    res["rss_slope_kib_per_object"] = slope
    res["rss_intercept_kb"] = intercept
    log(f"figure d: VmRSS slope {slope:.2f} KiB/object (least squares over {xs})")
    res["delete"] = delete_all(kube, ns, sel, a.timeout)
    write_json(a.out, res)


# ------------------------------------------------------------------------------------------
# figure e


class Dockers(threading.local):
    """One engine connection per thread."""

    def __init__(self) -> None:
        self.d = Docker()


def create_containers(first: int, last: int, instance: str, ns: str, image: str, threads: int = 16) -> float:
    """Never-started containers labelled like a Sandbox's of `instance` whose owner object does
    not exist — young, so the sweeper keeps them (and the dry run would not delete anyway)."""
    local = Dockers()

    def one(i: int) -> None:
        labels = {"sandboxes.dev/managed-by": instance, "sandboxes.dev/kind": "Sandbox",
                  "sandboxes.dev/owner": f"{ns}.bench-e-{i}", "sandboxes.dev/owner-uid": str(uuid.uuid4()),
                  "bench.sandboxes.dev/phase": "e"}
        local.d.request("POST", f"/containers/create?name=bench-e-{instance}-{i}",
                        {"Image": image, "Cmd": ["true"], "Labels": labels, "HostConfig": {"NetworkMode": "none"}})

    t0 = now()
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        for k, _ in enumerate(ex.map(one, range(first, last)), 1):
            if k % 1000 == 0:
                log(f"  created {first + k}/{last} containers")
    return now() - t0


def raw_list(instance: str) -> tuple[float, int]:
    """One engine list call of this instance's containers (all states), read and parsed."""
    d = Docker()
    q = urllib.parse.urlencode({"all": "1", "filters": json.dumps({"label": [f"sandboxes.dev/managed-by={instance}"]})})
    t = now()
    items = d.request("GET", f"/containers/json?{q}")
    return now() - t, len(items)


SUMMARY = re.compile(r"enumerated (\d+) sandboxes, (\d+) volumes, (\d+) templates in ([0-9.]+)s")


def sweep_pass(binary: str, config: str) -> tuple[float, int]:
    """One dry-run pass of the sweeper over the Docker provider: its own elapsed time (the
    process's start-up and the table's printing excluded) and what it enumerated."""
    p = subprocess.run([binary, "sweep", "--dry-run", "--config", config, "--provider", "docker"],
                       capture_output=True, text=True, timeout=600)
    m = SUMMARY.search(p.stdout)
    if p.returncode not in (0, 2) or not m:
        raise RuntimeError(f"sweep --dry-run failed ({p.returncode}): {p.stderr[-400:]} {p.stdout[:400]}")
    return float(m.group(4)), int(m.group(1))


def cmd_sweep(a) -> None:
    levels = sorted({int(x) for x in a.levels.split(",") if x.strip()})
    res = {"figure": "e", "rounds": a.rounds, "levels": [], "instance": a.instance}
    created = 0
    for level in levels:
        log(f"figure e: creating {level - created} never-started labelled containers to reach {level}")
        res.setdefault("create_seconds", []).append(create_containers(created, level, a.instance, a.namespace, a.image))
        created = level
        raw, swept = [], []
        for _ in range(a.rounds):  # interleaved, so drift in the engine's state hits both alike
            t, k = raw_list(a.instance)
            if k != level:
                raise RuntimeError(f"the raw list returned {k} containers, expected {level}")
            raw.append(t)
            t, k = sweep_pass(a.binary, a.config)
            if k != level:
                raise RuntimeError(f"the sweep pass enumerated {k} sandboxes, expected {level}")
            swept.append(t)
        row = {"n": level, "raw_list": stats(raw), "sweep_pass": stats(swept), "raw_samples": raw, "sweep_samples": swept}
        row["ratio"] = row["sweep_pass"]["median"] / row["raw_list"]["median"]
        res["levels"].append(row)
        log(f"figure e: {level} containers: sweep pass {row['sweep_pass']['median']:.3f}s vs raw list "
            f"{row['raw_list']['median']:.3f}s (medians of {a.rounds}) -> {row['ratio']:.2f}x")
        write_json(a.out, res)


# ------------------------------------------------------------------------------------------
# figure f


def cmd_counts(a) -> None:
    kube = Kube()
    ns, n, phase = a.namespace, a.n, "f"
    sel = f"bench.sandboxes.dev/phase={phase}"
    w = Watch(kube, ns, sel)
    w.start()
    if not w.synced.wait(60):
        raise RuntimeError(f"cannot list Sandboxes: {w.error}")
    # The sweeper's first pass (30 s after leadership) lists the engine; it is not work a
    # create causes, so the window opens after it.
    deadline = now() + 120
    while metric_sum(scrape(a.metrics), "sandbox_operator_sweep_passes_total") < 1 and now() < deadline:
        time.sleep(0.5)
    time.sleep(1)  # the pass's requests reach the proxy's counts file (0.1 s cadence)
    settle(a.metrics, quiet=5)
    m0, e0 = scrape(a.metrics), proxy_counts(a.proxy_counts)
    objs = [sandbox(f"bench-f-{i}", ns, phase, a.image) for i in range(n)]
    t0 = now()
    create_many(kube, objs, threads=4)
    ok = w.wait(lambda: len(w.ready) >= n, a.timeout, f"{n} Ready",
                progress=lambda: f"  {len(w.ready)}/{n} Ready after {now() - t0:.0f}s")
    settle(a.metrics, quiet=10)
    time.sleep(1)  # the proxy writes its counts file every 0.1 s
    m1, e1 = scrape(a.metrics), proxy_counts(a.proxy_counts)
    engine = {k: e1.get(k, 0) - e0.get(k, 0) for k in set(e0) | set(e1) if e1.get(k, 0) - e0.get(k, 0)}
    reconciles = metric_sum(m1, "sandbox_operator_reconciles_total{kind=\"Sandbox\"}") - metric_sum(m0, "sandbox_operator_reconciles_total{kind=\"Sandbox\"}")
    res = {"figure": "f", "n": n, "complete": ok, "ready": len(w.ready), "reconciles": reconciles,
           "reconciles_per_create": reconciles / n, "engine_requests": engine,
           "engine_requests_per_create": sum(engine.values()) / n,
           "api_requests": {k: v for k, v in {k: kube_requests(m1).get(k, 0) - kube_requests(m0).get(k, 0)
                                               for k in set(kube_requests(m0)) | set(kube_requests(m1))}.items() if v}}
    res["api_requests_per_create"] = sum(v for k, v in res["api_requests"].items() if not k.endswith(" " + LEASE)) / n
    log(f"figure f: {reconciles / n:.2f} reconciles, {res['engine_requests_per_create']:.2f} engine requests and "
        f"{res['api_requests_per_create']:.2f} API requests per create; engine {engine}")
    res["delete"] = delete_all(kube, ns, sel, a.timeout)
    write_json(a.out, res)


def add_parsers(sub, common) -> dict:
    p = sub.add_parser("scale"); common(p)
    p.add_argument("--levels", default="1000,5000,10000,20000"); p.add_argument("--idle-secs", type=float, default=60)
    p = sub.add_parser("sweep"); common(p, need_op=False)
    p.add_argument("--levels", default="1000,10000"); p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--binary", required=True); p.add_argument("--config", required=True)
    p = sub.add_parser("counts"); common(p)
    p.add_argument("--n", type=int, default=100); p.add_argument("--proxy-counts", required=True)
    return {"scale": cmd_scale, "sweep": cmd_sweep, "counts": cmd_counts}


# ------------------------------------------------------------------------------------------
# report


def _load(d: str, name: str):
    try:
        with open(f"{d}/{name}") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _verdict(ok: bool) -> str:
    return "meets target" if ok else "misses target"


def _at(D: dict, n: int) -> dict | None:
    return next((r for r in D.get("levels", []) if r["n"] == n), None)


def report_rows(d: str) -> list[str]:
    """Rows of the results table for figures d, e and f."""
    L = []
    D, E, F = _load(d, "d-scale.json"), _load(d, "e-sweep.json"), _load(d, "f-counts.json")
    if F:
        L.append(f"| f. reconciles per created Sandbox ({F['n']} creates, metrics counter) | **{F['reconciles_per_create']:.2f}** | — | — | ≤ 2.0 | "
                 f"{_verdict(F['reconciles_per_create'] <= 2.0)} |")
        L.append(f"| f. engine requests per created Sandbox (counting proxy) | **{F['engine_requests_per_create']:.2f}** | — | — | ≤ 6 | "
                 f"{_verdict(F['engine_requests_per_create'] <= 6)} |")
    if D and D.get("levels"):
        r5 = _at(D, 5000)
        if r5:
            rss5 = r5["rss_kb"] / 1024
            slope = D.get("rss_slope_kib_per_object")
            ok = rss5 <= 48 and (slope is None or slope <= 6)
            L.append(f"| d. VmRSS, 5,000 Sandboxes settled; slope to {D['levels'][-1]['n']:,} | **{rss5:.1f} MiB**; "
                     f"**{slope:.2f} KiB/object** (least squares over {', '.join(str(r['n']) for r in D['levels'])}) | — | "
                     f"{rss5 / 48:.2f} of 48 MiB | ≤ 48 MiB, ≤ 6 KiB/object | {_verdict(ok)} |")
        r10 = _at(D, 10000)
        if r10:
            L.append(f"| d. API requests/s at idle, 10,000 Sandboxes (Lease excluded) | **{r10['api_requests_per_second']:.3f}/s** "
                     f"({r10['api_requests']:.0f} in {r10['idle_seconds']:.0f} s) | — | — | ≤ 1 | {_verdict(r10['api_requests_per_second'] <= 1)} |")
    if E:
        for r in E["levels"]:
            L.append(f"| e. one sweep pass, {r['n']:,} labelled containers, release build (median of {E['rounds']}) | "
                     f"{r['sweep_pass']['median']:.3f} s | {r['raw_list']['median']:.3f} s (one engine list call) | **{r['ratio']:.2f}×** | ≤ 1.5× | "
                     f"{_verdict(r['ratio'] <= 1.5)} |")
    return L


def _plot(d: str, name: str, alt: str) -> list[str]:
    import os
    return [f"![{alt}](plots/{name}.png)\n"] if os.path.exists(f"{d}/plots/{name}.png") else []


def report_sections(d: str) -> list[str]:
    """Sections of results.md for figures d, e and f."""
    L = []
    D, E, F = _load(d, "d-scale.json"), _load(d, "e-sweep.json"), _load(d, "f-counts.json")
    if D and D.get("levels"):
        L.append("## d. memory and idle API load against object count\n")
        L.append(f"Measured: {D['description']}, grown level by level in one operator process; at each level, once every "
                 f"object was Stalled and the reconcile counter had stood still for 15 s, a {D['idle_seconds']:.0f} s idle window: "
                 f"VmRSS at its end and the requests counted by `sandbox_operator_kube_requests_total` during it. "
                 f"VmRSS before any object: {D['rss_empty_kb'] / 1024:.1f} MiB.\n")
        L.append("| Sandboxes | created in | all Stalled after | VmRSS | VmHWM | RssAnon | API requests in the window (Lease excluded) | per second | every request in the window |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for r in D["levels"]:
            every = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["requests_by_verb_resource"].items())) or "none"
            L.append(f"| {r['n']:,} | {r['create_seconds']:.0f} s | {r['reconcile_all_seconds']:.0f} s | {r['rss_kb'] / 1024:.1f} MiB | "
                     f"{r['hwm_kb'] / 1024:.1f} MiB | {(r.get('rss_anon_kb') or 0) / 1024:.1f} MiB | {r['api_requests']:.0f} | "
                     f"{r['api_requests_per_second']:.3f} | {every} |")
        if "rss_slope_kib_per_object" in D:
            L.append(f"\nLeast-squares slope of VmRSS against object count: **{D['rss_slope_kib_per_object']:.2f} KiB per object** "
                     f"(intercept {D['rss_intercept_kb'] / 1024:.1f} MiB).\n")
        L.extend(_plot(d, "rss", "VmRSS against object count"))
        L.extend(_plot(d, "idle-api", "API requests per second at idle against object count"))
    if E:
        L.append("## e. one sweep pass against one raw list call\n")
        L.append(f"Never-started containers labelled as this instance's (`{E['instance']}`) Sandboxes whose objects do not exist, "
                 f"young enough that the sweeper keeps them. Sweep: `sandbox-operator sweep --dry-run --provider docker` (release "
                 f"build), the pass's own elapsed time (enumerate the containers, volumes and images, list the owners' namespace, "
                 f"decide); raw: one `GET /containers/json?all=1&filters=label=…` over the engine socket, read and parsed. "
                 f"{E['rounds']} rounds each, interleaved.\n")
        L.append("| containers | sweep pass median (min–max) | raw list median (min–max) | ratio |")
        L.append("|---|---|---|---|")
        for r in E["levels"]:
            s, w = r["sweep_pass"], r["raw_list"]
            L.append(f"| {r['n']:,} | {s['median']:.3f} s ({s['min']:.3f}–{s['max']:.3f}) | {w['median']:.3f} s ({w['min']:.3f}–{w['max']:.3f}) | {r['ratio']:.2f}× |")
        L.append("")
        L.extend(_plot(d, "sweep", "sweep pass against raw list"))
    if F:
        L.append("## f. work per created Sandbox\n")
        L.append(f"{F['n']} Sandboxes POSTed ({F['ready']} Ready), counted from before the first POST until the reconcile counter "
                 f"stood still for 10 s: {F['reconciles']:.0f} Sandbox reconciles; engine requests seen by the counting proxy on the "
                 f"operator's engine socket: " + (", ".join(f"{k} {v:.0f}" for k, v in sorted(F["engine_requests"].items())) or "none")
                 + "; Kubernetes API requests: " + (", ".join(f"{k} {v:.0f}" for k, v in sorted(F["api_requests"].items())) or "none") + ".\n")
        L.extend(_plot(d, "per-create", "reconciles, engine and API requests per create"))
    return L
