#!/usr/bin/env bash
# Builds bench/launch-floor/launch_floor.cu, what launching an empty kernel
# costs on one GPU (per call between events, batched, from a graph) by block
# size, parameter size, launch call and attribute (the remote
# memory-synchronization domain NCCL launches in, programmatic dependent
# launch), on a machine with nvcc; the binary runs on a GPU machine without it
# (CUDA runtime static):
#
#   bench/launch-floor/build.sh [--out DIR] [--arch SM]
#   DIR/launch_floor [--calls N] [--device D]   # prints one table
#
#   --out DIR   output folder (created; default <repo>/.gpu-launch-floor)
#   --arch SM   compute capability without the dot (default 90: H100/H200;
#               griddepcontrol and the sync domain need 90 or newer)
#
# Looks for nvcc as bench/link-ceiling/build.sh does (scripts/lib/nvcc.sh).
# Exits 1 saying what is missing, 2 on a bad option.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../../scripts/lib/cli.sh
source "$root/scripts/lib/cli.sh"
# shellcheck source=../../scripts/lib/nvcc.sh
source "$root/scripts/lib/nvcc.sh"
probe_build launch-floor "$@"
