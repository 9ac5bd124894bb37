#!/usr/bin/env bash
# The main job: simple_write's initiator and target on this machine's GPU(s),
# started together by `simple_write --mode pair` (one process hosts the store
# on a free port and runs both roles as its children). On a machine without
# a GPU it says so and runs the host-API example (two_proc) instead.
#
#   scripts/run_simple_write.sh [--mps] [simple_write options...]
#
#   --mps    both roles on one GPU under a private MPS daemon, stopped after
#            (see scripts/lib/mps.sh; with two GPUs add --target-gpu 0)
#
# Other options go to simple_write (see `simple_write --help`), e.g.
# --size 64M --level block --path put,store --target-gpu 1. Set
# SIMPLE_WRITE_BIN to a built binary to skip building (a GPU machine without
# cargo). Exit status: simple_write's (0 ok, 1 failure, 2 usage, 3 mismatch).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
log() { printf '[run] %s\n' "$*" >&2; }

MPS=0; ARGS=()
for a in "$@"; do
  case "$a" in
    --mps) MPS=1 ;;
    -h|--help) usage; exit 0 ;;
    *) ARGS+=("$a") ;;
  esac
done

has_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

# Containers: UCX's shared-memory transport otherwise opens /proc/<pid>/fd
# links of the peer and gets "Permission denied".
export UCX_POSIX_USE_PROC_LINK="${UCX_POSIX_USE_PROC_LINK:-n}"

if [[ -z "${SIMPLE_WRITE_BIN:-}" ]]; then
  scripts/setup.sh >/dev/null 2>&1 || scripts/setup.sh || exit 1
fi

BIN="${SIMPLE_WRITE_BIN:-}"
if [[ -z "$BIN" ]]; then
  cargo build --quiet --release --bin simple_write || exit 1
  BIN="$ROOT/target/release/simple_write"
fi
# The options first, GPU or not: simple_write's own parser checks every
# one given before a trailing --help (an unknown option or a bad value
# exits 2 with clap's message), and nothing runs.
if ((${#ARGS[@]})); then
  "$BIN" --mode pair "${ARGS[@]}" --help >/dev/null || exit $?
fi

if ! has_gpu; then
  log "no NVIDIA GPU on this machine (nvidia-smi finds none): simple_write needs one."
  ((${#ARGS[@]})) && log "(so these simple_write options go unused: ${ARGS[*]})"
  log "running the host-API example instead: two NIXL agents, two processes, DRAM, READ + WRITE with notifications"
  cargo run --quiet --release --example two_proc -- --port 0
  exit $?
fi
if ((MPS)); then
  # shellcheck source=lib/mps.sh
  source "$ROOT/scripts/lib/mps.sh"
  mps_start || exit 1
  "$BIN" --mode pair --target-gpu 0 "${ARGS[@]}"; rc=$?
  mps_stop
  exit $rc
fi
exec "$BIN" --mode pair "${ARGS[@]}"
