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

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../../scripts/lib/cli.sh
source "$root/scripts/lib/cli.sh"
# shellcheck source=../../scripts/lib/nvcc.sh
source "$root/scripts/lib/nvcc.sh"
fail() { echo "link-ceiling-build: error: $*" >&2; exit 1; }

out=$root/.gpu-link-ceiling
arch=90
while (($#)); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --out) need_value "$1" $#; out=$2; shift 2 ;;
    --arch) need_value "$1" $#; arch=$2; shift 2 ;;
    *) bad_option "$1" ;;
  esac
done
[[ $arch =~ ^[0-9]+$ ]] || { echo "link-ceiling-build: --arch '$arch': want a number such as 90" >&2; exit 2; }

nvcc=$(find_nvcc "$root")
[[ -n $nvcc ]] || fail "nvcc not found (set NVCC or CUDA_HOME, or install the PyPI CUDA 13 toolkit into .venv)"
command -v "${CXX:-g++}" >/dev/null || fail "no host C++ compiler (g++) for nvcc"
# shellcheck disable=SC2207  # "-L DIR" pairs, no spaces in them
cudalib=($(cuda_lib_dirs "$nvcc" libcudart_static.a))
mkdir -p "$out"
"$nvcc" -O3 -std=c++17 -gencode "arch=compute_$arch,code=sm_$arch" -o "$out/link_ceiling" \
  "$here/link_ceiling.cu" ${cudalib[@]+"${cudalib[@]}"} || fail "nvcc failed"
echo "link-ceiling-build: built $out/link_ceiling" >&2
