#!/usr/bin/env bash
# two H200s: the elastic matrix (3-cycle kill loops) and die-mid-dispatch, ranks r on GPU r mod 2
set -uo pipefail
OUT=${OUT:-/tmp/out}; B=/tmp/bf; W=/tmp/pair; mkdir -p "$OUT" "$B" "$W/m"
tar -C "$B" -xJf .gpu/lead/bundle.tar.xz || exit 1
export NIXL_LIB_DIR="$B/nixl/.nixl_cu13.mesonpy.libs" UCX_POSIX_USE_PROC_LINK=n NCCL_NVLS_ENABLE=0
nvidia-smi topo -m > "$W/topo.txt" 2>&1
# two ranks per GPU: one MPS daemon for both GPUs, so that they run side by side
source scripts/lib/mps.sh && mps_start
P=tests/fixtures/elastic/expansion_fault_contraction.json
for path in put store; do
  echo "== die-mid-dispatch ll $path (4 ranks on 2 GPUs)"
  timeout 120 "$B/bin/ep" --plan $P --gpus 2 --mode ll --path $path --iters 20 --warmup 3 --inject die-mid-dispatch --port 0 > "$W/dmd-$path.out" 2> "$W/dmd-$path.err"; echo "exit $?"
  grep -hE "ranks gone" "$W/dmd-$path.out" | head -1 | cut -c1-200
done
timeout 330 scripts/run_elastic.sh --bin "$B/bin" --nixl-lib "$NIXL_LIB_DIR" --out "$W/m" --modes "ll ht" --cycles 3 --no-mps 2>&1 | tail -25
mps_stop
cd "$W" && tar -czf "$OUT/pair.tgz" --exclude='*/bundle*' . && ls -la "$OUT"
