# Sourced by scripts/setup.sh: NIXL's device header, the one build input no
# package registry ships (the nixl-cu13 wheel has no headers).
#
# The kernels need gpu/ucx/nixl_device.cuh and the nixl_types.h it includes.
# When neither NIXL_INCLUDE_DIR nor $NIXL_PREFIX/include (default
# /opt/nvidia/nvda_nixl) has them, the two files are downloaded from NIXL's
# public repository into .deps/nixl-include (git-ignored), where
# build/cuda_kernels.rs finds them, after their SHA-256 matched the sums below.
# Nothing is installed unless both match.
#
# Pinned to tag v1.4.0: the public repository has no tag for the 1.5.x
# wheels (up to its main branch of 2026-08 the project version is 1.4.0);
# nixl_device.cuh is byte-identical from v1.0.0 through v1.4.0 and main, and
# nixl_types.h from v1.2.0 on (v1.0/v1.1 differ only in the type of
# default_comm_port). The 1.5.1 wheel implements this device API; the
# two-process GPU runs were done against exactly these two files.
#
# Expects from the caller: say, DEPS, PY, HEADER_DOWNLOAD (0 = never
# download). Sets HEADER_STATUS for the report.
# Environment: NIXL_HEADERS_URL, another base URL under which src/api/... is
# served (a mirror; the tests use a loopback server).

NIXL_HEADERS_TAG=v1.4.0
NIXL_HEADERS_PUBLIC="https://raw.githubusercontent.com/ai-dynamo/nixl/$NIXL_HEADERS_TAG"
NIXL_HEADERS_URL="${NIXL_HEADERS_URL:-$NIXL_HEADERS_PUBLIC}"
NIXL_HEADERS_DIR="$DEPS/nixl-include"
NIXL_HEADERS_STAMP="$NIXL_HEADERS_DIR/nixl-headers.stamp"
# Path in the repository, path under NIXL_HEADERS_DIR, SHA-256 at the tag.
NIXL_HEADER_FILES=(
  "src/api/gpu/ucx/nixl_device.cuh gpu/ucx/nixl_device.cuh d1fd98b736c6bde966108150ebcda2ae685fe6f2464e351627822df366a376f6"
  "src/api/cpp/nixl_types.h nixl_types.h 3f6741cba5b8b0ca8b3e79fe9de096b00d787a9e9c8b7ad2e96b681064e345c0"
)
HEADER_STATUS="missing: the GPU kernels will be left out (see above)"

has_nixl_headers() { [[ -f "$1/gpu/ucx/nixl_device.cuh" && -f "$1/nixl_types.h" ]]; }

# Compares the two files under $1 with the pinned sums; with $2 = quiet
# prints nothing, otherwise one line per file. Status 0 when both match.
check_nixl_headers() {
  local dir=$1 quiet=${2:-} entry src rel want got rc=0
  for entry in "${NIXL_HEADER_FILES[@]}"; do
    read -r src rel want <<<"$entry"
    got=$(sha256sum "$dir/$rel" 2>/dev/null | cut -d' ' -f1) || true
    if [[ $got == "$want" ]]; then
      [[ -n $quiet ]] || say "  sha256 $got  $rel  ok"
    else
      rc=1
      [[ -n $quiet ]] || say "  sha256 ${got:-(no file)}  $rel  MISMATCH: setup.sh expects $want"
    fi
  done
  return $rc
}

# The one message for every way the header does not get installed: why, the
# two URLs, where the files go, and NIXL_INCLUDE_DIR.
nixl_headers_help() {
  local entry src rel want
  say "NIXL device header not installed: $1"
  say "  Without it the GPU kernels are left out; the host side builds and runs as usual."
  say "  To build the kernels, get these two files (NIXL $NIXL_HEADERS_TAG, public repository):"
  for entry in "${NIXL_HEADER_FILES[@]}"; do
    read -r src rel want <<<"$entry"
    say "    $NIXL_HEADERS_PUBLIC/$src"
  done
  [[ $NIXL_HEADERS_URL == "$NIXL_HEADERS_PUBLIC" ]] || say "  (this run tried NIXL_HEADERS_URL=$NIXL_HEADERS_URL)"
  say "  and put them here (then run scripts/setup.sh again: it checks their SHA-256):"
  for entry in "${NIXL_HEADER_FILES[@]}"; do
    read -r src rel want <<<"$entry"
    say "    $NIXL_HEADERS_DIR/$rel"
  done
  say "  or set NIXL_INCLUDE_DIR to a folder holding gpu/ucx/nixl_device.cuh and nixl_types.h"
  say "  (a NIXL install's include/; NIXL_PREFIX=<that install> works too)."
}

write_nixl_headers_stamp() {
  local dir=$1 source=$2 entry src rel want
  {
    echo "tag $NIXL_HEADERS_TAG"
    echo "source $source"
    for entry in "${NIXL_HEADER_FILES[@]}"; do
      read -r src rel want <<<"$entry"
      echo "sha256 $want  $rel"
    done
  } >"$dir/nixl-headers.stamp"
}

