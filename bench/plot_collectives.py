"""Plots the JSON files of `collectives --json` (bench/run_collectives.sh
writes coll-*.json): per operation, GPU time per call (p50) against size for
every algorithm and data path, NCCL's same calls dashed where they ran; and
bus bandwidth against size. One row of plots per JSON file, titled with its
ranks, GPUs, MPS and launch mode (stream or CUDA graph).
Usage: plot_collectives.py OUT.png FILE.json [FILE.json ...]"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402

ARGS = benchlib.args(__doc__, "plot_collectives.py OUT.png FILE.json [FILE.json ...]", 2, None)
plt = benchlib.pyplot()

out, files = ARGS[0], ARGS[1:]
OPS = ("allreduce", "allgather", "reduce-scatter")
STYLE = {"store": "-", "put": ":"}


def title_of(path, run):
    cfg = run.get("config", {})
    gpus = len(set(g.split(" ", 1)[-1] for g in run.get("gpus", [])))
    mps = ", MPS" if run.get("mps") else ""
    launch = cfg.get("launch", "stream")
    return f"{os.path.basename(path)}: {cfg.get('ranks', '?')} ranks on {gpus} GPU(s){mps}, {launch} launches"


def series(rows, op):
    """(algo, path, dtype, place) -> sorted [(size, row)]."""
    out = {}
    for r in rows:
        if r["op"] == op:
            key = (r["algo"], r["path"], r["type"], "in" if r["in_place"] else "out")
            out.setdefault(key, []).append((r["size_bytes"], r))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in out.items()}


def plot_op(ax_t, ax_b, rows, op):
    drawn_nccl = set()
    for (algo, path, dtype, place), pts in sorted(series(rows, op).items()):
        label = f"{'' if algo == '-' else algo + ', '}{path}, {dtype}{', in place' if place == 'in' else ''}"
        xs = [p[0] for p in pts]
        ax_t.plot(xs, [p[1]["time_p50_us"] for p in pts], STYLE.get(path, "-"), marker="o", ms=2.5, label=label)
        ax_b.plot(xs, [p[1]["busbw_gbps"] for p in pts], STYLE.get(path, "-"), marker="o", ms=2.5, label=label)
        nccl = [(p[0], p[1]["nccl_p50_us"], p[1]["nccl_busbw_gbps"]) for p in pts if p[1].get("nccl_p50_us")]
        if nccl and dtype not in drawn_nccl:
            drawn_nccl.add(dtype)
            ax_t.plot([n[0] for n in nccl], [n[1] for n in nccl], "k--", lw=1, label=f"NCCL, {dtype}")
            ax_b.plot([n[0] for n in nccl], [n[2] for n in nccl], "k--", lw=1, label=f"NCCL, {dtype}")
    ax_t.set(xscale="log", yscale="log", xlabel="size (bytes)", ylabel="time per call, p50 (µs)", title=op)
    ax_b.set(xscale="log", xlabel="size (bytes)", ylabel="busbw (GB/s, 1e9 B/s)", title=op + ", bus bandwidth")
    for a in (ax_t, ax_b):
        a.grid(True, which="both", alpha=0.3)
        if a.lines:
            a.legend(fontsize=6)


docs = []
for path in files:
    try:
        docs.append((path, json.load(open(path))))
    except (OSError, ValueError) as e:
        print(f"plot_collectives.py: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(1)
# Only the operations some file ran.
ops = [o for o in OPS if any(r["op"] == o for _, d in docs for r in d.get("rows", []))] or list(OPS)
fig, axes = plt.subplots(2 * len(docs), len(ops), figsize=(6 * len(ops), 4.5 * 2 * len(docs)), squeeze=False)
for i, (path, doc) in enumerate(docs):
    for j, op in enumerate(ops):
        plot_op(axes[2 * i][j], axes[2 * i + 1][j], doc.get("rows", []), op)
    axes[2 * i][0].annotate(title_of(path, doc.get("run", {})), (0, 1.12), xycoords="axes fraction", fontsize=10)
fig.tight_layout()
fig.savefig(out, dpi=110)
print(f"wrote {out}")
