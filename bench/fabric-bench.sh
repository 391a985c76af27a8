#!/usr/bin/env bash
# The fabric test on real GPUs of one host, as two nodes: two `gpuval-agent fabric` ranks
# (torchrun-style environment), one GPU each, NCCL forced onto its network transport, beside
# the same all-reduce through torch.distributed in the same call; then two planted faults.
#
#   bench/fabric-bench.sh AGENT OUT_DIR
#
# Runs: pass (floor MIN_BUS, TCP pair too), reference (torch.distributed), fault-local (rank 1
# with NCCL_SOCKET_IFNAME naming no interface: its NCCL cannot start, it must be named),
# fault-floor (a floor above what the link gives: both below it, not localizable with two
# nodes, the fabric must fail without naming either).
# Environment: BYTES (1 GiB), ITERS (20), WARMUP (5), MIN_BUS (1 GB/s).
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 AGENT OUT_DIR" >&2
  exit 2
fi
AGENT=$1 OUT=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
BYTES=${BYTES:-1073741824}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MIN_BUS=${MIN_BUS:-1}
export NCCL_NVLS_ENABLE=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader >"$OUT/setup.txt" 2>&1 || true
echo "bytes=$BYTES iters=$ITERS warmup=$WARMUP NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" >>"$OUT/setup.txt"

# Two ranks of the agent's fabric mode; extra arguments go to both, RANK1_ENV to rank 1 only.
fabric() {
  local name=$1 port=$2; shift 2
  local r
  for r in 0 1; do
    local extra=()
    [ "$r" = 1 ] && [ -n "${RANK1_ENV:-}" ] && extra=(env "$RANK1_ENV")
    CUDA_VISIBLE_DEVICES=$r RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "${extra[@]}" "$AGENT" fabric --node-name "node-$r" --nccl-bytes "$BYTES" \
      --round-timeout 60s "$@" -o "$OUT/$name-rank$r.json" >"$OUT/$name-rank$r.txt" 2>&1 &
  done
  wait
  echo "$name: rank 0 exit and report in $OUT/$name-rank0.*"
}

start=$(date +%s)
fabric pass 29500 --nccl-min-bus-gbps "$MIN_BUS" --tcp --tcp-streams 4 --tcp-duration 3s
echo "pass: $(( $(date +%s) - start )) s" >>"$OUT/setup.txt"

for r in 0 1; do
  CUDA_VISIBLE_DEVICES=$r RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29600 \
    python3 "$here/fabric_ref.py" "$BYTES" "$ITERS" "$WARMUP" >"$OUT/reference-rank$r.txt" 2>&1 &
done
wait

RANK1_ENV=NCCL_SOCKET_IFNAME=gpuval-no-such-if fabric fault-local 29700 --nccl-min-bus-gbps "$MIN_BUS"
fabric fault-floor 29800 --nccl-min-bus-gbps 100000
echo "all: $(( $(date +%s) - start )) s" >>"$OUT/setup.txt"
