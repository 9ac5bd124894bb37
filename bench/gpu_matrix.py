"""The summary of bench/gpu-matrix.sh's folder: every row beside its same-run
baseline, as ratios (GB/s = 1e9 B/s; times are p50 unless named), the
machine (env.txt: GPUs, driver, topology, NVLink, NCCL), every row that
did not run, overran its deadline or failed, with why (rows.jsonl), and
every row that ran whose JSON the folder no longer holds (its tables are
then missing: a results folder trimmed to its cap).

  - simple_write: 8-byte half round trips over the floor row (a bare flag
    between the same processes); bandwidth of each path over the copy
    engine's between the same GPUs; the put over the store at the same
    size; every ordered pair's store rate;
  - NVSHMEM: its put+signal beside simple_write's best path on the same pair;
  - collectives: at each size the fastest of our algorithms and paths beside
    NCCL's same call, per rank count and launch (stream, graph);
  - ep: each path and phase beside NCCL's all-to-all;
  - pipeline: each link beside NCCL's send/recv chain;
  - faults: gpu-faults.sh's table;
  - pdl, sync: each A/B of an option of ours (pdl-ab-*.md: programmatic
    dependent launch; sync-ab-*.md: the remote memory-synchronization
    domain; written by bench/ab_collectives.py): per operation the batch
    time with the option over without, and the fastest of ours per size
    both ways beside NCCL.

A ratio whose baseline is above the link's rate (the sum of the NVLink
links' per-direction rates that env.txt lists) is not printed: such a
baseline did not measure the link, and the row says so.
Writes RESULTS_DIR/summary.md and prints it.
Usage: gpu_matrix.py RESULTS_DIR"""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchlib  # noqa: E402
from benchlib import num, ratio, size, table  # noqa: E402

ARGS = benchlib.args(__doc__, "gpu_matrix.py RESULTS_DIR", 1, 1)
DIR = ARGS[0]
if not os.path.isdir(DIR):
    print(f"gpu_matrix.py: {DIR} is not a folder (bench/gpu-matrix.sh --out writes one)", file=sys.stderr)
    sys.exit(2)


def load(tag):
    """DIR/tag.json (or .json.gz, as docs/results keeps them), or None when
    the row did not run."""
    for name in (tag + ".json", tag + ".json.gz"):
        try:
            return benchlib.load_json(os.path.join(DIR, name))
        except (OSError, ValueError):
            pass
    return None


def tags(pattern):
    found = glob.glob(os.path.join(DIR, pattern + ".json")) + glob.glob(os.path.join(DIR, pattern + ".json.gz"))
    return sorted({os.path.basename(p).split(".json")[0] for p in found})


def env():
    """env.txt's sections, and the link's rate per direction (GB/s)."""
    try:
        text = open(os.path.join(DIR, "env.txt")).read()
    except OSError:
        return "", None
    rates = [sum(float(x) for x in re.findall(r"([0-9.]+) GB/s", line))
             for line in text.splitlines() if re.match(r"GPU \d+: ", line) and "GB/s" in line]
    return text, (min(rates) if rates else None)


TEXT, LINK = env()


def against(x, base):
    """x ÷ base, or why it is not printed (the baseline above the link)."""
    if base is not None and LINK and base > LINK * 1.02:
        return f"none: baseline {base:.0f} GB/s > link {LINK:.0f}"
    return num(ratio(x, base))


def nccl_used():
    """The NCCL the programs loaded, as their ranks print it."""
    found = set()
    for f in glob.glob(os.path.join(DIR, "*.err")) + glob.glob(os.path.join(DIR, "*.json*")):
        try:
            with benchlib.open_text(f, errors="replace") as fh:
                found |= set(re.findall(r"NCCL (\d+\.\d+\.\d+)", fh.read()))
        except OSError:
            pass
    return ", ".join(sorted(found)) or "?"


def header():
    listed = TEXT.split("## driver")[0]
    names = re.findall(r"^GPU \d+: (.*?) \(UUID", listed, re.M)
    driver = re.search(r"## driver\n(.*)\n", TEXT)
    nccl = re.search(r"## NCCL.*\n(.*)\n", TEXT)
    topo = re.search(r"## nvidia-smi topo -m\n(.*?)\n## ", TEXT, re.S)
    lines = [f"# The GPU matrix: {len(names)} × {names[0] if names else '?'}", ""]
    lines.append(f"Driver {driver.group(1) if driver else '?'}, NCCL {nccl_used()} as the programs loaded it "
                 f"(python3's torch has {nccl.group(1) if nccl else '?'}; NVLink multicast off), one rank per GPU. "
                 f"Link rate per direction (sum of one GPU's "
                 f"NVLink links, nvidia-smi): {num(LINK, '{:.0f}')} GB/s.")
    if topo:
        lines += ["", "```", topo.group(1).rstrip(), "```"]
    return lines


