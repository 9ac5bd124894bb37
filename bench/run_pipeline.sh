#!/usr/bin/env bash
# The pipeline matrix on a GPU machine: chains of 2, 3 and 4 stages on the
# store and put paths (1 MiB chunks), the LL form with small chunks, a
# slow stage over a million chunks, and the failure cases (a wrong word
# must exit 3; a frozen stage must be named by its neighbours; a grid that
# cannot be resident at once must exit 2); beside
# them simple_write's put and store bandwidth and its LL half round trip,
# measured in the same call on the same GPU, so the ratios are same-run
# (also at a ring's working set: $OUT/vs-simple-write.txt).
# The runs with baselines also time NCCL's ncclSend/ncclRecv through the same
# chain where NCCL runs (ranks on distinct GPUs; on one GPU the tables say
# why not). One table per run, JSON and CSV, logs in --out, and
# bench/plot_pipeline.py's plot of every CSV ($OUT/pipeline.png; skipped
# with a note when python3 has no matplotlib).
#
#   bench/run_pipeline.sh [--bin DIR | --bundle FILE] [--nixl-lib DIR] [--out DIR]
#                           [--stages "2 3 4"] [--slow-chunks N] [--no-mps] [--quick]
#
# With one GPU the stages share it under MPS (a private daemon,
# scripts/lib/mps.sh, stopped after). --quick: 2 stages, fewer chunks.
# Needs no cargo (scripts/gpu-bundle.sh packs the binaries).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/pipeline; STAGES="2 3 4"; MPS=1
SLOW_CHUNKS=1000000; QUICK=0
while (($#)); do
  case "$1" in
    --bundle|--bin|--nixl-lib|--out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --stages) need_value "$1" $#; STAGES=$2; shift 2 ;;
    --slow-chunks) need_value "$1" $#; SLOW_CHUNKS=$2; shift 2 ;;
    --no-mps) MPS=0; shift ;;
    --quick) QUICK=1; STAGES=2; SLOW_CHUNKS=20000; shift ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
NAME=run_pipeline
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
P="$BIN/pipeline"; SW="$BIN/simple_write"
[[ -x "$P" ]] || { echo "run_pipeline: no pipeline binary in $BIN" >&2; exit 1; }
# shellcheck source=lib/ports.sh
source "$ROOT/scripts/lib/ports.sh"
# shellcheck source=lib/mps.sh
source "$ROOT/scripts/lib/mps.sh"
fail=0

# One run: tag, wanted exit status, then the command; stdout to $OUT/$tag.out.
one() {
  local tag=$1 want=$2; shift 2
  echo "== $tag: $*" >&2
  local t0=$SECONDS
  timeout 300 "$@" >"$OUT/$tag.out" 2>"$OUT/$tag.err"
  local rc=$?
  if ((rc != want)); then fail=1; echo "!! $tag: exit $rc, expected $want" >&2; tail -8 "$OUT/$tag.err" >&2
  else echo "ok $tag: exit $rc in $((SECONDS - t0)) s" >&2; fi
}

# A pipeline run with its JSON and CSV.
pipe() {
  local tag=$1 want=$2; shift 2
  one "$tag" "$want" "$P" --port "$(pick_port)" --json "$OUT/$tag.json" --csv "$OUT/$tag.csv" "$@"
}

# A stage frozen mid-run (SIGSTOP): its neighbours must name it within
# --fault-timeout and the run must fail (exit 1), not hang.
frozen() {
  local tag=frozen
  echo "== $tag: 3 stages, stage 1 stopped after 3 s" >&2
  "$P" --ranks 3 --port "$(pick_port)" --path store --chunk 64K --chunks 2000000 --slow-stage 2 --delay-us 5 \
    --fault-timeout 3 --timeout 60 --no-baseline >"$OUT/$tag.out" 2>"$OUT/$tag.err" &
  local launcher=$! pid victim=""
  sleep 3
  for pid in $(pgrep -P "$launcher"); do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx RANK=1 && victim=$pid
  done
  [[ -n $victim ]] && kill -STOP "$victim"
  wait "$launcher"; local rc=$?
  [[ -n $victim ]] && kill -CONT "$victim" 2>/dev/null
  if ((rc == 1)) && grep -qE "(stage|rank) 1" "$OUT/$tag.err"; then echo "ok $tag: exit 1, stage 1 named" >&2
  else fail=1; echo "!! $tag: exit $rc (victim ${victim:-none})" >&2; tail -8 "$OUT/$tag.err" >&2; fi
}

