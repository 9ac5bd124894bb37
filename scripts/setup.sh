#!/usr/bin/env bash
# Installs everything the project builds and tests against, into folders of
# the project (.venv, .deps) plus a few Debian packages. Idempotent: a second
# run checks and returns in about a second.
#
#   scripts/setup.sh                     NIXL, nvcc, UCX device headers, NIXL's
#                                        device header, libtorch, etcd
#   scripts/setup.sh --full-torch        also a complete PyTorch in .venv, so the
#                                        tests talk to Python's TCPStore and
#                                        launch ranks with torchrun
#   scripts/setup.sh --no-header-download  never download NIXL's device header
#                                        (also: NIXL_HEADERS_DOWNLOAD=0)
#   scripts/setup.sh --headers-only      only the NIXL device header step
#
# What lands where:
#   .venv/                         Python venv with nixl-cu13 (libnixl*.so, UCX
#                                  plugin), nvcc 13.0, libucx-cu13 (UCX headers)
#   .deps/nixl-include/            NIXL v1.4.0's nixl_device.cuh + nixl_types.h,
#                                  SHA-256 checked (NIXL_HEADERS_URL: another base)
#   .deps/nixl-include-next/       upstream main's backend-neutral gpu/nixl_device.cuh
#                                  layout, only for the test that compiles the
#                                  kernels against both layouts
#   .deps/libtorch/torch/{include,lib}  libtorch_cpu + libc10 + headers from the
#                                  torch wheel (LIBTORCH for the libtorch store)
#   /usr/bin/etcd                  Debian etcd-server, for the etcd metadata path
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
DEPS="$ROOT/.deps"
FULL_TORCH=0
HEADERS_ONLY=0
HEADER_DOWNLOAD="${NIXL_HEADERS_DOWNLOAD:-1}"
for arg in "$@"; do
  case "$arg" in
    --full-torch) FULL_TORCH=1 ;;
    --no-header-download) HEADER_DOWNLOAD=0 ;;
    --headers-only) HEADERS_ONLY=1 ;;
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
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
PY=${PYTHON:-python3}
t0=$(date +%s)

# --- Debian packages -------------------------------------------------------
# libclang: bindgen (nixl-sys, the libtorch shim). etcd-server: NIXL's etcd
# metadata exchange in the tests. g++: the libtorch shim.
# The etcd *service* (not any etcd process): systemd's unit, or the Debian
# init script's pidfile where there is no systemd (containers).
ETCD_PIDFILE=/run/etcd.pid
etcd_service_active() {
  if [[ -d /run/systemd/system ]]; then
    systemctl is-active --quiet etcd 2>/dev/null
  else
    local pid; pid=$(cat "$ETCD_PIDFILE" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ && -d /proc/$pid ]]
  fi
}
# Stops the service Debian's postinst started: the unit, or the one process
# named by the init script's pidfile, and only if it is /usr/bin/etcd. Never
# by name (the init script's own stop also kills every /usr/bin/etcd by
# path, so it is not used), so a user's own etcd and the tests' keep running.
stop_etcd_service() {
  if [[ -d /run/systemd/system ]]; then
    $SUDO systemctl stop etcd || say "etcd: could not stop the etcd service the install started (systemctl stop etcd)"
  elif [[ -s $ETCD_PIDFILE ]]; then
    $SUDO start-stop-daemon --stop --quiet --oknodo --pidfile "$ETCD_PIDFILE" \
      --exec /usr/bin/etcd --retry TERM/10/KILL/5 ||
      say "etcd: could not stop the etcd service the install started (pid $(cat "$ETCD_PIDFILE"))"
  fi
}

