"""An A/B of two sets of collectives runs (their --json files, .json or
.json.gz): for every case both sets ran (operation, algorithm, path, type,
place, size), the median over each set's runs of the batch time (nccl-tests'
time: back-to-back calls between two events, µs per call) and of the per-call
p50, A over B (below 1: A is faster); per operation and launch mode the
geometric mean and range of A ÷ B over the cases; then at each size the
fastest of ours under A and under B beside NCCL's batch from the same runs;
and where both sets' runs measured it, the launch floor (an empty kernel of
ours launched and timed as the calls) under A and B, medians over the runs.

Run the two sets alternately in one machine session (A, B, A, B) so that a
drift of the machine falls on both. Each set is a glob; quote it.

    python3 bench/ab_collectives.py 'DIR/ab-graph-pdl-*.json' 'DIR/ab-graph-nopdl-*.json'

Prints Markdown on stdout, headed by what the two sets' configurations
differ in (the option under test, and anything else that differs); exits 2
when a glob matches no file, when one set's runs differ among themselves in
rank count, launch mode or MPS (they would not be rounds of one case), or
when the two sets share no case.
Usage: ab_collectives.py A_GLOB B_GLOB"""
import glob
import math
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402
from benchlib import num, ratio, size, table  # noqa: E402

A_GLOB, B_GLOB = benchlib.args(__doc__, "ab_collectives.py A_GLOB B_GLOB", 2, 2)


def refuse(why):
    print(f"ab_collectives.py: {why}", file=sys.stderr)
    sys.exit(2)


def runs(pattern):
    """The runs a glob names: (their files, rows by case, the first run's
    configuration with its run-level `pdl` and `mps`, each run's launch
    floor where it has one)."""
    files = sorted(glob.glob(pattern))
    if not files:
        refuse(f"'{pattern}' matches no file")
    rows, config, floors = defaultdict(list), None, []
    for f in files:
        doc = benchlib.load_json(f)
        run = doc["run"]
        if run.get("floor"):
            floors.append(run["floor"])
        c = dict(run["config"], pdl=run.get("pdl"), mps=run.get("mps"))
        if config is None:
            config = c
        for key in ("ranks", "launch", "mps"):
            if c.get(key) != config.get(key):
                refuse(f"'{pattern}': {f} has {key} {c.get(key)}, {files[0]} {config.get(key)}: not rounds of one case")
        for r in doc["rows"]:
            rows[(r["op"], r["algo"], r["path"], r["type"], r["in_place"], r["size_bytes"])].append(r)
    return files, rows, config, floors


def median(rows, field):
    vals = [r[field] for r in rows if r.get(field) is not None]
    return statistics.median(vals) if vals else None


def cases(a, b, common):
    """The case-by-case table (batch and per-call, A over B); the batch
    ratios by operation; the fastest of ours per (op, type, size, side)."""
    body, per_op, best = [], defaultdict(list), {}
    for k in common:
        ab, bb = median(a[k], "batch_us"), median(b[k], "batch_us")
        ac, bc = median(a[k], "time_p50_us"), median(b[k], "time_p50_us")
        rb = ratio(ab, bb) if ab else None
        if rb is not None:
            per_op[k[0]].append(rb)
        place = "in" if k[4] else "out"
        body.append([k[0], k[1], k[2], k[3], place, size(k[5]), num(ab), num(bb), num(rb, "{:.3f}"),
                     num(ac), num(bc), num(ratio(ac, bc) if ac else None, "{:.3f}")])
        nccl = median(a[k] + b[k], "nccl_batch_us")
        for side, t in (("a", ab), ("b", bb)):
            key = (k[0], k[3], k[5], side)
            if t and (key not in best or t < best[key][0]):
                best[key] = (t, f"{k[1]} {k[2]}", nccl)
    head = ["op", "algo", "path", "type", "place", "size", "A batch µs", "B batch µs", "A/B", "A call µs",
            "B call µs", "A/B"]
    return table(head, body), per_op, best


def by_op(per_op):
    """Per operation, the geometric mean and range of the batch's A ÷ B."""
    body = []
    for op, rs in sorted(per_op.items()):
        gm = math.exp(sum(math.log(r) for r in rs) / len(rs))
        body.append([op, f"{gm:.3f}", f"{min(rs):.3f}-{max(rs):.3f}", len(rs)])
    return table(["op", "batch A/B, geometric mean", "range", "cases"], body)


def fastest(best):
    """At each size the fastest of ours under A and under B, beside NCCL."""
    body = []
    for (op, dtype, s, side) in sorted(best):
        if side != "a" or (op, dtype, s, "b") not in best:
            continue
        (ta, wa, nccl), (tb, wb, _) = best[(op, dtype, s, "a")], best[(op, dtype, s, "b")]
        body.append([op, dtype, size(s), wa, f"{ta:.2f}", wb, f"{tb:.2f}", num(nccl),
                     num(ratio(ta, nccl), "{:.3f}"), num(ratio(tb, nccl), "{:.3f}")])
    head = ["op", "type", "size", "fastest under A", "A batch µs", "fastest under B", "B batch µs",
            "NCCL batch µs", "A/NCCL", "B/NCCL"]
    return table(head, body)


def floor(fa, fb):
    """The launch floor under A and B (medians over each set's runs), or
    nothing where a set's runs did not all measure it."""
    if not fa or not fb:
        return []
    body = []
    for what, field in (("per call, p50", "time_p50_us"), ("batch", "batch_us")):
        ta, tb = median(fa, field), median(fb, field)
        body.append([what, num(ta), num(tb), num(ratio(ta, tb), "{:.3f}")])
    return [""] + table(["launch floor µs", "A", "B", "A/B"], body)


def main():
    fa, a, ca, floor_a = runs(A_GLOB)
    fb, b, cb, floor_b = runs(B_GLOB)
    common = sorted(set(a) & set(b), key=lambda k: (k[0], k[5], k[1], k[2], k[3], k[4]))
    if not common:
        refuse("the two sets share no case (operation, algorithm, path, type, place, size)")
    print(f"A: {len(fa)} run(s), {A_GLOB} ({ca['ranks']} ranks, {ca['launch']} launches)")
    print(f"B: {len(fb)} run(s), {B_GLOB} ({cb['ranks']} ranks, {cb['launch']} launches)")
    differ = [f"{k} {ca.get(k)} / {cb.get(k)}" for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
    print(f"A and B differ in: {'; '.join(differ) if differ else 'nothing in their configurations'}\n")
    lines, per_op, best = cases(a, b, common)
    full = len(floor_a) == len(fa) and len(floor_b) == len(fb)
    print("\n".join(lines + [""] + by_op(per_op) + [""] + fastest(best) + (floor(floor_a, floor_b) if full else [])))


main()
