#!/usr/bin/env python3
"""Measurements for `make bench` (driven by bench/run.sh; Python 3.11 standard library only).

Subcommands (each writes one JSON result file):

  single  figure a: one Sandbox `kubectl apply` -> Ready vs `docker run -d`, N times each,
          interleaved; plus the same through the APIs (POST + watch vs create + start over
          the engine socket) and the client start-up overheads.
  burst   figure b: N Sandboxes in one `kubectl apply -f` -> all Ready, vs N `docker run -d`
          through `xargs -P C`.
  idle    figure c: N Sandbox objects (Docker-backed and stopped, or naming an unconfigured
          provider), reconciled, then idle: operator VmRSS and the provider calls made while
          idle (operator metrics and a counting proxy on the engine socket).
  cleanup delete every Sandbox in the namespace (one deletecollection) and wait until gone.
  report  results.md from the JSON files.

Kubernetes is reached with the credentials of `kubectl config view --raw --minify --flatten`
(token or client certificate; exec plugins are not supported), Docker through its unix socket.
"""

import argparse
import base64
import concurrent.futures
import datetime
import http.client
import json
import os
import random
import re
import socket
import ssl
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

GROUP, VERSION, PLURAL = "sandboxes.dev", "v1alpha1", "sandboxes"
# The main process of every benchmark sandbox and raw container: exits promptly on SIGTERM
# (so a stop does not wait Docker's 10 s kill timeout), otherwise sleeps forever.
COMMAND = ["perl", "-e", "$SIG{TERM} = sub { exit 0 }; sleep"]
RAW_LABEL = "sandboxes.dev/managed-by=bench-raw"  # raw containers: not ours, not the operator's


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def now() -> float:
    return time.perf_counter()


def rand(n: int = 5) -> str:
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(n))


def run(cmd, stdin: str | None = None, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return p


def cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of all CPUs so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields[:8])


def quiet(what: str, idle: float = 0.85, window: float = 1.0, timeout: float = 180.0) -> float:
    """Waits until the machine's CPUs were at least `idle` idle over one `window` (at most
    `timeout`), and returns the last window's idle share. A figure timed right after a
    phase that removed or made many containers otherwise measures the kernel's clean-up of
    them (network namespaces, cgroups) as much as the thing it names, and a run-to-run
    difference of 2x on a 2-core machine. A machine that never quiets is measured anyway,
    and said so."""
    deadline = now() + timeout
    share = 0.0
    while now() < deadline:
        i0, t0 = cpu_times()
        time.sleep(window)  # a sampling interval of the machine's load, not a synchronisation
        i1, t1 = cpu_times()
        share = (i1 - i0) / max(1, t1 - t0)
        if share >= idle:
            return share
    log(f"{what}: the machine stayed busy ({share:.0%} idle after {timeout:.0f} s); measuring anyway")
    return share


def stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {}
    p90 = xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]
    return {"n": len(xs), "median": statistics.median(xs), "mean": statistics.fmean(xs), "min": xs[0], "p90": p90, "max": xs[-1]}


def write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    log(f"wrote {path}")


# ------------------------------------------------------------------------------------------
# Kubernetes API


class Kube:
    def __init__(self) -> None:
        cfg = json.loads(run(["kubectl", "config", "view", "--raw", "--minify", "--flatten", "-o", "json"]).stdout)
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        u = urllib.parse.urlsplit(cluster["server"])
        self.host, self.port, self.prefix = u.hostname, u.port or 443, u.path.rstrip("/")
        ctx = ssl.create_default_context()
        if cluster.get("certificate-authority-data"):
            ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        if cluster.get("insecure-skip-tls-verify"):
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self.headers = {"Accept": "application/json"}
        if user.get("token"):
            self.headers["Authorization"] = f"Bearer {user['token']}"
        elif user.get("client-certificate-data"):
            d = tempfile.mkdtemp(prefix="bench-kube-")
            cert, key = os.path.join(d, "c.pem"), os.path.join(d, "k.pem")
            with open(cert, "wb") as f:
                f.write(base64.b64decode(user["client-certificate-data"]))
            with open(key, "wb") as f:
                f.write(base64.b64decode(user["client-key-data"]))
            ctx.load_cert_chain(cert, key)
        elif user.get("exec") or user.get("auth-provider"):
            sys.exit("bench.py: exec/auth-provider credentials are not supported; use a kubeconfig with a token or client certificate")
        self.ctx = ctx
        self.local = threading.local()

    def conn(self, timeout: float | None = 60) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def request(self, method: str, path: str, body=None, ctype: str = "application/json", ok=(200, 201, 202)):
        """One request on this thread's keep-alive connection; returns (status, parsed body)."""
        for attempt in range(3):
            c = getattr(self.local, "c", None)
            if c is None:
                c = self.local.c = self.conn()
            headers = dict(self.headers)
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = ctype
            try:
                c.request(method, self.prefix + path, body=data, headers=headers)
                r = c.getresponse()
                raw = r.read()
            except (http.client.HTTPException, OSError):
                c.close()
                self.local.c = None
                if attempt == 2:
                    raise
                continue
            out = json.loads(raw) if raw else {}
            if ok and r.status not in ok:
                raise RuntimeError(f"{method} {path}: HTTP {r.status}: {out.get('message', raw[:300])}")
            return r.status, out
        raise AssertionError("unreachable")

    def sbx_path(self, ns: str, name: str = "") -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" + (f"/{name}" if name else "")


def sandbox(name: str, ns: str, phase: str, image: str, provider: str = "docker", state: str | None = None,
            no_network: bool = False) -> dict:
    spec = {"provider": provider, "image": image, "command": COMMAND}
    if state:
        spec["state"] = state
    if no_network:
        # An empty allow-list: no network at all (Docker `NetworkMode: none`), like the raw
        # side's `--network none`.
        spec["egress"] = {"allowedDomains": []}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name, "namespace": ns, "labels": {"bench.sandboxes.dev/phase": phase}},
        "spec": spec,
    }


def to_yaml(obj: dict) -> str:
    """JSON is YAML; one document per object keeps kubectl happy."""
    return json.dumps(obj)


