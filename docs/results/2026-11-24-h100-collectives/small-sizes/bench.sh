#!/usr/bin/env bash
# coll2's one GPU call: today's main (before.tar.xz) beside this branch
# (after.tar.xz), allreduce 8 B-64 KiB at 2, 3, 4 ranks on one GPU under
# MPS, stream and graph launches; then the after build's full matrix at 3
# ranks (both launches), an injected wrong element, and 64 MiB-1 GiB.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd); R=$(cd "$D/../.." && pwd)
L=${OUT:-/tmp/out}/logs; mkdir -p "$L"
for b in before after; do mkdir -p /tmp/$b && tar -C /tmp/$b -xJf "$D/$b.tar.xz"; done
export UCX_POSIX_USE_PROC_LINK=n NCCL_NVLS_ENABLE=0
source "$R/scripts/lib/mps.sh"; source "$R/scripts/lib/ports.sh"
nvidia-smi -L > "$L/gpu.txt"; mps_start
one() { # tag want bundle args...
  local tag=$1 want=$2 b=$3; shift 3; local t0=$SECONDS
  NIXL_LIB_DIR=/tmp/$b/nixl/.nixl_cu13.mesonpy.libs timeout 150 /tmp/$b/bin/collectives --port "$(pick_port)" \
    --gpus 1 --no-baseline --timeout 15 "$@" --json "$L/$tag.json" --csv "$L/$tag.csv" >"$L/$tag.out" 2>"$L/$tag.err"
  local rc=$?; echo "$tag exit $rc (want $want) in $((SECONDS - t0)) s" | tee -a "$L/driver.log"
}
S="--op allreduce --dtype f32 -b 8 -e 64K -f 2 -n 100"
for r in 2 3 4; do
  one before-${r}r 0 before --ranks $r $S
  one after-${r}r-stream 0 after --ranks $r $S --launch stream
  one after-${r}r-graph 0 after --ranks $r $S --launch graph
done
one after-3r-full-stream 0 after --ranks 3 -b 8 -e 16M -f 4
one after-3r-full-graph 0 after --ranks 3 -b 8 -e 16M -f 4 --launch graph --place both
one after-3r-corrupt 3 after --ranks 3 -b 1K -e 1K --algo ll --dtype bf16 --inject corrupt=1
one after-2r-1g 0 after --ranks 2 -b 64M -e 1G -f 4 --op allreduce --dtype f32 --algo two-shot --path store -n 10
mps_stop
tar -C "$L/.." -czf "$OUT/coll2-logs.tgz" logs; cat "$L/driver.log"
for f in "$L"/*-stream.out "$L"/before-*.out; do echo "== $f"; grep -E "^ +(8|1024|65536) " "$f" | head -20; done
