# Sourced by scripts/setup.sh after lib/nixl-headers.sh (same caller contract:
# say, DEPS, PY, HEADER_DOWNLOAD): the next layout of NIXL's device header,
# for the test that compiles the kernels against both layouts.
#
# Upstream's main replaces gpu/ucx/nixl_device.cuh with a backend-neutral
# gpu/nixl_device.cuh (NIXL PRs #2111 and #2147; no release has it yet).
# The kernels compile against either (cuda/device_common.cuh); the build
# keeps using the 1.x files above, which match the 1.5.1 wheel's library.
# These go to .deps/nixl-include-next only for tests/setup_headers.rs,
# pinned to PR #2111's head commit and SHA-256 checked like the others.
# nixl_device_config.h is what meson's configure_file makes of the .in with
# the UCX device API found. Never fatal: without them that test says SKIP.
NIXL_NEXT_COMMIT=40cdf47c81503afe1c7308f2bd1a12827942bbe8
NIXL_NEXT_URL="${NIXL_HEADERS_NEXT_URL:-https://raw.githubusercontent.com/ai-dynamo/nixl/$NIXL_NEXT_COMMIT}"
NIXL_NEXT_DIR="$DEPS/nixl-include-next"
NIXL_NEXT_FILES=(
  "src/api/gpu/nixl_device.cuh gpu/nixl_device.cuh 182594014db983f7d2e3af28b1766693f71478819d77de23dcfba23e9f376c7a"
  "src/api/gpu/common/nixl_device_api.cuh gpu/common/nixl_device_api.cuh edccb0eeaff9cb02f9ee3f02432ae2d354afdad039a3836b9a69ab4a2d78fafd"
  "src/api/gpu/common/nixl_device_types.cuh gpu/common/nixl_device_types.cuh 246764ddb99722cc91c21eb4df6d133bbfac443dc0113eeedc8ec616d3a43ebe"
  "src/api/gpu/common/nixl_device_wrappers.cuh gpu/common/nixl_device_wrappers.cuh 65d523e858cd09990ab834f0b04574bb5673ef023d88653921856fdff24c1251"
  "src/api/gpu/ucx/nixl_device_impl.cuh gpu/ucx/nixl_device_impl.cuh 7bf834b0eb2f2e94031b56d8fb21a2f716f83d8b09a7c5496c2b82b54e719f07"
  "src/api/gpu/nixl_device_config.h.in gpu/nixl_device_config.h.in f810c1020deed6156ea48eec5895d5bf4a28c972ba566d58cb4fbd50c7b526ea"
  "src/api/cpp/nixl_types.h nixl_types.h 3f6741cba5b8b0ca8b3e79fe9de096b00d787a9e9c8b7ad2e96b681064e345c0"
)

nixl_next_headers_step() {
  [[ -f $NIXL_NEXT_DIR/gpu/nixl_device_config.h ]] && { say "NIXL next header layout: $NIXL_NEXT_DIR"; return; }
  [[ $HEADER_DOWNLOAD == 0 ]] && { say "NIXL next header layout: not downloaded (download turned off); its compile test will SKIP"; return; }
  local spec=() entry src rel want tmp err
  for entry in "${NIXL_NEXT_FILES[@]}"; do read -r src rel want <<<"$entry"; spec+=("$src" "$rel" "$want"); done
  tmp=$(mktemp -d "$DEPS/.nixl-include-next.XXXXXX")
  if err=$("$PY" - "$NIXL_NEXT_URL" "$tmp" "${spec[@]}" 2>&1 <<'PYEOF'
import hashlib, os, sys, urllib.request
base, dest, *spec = sys.argv[1:]
for src, rel, want in zip(spec[::3], spec[1::3], spec[2::3]):
    url = f"{base}/{src}"
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            data = r.read(4 << 20)
    except Exception as e:
        sys.exit(f"{url}: {e}")
    if hashlib.sha256(data).hexdigest() != want:
        sys.exit(f"{url}: SHA-256 mismatch (not the pinned file)")
    os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
    with open(os.path.join(dest, rel), "wb") as f:
        f.write(data)
cfg = os.path.join(dest, "gpu/nixl_device_config.h")
text = open(cfg + ".in").read().replace("#mesondefine NIXL_HAVE_UCX_GPU_DEVICE_API", "#define NIXL_HAVE_UCX_GPU_DEVICE_API")
open(cfg, "w").write(text)
PYEOF
  ); then
    rm -rf "$NIXL_NEXT_DIR"; mv "$tmp" "$NIXL_NEXT_DIR"
    say "NIXL next header layout: installed in $NIXL_NEXT_DIR (commit ${NIXL_NEXT_COMMIT:0:9}, SHA-256 checked)"
  else
    rm -rf "$tmp"
    say "NIXL next header layout: not installed (${err##*$'\n'}); tests/setup_headers.rs skips its compile"
  fi
}
