#!/usr/bin/env bash
# The standard benchmark matrix of simple_write on a GPU machine, as JSON,
# CSV, one table per run, and a PNG (bandwidth vs size per level, the
# same-run baselines as dashed lines; half round trip vs size).
#
#   scripts/bench.sh [--bin DIR | --bundle FILE] [--nixl-lib DIR] [--out DIR] [--quick]
#
# Runs both processes on GPU 0, and GPU 0 -> GPU 1 when there are two:
#   bandwidth, block level:        8 B .. 256 MiB, x2
#   bandwidth, thread+warp level:  8 B .. 16 MiB, x4   (they teach; slow by nature)
#   ping-pong, every level:        8 B .. 1 MiB, x8
# Needs no cargo and no internet (use scripts/gpu-bundle.sh where cargo is);
# plotting needs python3 with matplotlib (skipped with a note otherwise).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/bench; QUICK=0
while (($#)); do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --nixl-lib) NIXL_LIB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
done
NAME=bench
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
PAIRS=("0 0"); ((NGPU >= 2)) && PAIRS+=("0 1")
if ((QUICK)); then
  RUNS=("bw-block|--levels block -b 8 -e 64M -f 8" "pp|--pingpong --levels thread,warp,block -b 8 -e 64K -f 8")
else
  RUNS=("bw-block|--levels block -b 8 -e 256M -f 2" "bw-teach|--levels thread,warp -b 8 -e 16M -f 4" "pp|--pingpong --levels thread,warp,block -b 8 -e 1M -f 8")
fi
fail=0; port=$((20000 + RANDOM % 20000))
for pair in "${PAIRS[@]}"; do
  read -r gi gt <<<"$pair"
  for run in "${RUNS[@]}"; do
    name="${run%%|*}"; opts="${run#*|}"; tag="gpu${gi}-gpu${gt}-$name"; port=$((port + 1))
    echo "== $tag: simple_write $opts" >&2
    # shellcheck disable=SC2086
    "$BIN/simple_write" -m initiator -g "$gi" -p "$port" $opts --json "$OUT/$tag.json" --csv "$OUT/$tag.csv" \
      >"$OUT/$tag.out" 2>"$OUT/$tag.err" &
    ipid=$!
    "$BIN/simple_write" -m target -g "$gt" -p "$port" >"$OUT/$tag.target.out" 2>"$OUT/$tag.target.err"; trc=$?
    wait $ipid; irc=$?
    if ((irc || trc)); then fail=1; echo "!! $tag: initiator $irc, target $trc" >&2; tail -3 "$OUT/$tag.err" "$OUT/$tag.target.err" >&2; fi
    echo "-- $tag (GPU $gi -> GPU $gt)"; sed -n '/^ *size /,$p' "$OUT/$tag.out"
  done
done
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$ROOT/scripts/plot_bench.py" "$OUT" "$OUT/bench.png" && echo "plot: $OUT/bench.png"
else
  echo "note: python3 has no matplotlib; no plot (the JSON files hold every figure)" >&2
fi
exit $fail
