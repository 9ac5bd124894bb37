#!/usr/bin/env bash
# The third GPU-machine call: ep before (main at 8db4797, before/ep), the
# second build of this branch (v2/ep, 756dbed: our own combine share reduced
# from y but still copied into combine_recv) and the final one
# (bundle.tar.xz: the own share never copied) beside each other, 2 ranks sharing one GPU under MPS, both
# modes and both paths, the high-throughput combine at 16 (default) and 12
# sending warps; skewed routing, an odd shape and 3 ranks for correctness;
# simple_write's put and store
# bandwidth at the high-throughput combine's wire size (58.48 MB), block
# level, in the same call.
#   run.sh DIR   (DIR holds bundle.tar.xz, before/ep, v2/ep and scripts/lib/; logs tarred into $OUT)
set -uo pipefail
HERE=$(cd "${1:-$(dirname "$0")}" && pwd)
R=/tmp/epfast; rm -rf "$R"; mkdir -p "$R/bundle"
finish() { tar -C /tmp --exclude epfast/bundle -czf "${OUT:-/tmp}/epfast.tgz" epfast; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$R/gpu.txt" 2>&1
tar -C "$R/bundle" -xJf "$HERE/bundle.tar.xz"
NEW="$R/bundle/bin/ep"; OLD="$HERE/before/ep"; V2="$HERE/v2/ep"; SW="$R/bundle/bin/simple_write"
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
ep "$V2" ll-v2 --mode ll
ep "$NEW" ht-new-a --mode ht
ep "$OLD" ht-old-a --mode ht
ep "$V2" ht-v2-s16 --mode ht --combine-senders 16
ep "$NEW" ht-new-s12 --mode ht --combine-senders 12
ep "$OLD" ht-old-b --mode ht
ep "$NEW" ht-new-b --mode ht
ep "$OLD" ll-old-b --mode ll
ep "$NEW" ll-new-b --mode ll
ep "$NEW" ht-skewed --mode ht --routing skewed --iters 10 --warmup 2
ep "$NEW" ll-skewed --mode ll --routing skewed
ep "$NEW" ht-odd --mode ht --tokens 1000 --hidden 1000 --iters 10 --warmup 2
timeout 90 "$NEW" --ranks 3 --gpus 1 --experts 255 --mode ht --iters 10 --warmup 2 --timeout 8 --no-baseline \
  --json "$R/ht-3r.json" >"$R/ht-3r.out" 2>"$R/ht-3r.err"
echo "== ht-3r: exit $?" | tee -a "$R/summary.txt"; sed -n '/^mode /,$p' "$R/ht-3r.out" >>"$R/summary.txt"
timeout 90 "$NEW" --ranks 3 --gpus 1 --experts 255 --mode ll --timeout 8 --no-baseline \
  --json "$R/ll-3r.json" >"$R/ll-3r.out" 2>"$R/ll-3r.err"
echo "== ll-3r: exit $?" | tee -a "$R/summary.txt"; sed -n '/^mode /,$p' "$R/ll-3r.out" >>"$R/summary.txt"
ep "$NEW" ll-corrupt-combine --mode ll --iters 4 --warmup 1 --inject corrupt=combine
ep "$NEW" ht-corrupt-combine --mode ht --iters 4 --warmup 1 --inject corrupt=combine
timeout 90 "$SW" -m pair --timeout 20 -s 58480000 --level block --path put,store --no-baselines \
  --json "$R/sw-bw.json" --csv "$R/sw-bw.csv" >"$R/sw-bw.out" 2>"$R/sw-bw.err"
echo "== sw-bw: exit $?" | tee -a "$R/summary.txt"; sed -n '/^ *size /,$p' "$R/sw-bw.out" >>"$R/summary.txt"
mps_stop
finish
