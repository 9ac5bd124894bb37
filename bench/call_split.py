"""Where a small collectives call's time goes, from collectives --json files
(.json or .json.gz), one line per file (one run: its rank count, launch mode,
PDL and memory-synchronization domain). Over the run's sizes up to 64 KiB
(where a call's fixed cost, not its bytes, sets the time), each operation and
type's fastest case per size (by time per call), the medians, µs, of

  kernel   ours: block 0's first instruction to the end of the call's last
           block (the JSON's kernel_last_p50_us, or kernel_p50_us)
  gap      ours: batch - kernel, what a call costs back to back beyond its
           kernel (the next kernel's launch, start and end)
  events   per call - batch: what the pair of event records around each call
           adds, ours and NCCL's (its same calls, timed the same two ways)

then, where the run measured it (run.floor), the launch floor: an empty kernel
of ours, one block with a call's parameters, launched and timed as the calls,
per call, batched, and its own events (per call - batch), and ours less the
floor's events: what our calls add to the event records beyond any kernel
launched the same way (a same-run comparison every run has, NCCL or not).
Last, where the run has NCCL's baseline, NCCL's events and ours less them.

    python3 bench/call_split.py docs/results/*/coll-*.json.gz

Prints a Markdown table on stdout ("-" where a run lacks the floor or NCCL's
baseline). Exits 2 when a file is not a collectives run's JSON, or no file has
a case up to 64 KiB with its batch time.
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
    """The medians of one run's small cases, ours (kernel, gap, events) and
    NCCL's events (None without its batch), and the case count; None without
    any case timed batched."""
    best = {}
    for r in doc.get("rows", []):
        k = (r["op"], r["type"], r["size_bytes"])
        usable = r["size_bytes"] <= SMALL and r.get("batch_us")
        if usable and (k not in best or r["time_p50_us"] < best[k]["time_p50_us"]):
            best[k] = r
    rows = list(best.values())
    if not rows:
        return None
    med = lambda f, rows=rows: statistics.median(f(r) for r in rows)  # noqa: E731
    kernel = lambda r: max(r.get("kernel_last_p50_us", 0.0), r["kernel_p50_us"])  # noqa: E731
    nccl = [r for r in rows if r.get("nccl_batch_us") and r.get("nccl_p50_us")]
    nccl_events = med(lambda r: r["nccl_p50_us"] - r["nccl_batch_us"], nccl) if nccl else None
    return (med(kernel), med(lambda r: r["batch_us"] - kernel(r)), med(lambda r: r["time_p50_us"] - r["batch_us"]),
            nccl_events, len(rows))


def less(a, b):
    """a - b rounded to 0.01 (no "-0.00"), or None when either is missing."""
    return None if a is None or b is None else round(a - b, 2) + 0.0


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
        print(f"call_split.py: {path}: left out, no case up to 64 KiB timed batched", file=sys.stderr)
        return None
    kernel, gap, events, nccl_events, cases = s
    floor = run.get("floor") or {}
    per_call, batch = floor.get("time_p50_us"), floor.get("batch_us")
    floor_events = less(per_call, batch)
    where = os.path.relpath(os.path.abspath(path), RESULTS)
    where = os.path.basename(path) if where.startswith("..") else where
    return [where, cfg.get("ranks", "?"), cfg.get("launch", "?"), "on" if run.get("pdl") else "off",
            cfg.get("sync_domain", "default"), cases, num(kernel), num(gap), num(events), num(per_call), num(batch),
            num(floor_events), num(less(events, floor_events)), num(nccl_events), num(less(events, nccl_events))]


def main():
    head = ["run", "ranks", "launch", "PDL", "domain", "cases (op, type, size) ≤ 64 KiB", "ours: kernel", "gap",
            "events", "floor: per call", "batch", "events", "ours − floor's events", "NCCL: events",
            "ours − NCCL's events"]
    rows = [r for r in (line(p) for p in FILES) if r]
    if not rows:
        print("call_split.py: no run with a case up to 64 KiB timed batched among the files", file=sys.stderr)
        sys.exit(2)
    print("\n".join(table(head, rows)))

main()
