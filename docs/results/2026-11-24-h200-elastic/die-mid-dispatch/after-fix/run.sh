#!/usr/bin/env bash
# 1) die-mid-dispatch after the fix (forgiveness + resync); 2) the elastic matrix, 10 kill cycles
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=/tmp/bf; mkdir -p "$OUT" "$B" "$OUT/m"
tar -C "$B" -xJf .gpu/lead/bundle.tar.xz || exit 1
BIN="$B/bin"; export NIXL_LIB_DIR="$B/nixl/.nixl_cu13.mesonpy.libs"
export UCX_POSIX_USE_PROC_LINK=n
source scripts/lib/mps.sh && mps_start
P=tests/fixtures/elastic/expansion_fault_contraction.json
one() { local tag=$1; shift; echo "== $tag: ep $*"; timeout 120 "$BIN/ep" "$@" --port 0 >"$OUT/$tag.out" 2>"$OUT/$tag.err"; echo "exit $?"; grep -E "ranks gone|dying|agreed that this rank|error|resynchronised" "$OUT/$tag.out" "$OUT/$tag.err" | sed 's|^/[^:]*/||' | cut -c1-230 | head -12; grep -E '^\| 2 ' "$OUT/$tag.out" | cut -c1-240; }
for k in 1 2; do one ll-put-$k --plan $P --mode ll --path put --iters 20 --warmup 3 --inject die-mid-dispatch; done
for k in 1 2; do one ll-store-$k --plan $P --mode ll --path store --iters 20 --warmup 3 --inject die-mid-dispatch; done
one ht-store-1 --plan $P --mode ht --path store --tokens 1024 --iters 10 --warmup 2 --inject die-mid-dispatch
one ht-put-1 --plan $P --mode ht --path put --tokens 1024 --iters 10 --warmup 2 --inject die-mid-dispatch
one ll-both-stop --plan $P --mode ll --iters 20 --warmup 3 --inject die-mid-dispatch --kill-signal STOP
mps_stop
echo "== matrix"
timeout 420 scripts/run_elastic.sh --bundle .gpu/lead/bundle.tar.xz --out "$OUT/m" --modes "ll ht" --cycles 10 2>&1 | tail -40
cd "$OUT" && tar -czf /tmp/logs.tgz . && mv /tmp/logs.tgz "$OUT/logs.tgz" && find . -type f ! -name logs.tgz -delete
