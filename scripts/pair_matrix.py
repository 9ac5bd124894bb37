"""The summary of scripts/pair-matrix.sh's folder: every row beside its
same-run baseline, as ratios (GB/s = 1e9 B/s, times p50 unless named).
  - simple_write: the LL, store and put half round trips of 8 bytes over the
    floor row (a bare flag between the same processes); the best path's
    bandwidth from 64 MiB over the copy engine's;
  - collectives: at each size the fastest of our algorithms and paths beside
    NCCL's same call (time, and bus bandwidth), stream launches and graphs;
  - ep: each path and phase beside NCCL's all-to-all, and the wire rate over
    simple_write's put bandwidth at the size nearest the phase's wire bytes;
    the host's time per step, stream launches and graph replays;
  - pipeline: each link beside NCCL's send/recv chain and simple_write at the
    same size and path; one LL chunk's one-way time over simple_write's LL
    half round trip.
Writes RESULTS_DIR/summary.md and prints it. Rows that did not run are listed
from RESULTS_DIR/skipped.txt. --one-gpu marks the summary as a check of the
script on one GPU (ranks sharing it under MPS), not the matrix.
Usage: pair_matrix.py RESULTS_DIR [--one-gpu]"""
import glob
import json
import os
import sys

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__)
    sys.exit(0)
ARGS = [a for a in sys.argv[1:] if a != "--one-gpu"]
if len(ARGS) != 1 or ARGS[0].startswith("-"):
    print("usage: pair_matrix.py RESULTS_DIR [--one-gpu] (try --help)", file=sys.stderr)
    sys.exit(2)
DIR, ONE_GPU = ARGS[0], "--one-gpu" in sys.argv[1:]


