#!/usr/bin/env bash
# The second call (final numbers): the same-run before/after of the put and
# store paths (BEFORE = simple_write built from main at b4c4ea2, the commit
# this branch started from), the 8-byte ping-pong of every level and path
# (twice), a system-scope release everywhere, 64 and 256 MiB beside the copy
# engine, a finer crossover sweep, scripts/bench.sh --quick --mps, and without
# MPS every path for correctness.
#   run2.sh DIR   (DIR holds bundle.tar.xz, before/simple_write and scripts/; logs under $OUT/ll2)
set -uo pipefail
HERE=$(cd "${1:-$(dirname "$0")}" && pwd)
R="${OUT:-/tmp/out}/ll2"; mkdir -p "$R/bundle"
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
sw "$NEW" mps-bw --levels block -s 64M --path put,store,ll
sw "$OLD" mps-bw-before --levels block -s 64M --path put,store
sw "$NEW" mps-bw256 --levels block -s 256M --path put,store,ll
sw "$OLD" mps-bw256-before --levels block -s 256M --path put,store
sw "$NEW" mps-pp-sweep --pingpong -b 8 -e 64K -f 2 --levels warp,block --path store,ll
sw "$NEW" mps-corrupt --levels block -s 4096 --path ll --no-baselines --inject corrupt-data
mps_stop
bash "$HERE/scripts/bench.sh" --bundle "$HERE/bundle.tar.xz" --out "$R/bench-mps" --quick --mps >"$R/bench-mps.txt" 2>&1
echo "bench exit $?" >>"$R/bench-mps.txt"
rm -rf "$R/bench-mps/bundle"
sw "$NEW" nomps-pp8 --pingpong -s 8 --levels thread,warp,block --path put,store,ll --iters 20 --warmup 2
sw "$NEW" nomps-odd --levels thread,warp,block -s 12345 --path put,store,ll --iters 3 --no-baselines
rm -rf "$R/bundle"
