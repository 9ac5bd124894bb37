#!/usr/bin/env bash
# The expert-parallel matrix on a GPU machine: dispatch + combine between N
# ranks over NIXL's device API, both modes, both data paths, every value
# verified, with the same-run NCCL all-to-all baseline; JSON, CSV, one table
# per run, and a PNG.
#
#   scripts/run_ep.sh [--bin DIR | --bundle FILE] [--nixl-lib DIR] [--out DIR]
#                     [--modes "ht ll"] [--quick] [--no-mps] [--no-torchrun] [-- EP_ARGS...]
#
# Runs, for each mode: 2 ranks on 2 GPUs (our launcher, `ep --ranks 2`);
# the same under torchrun when it is on PATH; 4 ranks sharing the 2 GPUs,
# under MPS when nvidia-cuda-mps-control exists (started and stopped here,
# in a private pipe directory). With one GPU: 2 ranks sharing it.
# Needs no cargo (use scripts/gpu-bundle.sh where cargo is, or --bin DIR
# holding `ep`); plotting needs python3 with matplotlib.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/ep; MODES="ht ll"; QUICK=0; MPS=1; TORCHRUN=1
EXTRA=()
while (($#)); do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --nixl-lib) NIXL_LIB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-mps) MPS=0; shift ;;
    --no-torchrun) TORCHRUN=0; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_ep: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
done
NAME=run_ep
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
[[ -x "$BIN/ep" ]] || { echo "run_ep: no ep binary in $BIN (build it: cargo build --release --bin ep)" >&2; exit 1; }

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
((NGPU >= 1)) || { echo "run_ep: no GPU (nvidia-smi -L lists none)" >&2; exit 1; }
QUICKARGS=(); ((QUICK)) && QUICKARGS=(--iters 10 --warmup 2)
fail=0; port=$((20000 + RANDOM % 20000))

# One run: tag, then the launcher command (ep's own arguments follow).
one() {
  local tag=$1; shift
  port=$((port + 1))
  echo "== $tag: $*" >&2
  "$@" "${QUICKARGS[@]}" "${EXTRA[@]}" --json "$OUT/ep-$tag.json" --csv "$OUT/ep-$tag.csv" \
    >"$OUT/ep-$tag.out" 2>"$OUT/ep-$tag.err"
  local rc=$?
  if ((rc)); then fail=1; echo "!! $tag: exit $rc" >&2; tail -5 "$OUT/ep-$tag.err" >&2; fi
  echo "-- $tag"; sed -n '/^mode /,$p' "$OUT/ep-$tag.out"
}

start_mps() {
  command -v nvidia-cuda-mps-control >/dev/null || { echo "note: no nvidia-cuda-mps-control: shared-GPU runs without MPS (time-sliced, slow)" >&2; return 1; }
  export CUDA_MPS_PIPE_DIRECTORY="$OUT/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$OUT/mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && trap stop_mps EXIT
}
stop_mps() {
  [[ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]] && echo quit | nvidia-cuda-mps-control 2>/dev/null
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  trap - EXIT
}

for mode in $MODES; do
  if ((NGPU >= 2)); then
    one "$mode-2r2g" "$BIN/ep" --ranks 2 --gpus 2 --port "$port" --mode "$mode"
    if ((TORCHRUN)) && command -v torchrun >/dev/null; then
      one "$mode-2r2g-torchrun" torchrun --standalone --nnodes=1 --nproc-per-node=2 --no-python "$BIN/ep" --mode "$mode"
    fi
    mps=0; ((MPS)) && start_mps && mps=1
    one "$mode-4r2g$( ((mps)) && echo -mps)" "$BIN/ep" --ranks 4 --gpus 2 --port "$port" --mode "$mode"
    ((mps)) && stop_mps
  else
    mps=0; ((MPS)) && start_mps && mps=1
    one "$mode-2r1g$( ((mps)) && echo -mps)" "$BIN/ep" --ranks 2 --gpus 1 --port "$port" --mode "$mode"
    ((mps)) && stop_mps
  fi
done
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$ROOT/scripts/plot_ep.py" "$OUT" "$OUT/ep.png" && echo "plot: $OUT/ep.png"
else
  echo "note: python3 has no matplotlib; no plot (the JSON files hold every figure)" >&2
fi
exit $fail
