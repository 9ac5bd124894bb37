#!/usr/bin/env bash
# Runs one small simple_write pair with UCX debug logging and extracts what
# decides whether a device lane exists: transports, endpoint lanes, rkeys.
#   scripts/ucx-diag.sh BIN_DIR OUT_DIR [simple_write args...]
set -uo pipefail
BIN=$1; OUT=$2; shift 2
mkdir -p "$OUT"
export UCX_LOG_LEVEL=${UCX_LOG_LEVEL:-debug} UCX_POSIX_USE_PROC_LINK=n
port=$((30000 + RANDOM % 20000))
"$BIN/simple_write" -m initiator -p $port -s 8 -l block --iters 1 --warmup 0 -t 15 "$@" >"$OUT/i.out" 2>"$OUT/i.err" &
sleep 0.3
"$BIN/simple_write" -m target -p $port -t 15 >"$OUT/t.out" 2>"$OUT/t.err"
echo "target rc=$?"; wait; echo "initiator rc=$?"
for f in i t; do
  cat "$OUT/$f.out" "$OUT/$f.err" > "$OUT/$f.all"
  grep -iE "ep_cfg|lane|cuda_ipc|device ep|rkey|md_map|reachab|select|fail|error|warn" "$OUT/$f.all" | grep -v "^\s*$" | head -150 > "$OUT/$f.grep"
  wc -l "$OUT/$f.all"
done
