# Sourced by the GPU scripts for --mps: a private CUDA MPS control daemon
# for runs whose two processes share one GPU.
#
# Without MPS the GPU time-slices between processes: their kernels never
# run at the same time, so a put in one process and the wait kernel in the
# other take turns (a ping-pong costs ~140 µs per direction on an H100). Under MPS
# both processes' kernels run at once. mps_start starts a daemon with its
# own pipe and log folders (so it touches no system-wide MPS setup and
# changes no GPU setting); every process started afterwards from this
# shell is its client. mps_stop ends it and checks that nothing is left.
MPS_DIR=""
mps_start() {
  command -v nvidia-cuda-mps-control >/dev/null || {
    echo "mps: nvidia-cuda-mps-control is not on PATH (it comes with the NVIDIA driver)" >&2; return 1; }
  MPS_DIR=$(mktemp -d /tmp/nixl-mps.XXXXXX)
  export CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "mps: the control daemon did not start (see $CUDA_MPS_LOG_DIRECTORY)" >&2; return 1; }
  trap mps_stop EXIT
  echo "mps: private control daemon started (pipes in $CUDA_MPS_PIPE_DIRECTORY)" >&2
}
mps_stop() {
  [[ -n "$MPS_DIR" ]] || return 0
  echo quit | nvidia-cuda-mps-control 2>/dev/null
  local i
  for i in $(seq 1 50); do
    pgrep -f "nvidia-cuda-mps-(control|server)" >/dev/null || break
    sleep 0.1
  done
  if pgrep -f "nvidia-cuda-mps-(control|server)" >/dev/null; then
    echo "mps: the daemon did not quit; left running: $(pgrep -af nvidia-cuda-mps | tr '\n' ' ')" >&2
  else
    echo "mps: daemon stopped, nothing left running" >&2
  fi
  rm -rf "$MPS_DIR"; MPS_DIR=""
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
