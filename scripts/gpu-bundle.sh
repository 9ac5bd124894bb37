#!/usr/bin/env bash
# Packs what a GPU machine without cargo or internet needs to run the
# examples into .gpu/: release binaries built with the device kernels (and
# the EP mask check, tests/ep_mask_check.rs, as bin/ep_mask_check), and
# the NIXL + UCX libraries of the nixl-cu13 wheel (only those the UCX
# backend loads), keeping the wheel's folder layout their RPATHs expect.
#
#   NIXL_PREFIX=/path/to/nixl scripts/gpu-bundle.sh    # or NIXL_INCLUDE_DIR=...
#
# Then copy the checkout (or just .gpu/ and scripts/) to the GPU machine and
# run bench/gpu-check.sh there. Checks first that the kernels can be
# built here (nvcc and the headers, as `cargo build -vv` would find them)
# and stops with what is missing otherwise; the release build is the one
# `cargo build --release` makes, so nothing rebuilds afterwards.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
while (($#)); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    *) bad_option "$1" ;;
  esac
done
OUT="$ROOT/.gpu"
say() { printf '[gpu-bundle] %s\n' "$*" >&2; }

SITE=$(ls -d .venv/lib/python3*/site-packages 2>/dev/null | head -1)
[[ -n "$SITE" && -f "$SITE/.nixl_cu13.mesonpy.libs/libnixl_capi.so" ]] || {
  echo "gpu-bundle: no nixl-cu13 wheel in .venv: run scripts/setup.sh first" >&2; exit 1; }

say "building release binaries with the device kernels"
cargo build --release --bins --examples 2>&1 | grep -v '^\s*Compiling' >&2
# The build leaves the kernels out (with a warning) when it cannot make
# them; a bundle without them would only fail on the GPU machine. The build
# script's output says which it did. (NIXL_REQUIRE_KERNELS=1 would fail the
# build instead, but it is a build setting: the next plain `cargo build
# --release` would rebuild everything without it.)
out=$(ls -t target/release/build/nixl-device-examples-*/output 2>/dev/null | head -1)
if [[ -z $out ]] || ! grep -q '^cargo:rustc-cfg=nixl_kernels$' "$out"; then
  why=$(sed -n 's/^cargo:rustc-env=NIXL_KERNELS_MISSING=//p' "$out" 2>/dev/null)
  echo "gpu-bundle: the device kernels cannot be built here: ${why:-see cargo build -vv}" >&2
  exit 1
fi

# The EP mask check: a test without cargo's harness, so a plain program, at
# a path cargo names.
mask_check=$(cargo test --release --test ep_mask_check --no-run --message-format=json \
  2> >(grep -v '^\s*Compiling' >&2) | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
[[ -x $mask_check ]] || { echo "gpu-bundle: building tests/ep_mask_check.rs failed" >&2; exit 1; }

rm -rf "$OUT"; mkdir -p "$OUT/stage/bin" "$OUT/stage/nixl"
for b in target/release/simple_write target/release/ep target/release/collectives target/release/pipeline target/release/examples/*; do
  [[ -f "$b" && -x "$b" && "$b" != *.d && "$(basename "$b")" != *-* ]] && cp "$b" "$OUT/stage/bin/"
done
cp "$mask_check" "$OUT/stage/bin/ep_mask_check"

# The libraries: libnixl* and the UCX plugin, plus everything they load
# from the wheel's bundled-library folder (UCX, its transport modules, etcd client).
M="$SITE/.nixl_cu13.mesonpy.libs"; L="$SITE/nixl_cu13.libs"
mkdir -p "$OUT/stage/nixl/.nixl_cu13.mesonpy.libs/plugins" "$OUT/stage/nixl/nixl_cu13.libs"
cp -a "$M"/*.so* "$OUT/stage/nixl/.nixl_cu13.mesonpy.libs/"
cp -a "$M/plugins/libplugin_UCX.so" "$OUT/stage/nixl/.nixl_cu13.mesonpy.libs/plugins/"
needed=$(LD_LIBRARY_PATH="$SITE/nvidia/cu13/lib" ldd "$M/libnixl_capi.so" "$M/plugins/libplugin_UCX.so" \
  | awk '/nixl_cu13.libs/ {print $3}' | xargs -n1 basename | sort -u)
for f in $needed; do cp -a "$L/$f" "$OUT/stage/nixl/nixl_cu13.libs/"; done
cp -a "$L/ucx" "$OUT/stage/nixl/nixl_cu13.libs/"
# UCX loads its transport modules from ucx/ at run time; what they link from
# the wheel's top-level folder must come too. Only top-level files: copying a
# module (say libuct_cuda) up a level makes UCX load it twice, register each
# CUDA transport twice, and the device API then finds no lane.
for mod in "$L"/ucx/*.so*; do
  LD_LIBRARY_PATH="$L" ldd "$mod" 2>/dev/null | awk '{print $3}' | while read -r dep; do
    base=$(basename "$dep")
    if [[ -n "$base" && -f "$L/$base" ]]; then cp -an "$L/$base" "$OUT/stage/nixl/nixl_cu13.libs/"; fi
  done
done
# The wheel's metadata, so reports can name the NIXL version.
cp -a "$SITE"/nixl_cu13-*.dist-info "$OUT/stage/nixl/" 2>/dev/null || true
# UCX's CUDA modules link the CUDA runtime; ship the wheel's copy beside them.
cp -a "$SITE"/nvidia/cu13/lib/libcudart.so.13* "$OUT/stage/nixl/nixl_cu13.libs/"
tar -C "$OUT/stage" -cJf "$OUT/bundle.tar.xz" .
rm -rf "$OUT/stage"
say "wrote $OUT/bundle.tar.xz ($(du -h "$OUT/bundle.tar.xz" | cut -f1))"
