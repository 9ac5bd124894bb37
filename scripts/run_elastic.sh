#!/usr/bin/env bash
# The elastic EP matrix on a GPU machine: upstream NIXL EP's four plans
# (tests/fixtures/elastic/*.json) in both modes over both data paths, the
# fault plan with a frozen rank (SIGSTOP) too, a kill loop (a rank killed
# and a new process in its place, --cycles times) in both modes and on each
# path, the fresh runs each contraction compares with (ranks 0,3 and 0,1,2
# of a capacity of 4), and two ranks with --graph (stream launches beside
# CUDA-graph replays); every step verified, one per-phase table, JSON and
# CSV per run, logs and a plot (scripts/plot_elastic.py) in --out.
#
#   scripts/run_elastic.sh [--bin DIR | --bundle FILE] [--nixl-lib DIR] [--out DIR]
#                          [--modes "ll ht"] [--cycles 20] [--quick] [--no-mps]
#                          [--campaign N [--seed S]]
#
# --campaign N runs, instead of the matrix, N elastic runs of four ranks
# (`ep --ranks 4 --elastic`, the modes and both paths in turn) in each of
# which this script kills one rank by pid, at a moment it draws, with no
# plan naming it: the victim drawn among all ranks, rank 0 included,
# SIGKILL or SIGSTOP, a delay after the first progress line of the steps.
# campaign.tsv has one row per run: the draw, the exit status, how many
# survivors named the victim, and the detection and agreement times the
# run's JSON holds. --seed S makes the draws repeatable (default 1).
#
# With one GPU the ranks share it under MPS (a private daemon,
# scripts/lib/mps.sh, stopped after); with more, rank r runs on GPU
# r mod GPUs. Needs no cargo (scripts/gpu-bundle.sh packs the binaries).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/elastic; MODES="ll ht"; CYCLES=20; QUICK=0; MPS=1
CAMPAIGN=0; SEED=1
while (($#)); do
  case "$1" in
    --bundle) need_value "$1" $#; BUNDLE=$2; shift 2 ;;
    --bin) need_value "$1" $#; BIN=$2; shift 2 ;;
    --nixl-lib) need_value "$1" $#; NIXL_LIB=$2; shift 2 ;;
    --out) need_value "$1" $#; OUT=$2; shift 2 ;;
    --modes) need_value "$1" $#; MODES=$2; shift 2 ;;
    --cycles) need_value "$1" $#; CYCLES=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-mps) MPS=0; shift ;;
    --campaign) need_value "$1" $#; CAMPAIGN=$2; shift 2 ;;
    --seed) need_value "$1" $#; SEED=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
NAME=run_elastic
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
EP="$BIN/ep"
[[ -x "$EP" ]] || { echo "run_elastic: no ep binary in $BIN" >&2; exit 1; }
PLANS="$ROOT/tests/fixtures/elastic"
[[ -d "$PLANS" ]] || { echo "run_elastic: no plans in $PLANS" >&2; exit 1; }
# shellcheck source=lib/ports.sh
source "$ROOT/scripts/lib/ports.sh"
# shellcheck source=lib/mps.sh
source "$ROOT/scripts/lib/mps.sh"
fail=0
ITERS=(--iters 40 --warmup 5); ((QUICK)) && ITERS=(--iters 10 --warmup 2)
# HT steps move tens of MB per rank: fewer of them, and fewer tokens when
# eight ranks share one GPU.
ht_args() { echo --iters 10 --warmup 2 --tokens 1024; }

# One run: tag, then ep's arguments.
one() {
  local tag=$1; shift
  echo "== $tag: ep $*" >&2
  local t0=$SECONDS
  timeout 560 "$EP" "$@" --port "$(pick_port)" --json "$OUT/el-$tag.json" --csv "$OUT/el-$tag.csv" \
    >"$OUT/el-$tag.out" 2>"$OUT/el-$tag.err"
  local rc=$?
  if ((rc != 0)); then fail=1; echo "!! $tag: exit $rc" >&2; tail -12 "$OUT/el-$tag.err" >&2
  else echo "ok $tag in $((SECONDS - t0)) s" >&2; fi
}