# Downloads both files into a scratch folder beside NIXL_HEADERS_DIR, checks
# them, and only then moves them into place.
download_nixl_headers() {
  local tmp err entry src rel want pairs=()
  for entry in "${NIXL_HEADER_FILES[@]}"; do
    read -r src rel want <<<"$entry"
    pairs+=("$src" "$rel")
  done
  tmp=$(mktemp -d "$DEPS/.nixl-include.XXXXXX")
  say "NIXL device header: downloading NIXL $NIXL_HEADERS_TAG's nixl_device.cuh and nixl_types.h from $NIXL_HEADERS_URL"
  # Python's urllib: no curl needed, proxies from the environment, and a
  # deadline per file so a silent network fails in seconds.
  if ! err=$("$PY" - "$NIXL_HEADERS_URL" "$tmp" "${pairs[@]}" 2>&1 <<'PYEOF'
import os, sys, urllib.request
base, dest, *pairs = sys.argv[1:]
for src, rel in zip(pairs[::2], pairs[1::2]):
    url = f"{base}/{src}"
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            data = r.read(4 << 20)
    except Exception as e:
        sys.exit(f"{url}: {e}")
    os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
    with open(os.path.join(dest, rel), "wb") as f:
        f.write(data)
PYEOF
  ); then
    rm -rf "$tmp"
    nixl_headers_help "the download failed (${err##*$'\n'})."
    return
  fi
  if ! check_nixl_headers "$tmp"; then
    rm -rf "$tmp"
    nixl_headers_help "checksum mismatch: what $NIXL_HEADERS_URL served is not NIXL $NIXL_HEADERS_TAG's files; nothing was installed."
    return
  fi
  for entry in "${NIXL_HEADER_FILES[@]}"; do
    read -r src rel want <<<"$entry"
    mkdir -p "$(dirname "$NIXL_HEADERS_DIR/$rel")"
    mv -f "$tmp/$rel" "$NIXL_HEADERS_DIR/$rel"
  done
  rm -rf "$tmp"
  write_nixl_headers_stamp "$NIXL_HEADERS_DIR" "$NIXL_HEADERS_URL"
  HEADER_STATUS="$NIXL_HEADERS_DIR (NIXL $NIXL_HEADERS_TAG, SHA-256 checked)"
  say "NIXL device header: installed in $HEADER_STATUS; the build finds it there"
}

# Files already in NIXL_HEADERS_DIR: ours (stamp) or placed by hand. Status 0
# when nothing more is to be done.
existing_nixl_headers() {
  if check_nixl_headers "$NIXL_HEADERS_DIR" quiet; then
    [[ -f $NIXL_HEADERS_STAMP ]] || write_nixl_headers_stamp "$NIXL_HEADERS_DIR" "placed by hand"
    HEADER_STATUS="$NIXL_HEADERS_DIR (NIXL $NIXL_HEADERS_TAG, SHA-256 checked)"
    say "NIXL device header: $HEADER_STATUS"
    return 0
  fi
  if [[ -f $NIXL_HEADERS_STAMP ]] && ! grep -qx "tag $NIXL_HEADERS_TAG" "$NIXL_HEADERS_STAMP"; then
    say "NIXL device header: $NIXL_HEADERS_DIR holds an earlier pin's files; replacing them with $NIXL_HEADERS_TAG's"
    return 1
  fi
  say "NIXL device header: the files in $NIXL_HEADERS_DIR are not NIXL $NIXL_HEADERS_TAG's:"
  check_nixl_headers "$NIXL_HEADERS_DIR" || true
  say "  kept as they are (the build uses them); remove them to get the pinned ones."
  HEADER_STATUS="$NIXL_HEADERS_DIR (not the pinned $NIXL_HEADERS_TAG files: unchecked)"
  return 0
}

nixl_headers_step() {
  rm -rf "$DEPS"/.nixl-include.* # scratch folders of an interrupted run
  # Always there, so the build can watch it for the files arriving later.
  mkdir -p "$NIXL_HEADERS_DIR"
  if [[ -n ${NIXL_INCLUDE_DIR:-} ]]; then
    if has_nixl_headers "$NIXL_INCLUDE_DIR"; then
      HEADER_STATUS="NIXL_INCLUDE_DIR=$NIXL_INCLUDE_DIR"
      say "NIXL device header: $HEADER_STATUS"
      return
    fi
    say "NIXL device header: NIXL_INCLUDE_DIR=$NIXL_INCLUDE_DIR has no gpu/ucx/nixl_device.cuh + nixl_types.h; looking further"
  fi
  local prefix_inc="${NIXL_PREFIX:-/opt/nvidia/nvda_nixl}/include"
  if has_nixl_headers "$prefix_inc"; then
    HEADER_STATUS="$prefix_inc (a NIXL install)"
    say "NIXL device header: $HEADER_STATUS"
    return
  fi
  if has_nixl_headers "$NIXL_HEADERS_DIR" && existing_nixl_headers; then
    return
  fi
  if [[ $HEADER_DOWNLOAD == 0 ]]; then
    nixl_headers_help "the download is turned off (--no-header-download or NIXL_HEADERS_DOWNLOAD=0)."
    return
  fi
  download_nixl_headers
}

