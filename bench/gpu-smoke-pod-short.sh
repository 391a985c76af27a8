# A short pod-way run (for when the device time left does not hold a whole gate, bench/gpu-smoke.sh):
# the operator flow through the chart's own pod under runc, a neighbour before the checks, and
# a killed container, with bench/gpu-smoke-pod.sh's own functions.
set -uo pipefail
OUT_DIR=$1
RAW=$OUT_DIR/raw
mkdir -p "$RAW"
STEPS=$RAW/steps.tsv
BUDGET_S=${BUDGET_S:-200}
MIN_STEP_S=15
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
printf 'step\trc\tseconds\tlimit\tnote\n' >"$STEPS"
say() { printf '[%4ss] %s\n' "$SECONDS" "$*" | tee -a "$RAW/log.txt"; }
skip() { printf '%s\tskipped\t0\t0\t%s\n' "$1" "$2" >>"$STEPS"; say "$1 SKIPPED: $2"; }
step() {
  local name=$1 limit=$2 stdout=$3; shift 3
  local left=$((BUDGET_S - SECONDS)); [ "$limit" -le "$left" ] || limit=$left
  [ "$limit" -ge "$MIN_STEP_S" ] || { skip "$name" "budget"; return 0; }
  say "$name (limit ${limit}s)"; local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$RAW/$name.log" 2>&1
  printf '%s\t%s\t%s\t%s\t\n' "$name" "$?" "$((SECONDS - t0))" "$limit" >>"$STEPS"
  tail -n 6 "$RAW/$name.log" | sed 's/^/    /'
}
mkdir -p /tmp/gpuval-smoke-bin
xz -dc .device-carry/e2e/gpuval.tar.xz | tar -x -C /tmp/gpuval-smoke-bin gpuval-agent gpuval-operator gpu-e2e
AGENT=/tmp/gpuval-smoke-bin/gpuval-agent
nvidia-smi -L >"$RAW/machine.txt"; echo "${GPUVAL_COMMIT:-}" >"$RAW/commit.txt"
. bench/gpu-smoke-pod.sh
pod_setup && ways="host pod" || ways=host
pod_e2e pod-agent-checks 90 pod-checks.yaml passed
pod_e2e pod-fault-before 80 pod-neighbour.yaml no-hardware-action --hold-gpu-memory 0:0.01 --hold-command "exec bash bench/neighbour.sh 0"
pod_e2e pod-killed 45 pod-killed.yaml no-hardware-action --kill-agent-after 8 --expect-reason "exit code 137"
cat "$STEPS"
tar -C "$OUT_DIR" -czf "$OUT_DIR/raw.tar.gz" raw && rm -rf "$RAW"