# One campaign run: tag, mode, path, victim, signal, delay in ms, then
# ep's arguments. Kills the victim by pid once the steps are under way.
kill_run() {
  local tag=$1 mode=$2 path=$3 victim=$4 sig=$5 delay=$6; shift 6
  local err="$OUT/el-$tag.err" pid rc
  "$EP" --ranks 4 --elastic --mode "$mode" --path "$path" "$@" --port "$(pick_port)" \
    --json "$OUT/el-$tag.json" >"$OUT/el-$tag.out" 2>"$err" &
  local launcher=$!
  for _ in $(seq 600); do grep -q "steps verified" "$err" 2>/dev/null && break; sleep 0.1; done
  pid=$(sed -n "s/^\[ep\] started rank $victim (pid \([0-9]*\))\$/\1/p" "$err")
  sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
  [[ -n $pid ]] && kill -s "$sig" "$pid"
  timeout 560 tail --pid="$launcher" -f /dev/null; wait "$launcher"; rc=$?
  ((rc != 0)) && fail=1
  local named; named=$(grep -c "ranks gone: \[$victim\]" "$OUT/el-$tag.out")
  local times; times=$(python3 - "$OUT/el-$tag.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("-\t-"); sys.exit()
det = [x["after_kill_ms"] for r in d.get("ranks", []) for x in r.get("detected", []) if x.get("after_kill_ms") is not None]
agr = [a for r in d.get("ranks", []) for a in r.get("agree_ms", [])]
f = lambda v: "%.1f-%.1f" % (min(v), max(v)) if v else "-"
print(f"{f(det)}\t{f(agr)}")
PY
)
  printf '%s\t%s\t%s\t%s\tSIG%s\t%s\t%s\t%s\t%s\n' "$tag" "$mode" "$path" "$victim" "$sig" "$delay" "$rc" "$named" "$times" \
    | tee -a "$OUT/campaign.tsv" >&2
}

if ((CAMPAIGN > 0)); then
  mps=0; ((MPS && NGPU == 1)) && mps_start && mps=1
  RANDOM=$SEED
  printf 'run\tmode\tpath\tvictim\tsignal\tdelay_ms\texit\tnamed_by\tdetect_ms\tagree_ms\n' >"$OUT/campaign.tsv"
  read -ra modes <<<"$MODES"
  for k in $(seq "$CAMPAIGN"); do
    mode=${modes[$((RANDOM % ${#modes[@]}))]}; path=$([[ $((RANDOM % 2)) == 0 ]] && echo put || echo store)
    victim=$((RANDOM % 4)); ((k == 1)) && victim=0; ((k == 2)) && victim=3
    sig=$([[ $((RANDOM % 2)) == 0 ]] && echo KILL || echo STOP)
    if [[ $mode == ll ]]; then delay=$((RANDOM % 1500)); args=(--iters 3000 --warmup 20)
    else delay=$((RANDOM % 300)); args=(--iters 300 --warmup 5 --tokens 1024); fi
    kill_run "c$k" "$mode" "$path" "$victim" "$sig" "$delay" "${args[@]}"
  done
  ((mps)) && mps_stop
  exit $fail
fi

# The kill loop: ranks 0..3, rank 3 killed and started anew, CYCLES times.
python3 - "$CYCLES" >"$OUT/kill_loop.json" <<'PY'
import json, sys
n = int(sys.argv[1])
print(json.dumps([[0, 1, 2, 3]] + [[0, 1, 2, -3], [0, 1, 2, 3]] * n))
PY
echo '[[0,3]]' >"$OUT/fresh_0_3.json"
echo '[[0,1,2]]' >"$OUT/fresh_0_1_2.json"

mps=0; ((MPS && NGPU == 1)) && mps_start && mps=1
for mode in $MODES; do
  args=("${ITERS[@]}"); [[ $mode == ht ]] && read -ra args <<<"$(ht_args)"
  for plan in no_expansion single_expansion expansion_contraction expansion_fault_contraction; do
    one "$mode-$plan" --plan "$PLANS/$plan.json" --mode "$mode" "${args[@]}"
  done
  one "$mode-fault-stop" --plan "$PLANS/expansion_fault_contraction.json" --kill-signal STOP --mode "$mode" "${args[@]}"
  one "$mode-fresh-0-3" --plan "$OUT/fresh_0_3.json" --capacity 4 --mode "$mode" "${args[@]}"
  one "$mode-fresh-0-1-2" --plan "$OUT/fresh_0_1_2.json" --capacity 4 --mode "$mode" "${args[@]}"
  one "$mode-graph" --ranks 2 --mode "$mode" --graph "${args[@]}"
  for path in put store; do
    one "$mode-kill-loop-$path" --plan "$OUT/kill_loop.json" --mode "$mode" --path "$path" "${args[@]}"
  done
done
((mps)) && mps_stop
python3 "$ROOT/scripts/plot_elastic.py" "$OUT" "$OUT/elastic.png" && echo "plot: $OUT/elastic.png" >&2
exit $fail
