#!/usr/bin/env bash
# Runs simple_write's verification matrix on a GPU machine and prints one
# table: sizes 8 B, 1 MiB and 64 MiB at thread, warp and block level, on
# all four data paths (nixlPut, stores through nixlGetPtr, LL and LL128 lines;
# LL128 at warp and block level only), both processes
# on one GPU, and GPU 0 -> GPU 1 when there are two.
#
#   bench/gpu-check.sh [--bundle FILE] [--bin DIR] [--nixl-lib DIR] [--sizes "8 1M 64M"]
#                        [--paths put,store,ll,ll128] [--mps] [--out DIR] [-- simple_write options]
#
#   --mps   the same-GPU rows under a private MPS daemon (scripts/lib/mps.sh)
#
# Needs no cargo and no internet: give it the bundle from scripts/gpu-bundle.sh
# (default .gpu/bundle.tar.xz), or a built binary folder (--bin) and the
# folder holding libnixl_capi.so (--nixl-lib). Logs land in --out (default
# /tmp/gpu-check); exit status is non-zero if any run failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; SIZES="8 1M 64M"; OUT=/tmp/gpu-check
PATHS=put,store,ll,ll128; MPS=0; EXTRA=()
while (($#)); do
  case "$1" in
    --bundle) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --bin) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --nixl-lib) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --sizes) need_value "$1" $#; SIZES=$2; shift 2 ;;
    --paths) need_value "$1" $#; PATHS=$2; shift 2 ;;
    --mps) MPS=1; shift ;;
    --out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
NAME=gpu-check
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $NGPU GPU(s)"
nvidia-smi topo -m 2>/dev/null | head -5 > "$OUT/topo.txt"
if ((MPS)); then
  # shellcheck source=lib/mps.sh
  source "$ROOT/scripts/lib/mps.sh"
  mps_start || exit 1
fi

PAIRS=("0 0")
((NGPU >= 2 && !MPS)) && PAIRS+=("0 1")
fail=0
printf '%-10s %-9s %-6s %-6s %-12s %-7s %-12s %-10s %s\n' "gpus" "size" "level" "path" "grid" "iters" "us/iter" "GB/s" "verified" > "$OUT/table.txt"
for pair in "${PAIRS[@]}"; do
  read -r gi gt <<<"$pair"
  for size in $SIZES; do
    tag="gpu${gi}-gpu${gt}-${size}$( ((MPS)) && echo -mps)"
    "$BIN/simple_write" -m pair -g "$gi" --target-gpu "$gt" -s "$size" --path "$PATHS" \
      --json "$OUT/$tag.json" "${EXTRA[@]}" >"$OUT/$tag.out" 2>"$OUT/$tag.err"
    rc=$?
    if ((rc != 0)); then
      fail=1
      echo "!! $tag: exit $rc" >&2
      tail -5 "$OUT/$tag.err" >&2
    fi
    if [[ -s "$OUT/$tag.json" ]]; then
      python3 - "$OUT/$tag.json" "$gi->$gt" >>"$OUT/table.txt" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
tag = sys.argv[2] + (" mps" if doc["run"].get("mps") else "")
for r in doc["rows"]:
    print(f"{tag:<10} {r['size_bytes']:<9} {r['level']:<6} {r['path']:<6} {str(r['blocks'])+'x'+str(r['threads']):<12} "
          f"{r['iters']:<7} {r['us_per_iter']:<12.3f} {r['gb_per_s']:<10.3f} {r['verified']}")
PY
    fi
  done
done
cat "$OUT/table.txt"
exit $fail
