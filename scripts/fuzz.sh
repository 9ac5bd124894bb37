#!/usr/bin/env bash
# Fuzzes the two decoders that read untrusted bytes, SECONDS each (default 60):
#   store_frame    c10d TCPStore request frames (crates/tcpstore/src/native/wire.rs),
#                  what the store server decodes from every connection;
#   serdes_decode  NIXL descriptor lists (src/nixl/serdes.rs), what peers
#                  publish through the store.
#
#   scripts/fuzz.sh [SECONDS]
#
# Coverage-guided with cargo-fuzz (libFuzzer + AddressSanitizer, debug
# assertions on, so integer overflow panics), installed with
# `cargo install cargo-fuzz --locked` if missing. cargo-fuzz passes
# nightly-only flags (-Zsanitizer); on a stable toolchain RUSTC_BOOTSTRAP=1
# lets it through (checked with rustc 1.95). No single allocation may exceed
# 2 MiB (-malloc_limit_mb): inputs are at most 4 KiB and the frame decoder
# reserves at most 1 MiB ahead of a field's bytes, so a larger allocation
# means a length field was believed before its bytes arrived. A crash, a
# panic, an over-limit allocation, or an input that takes over 10 s is a
# failure. Targets: fuzz/fuzz_targets/; seeds (valid encodings):
# fuzz/seeds/; dictionaries: fuzz/dicts/. Corpora grow in fuzz/corpus/
# (git-ignored) and are reused by the next run.
#
# Where cargo-fuzz cannot be installed or cannot build (or with
# FUZZ_ENGINE=proptest), it says why and runs the properties of
# tests/fuzz_props.rs instead, in rounds of PROPTEST_CASES (default 2000)
# fresh random cases, for the same time.
#
# Exit status 0 when nothing crashed; otherwise 1, after printing where the
# reproducer is and the command that replays it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  -*) bad_option "$1" ;;
esac
(($# <= 1)) || { echo "fuzz.sh: one argument at most, SECONDS (try --help)" >&2; exit 2; }
SECS="${1:-60}"
if ! [[ "$SECS" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: '$SECS' is not a number of seconds per target, e.g. 60 (try --help)" >&2
  exit 2
fi
TARGETS=(store_frame serdes_decode)
ENGINE="${FUZZ_ENGINE:-cargo-fuzz}"

# The properties of tests/fuzz_props.rs that cover each target.
declare -A PROPS=([store_frame]=wire_ [serdes_decode]=serdes_)

proptest_fallback() {
  local cases="${PROPTEST_CASES:-2000}" failed=0 t log
  log="$(mktemp)"
  echo "== fuzz: proptest properties (tests/fuzz_props.rs), ${cases} cases a round, ${SECS}s per target"
  cargo test --quiet --test fuzz_props --no-run
  for t in "${TARGETS[@]}"; do
    local start=$SECONDS rounds=0
    while (( SECONDS - start < SECS )); do
      # A fresh random seed every round (proptest's default).
      if ! PROPTEST_CASES="$cases" cargo test --quiet --test fuzz_props -- "${PROPS[$t]}" >"$log" 2>&1; then
        cat "$log"
        echo "== fuzz: $t: a property failed (minimal input above); proptest saved its seed in"
        echo "   tests/fuzz_props.proptest-regressions; replay with: cargo test --test fuzz_props"
        failed=1
        break
      fi
      rounds=$((rounds + 1))
    done
    echo "== fuzz: $t: $rounds rounds of $cases cases per property in $((SECONDS - start))s"
  done
  rm -f "$log"
  return "$failed"
}

if [[ "$ENGINE" == proptest ]]; then
  proptest_fallback
  exit $?
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
  if ! cargo install cargo-fuzz --locked; then
    echo "== fuzz: cannot install cargo-fuzz: falling back to proptest"
    proptest_fallback
    exit $?
  fi
fi

# -a: debug assertions (overflow checks) in the fuzzed code; the same flags
# for build and run, or run rebuilds.
FUZZ_FLAGS=(-a)
build_log="$(mktemp)"
trap 'rm -f "$build_log"' EXIT
echo "== fuzz: building ${TARGETS[*]} ($(cargo fuzz --version), $(rustc --version))"
if ! RUSTC_BOOTSTRAP=1 cargo fuzz build "${FUZZ_FLAGS[@]}" >"$build_log" 2>&1; then
  echo "== fuzz: cargo fuzz build failed; its last lines:"
  tail -n 25 "$build_log"
  echo "== fuzz: no coverage-guided fuzzer on this toolchain: falling back to proptest"
  proptest_fallback
  exit $?
fi

status=0
for t in "${TARGETS[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  log="fuzz/artifacts/$t/last-run.log"
  marker="$(mktemp)"
  echo "== fuzz: $t for ${SECS}s (log: $log)"
  set +e
  # New inputs go to the first corpus directory; the seeds are only read.
  RUSTC_BOOTSTRAP=1 cargo fuzz run "${FUZZ_FLAGS[@]}" "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    -max_total_time="$SECS" -timeout=10 -malloc_limit_mb=2 -rss_limit_mb=2048 \
    -dict="fuzz/dicts/$t.dict" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  grep -E '^Done [0-9]+ runs|stat::(number_of_executed_units|peak_rss_mb|new_units_added)' "$log" | sed 's/^/   /' || true
  echo "   corpus: $(find "fuzz/corpus/$t" -type f | wc -l) inputs in fuzz/corpus/$t"
  if (( rc != 0 )); then
    status=1
    repro="$(find "fuzz/artifacts/$t" -type f -newer "$marker" ! -name '*.log' | head -n 1)"
    echo "== fuzz: $t FAILED (exit $rc); the end of its log:"
    grep -E -A1 'panicked at|^==[0-9]+== ?ERROR' "$log" | head -n 6 | sed 's/^/   /' || true
    grep -E '^SUMMARY' "$log" | head -n 1 | sed 's/^/   /' || true
    if [[ -n "$repro" ]]; then
      echo "   reproducer: $ROOT/$repro"
      echo "   replay:     RUSTC_BOOTSTRAP=1 cargo fuzz run ${FUZZ_FLAGS[*]} $t $repro"
    else
      echo "   no reproducer was written; see $log"
    fi
  fi
  rm -f "$marker"
done
exit "$status"
