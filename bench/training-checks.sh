#!/usr/bin/env bash
# The training check's failure paths on real GPUs: a planted corruption on each GPU in turn (one
# weight bit flipped after a given step; the check must fail naming the divergence at the next
# comparison) and one GPU selected (the check is skipped). Complements training-bench.sh.
#
#   bench/training-checks.sh AGENT OUT_DIR
#
# AGENT must be built with the planted-fault hooks: cargo build --release -p gpuval-agent
# --features test-hooks (`make release` and the images leave them out).
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 AGENT OUT_DIR" >&2
  exit 2
fi
AGENT=$(realpath "$1") OUT=$2
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ! ldconfig -p | grep -q 'libnccl\.so '; then
  lib=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
  if [ -n "$lib" ]; then
    mkdir -p /tmp/nccl-link && ln -sf "$lib" /tmp/nccl-link/libnccl.so
    export LD_LIBRARY_PATH=/tmp/nccl-link${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
fi
step() { printf '\n== %s  (%s)\n' "$*" "$(date -u +%H:%M:%S)" | tee -a "$OUT/checks.txt"; }
short=(--training-steps 8 --training-warmup 2)

step "planted corruption: GPU 1 after step 5, checksums every 5 steps (must fail at step 5)"
GPUVAL_TRAINING_TEST_CORRUPT=1:5 timeout 240 "$AGENT" run --checks training "${short[@]}" \
  --training-checksum-every 5 -o "$OUT/corrupt-gpu1.json" >>"$OUT/checks.txt" 2>&1
echo "rc=$?" | tee -a "$OUT/checks.txt"

step "planted corruption: GPU 0 after step 7, checksums every 3 steps (must fail at step 9)"
GPUVAL_TRAINING_TEST_CORRUPT=0:7 timeout 240 "$AGENT" run --checks training "${short[@]}" \
  --training-checksum-every 3 -o "$OUT/corrupt-gpu0.json" >>"$OUT/checks.txt" 2>&1
echo "rc=$?" | tee -a "$OUT/checks.txt"

step "no corruption, same short run (must pass)"
timeout 240 "$AGENT" run --checks training "${short[@]}" --training-checksum-every 3 \
  -o "$OUT/clean.json" >>"$OUT/checks.txt" 2>&1
echo "rc=$?" | tee -a "$OUT/checks.txt"

step "one GPU selected (skipped)"
timeout 120 "$AGENT" run --checks training --gpus 0 -o "$OUT/one-gpu.json" >>"$OUT/checks.txt" 2>&1
echo "rc=$?" | tee -a "$OUT/checks.txt"

python3 - "$OUT" <<'PY' | tee -a "$OUT/checks.txt"
import json, sys, os
for name in ["corrupt-gpu1", "corrupt-gpu0", "clean", "one-gpu"]:
    try:
        r = json.load(open(os.path.join(sys.argv[1], name + ".json")))
    except (OSError, ValueError) as e:
        print(f"- {name}: no report ({e})")
        continue
    t = r.get("training") or {}
    rep = t.get("replicas") or {}
    print(f"- {name}: node {r.get('verdict')}, training {t.get('verdict')}, checks run: "
          f"{[k for k in ('nccl', 'training') if r.get(k)]}, comparisons {rep.get('comparisons')}, "
          f"divergence {rep.get('divergence')}, GPUs {[(g['index'], g['verdict']) for g in r.get('gpus', [])]}")
PY