def sw_latency(tag, pp):
    floor = next((r["half_rtt"]["p50_ns"] for r in pp["rows"] if r["path"] == "flag" and r.get("half_rtt")), None)
    body = [(r["level"], r["path"], num(r["half_rtt"]["p50_ns"] / 1e3, "{:.3f}"), num(r.get("floor_ratio")))
            for r in pp["rows"] if r["size_bytes"] == 8 and r.get("half_rtt") and r["path"] != "flag"]
    return table([f"{tag}: 8 B half round trip (floor {num(floor and floor / 1e3, '{:.3f}')} µs)", "path", "µs",
                  "÷ floor"], body)


def sw_rows(bw):
    by = {}
    for r in bw["rows"]:
        by.setdefault(r["size_bytes"], {})[r["path"]] = r
    return by


def sw_bandwidth(tag, bw):
    """Each path's GB/s, the copy engine's, best ÷ copy engine, put ÷ store."""
    body = []
    # ll128 only where it ran (it has rows of its own, ll128-XtoY-bw).
    kinds = ("put", "store", "ll") + (("ll128",) if any(r["path"] == "ll128" for r in bw["rows"]) else ())
    for s, paths in sorted(sw_rows(bw).items()):
        if s < 1 << 20 and s not in (16, 4096, 65536):
            continue
        ce = next((p["baselines"].get("copy_engine_gbps") for p in paths.values()), None)
        best = max(p["gb_per_s"] for p in paths.values())
        put, store = (paths.get(k, {}).get("gb_per_s") for k in ("put", "store"))
        l2 = next((p.get("l2_resident") for p in paths.values()), None)
        body.append([size(s)] + [num(paths[k]["gb_per_s"], "{:.1f}") if k in paths else "-"
                                 for k in kinds]
                    + [num(ce, "{:.1f}"), against(best, ce), num(ratio(put, store)), "L2" if l2 else "HBM"])
    note = (bw.get("run") or {}).get("baselines", "")
    return table([f"{tag}, block level"] + [f"{k} GB/s" for k in kinds] + ["copy engine", "best ÷ CE",
                  "put ÷ store", "from"], body) + ([f"\n{note}"] if note else [])


def sw_pairs(bws):
    """Every ordered pair: the store path at 1 MiB, 32 MiB, 1 GiB over the copy engine."""
    body = []
    for tag, bw in bws:
        by = sw_rows(bw)
        cells = []
        for s in (1 << 20, 32 << 20, 1 << 30):
            p = by.get(s, {})
            ce = next((x["baselines"].get("copy_engine_gbps") for x in p.values()), None)
            st = p.get("store", {}).get("gb_per_s")
            cells += [num(st, "{:.0f}"), num(ce, "{:.0f}"), against(st, ce)]
        body.append([tag.split("-")[1].replace("to", " → ")] + cells)
    return table(["GPUs", "store 1 MiB", "CE", "÷", "store 32 MiB", "CE", "÷", "store 1 GiB", "CE", "÷"], body)


def nvshmem(tag, doc, pp, bw):
    """NVSHMEM's put+signal beside simple_write's best path on the same pair."""
    ours_half = {}
    for r in (pp or {}).get("rows", []):
        if r.get("half_rtt") and r["path"] != "flag":
            k = r["size_bytes"]
            ours_half[k] = min(ours_half.get(k, 1e30), r["half_rtt"]["p50_ns"] / 1e3)
    ours_bw = {s: max(p["gb_per_s"] for p in paths.values()) for s, paths in sw_rows(bw or {"rows": []}).items()}
    body = [["half round trip", r["level"], size(r["bytes"]), num(r["half_rtt_us_p50"], "{:.3f}"),
             num(ours_half.get(r["bytes"]), "{:.3f}"), num(ratio(r["half_rtt_us_p50"], ours_half.get(r["bytes"])))]
            for r in doc.get("pingpong", [])]
    body += [["bandwidth GB/s", r["level"], size(r["bytes"]), num(r["gbps"], "{:.1f}"), num(ours_bw.get(r["bytes"]), "{:.1f}"),
              num(ratio(ours_bw.get(r["bytes"]), r["gbps"]))] for r in doc.get("bandwidth", [])]
    return table([f"NVSHMEM {doc.get('nvshmem_version', '?')}, {tag}", "level", "size", "NVSHMEM",
                  "simple_write best", "ours ahead by ×"], body)


