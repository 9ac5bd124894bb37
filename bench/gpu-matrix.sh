#!/usr/bin/env bash
# The GPU matrix: everything only separate GPUs can show, one rank per GPU,
# every row beside its same-run baseline, on a machine with 2, 4 (or 8) GPUs.
# No row can hang the matrix: each has its own deadline, derived from its
# sizes; a row that overruns is killed, named in the summary with its last
# lines, and the next row runs.
#
#   bench/gpu-matrix.sh [--bin DIR | --bundle FILE] [--nixl-lib DIR] [--out DIR]
#                       [--gpus "0 1 2 3"] [--parts "sw nvshmem coll ep pipe faults pdl sync"]
#                       [--budget SECONDS] [--nvshmem DIR]
#
# Parts (GPUs from --gpus, default every GPU; the first two are "the pair"):
#   sw       simple_write on the pair both ways: bandwidth 16 B - 1 GiB at
#            block level on the put, store and ll paths beside the copy
#            engine, ping-pong 8 B - 1 MiB at every level with the floor
#            row; the ll128 path in rows of its own on the pair (one way,
#            bandwidth at block level, ping-pong at warp and block level),
#            shown in the same tables; every other ordered pair: bandwidth at
#            1 MiB, 32 MiB and 1 GiB (store, put) beside the copy engine
#   nvshmem  NVSHMEM's put+signal on the pair (bench/nvshmem; --nvshmem DIR
#            holds its binary, default .gpu-nvshmem), half round trip and
#            bandwidth, to set beside simple_write's rows
#   coll     collectives at 2, 3 and 4 ranks (as many as there are GPUs),
#            8 B - 1 GiB of f32, every op, algorithm (COLL_ALGO, default
#            all) and path beside NCCL's same call (COLL_ARGS: more options):
#            stream launches, then CUDA graphs against NCCL's graphs; and
#            the LL128 algorithms (8 B - 4 MiB, f32 and bf16, store path) in a row of
#            their own
#   ep       EP2 and EP4, ht and ll, both paths, --graph, beside NCCL's
#            all-to-all
#   pipe     the pipeline at 2 and 4 stages, 1 and 4 MiB chunks beside
#            NCCL's send/recv chain, the line paths (LL128, LL) beside the
#            store path at 8 KiB - 1 MiB; one 8-byte LL chunk on the pair
#   faults   bench/gpu-faults.sh, initiator and target on the pair
#   pdl      (not run unless named) collectives with programmatic dependent
#            launch against without (--pdl), 8 B - 4 MiB, every op,
#            algorithm and path, at 2 ranks and at as many as there are
#            GPUs, stream and graph launches, two rounds of each alternating
#            (on, off, on, off); bench/ab_collectives.py compares them into
#            pdl-ab-<ranks>r-<launch>.md
#   sync     (not run unless named) the same A/B of --sync-domain remote (our
#            calls in CUDA's remote memory-synchronization domain, as NCCL
#            launches its own) against the default: sync-ab-<ranks>r-<launch>.md
#
# Parts can run in separate calls into one folder (--out): a call removes
# only the files of the rows it runs. bench/gpu_matrix.py DIR then writes
# DIR/summary.md from whatever rows the folder holds: every ratio to its
# same-run baseline (none printed where the baseline is above the link's
# rate), the GPUs, topology, driver and NCCL (env.txt), and every row that
# did not run, overran or failed, with why.
#
# --budget (default 560): seconds this call may spend; a row whose deadline
# does not fit in what is left is skipped and named (run it in the next
# call with --parts). Exit 0 only when every row ran and ended as expected.
# With fewer than 2 GPUs every row is named as skipped and the exit is 1.
# Needs no cargo (scripts/gpu-bundle.sh packs the binaries).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../scripts/lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
BUNDLE="$ROOT/.gpu/bundle.tar.xz"; BIN=""; NIXL_LIB=""; OUT=/tmp/gpu-matrix; GPUS=""
PARTS="sw nvshmem coll ep pipe faults"; BUDGET=560; NVSHMEM="$ROOT/.gpu-nvshmem"
while (($#)); do
  case "$1" in
    --bundle|--bin|--nixl-lib|--out) gpu_option "$1" $# "${2-}"; shift 2 ;;
    --gpus) need_value "$1" $#; GPUS=$2; shift 2 ;;
    --parts) need_value "$1" $#; PARTS=$2; shift 2 ;;
    --budget) need_value "$1" $#; BUDGET=$2; shift 2 ;;
    --nvshmem) need_value "$1" $#; NVSHMEM=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu-matrix: --budget '$BUDGET': want whole seconds" >&2; exit 2; }
