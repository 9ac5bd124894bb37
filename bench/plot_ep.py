#!/usr/bin/env python3
"""Plots the ep runs of a folder (the ep-*.json files bench/run_ep.sh writes).

    python3 bench/plot_ep.py DIR OUT.png

Left: high-throughput runs, wire bandwidth (GB/s, bytes crossing into a
rank per p50 iteration) of dispatch and combine per method (put, store, and
the NCCL all-to-all of the same bytes). Right: low-latency runs, p50 and p99
GPU time per phase (µs).
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402

ARGS = benchlib.args(__doc__, "plot_ep.py RESULTS_DIR OUT.png", 2, 2)
plt = benchlib.pyplot()

COLORS = {"put": "#1f77b4", "store": "#2ca02c", "nccl": "#7f7f7f"}


def load(folder):
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "ep-*.json"))):
        with open(path) as f:
            doc = json.load(f)
        tag = os.path.basename(path)[3:-5]
        runs.append((tag, doc["run"]["config"]["mode"], doc["rows"]))
    return runs


def bars(ax, runs, value, ylabel, title):
    labels, x = [], 0
    for tag, _, rows in runs:
        for phase in ("dispatch", "combine"):
            for r in (r for r in rows if r["phase"] == phase):
                ax.bar(x, value(r), color=COLORS.get(r["method"], "k"), hatch="" if phase == "dispatch" else "//")
                x += 1
            labels.append((x - 0.5, f"{tag}\n{phase}"))
            x += 0.6
    ax.set_xticks([p - 1 for p, _ in labels])
    ax.set_xticklabels([t for _, t in labels], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, COLORS.keys(), fontsize=8)


def main():
    folder, out = ARGS
    runs = load(folder)
    if not runs:
        sys.exit(f"plot_ep: no ep-*.json in {folder}")
    ht = [r for r in runs if r[1] == "ht"]
    ll = [r for r in runs if r[1] == "ll"]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    if ht:
        bars(axes[0], ht, lambda r: r["wire_gbps"], "wire GB/s (p50)", "high-throughput: wire bandwidth")
    if ll:
        bars(axes[1], ll, lambda r: r["time"]["p50_ns"] / 1e3, "µs (p50)", "low-latency: GPU time per phase")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
