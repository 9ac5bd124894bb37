#!/usr/bin/env bash
# The third call: the put path's acknowledgement as a bare flag. The 8-byte
# ping-pong of every level and path (twice) beside the build this branch
# started from (before/simple_write, main at b4c4ea2), a system-scope release
# everywhere, bench.sh --quick --mps, and without MPS the 8-byte matrix.
#   run3.sh DIR   (DIR holds bundle.tar.xz, before/simple_write and scripts/; logs under $OUT/ll3)
set -uo pipefail
HERE=$(cd "${1:-$(dirname "$0")}" && pwd)
R="${OUT:-/tmp/out}/ll3"; mkdir -p "$R/bundle"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$R/gpu.txt" 2>&1
tar -C "$R/bundle" -xJf "$HERE/bundle.tar.xz"
NEW="$R/bundle/bin/simple_write"; OLD="$HERE/before/simple_write"
export NIXL_LIB_DIR="$R/bundle/nixl/.nixl_cu13.mesonpy.libs" UCX_POSIX_USE_PROC_LINK=n
sw() {  # sw BINARY TAG ARGS...
  local bin=$1 tag=$2; shift 2
  timeout 150 "$bin" -m pair --timeout 20 "$@" --json "$R/$tag.json" --csv "$R/$tag.csv" >"$R/$tag.out" 2>"$R/$tag.err"
  echo "== $tag: exit $? :: $(basename "$(dirname "$(dirname "$bin")")") $*" | tee -a "$R/summary.txt"
  sed -n '/^ *size /,$p' "$R/$tag.out" >>"$R/summary.txt"
}
source "$HERE/scripts/lib/mps.sh"
mps_start
sw "$NEW" mps-pp8-a --pingpong -s 8 --levels thread,warp,block --path put,store,ll
sw "$OLD" mps-pp8-before --pingpong -s 8 --levels thread,warp,block --path put,store
sw "$NEW" mps-pp8-b --pingpong -s 8 --levels thread,warp,block --path put,store,ll
sw "$NEW" mps-pp8-sysfence --pingpong -s 8 --levels thread,warp,block --path put,store --fence-scope system
sw "$OLD" mps-pp8-before-b --pingpong -s 8 --levels thread,warp,block --path put,store
sw "$NEW" mps-bw --levels block -s 64M --path put,store,ll
mps_stop
bash "$HERE/scripts/bench.sh" --bundle "$HERE/bundle.tar.xz" --out "$R/bench-mps" --quick --mps >"$R/bench-mps.txt" 2>&1
echo "bench exit $?" >>"$R/bench-mps.txt"
rm -rf "$R/bench-mps/bundle"
sw "$NEW" nomps-pp8 --pingpong -s 8 --levels thread,warp,block --path put,store,ll --iters 20 --warmup 2
rm -rf "$R/bundle"