apt_step() {
  local need_apt=() etcd_fresh=0
  [[ -e /usr/lib/llvm-14/lib/libclang.so || -n "$(ls /usr/lib/llvm-*/lib/libclang.so 2>/dev/null)" ]] || need_apt+=(libclang-dev)
  command -v etcd >/dev/null || need_apt+=(etcd-server)
  command -v g++ >/dev/null || need_apt+=(g++)
  # python3 -m venv needs ensurepip, a separate package on Debian and Ubuntu.
  "$PY" -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
  if ((${#need_apt[@]} == 0)); then
    say "apt: libclang, etcd, g++, python3-venv already present"
    return
  fi
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  # Debian starts etcd as a service on install; the tests start their own.
  # Stop it afterwards only if this run installs the package and no etcd
  # service was running before: then whatever runs now, this run started.
  if [[ " ${need_apt[*]} " == *" etcd-server "* ]] &&
    [[ "$(dpkg-query -W -f='${db:Status-Status}' etcd-server 2>/dev/null)" != installed ]] &&
    ! etcd_service_active; then
    etcd_fresh=1
  fi
  say "apt: installing ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  if ((etcd_fresh)) && etcd_service_active; then
    say "etcd: stopping the etcd service the package install just started (the tests start their own)"
    stop_etcd_service
  fi
}

# --- Python venv with NIXL, nvcc, UCX headers --------------------------------
venv_step() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating $VENV"
    "$PY" -m venv "$VENV"
  fi
  local stamp="$VENV/.setup-stamp" want
  want="$(printf '%s\n' "${PY_PACKAGES[@]}")"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    say "pip: installing ${PY_PACKAGES[*]} (no deps: nixl-cu13 declares torch, which its libraries do not need)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${PY_PACKAGES[@]}"
    printf '%s' "$want" > "$stamp"
  else
    say "pip: pinned packages already installed"
  fi
  SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
}

# --- libtorch (c10d TCPStore) from the torch wheel ---------------------------
# PyPI has no CPU-only torch wheel; unpacking only libtorch_cpu, libc10 and
# the headers (about 0.5 GB, seconds) is enough for c10d::TCPStore.
LT="$DEPS/libtorch"
libtorch_step() {
  if [[ -f "$LT/.version" && "$(cat "$LT/.version")" == "$TORCH_VERSION" ]]; then
    say "libtorch $TORCH_VERSION already unpacked"
    return
  fi
  mkdir -p "$DEPS/wheels"
  local whl
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
}

# --- optional: a complete PyTorch for Python TCPStore interop tests ----------
full_torch_step() {
  if "$VENV/bin/python" -c "import torch.distributed" 2>/dev/null; then
    say "full torch already importable"
  else
    say "pip: installing torch==$TORCH_VERSION with its dependencies (several GB)"
    # Not fatal: the tests that need it (Python's TCPStore, torchrun across
    # two loopback nodes) say SKIP with the reason when torch is missing.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" ||
      say "WARNING: could not install torch==$TORCH_VERSION; tests needing it will SKIP"
  fi
}

# --- NIXL's device header: on no registry, two files from its repository ----
# shellcheck source=lib/nixl-headers.sh
source "$ROOT/scripts/lib/nixl-headers.sh"
# shellcheck source=lib/nixl-headers-next.sh
source "$ROOT/scripts/lib/nixl-headers-next.sh"

# --- UCX: the device headers' version against the one NIXL's wheel bundles ---
# PyPI's newest libucx-cu13 is 1.22.0 while nixl-cu13 1.5.1 bundles a 1.23
# development build; build/cuda_kernels.rs says why that is safe.
ucx_versions() {
  local hdr rt
  hdr=$(sed -n 's/^#define UCP_API_\(MAJOR\|MINOR\) *\([0-9]*\).*/\2/p' \
    "$SITE/libucx/include/ucp/api/ucp_version.h" 2>/dev/null | paste -sd.) || true
  rt=$("$VENV/bin/python" - "$SITE" 2>/dev/null <<'PYEOF' || true
import ctypes, glob, sys
lib = sorted(glob.glob(sys.argv[1] + "/nixl_cu1[23].libs/libucp*.so*"))[0]
f = ctypes.CDLL(lib).ucp_get_version_string
f.restype = ctypes.c_char_p
print(f().decode())
PYEOF
)
  printf 'device headers %s, NIXL'"'"'s bundled UCX %s' "${hdr:-unknown}" "${rt:-unknown}"
  if [[ -z $hdr || $rt != "$hdr".* ]]; then
    printf ': they differ; each memory view'"'"'s layout version is checked when it is prepared (build/cuda_kernels.rs)'
  fi
}

report() {
  local libs="$SITE/.nixl_cu13.mesonpy.libs"
  cat >&2 <<REPORT
[setup] done in $(( $(date +%s) - t0 )) s
[setup]   NIXL libraries   $libs (found at run time; no LD_LIBRARY_PATH needed)
[setup]   NIXL plugins     $libs/plugins
[setup]   nvcc             $SITE/nvidia/cu13/bin/nvcc
[setup]   UCX headers      $SITE/libucx/include ($(ucx_versions))
[setup]   NIXL dev header  $HEADER_STATUS
[setup]   libtorch         $LT/torch (LIBTORCH for --features libtorch)
[setup]   etcd             $(command -v etcd || echo missing)
REPORT
}

if ((HEADERS_ONLY)); then
  nixl_headers_step
  exit 0
fi
apt_step
venv_step
libtorch_step
if ((FULL_TORCH)); then full_torch_step; fi
nixl_headers_step
nixl_next_headers_step
report
