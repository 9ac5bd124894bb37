"""Plots bench/bench.sh's JSON: bandwidth vs size per level and data path
(nixlPut solid, stores through nixlGetPtr dotted, LL lines dash-dotted) with
the same-run baselines dashed, and the ratio to the copy engine, one column
per GPU pair (same-GPU runs under MPS get their own column); and half round
trip vs size per level and path, with the same run's floor (a bare flag) as a
grey line and the size up to which LL beats the other paths marked.
Usage: plot_bench.py RESULTS_DIR OUT.png"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402

ARGS = benchlib.args(__doc__, "plot_bench.py RESULTS_DIR OUT.png", 2, 2)
plt = benchlib.pyplot()

src, out = ARGS
runs = {}
for path in sorted(glob.glob(os.path.join(src, "gpu*-gpu*-*.json"))):
    parts = os.path.basename(path).split("-")
    pair = "-".join(parts[:3] if parts[2] == "mps" else parts[:2])
    runs.setdefault(pair, []).append(benchlib.load_json(path))
if not runs:
    print(f"plot_bench.py: no gpu*-gpu*-*.json in {src}: run bench/bench.sh --out DIR first", file=sys.stderr)
    sys.exit(1)

STYLE = {"put": "-", "store": ":", "ll": "-.", "ll128": (0, (5, 1, 1, 1, 1, 1))}
NAME = {"put": "nixlPut", "store": "nixlGetPtr stores", "ll": "LL lines", "ll128": "LL128 lines"}


def title_of(docs):
    run = docs[0]["run"]
    gi, gt = run.get("initiator_gpu") or {}, run.get("target_gpu") or {}
    mps = ", MPS" if run.get("mps") else ""
    return f"{gi.get('name', '?')} GPU {gi.get('ordinal', '?')} -> GPU {gt.get('ordinal', '?')}{mps}"


def bandwidth(ax, ratio_ax, rows, title):
    for level in ("thread", "warp", "block"):
        for path in ("put", "store", "ll", "ll128"):
            pts = sorted((r["size_bytes"], r["gb_per_s"], r.get("ratio")) for r in rows
                         if r["level"] == level and r.get("path", "put") == path)
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=STYLE[path], marker="o", ms=3,
                    label=f"{level}, {NAME[path]}")
            # Hollow rings: the row's working set fits in L2 (a cache rate, not HBM's).
            cached = sorted((r["size_bytes"], r["gb_per_s"]) for r in rows
                            if r["level"] == level and r.get("path", "put") == path and r.get("l2_resident"))
            if cached:
                ax.plot(*zip(*cached), linestyle="none", marker="o", ms=7, mfc="none", mec="grey")
            rp = [(p[0], p[2]) for p in pts if p[2]]
            if rp and level == "block":
                ratio_ax.plot(*zip(*rp), linestyle=STYLE[path], marker="o", ms=3, label=f"block, {path}")
    for key, label in (("copy_engine_gbps", "copy engine"), ("nixl_write_gbps", "NIXL host WRITE")):
        pts = sorted({(r["size_bytes"], r["baselines"][key]) for r in rows if r["baselines"].get(key)})
        if pts:
            ax.plot(*zip(*pts), linestyle="--", label=label)
    ax.set(xscale="log", yscale="log", xlabel="bytes per iteration (ringed: fits in L2)", ylabel="GB/s (1e9 B/s)",
           title="bandwidth, " + title)
    ratio_ax.axhline(1.0, color="grey", lw=0.8)
    ratio_ax.set(xscale="log", xlabel="bytes per iteration", ylabel="path ÷ best baseline", title="ratio, " + title)
    for a in (ax, ratio_ax):
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)


def pingpong(ax, rows, title):
    for level in ("thread", "warp", "block"):
        for path in ("put", "store", "ll", "ll128"):
            pts = sorted((r["size_bytes"], r["half_rtt"]["p50_ns"] / 1e3) for r in rows
                         if r["level"] == level and r.get("path", "put") == path and r.get("half_rtt"))
            if pts:
                ax.plot(*zip(*pts), linestyle=STYLE[path], marker="o", ms=3, label=f"{level}, {path}, p50")
    floors = [r["half_rtt"]["p50_ns"] / 1e3 for r in rows if r.get("path") == "flag" and r.get("half_rtt")]
    if floors:
        ax.axhline(min(floors), color="grey", lw=1, label=f"floor (bare flag) {min(floors):.2f} µs")
    for c in CROSS.get(title, []):
        if c["mode"] == "pingpong" and c["level"] == "block" and c["ll_wins_up_to_bytes"]:
            ax.axvline(c["ll_wins_up_to_bytes"], color="grey", ls="-.", lw=0.8,
                       label=f"block: ll fastest up to {c['ll_wins_up_to_bytes']} B")
    ax.set(xscale="log", yscale="log", xlabel="bytes per put", ylabel="half round trip (µs)", title="ping-pong, " + title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


CROSS = {}
try:
    for c in json.load(open(os.path.join(src, "crossover.json"))):
        CROSS.setdefault(c["pair"], []).append(c)
except (OSError, ValueError):
    pass
pairs = sorted(runs)
fig, axes = plt.subplots(3, len(pairs), figsize=(7 * len(pairs), 13), squeeze=False)
for col, pair in enumerate(pairs):
    docs = runs[pair]
    title = title_of(docs)
    bandwidth(axes[0][col], axes[1][col], [r for d in docs for r in d["rows"] if r["mode"] == "bandwidth"], title)
    pingpong(axes[2][col], [r for d in docs for r in d["rows"] if r["mode"] == "pingpong"], pair)
    axes[2][col].set_title("ping-pong, " + title)
fig.tight_layout()
fig.savefig(out, dpi=100)
