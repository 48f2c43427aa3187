#!/bin/sh
# Which torch 2.13.0 build `make install` puts in .venv. Prints pip's arguments on stdout and, on stderr, one line
# saying which build it chose and why. Read from the environment (the Makefile passes them on):
#   TORCH=auto|cpu|cuda   auto (the default): the CUDA build where an NVIDIA GPU is found, else the CPU build
#   TORCH_INDEX=URL       torch==2.13.0 from this index instead, whatever the machine
#   TORCH_CPU_INDEX=URL   PyTorch's CPU wheel index (default https://download.pytorch.org/whl/cpu)
#   NVIDIA_PROC=DIR       where the NVIDIA driver lists its GPUs (default /proc/driver/nvidia/gpus)
#   PYTHON                the interpreter that checks whether the CPU index can be reached
# Why: on Linux, PyPI's torch==2.13.0 is the CUDA build with about 20 NVIDIA packages (several GB), which a machine
# without an NVIDIA GPU cannot use; PyTorch's CPU index holds the CPU build (about 200 MB).
set -eu
version=2.13.0
cpu_index=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
cpu_index=${cpu_index%/}
probe_seconds=5

say() { echo "torch $version: $*" >&2; }

# the first NVIDIA GPU found, on stdout; fails when there is none
nvidia_gpu() {
  if command -v nvidia-smi >/dev/null 2>&1 && listed=$(nvidia-smi -L 2>/dev/null | grep -m 1 '^GPU '); then
    echo "$listed"
    return 0
  fi
  for gpu in "${NVIDIA_PROC:-/proc/driver/nvidia/gpus}"/*; do
    if [ -e "$gpu" ]; then
      echo "an NVIDIA GPU at $gpu"
      return 0
    fi
  done
  return 1
}

# whether PyTorch's CPU index answers within $probe_seconds (a machine without that network access fails at once or
# after the timeout, and pip is not left to wait out its own retries)
cpu_index_reachable() {
  "${PYTHON:-python3}" -c "
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).close()
" "$cpu_index/torch/" "$probe_seconds" >/dev/null 2>&1
}

if [ -n "${TORCH_INDEX:-}" ]; then
  say "from $TORCH_INDEX (TORCH_INDEX)"
  echo "torch==$version --index-url $TORCH_INDEX"
  exit 0
fi
case "${TORCH:-auto}" in
  cuda) build=cuda why="TORCH=cuda" ;;
  cpu) build=cpu why="TORCH=cpu" ;;
  auto)
    if gpu=$(nvidia_gpu); then
      build=cuda why="found $gpu"
    else
      build=cpu why="no NVIDIA GPU found (nvidia-smi -L, /proc/driver/nvidia/gpus)"
    fi
    ;;
  *)
    echo "TORCH=$TORCH: expected auto, cpu or cuda" >&2
    exit 2
    ;;
esac
if [ "$build" = cuda ]; then
  say "the CUDA build, PyPI's own (CUDA 13.0, NVIDIA driver 580 or newer): $why; TORCH=cpu for the CPU build"
  # '===': the exact version, which a local build such as 2.13.0+cpu is not, so a CPU wheel on disk cannot win
  echo "torch===$version"
elif cpu_index_reachable; then
  say "the CPU build from PyTorch's CPU wheel index $cpu_index: $why; TORCH=cuda for the CUDA build"
  echo "torch==$version --index-url $cpu_index"
else
  say "the CPU build: $why; $cpu_index cannot be reached (${probe_seconds} s), so torch==$version as pip finds it" \
    "(a CPU wheel from pip's own sources where they hold one, as on this project's machines; from PyPI alone, on" \
    "Linux x86_64 that is the CUDA build)"
  echo "torch==$version"
fi
