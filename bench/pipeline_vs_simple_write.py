"""The pipeline's per-link throughput beside simple_write's, from the JSON files
of one call (bench/run_pipeline.sh writes both): for every pipeline row on
the store and put paths, its slowest link's GB/s (1e9 B/s) over simple_write's
bandwidth at the same size and path, twice:
  - x sw: simple_write as it runs by default, every iteration rewriting the
    same bytes (at 1 and 4 MiB they stay in the L2 cache, and nothing reads
    them): the issue's baseline;
  - x ws: simple_write rotating through slots (`--slots N`) whose working
    set on the GPU (two sources and the destination, 3 x N slots) is the
    nearest of those measured to the link's (its ring of S slots, and on
    the put path the sender's S staging slots too); `ws` gives both, MiB.
A pipeline link has a reader: the next stage loads and checks every byte, on
the same GPU under MPS, while the writer writes. simple_write has none.
Columns without a simple_write run at that size and path are `-`.
Usage: pipeline_vs_simple_write.py SIMPLE_WRITE.json [...] PIPELINE.json [...]
(the files tell themselves apart by their rows)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402
from benchlib import size  # noqa: E402

ARGS = benchlib.args(__doc__, "pipeline_vs_simple_write.py SIMPLE_WRITE.json [...] PIPELINE.json [...]", 2)


def rows(path):
    try:
        with open(path) as f:
            return json.load(f)["rows"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"pipeline_vs_simple_write: cannot read rows from {path}: {e}")


def ring_bytes(r):
    """A link's working set on one GPU: its ring, and on the put path the
    sender's staging slots (a slot holds one chunk)."""
    return r["slots"] * r["chunk_bytes"] * (2 if r["path"] == "put" else 1)


sw, pipe = {}, []
for path in ARGS:
    for r in rows(path):
        if "min_link_gbps" in r:
            pipe.append(r)
        elif r.get("mode") == "bandwidth" and r.get("level") == "block":
            ws = r.get("working_set_bytes") or 3 * r["span_bytes"]
            sw.setdefault((r["size_bytes"], r["path"]), []).append((r["span_bytes"], ws, r["gb_per_s"]))
if not pipe or not sw:
    sys.exit("pipeline_vs_simple_write: need simple_write bandwidth rows and pipeline rows")


def nearest(runs, want):
    """The rotating run (more than one slot) whose working set is nearest `want`, by ratio."""
    rotating = [r for r in runs if r[0] > min(x[0] for x in runs)]
    return min(rotating, key=lambda r: max(r[1], want) / min(r[1], want), default=None)


def cell(link, base):
    return ("-", "-") if base is None else (f"{base:.1f}", f"{link / base:.2f}")


print(f"{'path':>5} {'chunk':>8} {'stages':>6} {'slots':>5} {'batch':>5} {'link GB/s':>10} "
      f"{'sw GB/s':>9} {'x sw':>6} {'ws MiB':>11} {'sw GB/s':>9} {'x ws':>6}")
for r in pipe:
    if r["path"] not in ("store", "put"):
        continue
    runs = sw.get((r["chunk_bytes"], r["path"]), [])
    plain = min(runs, default=None)
    near = nearest(runs, ring_bytes(r)) if runs else None
    link = r["min_link_gbps"]
    x = [("-", "-") if b is None else (f"{b[2]:.1f}", f"{link / b[2]:.2f}") for b in (plain, near)]
    ws = "-" if near is None else f"{ring_bytes(r) >> 20}/{near[1] >> 20}"
    print(f"{r['path']:>5} {size(r['chunk_bytes']):>8} {r['stages']:>6} {r['slots']:>5} {r.get('batch', '-'):>5} "
          f"{link:>10.1f} {x[0][0]:>9} {x[0][1]:>6} {ws:>11} {x[1][0]:>9} {x[1][1]:>6}")
print("# x sw: over simple_write rewriting one buffer (L2-resident at these sizes, no reader). ws: working set on the "
      "GPU, MiB, the link's (ring, and staging on the put path) / the rotating simple_write's (3 x its slots); "
      "x ws: over that simple_write")
