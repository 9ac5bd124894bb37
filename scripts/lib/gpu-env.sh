# Sourced by the GPU-machine scripts (gpu-check, bench, gpu-faults): turns
# the bundle from scripts/gpu-bundle.sh (or --bin/--nixl-lib) into BIN and
# NIXL_LIB_DIR, and sets the environment every run needs.
#
# Expects BUNDLE, BIN, NIXL_LIB, OUT set by the caller's option parsing and
# NAME for messages. Sets NGPU.
# Nothing here can run without a GPU: say so and stop (non-zero), rather
# than fail every run, or pass rows that never ran.
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if ((NGPU < 1)); then
  echo "$NAME: no NVIDIA GPU on this machine (nvidia-smi lists none): run it on a GPU machine" >&2
  exit 1
fi
mkdir -p "$OUT"
if [[ -z "$BIN" ]]; then
  [[ -f "$BUNDLE" ]] || { echo "$NAME: no bundle at $BUNDLE: run scripts/gpu-bundle.sh where cargo is, or pass --bin and --nixl-lib" >&2; exit 1; }
  rm -rf "$OUT/bundle"; mkdir -p "$OUT/bundle"; tar -C "$OUT/bundle" -xJf "$BUNDLE" || exit 1
  BIN="$OUT/bundle/bin"; NIXL_LIB="$OUT/bundle/nixl/.nixl_cu13.mesonpy.libs"
fi
export NIXL_LIB_DIR="${NIXL_LIB:-${NIXL_LIB_DIR:-}}"
# Containers: UCX would open the peer's /proc/<pid>/fd links. NVLink
# multicast stays off on shared machines.
export UCX_POSIX_USE_PROC_LINK=n NCCL_NVLS_ENABLE=0
