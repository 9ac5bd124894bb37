#!/usr/bin/env bash
# Elastic collectives on a GPU machine (bench/run_collectives.sh --elastic
# runs it): N runs, each one operation / algorithm / path drawn at random,
# 4 ranks on one GPU under MPS, one death per run, drawn too: a planned kill
# (`--plan [[0,1,-v,3]]`, at a random step, SIGKILL or SIGSTOP), a planned
# kill followed by a new rank joining (`--plan [[0,1,-v,3],[0,1,3,4]]`:
# shrink, then grow) or a kill by pid at a random moment (any rank, 0
# included). Every survivor must name the victim, a joiner must join and its
# calls be checked, no element may be wrong (exit 3 otherwise), and the run
# must exit 0. Each run's table (per case and member count: time per call, calls
# checked and lost) and detections go to --out as JSON, CSV and a log; a
# summary line per run, then totals.
#
# --sweep adds, for each operation / algorithm / path, a run at 3 ranks with
# no death (fresh-<case>.json) and a run at 4 ranks that loses one by plan
# (sweep-<case>.json), f32 at every size from 8 B to 64 MiB (×2), 8 rounds
# of 5 calls: the sizes the comparison "after a shrink against a fresh run
# of the survivors' count" needs. bench/report_collectives_elastic.py
# reads the folder: the per-phase table, the comparison, and a plot.
#
#   bench/collectives_elastic.sh [--bin DIR | --bundle FILE] [--out DIR]
#                                  [--runs N] [--seed S] [--fault-timeout MS] [--sweep]
#                                  [--sweep-case "OP ALGO PATH"] [--campaign N [--long-every 3] [--budget-s S]]
#
# --campaign N runs, instead, bench/elastic_campaign.py --collectives: N
# runs of one phase of one rank per GPU (4 on one GPU under MPS), the case
# drawn, a plan kill or not and a kill by pid of any rank at a drawn moment,
# every --long-every'th phase long (>= 10 s of steps) and held to its time
# bound (see that script's --help); --budget-s S stops starting runs after S s.
#
# --sweep-case (implies --sweep) sweeps that one case only, e.g.
# "reduce-scatter one-shot store"; --runs 0 skips the random runs.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/collectives-elastic
RUNS=12; SEED=$(date +%s); FAULT=200; SWEEP=0; SWEEP_CASE=; CAMPAIGN=0; LONG_EVERY=3; BUDGET=0
while (($#)); do
  case "$1" in
    --bundle|--bin|--nixl-lib|--out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --runs) need_value "$1" $#; RUNS=$2; shift 2 ;;
    --seed) need_value "$1" $#; SEED=$2; shift 2 ;;
    --fault-timeout) need_value "$1" $#; FAULT=$2; shift 2 ;;
    --sweep) SWEEP=1; shift ;;
    --campaign) need_value "$1" $#; CAMPAIGN=$2; shift 2 ;;
    --long-every) need_value "$1" $#; LONG_EVERY=$2; shift 2 ;;
    --budget-s) need_value "$1" $#; BUDGET=$2; shift 2 ;;
    --sweep-case) need_value "$1" $#; SWEEP=1; SWEEP_CASE=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
NAME=collectives_elastic
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
# shellcheck source=lib/mps.sh
source "$ROOT/scripts/lib/mps.sh"
C="$BIN/collectives"
if ((CAMPAIGN > 0)); then
  mps=0; ((NGPU == 1)) && { mps_start || exit 1; mps=1; }
  ranks=$NGPU; ((NGPU == 1)) && ranks=4
  python3 "$ROOT/bench/elastic_campaign.py" --collectives "$C" --out "$OUT" --runs "$CAMPAIGN" --seed "$SEED" \
    --max-ranks "$ranks" --long-every "$LONG_EVERY" --budget-s "$BUDGET" --fault-timeout "$FAULT"
  rc=$?
  ((mps)) && mps_stop
  exit $rc
fi
mps_start || exit 1
RANDOM=$SEED
echo "collectives_elastic: seed $SEED, $RUNS runs, fault timeout $FAULT ms" >&2
CASES=("allreduce one-shot" "allreduce two-shot" "allreduce ll" "allgather one-shot" "reduce-scatter one-shot")
pass=0; fail=0; total=0

# planned TAG VICTIM SIGNAL ARGS...: the plan kills VICTIM of ranks 0-3 at a
# step drawn in the first half of the run.
planned() {
  local tag=$1 victim=$2 sig=$3; shift 3
  local plan="$OUT/$tag.plan.json" members=(0 1 2 3)
  members[victim]="-$victim"
  (IFS=,; echo "[[${members[*]}]]") > "$plan"
  "$C" --plan "$plan" --kill-signal "$sig" --kill-seed "$RANDOM" "$@" > "$OUT/$tag.log" 2>&1
}

# grow TAG VICTIM SIGNAL ARGS...: the plan kills VICTIM of ranks 0-3 in
# phase 0 and rank 4, a new process, joins in phase 1 (shrink, then grow).
grow() {
  local tag=$1 victim=$2 sig=$3; shift 3
  local plan="$OUT/$tag.plan.json" members=(0 1 2 3) after=()
  members[victim]="-$victim"
  for r in 0 1 2 3; do ((r != victim)) && after+=("$r"); done
  after+=(4)
  (IFS=,; echo "[[${members[*]}],[${after[*]}]]") > "$plan"
  "$C" --plan "$plan" --kill-signal "$sig" --kill-seed "$RANDOM" "$@" > "$OUT/$tag.log" 2>&1
}