def shown(s):
    return s == 8 or (s & (s - 1) == 0 and (s.bit_length() - 1) % 2 == 0)


def coll(tag, doc):
    """Per op and size: our fastest row beside NCCL's same call, timed per
    call (events around each) and as nccl-tests times it (a batch)."""
    best, batch = {}, {}
    for r in doc["rows"]:
        k = (r["op"], r["size_bytes"])
        if k not in best or r["time_p50_us"] < best[k]["time_p50_us"]:
            best[k] = r
        if r.get("batch_us") and (k not in batch or r["batch_us"] < batch[k]["batch_us"]):
            batch[k] = r
    body = []
    for (op, s), r in sorted(best.items()):
        if shown(s):
            b = batch.get((op, s), {})
            body.append([op, size(s), " ".join(x for x in (r["algo"], r["path"]) if x != "-"), num(r["time_p50_us"]),
                         num(r["nccl_p50_us"]), num(ratio(r["time_p50_us"], r["nccl_p50_us"])),
                         num(b.get("batch_us")), num(b.get("nccl_batch_us")),
                         num(ratio(b.get("batch_us"), b.get("nccl_batch_us"))),
                         num(r["busbw_gbps"], "{:.1f}"), num(r["nccl_busbw_gbps"], "{:.1f}"),
                         num(ratio(r["busbw_gbps"], r["nccl_busbw_gbps"]))])
    out = table([tag, "size", "fastest of ours", "µs per call", "NCCL", "÷ NCCL", "µs batch", "NCCL batch",
                 "÷ NCCL", "busbw GB/s", "NCCL busbw", "÷ NCCL busbw"], body)
    f = (doc.get("run") or {}).get("floor")
    if f:
        out += ["", f"Launch floor (an empty kernel of one block with a call's parameters, launched and timed as "
                    f"the calls): {num(f['time_p50_us'])} µs per call, {num(f['batch_us'])} µs batched."]
    return out


def ep(tag, doc):
    body = [[r["method"], r["phase"], num(r["time"]["p50_ns"] / 1e3, "{:.1f}"), num(r["wire_gbps"], "{:.1f}"),
             num(r.get("vs_nccl"))] for r in doc["rows"]]
    return table([tag, "phase", "p50 µs", "wire GB/s", "NCCL ÷ ours (above 1: ours faster)"], body)


def pipe(tag, doc):
    body = [[r["path"], size(r["chunk_bytes"]), r["slots"], r["channels"], num(r["min_link_gbps"], "{:.1f}"),
             num(r.get("min_link_wire_gbps"), "{:.1f}"),
             num(r.get("ce_gbps"), "{:.1f}"), against(r["min_link_gbps"], r.get("ce_gbps")),
             num(r.get("nccl_gbps"), "{:.1f}"), num(r.get("link_vs_nccl"))] for r in doc["rows"]]
    return table([tag, "chunk", "slots", "channels", "GB/s per link", "wire GB/s", "CE GB/s", "÷ CE", "NCCL GB/s",
                  "÷ NCCL"], body)


def pipe_ll(tag, doc):
    """One 8-byte LL chunk's one-way time, where the two stages share a GPU
    (the pipeline leaves it null across GPUs: two clocks)."""
    lat = lambda r, k: None if r.get("latency") is None else r["latency"][k] / 1e3
    body = [[r["level"], num(lat(r, "p50_ns"), "{:.3f}"), num(lat(r, "p99_ns"), "{:.3f}")] for r in doc["rows"]]
    out = table([f"{tag}: LL 8 B, level", "one way p50 µs", "p99 µs"], body)
    if any(r.get("latency") is None for r in doc["rows"]):
        out.append("")
        out.append("The stages ran on different GPUs, whose clocks differ: no one-way time (simple_write's "
                   "ping-pong rows hold the pair's round trip).")
    return out


