#!/usr/bin/env bash
# The main job: simple_write's initiator and target on this machine's GPU(s).
# On a machine without a GPU it says so and runs the host-API example
# (two_proc) instead.
#
#   scripts/run_simple_write.sh [simple_write options...]
#
# Options go to the initiator (which decides sizes, levels, iterations);
# --host/--port/--timeout/--store also go to the target, --target-gpu N picks
# the target's GPU. Set SIMPLE_WRITE_BIN to a built binary to skip building
# (a GPU machine without cargo). Exit status: non-zero if either process failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { printf '[run] %s\n' "$*" >&2; }

INIT_ARGS=(); TARGET_ARGS=()
while (($#)); do
  case "$1" in
    --target-gpu) TARGET_ARGS+=(--gpu "$2"); shift 2 ;;
    --host|--port|-p|--timeout|-t|--store) INIT_ARGS+=("$1" "$2"); TARGET_ARGS+=("$1" "$2"); shift 2 ;;
    --host=*|--port=*|--timeout=*|--store=*) INIT_ARGS+=("$1"); TARGET_ARGS+=("$1"); shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) INIT_ARGS+=("$1"); shift ;;
  esac
done

has_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

# Containers: UCX's shared-memory transport otherwise opens /proc/<pid>/fd
# links of the peer and gets "Permission denied".
export UCX_POSIX_USE_PROC_LINK="${UCX_POSIX_USE_PROC_LINK:-n}"

if [[ -z "${SIMPLE_WRITE_BIN:-}" ]]; then
  scripts/setup.sh >/dev/null 2>&1 || scripts/setup.sh || exit 1
fi

if ! has_gpu; then
  log "no NVIDIA GPU on this machine (nvidia-smi finds none): simple_write needs one."
  log "running the host-API example instead: two NIXL agents, two processes, DRAM, READ + WRITE with notifications"
  cargo run --quiet --release --example two_proc -- "${TARGET_ARGS[@]}"
  exit $?
fi

BIN="${SIMPLE_WRITE_BIN:-}"
if [[ -z "$BIN" ]]; then
  cargo build --quiet --release --bin simple_write || exit 1
  BIN="$ROOT/target/release/simple_write"
fi

"$BIN" --mode initiator "${INIT_ARGS[@]}" &
ipid=$!
# The initiator hosts the store; the target retries its connection until it is up.
"$BIN" --mode target "${TARGET_ARGS[@]}"
trc=$?
wait "$ipid"; irc=$?
if ((irc != 0 || trc != 0)); then
  log "failed: initiator exit $irc, target exit $trc"
  ((irc != 0)) && exit "$irc"
  exit "$trc"
fi
