#!/usr/bin/env python3
"""The per-phase view of a folder of elastic collectives runs (the JSON files
bench/collectives_elastic.sh writes: r*-*.json random deaths, sweep-*.json
a planned death at every size, fresh-*.json the same sizes at the survivors'
rank count with no death).

    python3 bench/report_collectives_elastic.py DIR [OUT_PREFIX]

Writes OUT_PREFIX.json (runs and comparison), OUT_PREFIX.csv (the comparison),
OUT_PREFIX-runs.csv and OUT_PREFIX.png (default
DIR/phases) and prints, on stdout:
  - per run: ranks gone, detection (GPU wait ms when a kernel masked the rank,
    else "agreement"), agreement ms and shrink ms (slowest survivor), calls
    lost, wrong elements;
  - per case and size of the sweep: p50 µs per call before the death (4 ranks),
    after the shrink (3 ranks), the fresh 3-rank run, and after / fresh.
The plot: after / fresh against size per case (left); detection, agreement
and shrink per run (right). Times are the slowest rank's GPU time per call,
the warm-up round left out (as `collectives --json` gives them).
"""
import csv
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402

ARGS = benchlib.args(__doc__, "report_collectives_elastic.py DIR [OUT_PREFIX]", 1, 2)
DIR = ARGS[0]
PREFIX = ARGS[1] if len(ARGS) == 2 else os.path.join(DIR, "phases")


def load(pattern):
    out = {}
    for f in sorted(glob.glob(os.path.join(DIR, pattern))):
        with open(f) as fh:
            out[os.path.basename(f)[: -len(".json")]] = json.load(fh)
    return out


def case_key(row):
    return (row["op"], row["algo"], row["path"], row["dtype"])


