#!/usr/bin/env bash
# One-call GPU bench: the agent's checks and the PyTorch references on the same GPUs, same call.
#
#   bench/gpu-bench.sh AGENT_BINARY OUT_DIR [BURN_SECONDS] [PARTS]
#
# PARTS (comma-separated, default core,links,io): core = inventory, topology, memory and compute
# against PyTorch; links = p2p and host transfers against PyTorch; io = file I/O against dd
# (IO_DIR, default /tmp/gpuval-io-bench, on the disk to test).
#
# Run from the repository root on a GPU host (the device machine: build the agent elsewhere and
# carry target/release/gpuval-agent). Writes raw JSON, logs and a side-by-side table.md to
# OUT_DIR; bench.tar.gz bundles everything (at most a few files come back from the device).
set -uo pipefail
AGENT=$(realpath "$1"); OUT=$2; BURN=${3:-60}; PARTS=${4:-core,links,io}
IO_DIR=${IO_DIR:-/tmp/gpuval-io-bench}
part() { [[ ",$PARTS," == *",$1,"* ]]; }
mkdir -p "$OUT/raw"
RAW="$OUT/raw"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
step() { printf '\n== %s  (%s)\n' "$*" "$(date -u +%H:%M:%S)" | tee -a "$RAW/steps.log"; }

step "machine"
{ nvidia-smi -L; nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv; uname -r; nproc; } > "$RAW/machine.txt" 2>&1
cat "$RAW/machine.txt"
nvidia-smi topo -m > "$RAW/topo-smi.txt" 2>&1
nvidia-smi -q > "$RAW/nvidia-smi-q.txt" 2>&1

if part core; then
step "agent inventory / topo (compared cell by cell with nvidia-smi topo -m)"
"$AGENT" inventory | tee "$RAW/inventory.txt"
"$AGENT" inventory --json > "$RAW/inventory.json"
"$AGENT" topo --snapshot "$RAW/topo-snapshot.json" --compare "$RAW/topo-smi.txt" > "$RAW/topo-agent.txt" 2> "$RAW/topo-compare.txt"
echo "topo compare exit $?" >> "$RAW/topo-compare.txt"
cat "$RAW/topo-agent.txt" "$RAW/topo-compare.txt"

step "agent selftest (planted bit flips must all be found)"
"$AGENT" selftest 2>&1 | tee "$RAW/selftest.txt"

step "PyTorch burst references (cool GPUs)"
# memverify at the size the agent tests with --memory-fraction 0.8 (same bytes, see below).
"$AGENT" run --checks memory --memory-fraction 0.8 --output "$RAW/agent-memory-0.8.json" > "$RAW/agent-memory-0.8.txt" 2>&1
cat "$RAW/agent-memory-0.8.txt"
GIB=$(python3 -c "import json,sys; r=json.load(open('$RAW/agent-memory-0.8.json')); print(min(g['memory']['testedGib'] for g in r['gpus']))")
python3 bench/torch_ref.py --phase burst --memverify-gib "$GIB" > "$RAW/torch-burst.json" 2> "$RAW/torch-burst.log"
cat "$RAW/torch-burst.json"

step "short burn, like for like: agent 5s bf16, then PyTorch 5s bf16 (all GPUs at once)"
"$AGENT" run --checks compute --duration 5s --dtypes bf16 --output "$RAW/agent-short.json" > "$RAW/agent-short.txt" 2>&1
python3 bench/torch_ref.py --phase sustained --sustained "bf16:5" > "$RAW/torch-short.json" 2> "$RAW/torch-short.log"
cat "$RAW/torch-short.json"

step "agent run: topology + memory (0.95 of free) + ${BURN}s bf16 burn on every GPU at once"
"$AGENT" run --checks topology,memory,compute --duration "${BURN}s" --dtypes bf16 --output "$RAW/agent-bf16.json" 2>&1 | tee "$RAW/agent-bf16.txt"

step "PyTorch sustained bf16 for ${BURN}s on every GPU at once"
python3 bench/torch_ref.py --phase sustained --sustained "bf16:${BURN}" > "$RAW/torch-sustained.json" 2> "$RAW/torch-sustained.log"
cat "$RAW/torch-sustained.json"

step "agent run: fp16, tf32, fp32 (20s each), then PyTorch the same"
"$AGENT" run --checks compute --duration 60s --dtypes fp16,tf32,fp32 --output "$RAW/agent-dtypes.json" 2>&1 | tee "$RAW/agent-dtypes.txt"
python3 bench/torch_ref.py --phase sustained --sustained "fp16:20,tf32:20,fp32:20" > "$RAW/torch-dtypes.json" 2> "$RAW/torch-dtypes.log"
cat "$RAW/torch-dtypes.json"
fi

if part links; then
step "agent p2p (every ordered pair, host-staged too) and host transfers"
"$AGENT" run --checks p2p,hostTransfer --host-staged --output "$RAW/agent-links.json" 2>&1 | tee "$RAW/agent-links.txt"
step "PyTorch p2p copy_ (one stream, then two) and host copies (pinned, pageable, all GPUs at once)"
python3 bench/link_ref.py > "$RAW/torch-links.json" 2> "$RAW/torch-links.log"
cat "$RAW/torch-links.json"
fi

if part io; then
mkdir -p "$IO_DIR"; df -hT "$IO_DIR" > "$RAW/io-disk.txt"; cat "$RAW/io-disk.txt"
step "agent io: 4 files x 1 GiB, 4 writers, O_DIRECT, then dd the same on the same disk"
"$AGENT" run --checks io --io-dir "$IO_DIR" --io-file-size-mib 1024 --io-files 4 --io-concurrency 4 --output "$RAW/agent-io.json" 2>&1 | tee "$RAW/agent-io.txt"
bash bench/io_ref.sh "$IO_DIR" 1024 4 4 > "$RAW/dd-io.json" 2> "$RAW/dd-io.log"
"$AGENT" run --checks io --io-dir "$IO_DIR" --io-file-size-mib 1024 --io-files 4 --io-concurrency 4 --output "$RAW/agent-io-2.json" > "$RAW/agent-io-2.txt" 2>&1
bash bench/io_ref.sh "$IO_DIR" 1024 4 4 > "$RAW/dd-io-2.json" 2>> "$RAW/dd-io.log"
cat "$RAW/dd-io.json" "$RAW/dd-io-2.json"
step "agent io during a 30 s bf16 burn on every GPU"
"$AGENT" run --config bench/io-during-compute.yaml --io-dir "$IO_DIR" --output "$RAW/agent-io-burn.json" 2>&1 | tee "$RAW/agent-io-burn.txt"
fi

step "table"
python3 bench/make_table.py "$RAW" | tee "$OUT/table.md"
tar -C "$OUT" -czf "$OUT/bench.tar.gz" raw table.md
