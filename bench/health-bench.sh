#!/usr/bin/env bash
# Power, pulse, PCIe and memory depth on healthy GPUs, beside the faults that can be planted on
# real GPUs, in one call (issue 19). Runs on the GPU machine, where there is no Rust: it takes a
# prebuilt (stripped) gpuval-agent.
#
#   bench/health-bench.sh AGENT OUT_DIR [BURN_SECONDS] [PULSE_SECONDS]
#
# Healthy runs (every GPU of the machine):
#   power     a bf16 burn: median power against the enforced limit, throttle reasons, slowdown share
#   pulse     a short burn, then load and idle in turn (1 s period): power swing, results checked
#   pcie      memory then host transfers: the link under load, replay and AER counters over the run
#   memory    all three patterns (address, movingInversions, random): GB/s each, bits flipped, rows
#   selftest  planted bit flips found, and their bits counted
#   reference PyTorch on the same GPUs: fill/verify and copy GB/s, pinned host transfers, and a
#             bf16 burn as long as the agent's with nvidia-smi sampling power (table: ratios)
# Planted faults (GPU 0 unless said):
#   holder    a second process holds 40% of GPU 0's memory during the memory check (must fail)
#   contend   a second process runs bf16 matmuls on GPU 0 during the burn (must fail on TFLOP/s)
#   count     a wrong expected GPU count (--expect-gpus; skipped, and
#             said so, when this agent has no such flag)
# Writes raw JSON and logs to OUT_DIR/raw, OUT_DIR/table.md (bench/health_table.py) and
# OUT_DIR/health-bench.tar.gz with everything.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 AGENT OUT_DIR [BURN_SECONDS] [PULSE_SECONDS]" >&2
  exit 2
fi
AGENT=$(realpath "$1") OUT=$2 BURN=${3:-60} PULSE=${4:-30}
here=$(cd "$(dirname "$0")" && pwd)
RAW="$OUT/raw"
mkdir -p "$RAW"
# NVLink multicast stays off (shared test machines; see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
GPUS=$(nvidia-smi -L | grep -c '^GPU')
step() { printf '\n== %s  (%s)\n' "$*" "$(date -u +%H:%M:%S)" | tee -a "$RAW/steps.log"; }
# run NAME TIMEOUT ARGS...: the agent with its table in NAME.txt, its report in NAME.json, its
# exit code in the steps log (0 pass/warn, 1 a check failed, 2 could not run).
run() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$AGENT" run "$@" -o "$RAW/$name.json" >"$RAW/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc" | tee -a "$RAW/steps.log"
  tail -n 40 "$RAW/$name.txt"
}
# wait_for FILE SECONDS: until the helper process says it is ready.
wait_for() {
  local file=$1 deadline=$((SECONDS + $2))
  while [ ! -e "$file" ] && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  [ -e "$file" ]
}

step "machine"
{
  nvidia-smi -L
  nvidia-smi --query-gpu=index,name,driver_version,power.limit,power.default_limit,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv
  uname -r
  nproc
} >"$RAW/machine.txt" 2>&1
cat "$RAW/machine.txt"
nvidia-smi -q -d POWER,PERFORMANCE,PAGE_RETIREMENT,ROW_REMAPPER >"$RAW/nvidia-smi-q.txt" 2>&1
nvidia-smi -q | sed -n '/PCI$/,/Fan Speed/p' >"$RAW/nvidia-smi-pci.txt" 2>&1
"$AGENT" inventory --json >"$RAW/inventory.json" 2>"$RAW/inventory.err"

step "selftest: planted bit flips found, bits counted"
timeout 120 "$AGENT" selftest 2>&1 | tee "$RAW/selftest.txt"

step "power: ${BURN}s bf16 burn on every GPU at once"
run power $((BURN + 120)) --checks compute --duration "${BURN}s" --dtypes bf16

step "pulse: 10s burn, then ${PULSE}s of 1s load/idle cycles"
run pulse $((PULSE + 120)) --checks compute --duration 10s --dtypes bf16 \
  --pulse-period 1s --pulse-duration "${PULSE}s"

step "pcie: memory (address) then host transfers; counters from before the memory check"
run pcie 300 --checks memory,hostTransfer --memory-patterns address

step "memory: address, movingInversions, random at 0.95 of free memory"
run memory 600 --checks memory --memory-patterns address,movingInversions,random

step "reference: PyTorch on the same GPUs (copy and fill/verify GB/s, pinned host transfers, a ${BURN}s bf16 burn with nvidia-smi sampling power)"
python3 "$here/torch_ref.py" --phase burst --dtypes bf16 --memverify-gib 8 >"$RAW/ref-burst.json" 2>"$RAW/ref-burst.log"
echo "ref-burst rc=$?" | tee -a "$RAW/steps.log"
python3 "$here/link_ref.py" >"$RAW/ref-links.json" 2>"$RAW/ref-links.log"
echo "ref-links rc=$?" | tee -a "$RAW/steps.log"
nvidia-smi --query-gpu=index,power.draw,power.limit,clocks_throttle_reasons.active --format=csv,noheader,nounits \
  -lms 200 >"$RAW/ref-power.csv" 2>/dev/null &
sampler=$!
python3 "$here/torch_ref.py" --phase sustained --sustained "bf16:${BURN}" >"$RAW/ref-sustained.json" 2>"$RAW/ref-sustained.log"
echo "ref-sustained rc=$?" | tee -a "$RAW/steps.log"
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null

step "planted: a second process holds 40% of GPU 0's memory during the memory check"
rm -f "$RAW/holder.ready"
CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 python3 "$here/gpu_hog.py" hold 0.4 "$RAW/holder.ready" \
  >"$RAW/holder.log" 2>&1 &
holder=$!
if wait_for "$RAW/holder.ready" 120; then
  run fault-holder 300 --checks memory --memory-patterns address --gpus 0
else
  echo "fault-holder: the holder never became ready" | tee -a "$RAW/steps.log"
fi
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null

step "planted: a second process runs bf16 matmuls on GPU 0 during a 30s burn"
rm -f "$RAW/contend.ready" "$RAW/contend.stop"
CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 python3 "$here/gpu_hog.py" burn "$RAW/contend.ready" \
  "$RAW/contend.stop" >"$RAW/contend.log" 2>&1 &
contender=$!
if wait_for "$RAW/contend.ready" 120; then
  run fault-contend 240 --checks compute --duration 30s --dtypes bf16 --gpus 0
else
  echo "fault-contend: the contender never became ready" | tee -a "$RAW/steps.log"
fi
touch "$RAW/contend.stop"
wait "$contender" 2>/dev/null
cat "$RAW/contend.log"

step "planted: a wrong expected GPU count ($((GPUS + 1)) expected, $GPUS present)"
# The agent's --expect-gpus (node facts); an agent without it skips the step and says so.
EXPECT_GPUS_FLAG=${EXPECT_GPUS_FLAG:---expect-gpus}
if "$AGENT" run --help 2>/dev/null | grep -q -- "$EXPECT_GPUS_FLAG"; then
  run fault-count 120 --checks topology "$EXPECT_GPUS_FLAG" $((GPUS + 1))
else
  echo "fault-count SKIPPED: this agent has no $EXPECT_GPUS_FLAG flag" | tee -a "$RAW/steps.log"
fi

step "table"
python3 "$here/health_table.py" "$RAW" | tee "$OUT/table.md"
tar -C "$OUT" -czf "$OUT/health-bench.tar.gz" raw table.md
ls -l "$OUT"
