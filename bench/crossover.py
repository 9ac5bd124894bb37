"""Where the LL path stops paying: from bench/bench.sh's JSON, for each GPU
pair and level, the largest size up to which `--path ll` beats the best of the
other paths at every size (ping-pong: half round trip p50; bandwidth: time
per iteration), and the floor each ping-pong run measured.
Prints a table and writes RESULTS_DIR/crossover.json.
Usage: crossover.py RESULTS_DIR"""
import glob
import json
import os
import sys


def pair_of(path):
    parts = os.path.basename(path).split("-")
    return "-".join(parts[:3] if parts[2] == "mps" else parts[:2])


def metric(row):
    if row["mode"] == "pingpong":
        return (row.get("half_rtt") or {}).get("p50_ns")
    return row["us_per_iter"] * 1e3 if row["gb_per_s"] > 0 else None


def crossover(rows):
    """(largest size at which ll wins, smallest size from which it never wins
    again, ll / best other at each size). Single small sizes can flip either
    way by a poll period, so "up to" is the last win, not the first loss."""
    by_size = {}
    for r in rows:
        m = metric(r)
        if m:
            by_size.setdefault(r["size_bytes"], {})[r["path"]] = m
    up_to, loses_at, ratios = None, None, []
    for size in sorted(by_size):
        t = by_size[size]
        others = [v for p, v in t.items() if p in ("put", "store")]
        if "ll" not in t or not others:
            continue
        ratio = t["ll"] / min(others)
        ratios.append((size, round(ratio, 3)))
        if ratio < 1.0:
            up_to, loses_at = size, None
        elif loses_at is None:
            loses_at = size
    return up_to, loses_at, ratios


def main(src):
    out, lines = [], []
    for path in sorted(glob.glob(os.path.join(src, "gpu*-gpu*-*.json"))):
        doc = json.load(open(path))
        rows = [r for r in doc["rows"] if r.get("path") != "flag"]
        floor = next((r["half_rtt"]["p50_ns"] for r in doc["rows"] if r.get("path") == "flag" and r.get("half_rtt")), None)
        for mode in ("pingpong", "bandwidth"):
            for level in ("thread", "warp", "block"):
                sel = [r for r in rows if r["mode"] == mode and r["level"] == level]
                up_to, loses_at, ratios = crossover(sel)
                if not ratios:
                    continue
                out.append({"pair": pair_of(path), "run": os.path.basename(path), "mode": mode, "level": level,
                            "ll_wins_up_to_bytes": up_to, "ll_loses_from_bytes": loses_at,
                            "ll_over_best_other": ratios, "floor_half_rtt_p50_ns": floor if mode == "pingpong" else None})
                lines.append(f"{pair_of(path):<16} {mode:<9} {level:<6} ll wins up to {up_to if up_to else '-':>9} B"
                             f"  (loses from {loses_at if loses_at else '-'} B)   ll/best: "
                             + " ".join(f"{s}:{x}" for s, x in ratios))
    json.dump(out, open(os.path.join(src, "crossover.json"), "w"), indent=1)
    print("crossover (ll against the best of put and store, same run):")
    print("\n".join(lines) if lines else "  no run had ll beside put or store")


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
    import benchlib

    (folder,) = benchlib.args(__doc__, "crossover.py RESULTS_DIR", 1, 1)
    if not os.path.isdir(folder):
        print(f"crossover.py: {folder} is not a folder of bench.sh results", file=sys.stderr)
        sys.exit(1)
    main(folder)
