#!/usr/bin/env bash
# Runs the NVSHMEM baseline: rank 0 (initiator) on GPU A, rank 1 (target) on GPU B.
#
#   bench/nvshmem/run.sh --bin DIR --gpus "A B" --out FILE.json [--timeout S] [--no-vmm]
#                        [-- BINARY-OPTIONS...]
#
# Starts DIR/nvshmem_bench twice (NVSHMEM unique-ID bootstrap through a file in
# a fresh temp folder; no MPI/PMI), with CUDA_VISIBLE_DEVICES=A,B in both, so
# each process sees both GPUs and rank r uses device r (NVLink P2P between
# them). Rank 0's table goes to stdout, both ranks' diagnostics to stderr
# ("[nvshmem rank N]"); rank 0 writes FILE.json.
#
#   --bin DIR     folder holding nvshmem_bench (bench/nvshmem/build.sh's --out)
#   --gpus "A B"  two different physical GPU ids (initiator, target)
#   --out FILE    JSON results
#   --timeout S   whole run, each rank (default 180); the binary's own waits use --timeout 10
#   --no-vmm      NVSHMEM_DISABLE_CUDA_VMM=1 from the start (legacy cudaIpc heap); without
#                 it a run whose NVSHMEM setup fails (exit 3 or 255) is tried once more with it
#   --            the rest goes to both ranks (see DIR/nvshmem_bench --help)
#
# NVSHMEM's libraries: $NVSHMEM_LIB_DIR, else python3's nvidia.nvshmem package
# (pip nvidia-nvshmem-cu13, which torch depends on), else DIR/lib (build.sh
# --bundle-libs). Exit: 0 ok; 2 a bad option; else the first failing rank's
# code (2 usage/no GPU, 3 NVSHMEM setup, 4 data mismatch, 5 timeout, 124
# killed by --timeout, 127 library not found).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../../scripts/lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"

log() { echo "nvshmem-run: $*" >&2; }
fail() { echo "nvshmem-run: error: $1" >&2; exit "${2:-2}"; }

bin='' gpus='' out='' total=180 novmm=0 extra=() tmp=''
while (($#)); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --bin) need_value "$1" $#; bin=$2; shift 2 ;;
    --gpus) need_value "$1" $#; gpus=$2; shift 2 ;;
    --out) need_value "$1" $#; out=$2; shift 2 ;;
    --timeout) need_value "$1" $#; total=$2; shift 2 ;;
    --no-vmm) novmm=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) bad_option "$1" ;;
  esac
done
[[ -n $bin && -n $gpus && -n $out ]] || fail "--bin, --gpus and --out are required (try --help)"
exe=$bin/nvshmem_bench
[[ -x $exe ]] || fail "$exe missing or not executable (build it with bench/nvshmem/build.sh)"
read -r ga gb rest <<<"$gpus"
[[ $ga =~ ^[0-9]+$ && $gb =~ ^[0-9]+$ && -z ${rest:-} ]] || fail "--gpus wants two GPU ids, \"A B\", got \"$gpus\""
[[ $ga != "$gb" ]] || fail "--gpus: initiator and target must be different GPUs (NVSHMEM runs one PE per GPU)"
[[ $total =~ ^[0-9]+$ ]] || fail "--timeout wants whole seconds"

# NVSHMEM's host library and UID bootstrap plugin.
has_libs() { [[ -n $1 && -f $1/libnvshmem_host.so.3 && -f $1/nvshmem_bootstrap_uid.so.3 ]]; }
libdir=${NVSHMEM_LIB_DIR:-}
if ! has_libs "$libdir"; then
  [[ -n $libdir ]] && log "NVSHMEM_LIB_DIR=$libdir lacks libnvshmem_host.so.3 or nvshmem_bootstrap_uid.so.3"
  pkg=$(python3 -c 'import os, nvidia.nvshmem as m; print(os.path.dirname(m.__file__) if getattr(m, "__file__", None) else list(m.__path__)[0])' 2>/dev/null || true)
  libdir=${pkg:+$pkg/lib}
  if has_libs "$libdir"; then
    pyver=$(python3 -c 'import importlib.metadata as m; print(m.version("nvidia-nvshmem-cu13"))' 2>/dev/null || echo "?")
    log "NVSHMEM libraries: python3 package nvidia-nvshmem-cu13 $pyver at $libdir"
  elif has_libs "$bin/lib"; then
    libdir=$bin/lib; log "NVSHMEM libraries: bundled copy in $libdir"
  else
    fail "NVSHMEM host library not found: no NVSHMEM_LIB_DIR, no python3 package nvidia.nvshmem (pip nvidia-nvshmem-cu13) with lib/libnvshmem_host.so.3 + nvshmem_bootstrap_uid.so.3, no $bin/lib" 3
  fi