# by_pid TAG VICTIM SIGNAL ARGS...: 4 ranks; VICTIM's process is sent SIGNAL
# at a random moment after the first round.
by_pid() {
  local tag=$1 victim=$2 sig=$3; shift 3
  "$C" --elastic --ranks 4 "$@" > "$OUT/$tag.log" 2>&1 &
  local launcher=$! pid="" rc
  for _ in $(seq 1 600); do grep -q "round 1/60 verified" "$OUT/$tag.log" && break; sleep 0.02; done
  sleep "0.$((RANDOM % 5))$((RANDOM % 10))"
  for p in $(pgrep -P "$launcher"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$victim" && pid=$p
  done
  if [[ -n $pid ]]; then
    kill -s "$sig" "$pid"; echo "[$tag] sent SIG$sig to rank $victim (pid $pid)" >> "$OUT/$tag.log"
  else
    echo "[$tag] the kill missed: rank $victim had exited (the run ended first)" >> "$OUT/$tag.log"
  fi
  wait "$launcher"; rc=$?
  [[ $sig == STOP && -n $pid ]] && kill -KILL "$pid" 2>/dev/null
  return "$rc"
}

# verdict TAG RC VICTIM: passes when the run exited 0 and all 3 survivors
# named the victim (and, in a grow run, rank 4 joined: its calls are checked
# like everyone's, a wrong one exits 3); one summary line.
verdict() {
  local tag=$1 rc=$2 victim=$3 named lost wait_ms agree joined=1 v=ok
  named=$(grep -c "ranks gone: \[$victim\]" "$OUT/$tag.log")
  if [[ $tag == *-grow-* ]]; then
    grep -q "rank 4 joined in phase 1" "$OUT/$tag.log" || joined=0
  fi
  total=$((total + 1))
  if ((rc == 0 && named == 3 && joined)); then pass=$((pass + 1)); else fail=$((fail + 1)); v=FAIL; fi
  lost=$(grep -o '"lost": [0-9]*' "$OUT/$tag.json" 2>/dev/null | awk '{s += $2} END {print s + 0}')
  wait_ms=$(grep -o 'waited on [0-9.]* ms' "$OUT/$tag.log" | head -1)
  agree=$(grep -o 'agreed in [0-9.]* ms' "$OUT/$tag.log" | head -1)
  echo "$v $tag: exit $rc, named by $named/3 survivors, lost calls $lost, ${wait_ms:-no GPU wait}, ${agree:-}"
}

for ((k = 1; k <= RUNS; k++)); do
  read -r op algo <<< "${CASES[RANDOM % ${#CASES[@]}]}"
  path=$([[ $algo == ll ]] && echo store || ( ((RANDOM % 2)) && echo put || echo store ))
  sig=$( ((RANDOM % 2)) && echo KILL || echo STOP )
  victim=$((RANDOM % 4))
  how=pid
  ((victim > 0)) && how=$(echo pid plan grow | cut -d' ' -f$((1 + RANDOM % 3)))
  tag=$(printf 'r%02d-%s-%s-%s-%s-rank%d-%s' "$k" "$op" "$algo" "$path" "$how" "$victim" "$sig")
  rounds=60; [[ $how == grow ]] && rounds=30   # per phase
  args=(--gpus 1 --op "$op" --algo "$algo" --path "$path" -b 8 -e 1M -f 32 --rounds $rounds -n 10
        --fault-timeout "$FAULT" --timeout 30 --json "$OUT/$tag.json" --csv "$OUT/$tag.csv")
  case $how in
    plan) planned "$tag" "$victim" "$sig" "${args[@]}" ;;
    grow) grow "$tag" "$victim" "$sig" "${args[@]}" ;;
    *) by_pid "$tag" "$victim" "$sig" "${args[@]}" ;;
  esac
  verdict "$tag" $? "$victim"
done

if ((SWEEP)); then
  for c in "allreduce one-shot put" "allreduce one-shot store" "allreduce two-shot put" \
           "allreduce two-shot store" "allreduce ll store" "allgather one-shot put" \
           "allgather one-shot store" "reduce-scatter one-shot put" "reduce-scatter one-shot store"; do
    [[ -n $SWEEP_CASE && $c != "$SWEEP_CASE" ]] && continue
    read -r op algo path <<< "$c"
    name="$op-$algo-$path"; max=64M
    [[ $algo == ll ]] && max=64K   # LL runs up to 64 KiB
    args=(--gpus 1 --op "$op" --algo "$algo" --path "$path" -f 2 --dtype f32
          --rounds 8 -n 5 --fault-timeout "$FAULT" --timeout 60)
    # allgather and reduce-scatter survivors keep 4 ranks' count per rank:
    # buffers of 3/4 the size, which a fresh 3-rank run gets from -b 12 -e 48M.
    fresh=(-b 8 -e "$max"); [[ $op != allreduce ]] && fresh=(-b 12 -e 48M)
    "$C" --elastic --ranks 3 "${args[@]}" "${fresh[@]}" --json "$OUT/fresh-$name.json" --csv "$OUT/fresh-$name.csv" \
      > "$OUT/fresh-$name.log" 2>&1 || echo "FAIL fresh-$name: exit $? (see $OUT/fresh-$name.log)"
    victim=$((1 + RANDOM % 3)); sig=$( ((RANDOM % 2)) && echo KILL || echo STOP )
    tag="sweep-$name-rank$victim-$sig"
    planned "$tag" "$victim" "$sig" "${args[@]}" -b 8 -e "$max" --json "$OUT/$tag.json" --csv "$OUT/$tag.csv"
    verdict "$tag" $? "$victim"
  done
fi
echo "collectives_elastic: $pass/$total runs passed (seed $SEED)"
((fail == 0))
