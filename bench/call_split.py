"""Where a small collectives call's time goes, from collectives --json files
(.json or .json.gz), one line per file (one run: its rank count and launch
mode). Over the run's sizes up to 64 KiB (where a call's fixed cost, not its
bytes, sets the time), each operation and type's fastest case per size (by
time per call), the medians, µs, of

  kernel   ours: block 0's first instruction to the end of the call's last
           block (the JSON's kernel_last_p50_us, or kernel_p50_us)
  gap      ours: batch - kernel, what a call costs back to back beyond its
           kernel (the next kernel's launch, start and end)
  events   per call - batch: what the pair of event records around each call
           adds, ours and NCCL's (its same calls, timed the same two ways)

then ours less NCCL's events, and where the run measured it (run.floor) the
launch floor: an empty kernel of ours, one block with a call's parameters,
launched and timed as the calls, per call and batched.

    python3 bench/call_split.py docs/results/*/coll-*.json.gz

Prints a Markdown table on stdout. A run without NCCL's baseline (--no-baseline,
ranks sharing a GPU, elastic runs) is left out with a line on stderr; exits 2
when a file is not a collectives run's JSON, or no file has the baseline.
Usage: call_split.py FILE..."""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402
from benchlib import num, table  # noqa: E402

FILES = benchlib.args(__doc__, "call_split.py FILE...", 1)
SMALL = 64 << 10
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results")


def split(doc):
    """The medians of one run's small cases: ours (kernel, gap, events),
    NCCL's events, and the case count; None without NCCL's batch."""
    best = {}
    for r in doc.get("rows", []):
        k = (r["op"], r["type"], r["size_bytes"])
        usable = r["size_bytes"] <= SMALL and r.get("batch_us") and r.get("nccl_batch_us") and r.get("nccl_p50_us")
        if usable and (k not in best or r["time_p50_us"] < best[k]["time_p50_us"]):
            best[k] = r
    rows = list(best.values())
    if not rows:
        return None
    med = lambda f: statistics.median(f(r) for r in rows)  # noqa: E731
    kernel = lambda r: max(r.get("kernel_last_p50_us", 0.0), r["kernel_p50_us"])  # noqa: E731
    return (med(kernel), med(lambda r: r["batch_us"] - kernel(r)), med(lambda r: r["time_p50_us"] - r["batch_us"]),
            med(lambda r: r["nccl_p50_us"] - r["nccl_batch_us"]), len(rows))


def line(path):
    try:
        doc = benchlib.load_json(path)
        run = doc["run"]
        cfg = run["config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"call_split.py: {path}: not a collectives run's JSON ({e})", file=sys.stderr)
        sys.exit(2)
    s = split(doc)
    if s is None:
        print(f"call_split.py: {path}: left out, no case up to 64 KiB with NCCL's batch beside ours", file=sys.stderr)
        return None
    kernel, gap, events, nccl_events, cases = s
    floor = run.get("floor") or {}
    where = os.path.relpath(os.path.abspath(path), RESULTS)
    where = os.path.basename(path) if where.startswith("..") else where
    return [where, cfg.get("ranks", "?"), cfg.get("launch", "?"), "on" if run.get("pdl") else "off", cases,
            num(kernel), num(gap), num(events), num(nccl_events), num(events - nccl_events),
            num(floor.get("time_p50_us")), num(floor.get("batch_us"))]


def main():
    head = ["run", "ranks", "launch", "PDL", "cases (op, type, size) ≤ 64 KiB", "ours: kernel", "gap", "events",
            "NCCL: events", "ours − NCCL's events", "floor per call", "floor batch"]
    rows = [r for r in (line(p) for p in FILES) if r]
    if not rows:
        print("call_split.py: no run with NCCL's baseline among the files", file=sys.stderr)
        sys.exit(2)
    print("\n".join(table(head, rows)))


main()