fi
built=$(sed -n 's/^nvshmem_version=//p' "$bin/BUILD_INFO" 2>/dev/null || true)
log "binary built against NVSHMEM ${built:-?}; GPUs initiator $ga, target $gb; timeout ${total}s"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi topo -m 2>/dev/null | awk -v a="$ga" -v b="$gb" 'NR == 1 || $1 == "GPU" a || $1 == "GPU" b' | sed 's/^/nvshmem-run: topo: /' >&2 || true
fi
out_dir=$(dirname "$out"); mkdir -p "$out_dir" || fail "cannot create $out_dir"

pids=()
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  local p
  for p in ${pids[@]+"${pids[@]}"}; do kill -TERM "$p" 2>/dev/null; done
  if [[ -n $tmp ]]; then rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# One attempt: both ranks under `timeout`; the first to fail takes the other down.
attempt() {
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/nvshmem-run.XXXXXX") || fail "mktemp failed"
  local uid=$tmp/uid r rc0 rc1
  log "attempt: NVSHMEM_DISABLE_CUDA_VMM=${NVSHMEM_DISABLE_CUDA_VMM:-<unset>}, uid file $uid"
  for r in 0 1; do
    local args=(--rank "$r" --uid-file "$uid" --initiator-gpu "$ga" --target-gpu "$gb")
    ((r == 0)) && args+=(--out "$out")
    CUDA_VISIBLE_DEVICES=$ga,$gb LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      timeout -k 5 "$total" "$exe" "${args[@]}" ${extra[@]+"${extra[@]}"} >&"$((r == 0 ? 1 : 2))" &
    pids[r]=$!
    log "rank $r: pid ${pids[r]}, device $r of CUDA_VISIBLE_DEVICES=$ga,$gb"
  done
  rc0='' rc1=''
  while [[ -z $rc0 || -z $rc1 ]]; do
    if [[ -z $rc0 ]] && ! kill -0 "${pids[0]}" 2>/dev/null; then wait "${pids[0]}"; rc0=$?; log "rank 0 exited $rc0"; fi
    if [[ -z $rc1 ]] && ! kill -0 "${pids[1]}" 2>/dev/null; then wait "${pids[1]}"; rc1=$?; log "rank 1 exited $rc1"; fi
    if [[ -n $rc0 && $rc0 != 0 && -z $rc1 ]]; then log "rank 0 failed: stopping rank 1"; kill -TERM "${pids[1]}" 2>/dev/null; fi
    if [[ -n $rc1 && $rc1 != 0 && -z $rc0 ]]; then log "rank 1 failed: stopping rank 0"; kill -TERM "${pids[0]}" 2>/dev/null; fi
    [[ -z $rc0 || -z $rc1 ]] && sleep 0.2
  done
  pids=(); rm -rf "$tmp"; tmp=
  # The first failure is the cause; the other rank's is its consequence (143: stopped).
  if ((rc1 != 0 && rc1 != 143 && (rc0 == 0 || rc0 == 143 || rc0 == 5))); then return "$rc1"; fi
  return "$rc0"
}

((novmm)) && export NVSHMEM_DISABLE_CUDA_VMM=1
attempt; rc=$?
if ((rc == 3 || rc == 255)) && [[ -z ${NVSHMEM_DISABLE_CUDA_VMM:-} ]]; then
  log "NVSHMEM setup failed (exit $rc); trying once more with NVSHMEM_DISABLE_CUDA_VMM=1"
  export NVSHMEM_DISABLE_CUDA_VMM=1
  attempt; rc=$?
fi
if ((rc == 0)); then
  [[ -s $out ]] || fail "both ranks succeeded but $out is missing" 3
  log "ok in ${SECONDS} s: $out"
else
  log "failed with exit $rc after ${SECONDS} s (2 usage/no GPU, 3 NVSHMEM setup, 4 data mismatch, 5 timeout, 124 run timeout, 127 library not found)"
fi
exit "$rc"
