#!/usr/bin/env bash
# Builds bench/link-ceiling/link_ceiling.cu, what SMs can move over NVLink
# beside the copy engine (16-byte stores, streaming stores, the SM's
# bulk-copy engine, loads by the receiving GPU; one way between two GPUs,
# and all-to-all among 2 .. all GPUs), on a machine with nvcc; the binary runs on a GPU machine without it
# (CUDA runtime static):
#
#   bench/link-ceiling/build.sh [--out DIR] [--arch SM]
#   DIR/link_ceiling          # on a machine with two or more GPUs; prints two tables
#
#   --out DIR   output folder (created; default <repo>/.gpu-link-ceiling)
#   --arch SM   compute capability without the dot (default 90: H100/H200;
#               the bulk copy needs 90 or newer)
#
# Looks for nvcc in: $NVCC, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin, the
# repo's .venv (PyPI nvidia/cu13). Exits 1 saying what is missing, 2 on a
# bad option.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../../scripts/lib/cli.sh
source "$root/scripts/lib/cli.sh"
# shellcheck source=../../scripts/lib/nvcc.sh
source "$root/scripts/lib/nvcc.sh"
probe_build link-ceiling "$@"
