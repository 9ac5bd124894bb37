#!/usr/bin/env bash
# The standard benchmark matrix of simple_write on a GPU machine, as JSON,
# CSV, one table per run, and a PNG (bandwidth vs size per level and path,
# the same-run baselines as dashed lines; half round trip vs size).
#
#   bench/bench.sh [--bin DIR | --bundle FILE] [--nixl-lib DIR] [--out DIR] [--quick] [--mps]
#                    [--pairs "0 0,0 1"]
#
# Runs both processes on GPU 0, and GPU 0 -> GPU 1 when there are two
# (--pairs chooses), with `simple_write --mode pair`:
#   bandwidth, block level, put, store, ll and ll128 paths:  8 B .. 1 GiB, x2
#   bandwidth, thread+warp level, put path:           8 B .. 16 MiB, x4   (they teach; slow by nature)
#   ping-pong, every level, put, store, ll and ll128 paths:  8 B .. 1 MiB, x8, with the floor row (ll128: warp and block)
# then bench/crossover.py: the size up to which ll beats the best other path.
# --mps runs the same-GPU pairs under a private MPS daemon (stopped after),
# where the two processes' kernels run at once instead of time-slicing.
# Needs no cargo and no internet (use scripts/gpu-bundle.sh where cargo is);
# plotting needs python3 with matplotlib (skipped with a note otherwise).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/bench; QUICK=0; MPS=0; PAIRS_ARG=""
while (($#)); do
  case "$1" in
    --bundle|--bin|--nixl-lib|--out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --mps) MPS=1; shift ;;
    --pairs) need_value "$1" $#; PAIRS_ARG=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
NAME=bench
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [[ -n "$PAIRS_ARG" ]]; then IFS=, read -r -a PAIRS <<<"$PAIRS_ARG"
else PAIRS=("0 0"); ((NGPU >= 2 && !MPS)) && PAIRS+=("0 1"); fi
if ((MPS)); then
  # shellcheck source=lib/mps.sh
  source "$ROOT/scripts/lib/mps.sh"
  mps_start || exit 1
fi
if ((QUICK)); then
  RUNS=("bw-block|--levels block --path put,store,ll,ll128 -b 8 -e 64M -f 8"
        "pp|--pingpong --levels thread,warp,block --path put,store,ll,ll128 -b 8 -e 64K -f 8")
else
  RUNS=("bw-block|--levels block --path put,store,ll,ll128 -b 8 -e 1G -f 2"
        "bw-teach|--levels thread,warp -b 8 -e 16M -f 4"
        "pp|--pingpong --levels thread,warp,block --path put,store,ll,ll128 -b 8 -e 1M -f 8")
fi
fail=0
for pair in "${PAIRS[@]}"; do
  read -r gi gt <<<"$pair"
  for run in "${RUNS[@]}"; do
    name="${run%%|*}"; opts="${run#*|}"; tag="gpu${gi}-gpu${gt}$( ((MPS)) && echo -mps)-$name"
    echo "== $tag: simple_write $opts" >&2
    # shellcheck disable=SC2086
    "$BIN/simple_write" -m pair -g "$gi" --target-gpu "$gt" $opts --json "$OUT/$tag.json" --csv "$OUT/$tag.csv" \
      >"$OUT/$tag.out" 2>"$OUT/$tag.err"; rc=$?
    if ((rc)); then fail=1; echo "!! $tag: exit $rc" >&2; tail -4 "$OUT/$tag.err" >&2; fi
    echo "-- $tag (GPU $gi -> GPU $gt$( ((MPS)) && echo ', MPS'))"; sed -n '/^ *size /,$p' "$OUT/$tag.out"
  done
done
((MPS)) && mps_stop
python3 "$ROOT/bench/crossover.py" "$OUT" || { echo "!! bench/crossover.py failed" >&2; fail=1; }
if python3 -c 'import matplotlib' 2>/dev/null; then
  if python3 "$ROOT/bench/plot_bench.py" "$OUT" "$OUT/bench.png"; then echo "plot: $OUT/bench.png"
  else echo "!! bench/plot_bench.py failed: no plot" >&2; fail=1; fi
else
  echo "note: python3 has no matplotlib; no plot (the JSON files hold every figure)" >&2
fi
exit $fail