def condition(obj: dict, type_: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


class Watch(threading.Thread):
    """List + watch Sandboxes in a namespace (optionally by label), recording the monotonic
    time each object is first seen Ready=True / Stalled=True, and deletions."""

    def __init__(self, kube: Kube, ns: str, selector: str | None = None) -> None:
        super().__init__(daemon=True)
        self.kube, self.ns, self.selector = kube, ns, selector
        self.cv = threading.Condition()
        self.present: set[str] = set()
        self.ready: dict[str, float] = {}
        self.stalled: dict[str, float] = {}
        self.reasons: dict[str, str] = {}
        self.deleted: dict[str, float] = {}
        self.synced = threading.Event()
        self.error: str | None = None

    def _see(self, typ: str, obj: dict) -> None:
        t = now()
        name = obj["metadata"]["name"]
        with self.cv:
            if typ == "DELETED":
                self.present.discard(name)
                self.deleted[name] = t
            else:
                self.present.add(name)
                self.deleted.pop(name, None)
                r = condition(obj, "Ready")
                if r:
                    self.reasons[name] = r.get("reason", "")
                if r and r.get("status") == "True":
                    self.ready.setdefault(name, t)
                s = condition(obj, "Stalled")
                if s and s.get("status") == "True":
                    self.stalled.setdefault(name, t)
            self.cv.notify_all()

    def _query(self, **extra) -> str:
        q = dict(extra)
        if self.selector:
            q["labelSelector"] = self.selector
        return "?" + urllib.parse.urlencode(q)

    def _list(self) -> str:
        cont, rv = None, ""
        names = set()
        while True:
            q = {"limit": 500}
            if cont:
                q["continue"] = cont
            _, body = self.kube.request("GET", self.kube.sbx_path(self.ns) + self._query(**q))
            for item in body.get("items", []):
                names.add(item["metadata"]["name"])
                self._see("ADDED", item)
            rv = body["metadata"].get("resourceVersion", rv)
            cont = body["metadata"].get("continue")
            if not cont:
                break
        with self.cv:
            for gone in self.present - names:
                self.present.discard(gone)
                self.deleted[gone] = now()
            self.cv.notify_all()
        return rv

    def run(self) -> None:
        rv = None
        while True:
            try:
                if rv is None:
                    rv = self._list()
                    self.synced.set()
                c = self.kube.conn(timeout=330)
                c.request("GET", self.kube.sbx_path(self.ns) + self._query(watch="1", resourceVersion=rv, allowWatchBookmarks="true", timeoutSeconds="300"), headers=self.kube.headers)
                r = c.getresponse()
                if r.status != 200:
                    r.read()
                    rv = None
                    continue
                while True:
                    line = r.readline()
                    if not line:
                        break
                    ev = json.loads(line)
                    if ev["type"] == "ERROR":
                        rv = None  # 410 Gone: relist
                        break
                    rv = ev["object"]["metadata"].get("resourceVersion", rv)
                    if ev["type"] != "BOOKMARK":
                        self._see(ev["type"], ev["object"])
                c.close()
            except Exception as e:  # keep watching; report if it persists
                self.error = repr(e)
                rv = None
                time.sleep(0.5)

    def wait(self, pred, timeout: float, what: str, progress=None, every: float = 10.0) -> bool:
        deadline = now() + timeout
        last = now()
        with self.cv:
            while not pred():
                left = deadline - now()
                if left <= 0:
                    log(f"timed out after {timeout:.0f} s waiting for {what}")
                    return False
                self.cv.wait(min(left, 1.0))
                if progress and now() - last >= every:
                    last = now()
                    log(progress())
        return True


# ------------------------------------------------------------------------------------------
# Docker API (unix socket)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 120) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.socket_path)
        self.sock = s


class Docker:
    def __init__(self) -> None:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        if not host.startswith("unix://"):
            sys.exit(f"bench.py: DOCKER_HOST={host} is not a unix socket")
        self.path = host[len("unix://"):]
        self.c = UnixHTTPConnection(self.path)

    def request(self, method: str, path: str, body=None, ok=(200, 201, 204, 304)):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.c.request(method, "/v1.41" + path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
        r = self.c.getresponse()
        raw = r.read()
        if r.status not in ok:
            raise RuntimeError(f"docker {method} {path}: HTTP {r.status}: {raw[:300]!r}")
        return json.loads(raw) if raw else {}


def docker_count(label: str) -> int:
    return len(run(["docker", "ps", "-aq", "--filter", f"label={label}"]).stdout.split())


def docker_purge(label: str, parallel: int = 32) -> None:
    ids = run(["docker", "ps", "-aq", "--filter", f"label={label}"]).stdout.split()
    if ids:
        subprocess.run(["xargs", "-P", str(parallel), "-n", "20", "docker", "rm", "-f", "-v"], input="\n".join(ids), capture_output=True, text=True)


# ------------------------------------------------------------------------------------------
# Operator metrics and process


def scrape(addr: str) -> dict:
    c = http.client.HTTPConnection(addr, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, val = line.rpartition(" ")
        try:
            out[key] = float(val)
        except ValueError:
            pass
    return out


def provider_calls(m: dict) -> dict:
    """{'operation/outcome': count} from sandbox_operator_provider_calls_total."""
    out = {}
    for k, v in m.items():
        if k.startswith("sandbox_operator_provider_calls_total{"):
            op = re.search(r'operation="([^"]*)"', k).group(1)
            oc = re.search(r'outcome="([^"]*)"', k).group(1)
            out[f"{op}/{oc}"] = out.get(f"{op}/{oc}", 0) + v
    return out


def metric_sum(m: dict, prefix: str) -> float:
    return sum(v for k, v in m.items() if k == prefix or k.startswith(prefix + "{"))


def delta(a: dict, b: dict) -> dict:
    keys = set(a) | set(b)
    return {k: b.get(k, 0) - a.get(k, 0) for k in sorted(keys) if b.get(k, 0) - a.get(k, 0)}


def proc_status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"):
                out[k] = int(v.split()[0])  # kB, or a count for Threads
    return out


def proc_cpu_secs(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proxy_counts(path: str | None) -> dict:
    if not path:
        return {}
    with open(path) as f:
        return json.load(f)["by_endpoint"]


def create_many(kube: Kube, objs: list[dict], threads: int = 8) -> float:
    t0 = now()
    done = [0]
    lock = threading.Lock()

    def one(o):
        kube.request("POST", kube.sbx_path(o["metadata"]["namespace"]), o)
        with lock:
            done[0] += 1
            if done[0] % 500 == 0:
                log(f"  created {done[0]}/{len(objs)}")

    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, objs))
    return now() - t0


def delete_all(kube: Kube, ns: str, selector: str | None, timeout: float) -> dict:
    """deletecollection, then wait until the operator has released every finalizer."""
    w = Watch(kube, ns, selector)
    w.start()
    w.synced.wait(60)
    n = len(w.present)
    t0 = now()
    q = "?" + urllib.parse.urlencode({"labelSelector": selector}) if selector else ""
    kube.request("DELETE", kube.sbx_path(ns) + q, ok=(200, 202))
    ok = w.wait(lambda: not w.present, timeout, f"{n} Sandboxes to be deleted",
                progress=lambda: f"  deleting: {len(w.present)} of {n} left")
    return {"objects": n, "seconds": now() - t0, "complete": ok, "left": len(w.present)}


# ------------------------------------------------------------------------------------------
# figure a


def cmd_single(a) -> None:
    kube, dock = Kube(), Docker()
    ns, n, image = a.namespace, a.n, a.image
    res = {"figure": "a", "n": n, "image": image, "command": COMMAND, "namespace": ns}

    log(f"client start-up overheads (median of {n})")
    kv, dv = [], []
    for _ in range(n):
        t = now(); run(["kubectl", "version", "--client", "-o", "json"]); kv.append(now() - t)
        t = now(); run(["docker", "--version"]); dv.append(now() - t)
    res["kubectl_version_client"] = stats(kv)
    res["docker_version_client"] = stats(dv)

    w = Watch(kube, ns, "bench.sandboxes.dev/phase=a")
    w.start()
    if not w.synced.wait(60):
        raise RuntimeError(f"cannot list Sandboxes: {w.error}")

    cli_op, cli_raw, api_op, api_raw = [], [], [], []
    tag = rand()
    for i in range(n):
        # 1. raw provider, CLI: docker run -d
        name = f"bench-a-raw-{tag}-{i}"
        t = now()
        run(["docker", "run", "-d", "--name", name, "--label", RAW_LABEL, image, *COMMAND])
        cli_raw.append(now() - t)
        run(["docker", "rm", "-f", name])

        # 2. operator, CLI: kubectl apply && kubectl wait --for=condition=Ready
        name = f"bench-a-cli-{tag}-{i}"
        doc = to_yaml(sandbox(name, ns, "a", image))
        t = now()
        run(["kubectl", "apply", "-f", "-"], stdin=doc)
        run(["kubectl", "wait", "--for=condition=Ready", f"sbx/{name}", "-n", ns, "--timeout=60s"], timeout=90)
        cli_op.append(now() - t)
        run(["kubectl", "delete", "sbx", name, "-n", ns, "--wait=true", "--timeout=60s"], timeout=90)

        # 3. raw provider, API: create + start over the engine socket
        name = f"bench-a-rawapi-{tag}-{i}"
        t = now()
        cid = dock.request("POST", f"/containers/create?name={name}", {"Image": image, "Cmd": COMMAND, "Labels": {RAW_LABEL.split("=")[0]: RAW_LABEL.split("=")[1]}})["Id"]
        dock.request("POST", f"/containers/{cid}/start")
        api_raw.append(now() - t)
        dock.request("DELETE", f"/containers/{cid}?force=1&v=1")

        # 4. operator, API: POST the Sandbox, watch until Ready=True
        name = f"bench-a-api-{tag}-{i}"
        t = now()
        kube.request("POST", kube.sbx_path(ns), sandbox(name, ns, "a", image))
        if not w.wait(lambda: name in w.ready, 60, f"{name} Ready"):
            raise RuntimeError(f"{name} not Ready within 60 s (reason {w.reasons.get(name)})")
        api_op.append(w.ready[name] - t)
        kube.request("DELETE", kube.sbx_path(ns, name))
        if not w.wait(lambda: name in w.deleted, 60, f"{name} deleted"):
            raise RuntimeError(f"{name} not deleted within 60 s")

        log(f"  {i + 1}/{n}: docker run -d {cli_raw[-1]:.3f}s | kubectl apply+wait {cli_op[-1]:.3f}s | "
            f"engine API create+start {api_raw[-1]:.3f}s | API create->Ready (watch) {api_op[-1]:.3f}s")

    res["docker_run_d"] = stats(cli_raw)
    res["kubectl_apply_wait_ready"] = stats(cli_op)
    res["docker_api_create_start"] = stats(api_raw)
    res["api_create_watch_ready"] = stats(api_op)
    res["raw"] = {"docker_run_d": cli_raw, "kubectl_apply_wait_ready": cli_op, "docker_api_create_start": api_raw, "api_create_watch_ready": api_op}
    res["ratio_cli"] = res["kubectl_apply_wait_ready"]["median"] / res["docker_run_d"]["median"]
    res["ratio_api"] = res["api_create_watch_ready"]["median"] / res["docker_api_create_start"]["median"]
    log(f"figure a: CLI ratio {res['ratio_cli']:.2f}, API ratio {res['ratio_api']:.2f}")
    write_json(a.out, res)


# ------------------------------------------------------------------------------------------
# figure b


def cmd_burst(a) -> None:
    kube = Kube()
    ns, n, par, image = a.namespace, a.n, a.concurrency, a.image
    res = {"figure": "b", "n": n, "concurrency": par, "image": image, "namespace": ns}
    tag = rand()

    # A Linux bridge takes at most 1,024 ports, so beyond ~1,000 containers neither side can
    # use Docker's default bridge: both run without a network.
    no_network = n > 1000
    res["network"] = "none (both sides)" if no_network else "the engine's default (both sides)"
    net = ["--network", "none"] if no_network else []

    # raw provider first: n `docker run -d` through xargs -P par
    names = [f"bench-b-raw-{tag}-{i}" for i in range(n)]
    log(f"raw: {n} x docker run -d {' '.join(net)} through xargs -P {par}")
    t = now()
    p = subprocess.run(["xargs", "-P", str(par), "-I{}", "docker", "run", "-d", *net, "--name", "{}", "--label", RAW_LABEL, image, *COMMAND],
                       input="\n".join(names) + "\n", capture_output=True, text=True, timeout=a.timeout)
    res["docker_seconds"] = now() - t
    res["docker_exit"] = p.returncode
    running = len(run(["docker", "ps", "-q", "--filter", f"label={RAW_LABEL}"]).stdout.split())
    res["docker_running"] = running
    log(f"raw: {res['docker_seconds']:.1f}s, {running}/{n} running (xargs exit {p.returncode})")
    if p.returncode != 0:
        log("raw: some docker run failed: " + p.stderr.strip()[-400:])
    t = now()
    docker_purge(RAW_LABEL, par)
    res["docker_rm_seconds"] = now() - t
    log(f"raw: docker rm -f of {n} with -P {par}: {res['docker_rm_seconds']:.1f}s")

    # operator: one kubectl apply -f of an n-document file
    path = os.path.join(a.workdir, f"burst-{n}.yaml")
    with open(path, "w") as f:
        f.write("\n---\n".join(to_yaml(sandbox(f"bench-b-{i}", ns, "b", image, no_network=no_network)) for i in range(n)) + "\n")
    w = Watch(kube, ns, "bench.sandboxes.dev/phase=b")
    w.start()
    if not w.synced.wait(60):
        raise RuntimeError(f"cannot list Sandboxes: {w.error}")
    m0 = scrape(a.metrics)
    cpu0 = proc_cpu_secs(a.pid)
    log(f"operator: kubectl apply -f {path} ({n} documents), then watch until all Ready")
    t0 = now()
    p = subprocess.run(["kubectl", "apply", "-f", path], capture_output=True, text=True, timeout=a.timeout)
    res["kubectl_apply_seconds"] = now() - t0
    if p.returncode != 0:
        raise RuntimeError(f"kubectl apply failed: {p.stderr[-400:]}")
    log(f"operator: kubectl apply returned after {res['kubectl_apply_seconds']:.1f}s; {len(w.ready)} Ready so far")
    ok = w.wait(lambda: len(w.ready) >= n, a.timeout, f"{n} Ready",
                progress=lambda: f"  {len(w.ready)}/{n} Ready after {now() - t0:.0f}s (operator VmRSS {proc_status(a.pid)['VmRSS'] // 1024} MiB)")
    m1 = scrape(a.metrics)
    res["complete"] = ok
    res["ready"] = len(w.ready)
    times = sorted(t - t0 for t in w.ready.values())
    res["operator_seconds"] = times[-1] if ok else None
    res["operator_time_to_ready"] = stats(times)
    res["ready_times"] = times
    res["operator_cpu_seconds"] = proc_cpu_secs(a.pid) - cpu0
    res["operator_status"] = proc_status(a.pid)
    res["provider_calls"] = delta(provider_calls(m0), provider_calls(m1))
    res["reconciles"] = metric_sum(m1, "sandbox_operator_reconciles_total") - metric_sum(m0, "sandbox_operator_reconciles_total")
    res["reconcile_errors"] = delta({k: v for k, v in m0.items() if "reconcile_errors_total" in k}, {k: v for k, v in m1.items() if "reconcile_errors_total" in k})
    if ok:
        res["ratio"] = res["operator_seconds"] / res["docker_seconds"]
        log(f"figure b: operator {res['operator_seconds']:.1f}s vs docker {res['docker_seconds']:.1f}s -> ratio {res['ratio']:.2f}")
    else:
        not_ready = {}
        for name in w.present - set(w.ready):
            r = w.reasons.get(name, "none")
            not_ready[r] = not_ready.get(r, 0) + 1
        res["not_ready_reasons"] = not_ready
        log(f"figure b: only {len(w.ready)}/{n} Ready within {a.timeout}s; not Ready by reason: {not_ready}")

    # The figure is complete: keep it even if the clean-up below never finishes (dockerd 20.10
    # has wedged removing ~1,000 running containers at once).
    write_json(a.out, res)
    res["delete"] = delete_measured(kube, a, ns, "bench.sandboxes.dev/phase=b")
    write_json(a.out, res)


# ------------------------------------------------------------------------------------------
# figure c


def cmd_idle(a) -> None:
    kube = Kube()
    ns, n, variant = a.namespace, a.n, a.variant
    phase = f"c-{variant}"
    sel = f"bench.sandboxes.dev/phase={phase}"
    res = {"figure": "c", "variant": variant, "n": n, "namespace": ns, "idle_seconds": a.idle_secs}
    if variant == "docker":
        objs = [sandbox(f"bench-c-{i}", ns, phase, a.image, state="Stopped") for i in range(n)]
        res["description"] = f"{n} Docker-backed Sandboxes with spec.state: Stopped (each a real created, started and stopped container)"
    else:
        objs = [sandbox(f"bench-c-{i}", ns, phase, a.image, provider="not-configured") for i in range(n)]
        res["description"] = (f"{n} Sandboxes naming spec.provider: not-configured (Stalled, ProviderNotConfigured; cached, "
                              f"finalized and reconciled by the operator, no provider resource)")
    res["started_at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    w = Watch(kube, ns, sel)
    w.start()
    if not w.synced.wait(60):
        raise RuntimeError(f"cannot list Sandboxes: {w.error}")
    res["rss_before_kb"] = proc_status(a.pid)["VmRSS"]
    log(f"creating {n} Sandboxes ({variant}) with 8 parallel POSTs")
    t0 = now()
    res["create_seconds"] = create_many(kube, objs)
    log(f"created in {res['create_seconds']:.1f}s; waiting until every one is reconciled")
    done = (lambda: len(w.ready) >= n) if variant == "docker" else (lambda: len(w.stalled) >= n)
    ok = w.wait(done, a.timeout, f"{n} reconciled",
                progress=lambda: f"  {len(w.ready) if variant == 'docker' else len(w.stalled)}/{n} reconciled after {now() - t0:.0f}s "
                                 f"(operator VmRSS {proc_status(a.pid)['VmRSS'] // 1024} MiB)")
    res["reconciled"] = len(w.ready) if variant == "docker" else len(w.stalled)
    res["reconcile_all_seconds"] = now() - t0
    res["complete"] = ok
    reasons = {}
    for name in w.present:
        r = w.reasons.get(name, "none")
        reasons[r] = reasons.get(r, 0) + 1
    res["ready_reasons"] = reasons
    log(f"{res['reconciled']}/{n} reconciled in {res['reconcile_all_seconds']:.1f}s; Ready reasons: {reasons}")

    # Settle: the reconcile counter stops moving (status writes echo back as watch events).
    last, stable_since, deadline = None, now(), now() + 300
    while now() < deadline:
        cur = metric_sum(scrape(a.metrics), "sandbox_operator_reconciles_total")
        if cur != last:
            last, stable_since = cur, now()
        elif now() - stable_since >= 15:
            break
        time.sleep(1)
    res["settled"] = now() < deadline

    def snap():
        m = scrape(a.metrics)
        return {"t": now(), "metrics": m, "calls": provider_calls(m), "reconciles": metric_sum(m, "sandbox_operator_reconciles_total"),
                "sweeps": metric_sum(m, "sandbox_operator_sweep_passes_total"), "engine": proxy_counts(a.proxy_counts),
                "status": proc_status(a.pid), "cpu": proc_cpu_secs(a.pid)}

    s0 = snap()
    log(f"settled: VmRSS {s0['status']['VmRSS'] / 1024:.1f} MiB, VmHWM {s0['status']['VmHWM'] / 1024:.1f} MiB")
    if a.sweep_interval:
        log(f"waiting for the next sweep pass to finish (interval {a.sweep_interval}s +-10%), so the idle window lies between passes")
        deadline = now() + a.sweep_interval * 1.1 + 120
        while now() < deadline and metric_sum(scrape(a.metrics), "sandbox_operator_sweep_passes_total") <= s0["sweeps"]:
            time.sleep(0.5)
        time.sleep(2)  # the pass's last engine requests reach the proxy's counts file (0.1 s cadence)
    s1 = snap()
    log(f"idle window: {a.idle_secs}s")
    time.sleep(a.idle_secs)
    s2 = snap()
    res["rss_settled_kb"] = s0["status"]["VmRSS"]
    res["rss_idle_start_kb"] = s1["status"]["VmRSS"]
    res["rss_idle_end_kb"] = s2["status"]["VmRSS"]
    res["hwm_kb"] = s2["status"]["VmHWM"]
    res["rss_anon_kb"] = s2["status"].get("RssAnon")
    res["threads"] = s2["status"].get("Threads")
    res["idle"] = {
        "seconds": s2["t"] - s1["t"],
        "provider_calls": delta(s1["calls"], s2["calls"]),
        "reconciles": s2["reconciles"] - s1["reconciles"],
        "engine_requests": delta(s1["engine"], s2["engine"]),
        "operator_cpu_seconds": s2["cpu"] - s1["cpu"],
        "sweep_passes": s2["sweeps"] - s1["sweeps"],
    }
    res["sweep_window"] = {
        "seconds": s1["t"] - s0["t"],
        "sweep_passes": s1["sweeps"] - s0["sweeps"],
        "provider_calls": delta(s0["calls"], s1["calls"]),
        "reconciles": s1["reconciles"] - s0["reconciles"],
        "engine_requests": delta(s0["engine"], s1["engine"]),
    }
    res["engine_proxy"] = bool(a.proxy_counts)
    log(f"idle {res['idle']['seconds']:.0f}s: provider calls {res['idle']['provider_calls'] or 0}, reconciles {res['idle']['reconciles']:.0f}, "
        f"engine requests {res['idle']['engine_requests'] or 0}; VmRSS {res['rss_idle_end_kb'] / 1024:.1f} MiB")
    log(f"sweep window {res['sweep_window']['seconds']:.0f}s ({res['sweep_window']['sweep_passes']:.0f} pass): provider calls "
        f"{res['sweep_window']['provider_calls']}, engine requests {res['sweep_window']['engine_requests']}")

    res["events_in_namespace"] = count_events(kube, ns, "bench-c-", res["started_at"])
    _, one = kube.request("GET", kube.sbx_path(ns, objs[0]["metadata"]["name"]))
    res["object_json_bytes"] = len(json.dumps(one, separators=(",", ":")))
    res["object_managed_fields_bytes"] = len(json.dumps(one["metadata"].get("managedFields", []), separators=(",", ":")))
    res["object_managers"] = [f"{m.get('manager')}/{m.get('operation')}{'/' + m['subresource'] if m.get('subresource') else ''}" for m in one["metadata"].get("managedFields", [])]
    res["engine_at_idle_end"] = proxy_counts(a.proxy_counts)
    if a.keep:
        write_json(a.out, res)
        return
    res["delete"] = delete_measured(kube, a, ns, sel)
    write_json(a.out, res)


def count_events(kube: Kube, ns: str, prefix: str, since: str) -> int:
    """Events about objects named `prefix…` created at or after `since` (RFC 3339, UTC)."""
    n, cont = 0, None
    while True:
        q = {"limit": 500}
        if cont:
            q["continue"] = cont
        _, body = kube.request("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events?" + urllib.parse.urlencode(q))
        n += sum(1 for e in body.get("items", [])
                 if (e.get("regarding") or {}).get("name", "").startswith(prefix)
                 and e["metadata"].get("creationTimestamp", "") >= since)
        cont = body["metadata"].get("continue")
        if not cont:
            return n


def delete_measured(kube: Kube, a, ns: str, sel: str | None) -> dict:
    """Delete everything (selected), wait for the finalizers, and record what the operator did
    meanwhile: reconcile errors by category and provider calls."""
    m0 = scrape(a.metrics)
    log("deleting all (deletecollection) and waiting for the finalizers")
    r = delete_all(kube, ns, sel, a.timeout)
    time.sleep(2)  # let retries of already-deleted objects land in the metrics
    m1 = scrape(a.metrics)
    r["containers_left"] = docker_count(f"sandboxes.dev/managed-by={a.instance}")
    r["provider_calls"] = delta(provider_calls(m0), provider_calls(m1))
    r["reconcile_errors"] = delta({k: v for k, v in m0.items() if "reconcile_errors_total" in k},
                                  {k: v for k, v in m1.items() if "reconcile_errors_total" in k})
    r["reconciles"] = metric_sum(m1, "sandbox_operator_reconciles_total") - metric_sum(m0, "sandbox_operator_reconciles_total")
    log(f"deleted {r['objects']} in {r['seconds']:.1f}s; containers left: {r['containers_left']}; "
        f"reconciles {r['reconciles']:.0f}; reconcile errors {r['reconcile_errors'] or 'none'}; provider calls {r['provider_calls']}")
    return r


def cmd_restart(a) -> None:
    """After `idle --keep` and an operator restart: how long the new process takes to settle on
    the existing objects, what it costs, and its resident memory then. Deletes everything."""
    kube = Kube()
    with open(a.out) as f:
        res = json.load(f)
    n = res["n"]
    sel = f"bench.sandboxes.dev/phase=c-{res['variant']}"
    t0 = now()
    log(f"restarted operator (pid {a.pid}): waiting until it has reconciled the {n} existing objects and is quiet")
    deadline = now() + a.timeout
    last, stable_since = None, now()
    while now() < deadline:
        cur = metric_sum(scrape(a.metrics), "sandbox_operator_reconciles_total")
        if cur != last:
            last, stable_since = cur, now()
        elif cur >= n and now() - stable_since >= 15:
            break
        time.sleep(1)
    m1 = scrape(a.metrics)
    st = proc_status(a.pid)
    res["restart"] = {
        "settle_seconds": stable_since - t0,
        "reconciles": metric_sum(m1, "sandbox_operator_reconciles_total"),
        "provider_calls": provider_calls(m1),
        "rss_kb": st["VmRSS"], "hwm_kb": st["VmHWM"], "rss_anon_kb": st.get("RssAnon"),
        # the new process's counters start at zero; the proxy's run on from the idle window
        "engine_requests": delta(res.get("engine_at_idle_end") or {}, proxy_counts(a.proxy_counts)) if a.proxy_counts else None,
    }
    log(f"after restart: {res['restart']['reconciles']:.0f} reconciles in {res['restart']['settle_seconds']:.1f}s, "
        f"provider calls {res['restart']['provider_calls'] or 'none'}; engine requests {res['restart']['engine_requests']}; VmRSS {st['VmRSS'] / 1024:.1f} MiB (VmHWM {st['VmHWM'] / 1024:.1f} MiB)")
    res["delete"] = delete_measured(kube, a, res["namespace"], sel)
    write_json(a.out, res)


def cmd_cleanup(a) -> None:
    kube = Kube()
    r = delete_all(kube, a.namespace, None, a.timeout)
    log(f"cleanup: {r}")
    if r["left"]:
        sys.exit(1)


# ------------------------------------------------------------------------------------------
# report


def fmt_s(x) -> str:
    return "—" if x is None else f"{x:.3f} s" if x < 10 else f"{x:.1f} s"


def verdict(ratio, target) -> str:
    if ratio is None:
        return "not measured"
    return "meets target" if ratio <= target else "misses target"


def category(key: str) -> str:
    m = re.search(r'category="([^"]*)"', key)
    return m.group(1) if m else key


def delete_line(dl: dict) -> str:
    line = (f"- clean-up: deletecollection of {dl['objects']} → all finalizers released in {fmt_s(dl['seconds'])}; "
            f"containers left: {dl['containers_left']}")
    if "reconciles" in dl:
        errors = ", ".join(f"{category(k)} {v:.0f}" for k, v in dl["reconcile_errors"].items()) or "none"
        calls = ", ".join(f"{k} {v:.0f}" for k, v in dl["provider_calls"].items()) or "none"
        line += f"; meanwhile {dl['reconciles']:.0f} reconciles, reconcile errors: {errors}; provider calls: {calls}"
    return line + "."


def plot_line(d: str, name: str, alt: str) -> list[str]:
    """A Markdown image of plots/NAME.png when bench/plot.py drew it."""
    return [f"![{alt}](plots/{name}.png)\n"] if os.path.exists(os.path.join(d, "plots", f"{name}.png")) else []


def cmd_report(a) -> None:
    import scale

    d = a.dir

    def load(name):
        try:
            with open(os.path.join(d, name)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    env = load("env.json") or {}
    A, B = load("a-single.json"), load("b-burst.json")
    C = [x for x in (load("c-idle-docker.json"), load("c-idle-stalled.json")) if x]
    rows, notes = [], []
    L = []
    L.append("# sandbox-operator benchmark results\n")
    L.append(f"Run {env.get('date', '?')} on {env.get('host', '?')}: {env.get('cpus', '?')} CPUs, {env.get('mem', '?')} RAM, "
             f"kernel {env.get('kernel', '?')}; Docker engine {env.get('docker', '?')}; kube-apiserver {env.get('kube', '?')}; "
             f"operator {env.get('operator', '?')} (release build, git {env.get('git', '?')}), "
             f"`--concurrency {env.get('concurrency', '?')}`, `providerConcurrency: {env.get('provider_concurrency', '?')}`, "
             f"namespace `{env.get('namespace', '?')}`, instance `{env.get('instance', '?')}`.\n")
    L.append("Every figure is a ratio against the raw provider measured in the same run (the machine is shared and noisy). "
             "Command: `make bench` (= `bash bench/run.sh`); raw data: `target/bench/*.json`, operator logs: `target/bench/operator-*.log`.\n")
    L.append("| figure | sandbox-operator | raw provider (same run) | ratio | target | verdict |")
    L.append("|---|---|---|---|---|---|")
    if A:
        L.append(f"| a. `kubectl apply` → Ready, 1 sandbox, median of {A['n']} | {fmt_s(A['kubectl_apply_wait_ready']['median'])} "
                 f"(`kubectl apply -f - && kubectl wait --for=condition=Ready`) | {fmt_s(A['docker_run_d']['median'])} (`docker run -d`) | "
                 f"**{A['ratio_cli']:.2f}×** | ≤ 1.30× | {verdict(A['ratio_cli'], 1.3)} |")
        L.append(f"| a′. same through the APIs, median of {A['n']} | {fmt_s(A['api_create_watch_ready']['median'])} (POST Sandbox → watch sees Ready=True) | "
                 f"{fmt_s(A['docker_api_create_start']['median'])} (engine API create + start) | **{A['ratio_api']:.2f}×** | ≤ 1.10× | {verdict(A['ratio_api'], 1.1)} |")
    if B:
        op = B.get("operator_seconds")
        L.append(f"| b. {B['n']} Sandboxes in one `kubectl apply -f` → all Ready | "
                 f"{fmt_s(op) if op else 'incomplete: ' + str(B['ready']) + '/' + str(B['n']) + ' Ready'} | "
                 f"{fmt_s(B['docker_seconds'])} ({B['n']} × `docker run -d`, `xargs -P {B['concurrency']}`) | "
                 f"**{B['ratio']:.2f}×** | ≤ 1.15× | {verdict(B.get('ratio'), 1.15)} |" if B.get("ratio") else
                 f"| b. {B['n']} Sandboxes in one `kubectl apply -f` → all Ready | incomplete: {B['ready']}/{B['n']} Ready within the bound | "
                 f"{fmt_s(B['docker_seconds'])} | — | ≤ 1.15× | not met |")
    for c in C:
        rss = c["rss_idle_end_kb"] / 1024
        calls = sum(c["idle"]["provider_calls"].values())
        eng = sum(c["idle"]["engine_requests"].values()) if c.get("engine_proxy") else None
        # per-object engine requests: anything addressed to one container
        eng_obj = sum(v for k, v in c["idle"]["engine_requests"].items() if "/containers/{id}" in k) if c.get("engine_proxy") else None
        quiet = calls == 0 and eng_obj in (None, 0)
        if c["n"] >= 5000:
            target, ok = "≤ 48 MiB; 0 calls", rss <= 48 and quiet
            ratio = f"{rss / 48:.2f} of 48 MiB"
        else:
            target, ok = "0 calls (the 48 MiB target is for 5,000)", quiet
            ratio = "—"
        L.append(f"| c. idle, {c['n']} Sandboxes ({c['variant']}) | VmRSS {rss:.1f} MiB; provider calls in {c['idle']['seconds']:.0f} s idle: {calls:.0f}"
                 + (f"; engine requests seen by the socket proxy: {eng:.0f}, of them per container: {eng_obj:.0f}" if eng is not None else "")
                 + f" | — (no raw equivalent) | {ratio} | {target} | " + ("meets target" if ok else "misses target") + " |")
    L.extend(scale.report_rows(d))
    L.append("")
    L.extend(plot_line(d, "summary", "all figures on one page"))
    if A:
        L.append("## a. one sandbox: apply → Ready\n")
        L.append(f"Image `{A['image']}`, command `{' '.join(A['command'])}` for both sides; the four variants run interleaved, "
                 f"{A['n']} rounds, each object/container deleted (untimed) before the next.\n")
        L.append("| variant | command timed | median | mean | min | p90 | max |")
        L.append("|---|---|---|---|---|---|---|")
        for key, what in (("docker_run_d", f"`docker run -d --name X --label {RAW_LABEL} IMAGE CMD`"),
                          ("kubectl_apply_wait_ready", "`kubectl apply -f - && kubectl wait --for=condition=Ready sbx/X --timeout=60s`"),
                          ("docker_api_create_start", "`POST /containers/create` + `POST /containers/{id}/start` (engine socket, keep-alive)"),
                          ("api_create_watch_ready", "`POST …/sandboxes` → first watch event with Ready=True (watch open before)"),
                          ("kubectl_version_client", "`kubectl version --client -o json` (client start-up overhead)"),
                          ("docker_version_client", "`docker --version` (client start-up overhead)")):
            s = A[key]
            L.append(f"| {key} | {what} | {fmt_s(s['median'])} | {fmt_s(s['mean'])} | {fmt_s(s['min'])} | {fmt_s(s['p90'])} | {fmt_s(s['max'])} |")
        kov = A["kubectl_version_client"]["median"]
        dov = A["docker_version_client"]["median"]
        L.append("")
        L.append(f"The kubectl path starts two kubectl processes (apply, then wait), ≈ {2 * kov:.3f} s of client start-up by the "
                 f"`kubectl version --client` median; `docker run -d` starts one docker process (≈ {dov:.3f} s). Subtracting those: "
                 f"{A['kubectl_apply_wait_ready']['median'] - 2 * kov:.3f} s vs {A['docker_run_d']['median'] - dov:.3f} s "
                 f"({(A['kubectl_apply_wait_ready']['median'] - 2 * kov) / max(1e-9, A['docker_run_d']['median'] - dov):.2f}×). "
                 f"Row a′ avoids client processes altogether.\n")
        L.extend(plot_line(d, "latency-cdf", "distribution of the four variants"))
    if B:
        L.append("## b. burst\n")
        L.extend(plot_line(d, "burst", "Sandboxes Ready over time against the raw burst's end"))
        L.append(f"- network: {B.get('network', 'the engine default')} (a Linux bridge takes at most 1,024 ports; "
                 f"beyond 1,000 sandboxes the Sandboxes carry `egress.allowedDomains: []` and the raw containers `--network none`).")
        L.append(f"- raw: {B['n']} × `docker run -d` via `xargs -P {B['concurrency']}`: {fmt_s(B['docker_seconds'])} "
                 f"({B['docker_running']}/{B['n']} running); `docker rm -f` of all with -P {B['concurrency']}: {fmt_s(B['docker_rm_seconds'])}.")
        L.append(f"- operator: `kubectl apply -f burst-{B['n']}.yaml` ({B['n']} documents) returned after {fmt_s(B['kubectl_apply_seconds'])}; "
                 f"{B['ready']}/{B['n']} Ready; last Ready at {fmt_s(B.get('operator_seconds'))} after the apply started "
                 f"(median object {fmt_s((B.get('operator_time_to_ready') or {}).get('median'))}).")
        L.append(f"- operator during the burst: {B['reconciles']:.0f} reconciles, CPU {B['operator_cpu_seconds']:.1f} s, "
                 f"VmHWM {B['operator_status']['VmHWM'] / 1024:.1f} MiB; provider calls: "
                 + ", ".join(f"{k} {v:.0f}" for k, v in B["provider_calls"].items()) + ".")
        if B.get("reconcile_errors"):
            L.append(f"- reconcile errors: {B['reconcile_errors']}")
        if B.get("not_ready_reasons"):
            L.append(f"- not Ready at the bound, by Ready reason: {B['not_ready_reasons']}")
        if B.get("delete"):
            L.append(delete_line(B["delete"]) + "\n")
        else:
            L.append("- clean-up: did not finish (the run was stopped during it).\n")
    for c in C:
        L.append(f"## c. idle with {c['n']} Sandboxes ({c['variant']})\n")
        L.append(f"Measured: {c['description']}. Created with parallel POSTs in {fmt_s(c['create_seconds'])}; "
                 f"{c['reconciled']}/{c['n']} reconciled {fmt_s(c['reconcile_all_seconds'])} after the first POST "
                 f"(Ready reasons: {c['ready_reasons']}).\n")
        L.append(f"- operator VmRSS: {c['rss_before_kb'] / 1024:.1f} MiB before the objects existed; "
                 f"{c['rss_settled_kb'] / 1024:.1f} MiB once settled; {c['rss_idle_end_kb'] / 1024:.1f} MiB at the end of the idle window "
                 f"(VmHWM {c['hwm_kb'] / 1024:.1f} MiB, RssAnon {(c.get('rss_anon_kb') or 0) / 1024:.1f} MiB, {c.get('threads')} threads).")
        i = c["idle"]
        L.append(f"- idle window {i['seconds']:.0f} s (between two sweep passes, long before the {env.get('resync', 600)} s resync): "
                 f"provider calls {i['provider_calls'] or 'none'}; reconciles {i['reconciles']:.0f}; operator CPU {i['operator_cpu_seconds']:.2f} s; "
                 + (f"engine requests seen by the socket proxy: {i['engine_requests'] or 'none'}." if c.get("engine_proxy") else "no engine proxy."))
        s = c["sweep_window"]
        if s["sweep_passes"]:
            eng = s["engine_requests"]
            L.append(f"- one sweep pass (window of {s['seconds']:.0f} s before the idle window, containing {s['sweep_passes']:.0f} pass): "
                     f"provider calls {s['provider_calls'] or 'none'}; engine requests {eng or 'none'}.")
        L.append(f"- Events the operator published about these objects: {c.get('events_in_namespace', '?')} "
                 f"(kube-runtime's Recorder keeps each one it published in an in-process cache for 6 minutes). "
                 f"One object as the API serves it: {c.get('object_json_bytes', '?')} bytes of JSON, of which managedFields "
                 f"{c.get('object_managed_fields_bytes', '?')} bytes ({', '.join(c.get('object_managers', []))}).")
        r = c.get("restart")
        if r:
            L.append(f"- after restarting the operator on the {c['n']} existing objects (a fresh process that never published an Event): "
                     f"{r['reconciles']:.0f} reconciles (done {fmt_s(r['settle_seconds'])} after the first scrape, which follows leadership by ~1 s), provider calls {r['provider_calls'] or 'none'}"
                     + (f", engine requests {r['engine_requests'] or 'none'}" if r.get("engine_requests") is not None else "")
                     + f"; VmRSS {r['rss_kb'] / 1024:.1f} MiB (VmHWM {r['hwm_kb'] / 1024:.1f} MiB, RssAnon {(r.get('rss_anon_kb') or 0) / 1024:.1f} MiB).")
        if c.get("delete"):
            L.append(delete_line(c["delete"]))
        L.append("")
    L.extend(scale.report_sections(d))
    for extra in env.get("notes", []):
        L.append(f"- {extra}")
    text = "\n".join(L) + "\n"
    with open(os.path.join(d, "results.md"), "w") as f:
        f.write(text)
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p, need_op=True):
        p.add_argument("--namespace", required=True)
        p.add_argument("--image", default=os.environ.get("SANDBOX_BASE_IMAGE", "sandbox-operator/base:bookworm"))
        p.add_argument("--out")
        p.add_argument("--timeout", type=float, default=900)
        p.add_argument("--instance", default="bench")
        if need_op:
            p.add_argument("--metrics", required=True)
            p.add_argument("--pid", type=int, required=True)

    p = sub.add_parser("single"); common(p, need_op=False); p.add_argument("--n", type=int, default=30)
    p = sub.add_parser("burst"); common(p); p.add_argument("--n", type=int, default=1000); p.add_argument("--concurrency", type=int, default=32); p.add_argument("--workdir", required=True)
    p = sub.add_parser("idle"); common(p); p.add_argument("--n", type=int, required=True); p.add_argument("--variant", choices=["docker", "stalled"], required=True)
    p.add_argument("--idle-secs", type=float, default=60); p.add_argument("--proxy-counts"); p.add_argument("--sweep-interval", type=float, default=0)
    p.add_argument("--keep", action="store_true", help="leave the objects for `restart`")
    p = sub.add_parser("restart"); common(p); p.add_argument("--proxy-counts")
    p = sub.add_parser("cleanup"); common(p, need_op=False)
    p = sub.add_parser("report"); p.add_argument("--dir", required=True)
    import scale  # figures d, e, f (bench/scale.py)
    commands = {"single": cmd_single, "burst": cmd_burst, "idle": cmd_idle, "restart": cmd_restart, "cleanup": cmd_cleanup, "report": cmd_report}
    commands.update(scale.add_parsers(sub, common))
    a = ap.parse_args()
    commands[a.cmd](a)


if __name__ == "__main__":
    main()
