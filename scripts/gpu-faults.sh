#!/usr/bin/env bash
# Fault matrix for simple_write on a GPU machine: every way a run can go
# wrong must end fast, with a message naming the cause and the fix, the
# documented exit status, and nothing left behind. Prints one table.
#
#   scripts/gpu-faults.sh [--bundle FILE | --bin DIR --nixl-lib DIR] [--out DIR]
#
# Needs no cargo or internet (bundle from scripts/gpu-bundle.sh).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/gpu-faults
while (($#)); do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --nixl-lib) NIXL_LIB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-faults: unknown option $1" >&2; exit 2 ;;
  esac
done
NAME=gpu-faults
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
# shellcheck source=lib/ports.sh
source "$ROOT/scripts/lib/ports.sh"
SW="$BIN/simple_write"
LONG=(--level warp --size 64M --iters 100 --no-baselines)   # about 5 s of puts
fails=0
printf '%-44s %-26s %-26s %-7s %s\n' "fault" "expected" "got" "time" "message (first line)" > "$OUT/table.txt"

# row NAME EXPECTED_DESC GOT_DESC SECONDS PASS(0/1) LOGFILE PATTERN
row() {
  local msg=""
  if [[ -n "$7" ]]; then
    msg=$(grep -m1 -E "$7" "$6" 2>/dev/null | cut -c1-110)
    [[ -z "$msg" ]] && msg="(no line matching /$7/ in $(basename "$6"))" && set -- "$1" "$2" "$3" "$4" 1 "$6" "$7"
  fi
  printf '%-44s %-26s %-26s %-7s %s\n' "$1" "$2" "$3" "${4}s" "$([[ $5 == 0 ]] && echo PASS || echo FAIL): $msg" >> "$OUT/table.txt"
  [[ $5 == 0 ]] || fails=$((fails + 1))
}
now() { echo "$EPOCHREALTIME"; }
dt() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# 1. The peer never comes.
p=$(pick_port); t0=$(now)
"$SW" -m target -p $p -t 3 >"$OUT/1.out" 2>"$OUT/1.err"; rc=$?
row "target, no initiator (-t 3)" "exit 1" "exit $rc" "$(dt $t0)" $((rc != 1)) "$OUT/1.err" "no initiator at"
p=$(pick_port); t0=$(now)
"$SW" -m initiator -p $p -t 3 >"$OUT/2.out" 2>"$OUT/2.err"; rc=$?
row "initiator, no target (-t 3)" "exit 1" "exit $rc" "$(dt $t0)" $((rc != 1)) "$OUT/2.err" "did not join"

# 2. The peer dies mid-run (SIGKILL: no cleanup of its own).
p=$(pick_port)
"$SW" -m initiator -p $p -t 20 "${LONG[@]}" >"$OUT/3i.out" 2>"$OUT/3i.err" & ip=$!
"$SW" -m target -p $p -t 20 >"$OUT/3t.out" 2>"$OUT/3t.err" & tp=$!
sleep 4; kill -9 $tp; t0=$(now); wait $ip; rc=$?; wait $tp 2>/dev/null
row "target SIGKILLed mid-transfer" "initiator exit 1, <10 s" "exit $rc" "$(dt $t0)" $((rc != 1)) "$OUT/3i.err" "stopped responding|gave up|never came|error"
p=$(pick_port)
"$SW" -m initiator -p $p -t 20 "${LONG[@]}" >"$OUT/4i.out" 2>"$OUT/4i.err" & ip=$!
"$SW" -m target -p $p -t 20 >"$OUT/4t.out" 2>"$OUT/4t.err" & tp=$!
sleep 4; kill -9 $ip; t0=$(now); wait $tp; rc=$?; wait $ip 2>/dev/null
row "initiator SIGKILLed mid-transfer" "target exit 1, <10 s" "exit $rc" "$(dt $t0)" $((rc != 1)) "$OUT/4t.err" "lost the store|stopped responding|error"

# 3. Ctrl-C / SIGTERM: clean up, exit 130 / 143; the peer is told.
p=$(pick_port)
"$SW" -m initiator -p $p -t 20 "${LONG[@]}" >"$OUT/5i.out" 2>"$OUT/5i.err" & ip=$!
"$SW" -m target -p $p -t 20 >"$OUT/5t.out" 2>"$OUT/5t.err" & tp=$!
sleep 4; kill -INT $ip; t0=$(now); wait $ip; rc=$?; wait $tp; trc=$?
row "SIGINT to the initiator mid-transfer" "130; target 1" "$rc; target $trc" "$(dt $t0)" $((rc != 130 || trc != 1)) "$OUT/5i.err" "interrupted"
row "  ... what the target says" "" "" "" $((trc != 1)) "$OUT/5t.err" "gave up|interrupted|lost the (store|connection)"
p=$(pick_port)
"$SW" -m initiator -p $p -t 20 "${LONG[@]}" >"$OUT/6i.out" 2>"$OUT/6i.err" & ip=$!
"$SW" -m target -p $p -t 20 >"$OUT/6t.out" 2>"$OUT/6t.err" & tp=$!
sleep 4; kill -TERM $tp; t0=$(now); wait $tp; trc=$?; wait $ip; rc=$?
row "SIGTERM to the target mid-transfer" "143; initiator 1" "$trc; initiator $rc" "$(dt $t0)" $((trc != 143 || rc != 1)) "$OUT/6t.err" "interrupted"

# 3b. The peer freezes mid-run (SIGSTOP: its sockets stay open, nothing
# answers). The survivor must notice within --timeout + 5 s, name the
# silent peer, and exit 1; the frozen one is killed afterwards.
p=$(pick_port)
"$SW" -m initiator -p $p -t 10 "${LONG[@]}" >"$OUT/s1i.out" 2>"$OUT/s1i.err" & ip=$!
"$SW" -m target -p $p -t 10 >"$OUT/s1t.out" 2>"$OUT/s1t.err" & tp=$!
sleep 4; kill -STOP $ip; t0=$(now); wait $tp; trc=$?; took=$(dt $t0); kill -9 $ip; wait $ip 2>/dev/null
row "initiator SIGSTOPped mid-transfer (-t 10)" "target exit 1, <15 s" "exit $trc" "$took" \
  $((trc != 1 || ${took%.*} >= 15)) "$OUT/s1t.err" "initiator"
p=$(pick_port)
"$SW" -m initiator -p $p -t 10 "${LONG[@]}" >"$OUT/s2i.out" 2>"$OUT/s2i.err" & ip=$!
"$SW" -m target -p $p -t 10 >"$OUT/s2t.out" 2>"$OUT/s2t.err" & tp=$!
sleep 4; kill -STOP $tp; t0=$(now); wait $ip; rc=$?; took=$(dt $t0); kill -9 $tp; wait $tp 2>/dev/null
row "target SIGSTOPped mid-transfer (-t 10)" "initiator exit 1, <15 s" "exit $rc" "$took" \
  $((rc != 1 || ${took%.*} >= 15)) "$OUT/s2i.err" "target"

# 4. Wrong data must fail both sides with 3.
p=$(pick_port)
"$SW" -m initiator -p $p -t 20 --level block --size 1M --inject corrupt-data >"$OUT/7i.out" 2>"$OUT/7i.err" & ip=$!
"$SW" -m target -p $p -t 20 >"$OUT/7t.out" 2>"$OUT/7t.err"; trc=$?; wait $ip; rc=$?
row "one corrupted source byte" "3 and 3" "$rc and $trc" "" $((rc != 3 || trc != 3)) "$OUT/7t.err" "MISMATCH|wrong"

# 5. Environment.
t0=$(now); UCX_TLS=^cuda_ipc "$SW" -m initiator -p $(pick_port) >"$OUT/8.out" 2>"$OUT/8.err"; rc=$?
row "UCX_TLS=^cuda_ipc" "exit 1 at once" "exit $rc" "$(dt $t0)" $((rc != 1)) "$OUT/8.err" "UCX_TLS"

# 6. Stale state and duplicates.
p=$(pick_port)
"$SW" -m initiator -p $p -t 20 "${LONG[@]}" >"$OUT/9i.out" 2>"$OUT/9i.err" & ip=$!
"$SW" -m target -p $p -t 20 >"$OUT/9t.out" 2>"$OUT/9t.err" & tp=$!
sleep 2
"$SW" -m initiator -p $p -t 5 >"$OUT/9i2.out" 2>"$OUT/9i2.err"; i2=$?
"$SW" -m target -p $p -t 5 >"$OUT/9t2.out" 2>"$OUT/9t2.err"; t2=$?
wait $ip; rc=$?; wait $tp; trc=$?
row "second initiator on a busy port" "exit 2" "exit $i2" "" $((i2 != 2)) "$OUT/9i2.err" "in use"
row "second target joins a running pair" "exit 1; pair 0/0" "exit $t2; pair $rc/$trc" "" $((t2 != 1 || rc != 0 || trc != 0)) "$OUT/9t2.err" "another target"

# 7. Arguments the machine cannot satisfy.
"$SW" -m initiator -p $(pick_port) --gpu 7 >"$OUT/10.out" 2>"$OUT/10.err"; rc=$?
row "--gpu 7" "exit 2" "exit $rc" "" $((rc != 2)) "$OUT/10.err" "does not exist"
"$SW" -m initiator -p $(pick_port) --size 4096G --level block >"$OUT/11.out" 2>"$OUT/11.err"; rc=$?
row "--size 4096G (more than the GPU has)" "exit 2" "exit $rc" "" $((rc != 2)) "$OUT/11.err" "MiB free"

# Nothing left behind: no simple_write processes.
left=$(pgrep -c simple_write || true)
row "processes left behind" "0" "$left" "" $((left != 0)) /dev/null ""
cat "$OUT/table.txt"
exit $((fails != 0))
