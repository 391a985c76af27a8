#!/usr/bin/env bash
# The training check beside PyTorch DDP on the same machine and GPUs, same shapes, dtype,
# bucket size, batch and step counts, in one call: the agent's run (its one-GPU, compute-only
# and overlapped phases), PyTorch DDP over every GPU (one process a GPU, torch.compile off) and
# PyTorch on one GPU; each twice, alternating; then the agent with a planted corruption (one
# weight bit flipped on GPU 1 after step 5) that must fail. bench/training_table.py writes
# table.md.
#
#   bench/training-bench.sh AGENT OUT_DIR
#
# AGENT must be built with the planted-fault hooks: cargo build --release -p gpuval-agent
# --features test-hooks (`make release` and the images leave them out).
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 AGENT OUT_DIR" >&2
  exit 2
fi
AGENT=$(realpath "$1") OUT=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
# NVLink multicast stays off (shared test machines; see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
GPUS=$(nvidia-smi -L | grep -c '^GPU')
step() { printf '\n== %s  (%s)\n' "$*" "$(date -u +%H:%M:%S)" | tee -a "$OUT/log.txt"; }

# The agent loads NCCL as libnccl.so; a runtime-only install has libnccl.so.2 alone.
if ! ldconfig -p | grep -q 'libnccl\.so '; then
  lib=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
  if [ -n "$lib" ]; then
    mkdir -p /tmp/nccl-link && ln -sf "$lib" /tmp/nccl-link/libnccl.so
    export LD_LIBRARY_PATH=/tmp/nccl-link${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
fi
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
  echo "agent NCCL: $(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')"
} >"$OUT/setup.txt" 2>&1
cat "$OUT/setup.txt"

step "agent smoke: small shapes, 5 steps"
timeout 120 "$AGENT" run --checks training --training-layers 2 --training-hidden 1024 \
  --training-steps 5 --training-warmup 1 -o "$OUT/agent-smoke.json" >"$OUT/agent-smoke.txt" 2>&1
echo "rc=$?" | tee -a "$OUT/log.txt"
tail -n 12 "$OUT/agent-smoke.txt" | tee -a "$OUT/log.txt"

for round in a b; do
  step "agent, $GPUS GPUs, round $round"
  timeout 240 "$AGENT" run --checks training -o "$OUT/agent-$round.json" >"$OUT/agent-$round.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/log.txt"
  tail -n 12 "$OUT/agent-$round.txt" | tee -a "$OUT/log.txt"
  step "PyTorch DDP, $GPUS processes, round $round"
  timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node "$GPUS" \
    "$here/training_ref.py" --out "$OUT/torch-ddp-$round.json" >>"$OUT/log.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/log.txt"
  step "PyTorch one GPU, round $round"
  CUDA_VISIBLE_DEVICES=0 timeout 240 python3 "$here/training_ref.py" --out "$OUT/torch-1gpu-$round.json" >>"$OUT/log.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/log.txt"
done

step "agent, planted corruption: GPU 1, one weight bit after step 5 (must fail)"
GPUVAL_TRAINING_TEST_CORRUPT=1:5 timeout 240 "$AGENT" run --checks training --training-steps 8 \
  --training-warmup 2 --training-checksum-every 5 -o "$OUT/agent-corrupt.json" \
  >"$OUT/agent-corrupt.txt" 2>&1
echo "rc=$?" | tee -a "$OUT/log.txt"
tail -n 12 "$OUT/agent-corrupt.txt" | tee -a "$OUT/log.txt"

python3 "$here/training_table.py" "$OUT" >"$OUT/table.md"
cat "$OUT/table.md"
