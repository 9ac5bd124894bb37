# shellcheck shell=bash
# nvcc for the scripts that build a CUDA program outside cargo
# (bench/nvshmem/build.sh, bench/link-ceiling/build.sh). Source it, then:
#
#   find_nvcc ROOT        prints nvcc's path, looking in $NVCC, $CUDA_HOME/bin,
#                         PATH, /usr/local/cuda/bin and ROOT's .venv (the PyPI
#                         CUDA 13 toolkit, nvidia/cu13); prints nothing if none
#   cuda_lib_dirs NVCC F  prints "-L DIR" for each of the toolkit's library
#                         folders that holds F (the PyPI toolkit keeps its static
#                         libraries in ../lib, where nvcc does not look)

find_nvcc() {
  local site cand
  site=$(compgen -G "$1/.venv/lib/python3*/site-packages" | head -1 || true)
  for cand in "${NVCC:-}" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" "$(command -v nvcc || true)" \
    /usr/local/cuda/bin/nvcc "${site:+$site/nvidia/cu13/bin/nvcc}"; do
    if [[ -n $cand && -x $cand ]]; then echo "$cand"; return; fi
  done
}

cuda_lib_dirs() {
  local d
  for d in "$(dirname "$1")/../lib64" "$(dirname "$1")/../lib"; do
    [[ -f $d/$2 ]] && echo "-L $(cd "$d" && pwd)"
  done
  return 0
}
