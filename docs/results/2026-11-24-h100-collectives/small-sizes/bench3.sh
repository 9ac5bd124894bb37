#!/usr/bin/env bash
# coll2's third GPU call: --data random (all operations, f32 and bf16, 3
# ranks stream and graph, 2 ranks), exact data again after the check's
# rewrite, and an injected element under random data (must exit 3).
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd); R=$(cd "$D/../.." && pwd)
L=${OUT:-/tmp/out}/logs; mkdir -p "$L"
mkdir -p /tmp/after && tar -C /tmp/after -xJf "$D/after.tar.xz"
export UCX_POSIX_USE_PROC_LINK=n NCCL_NVLS_ENABLE=0
source "$R/scripts/lib/mps.sh"; source "$R/scripts/lib/ports.sh"
mps_start
one() { # tag want args...
  local tag=$1 want=$2; shift 2; local t0=$SECONDS
  NIXL_LIB_DIR=/tmp/after/nixl/.nixl_cu13.mesonpy.libs timeout 150 /tmp/after/bin/collectives --port "$(pick_port)" \
    --gpus 1 --no-baseline --timeout 15 "$@" --json "$L/$tag.json" --csv "$L/$tag.csv" >"$L/$tag.out" 2>"$L/$tag.err"
  local rc=$?; echo "$tag exit $rc (want $want) in $((SECONDS - t0)) s" | tee -a "$L/driver.log"
}
one random-3r-stream 0 --ranks 3 -b 8 -e 64M -f 8 --data random
one random-3r-graph 0 --ranks 3 -b 8 -e 64M -f 8 --data random --launch graph --place both
one random-2r 0 --ranks 2 -b 8 -e 16M -f 8 --data random
one random-4r 0 --ranks 4 -b 8 -e 16M -f 8 --data random --op allreduce
one exact-3r 0 --ranks 3 -b 8 -e 16M -f 8
one random-3r-corrupt 3 --ranks 3 -b 1K -e 1K --op allreduce --algo one-shot --path store --data random --inject corrupt=1
mps_stop
tar -C "$L/.." -czf "$OUT/coll2-logs3.tgz" logs && rm -rf "$L"
