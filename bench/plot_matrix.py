"""Plots the collectives rows of a bench/gpu-matrix.sh folder: per operation,
our fastest algorithm and path at each size over NCCL's same call from the
same run (time p50 ÷ NCCL's p50; below 1 ours is faster), one line per rank
count and launch mode (stream launches solid, CUDA graphs dashed), sizes on
a log axis. Writes OUT.png.
Reads coll-*.json or coll-*.json.gz.
Usage: plot_matrix.py RESULTS_DIR OUT.png"""
import glob
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402

ARGS = benchlib.args(__doc__, "plot_matrix.py RESULTS_DIR OUT.png", 2, 2)
plt = benchlib.pyplot()

DIR, OUT = ARGS
OPS = ("allreduce", "allgather", "reduce-scatter")


def ratios(rows, op):
    """Size → our fastest p50 over NCCL's p50, where NCCL ran."""
    best = {}
    for r in rows:
        if r["op"] == op and r.get("nccl_p50_us"):
            s = r["size_bytes"]
            if s not in best or r["time_p50_us"] < best[s]["time_p50_us"]:
                best[s] = r
    return sorted((s, r["time_p50_us"] / r["nccl_p50_us"]) for s, r in best.items())


def main():
    files = sorted(glob.glob(os.path.join(DIR, "coll-*.json")) + glob.glob(os.path.join(DIR, "coll-*.json.gz")))
    if not files:
        print(f"plot_matrix.py: no coll-*.json in {DIR}", file=sys.stderr)
        sys.exit(1)
    fig, axes = plt.subplots(1, len(OPS), figsize=(6 * len(OPS), 4.5), sharey=True)
    for ax, op in zip(axes, OPS):
        for f in files:
            tag = os.path.basename(f)[5:].split(".json")[0]  # 2r-stream
            ranks, launch = tag.split("-")
            pts = ratios(benchlib.load_json(f)["rows"], op)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "--" if launch == "graph" else "-",
                        marker=".", label=f"{ranks[:-1]} ranks, {launch}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(op)
        ax.set_xlabel("size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ours ÷ NCCL, time per call (below 1: ours faster)")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    benchlib.save_png(fig, OUT, dpi=110)


main()
