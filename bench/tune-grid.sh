#!/usr/bin/env bash
# Searches the block-level grid of simple_write per size and data path on
# this machine's GPU pair: for each (path, blocks, threads, chunk) one
# `simple_write --mode pair` sweep, then one table of the best grid per size
# against the copy engine measured in the same runs. What bench/bench.sh's
# defaults (src/simple_write/plan.rs: auto_blocks) are chosen from.
#
#   bench/tune-grid.sh [--bundle FILE | --bin DIR --nixl-lib DIR] [--gi 0 --gt 1] [--mps]
#                        [--blocks "33 66 132 264"] [--threads "256 512 1024"]
#                        [--chunks "0"] [--sizes 64K:4M] [--paths put,store] [--out DIR]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/tune; GI=0; GT=1; MPS=0
BLOCKS="33 66 132 264"; THREADS="256 512 1024"; CHUNKS="0"; SIZES="64K:4M"; PATHS="put store"
while (($#)); do
  case "$1" in
    --bundle) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --bin) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --nixl-lib) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --gi) need_value "$1" $#; GI=$2; shift 2 ;;
    --gt) need_value "$1" $#; GT=$2; shift 2 ;;
    --mps) MPS=1; shift ;;
    --blocks) need_value "$1" $#; BLOCKS=$2; shift 2 ;;
    --threads) need_value "$1" $#; THREADS=$2; shift 2 ;;
    --chunks) need_value "$1" $#; CHUNKS=$2; shift 2 ;;
    --sizes) need_value "$1" $#; SIZES=$2; shift 2 ;;
    --paths) PATHS=${2//,/ }; shift 2 ;;
    --out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
NAME=tune-grid
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
if ((MPS)); then
  # shellcheck source=lib/mps.sh
  source "$ROOT/scripts/lib/mps.sh"; mps_start || exit 1
fi
lo=${SIZES%%:*}; hi=${SIZES##*:}
# The copy engine once per size, from a run with baselines.
"$BIN/simple_write" -m pair -g "$GI" --target-gpu "$GT" --levels block -b "$lo" -e "$hi" -f 2 \
  --json "$OUT/baseline.json" >"$OUT/baseline.out" 2>"$OUT/baseline.err" || echo "!! baseline run failed" >&2
n=0
for path in $PATHS; do for b in $BLOCKS; do for t in $THREADS; do for c in $CHUNKS; do
  tag="$path-b$b-t$t-c$c"; n=$((n + 1))
  "$BIN/simple_write" -m pair -g "$GI" --target-gpu "$GT" --levels block --path "$path" --blocks "$b" \
    --threads "$t" --chunk "$c" --no-baseline -b "$lo" -e "$hi" -f 2 \
    --json "$OUT/$tag.json" >"$OUT/$tag.out" 2>"$OUT/$tag.err" || echo "!! $tag failed: $(tail -1 "$OUT/$tag.err")" >&2
done; done; done; done
((MPS)) && mps_stop
echo "$n grids tried" >&2
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
ce = {}
try:
    for r in json.load(open(os.path.join(out, "baseline.json")))["rows"]:
        ce[r["size_bytes"]] = r["baselines"].get("copy_engine_gbps")
except Exception as e:
    print("no baseline:", e)
best = {}
for f in glob.glob(os.path.join(out, "*-b*-t*-c*.json")):
    for r in json.load(open(f))["rows"]:
        if not r["verified"]:
            continue
        k = (r["path"], r["size_bytes"])
        if k not in best or r["gb_per_s"] > best[k]["gb_per_s"]:
            best[k] = r
print(f"{'path':<6} {'size':>11} {'grid':>10} {'chunk':>8} {'GB/s':>9} {'CE GB/s':>9} {'ratio':>6}")
for (path, size), r in sorted(best.items()):
    c = ce.get(size)
    ratio = f"{r['gb_per_s'] / c:.3f}" if c else "-"
    print(f"{path:<6} {size:>11} {str(r['blocks'])+'x'+str(r['threads']):>10} {r['chunk']:>8} "
          f"{r['gb_per_s']:>9.1f} {c or 0:>9.1f} {ratio:>6}")
PY
