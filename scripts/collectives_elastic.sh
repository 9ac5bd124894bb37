#!/usr/bin/env bash
# Elastic collectives on a GPU machine (scripts/run_collectives.sh --elastic
# runs it): N runs, each one operation / algorithm / path drawn at random,
# 4 ranks on one GPU under MPS, one death per run, drawn too: a planned kill
# (`--plan [[0,1,-v,3]]`, at a random step, SIGKILL or SIGSTOP) or a kill by
# pid at a random moment (any rank, 0 included). Every survivor must name
# the victim, no element may be wrong (exit 3 otherwise), and the run must
# exit 0. Each run's table (per case and member count: time per call, calls
# checked and lost) and detections go to --out as JSON, CSV and a log; a
# summary line per run, then totals.
#
#   scripts/collectives_elastic.sh [--bin DIR | --bundle FILE] [--out DIR]
#                                  [--runs N] [--seed S] [--fault-timeout MS]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/collectives-elastic
RUNS=12; SEED=$(date +%s); FAULT=200
while (($#)); do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --nixl-lib) NIXL_LIB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --fault-timeout) FAULT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
NAME=collectives_elastic
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
# shellcheck source=lib/mps.sh
source "$ROOT/scripts/lib/mps.sh"
mps_start || exit 1
C="$BIN/collectives"
RANDOM=$SEED
echo "collectives_elastic: seed $SEED, $RUNS runs, fault timeout $FAULT ms" >&2
CASES=("allreduce one-shot" "allreduce two-shot" "allreduce ll" "allgather one-shot" "reduce-scatter one-shot")
pass=0; fail=0
for ((k = 1; k <= RUNS; k++)); do
  read -r op algo <<< "${CASES[RANDOM % ${#CASES[@]}]}"
  path=$([[ $algo == ll ]] && echo store || ( ((RANDOM % 2)) && echo put || echo store ))
  sig=$( ((RANDOM % 2)) && echo KILL || echo STOP )
  victim=$((RANDOM % 4))
  how=$( ((victim > 0 && RANDOM % 2)) && echo plan || echo pid )
  tag=$(printf 'r%02d-%s-%s-%s-%s-rank%d-%s' "$k" "$op" "$algo" "$path" "$how" "$victim" "$sig")
  args=(--gpus 1 --op "$op" --algo "$algo" --path "$path" -b 8 -e 1M -f 32 --rounds 60 -n 10
        --fault-timeout "$FAULT" --timeout 30 --json "$OUT/$tag.json" --csv "$OUT/$tag.csv")
  if [[ $how == plan ]]; then
    plan="$OUT/$tag.plan.json"
    members=(0 1 2 3); members[victim]="-$victim"
    (IFS=,; echo "[[${members[*]}]]") > "$plan"
    "$C" --plan "$plan" --kill-signal "$sig" --kill-seed "$RANDOM" "${args[@]}" > "$OUT/$tag.log" 2>&1
    rc=$?
  else
    "$C" --elastic --ranks 4 "${args[@]}" > "$OUT/$tag.log" 2>&1 &
    launcher=$!
    # A random moment inside the steps: after the ranks report their first round.
    for _ in $(seq 1 600); do grep -q "round 1/60 verified" "$OUT/$tag.log" && break; sleep 0.02; done
    sleep "0.$((RANDOM % 5))$((RANDOM % 10))"
    pid=""
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
  fi
  named=$(grep -c "ranks gone: \[$victim\]" "$OUT/$tag.log")
  if ((rc == 0 && named == 3)); then
    pass=$((pass + 1)); verdict=ok
  else
    fail=$((fail + 1)); verdict=FAIL
  fi
  lost=$(grep -o '"lost": [0-9]*' "$OUT/$tag.json" 2>/dev/null | awk '{s += $2} END {print s + 0}')
  wait_ms=$(grep -o 'waited on [0-9.]* ms' "$OUT/$tag.log" | head -1)
  agree=$(grep -o 'agreed in [0-9.]* ms' "$OUT/$tag.log" | head -1)
  echo "$verdict $tag: exit $rc, named by $named/3 survivors, lost calls $lost, ${wait_ms:-no GPU wait}, ${agree:-}"
done
echo "collectives_elastic: $pass/$RUNS runs passed (seed $SEED)"
((fail == 0))
