#!/usr/bin/env bash
# The nccl check beside nccl-tests on the same machine, GPUs, NCCL library, sizes, data type and
# iteration counts: the agent's all-reduce, all-gather and reduce-scatter sweeps, then
# all_reduce_perf, all_gather_perf and reduce_scatter_perf (prebuilt; pass their directory),
# then the wall time of the agent's full default sweep; bench/nccl_table.py writes table.md.
#
#   bench/nccl-bench.sh AGENT OUT_DIR NCCL_TESTS_BIN_DIR
#
# Environment: GPUS (default: every GPU nvidia-smi lists), DTYPE (bf16), ITERS (20), WARMUP (5).
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 AGENT OUT_DIR NCCL_TESTS_BIN_DIR" >&2
  exit 2
fi
AGENT=$1 OUT=$2 BIN=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
# NVLink multicast stays off (shared test machines; see the device notes).
export NCCL_NVLS_ENABLE=0
GPUS=${GPUS:-$(nvidia-smi -L | grep -c '^GPU')}
DTYPE=${DTYPE:-bf16}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
case "$DTYPE" in bf16) NT_DTYPE=bfloat16 ;; fp32) NT_DTYPE=float ;; *) echo "DTYPE must be bf16 or fp32" >&2; exit 2 ;; esac
echo "GPUs: $GPUS  dtype: $DTYPE  iterations: $ITERS after $WARMUP warm-up" | tee "$OUT/setup.txt"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader >>"$OUT/setup.txt" || true

# The agent: one communicator, the three sweeps, 8 B to 4 GiB x4 (4 GiB itself included).
"$AGENT" run --checks nccl \
  --nccl-collectives allReduce,allGather,reduceScatter \
  --nccl-min-bytes 8 --nccl-max-bytes 4G --nccl-step-factor 4 \
  --nccl-dtype "$DTYPE" --nccl-iterations "$ITERS" --nccl-warmup "$WARMUP" \
  --nccl-log-dir "$OUT/agent-logs" -o "$OUT/agent.json" 2>&1 | tee "$OUT/agent.txt" || true

# nccl-tests: one process, one thread, all GPUs (-g), same sizes; its ladder from 8 B by x4
# stops at 2 GiB, so 4 GiB is a second run.
for t in all_reduce all_gather reduce_scatter; do
  {
    "$BIN/${t}_perf" -g "$GPUS" -b 8 -e 2G -f 4 -d "$NT_DTYPE" -n "$ITERS" -w "$WARMUP"
    "$BIN/${t}_perf" -g "$GPUS" -b 4G -e 4G -d "$NT_DTYPE" -n "$ITERS" -w "$WARMUP"
  } 2>&1 | tee "$OUT/nccl-tests-$t.txt"
done

# The agent's full default sweep (all-reduce, 8 B to 4 GiB), wall time from start to exit.
start=$(date +%s.%N)
"$AGENT" run --checks nccl -o "$OUT/agent-default.json" >"$OUT/agent-default.txt" 2>&1 || true
end=$(date +%s.%N)
echo "$start $end" | awk '{printf "%.2f\n", $2 - $1}' >"$OUT/default-sweep-seconds.txt"

python3 "$here/nccl_table.py" "$OUT" >"$OUT/table.md"
cat "$OUT/table.md"
