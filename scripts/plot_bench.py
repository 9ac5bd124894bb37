"""Plots scripts/bench.sh's JSON: bandwidth vs size per level with the
same-run baselines dashed (one panel per GPU pair), and half round trip vs
size per level. Usage: plot_bench.py RESULTS_DIR OUT.png"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src, out = sys.argv[1], sys.argv[2]
runs = {}
for path in sorted(glob.glob(os.path.join(src, "gpu*-gpu*-*.json"))):
    pair = "-".join(os.path.basename(path).split("-")[:2])
    doc = json.load(open(path))
    runs.setdefault(pair, []).append(doc)

pairs = sorted(runs)
fig, axes = plt.subplots(2, len(pairs), figsize=(7 * len(pairs), 9), squeeze=False)
for col, pair in enumerate(pairs):
    docs = runs[pair]
    gi = docs[0]["run"].get("initiator_gpu") or {}
    gt = docs[0]["run"].get("target_gpu") or {}
    title = f"{gi.get('name', '?')} GPU {gi.get('ordinal', '?')} -> GPU {gt.get('ordinal', '?')}"
    ax = axes[0][col]
    rows = [r for d in docs for r in d["rows"] if r["mode"] == "bandwidth"]
    for level in ("thread", "warp", "block"):
        pts = sorted((r["size_bytes"], r["gb_per_s"]) for r in rows if r["level"] == level)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=f"device put, {level} level")
    for key, label in (("copy_engine_gbps", "copy engine"), ("nixl_write_gbps", "NIXL host WRITE")):
        pts = sorted({(r["size_bytes"], r["baselines"][key]) for r in rows if r["baselines"].get(key)})
        if pts:
            ax.plot(*zip(*pts), linestyle="--", label=label)
    ax.set(xscale="log", yscale="log", xlabel="bytes per iteration", ylabel="GB/s (1e9 B/s)", title="bandwidth, " + title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1][col]
    rows = [r for d in docs for r in d["rows"] if r["mode"] == "pingpong"]
    for level in ("thread", "warp", "block"):
        pts = sorted((r["size_bytes"], r["half_rtt"]["p50_ns"] / 1e3) for r in rows if r["level"] == level and r.get("half_rtt"))
        if pts:
            ax.plot(*zip(*pts), marker="o", label=f"{level} level, p50")
    ax.set(xscale="log", yscale="log", xlabel="bytes per put", ylabel="half round trip (µs)", title="ping-pong, " + title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(out, dpi=110)
