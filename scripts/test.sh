#!/usr/bin/env bash
# The test suite: installs what the tests need (scripts/setup.sh: NIXL,
# libtorch, etcd...), then runs every test against the real parts.
#
#   scripts/test.sh [extra cargo test args...]
#
# Tests that cannot run here (no GPU, no full PyTorch) print a line starting
# with SKIP saying why; they are listed again at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
# Examples are programs the tests run; build them with the same features first.
cargo build --quiet --features libtorch --examples
# The cargo-fuzz targets must keep compiling (scripts/fuzz.sh runs them).
cargo check --quiet --manifest-path fuzz/Cargo.toml --target-dir target
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# --show-output prints what passing tests wrote, so every SKIP is visible.
set +e
cargo test --no-fail-fast --features libtorch "$@" -- --show-output 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
echo
echo "== summary"
grep -E '^test result:' "$log" | awk '{p+=$4; f+=$6; i+=$8} END {printf "passed %d, failed %d, ignored %d\n", p, f, i}'
if grep -q 'SKIP' "$log"; then
  echo "skipped (with reasons):"
  grep -oE 'SKIP[^"]*' "$log" | sort -u | sed 's/^/  /'
fi
exit "$rc"
