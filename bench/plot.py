#!/usr/bin/env python3
"""Plots of `make bench` (run by bench/run.sh with the bench's own virtualenv, which has
matplotlib from PyPI): one PNG per figure in target/bench/plots/, and summary.png with all of
them on one page (the README's headline plot). Reads the JSON files bench.py wrote; a figure
that was not measured is left out.

    python bench/plot.py --dir target/bench
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OP, RAW, TARGET = "#1f77b4", "#7f7f7f", "#d62728"


def load(d: str, name: str):
    try:
        with open(os.path.join(d, name)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def ecdf(ax, xs, label, color, style="-"):
    xs = sorted(xs)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=label, color=color, linestyle=style)


def latency(ax, A):
    raw = A["raw"]
    ecdf(ax, raw["kubectl_apply_wait_ready"], f"kubectl apply + wait (median {A['kubectl_apply_wait_ready']['median']:.2f} s)", OP)
    ecdf(ax, raw["docker_run_d"], f"docker run -d (median {A['docker_run_d']['median']:.2f} s)", RAW)
    ecdf(ax, raw["api_create_watch_ready"], f"API POST → watch Ready ({A['api_create_watch_ready']['median']:.2f} s)", OP, "--")
    ecdf(ax, raw["docker_api_create_start"], f"engine create + start ({A['docker_api_create_start']['median']:.2f} s)", RAW, "--")
    ax.set_title(f"a. one sandbox → Ready, {A['n']} rounds: {A['ratio_cli']:.2f}× CLI, {A['ratio_api']:.2f}× API")
    ax.set_xlabel("seconds")
    ax.set_ylabel("fraction of rounds")
    ax.set_xlim(left=0)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)


def burst(ax, B):
    times = sorted(B.get("ready_times") or [])
    if times:
        ax.step(times, range(1, len(times) + 1), where="post", color=OP, label=f"operator: Sandboxes Ready ({len(times)})")
    ax.axvline(B["docker_seconds"], color=RAW, linestyle="--", label=f"{B['n']} × docker run -d done ({B['docker_seconds']:.0f} s)")
    ratio = f"{B['ratio']:.2f}×" if B.get("ratio") else "incomplete"
    ax.set_title(f"b. {B['n']} applied at once → all Ready: {ratio}")
    ax.set_xlabel("seconds after the apply / the first docker run")
    ax.set_ylabel("Ready")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)


def rss(ax, D, C):
    xs = [r["n"] for r in D["levels"]]
    ys = [r["rss_kb"] / 1024 for r in D["levels"]]
    ax.plot(xs, ys, "o", color=OP, label="VmRSS, settled (Stalled objects)")
    s, b = D["rss_slope_kib_per_object"], D["rss_intercept_kb"]
    ax.plot([0, max(xs)], [b / 1024, (s * max(xs) + b) / 1024], "-", color=OP, alpha=0.5,
            label=f"least squares: {s:.2f} KiB/object")
    ax.plot([5000], [48], "x", color=TARGET, markersize=10, label="target at 5,000: 48 MiB")
    ax.plot([0, max(xs)], [b / 1024, (6 * max(xs) + b) / 1024], ":", color=TARGET, label="target slope 6 KiB/object")
    for c in C or []:
        if c.get("variant") == "docker":
            ax.plot([c["n"]], [c["rss_idle_end_kb"] / 1024], "s", color="#2ca02c", label=f"{c['n']} Docker-backed, stopped")
    ax.set_title("d. operator memory against object count")
    ax.set_xlabel("Sandboxes")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)


def idle(ax, D):
    xs = [r["n"] for r in D["levels"]]
    ys = [r["api_requests_per_second"] for r in D["levels"]]
    ax.plot(xs, ys, "o-", color=OP, label=f"API requests/s at idle, Lease excluded ({D['idle_seconds']:.0f} s windows)")
    ax.axhline(1.0, color=TARGET, linestyle=":", label="target at 10,000: ≤ 1/s")
    ax.set_title("d. API load at idle against object count")
    ax.set_xlabel("Sandboxes")
    ax.set_ylabel("requests / s")
    ax.set_ylim(bottom=0, top=max(1.2, max(ys) * 1.2))
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)


def sweep(ax, E):
    rows = E["levels"]
    labels = [f"{r['n']:,}" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["raw_list"]["median"] for r in rows], 0.4, color=RAW, label="one raw engine list call")
    ax.bar([i + 0.2 for i in x], [r["sweep_pass"]["median"] for r in rows], 0.4, color=OP, label="one sweep pass")
    for i, r in zip(x, rows):
        ax.annotate(f"{r['ratio']:.2f}×", (i + 0.2, r["sweep_pass"]["median"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels)
    ax.set_title(f"e. sweep pass vs raw list (medians of {E['rounds']}; target ≤ 1.5×)")
    ax.set_xlabel("labelled containers")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3, axis="y")


def counts(ax, F):
    names = ["reconciles", "engine requests", "API requests\n(Lease excluded)"]
    vals = [F["reconciles_per_create"], F["engine_requests_per_create"], F["api_requests_per_create"]]
    targets = [2.0, 6.0, None]
    bars = ax.bar(names, vals, color=OP)
    for bar, v, t in zip(bars, vals, targets):
        ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
        if t is not None:
            ax.hlines(t, bar.get_x(), bar.get_x() + bar.get_width(), color=TARGET, linestyle=":")
    ax.set_title(f"f. per created Sandbox ({F['n']} creates; dotted: targets)")
    ax.set_ylabel("per create")
    ax.grid(alpha=0.3, axis="y")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    d = ap.parse_args().dir
    out = os.path.join(d, "plots")
    os.makedirs(out, exist_ok=True)
    A, B, D, E, F = (load(d, n) for n in ("a-single.json", "b-burst.json", "d-scale.json", "e-sweep.json", "f-counts.json"))
    C = [c for c in (load(d, "c-idle-docker.json"), load(d, "c-idle-stalled.json")) if c]
    panels = [("latency-cdf", A, lambda ax: latency(ax, A)),
              ("burst", B, lambda ax: burst(ax, B)),
              ("rss", D and D.get("levels"), lambda ax: rss(ax, D, C)),
              ("idle-api", D and D.get("levels"), lambda ax: idle(ax, D)),
              ("sweep", E and E.get("levels"), lambda ax: sweep(ax, E)),
              ("per-create", F, lambda ax: counts(ax, F))]
    panels = [(name, draw) for name, data, draw in panels if data]
    for name, draw in panels:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        draw(ax)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"{name}.png"), dpi=110)
        plt.close(fig)
        print(f"wrote {out}/{name}.png")
    if panels:
        cols = 2
        rows = (len(panels) + 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(14, 4.6 * rows), squeeze=False)
        for ax, (_, draw) in zip(axes.flat, panels):
            draw(ax)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.suptitle("sandbox-operator, make bench (each figure against the raw provider in the same run)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "summary.png"), dpi=90)
        plt.close(fig)
        print(f"wrote {out}/summary.png")


if __name__ == "__main__":
    main()
