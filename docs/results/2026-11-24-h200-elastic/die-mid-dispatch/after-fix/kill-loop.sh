#!/usr/bin/env bash
# the kill loop (5 cycles, 3 ranks) after the fix: agreement times; plus the die-mid-dispatch logs
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=/tmp/bf; mkdir -p "$OUT" "$B"
[ -x "$B/bin/ep" ] || tar -C "$B" -xJf .gpu/lead/bundle.tar.xz || exit 1
BIN="$B/bin"; export NIXL_LIB_DIR="$B/nixl/.nixl_cu13.mesonpy.libs"
export UCX_POSIX_USE_PROC_LINK=n
source scripts/lib/mps.sh && mps_start
echo '[[0,1,2,3],[0,1,2,-3],[0,1,2,3],[0,1,2,-3],[0,1,2,3],[0,1,2,-3],[0,1,2,3],[0,1,2,-3],[0,1,2,3],[0,1,2,-3],[0,1,2,3]]' > /tmp/kl.json
for path in put store; do
  echo "== kill loop, ll $path"
  timeout 150 "$BIN/ep" --plan /tmp/kl.json --mode ll --path $path --iters 40 --warmup 5 --port 0 > "$OUT/kl-$path.out" 2> "$OUT/kl-$path.err"; echo "exit $?"
  grep -E '^\| ' "$OUT/kl-$path.out" | awk -F'|' '$5 ~ /[0-9]/ {print $2,$5,$8,$9,$10,$16,$17}'
done
mps_stop
