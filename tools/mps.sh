# Sourced by gpu-tests.sh and gpu-bench.sh: the MPS daemon under which several ranks share one GPU.
# start_mps: start the daemon, or keep one already running if a CUDA client can attach to it, else
# replace it. A job killed while its ranks were alive leaves a daemon that refuses every new client
# ("Error 805: MPS client failed to connect"), or one still waiting for those ranks to detach;
# every later run on that machine then fails at its first CUDA call.
# stop_mps: ask our daemon to quit, bounded: quitting waits for the clients to detach, and a rank
# that is still spinning would hold the script (and the output it would print) forever.
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps_pipe} CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps_log}
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
started_mps=0

mps_client_ok() { timeout 60 python3 -c "import torch; torch.zeros(1, device='cuda')" >/dev/null 2>&1; }

stop_mps() {
  timeout 20 bash -c "echo quit | nvidia-cuda-mps-control" >/dev/null 2>&1
  # A daemon that did not quit in time, and its server: pattern anchored at the start of the command
  # line, so that it never matches a shell whose arguments mention the daemon.
  pkill -9 -f '^nvidia-cuda-mps-' 2>/dev/null
  sleep 1
}

restart_mps() { stop_mps; nvidia-cuda-mps-control -d 2>/dev/null && started_mps=1 && echo "=== MPS restarted"; }

# Also stops, at the script's exit, a daemon that it (or a later restart_mps) started.
start_mps() {
  command -v nvidia-cuda-mps-control >/dev/null || return 0
  trap '[ "$started_mps" = 1 ] && stop_mps' EXIT
  if nvidia-cuda-mps-control -d 2>/dev/null; then started_mps=1; echo "MPS started"; return 0; fi
  if mps_client_ok; then echo "MPS already running, and usable"; return 0; fi
  echo "MPS already running but refusing clients: restarting it"
  restart_mps
}
