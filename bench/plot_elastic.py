#!/usr/bin/env python3
"""Plots the elastic ep runs of a folder (the el-*.json files bench/run_elastic.sh writes).

    python3 bench/plot_elastic.py DIR OUT.png

Left: every kill of the kill loops (el-<mode>-kill-loop-<path>.json), the
survivors' agreement time (host ms from a survivor's report to the decision,
slowest survivor) per kill. Middle: LL dispatch and combine p50 after each
contraction (µs, slowest rank), beside the fresh run of the same ranks
(el-ll-fresh-0-1-2.json, dashed). Right: upstream's expansion_fault_contraction
in LL, p50 per phase and path (after the agreement where a rank was killed).
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402

ARGS = benchlib.args(__doc__, "plot_elastic.py RESULTS_DIR OUT.png", 2, 2)
plt = benchlib.pyplot()

COLORS = {"put": "#1f77b4", "store": "#2ca02c"}


def load(folder, name):
    path = os.path.join(folder, f"el-{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["phases"]


def p50(row, key):
    v = row.get(key)
    return v["p50_us"] if v else None


def agreement(ax, folder):
    for path in sorted(glob.glob(os.path.join(folder, "el-*-kill-loop-*.json"))):
        tag = os.path.basename(path)[3:-5].replace("-kill-loop-", " ")
        with open(path) as f:
            kills = [r for r in json.load(f)["phases"] if r["killed"] and r["agree_ms"] is not None]
        ax.plot(range(1, len(kills) + 1), [r["agree_ms"] for r in kills], marker="o", ms=3, label=tag)
    ax.set(xlabel="kill", ylabel="agreement, ms (slowest survivor)", title="kill loops: agreement per kill")
    ax.legend(fontsize=7)


def contraction(ax, folder):
    fresh = load(folder, "ll-fresh-0-1-2") or []
    for path in ("put", "store"):
        rows = [r for r in load(folder, f"ll-kill-loop-{path}") or [] if r["killed"] and r["path"] == path]
        for key, style in (("dispatch_after", "-"), ("combine_after", ":")):
            ax.plot([p50(r, key) for r in rows], style, color=COLORS[path], label=f"{path} {key.split('_')[0]}")
            ref = [p50(r, key.replace("after", "before")) for r in fresh if r["path"] == path]
            if ref and ref[0]:
                ax.axhline(ref[0], ls="--", lw=0.8, color=COLORS[path])
    ax.set(xlabel="kill", ylabel="p50 µs after the agreement", title="LL after each contraction (dashed: fresh run)")
    ax.legend(fontsize=7)


def fault_plan(ax, folder):
    rows = load(folder, "ll-expansion_fault_contraction") or []
    for n, path in enumerate(("put", "store")):
        mine = [r for r in rows if r["path"] == path]
        for k, key in enumerate(("dispatch", "combine")):
            vals = [p50(r, f"{key}_after") or p50(r, f"{key}_before") or 0 for r in mine]
            xs = [r["phase"] + 0.2 * (2 * n + k) - 0.3 for r in mine]
            ax.bar(xs, vals, width=0.18, color=COLORS[path], alpha=1.0 if key == "dispatch" else 0.5,
                   label=f"{path} {key}")
    ax.set_xticks([r["phase"] for r in rows if r["path"] == "store"])
    ax.set_xticklabels([",".join(str(x) for x in r["ranks"]) for r in rows if r["path"] == "store"], fontsize=7)
    ax.set(xlabel="phase (ranks)", ylabel="p50 µs", title="expansion_fault_contraction, LL")
    ax.legend(fontsize=7)


def main():
    folder, out = ARGS
    if not glob.glob(os.path.join(folder, "el-*.json")):
        print(f"plot_elastic: no el-*.json in {folder}", file=sys.stderr)
        sys.exit(1)
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    agreement(axes[0], folder)
    contraction(axes[1], folder)
    fault_plan(axes[2], folder)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


main()
