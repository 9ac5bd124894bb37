#!/usr/bin/env bash
# The cross-GPU matrix: what only a pair of GPUs can show, in one call of
# at most ten minutes, every row beside its same-run baseline (NCCL refuses
# ranks that share a GPU, so its rows need the pair).
#
#   scripts/pair-matrix.sh [--bin DIR | --bundle FILE] [--nixl-lib DIR] [--out DIR]
#                          [--gpus "A B"] [--parts "sw coll ep pipe"] [--budget SECONDS]
#                          [--one-gpu]
#
# Parts, in this order (GPU A initiates, GPU B is the target; --gpus):
#   sw    simple_write A -> B: bandwidth 16 B - 1 GiB at block level on the
#         put, store and ll paths beside the copy engine; ping-pong 8 B - 1 MiB
#         at every level with the floor row (a bare flag)
#   coll  collectives, 2 ranks on A and B, 8 B - 1 GiB, every op, algorithm
#         and path beside NCCL's same call: stream launches, then CUDA graphs
#   ep    EP2 on A and B, ht and ll, both paths, beside NCCL's all-to-all,
#         stream launches and --graph replays
#   pipe  the pipeline, 2 stages on A and B: 1 and 4 MiB chunks beside NCCL's
#         send/recv chain (default grid and 128 blocks), one 8-byte LL chunk
# then scripts/pair_matrix.py: summary.md (every ratio to its same-run
# baseline, the ep combine's wire rate over simple_write's put at the
# nearest size), the parts' plots, and skipped.txt naming every row that did
# not run and why.
#
# --budget (default 570): seconds for the whole call; a row that cannot
# start with 30 s left is skipped and named. --one-gpu runs every row with
# both ranks on GPU A under MPS (a private daemon, scripts/lib/mps.sh): it
# checks the script and its report on one GPU, it is not the matrix (the
# summary says so). Without --one-gpu and with one GPU every row is named
# as skipped and the script exits 1. Exit 0 only when every row ran and
# ended as expected. Needs no cargo (scripts/gpu-bundle.sh packs the binaries).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/pair-matrix; GPUS="0 1"
PARTS="sw coll ep pipe"; BUDGET=570; ONE_GPU=0
while (($#)); do
  case "$1" in
    --bundle|--bin|--nixl-lib|--out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --gpus) need_value "$1" $#; GPUS=$2; shift 2 ;;
    --parts) need_value "$1" $#; PARTS=$2; shift 2 ;;
    --budget) need_value "$1" $#; BUDGET=$2; shift 2 ;;
    --one-gpu) ONE_GPU=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
read -r GA GB <<<"$GPUS"
[[ $GA =~ ^[0-9]+$ && ${GB:-x} =~ ^[0-9]+$ && $GA != "$GB" ]] || {
  echo "pair-matrix: --gpus '$GPUS': want two distinct GPU ordinals, e.g. \"0 1\"" >&2; exit 2; }
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "pair-matrix: --budget '$BUDGET': want whole seconds" >&2; exit 2; }
for p in $PARTS; do
  [[ " sw coll ep pipe " == *" $p "* ]] || { echo "pair-matrix: --parts: unknown part '$p' (sw coll ep pipe)" >&2; exit 2; }
done
NAME=pair-matrix
# shellcheck source=lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
# shellcheck source=lib/ports.sh
source "$ROOT/scripts/lib/ports.sh"
# shellcheck source=lib/mps.sh
source "$ROOT/scripts/lib/mps.sh"
# A folder used before holds no rows of an earlier call.
rm -f "$OUT"/{gpu*-gpu*-*,coll-*,ep-*,pipe-*}.{json,csv,out,err} "$OUT"/{skipped,rows,crossover}.txt "$OUT"/summary.md
fail=0

if ((GA >= NGPU || (!ONE_GPU && NGPU >= 2 && GB >= NGPU))); then
  echo "pair-matrix: --gpus '$GPUS': this machine has GPUs 0-$((NGPU - 1))" >&2; exit 2
fi
# Why no row can run here (every row is then named as skipped), or nothing.
WHY=""
((!ONE_GPU && NGPU < 2)) && WHY="needs a second GPU (this machine has $NGPU; --one-gpu checks the script on one)"
# Inside the rows the pair is GPUs 0 and 1 (or GPU 0 alone with --one-gpu).
# simple_write's files are named as scripts/bench.sh names them, so its
# crossover and plot scripts read them.
if ((ONE_GPU)); then export CUDA_VISIBLE_DEVICES=$GA; NG=1; TGT=0; SW=gpu0-gpu0-mps
else export CUDA_VISIBLE_DEVICES=$GA,$GB; NG=2; TGT=1; SW=gpu0-gpu1; fi

