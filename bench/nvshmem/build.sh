#!/usr/bin/env bash
# Builds the NVSHMEM baseline (bench/nvshmem/nvshmem_bench.cu) on a machine with
# nvcc and the NVSHMEM headers and libraries; the binary runs on a GPU machine
# without either.
#
#   bench/nvshmem/build.sh [--out DIR] [--arch SM] [--bundle-libs]
#
# Compiles nvshmem_bench.cu with nvcc (-rdc=true), linking NVSHMEM's device
# library (libnvshmem_device.a) statically and libnvshmem_host.so.3
# dynamically (CUDA runtime static), into DIR (default: <repo>/.gpu-nvshmem).
#
#   --out DIR       output folder (created)
#   --arch SM       compute capability without the dot (default 90: H100/H200)
#   --bundle-libs   also copy libnvshmem_host.so.3 + nvshmem_bootstrap_uid.so.3
#                   into DIR/lib (about 41 MiB: too big for a 64 MiB transfer
#                   next to the rest; by default run.sh uses the GPU machine's
#                   pip package nvidia-nvshmem-cu13, the one torch depends on)
#
# Looks for nvcc in: $NVCC, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin, the
# repo's .venv (PyPI nvidia/cu13); for NVSHMEM in: $NVSHMEM_HOME, the repo's
# .venv (PyPI nvidia-nvshmem-cu13). Exits 1 saying what is missing, 2 on a
# bad option.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../../scripts/lib/cli.sh
source "$root/scripts/lib/cli.sh"
# shellcheck source=../../scripts/lib/nvcc.sh
source "$root/scripts/lib/nvcc.sh"
log() { echo "nvshmem-build: $*" >&2; }
fail() { echo "nvshmem-build: error: $*" >&2; exit 1; }

out=$root/.gpu-nvshmem
arch=90
bundle=0
while (($#)); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --out) need_value "$1" $#; out=$2; shift 2 ;;
    --arch) need_value "$1" $#; arch=$2; shift 2 ;;
    --bundle-libs) bundle=1; shift ;;
    *) bad_option "$1" ;;
  esac
done

site=$(compgen -G "$root/.venv/lib/python3*/site-packages" | head -1 || true)
nvcc=$(find_nvcc "$root")
[[ -n $nvcc ]] || fail "nvcc not found (set NVCC or CUDA_HOME, or install the PyPI CUDA 13 toolkit into .venv)"

nvshmem=
for cand in "${NVSHMEM_HOME:-}" "${site:+$site/nvidia/nvshmem}"; do
  if [[ -n $cand && -f $cand/include/nvshmem.h && -f $cand/lib/libnvshmem_device.a ]]; then nvshmem=$cand; break; fi
done
[[ -n $nvshmem ]] || fail "NVSHMEM not found: need include/nvshmem.h and lib/libnvshmem_device.a under \$NVSHMEM_HOME or .venv's nvidia/nvshmem (pip install nvidia-nvshmem-cu13)"
host_so=$nvshmem/lib/libnvshmem_host.so.3
[[ -f $host_so ]] || fail "$host_so missing"
command -v "${CXX:-g++}" >/dev/null || fail "no host C++ compiler (g++) for nvcc"

version=$(awk '/define NVSHMEM_VENDOR_(MAJOR|MINOR|PATCH)_VERSION/ {v = v (v ? "." : "") $3} END {print v}' \
  "$nvshmem/include/non_abi/nvshmem_version.h")
log "nvcc: $nvcc ($("$nvcc" --version | tail -1))"
log "NVSHMEM $version: $nvshmem"
log "arch sm_$arch -> $out"
mkdir -p "$out"
# shellcheck disable=SC2207  # "-L DIR" pairs, no spaces in them
cudalib=($(cuda_lib_dirs "$nvcc" libcudadevrt.a))

# -rdc=true: NVSHMEM's device API lives in libnvshmem_device.a and is device-linked in.
# $ORIGIN/lib comes after LD_LIBRARY_PATH (RUNPATH), for a --bundle-libs copy.
# shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker, not the shell
"$nvcc" -O3 -std=c++17 -rdc=true -gencode "arch=compute_$arch,code=sm_$arch" \
  -I "$nvshmem/include" -o "$out/nvshmem_bench" "$here/nvshmem_bench.cu" \
  ${cudalib[@]+"${cudalib[@]}"} -L "$nvshmem/lib" -lnvshmem_device -Xlinker "$host_so" \
  -Xlinker -rpath -Xlinker '$ORIGIN/lib' -Xlinker --enable-new-dtags \
  || fail "nvcc failed"

if ((bundle)); then
  mkdir -p "$out/lib"
  cp "$host_so" "$nvshmem/lib/nvshmem_bootstrap_uid.so.3" "$out/lib/"
  log "bundled $(du -sh "$out/lib" | cut -f1) of NVSHMEM libraries in $out/lib"
fi
printf 'nvshmem_version=%s\narch=sm_%s\nnvcc=%s\n' "$version" "$arch" "$nvcc" >"$out/BUILD_INFO"
log "built $out/nvshmem_bench ($(du -h "$out/nvshmem_bench" | cut -f1))"
