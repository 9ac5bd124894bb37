#!/usr/bin/env bash
# Installs everything the project builds and tests against, into folders of
# the project (.venv, .deps) plus a few Debian packages. Idempotent: a second
# run checks and returns in about a second.
#
#   scripts/setup.sh               NIXL, nvcc, UCX device headers, libtorch, etcd
#   scripts/setup.sh --full-torch  also a complete PyTorch in .venv, so the tests
#                                  talk to Python's torch.distributed.TCPStore
#
# What lands where:
#   .venv/                         Python venv with nixl-cu13 (libnixl*.so, UCX
#                                  plugin), nvcc 13.0, libucx-cu13 (UCX headers)
#   .deps/libtorch/torch/{include,lib}  libtorch_cpu + libc10 + headers from the
#                                  torch wheel (LIBTORCH for the libtorch store)
#   /usr/bin/etcd                  Debian etcd-server, for the etcd metadata path
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
DEPS="$ROOT/.deps"
FULL_TORCH=0
for arg in "$@"; do
  case "$arg" in
    --full-torch) FULL_TORCH=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

TORCH_VERSION=2.11.0
# Pinned to what the GPU machines run (driver 580 / CUDA 13.0) and to the
# NIXL release the device examples were proven against.
PY_PACKAGES=(
  nixl-cu13==1.5.1
  libucx-cu13==1.22.0
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-cupti==13.0.85
  numpy
)

say() { printf '[setup] %s\n' "$*" >&2; }
t0=$(date +%s)

# --- Debian packages -------------------------------------------------------
# libclang: bindgen (nixl-sys, the libtorch shim). etcd-server: NIXL's etcd
# metadata exchange in the tests.
need_apt=()
[[ -e /usr/lib/llvm-14/lib/libclang.so || -n "$(ls /usr/lib/llvm-*/lib/libclang.so 2>/dev/null)" ]] || need_apt+=(libclang-dev)
command -v etcd >/dev/null || need_apt+=(etcd-server)
command -v g++ >/dev/null || need_apt+=(g++)
if ((${#need_apt[@]})); then
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  say "apt: installing ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Debian starts etcd as a service on install; the tests start their own.
  if [[ " ${need_apt[*]} " == *" etcd-server "* ]]; then
    $SUDO systemctl stop etcd 2>/dev/null || $SUDO service etcd stop 2>/dev/null || pkill -x etcd 2>/dev/null || true
  fi
else
  say "apt: libclang, etcd, g++ already present"
fi

# --- Python venv with NIXL, nvcc, UCX headers --------------------------------
PY=${PYTHON:-python3}
if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.setup-stamp"
want="$(printf '%s\n' "${PY_PACKAGES[@]}")"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  say "pip: installing ${PY_PACKAGES[*]} (no deps: nixl-cu13 declares torch, which its libraries do not need)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${PY_PACKAGES[@]}"
  printf '%s' "$want" > "$stamp"
else
  say "pip: pinned packages already installed"
fi
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# --- libtorch (c10d TCPStore) from the torch wheel ---------------------------
# PyPI has no CPU-only torch wheel; unpacking only libtorch_cpu, libc10 and
# the headers (about 0.5 GB, seconds) is enough for c10d::TCPStore.
LT="$DEPS/libtorch"
if [[ ! -f "$LT/.version" || "$(cat "$LT/.version")" != "$TORCH_VERSION" ]]; then
  mkdir -p "$DEPS/wheels"
  whl=$(ls "$DEPS"/wheels/torch-"$TORCH_VERSION"-*.whl 2>/dev/null | head -1 || true)
  if [[ -z "$whl" ]]; then
    say "pip: downloading torch==$TORCH_VERSION wheel (about 530 MB) for libtorch"
    "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
      "torch==$TORCH_VERSION" -d "$DEPS/wheels"
    whl=$(ls "$DEPS"/wheels/torch-"$TORCH_VERSION"-*.whl | head -1)
  fi
  say "unpacking libtorch_cpu, libc10, headers from $(basename "$whl")"
  rm -rf "$LT"; mkdir -p "$LT"
  "$VENV/bin/python" - "$whl" "$LT" <<'PYEOF'
import sys, zipfile
whl, dest = sys.argv[1:]
keep = {"torch/lib/libtorch_cpu.so", "torch/lib/libc10.so", "torch/lib/libgomp.so.1"}
z = zipfile.ZipFile(whl)
z.extractall(dest, [n for n in z.namelist() if n.startswith("torch/include/") or n in keep])
PYEOF
  # libtorch_cpu's RPATH looks in $ORIGIN/../../nvidia/cu13/lib for the CUDA
  # runtime and CUPTI it links (unused without a GPU, but loaded).
  ln -sfn "$SITE/nvidia" "$LT/nvidia"
  echo "$TORCH_VERSION" > "$LT/.version"
  rm -f "$DEPS"/wheels/torch-*.whl   # 530 MB we no longer need
else
  say "libtorch $TORCH_VERSION already unpacked"
fi

# --- optional: a complete PyTorch for Python TCPStore interop tests ----------
if ((FULL_TORCH)); then
  if "$VENV/bin/python" -c "import torch.distributed" 2>/dev/null; then
    say "full torch already importable"
  else
    say "pip: installing torch==$TORCH_VERSION with its dependencies (several GB)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
  fi
fi

# --- report -------------------------------------------------------------------
NIXL_LIBS="$SITE/.nixl_cu13.mesonpy.libs"
cat >&2 <<REPORT
[setup] done in $(( $(date +%s) - t0 )) s
[setup]   NIXL libraries   $NIXL_LIBS (found at run time; no LD_LIBRARY_PATH needed)
[setup]   NIXL plugins     $NIXL_LIBS/plugins
[setup]   nvcc             $SITE/nvidia/cu13/bin/nvcc
[setup]   UCX headers      $SITE/libucx/include
[setup]   libtorch         $LT/torch (LIBTORCH for --features libtorch)
[setup]   etcd             $(command -v etcd || echo missing)
[setup]   NIXL device header: not on any registry; point NIXL_INCLUDE_DIR (or NIXL_PREFIX)
[setup]   at a NIXL install to build the GPU kernels (see README).
REPORT
