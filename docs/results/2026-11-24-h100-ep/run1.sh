#!/usr/bin/env bash
# One GPU-machine call: ep before (main at 8db4797, before/ep) and after
# (bundle.tar.xz) beside each other, 2 ranks sharing one GPU under MPS, both
# modes and both paths; the high-throughput combine's sender/reducer split
# at 8, 12 (default) and 16 sending warps; simple_write's put and store
# bandwidth at the high-throughput combine's wire size (58.48 MB), block
# level, in the same call.
#   run.sh DIR   (DIR holds bundle.tar.xz, before/ep and scripts/lib/; logs tarred into $OUT)
set -uo pipefail
HERE=$(cd "${1:-$(dirname "$0")}" && pwd)
R=/tmp/epfast; rm -rf "$R"; mkdir -p "$R/bundle"
finish() { tar -C /tmp --exclude epfast/bundle -czf "${OUT:-/tmp}/epfast.tgz" epfast; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$R/gpu.txt" 2>&1
tar -C "$R/bundle" -xJf "$HERE/bundle.tar.xz"
NEW="$R/bundle/bin/ep"; OLD="$HERE/before/ep"; SW="$R/bundle/bin/simple_write"
export NIXL_LIB_DIR="$R/bundle/nixl/.nixl_cu13.mesonpy.libs" UCX_POSIX_USE_PROC_LINK=n NCCL_NVLS_ENABLE=0
source "$HERE/scripts/lib/mps.sh"
source "$HERE/scripts/lib/ports.sh"
ep() {  # ep BINARY TAG ARGS...
  local bin=$1 tag=$2; shift 2
  local t0=$SECONDS
  timeout 90 "$bin" --ranks 2 --gpus 1 --port "$(pick_port)" --timeout 8 --no-baseline "$@" \
    --json "$R/$tag.json" --csv "$R/$tag.csv" >"$R/$tag.out" 2>"$R/$tag.err"
  echo "== $tag: exit $? ($((SECONDS - t0)) s) :: $(basename "$(dirname "$bin")") $*" | tee -a "$R/summary.txt"
  sed -n '/^mode /,$p' "$R/$tag.out" >>"$R/summary.txt"
}
mps_start
ep "$NEW" ll-new-a --mode ll
ep "$OLD" ll-old-a --mode ll
ep "$NEW" ht-new-s12 --mode ht
ep "$OLD" ht-old --mode ht
ep "$NEW" ht-new-s8 --mode ht --combine-senders 8
ep "$NEW" ht-new-s16 --mode ht --combine-senders 16
ep "$OLD" ll-old-b --mode ll
ep "$NEW" ll-new-b --mode ll
timeout 90 "$SW" -m pair --timeout 20 -s 58480000 --level block --path put,store --no-baselines \
  --json "$R/sw-bw.json" --csv "$R/sw-bw.csv" >"$R/sw-bw.out" 2>"$R/sw-bw.err"
echo "== sw-bw: exit $?" | tee -a "$R/summary.txt"; sed -n '/^ *size /,$p' "$R/sw-bw.out" >>"$R/summary.txt"
mps_stop
