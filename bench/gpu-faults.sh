#!/usr/bin/env bash
# Fault matrix for simple_write on a GPU machine: every way a run can go
# wrong must end fast, with a message naming the cause and the fix, the
# documented exit status, and nothing left behind. Prints one table.
#
#   bench/gpu-faults.sh [--bundle FILE | --bin DIR --nixl-lib DIR] [--out DIR]
#
# Needs no cargo or internet (bundle from scripts/gpu-bundle.sh).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/gpu-faults
while (($#)); do
  case "$1" in
    --bundle|--bin|--nixl-lib|--out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
NAME=gpu-faults
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
# shellcheck source=lib/ports.sh
source "$ROOT/scripts/lib/ports.sh"
SW="$BIN/simple_write"
LONG=(--level warp --size 64M --iters 100 --no-baseline)   # about 5 s of puts
fails=0
printf '%-44s %-26s %-26s %-7s %s\n' "fault" "expected" "got" "time" "message (first line)" > "$OUT/table.txt"

# row NAME EXPECTED_DESC GOT_DESC SECONDS PASS(0/1) LOGFILE PATTERN
# PATTERN is the cause the fault must produce, as the survivor states it
# (an `error:` line naming the peer, not any line that mentions it): a row
# whose log has no such line fails, whatever the exit status.
row() {
  local msg=""
  if [[ -n "$7" ]]; then
    msg=$(grep -m1 -E -e "$7" "$6" 2>/dev/null | cut -c1-110)
    [[ -z "$msg" ]] && msg="(no line matching /$7/ in $(basename "$6"))" && set -- "$1" "$2" "$3" "$4" 1 "$6" "$7"
  fi
  printf '%-44s %-26s %-26s %-7s %s\n' "$1" "$2" "$3" "${4}s" "$([[ $5 == 0 ]] && echo PASS || echo FAIL): $msg" >> "$OUT/table.txt"
  [[ $5 == 0 ]] || fails=$((fails + 1))
}
# not_started NAME LOG: the row of a fault that could not be injected
# because the run was not under way (it never started, or ended first).
not_started() {
  printf '%-44s %-26s %-26s %-7s %s\n' "$1" "run under way" "not under way" "" \
    "FAIL: the run was not transferring when the fault was due (see $(basename "$2"))" >> "$OUT/table.txt"
  fails=$((fails + 1))
}
now() { echo "$EPOCHREALTIME"; }
dt() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
# under_way OUT PID...: waits (at most 60 s) until the initiator's stdout
# OUT says the transfer started, then 1 s more (the LONG run lasts about
# 5 s), and succeeds only if every PID is still running then.
under_way() {
  local out=$1 i pid
  shift
  for ((i = 0; i < 600; i++)); do
    grep -q "Transferring data via GPU kernel" "$out" 2>/dev/null && break
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null || return 1; done
    sleep 0.1
  done
  sleep 1
  for pid in "$@"; do kill -0 "$pid" 2>/dev/null || return 1; done
  grep -q "Transferring data via GPU kernel" "$out" 2>/dev/null
}
# stop_all PID...: ends what a row left running (a row that failed).
stop_all() {
  local pid
  for pid in "$@"; do kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  return 0
}
# pair TAG TIMEOUT: starts a LONG initiator and its target on a fresh
# port; sets ip and tp to their pids.
pair() {
  local p
  p=$(pick_port)
  "$SW" -m initiator -p "$p" -t "$2" "${LONG[@]}" >"$OUT/$1i.out" 2>"$OUT/$1i.err" & ip=$!
  "$SW" -m target -p "$p" -t "$2" >"$OUT/$1t.out" 2>"$OUT/$1t.err" & tp=$!
}

# 1. The peer never comes.
p=$(pick_port); t0=$(now)
"$SW" -m target -p $p -t 3 >"$OUT/1.out" 2>"$OUT/1.err"; rc=$?
row "target, no initiator (-t 3)" "exit 1" "exit $rc" "$(dt $t0)" $((rc != 1)) "$OUT/1.err" "error: no initiator at"
p=$(pick_port); t0=$(now)
"$SW" -m initiator -p $p -t 3 >"$OUT/2.out" 2>"$OUT/2.err"; rc=$?
row "initiator, no target (-t 3)" "exit 1" "exit $rc" "$(dt $t0)" $((rc != 1)) "$OUT/2.err" "error: the target did not join"

# 2. The peer dies mid-run (SIGKILL: no cleanup of its own). The survivor
# names the peer that died.
pair 3 20
if under_way "$OUT/3i.out" $ip $tp; then
  kill -9 $tp; t0=$(now); wait $ip; rc=$?; took=$(dt $t0); wait $tp 2>/dev/null
  row "target SIGKILLed mid-transfer" "initiator exit 1, <10 s" "exit $rc" "$took" \
    $((rc != 1 || ${took%.*} >= 10)) "$OUT/3i.err" "error: .*the target"
else not_started "target SIGKILLed mid-transfer" "$OUT/3i.err"; stop_all $ip $tp; fi
pair 4 20
if under_way "$OUT/4i.out" $ip $tp; then
  kill -9 $ip; t0=$(now); wait $tp; rc=$?; took=$(dt $t0); wait $ip 2>/dev/null
  row "initiator SIGKILLed mid-transfer" "target exit 1, <10 s" "exit $rc" "$took" \
    $((rc != 1 || ${took%.*} >= 10)) "$OUT/4t.err" "error: .*the initiator"
else not_started "initiator SIGKILLed mid-transfer" "$OUT/4t.err"; stop_all $ip $tp; fi

# 3. Ctrl-C / SIGTERM: clean up, exit 130 / 143; the peer is told.
pair 5 20
if under_way "$OUT/5i.out" $ip $tp; then
  kill -INT $ip; t0=$(now); wait $ip; rc=$?; took=$(dt $t0); wait $tp; trc=$?
  row "SIGINT to the initiator mid-transfer" "130; target 1" "$rc; target $trc" "$took" \
    $((rc != 130 || trc != 1)) "$OUT/5i.err" "interrupted by SIGINT"
  row "  ... what the target says" "names the initiator" "" "" $((trc != 1)) "$OUT/5t.err" "error: .*initiator"
else not_started "SIGINT to the initiator mid-transfer" "$OUT/5i.err"; stop_all $ip $tp; fi
pair 6 20
if under_way "$OUT/6i.out" $ip $tp; then
  kill -TERM $tp; t0=$(now); wait $tp; trc=$?; took=$(dt $t0); wait $ip; rc=$?
  row "SIGTERM to the target mid-transfer" "143; initiator 1" "$trc; initiator $rc" "$took" \
    $((trc != 143 || rc != 1)) "$OUT/6t.err" "interrupted by SIGTERM"
  row "  ... what the initiator says" "names the target" "" "" $((rc != 1)) "$OUT/6i.err" "error: .*target"
else not_started "SIGTERM to the target mid-transfer" "$OUT/6t.err"; stop_all $ip $tp; fi

# 3b. The peer freezes mid-run (SIGSTOP: its sockets stay open, nothing
# answers). The survivor must notice within --timeout + 5 s, name the
# silent peer in its error, and exit 1; the frozen one is killed afterwards.
pair s1 10
if under_way "$OUT/s1i.out" $ip $tp; then
  kill -STOP $ip; t0=$(now); wait $tp; trc=$?; took=$(dt $t0); kill -9 $ip; wait $ip 2>/dev/null
  row "initiator SIGSTOPped mid-transfer (-t 10)" "target exit 1, <15 s" "exit $trc" "$took" \
    $((trc != 1 || ${took%.*} >= 15)) "$OUT/s1t.err" "error: .*initiator"
else not_started "initiator SIGSTOPped mid-transfer (-t 10)" "$OUT/s1t.err"; stop_all $ip $tp; fi
pair s2 10
if under_way "$OUT/s2i.out" $ip $tp; then
  kill -STOP $tp; t0=$(now); wait $ip; rc=$?; took=$(dt $t0); kill -9 $tp; wait $tp 2>/dev/null
  row "target SIGSTOPped mid-transfer (-t 10)" "initiator exit 1, <15 s" "exit $rc" "$took" \
    $((rc != 1 || ${took%.*} >= 15)) "$OUT/s2i.err" "error: .*target"
else not_started "target SIGSTOPped mid-transfer (-t 10)" "$OUT/s2i.err"; stop_all $ip $tp; fi

# 4. Wrong data must fail both sides with 3, the target naming the mismatch.
p=$(pick_port)
"$SW" -m initiator -p $p -t 20 --level block --size 1M --inject corrupt-data >"$OUT/7i.out" 2>"$OUT/7i.err" & ip=$!
"$SW" -m target -p $p -t 20 >"$OUT/7t.out" 2>"$OUT/7t.err"; trc=$?; wait $ip; rc=$?
row "one corrupted source byte" "3 and 3" "$rc and $trc" "" $((rc != 3 || trc != 3)) "$OUT/7t.err" "Checksum MISMATCH"

# 5. Environment.
t0=$(now); UCX_TLS=^cuda_ipc "$SW" -m initiator -p $(pick_port) >"$OUT/8.out" 2>"$OUT/8.err"; rc=$?
row "UCX_TLS=^cuda_ipc" "exit 1 at once" "exit $rc" "$(dt $t0)" $((rc != 1)) "$OUT/8.err" "UCX_TLS=\^cuda_ipc leaves out cuda_ipc"

# 6. Stale state and duplicates, while a pair is transferring on the port.
p=$(pick_port)
"$SW" -m initiator -p $p -t 20 "${LONG[@]}" >"$OUT/9i.out" 2>"$OUT/9i.err" & ip=$!
"$SW" -m target -p $p -t 20 >"$OUT/9t.out" 2>"$OUT/9t.err" & tp=$!
if under_way "$OUT/9i.out" $ip $tp; then
  "$SW" -m initiator -p $p -t 5 >"$OUT/9i2.out" 2>"$OUT/9i2.err"; i2=$?
  "$SW" -m target -p $p -t 5 >"$OUT/9t2.out" 2>"$OUT/9t2.err"; t2=$?
  wait $ip; rc=$?; wait $tp; trc=$?
  row "second initiator on a busy port" "exit 2" "exit $i2" "" $((i2 != 2)) "$OUT/9i2.err" "port $p is already in use"
  row "second target joins a running pair" "exit 1; pair 0/0" "exit $t2; pair $rc/$trc" "" \
    $((t2 != 1 || rc != 0 || trc != 0)) "$OUT/9t2.err" "error: another target"
else not_started "second initiator / target on a running pair" "$OUT/9i.err"; stop_all $ip $tp; fi

# 7. Arguments the machine cannot satisfy.
"$SW" -m initiator -p $(pick_port) --gpu 7 >"$OUT/10.out" 2>"$OUT/10.err"; rc=$?
row "--gpu 7" "exit 2" "exit $rc" "" $((rc != 2)) "$OUT/10.err" "GPU 7 does not exist"
"$SW" -m initiator -p $(pick_port) --size 4096G --level block >"$OUT/11.out" 2>"$OUT/11.err"; rc=$?
row "--size 4096G (more than the GPU has)" "exit 2" "exit $rc" "" $((rc != 2)) "$OUT/11.err" "MiB free"

# Nothing left behind: no simple_write processes of this run.
left=$(pgrep -c -f "^$SW " || true)
row "processes left behind" "0" "$left" "" $((left != 0)) /dev/null ""
cat "$OUT/table.txt"
exit $((fails != 0))