# One row: tag, wanted exit status, then the command (its --json and --csv
# added). Named in skipped.txt instead when the pair is missing or the
# budget cannot hold it.
row() {
  local tag=$1 want=$2; shift 2
  local left=$((BUDGET - SECONDS))
  if [[ -n $WHY ]]; then echo "$tag: $WHY" >>"$OUT/skipped.txt"; fail=1; return; fi
  if ((left < 30)); then echo "$tag: the budget ($BUDGET s) ran out" >>"$OUT/skipped.txt"; fail=1; return; fi
  echo "== $tag: $*" >&2
  local t0=$SECONDS
  timeout "$left" "$@" --json "$OUT/$tag.json" --csv "$OUT/$tag.csv" >"$OUT/$tag.out" 2>"$OUT/$tag.err"
  local rc=$?
  echo "$tag exit $rc in $((SECONDS - t0)) s: $*" >>"$OUT/rows.txt"
  if ((rc != want)); then fail=1; echo "!! $tag: exit $rc, expected $want" >&2; tail -6 "$OUT/$tag.err" >&2
  else echo "ok $tag: exit $rc in $((SECONDS - t0)) s" >&2; fi
}

part_sw() {
  local sw=("$BIN/simple_write" -m pair -g 0 --target-gpu "$TGT")
  row "$SW-bw-block" 0 "${sw[@]}" --levels block --path put,store,ll -b 16 -e 1G -f 4
  row "$SW-pp" 0 "${sw[@]}" --pingpong --levels thread,warp,block --path put,store,ll -b 8 -e 1M -f 8
}
part_coll() {
  local c=("$BIN/collectives" --ranks 2 --gpus "$NG" -b 8 -e 1G --timeout 15)
  row coll-stream 0 "${c[@]}" --port "$(pick_port)"
  row coll-graph 0 "${c[@]}" --port "$(pick_port)" --launch graph
}
part_ep() {
  local mode
  for mode in ht ll; do row "ep-$mode" 0 "$BIN/ep" --ranks 2 --gpus "$NG" --port "$(pick_port)" --mode "$mode" --graph; done
}
part_pipe() {
  local p=("$BIN/pipeline" --ranks 2 --gpus "$NG" --path store,put --chunk 1M,4M --chunks 2000 --warmup 100)
  row pipe-default 0 "${p[@]}" --port "$(pick_port)" --slots 8,32
  row pipe-b128 0 "${p[@]}" --port "$(pick_port)" --slots 8,16,32 --blocks 128
  row pipe-ll8 0 "$BIN/pipeline" --ranks 2 --gpus "$NG" --port "$(pick_port)" --path ll --chunk 8 --slots 1 \
    --level thread,warp,block --threads 256 --chunks 20000 --warmup 1000 --no-baseline
}

# Each part's plot, by the script that draws it for its own matrix.
plots() {
  python3 -c 'import matplotlib' 2>/dev/null || {
    echo "note: python3 has no matplotlib; no plots (the JSON files hold every figure)" >&2; return; }
  local c=("$OUT"/coll-*.json) p=() f
  for f in "$OUT"/pipe-default.csv "$OUT"/pipe-b128.csv; do [[ -f $f ]] && p+=("$f"); done
  if [[ -f $OUT/$SW-pp.json ]]; then
    python3 "$ROOT/scripts/crossover.py" "$OUT" >"$OUT/crossover.txt" && python3 "$ROOT/scripts/plot_bench.py" "$OUT" "$OUT/bench.png"
  fi
  [[ -f ${c[0]} ]] && python3 "$ROOT/scripts/plot_collectives.py" "$OUT/collectives.png" "${c[@]}"
  compgen -G "$OUT/ep-*.json" >/dev/null && python3 "$ROOT/scripts/plot_ep.py" "$OUT" "$OUT/ep.png"
  ((${#p[@]})) && python3 "$ROOT/scripts/plot_pipeline.py" "$OUT/pipeline.png" "${p[@]}"
  true
}

mps=0; ((ONE_GPU)) && { mps_start || exit 1; mps=1; }
for p in $PARTS; do "part_$p"; done
((mps)) && mps_stop
plots
python3 "$ROOT/scripts/pair_matrix.py" "$OUT" $( ((ONE_GPU)) && echo --one-gpu) || fail=1
exit $fail
