#!/usr/bin/env bash
# Fetches NVRTC (the nvidia-cuda-nvrtc wheel from PyPI, no GPU or driver needed) into the tools
# cache so the unit tests can compile the agent's CUDA kernels on a machine without a GPU.
# Prints the directory holding libnvrtc.so.13.
set -euo pipefail
VERSION=13.0.88
CACHE="${GPUVAL_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuval}/nvrtc-$VERSION"
LIB="$CACHE/nvidia/cu13/lib"
if [ ! -e "$LIB/libnvrtc.so.13" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp" "nvidia-cuda-nvrtc==$VERSION" >&2
  mkdir -p "$CACHE"
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$tmp"/nvidia_cuda_nvrtc-*.whl "$CACHE"
fi
echo "$LIB"