mps=0; ((MPS)) && mps_start && mps=1
N=20000; ((QUICK)) && N=2000
# simple_write in the same call: put and store bandwidth at the chunk size,
# the LL half round trip of 8 bytes.
one sw-bw 0 "$SW" -m pair -b 1M -e 4M -f 4 --path put,store -l block --json "$OUT/sw-bw.json"
# ... and rotating through 3, 5, 11 and 21 slots: working sets (3 x the slots:
# two sources and the destination) near the rings' below, 8 to 128 MiB,
# where one buffer would stay in L2 (pipeline_vs_simple_write.py pairs them).
for s in 3 5 11 21; do
  one "sw-ring$s" 0 "$SW" -m pair -b 1M -e 4M -f 4 --slots "$s" --path put,store -l block --json "$OUT/sw-ring$s.json"
done
one sw-ll 0 "$SW" -m pair -s 8 --path ll --pingpong --json "$OUT/sw-ll.json"
for s in $STAGES; do
  pipe "p${s}-1M" 0 --ranks "$s" --chunk 1M --slots 2,8,16,32 --path store,put --chunks "$((N / 10))" --warmup 100
  pipe "p${s}-ll" 0 --ranks "$s" --path ll --chunk 8,4K,64K --slots 1,8 --level warp,block --chunks "$N" \
    --warmup 1000 --no-baseline
done
# One 8-byte chunk at a time (one slot): the round trip simple_write's LL
# ping-pong measures, at its grids (256 threads a block).
pipe p2-ll8 0 --ranks 2 --path ll --chunk 8 --slots 1 --level thread,warp,block --threads 256 --chunks "$N" \
  --warmup 1000 --no-baseline
# Larger chunks; and more channels (two blocks an SM's share: fewer bytes a
# step of each, more handshakes in flight).
pipe p2-4M 0 --ranks 2 --chunk 4M --slots 4,8 --path store,put --chunks 500 --warmup 50
pipe p2-b128 0 --ranks 2 --chunk 1M,4M --slots 8,16,32 --path store,put --blocks 128 --chunks 2000 --warmup 100 \
  --no-baseline
# The most chunks one handshake covers: 1 to 16.
pipe p2-batch 0 --ranks 2 --chunk 1M --slots 32 --batch 1,2,4,8,16 --path store,put --blocks 128 --chunks 2000 --warmup 100 \
  --no-baseline
pipe p2-levels 0 --ranks 2 --chunk 64K --slots 8 --path store,put --level thread,warp,block --chunks "$N" --warmup 1000 \
  --no-baseline
pipe p3-slow 0 --ranks 3 --chunk 64 --slots 8 --path store --level warp --slow-stage 2 --delay-us 2 \
  --chunks "$SLOW_CHUNKS" --warmup 1000 --no-baseline --timeout 280
# More blocks than the GPU keeps resident beside the other stage's must be
# refused up front (exit 2), not end in a timeout that blames a neighbour.
pipe p2-resident 2 --ranks 2 --chunk 1M --slots 4 --path store --blocks 1024 --threads 1024 --chunks 200 --no-baseline
pipe p3-corrupt 3 --ranks 3 --chunk 4K --slots 4 --path put --chunks 2000 --no-baseline --inject corrupt=1
((QUICK)) || frozen
((mps)) && mps_stop
# Every store and put row beside simple_write's, plain and at the ring's footprint.
python3 "$ROOT/bench/pipeline_vs_simple_write.py" "$OUT"/sw-*.json "$OUT"/p*.json >"$OUT/vs-simple-write.txt" || fail=1
# The plot: the two-stage sweeps over chunk sizes (LL 8 B - 64 KiB; store
# and put 1 and 4 MiB), one line each; every other run is in its table.
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$ROOT/bench/plot_pipeline.py" "$OUT/pipeline.png" "$OUT/p2-ll.csv" "$OUT/p2-b128.csv" >&2 || fail=1
else
  echo "note: python3 has no matplotlib; no plot (the CSV and JSON files hold every figure)" >&2
fi
exit $fail
