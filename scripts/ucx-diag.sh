#!/usr/bin/env bash
# Runs one small simple_write pair with UCX debug logging and extracts what
# decides whether a device lane exists: transports, endpoint lanes, rkeys.
#
#   scripts/ucx-diag.sh BIN_DIR OUT_DIR [simple_write args...]
#
# BIN_DIR holds simple_write; the logs and their extracts land in OUT_DIR.
# Needs a GPU machine.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  -*) bad_option "$1" ;;
  "") echo "ucx-diag.sh: BIN_DIR and OUT_DIR are needed (try --help)" >&2; exit 2 ;;
esac
(($# >= 2)) || { echo "ucx-diag.sh: OUT_DIR is needed after BIN_DIR (try --help)" >&2; exit 2; }
[[ -x "$1/simple_write" ]] || { echo "ucx-diag.sh: no simple_write in $1" >&2; exit 2; }
nvidia-smi -L 2>/dev/null | grep -q '^GPU' || {
  echo "ucx-diag.sh: no NVIDIA GPU on this machine (nvidia-smi lists none): run it on a GPU machine" >&2; exit 1; }
BIN=$1; OUT=$2; shift 2
mkdir -p "$OUT"
export UCX_LOG_LEVEL=${UCX_LOG_LEVEL:-debug} UCX_POSIX_USE_PROC_LINK=n
port=$((30000 + RANDOM % 20000))
"$BIN/simple_write" -m initiator -p $port -s 8 -l block --iters 1 --warmup 0 -t 15 "$@" >"$OUT/i.out" 2>"$OUT/i.err" &
sleep 0.3
"$BIN/simple_write" -m target -p $port -t 15 >"$OUT/t.out" 2>"$OUT/t.err"
echo "target rc=$?"; wait; echo "initiator rc=$?"
for f in i t; do
  cat "$OUT/$f.out" "$OUT/$f.err" > "$OUT/$f.all"
  grep -iE "ep_cfg|lane|cuda_ipc|device ep|rkey|md_map|reachab|select|fail|error|warn" "$OUT/$f.all" | grep -v "^\s*$" | head -150 > "$OUT/$f.grep"
  wc -l "$OUT/$f.all"
done