def with_ll128(tag):
    """The rows of `tag` (sw-XtoY-bw or -pp), with the ll128 rows of the
    ll128-XtoY row of the same pair and mode, which runs on its own."""
    doc = load(tag)
    extra = load("ll128-" + tag[3:])
    if doc and extra:
        doc = dict(doc, rows=doc["rows"] + [r for r in extra["rows"] if r["path"] == "ll128"])
    return doc or extra


def sections():
    out = []
    pps = [(t, with_ll128(t)) for t in tags("sw-*-pp")]
    bws = [(t, with_ll128(t)) for t in tags("sw-*-bw")]
    out += [sw_latency(t, d) for t, d in pps if d]
    full = [(t, d) for t, d in bws if d and any(r["size_bytes"] < 1 << 20 for r in d["rows"])]
    out += [sw_bandwidth(t, d) for t, d in full]
    if bws:
        out.append(sw_pairs([(t, d) for t, d in bws if d]))
    for t in tags("nvshmem-*"):
        pair = t.split("-", 1)[1]
        out.append(nvshmem(t, load(t), load(f"sw-{pair}-pp"), load(f"sw-{pair}-bw")))
    for t in sorted(tags("coll-*"), key=lambda t: (t.split("-")[2], t)):
        kind = t.split("-")[2]  # stream, graph, or ll128 (its own row, stream launches)
        what = "LL128, stream launches" if kind == "ll128" else f"{kind} launches"
        out.append(coll(f"collectives, {t.split('-')[1][:-1]} ranks, {what}", load(t)))
    out += [ep(f"ep, EP{t[2:].split('-')[0]} {t.split('-')[1]}", load(t)) for t in tags("ep*-*")]
    out += [pipe(f"pipeline, {t[4:].split('-')[0]} stages, {t.split('-')[1]}", load(t))
            for t in tags("pipe*-*") if not t.endswith("ll8")]
    out += [pipe_ll(t, load(t)) for t in tags("pipe*-ll8")]
    try:
        out.append(["faults (bench/gpu-faults.sh)", "", "```"] + open(os.path.join(DIR, "faults", "table.txt"))
                   .read().rstrip().splitlines() + ["```"])
    except OSError:
        pass
    for tag, what, option in (("pdl", "PDL", "--pdl"), ("sync", "Sync-domain", "--sync-domain remote")):
        for t in sorted(glob.glob(os.path.join(DIR, f"{tag}-ab-*.md"))):
            n, launch = os.path.basename(t)[len(f"{tag}-ab-"):-len(".md")].split("-")
            text = open(t).read()
            # The per-case table stays in the file; the summary takes the rest.
            kept = text[text.find("| op | batch A/B"):].rstrip().splitlines()
            out.append([f"{what} A/B, {n[:-1]} ranks, {launch} launches (A: {option}, B: without; "
                        f"{os.path.basename(t)})", ""] + kept)
    return out


def kept(tag):
    """Whether the folder still holds what row `tag` wrote: its JSON
    (tag.json, or .json.gz) or its own folder (tag/, as the faults row)."""
    return bool(tags(tag)) or os.path.isdir(os.path.join(DIR, tag))


def not_run():
    """Rows that did not run, overran or failed, the last call's entry of
    each; rows that ran but whose JSON this folder no longer holds (a
    results folder trimmed to its cap: their tables are missing above);
    the rows that ran, with their seconds."""
    rows = {}
    try:
        for line in open(os.path.join(DIR, "rows.jsonl")):
            r = json.loads(line)
            rows[r["tag"]] = r
    except (OSError, ValueError):
        pass
    bad, gone, ran = [], [], []
    for r in rows.values():
        if r["why"]:
            bad.append(f"- {r['tag']}: {r['why']}")
            bad += [f"    {x}" for x in r.get("last_lines", [])]
            continue
        ran.append(f"{r['tag']} {r['seconds']} s")
        if not kept(r["tag"]):
            gone.append(r["tag"])
    return bad, gone, ran


def main():
    lines = header() + [""]
    for s in sections():
        lines += s + [""]
    bad, gone, ran = not_run()
    lines += ["## Rows that did not run, overran or failed", ""] + (bad or ["none"])
    if gone:
        lines += ["", "Rows that ran but whose JSON is not in this folder (removed since), so their tables "
                  "are not above: " + ", ".join(gone)]
    if ran:
        lines += ["", "Rows that ran (seconds): " + ", ".join(ran)]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(DIR, "summary.md"), "w") as f:
        f.write(text)
    print(text, end="")


main()
