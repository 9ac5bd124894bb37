#!/usr/bin/env bash
# The expert-parallel matrix on a GPU machine: dispatch + combine between N
# ranks over NIXL's device API, both modes, both data paths, every value
# verified, with the same-run NCCL all-to-all baseline; JSON, CSV, one table
# per run, and a PNG.
#
#   bench/run_ep.sh [--bin DIR | --bundle FILE] [--nixl-lib DIR] [--out DIR]
#                     [--modes "ht ll"] [--quick] [--no-mps] [--no-torchrun] [--more-ranks "8"]
#                     [-- EP_ARGS...]
#
# Runs, for each mode: 2 ranks on 2 GPUs (our launcher, `ep --ranks 2`);
# the same under torchrun when it is on PATH; 4 ranks sharing the 2 GPUs,
# by both launchers, under MPS when nvidia-cuda-mps-control exists (a
# private daemon, scripts/lib/mps.sh, stopped after); --more-ranks "8" adds
# runs of that many ranks sharing the GPUs (correctness; no NCCL baseline).
# With one GPU: 2 ranks sharing it.
# Needs no cargo (use scripts/gpu-bundle.sh where cargo is, or --bin DIR
# holding `ep`); plotting needs python3 with matplotlib.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/ep; MODES="ht ll"; QUICK=0; MPS=1; TORCHRUN=1
MORE_RANKS=""
EXTRA=()
while (($#)); do
  case "$1" in
    --bundle|--bin|--nixl-lib|--out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --modes) need_value "$1" $#; MODES=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-mps) MPS=0; shift ;;
    --no-torchrun) TORCHRUN=0; shift ;;
    --more-ranks) need_value "$1" $#; MORE_RANKS=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
NAME=run_ep
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
[[ -x "$BIN/ep" ]] || { echo "run_ep: no ep binary in $BIN (build it: cargo build --release --bin ep)" >&2; exit 1; }

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
((NGPU >= 1)) || { echo "run_ep: no GPU (nvidia-smi -L lists none)" >&2; exit 1; }
QUICKARGS=(); ((QUICK)) && QUICKARGS=(--iters 10 --warmup 2)
fail=0

# One run: tag, then the launcher command (ep's own arguments follow).
one() {
  local tag=$1; shift
  echo "== $tag: $*" >&2
  "$@" "${QUICKARGS[@]}" "${EXTRA[@]}" --json "$OUT/ep-$tag.json" --csv "$OUT/ep-$tag.csv" \
    >"$OUT/ep-$tag.out" 2>"$OUT/ep-$tag.err"
  local rc=$?
  if ((rc)); then fail=1; echo "!! $tag: exit $rc" >&2; tail -5 "$OUT/ep-$tag.err" >&2; fi
  echo "-- $tag"; sed -n '/^mode /,$p' "$OUT/ep-$tag.out"
}

# shellcheck source=lib/mps.sh
source "$ROOT/scripts/lib/mps.sh"
# shellcheck source=lib/ports.sh
source "$ROOT/scripts/lib/ports.sh"
TR=(torchrun --standalone --nnodes=1 --no-python)
has_torchrun() { ((TORCHRUN)) && command -v torchrun >/dev/null; }

for mode in $MODES; do
  if ((NGPU >= 2)); then
    one "$mode-2r2g" "$BIN/ep" --ranks 2 --gpus 2 --port "$(pick_port)" --mode "$mode"
    has_torchrun && one "$mode-2r2g-torchrun" "${TR[@]}" --nproc-per-node=2 "$BIN/ep" --gpus 2 --mode "$mode"
    mps=0; ((MPS)) && mps_start && mps=1
    tag=$( ((mps)) && echo -mps)
    one "$mode-4r2g$tag" "$BIN/ep" --ranks 4 --gpus 2 --port "$(pick_port)" --mode "$mode"
    has_torchrun && one "$mode-4r2g$tag-torchrun" "${TR[@]}" --nproc-per-node=4 "$BIN/ep" --gpus 2 --mode "$mode"
    for r in $MORE_RANKS; do
      one "$mode-${r}r2g$tag" "$BIN/ep" --ranks "$r" --gpus 2 --port "$(pick_port)" --mode "$mode" --no-baseline
    done
    ((mps)) && mps_stop
  else
    mps=0; ((MPS)) && mps_start && mps=1
    one "$mode-2r1g$( ((mps)) && echo -mps)" "$BIN/ep" --ranks 2 --gpus 1 --port "$(pick_port)" --mode "$mode"
    ((mps)) && mps_stop
  fi
done
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$ROOT/bench/plot_ep.py" "$OUT" "$OUT/ep.png" && echo "plot: $OUT/ep.png"
else
  echo "note: python3 has no matplotlib; no plot (the JSON files hold every figure)" >&2
fi
exit $fail