def worst(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def run_row(name, run):
    """One death run: who went, how it was found, what it cost."""
    det = run.get("detections", [])
    waits = [d["wait_ms"] for d in det if d.get("wait_ms") is not None]
    r0 = run["rows"][0] if run["rows"] else {}
    return {
        "run": name,
        "op": r0.get("op"), "algo": r0.get("algo"), "path": r0.get("path"),
        "ranks_gone": sorted({d["rank"] for d in det}),
        "step": worst([d["step"] for d in det]),
        "detect": "gpu wait" if waits else "agreement",
        "gpu_wait_ms": worst(waits),
        "after_kill_ms": worst([d.get("after_kill_ms") for d in det]),
        "agree_ms": worst([d["agree_ms"] for d in det]),
        "shrink_ms": worst([d["shrink_ms"] for d in det]),
        "lost_calls": sum(r["lost"] for r in run["rows"]),
        "wrong_elements": run.get("wrong_elements", 0),
        "joined": sorted(j["rank"] for j in run.get("joins", [])),
        "join_ms": worst([j["connect_ms"] for j in run.get("joins", [])]),
    }


def compare(sweeps, fresh):
    """Rows of the sweep: per case and size after the shrink, its p50 against
    the fresh run's at the same rank count (and before the death, where the
    run timed that size at its first rank count; "before" is None where the
    death came first, or where an operation's buffer differs by rank count)."""
    fresh_p50 = {}
    for run in fresh.values():
        for r in run["rows"]:
            fresh_p50[case_key(r) + (r["bytes"], r["ranks"])] = r["p50_us"]
    out = []
    for name, run in sweeps.items():
        first = run["ranks"]
        before = {case_key(r) + (r["bytes"],): r["p50_us"] for r in run["rows"] if r["ranks"] == first}
        for r in run["rows"]:
            f = fresh_p50.get(case_key(r) + (r["bytes"], r["ranks"]))
            if r["ranks"] >= first or f is None or not r["p50_us"]:
                continue
            b = before.get(case_key(r) + (r["bytes"],)) or None
            out.append({"run": name, "op": r["op"], "algo": r["algo"], "path": r["path"],
                        "dtype": r["dtype"], "bytes": r["bytes"], "ranks_before": first,
                        "ranks_after": r["ranks"], "before_p50_us": b,
                        "after_p50_us": r["p50_us"], "fresh_p50_us": f, "after_over_fresh": r["p50_us"] / f})
    return sorted(out, key=lambda r: (r["op"], r["algo"], r["path"], r["bytes"]))


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else None


def print_tables(runs, cmp_rows):
    print("| run | gone | detection | GPU wait ms | agree ms | shrink ms | lost calls | wrong | joined | join ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v: "" if v is None else f"{v:.2f}"  # noqa: E731
    for r in runs:
        print(f"| {r['run']} | {r['ranks_gone']} | {r['detect']} | {fmt(r['gpu_wait_ms'])} | "
              f"{fmt(r['agree_ms'])} | {fmt(r['shrink_ms'])} | {r['lost_calls']} | {r['wrong_elements']} | "
              f"{r['joined'] or ''} | {fmt(r['join_ms'])} |")
    both = [r["agree_ms"] + r["shrink_ms"] for r in runs if r["agree_ms"] is not None]
    waits = [r["gpu_wait_ms"] for r in runs if r["gpu_wait_ms"] is not None]
    print(f"\nruns {len(runs)}, deaths named {sum(len(r['ranks_gone']) for r in runs)}, "
          f"wrong elements {sum(r['wrong_elements'] for r in runs)}; "
          f"GPU wait (in-step deaths, {len(waits)}): {fmt(min(waits, default=None))}–{fmt(max(waits, default=None))} ms; "
          f"agreement + shrink p50 {fmt(pct(both, 50))} ms, p99 {fmt(pct(both, 99))} ms, max {fmt(max(both, default=None))} ms")
    if not cmp_rows:
        return
    print("\n| case | bytes | before p50 µs | after p50 µs | fresh p50 µs | after / fresh |")
    print("|---|---|---|---|---|---|")
    for r in cmp_rows:
        print(f"| {r['op']} {r['algo']} {r['path']} {r['dtype']} | {r['bytes']} | "
              f"{fmt(r['before_p50_us'])} ({r['ranks_before']}) | {r['after_p50_us']:.1f} ({r['ranks_after']}) | "
              f"{r['fresh_p50_us']:.1f} | {r['after_over_fresh']:.2f} |")
    ratios = [r["after_over_fresh"] for r in cmp_rows]
    print(f"\nafter / fresh over {len(ratios)} sizes and cases: median {pct(ratios, 50):.2f}, "
          f"p90 {pct(ratios, 90):.2f}, range {min(ratios):.2f}–{max(ratios):.2f}")


def plot(runs, cmp_rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 5))
    cases = sorted({(r["op"], r["algo"], r["path"]) for r in cmp_rows})
    for c in cases:
        pts = sorted((r["bytes"], r["after_over_fresh"]) for r in cmp_rows
                     if (r["op"], r["algo"], r["path"]) == c)
        a.plot([p[0] for p in pts], [p[1] for p in pts], marker=".",
               linestyle=":" if c[2] == "put" else "-", label=" ".join(c))
    a.axhline(1.0, color="grey", lw=0.8)
    a.axhline(1.1, color="grey", lw=0.8, ls="--")
    a.set_xscale("log", base=2)
    a.set_xlabel("buffer bytes")
    a.set_ylabel("p50 per call after the shrink / fresh run")
    a.set_title("after a death: 3 survivors against a fresh 3-rank run")
    if cases:
        a.legend(fontsize=7)
    else:
        a.text(0.5, 0.5, "no sweep in this folder (--sweep)", ha="center", transform=a.transAxes)
    xs = range(len(runs))
    b.scatter(xs, [r["gpu_wait_ms"] or float("nan") for r in runs], marker="v", label="GPU wait (masked in-step)")
    b.scatter(xs, [r["agree_ms"] for r in runs], marker="o", label="agreement")
    b.scatter(xs, [r["shrink_ms"] for r in runs], marker="x", label="shrink (host)")
    b.set_yscale("log")
    b.set_xlabel("run")
    b.set_ylabel("ms (slowest survivor)")
    b.set_title("each death: detection, agreement, shrink")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    deaths = {**load("r[0-9]*.json"), **load("sweep-*.json")}
    deaths = {k: v for k, v in deaths.items() if not k.endswith(".plan")}
    if not deaths:
        print(f"report_collectives_elastic: no r*.json or sweep-*.json in {DIR}: "
              "run bench/collectives_elastic.sh --out DIR first", file=sys.stderr)
        sys.exit(1)
    runs = [run_row(k, v) for k, v in deaths.items()]
    cmp_rows = compare({k: v for k, v in deaths.items() if k.startswith("sweep-")}, load("fresh-*.json"))
    print_tables(runs, cmp_rows)
    with open(PREFIX + ".json", "w") as fh:
        json.dump({"runs": runs, "after_vs_fresh": cmp_rows}, fh, indent=1)
    with open(PREFIX + ".csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(cmp_rows[0]) if cmp_rows else ["run"])
        w.writeheader()
        w.writerows(cmp_rows)
    with open(PREFIX + "-runs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(runs[0]))
        w.writeheader()
        w.writerows(runs)
    plot(runs, cmp_rows, PREFIX + ".png")
    print(f"\nwrote {PREFIX}.json, {PREFIX}.csv, {PREFIX}-runs.csv, {PREFIX}.png", file=sys.stderr)


main()
