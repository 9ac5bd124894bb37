"""Plots the CSV or JSON files of `pipeline --csv/--json` (bench/run_pipeline.sh
writes p*.csv and p*.json): the slowest link's throughput (GB/s, 1e9 B/s)
against chunk size, one line per stages, path, level and slots (store solid,
nixlPut dotted, LL lines dash-dotted), with the same-run baselines where they
ran: the copy engine's copy of one chunk (grey, dashed) and NCCL's
ncclSend/ncclRecv through the same chain (black, dashed, per stage count);
and one chunk's latency through the chain against chunk size, p50 (solid
markers) and p99 (hollow). Every file goes into the same two panels, a line
per file and case (runs with other block counts or a slow stage are not
joined); where no baseline ran, the reason (the run's NCCL note) is printed
under the plot.
Usage: plot_pipeline.py OUT.png FILE.csv|FILE.json [...]"""
import csv
import io
import json
import os
import sys
import textwrap

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402

ARGS = benchlib.args(__doc__, "plot_pipeline.py OUT.png FILE.csv|FILE.json [...]", 2, None)
plt = benchlib.pyplot()

STYLE = {"store": "-", "put": ":", "ll": "-."}
NUMBERS = ("chunk_bytes", "slots", "stages", "min_link_gbps", "latency_p50_ns", "latency_p99_ns",
           "ce_gbps", "nccl_gbps")


def number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def read_csv(path):
    """(run info, rows): the `# key: value` lines (JSON values) and the table."""
    run, body = {}, []
    with open(path) as f:
        for line in f:
            if line.startswith("# ") and ": " in line and not body:
                key, value = line[2:].rstrip("\n").split(": ", 1)
                try:
                    run[key] = json.loads(value)
                except ValueError:
                    run[key] = value
            else:
                body.append(line)
    return run, list(csv.DictReader(io.StringIO("".join(body))))


def read_json(path):
    doc = json.load(open(path))
    rows = []
    for r in doc.get("rows", []):
        flat = dict(r)
        for k, v in (r.get("latency") or {}).items():
            flat[f"latency_{k}"] = v
        rows.append(flat)
    return doc.get("run", {}), rows


def load(path):
    run, rows = read_json(path) if path.endswith(".json") else read_csv(path)
    out = []
    for r in rows:
        row = {k: r.get(k) for k in ("path", "level")}
        row.update({k: number(r.get(k)) for k in NUMBERS})
        out.append(row)
    return run, out


def label_of(path, run, r):
    slow = (run.get("config") or {}).get("slow_stage")
    extra = f", slow stage {slow}" if slow is not None else ""
    tag = os.path.splitext(os.path.basename(path))[0]
    return f"{tag}: {int(r['stages'])} st, {r['path']}, {r['level']}, {int(r['slots'])} slots{extra}"


def collect(files):
    """Series (label -> {chunk: row}), the copy engine's points, NCCL's per stage count, notes."""
    series, ce, nccl, notes = {}, {}, {}, set()
    for path in files:
        try:
            run, rows = load(path)
        except (OSError, ValueError, KeyError) as e:
            print(f"plot_pipeline.py: cannot read {path}: {e}", file=sys.stderr)
            sys.exit(1)
        if run.get("nccl"):
            notes.add(str(run["nccl"]))
        for r in rows:
            if r["chunk_bytes"] is None or r["min_link_gbps"] is None:
                continue
            key = (r["path"], label_of(path, run, r))
            series.setdefault(key, {})[r["chunk_bytes"]] = r
            if r["ce_gbps"]:
                ce.setdefault(r["chunk_bytes"], []).append(r["ce_gbps"])
            if r["nccl_gbps"]:
                nccl.setdefault(int(r["stages"]), {}).setdefault(r["chunk_bytes"], []).append(r["nccl_gbps"])
    return series, ce, nccl, notes


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def draw(ax_t, ax_l, series, ce, nccl):
    for (path, label), pts in sorted(series.items()):
        xs = sorted(pts)
        line, = ax_t.plot(xs, [pts[x]["min_link_gbps"] for x in xs], STYLE.get(path, "-"), marker="o", ms=3,
                          label=label)
        p50 = [(x, pts[x]["latency_p50_ns"]) for x in xs if pts[x]["latency_p50_ns"]]
        p99 = [(x, pts[x]["latency_p99_ns"]) for x in xs if pts[x]["latency_p99_ns"]]
        if p50:
            ax_l.plot([p[0] for p in p50], [p[1] / 1e3 for p in p50], STYLE.get(path, "-"), marker="o", ms=3,
                      color=line.get_color(), label=label)
        if p99:
            ax_l.plot([p[0] for p in p99], [p[1] / 1e3 for p in p99], STYLE.get(path, "-"), marker="o", ms=4,
                      mfc="none", color=line.get_color(), alpha=0.6)
    if ce:
        xs = sorted(ce)
        ax_t.plot(xs, [median(ce[x]) for x in xs], "--", color="grey", marker="s", ms=3, lw=1,
                  label="copy engine (same run)")
    for stages, pts in sorted(nccl.items()):
        xs = sorted(pts)
        ax_t.plot(xs, [median(pts[x]) for x in xs], "k--", marker="^", ms=4, lw=1,
                  label=f"NCCL send/recv, {stages} stages")
    ax_t.set(xscale="log", yscale="log", xlabel="chunk (bytes)", ylabel="slowest link (GB/s, 1e9 B/s)",
             title="throughput per link")
    ax_l.set(xscale="log", yscale="log", xlabel="chunk (bytes)", ylabel="one chunk through the chain (µs)",
             title="latency, p50 (filled) and p99 (hollow)")
    for a in (ax_t, ax_l):
        a.grid(True, which="both", alpha=0.3)


out, files = ARGS[0], ARGS[1:]
series, ce, nccl, notes = collect(files)
if not series:
    print("plot_pipeline.py: no rows with a chunk size and a link rate in " + " ".join(files), file=sys.stderr)
    sys.exit(1)
fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(15, 6))
draw(ax_t, ax_l, series, ce, nccl)
title = ", ".join(sorted({os.path.basename(f) for f in files}))
fig.suptitle(f"pipeline: {title}", fontsize=9)
# One legend for both panels (a series has one colour in both), beside them.
fig.legend(*ax_t.get_legend_handles_labels(), loc="center right", fontsize=7)
if notes and not nccl:
    note = textwrap.fill("; ".join(sorted(notes))[:400], 200)
    fig.text(0.01, 0.005, note, fontsize=6)
fig.tight_layout(rect=(0, 0.04, 0.84, 0.97))
fig.savefig(out, dpi=90)
print(f"wrote {out}")