for p in $PARTS; do
  [[ " sw nvshmem coll ep pipe faults pdl sync " == *" $p "* ]] || {
    echo "gpu-matrix: --parts: unknown part '$p' (sw nvshmem coll ep pipe faults pdl sync)" >&2; exit 2; }
done
NAME=gpu-matrix
# shellcheck source=../scripts/lib/gpu-env.sh
source "$ROOT/scripts/lib/gpu-env.sh"
# shellcheck source=../scripts/lib/ports.sh
source "$ROOT/scripts/lib/ports.sh"
[[ -n $GPUS ]] || GPUS=$(seq -s ' ' 0 $((NGPU - 1)))
read -r -a G <<<"$GPUS"
for g in "${G[@]}"; do
  [[ $g =~ ^[0-9]+$ ]] && ((g < NGPU)) || { echo "gpu-matrix: --gpus '$GPUS': this machine has GPUs 0-$((NGPU - 1))" >&2; exit 2; }
done
WHY=""
if ((${#G[@]} < 2)); then
  WHY="needs two GPUs or more (this machine has $NGPU): one rank per GPU"
  G=(0 1)   # the rows' names, each named as not run
fi
fail=0

# The machine, once per folder: what every summary names.
if [[ ! -s $OUT/env.txt ]]; then
  {
    echo "## nvidia-smi -L"; nvidia-smi -L
    echo "## driver"; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
    echo "## nvidia-smi topo -m"; nvidia-smi topo -m
    echo "## nvlink per GPU (nvidia-smi nvlink -s)"
    for g in "${G[@]}"; do echo "GPU $g: $(nvidia-smi nvlink -s -i "$g" 2>/dev/null | grep -o '[0-9.]* GB/s' | tr '\n' ' ')"; done
    echo "## NCCL (python3's torch)"
    python3 -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>&1 | tail -1
  } >"$OUT/env.txt" 2>&1
fi

# row TAG WANT DEADLINE GPUS -- COMMAND...: runs COMMAND (its --json/--csv
# added unless NOJSON=1) with CUDA_VISIBLE_DEVICES=GPUS (comma-separated),
# killed after DEADLINE s. One JSON line per row in rows.jsonl.
row() {
  local tag=$1 want=$2 deadline=$3 gpus=$4; shift 5
  local left=$((BUDGET - SECONDS)) why="" rc=-1 t0=$SECONDS extra=()
  rm -f "$OUT/$tag".{json,csv,out,err}
  if [[ -n $WHY ]]; then why=$WHY
  elif ((deadline + 5 > left)); then why="needs up to $deadline s, $left s of this call's budget were left: run --parts again"
  fi
  if [[ -z $why ]]; then
    echo "== $tag (GPUs $gpus, deadline $deadline s): $*" >&2
    [[ ${NOJSON:-0} == 1 ]] || extra=(--json "$OUT/$tag.json" --csv "$OUT/$tag.csv")
    CUDA_VISIBLE_DEVICES=$gpus timeout -k 5 "$deadline" "$@" "${extra[@]}" >"$OUT/$tag.out" 2>"$OUT/$tag.err"
    rc=$?
    if ((rc == 124 || rc == 137)); then why="overran its deadline of $deadline s and was killed"
    elif ((rc != want)); then why="exit $rc, expected $want"; fi
    if [[ -n $why ]]; then echo "!! $tag: $why" >&2; tail -4 "$OUT/$tag.err" >&2; else echo "ok $tag: $((SECONDS - t0)) s" >&2; fi
  else
    echo "-- $tag: skipped: $why" >&2
  fi
  [[ -n $why ]] && fail=1
  TAG=$tag WANT=$want RC=$rc WHY=$why DL=$deadline GP=$gpus SECS=$((SECONDS - t0)) CMD="$*" \
    ERR="$OUT/$tag.err" python3 - >>"$OUT/rows.jsonl" <<'PY'
import json, os
e = os.environ
try:
    last = open(e["ERR"], errors="replace").read().splitlines()[-5:]
except OSError:
    last = []
print(json.dumps({"tag": e["TAG"], "gpus": e["GP"], "want": int(e["WANT"]), "exit": int(e["RC"]),
                  "why": e["WHY"], "deadline_s": int(e["DL"]), "seconds": int(e["SECS"]),
                  "command": e["CMD"], "last_lines": last if e["WHY"] else []}))
PY
}
# Physical GPU ordinals A,B,... as one comma-separated list.
vis() { local IFS=,; echo "$*"; }
# sizes FROM TO FACTOR: how many sizes a sweep has.
sizes() { local n=0 s=$1; while ((s <= $2)); do n=$((n + 1)); s=$((s * $3)); done; echo $n; }

part_sw() {
  local a=${G[0]} b=${G[1]} x y
  local bw=(-b 16 -e 1G -f 4) pp=(-b 8 -e 1M -f 8)
  local dbw=$((30 + 8 * $(sizes 16 $((1 << 30)) 4))) dpp=$((30 + 10 * $(sizes 8 $((1 << 20)) 8)))
  for x in "$a $b" "$b $a"; do
    read -r x y <<<"$x"
    row "sw-${x}to${y}-bw" 0 $dbw "$x,$y" -- "$BIN/simple_write" -m pair -g 0 --target-gpu 1 --levels block --path put,store,ll "${bw[@]}"
  done
  row "sw-${a}to${b}-pp" 0 $dpp "$a,$b" -- "$BIN/simple_write" -m pair -g 0 --target-gpu 1 --pingpong \
    --levels thread,warp,block --path put,store,ll "${pp[@]}"
  # LL128 in rows of its own on the first pair, so that a failure of the
  # newest path cannot take the other paths' rows with it (gpu_matrix.py
  # shows its rows in the same tables).
  row "ll128-${a}to${b}-bw" 0 $((30 + 4 * $(sizes 16 $((1 << 30)) 4))) "$a,$b" -- "$BIN/simple_write" -m pair -g 0 \
    --target-gpu 1 --levels block --path ll128 "${bw[@]}"
  row "ll128-${a}to${b}-pp" 0 $((30 + 5 * $(sizes 8 $((1 << 20)) 8))) "$a,$b" -- "$BIN/simple_write" -m pair -g 0 \
    --target-gpu 1 --pingpong --levels warp,block --path ll128 "${pp[@]}"
  for x in "${G[@]}"; do for y in "${G[@]}"; do
    [[ $x == "$y" || ( $x == "$a" && $y == "$b" ) || ( $x == "$b" && $y == "$a" ) ]] && continue
    row "sw-${x}to${y}-bw" 0 60 "$x,$y" -- "$BIN/simple_write" -m pair -g 0 --target-gpu 1 \
      --levels block --path put,store -b 1M -e 1G -f 32
  done; done
}
part_nvshmem() {
  local a=${G[0]} b=${G[1]}
  if [[ ! -x $NVSHMEM/nvshmem_bench ]]; then
    WHY_SAVED=$WHY; WHY="no NVSHMEM benchmark at $NVSHMEM (bench/nvshmem/build.sh builds it where nvcc is)"
    row "nvshmem-${a}to${b}" 0 120 "$a,$b" -- true; WHY=$WHY_SAVED; return
  fi
  NOJSON=1 row "nvshmem-${a}to${b}" 0 150 "$(vis "${G[@]}")" -- "$ROOT/bench/nvshmem/run.sh" --bin "$NVSHMEM" \
    --gpus "$a $b" --out "$OUT/nvshmem-${a}to${b}.json" --timeout 120
}
part_coll() {
  local n c
  local d=$((60 + 3 * $(sizes 8 $((1 << 30)) 2)))
  for n in 2 3 4 8; do
    ((n <= ${#G[@]})) || continue
    # shellcheck disable=SC2206 # COLL_ARGS: extra options, split on spaces
    c=("$BIN/collectives" --ranks "$n" --gpus "$n" -b 8 -e 1G --dtype f32 --algo "${COLL_ALGO:-all}" --timeout 15 ${COLL_ARGS:-})
    row "coll-${n}r-stream" 0 $d "$(vis "${G[@]:0:n}")" -- "${c[@]}" --port "$(pick_port)"
    row "coll-${n}r-graph" 0 $d "$(vis "${G[@]:0:n}")" -- "${c[@]}" --port "$(pick_port)" --launch graph
    # LL128 also in a row of its own (--algo all runs it in f32 only):
    # f32 and bf16, stream launches, up to where it runs.
    row "coll-${n}r-ll128" 0 $((60 + 6 * $(sizes 8 $((4 << 20)) 2))) "$(vis "${G[@]:0:n}")" -- "$BIN/collectives" \
      --ranks "$n" --gpus "$n" -b 8 -e 4M --dtype f32,bf16 --algo ll128 --path store --timeout 15 --port "$(pick_port)"
  done
}
# An A/B of one option of our collectives (its words follow TAG): with it
# ("on") and without, 8 B - 4 MiB, every op, algorithm and path, at 2 ranks
# and at as many as there are GPUs, stream and graph launches, two rounds
# alternating; bench/ab_collectives.py compares them into
# TAG-ab-<ranks>r-<launch>.md.
ab_part() {
  local tag=$1 n launch round with c ns=(2)
  shift
  ((${#G[@]} > 2)) && ns+=("${#G[@]}")
  for n in "${ns[@]}"; do
    for launch in stream graph; do
      for round in 1 2; do
        for with in on off; do
          c=("$BIN/collectives" --ranks "$n" --gpus "$n" -b 8 -e 4M -f 4 --dtype f32 --algo all --timeout 15
            --launch "$launch" --port "$(pick_port)")
          [[ $with == on ]] && c+=("$@")
          row "$tag-${n}r-$launch-$with-$round" 0 $((60 + 3 * $(sizes 8 $((4 << 20)) 4))) "$(vis "${G[@]:0:n}")" -- "${c[@]}"
        done
      done
      python3 "$ROOT/bench/ab_collectives.py" "$OUT/$tag-${n}r-$launch-on-*.json" "$OUT/$tag-${n}r-$launch-off-*.json" \
        >"$OUT/$tag-ab-${n}r-$launch.md" || rm -f "$OUT/$tag-ab-${n}r-$launch.md"
    done
  done
}
part_pdl() { ab_part pdl --pdl; }
part_sync() { ab_part sync --sync-domain remote; }
part_ep() {
  local n mode
  for n in 2 4 8; do
    ((n <= ${#G[@]})) || continue
    for mode in ht ll; do
      row "ep${n}-$mode" 0 150 "$(vis "${G[@]:0:n}")" -- "$BIN/ep" --ranks "$n" --gpus "$n" --port "$(pick_port)" \
        --mode "$mode" --graph
    done
  done
}
part_pipe() {
  local n p
  for n in 2 4; do
    ((n <= ${#G[@]})) || continue
    p=("$BIN/pipeline" --ranks "$n" --gpus "$n" --path store,put --chunk 1M,4M --chunks 2000 --warmup 100)
    row "pipe${n}-default" 0 120 "$(vis "${G[@]:0:n}")" -- "${p[@]}" --port "$(pick_port)" --slots 8,32
    row "pipe${n}-b128" 0 120 "$(vis "${G[@]:0:n}")" -- "${p[@]}" --port "$(pick_port)" --slots 8,16,32 --blocks 128
    row "pipe${n}-lines" 0 120 "$(vis "${G[@]:0:n}")" -- "$BIN/pipeline" --ranks "$n" --gpus "$n" --port "$(pick_port)" \
      --path ll128,ll,store --chunk 8K,64K,1M --slots 8 --chunks 5000 --warmup 200
  done
  row pipe2-ll8 0 90 "$(vis "${G[@]:0:2}")" -- "$BIN/pipeline" --ranks 2 --gpus 2 --port "$(pick_port)" --path ll \
    --chunk 8 --slots 1 --level thread,warp,block --threads 256 --chunks 20000 --warmup 1000 --no-baseline
}
part_faults() {
  NOJSON=1 row faults 0 240 "$(vis "${G[@]:0:2}")" -- "$ROOT/bench/gpu-faults.sh" --bin "$BIN" \
    --nixl-lib "$NIXL_LIB_DIR" --out "$OUT/faults"
}

for p in $PARTS; do "part_$p"; done
python3 "$ROOT/bench/gpu_matrix.py" "$OUT" >/dev/null || fail=1
echo "gpu-matrix: $OUT/summary.md" >&2
exit $fail
