#!/usr/bin/env bash
# The collectives matrix on a GPU machine: allreduce (one-shot, two-shot),
# allgather and reduce-scatter over both data paths, f32 and bf16, every
# output element checked, NCCL's same calls beside them where NCCL runs;
# one table, JSON and CSV per run, logs in --out.
#
#   bench/run_collectives.sh [--bin DIR | --bundle FILE] [--nixl-lib DIR] [--out DIR]
#                              [--ranks "3 4"] [--max SIZE|auto] [--no-mps] [--no-torchrun]
#
# --max auto (the default) sweeps up to 1 GiB when every GPU's memory holds
# the ranks' windows (input, two outputs, two receive areas of one row per
# rank, NCCL's two buffers: (5 + 2 × ranks) × the size per rank), else the
# largest power of two that fits. The first --ranks count runs the sweep
# twice: launched on the stream, and replayed from CUDA graphs (--launch graph).
#
# With 2 or more GPUs: 2 ranks on 2 GPUs (NCCL beside them), then the
# --ranks counts sharing the GPUs. With one GPU: the --ranks counts share it
# under MPS (a private daemon, scripts/lib/mps.sh, stopped after); NCCL
# refuses ranks that share a GPU, and the table says so. Also: the same
# sweep in place, torchrun as the launcher, and an injected wrong element
# (must exit 3). Needs no cargo (scripts/gpu-bundle.sh packs the binaries).
#
#   bench/run_collectives.sh --elastic [OPTIONS]   runs bench/collectives_elastic.sh:
#                              random deaths in elastic runs (its --help)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ${1:-} == --elastic ]]; then shift; exec "$ROOT/bench/collectives_elastic.sh" "$@"; fi
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/collectives; RANKS="3 4"; MAX=auto; MPS=1
TORCHRUN=1
while (($#)); do
  case "$1" in
    --bundle|--bin|--nixl-lib|--out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --ranks) need_value "$1" $#; RANKS=$2; shift 2 ;;
    --max) need_value "$1" $#; MAX=$2; shift 2 ;;
    --no-mps) MPS=0; shift ;;
    --no-torchrun) TORCHRUN=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
NAME=run_collectives
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
C="$BIN/collectives"
[[ -x "$C" ]] || { echo "run_collectives: no collectives binary in $BIN" >&2; exit 1; }
fail=0
# The largest sweep every GPU holds: (5 + 2r) buffers of the size per rank,
# ceil(r / GPUs) ranks per GPU, within 80% of the smallest GPU's memory.
max_for() {
  local r=$1 g=$2 mib per size=$((1 << 30))
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | sort -n | head -1)
  per=$(( (r + g - 1) / g * (5 + 2 * r) ))
  while ((size > (64 << 20) && size / 1048576 * per > mib * 8 / 10)); do size=$((size / 2)); done
  echo "$((size / 1048576))M"
}
# shellcheck source=lib/ports.sh
source "$ROOT/scripts/lib/ports.sh"
# shellcheck source=lib/mps.sh
source "$ROOT/scripts/lib/mps.sh"

# One run: tag, wanted exit status, then the command.
one() {
  local tag=$1 want=$2; shift 2
  echo "== $tag: $*" >&2
  local t0=$SECONDS
  timeout 480 "$@" --json "$OUT/coll-$tag.json" --csv "$OUT/coll-$tag.csv" >"$OUT/coll-$tag.out" 2>"$OUT/coll-$tag.err"
  local rc=$?
  if ((rc != want)); then fail=1; echo "!! $tag: exit $rc, expected $want" >&2; tail -8 "$OUT/coll-$tag.err" >&2
  else echo "ok $tag: exit $rc in $((SECONDS - t0)) s" >&2; fi
}

if ((NGPU >= 2)); then
  max=$MAX; [[ $max == auto ]] && max=$(max_for 2 2)
  one 2r2g 0 "$C" --ranks 2 --gpus 2 --port "$(pick_port)" -b 8 -e "$max"
  one 2r2g-graph 0 "$C" --ranks 2 --gpus 2 --port "$(pick_port)" -b 8 -e "$max" --launch graph
fi
mps=0; ((MPS)) && mps_start && mps=1
tag=$( ((mps)) && echo -mps)
G=$((NGPU >= 2 ? 2 : 1))
first=1
for r in $RANKS; do
  if ((first)); then
    # The full sweep, NCCL tried beside it.
    max=$MAX; [[ $max == auto ]] && max=$(max_for "$r" "$G")
    one "${r}r${G}g$tag" 0 "$C" --ranks "$r" --gpus "$G" --port "$(pick_port)" -b 8 -e "$max" --timeout 15
    one "${r}r${G}g$tag-graph" 0 "$C" --ranks "$r" --gpus "$G" --port "$(pick_port)" -b 8 -e "$max" --timeout 15 \
      --launch graph
    one "${r}r${G}g$tag-inplace" 0 "$C" --ranks "$r" --gpus "$G" --port "$(pick_port)" -b 8 -e 4M -f 4 \
      --place in --no-baseline --timeout 15
    one "${r}r${G}g$tag-corrupt" 3 "$C" --ranks "$r" --gpus "$G" --port "$(pick_port)" -b 1K -e 1K --op allreduce \
      --algo two-shot --path put --dtype bf16 --no-baseline --inject corrupt=1 --timeout 15
    if ((TORCHRUN)) && command -v torchrun >/dev/null; then
      one "${r}r${G}g$tag-torchrun" 0 torchrun --standalone --nnodes=1 --no-python --nproc-per-node="$r" \
        "$C" --gpus "$G" -b 8 -e 1M -f 8 --no-baseline --timeout 15
    fi
    first=0
  else
    one "${r}r${G}g$tag" 0 "$C" --ranks "$r" --gpus "$G" --port "$(pick_port)" -b 8 -e 16M -f 4 --no-baseline --timeout 15
  fi
done
((mps)) && mps_stop
exit $fail
