#!/usr/bin/env bash
# The fourth call: scripts/gpu-check.sh's verification matrix (8 B, 1 MiB,
# 64 MiB × thread, warp, block × put, store, ll) under MPS and without it,
# with the run3 build.   run4.sh DIR   (logs under $OUT/ll4)
set -uo pipefail
HERE=$(cd "${1:-$(dirname "$0")}" && pwd)
R="${OUT:-/tmp/out}/ll4"; mkdir -p "$R"
bash "$HERE/scripts/gpu-check.sh" --bundle "$HERE/bundle.tar.xz" --out "$R/mps" --mps >"$R/mps.txt" 2>&1
echo "gpu-check --mps exit $?" >>"$R/mps.txt"
bash "$HERE/scripts/gpu-check.sh" --bundle "$HERE/bundle.tar.xz" --out "$R/nomps" >"$R/nomps.txt" 2>&1
echo "gpu-check exit $?" >>"$R/nomps.txt"
rm -rf "$R/mps/bundle" "$R/nomps/bundle"