def load(tag):
    """The rows and run of DIR/tag.json, or None when the row did not run."""
    try:
        with open(os.path.join(DIR, tag + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_sw(run):
    """simple_write's run, named as scripts/bench.sh names it (gpu0-gpu1-pp, ...)."""
    found = sorted(glob.glob(os.path.join(DIR, f"gpu*-gpu*-{run}.json")))
    return load(os.path.basename(found[0])[:-5]) if found else None


def size(b):
    for unit, s in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << s and b % (1 << s) == 0:
            return f"{b >> s} {unit}iB"
    return f"{b} B"


def num(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def ratio(a, b):
    return a / b if a is not None and b else None


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def sw_latency(pp):
    """Half round trips of 8 B at every level and path, over the floor row."""
    floor = next((r["half_rtt"]["p50_ns"] for r in pp["rows"] if r["path"] == "flag" and r.get("half_rtt")), None)
    body = [(r["level"], r["path"], num(r["half_rtt"]["p50_ns"] / 1e3, "{:.3f}"), num(r.get("floor_ratio")))
            for r in pp["rows"] if r["size_bytes"] == 8 and r.get("half_rtt") and r["path"] != "flag"]
    head = [f"simple_write 8 B, half round trip (floor {num(floor and floor / 1e3, '{:.3f}')} µs)",
            "path", "µs", "÷ floor"]
    return table(head, body)


def sw_bandwidth(bw):
    """From 64 MiB: each path's GB/s and the best over the copy engine's."""
    by = {}
    for r in bw["rows"]:
        if r["size_bytes"] >= 64 << 20:
            by.setdefault(r["size_bytes"], {})[r["path"]] = r
    body = []
    for s, paths in sorted(by.items()):
        ce = next((p["baselines"].get("copy_engine_gbps") for p in paths.values()), None)
        best = max(p["gb_per_s"] for p in paths.values())
        body.append([size(s)] + [num(paths[k]["gb_per_s"], "{:.1f}") if k in paths else "-"
                                 for k in ("put", "store", "ll")] + [num(ce, "{:.1f}"), num(ratio(best, ce))])
    return table(["simple_write block level", "put GB/s", "store GB/s", "ll GB/s", "copy engine",
                  "best ÷ copy engine"], body)


def shown(s):
    """One size in two: 8 B, then the powers of four (16 B, 64 B, ... 1 GiB)."""
    return s == 8 or (s & (s - 1) == 0 and (s.bit_length() - 1) % 2 == 0)


def coll(doc, launch):
    """Per op and size: our fastest row beside NCCL's."""
    best = {}
    for r in doc["rows"]:
        k = (r["op"], r["size_bytes"])
        if k not in best or r["time_p50_us"] < best[k]["time_p50_us"]:
            best[k] = r
    body = []
    for (op, s), r in sorted(best.items()):
        if not shown(s):
            continue
        body.append([op, size(s), " ".join(x for x in (r["algo"], r["path"]) if x != "-"), num(r["time_p50_us"]), num(r["nccl_p50_us"]),
                     num(ratio(r["time_p50_us"], r["nccl_p50_us"])), num(r["busbw_gbps"], "{:.1f}"),
                     num(r["nccl_busbw_gbps"], "{:.1f}"), num(ratio(r["busbw_gbps"], r["nccl_busbw_gbps"]))])
    return table([f"collectives, {launch}", "size", "fastest of ours", "µs", "NCCL µs", "÷ NCCL time",
                  "busbw GB/s", "NCCL busbw", "÷ NCCL busbw"], body)


def sw_put_near(bw, nbytes):
    """simple_write's put GB/s at the size nearest `nbytes` (by ratio)."""
    puts = [r for r in (bw or {}).get("rows", []) if r["path"] == "put" and r["gb_per_s"] > 0]
    if not puts or not nbytes:
        return None, None
    r = min(puts, key=lambda r: max(r["size_bytes"], nbytes) / min(r["size_bytes"], nbytes))
    return r["gb_per_s"], r["size_bytes"]


def ep(doc, bw, mode):
    """Each method and phase: time, wire rate, over NCCL's and over simple_write's put."""
    body = []
    for r in doc["rows"]:
        put, at = sw_put_near(bw, r["bytes"]["wire"])
        body.append([r["method"], r["phase"], num(r["time"]["p50_ns"] / 1e3, "{:.1f}"),
                     num(r["wire_gbps"], "{:.1f}"), num(r.get("vs_nccl")),
                     f"{num(ratio(r['wire_gbps'], put))} (at {size(at)})" if put else "-"])
    lines = table([f"ep {mode}, 2 ranks", "phase", "p50 µs", "wire GB/s", "÷ NCCL", "÷ simple_write put"], body)
    for path, stream, graph in (doc.get("ranks") or [{}])[0].get("launch_cost", []):
        lines.append(f"\nrank 0, host time per step of dispatch + combine, {path}: stream {stream / 1e3:.1f} µs, "
                     f"graph {graph / 1e3:.1f} µs ({num(ratio(graph, stream))}×)")
    return lines


def pipe(doc, bw, grid):
    """Each link beside NCCL's chain and simple_write's same size and path."""
    sw = {(r["size_bytes"], r["path"]): r["gb_per_s"] for r in (bw or {}).get("rows", [])}
    body = [[r["path"], size(r["chunk_bytes"]), r["slots"], r["channels"], num(r["min_link_gbps"], "{:.1f}"),
             num(r.get("nccl_gbps"), "{:.1f}"), num(r.get("link_vs_nccl")),
             num(ratio(r["min_link_gbps"], sw.get((r["chunk_bytes"], r["path"]))))]
            for r in doc["rows"]]
    return table([f"pipeline, 2 stages, {grid}", "chunk", "slots", "channels", "GB/s per link", "NCCL GB/s",
                  "÷ NCCL", "÷ simple_write"], body)


def pipe_ll(doc, pp):
    """One 8-byte chunk's one-way time over simple_write's LL half round trip."""
    half = {r["level"]: r["half_rtt"]["p50_ns"] for r in (pp or {}).get("rows", [])
            if r["path"] == "ll" and r["size_bytes"] == 8 and r.get("half_rtt")}
    body = [[r["level"], num(r["latency"]["p50_ns"] / 1e3, "{:.3f}"), num(r["latency"]["p99_ns"] / 1e3, "{:.3f}"),
             num(ratio(r["latency"]["p50_ns"], half.get(r["level"])))] for r in doc["rows"]]
    return table(["pipeline LL 8 B, level", "one way p50 µs", "p99 µs", "÷ simple_write LL half round trip"], body)


def sections():
    bw, pp = load_sw("bw-block"), load_sw("pp")
    parts = [(pp, sw_latency), (bw, sw_bandwidth)]
    parts += [(load(f"coll-{k}"), lambda d, k=k: coll(d, f"{k} launches")) for k in ("stream", "graph")]
    parts += [(load(f"ep-{m}"), lambda d, m=m: ep(d, bw, m)) for m in ("ht", "ll")]
    grids = (("default", "default grid"), ("b128", "128 blocks"))
    parts += [(load(f"pipe-{k}"), lambda d, g=g: pipe(d, bw, g)) for k, g in grids]
    parts.append((load("pipe-ll8"), lambda d: pipe_ll(d, pp)))
    return [f(doc) for doc, f in parts if doc]


def main():
    title = "# The cross-GPU matrix" + (" on ONE GPU: a check of the script, not the matrix" if ONE_GPU else "")
    lines = [title, ""]
    for s in sections():
        lines += s + [""]
    try:
        skipped = open(os.path.join(DIR, "skipped.txt")).read().split("\n")
    except OSError:
        skipped = []
    skipped = [s for s in skipped if s]
    lines += ["## Rows that did not run", ""] + ([f"- {s}" for s in skipped] or ["none"])
    text = "\n".join(lines) + "\n"
    with open(os.path.join(DIR, "summary.md"), "w") as f:
        f.write(text)
    print(text, end="")


main()
