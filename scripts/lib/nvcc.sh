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
#   probe_build NAME "$@" the whole of bench/NAME/build.sh (bench/link-ceiling,
#                         bench/launch-floor): takes --out DIR (default
#                         <repo>/.gpu-NAME), --arch SM (default 90) and --help
#                         (the script's header), then compiles the one-file
#                         CUDA program bench/NAME/BIN.cu (BIN: NAME with '_'
#                         for '-') into DIR/BIN for sm_SM, the CUDA runtime
#                         static, so that it runs on a GPU machine without
#                         nvcc; exits 2 on a bad option, 1 naming what is
#                         missing. Needs scripts/lib/cli.sh sourced.

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

probe_build() {
  local name=$1 root here out arch=90 nvcc bin=${1//-/_} cudalib
  shift
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  here=$root/bench/$name
  out=$root/.gpu-$name
  while (($#)); do
    case $1 in
      -h|--help) usage; exit 0 ;;
      --out) need_value "$1" $#; out=$2; shift 2 ;;
      --arch) need_value "$1" $#; arch=$2; shift 2 ;;
      *) bad_option "$1" ;;
    esac
  done
  [[ $arch =~ ^[0-9]+$ ]] || { echo "$name-build: --arch '$arch': want a number such as 90" >&2; exit 2; }
  nvcc=$(find_nvcc "$root")
  [[ -n $nvcc ]] || { echo "$name-build: error: nvcc not found (set NVCC or CUDA_HOME, or install the PyPI CUDA 13" \
    "toolkit into .venv)" >&2; exit 1; }
  command -v "${CXX:-g++}" >/dev/null || { echo "$name-build: error: no host C++ compiler (g++) for nvcc" >&2; exit 1; }
  # shellcheck disable=SC2207  # "-L DIR" pairs, no spaces in them
  cudalib=($(cuda_lib_dirs "$nvcc" libcudart_static.a))
  mkdir -p "$out"
  "$nvcc" -O3 -std=c++17 -gencode "arch=compute_$arch,code=[sm_$arch,compute_$arch]" -o "$out/$bin" "$here/$bin.cu" \
    ${cudalib[@]+"${cudalib[@]}"} || { echo "$name-build: error: nvcc failed" >&2; exit 1; }
  echo "$name-build: built $out/$bin" >&2
}
