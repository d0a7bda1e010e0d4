#!/usr/bin/env python3
"""The warm-pool bench's table (printed and appended to results.md) and its plot, the claim
latency CDF against the cold create (plots/claims.png, when matplotlib is importable: run it
with the bench's virtualenv). Reads pool-claims.json, pool-burst.json and pool-k8s.json.

    python bench/pool_report.py target/bench
"""

import json
import os
import sys


def load(d: str, name: str):
    try:
        with open(os.path.join(d, name)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"


def verdict(ok: bool) -> str:
    return "meets target" if ok else "misses target"


def rows(C, B, K) -> list[str]:
    out = ["| figure | measured | target | verdict |", "|---|---|---|---|"]
    if C:
        med, p99 = C["claim"]["median"], pct(C["claims"], 0.99)
        out.append(f"| claim → Ready, pool of {C['pool_size']}, {C['n']} claims (modes {C['modes']}), median | {ms(med)} | ≤ 30 ms | {verdict(med <= 0.030)} |")
        out.append(f"| the same, p99 | {ms(p99)} | ≤ 100 ms | {verdict(p99 <= 0.100)} |")
        if C.get("docker"):
            d = C["docker"]["median"]
            out.append(f"| `docker run -d` median {ms(d)} / claim median | {d / med:.1f}× faster | ≥ 8× | {verdict(d / med >= 8)} |")
        if C.get("cold"):
            out.append(f"| cold create through the operator (no pool), median | {ms(C['cold']['median'])} | — | for reference |")
    if B:
        r = B["claims_s"] / B["docker_s"]
        out.append(f"| {B['n']} claims at once (modes {B['modes']}) {B['claims_s']:.2f} s / {B['n']} `docker run -d` at -P {B['concurrency']} {B['docker_s']:.2f} s | {r:.2f}× | ≤ 0.2× | {verdict(r <= 0.2)} |")
    if K:
        med = K["claim"]["median"]
        out.append(f"| Kubernetes provider: warm claim → Ready, {K['n']} claims (modes {K['modes']}), median | {ms(med)} | ≤ 50 ms | {verdict(med <= 0.050)} |")
    idle = [f"{name} {phase} {share:.0%}" for name, data in (("claims:", C), ("burst:", B), ("k8s:", K))
            for phase, share in ((data or {}).get("idle_before") or {}).items()]
    if idle:
        out.append("")
        out.append("CPU idle over the second before each timed phase: " + ", ".join(idle) + ".")
    return out


def plot(d: str, C, K) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    series = [(C, "claims", "Docker: claim", "-"), (C, "cold_creates", "Docker: cold create", "--"),
              (C, "docker_runs", "docker run -d", ":"), (K, "claims", "Kubernetes: claim", "-.")]
    for data, key, label, style in series:
        xs = sorted((data or {}).get(key) or [])
        if xs:
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step([x * 1000 for x in xs], ys, where="post", linestyle=style, label=f"{label} (n={len(xs)})")
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds to Ready (log)")
    ax.set_ylabel("fraction")
    ax.set_title("Warm-pool claim against a cold create")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    os.makedirs(os.path.join(d, "plots"), exist_ok=True)
    path = os.path.join(d, "plots", "claims.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    d = sys.argv[1] if len(sys.argv) > 1 else "target/bench"
    C, B, K = load(d, "pool-claims.json"), load(d, "pool-burst.json"), load(d, "pool-k8s.json")
    text = "\n".join(["", "### Warm pools (bench/pool.sh)", "", *rows(C, B, K)])
    png = plot(d, C, K)
    if png:
        text += f"\n\n![claim latency CDF]({os.path.relpath(png, d)})"
    print(text)
    with open(os.path.join(d, "results.md"), "a") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
