#!/usr/bin/env bash
# The test suite: installs what the tests need (scripts/setup.sh: NIXL,
# libtorch, PyTorch, etcd...), then runs every test against the real parts.
#
#   scripts/test.sh [--profiles debug,release] [-- CARGO_TEST_ARGS...]
#
#   --profiles LIST   the cargo profiles to run the suite in, in order
#                     (default: debug; CI, .ci/run, runs debug,release:
#                     a test must not depend on how fast the code is)
#   -- ARGS           passed to `cargo test`, e.g. `-- --test send_recv`
#
# Tests that cannot run here (no GPU, no full PyTorch) print a line starting
# with SKIP saying why; they are listed again at the end, with every test
# that failed (file::test) and the time each profile took. Exit status:
# cargo's (non-zero if any profile failed), 2 for a bad option.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PROFILES=debug
while [[ $# -gt 0 ]]; do
  case "$1" in
    --profiles) [[ $# -ge 2 ]] || { echo "test.sh: --profiles needs a value (e.g. debug,release)" >&2; exit 2; }
                PROFILES=$2; shift 2 ;;
    --profiles=*) PROFILES=${1#*=}; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown option '$1' (cargo test's own go after --; try --help)" >&2; exit 2 ;;
  esac
done
IFS=, read -r -a profiles <<< "$PROFILES"
for p in "${profiles[@]}"; do
  case "$p" in
    debug|release) ;;
    *) echo "test.sh: unknown profile '$p' in --profiles (debug or release)" >&2; exit 2 ;;
  esac
done

# --full-torch: the tests of Python's TCPStore and of torchrun across two
# loopback nodes run against the real PyTorch (about 1 min to install).
scripts/setup.sh --full-torch
# The cargo-fuzz targets must keep compiling (scripts/fuzz.sh runs them).
cargo check --quiet --manifest-path fuzz/Cargo.toml --target-dir target
log=$(mktemp)
trap 'rm -f "$log" "$log".*' EXIT

# Runs the suite in profile $1; its output goes to the terminal and $log.$1.
run_profile() {
  local profile=$1 flag=() rc
  shift
  [[ $profile == release ]] && flag=(--release)
  echo "== cargo test ${flag[*]} ($profile)"
  # Examples are programs the tests run; build them with the same features
  # first (a filtered cargo test would not).
  cargo build --quiet "${flag[@]}" --features libtorch --examples
  # --show-output prints what passing tests wrote, so every SKIP is visible.
  set +e
  # --workspace: the store crate's tests (crates/tcpstore) with this crate's.
  cargo test "${flag[@]}" --workspace --no-fail-fast --features libtorch "$@" -- --show-output 2>&1 | tee "$log.$profile"
  rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}

# The failing tests of one profile's log, as file::test ("lib::" for the
# library's unit tests).
failures() {
  awk '
    /^ *Running (unittests )?[^ ]+/ {
      f = ($1 == "Running" && $2 == "unittests") ? $3 : $2
      sub(/.*\//, "", f); sub(/\.rs$/, "", f)
    }
    /^test .* \.\.\. FAILED$/ { sub(/^test /, ""); sub(/ \.\.\. FAILED$/, ""); print "  " f "::" $0 }
  ' "$1"
}

# What the failing tests of one profile's log printed (libtest's
# "failures:" section), at most 100 lines each: CI shows only the end of
# the output, so the summary repeats it.
failure_output() {
  awk '
    /^failures:$/ { inside = 1; next }
    /^(successes:|test result:)/ { inside = 0 }
    inside && /^---- .* stdout ----$/ { n = 0 }
    inside && n++ < 100 { print "  " $0 }
  ' "$1"
}

status=0
declare -A took result
for p in "${profiles[@]}"; do
  t0=$(date +%s)
  rc=0
  run_profile "$p" "$@" || rc=$?
  took[$p]=$(( $(date +%s) - t0 ))
  result[$p]=$rc
  [[ $rc -eq 0 ]] || status=$rc
done

for p in "${profiles[@]}"; do
  if [[ -n $(failures "$log.$p") ]]; then
    echo
    echo "== what the failing tests printed ($p)"
    failure_output "$log.$p"
  fi
done

echo
echo "== summary"
for p in "${profiles[@]}"; do
  counts=$(grep -E '^test result:' "$log.$p" | awk '{p+=$4; f+=$6; i+=$8} END {printf "passed %d, failed %d, ignored %d", p, f, i}')
  echo "$p: $counts in $(( took[$p] / 60 )) min $(( took[$p] % 60 )) s (cargo test exit ${result[$p]})"
  failed=$(failures "$log.$p")
  if [[ -n $failed ]]; then
    echo "failed in $p:"
    echo "$failed"
  elif [[ ${result[$p]} -ne 0 ]]; then
    echo "failed in $p: no test failed; cargo itself did (a build error? see above)"
  fi
done
# (grep reads the files itself: `cat | grep -q` fails under pipefail.)
if grep -qh 'SKIP' "$log".*; then
  echo "skipped (with reasons):"
  grep -ohE 'SKIP[^"]*' "$log".* | sort -u | sed 's/^/  /'
fi
exit "$status"
