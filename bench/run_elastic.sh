#!/usr/bin/env bash
# The elastic EP matrix on a GPU machine: upstream NIXL EP's four plans
# (tests/fixtures/elastic/*.json) in both modes over both data paths, the
# fault plan with a frozen rank (SIGSTOP) too, a kill loop (a rank killed
# and a new process in its place, --cycles times) in both modes and on each
# path, the fresh runs each contraction compares with (ranks 0,3 and 0,1,2
# of a capacity of 4), and two ranks with --graph (stream launches beside
# CUDA-graph replays); every step verified, one per-phase table, JSON and
# CSV per run, logs and a plot (bench/plot_elastic.py) in --out.
#
#   bench/run_elastic.sh [--bin DIR | --bundle FILE] [--nixl-lib DIR] [--out DIR]
#                          [--modes "ll ht"] [--cycles 20] [--quick] [--no-mps]
#                          [--campaign N [--seed S] [--max-ranks N] [--long-every 3] [--budget-s S]] [--join]
#
# --join runs, instead of the matrix, three plans in which ranks join while
# the members step, in both modes over both paths, with phases long enough
# to cover a joiner's start (about 1.5 s; LL 2000 steps, HT 600 of 1024 tokens):
# join-2 [[0,1],[0,1],[0,1,2,3]] (two newcomers, connected ahead),
# leave-join [[0,1,2],[0,1,2],[0,1,3]] (one leaves as one joins) and
# rejoin [[0,1,2],[0,1,-2],[0,1,2]] (a killed id comes back: its element is
# still the old process's, so it is connected when the phase begins), and
# join-2 again with rank 3 SIGKILLed by pid during its own join, once it
# and the members connected ahead (join-death: the others go on without
# it). Each line of stderr carries the seconds since the run started
# (el-*.err).
#
# --campaign N runs, instead of the matrix, the fault campaign of
# bench/elastic_campaign.py (see its --help): N random plans of up to
# --max-ranks ranks (default: the GPUs, one rank each; 6 on one GPU), their
# kills at random moments, in every second run a kill by pid no plan names
# (rank 0 included), and every --long-every'th run one long phase (>= 10 s
# of steps) with a kill by pid at a moment drawn over it, which must end
# within its time bound; SIGKILL and SIGSTOP, the modes and the put, store
# and both paths drawn; every death must be named by every survivor, no
# survivor lost, no value wrong, no step after a decision waiting on the
# dead. --budget-s stops starting runs after that long. It writes campaign.tsv,
# deaths.tsv, summary.md (detection and agreement p50/p99/max) and
# campaign.png in --out. --seed S makes the draws repeatable (default 1).
#
# With one GPU the ranks share it under MPS (a private daemon,
# scripts/lib/mps.sh, stopped after); with more, rank r runs on GPU
# r mod GPUs. Needs no cargo (scripts/gpu-bundle.sh packs the binaries).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/elastic; MODES="ll ht"; CYCLES=20; QUICK=0; MPS=1
CAMPAIGN=0; SEED=1; MAX_RANKS=""; JOIN=0; LONG_EVERY=3; BUDGET=0
while (($#)); do
  case "$1" in
    --bundle|--bin|--nixl-lib|--out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --modes) need_value "$1" $#; MODES=$2; shift 2 ;;
    --cycles) need_value "$1" $#; CYCLES=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-mps) MPS=0; shift ;;
    --campaign) need_value "$1" $#; CAMPAIGN=$2; shift 2 ;;
    --seed) need_value "$1" $#; SEED=$2; shift 2 ;;
    --max-ranks) need_value "$1" $#; MAX_RANKS=$2; shift 2 ;;
    --long-every) need_value "$1" $#; LONG_EVERY=$2; shift 2 ;;
    --budget-s) need_value "$1" $#; BUDGET=$2; shift 2 ;;
    --join) JOIN=1; shift ;;
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
    >"$OUT/el-$tag.out" 2> >(stamped >"$OUT/el-$tag.err")
  local rc=$?
  wait
  if ((rc != 0)); then fail=1; echo "!! $tag: exit $rc" >&2; tail -12 "$OUT/el-$tag.err" >&2
  else echo "ok $tag in $((SECONDS - t0)) s" >&2; fi
}

# Prefixes each line of stdin with the seconds since it started.
stamped() {
  python3 -u -c 'import sys, time
t0 = time.monotonic()
for line in sys.stdin:
    print(f"{time.monotonic() - t0:9.3f} {line}", end="", flush=True)'
}

# join-death: once rank 3 says it connected ahead (in its run's stderr,
# $1), SIGKILL it by pid; says so on stderr.
kill_joiner() {
  local err=$1 pid
  for _ in $(seq 600); do
    if grep -q '\[rank 3\] connected ahead' "$err" 2>/dev/null; then
      pid=$(sed -n 's/.*started rank 3 .*(pid \([0-9]*\)).*/\1/p' "$err" | tail -1)
      kill -KILL "$pid" && echo "   killed rank 3 (pid $pid) during its join" >&2
      return
    fi
    sleep 0.05
  done
  echo "!! join-death: rank 3 never said it connected ahead" >&2
}

if ((JOIN)); then
  echo '[[0,1],[0,1],[0,1,2,3]]' >"$OUT/join_2.json"
  echo '[[0,1,2],[0,1,2],[0,1,3]]' >"$OUT/leave_join.json"
  echo '[[0,1,2],[0,1,-2],[0,1,2]]' >"$OUT/rejoin.json"
  mps=0; ((MPS && NGPU == 1)) && mps_start && mps=1
  for mode in $MODES; do
    args=(--iters 2000 --warmup 20); [[ $mode == ht ]] && args=(--iters 600 --warmup 10 --tokens 1024)
    for path in put store; do
      for plan in join_2 leave_join rejoin; do
        one "join-$mode-$path-${plan//_/-}" --plan "$OUT/$plan.json" --capacity 4 --mode "$mode" --path "$path" "${args[@]}"
      done
      kill_joiner "$OUT/el-join-$mode-$path-join-death.err" &
      one "join-$mode-$path-join-death" --plan "$OUT/join_2.json" --capacity 4 --mode "$mode" --path "$path" "${args[@]}"
      wait
    done
  done
  ((mps)) && mps_stop
  exit $fail
fi

[[ -z $MAX_RANKS ]] && { MAX_RANKS=$NGPU; ((NGPU == 1)) && MAX_RANKS=6; }
if ((CAMPAIGN > 0)); then
  mps=0; ((MPS && NGPU == 1)) && mps_start && mps=1
  python3 "$ROOT/bench/elastic_campaign.py" --ep "$EP" --out "$OUT" --runs "$CAMPAIGN" --seed "$SEED" \
    --modes "${MODES// /,}" --max-ranks "$MAX_RANKS" --long-every "$LONG_EVERY" --budget-s "$BUDGET"
  rc=$?
  ((mps)) && mps_stop
  exit $rc
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
python3 "$ROOT/bench/plot_elastic.py" "$OUT" "$OUT/elastic.png" && echo "plot: $OUT/elastic.png" >&2
exit $fail
