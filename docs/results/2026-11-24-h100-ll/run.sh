#!/usr/bin/env bash
# The matrix behind this folder, in one GPU-machine call: scripts/bench.sh
# --quick --mps (put, store and ll; floor row; crossover), then under MPS the
# 8-byte ping-pong of every level and path (twice), the same with a
# system-scope release everywhere, 64 MiB of each path beside the copy
# engine, odd sizes and an injected corruption; then without MPS (time
# slicing) every path and level for correctness.
#   run.sh DIR_WITH_bundle.tar.xz_AND_scripts/   (logs under $OUT/ll)
set -uo pipefail
HERE=$(cd "${1:-$(dirname "$0")}" && pwd)
R="${OUT:-/tmp/out}/ll"; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >"$R/gpu.txt" 2>&1
bash "$HERE/scripts/bench.sh" --bundle "$HERE/bundle.tar.xz" --out "$R/bench-mps" --quick --mps >"$R/bench-mps.txt" 2>&1
echo "bench exit $?" >>"$R/bench-mps.txt"
B="$R/bench-mps/bundle"; BIN="$B/bin"
export NIXL_LIB_DIR="$B/nixl/.nixl_cu13.mesonpy.libs" UCX_POSIX_USE_PROC_LINK=n
sw() {  # sw TAG ARGS...: one pair run, table on stdout, diagnostics on stderr
  local tag=$1; shift
  timeout 150 "$BIN/simple_write" -m pair --timeout 20 "$@" --json "$R/$tag.json" --csv "$R/$tag.csv" \
    >"$R/$tag.out" 2>"$R/$tag.err"
  echo "== $tag: exit $? :: $*" | tee -a "$R/summary.txt"
  sed -n '/^ *size /,$p' "$R/$tag.out" >>"$R/summary.txt"
}
source "$HERE/scripts/lib/mps.sh"
mps_start
sw mps-pp8-a --pingpong -s 8 --levels thread,warp,block --path put,store,ll
sw mps-pp8-b --pingpong -s 8 --levels thread,warp,block --path put,store,ll
sw mps-pp8-sysfence --pingpong -s 8 --levels thread,warp,block --path put,store --fence-scope system
sw mps-bw64m --levels block -s 64M --path put,store,ll
sw mps-odd-bw --levels thread,warp,block -s 12345 --path put,store,ll --no-baselines
sw mps-odd-pp --pingpong --levels thread,warp,block -s 1000 --path ll,store --no-baselines --no-floor
sw mps-corrupt --levels block -s 4096 --path ll --no-baselines --inject corrupt-data
mps_stop
sw nomps-pp8 --pingpong -s 8 --levels thread,warp,block --path put,store,ll --iters 20 --warmup 2
sw nomps-bw --levels block -s 1M --path put,store,ll --iters 20
sw nomps-odd --levels thread,warp -s 12345 --path ll --iters 3 --no-baselines
sw nomps-bw64m --levels block -s 64M --path put,store,ll --iters 50
rm -rf "$B"
