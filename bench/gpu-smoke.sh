#!/usr/bin/env bash
# The GPU gate (issue 31): in ONE device call of under 10 minutes, on whatever is lent (1, 2 or 4
# GPUs), every check of the agent with short settings beside its reference on the same GPUs, the
# faults that can be planted on real GPUs, and the operator flow from `kubectl apply`; then
# bench/smoke_summary.py writes OUT_DIR/summary.json (figures, references, ratios, verdicts,
# faults caught, an overall pass).
#
#   bench/gpu-smoke.sh AGENT OUT_DIR        # on the GPU machine, from the repository root
#   bench/gpu-smoke.sh packed OUT_DIR       # the agent from .device-carry/e2e (gpu-e2e.sh pack)
#
# Steps (each under its own `timeout`, within BUDGET_S; every exit code in raw/steps.tsv):
#   build         nvbandwidth, nccl-tests and fio from carried sources (NVBANDWIDTH_SRC,
#                 NCCL_TESTS_SRC, FIO_SRC; default .device-carry/src/{nvbandwidth,nccl-tests,
#                 fio-*.tar.gz}; nvbandwidth's Boost from the Debian packages in .device-carry/deb)
#                 when their binaries are not given; in the background while the GPU checks run
# Every agent step runs twice (ways.txt: `host pod`): as a host process (agent-NAME), and as the
# chart's own pod runs it (pod-agent-NAME): `kubectl apply` of a validation with the same
# settings (bench/e2e/pod-*.yaml) through the real operator, whose agent pod runs as an OCI
# container under runc (gpu-e2e --runc: the pod spec's read-only root, user, capabilities,
# volumes, /tmp and /dev/shm; the agent image assembled here from this machine's CUDA runtime by
# bench/agent-rootfs.sh; the GPUs injected from a CDI spec of the host's driver files,
# bench/cdi-from-host.sh), its stored report against the same references (pod-way.txt names the
# runtime); PODLIKE=0 runs the host way alone. The pod way needs the packed binaries
# (gpu-e2e.sh pack) and runc (.device-carry/deb-runc: Debian's runc and libseccomp2).
#   topology      `gpuval-agent topo --compare` against `nvidia-smi topo -m`, the topology check
#   memory        memory at MEMORY_FRACTION (0.25) of free; PyTorch device-to-device copy
#   compute       a 10 s bf16 burn on every GPU at once; PyTorch sustained bf16, 10 s
#   links         p2p and hostTransfer; nvbandwidth (NVBANDWIDTH=path) else PyTorch link_ref.py
#   nccl          all-reduce, all-gather, reduce-scatter 1 MiB to 1 GiB (x4, so floors apply);
#                 nccl-tests (NCCL_TESTS=dir of *_perf) as reference (2+ GPUs)
#   training      the default shapes, 20 steps; PyTorch DDP (training_ref.py), same shapes (2+ GPUs)
#   io            2 files x 2 GiB on a temp dir; fio (fio_ref.sh: the agent's block size, direct
#                 I/O, one request in flight per job) on the same dir, else dd (io_ref.sh); after
#                 an unmeasured 4 GiB write, the host agent, the reference and the pod-like agent
#                 in turn, five rounds, the order turning each round (the summary takes each side's
#                 best)
#   fault-memory  a second process holds 40% of GPU 0 during the memory check (must fail)
#   fault-compute a second process burns bf16 on GPU 0 during a 10 s burn (must be named, with no
#                 hardware action)
#   pod-fault-before  the pod: a process burning bf16 on GPU 0 (bench/neighbour.sh), started before
#                 the validation's memory and compute checks; NVML in the container lists it not:
#                 it must be caught as busy (GpuBusy), with no hardware action on the Node
#   pod-fault-during  the pod: the burn starts 8 s after the validation is applied, inside its 20 s
#                 compute burn; the same
#   pod-killed    the pod: its container gets SIGKILL 8 s into a 2-minute burn; the node must end
#                 Error naming exit code 137, with no hardware action on the Node
#   fault-training  rank 1's replica never joins the training communicator (the hooks agent,
#                 GPUVAL_TRAINING_TEST_HANG_INIT=1); the check must end in Error naming it, within
#                 its 10 s timeout, the 5 s grace and setup (2+ GPUs)
#   e2e           bench/gpu-e2e.sh device, with 2+ GPUs: `fabric-fault` (SPLIT=<gpus> nodes, the last
#                 one's NCCL without a network); the operator flow from kubectl apply to a verdict
#                 is the pod way's pod-agent-checks (through the real operator and the pod's container)
# Environment: BUDGET_S (570), PODLIKE (1), E2E (1; 0 skips the fabric flow, said in
# steps.tsv), E2E_SCENARIOS (fabric-fault on 2+ GPUs, none on one), HOOKS_AGENT (the agent built with --features test-hooks; packed:
# gpuval-agent-hooks), GPUVAL_COMMIT (written to raw/commit.txt: the device has no git),
# NVBANDWIDTH, NCCL_TESTS, NVBANDWIDTH_SRC, NCCL_TESTS_SRC, BUILD_LIMIT_S (180), IO_DIR,
# MEMORY_FRACTION.
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 AGENT OUT_DIR" >&2
  exit 2
fi
OUT=$(realpath -m "$2")
[ "$1" = packed ] || AGENT=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.." || exit 2
# AGENT `packed`: the agent that bench/gpu-e2e.sh pack put in .device-carry/e2e/gpuval.tar.xz
# (one copy of it travels), unpacked with xz or, without xz, Python's lzma.
if [ "$1" = packed ]; then
  mkdir -p /tmp/gpuval-smoke-bin
  for bin in gpuval-agent gpuval-agent-hooks gpuval-operator gpu-e2e; do
    if command -v xz >/dev/null; then
      xz -dc .device-carry/e2e/gpuval.tar.xz | tar -x -C /tmp/gpuval-smoke-bin "$bin"
    else
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extract(sys.argv[3], sys.argv[2])' \
        .device-carry/e2e/gpuval.tar.xz /tmp/gpuval-smoke-bin "$bin"
    fi || { echo "gpu-smoke.sh: no $bin in .device-carry/e2e/gpuval.tar.xz (run bench/gpu-e2e.sh pack)" >&2; exit 2; }
  done
  AGENT=/tmp/gpuval-smoke-bin/gpuval-agent
  HOOKS_AGENT=/tmp/gpuval-smoke-bin/gpuval-agent-hooks
fi
# The agent with planted-fault hooks (cargo feature test-hooks): HOOKS_AGENT, or packed.
HOOKS_AGENT=${HOOKS_AGENT:-}
RAW=$OUT/raw
STEPS=$RAW/steps.tsv
mkdir -p "$RAW"
BUDGET_S=${BUDGET_S:-570}
BUILD_LIMIT_S=${BUILD_LIMIT_S:-180}
MEMORY_FRACTION=${MEMORY_FRACTION:-0.25}
PODLIKE=${PODLIKE:-1}
E2E=${E2E:-1}
MIN_STEP_S=15
# NVLink multicast stays off (shared test machines; see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# Every tool numbers the GPUs as NVML does (PCI bus order), so GPU i is the same GPU everywhere.
export CUDA_DEVICE_ORDER=PCI_BUS_ID
printf 'step\trc\tseconds\tlimit\tnote\n' >"$STEPS"

say() { printf '[%4ss] %s\n' "$SECONDS" "$*" | tee -a "$RAW/log.txt"; }
# skip NAME WHY: a step that did not run, and why.
skip() {
  printf '%s\tskipped\t0\t0\t%s\n' "$1" "$2" >>"$STEPS"
  say "$1 SKIPPED: $2"
}
# step NAME LIMIT STDOUT CMD...: CMD under `timeout` (LIMIT, cut to the budget left), its stdout
# in STDOUT ('-': with its stderr in raw/NAME.log), its exit code in raw/steps.tsv.
step() {
  local name=$1 limit=$2 stdout=$3
  shift 3
  local left=$((BUDGET_S - SECONDS))
  [ "$limit" -le "$left" ] || limit=$left
  if [ "$limit" -lt "$MIN_STEP_S" ]; then
    skip "$name" "only ${left}s of the ${BUDGET_S}s budget left"
    return 0
  fi
  say "$name (limit ${limit}s)"
  local t0=$SECONDS rc note=""
  if [ "$stdout" = - ]; then
    timeout -k 10 "$limit" "$@" >"$RAW/$name.log" 2>&1
  else
    timeout -k 10 "$limit" "$@" >"$stdout" 2>"$RAW/$name.log"
  fi
  rc=$?
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && note="timed out after ${limit}s"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" "$note" >>"$STEPS"
  tail -n 4 "$RAW/$name.log" | sed 's/^/    /'
  return 0
}
# agent NAME LIMIT ARGS...: `gpuval-agent run ARGS` with its report in raw/NAME.json.
agent() {
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" - "$AGENT" run "$@" -o "$RAW/$name.json"
}
# The pod's way: the operator's own agent pod as a runc container (bench/gpu-smoke-pod.sh sets it
# up: runc, the image, the CDI spec, the control plane; ways.txt and pod-way.txt say whether it
# could).
ways=host
if [ "$PODLIKE" = 1 ]; then
  # shellcheck source=bench/gpu-smoke-pod.sh
  . bench/gpu-smoke-pod.sh
  pod_setup && ways="host pod"
fi
echo "$ways" >"$RAW/ways.txt"
# wait_for FILE SECONDS PID: until helper PID says it is ready (false if it died or took too long).
wait_for() {
  local file=$1 deadline=$((SECONDS + $2)) pid=$3
  while [ ! -e "$file" ] && [ $SECONDS -lt $deadline ] && kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  [ -e "$file" ]
}

# ---- cgroups: the pod way's containers get cgroups of their own under the root
# (/gpuval-gate/<id>, no limits: the pod spec sets none), while this script starts in the device
# command's cgroup, which may carry limits of its own: the first runc gates (6ba5262, 33d3894)
# saw the pod's io 15-20 % faster than the host agent and fio in every round. So the host steps
# and the references run in a sibling cgroup under the root too (/gpuval-gate-host), where
# cgroup v2 lets this shell move; raw/cgroups.txt records where each ran and the limits.
cgroup_report() {
  local cg
  cg=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup 2>/dev/null)
  echo "$1: cgroup ${cg:-unknown}"
  for f in cpu.max memory.max io.max pids.max; do
    [ -r "/sys/fs/cgroup$cg/$f" ] && echo "  $f: $(tr '\n' ' ' <"/sys/fs/cgroup$cg/$f")"
  done
}
{
  cgroup_report "started in"
  if [ -w /sys/fs/cgroup/cgroup.procs ] && mkdir -p /sys/fs/cgroup/gpuval-gate-host 2>/dev/null \
    && echo $$ >/sys/fs/cgroup/gpuval-gate-host/cgroup.procs 2>/dev/null; then
    cgroup_report "host steps and references run in"
  else
    echo "host steps and references stay where the script started (cgroup v2 root not writable)"
  fi
} >"$RAW/cgroups.txt" 2>&1
cat "$RAW/cgroups.txt"

# ---- machine, commit
date -u +%Y-%m-%dT%H:%M:%SZ >"$RAW/started.txt"
if [ -n "${GPUVAL_COMMIT:-}" ]; then
  echo "$GPUVAL_COMMIT" >"$RAW/commit.txt"
elif git rev-parse HEAD >"$RAW/commit.txt" 2>/dev/null; then
  :
else
  rm -f "$RAW/commit.txt"
  say "no commit: set GPUVAL_COMMIT=\$(git rev-parse HEAD) when starting the call"
fi
{
  nvidia-smi -L
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv
} >"$RAW/machine.txt" 2>&1
cat "$RAW/machine.txt"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
if [ "$GPUS" -lt 1 ]; then
  say "no GPU listed by nvidia-smi -L"
  python3 bench/smoke_summary.py "$RAW" "$OUT/summary.json"
  exit 1
fi
# The agent loads NCCL as libnccl.so; a runtime-only install has libnccl.so.2 alone.
if ! ldconfig -p | grep -q 'libnccl\.so '; then
  lib=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
  if [ -n "$lib" ]; then
    mkdir -p /tmp/gpuval-nccl-link && ln -sf "$lib" /tmp/gpuval-nccl-link/libnccl.so
    export LD_LIBRARY_PATH=/tmp/gpuval-nccl-link${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
fi

# ---- build the references from carried sources (background, CPU only)
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -n 1)
if [ -n "$NVCC" ]; then
  PATH=$(dirname "$NVCC"):$PATH
  export PATH
fi
NVBANDWIDTH_SRC=${NVBANDWIDTH_SRC:-.device-carry/src/nvbandwidth}
NCCL_TESTS_SRC=${NCCL_TESTS_SRC:-.device-carry/src/nccl-tests}
build_pids=()
# Debian packages carried for the builds (nvbandwidth's Boost program_options), unpacked aside.
DEBS=/tmp/gpuval-debs
if ls .device-carry/deb/*.deb >/dev/null 2>&1; then
  mkdir -p "$DEBS"
  for deb in .device-carry/deb/*.deb; do dpkg -x "$deb" "$DEBS"; done
fi
if [ -z "${NVBANDWIDTH:-}" ] && [ -d "$NVBANDWIDTH_SRC" ]; then
  if [ -z "$NVCC" ]; then
    skip build-nvbandwidth "no nvcc on this machine"
  else
    NVBANDWIDTH=/tmp/gpuval-nvbandwidth/nvbandwidth
    step build-nvbandwidth "$BUILD_LIMIT_S" - bash -c 'cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES="$3" -DCMAKE_PREFIX_PATH="$4/usr" && cmake --build "$2" -j "$(nproc)"' _ \
      "$NVBANDWIDTH_SRC" /tmp/gpuval-nvbandwidth "$CAP" "$DEBS" &
    build_pids+=($!)
  fi
fi
FIO_SRC=${FIO_SRC:-$(ls .device-carry/src/fio-*.tar.gz .device-carry/src/fio_*.orig.tar.gz 2>/dev/null | head -n 1)}
if [ -z "${FIO:-}" ] && [ -n "$FIO_SRC" ] && [ -f "$FIO_SRC" ]; then
  FIO=/tmp/gpuval-fio/fio
  step build-fio "$BUILD_LIMIT_S" - bash -c 'mkdir -p "$2" && tar -xzf "$1" -C "$2" --strip-components=1 \
    && cd "$2" && ./configure --disable-native && make -j "$(nproc)"' _ "$FIO_SRC" /tmp/gpuval-fio &
  build_pids+=($!)
fi
if [ -z "${NCCL_TESTS:-}" ] && [ -d "$NCCL_TESTS_SRC" ]; then
  if [ -z "$NVCC" ]; then
    skip build-nccl-tests "no nvcc on this machine"
  else
    NCCL_TESTS=/tmp/gpuval-nccl-tests
    # Headers and libnccl.so where the system has no NCCL development files: PyTorch's NCCL
    # wheel and the libnccl.so link made above.
    nccl_inc=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "include"))' 2>/dev/null)
    step build-nccl-tests "$BUILD_LIMIT_S" - env CPATH="$nccl_inc${CPATH:+:$CPATH}" \
      LIBRARY_PATH="/tmp/gpuval-nccl-link${LIBRARY_PATH:+:$LIBRARY_PATH}" \
      make -C "$NCCL_TESTS_SRC" -j "$(nproc)" MPI=0 CUDA_HOME="$(dirname "$(dirname "$NVCC")")" \
      BUILDDIR="$NCCL_TESTS" NVCC_GENCODE="-gencode=arch=compute_$CAP,code=sm_$CAP" \
      ${NCCL_HOME:+NCCL_HOME=$NCCL_HOME} &
    build_pids+=($!)
  fi
fi

# ---- topology
nvidia-smi topo -m >"$RAW/topo-smi.txt" 2>&1
step topo-compare 60 - "$AGENT" topo --compare "$RAW/topo-smi.txt"
agent agent-topology 60 --checks topology

# ---- memory, beside PyTorch's device-to-device copy (and a bf16 burst)
agent agent-memory 120 --checks memory --memory-fraction "$MEMORY_FRACTION"
step torch-burst 120 "$RAW/torch-burst.json" python3 bench/torch_ref.py --phase burst --dtypes bf16

# ---- compute: a 10 s bf16 burn, every GPU at once, beside PyTorch sustained for as long
agent agent-compute 90 --checks compute --duration 10s --dtypes bf16
step torch-compute 120 "$RAW/torch-compute.json" python3 bench/torch_ref.py --phase sustained --sustained bf16:10

if [ ${#build_pids[@]} -gt 0 ]; then
  say "waiting for the reference builds"
  wait "${build_pids[@]}"
fi

# ---- links: p2p and host transfers, beside nvbandwidth (else PyTorch)
agent agent-links 150 --checks p2p,hostTransfer
# ---- the pod's way of topology, memory, compute and links: one validation with the host way's
# settings (bench/e2e/pod-checks.yaml), from kubectl apply to Passed through the operator; its
# stored report stands for each of those steps.
pod_e2e pod-agent-checks 180 pod-checks.yaml passed
for name in topology memory compute links; do
  [ -f "$RAW/pod-agent-checks.json" ] && cp "$RAW/pod-agent-checks.json" "$RAW/pod-agent-$name.json"
done
if [ -n "${NVBANDWIDTH:-}" ] && [ -x "$NVBANDWIDTH" ]; then
  echo "nvbandwidth $NVBANDWIDTH" >"$RAW/links-ref.txt"
  tests=(host_to_device_memcpy_ce device_to_host_memcpy_ce)
  [ "$GPUS" -ge 2 ] && tests+=(device_to_device_memcpy_write_ce device_to_device_bidirectional_memcpy_write_ce)
  for t in "${tests[@]}"; do
    step "nvbandwidth-$t" 90 "$RAW/nvbandwidth-$t.txt" \
      env LD_LIBRARY_PATH="$DEBS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$NVBANDWIDTH" -t "$t"
  done
else
  echo "pytorch bench/link_ref.py (nvbandwidth: ${NVBANDWIDTH:-not given}${NVBANDWIDTH:+, not executable})" >"$RAW/links-ref.txt"
  step torch-links 150 "$RAW/torch-links.json" python3 bench/link_ref.py
fi

# ---- NCCL: the three collectives up to 1 GiB, beside nccl-tests
if [ "$GPUS" -ge 2 ]; then
  agent agent-nccl 120 --checks nccl --nccl-collectives allReduce,allGather,reduceScatter \
    --nccl-min-bytes 1M --nccl-max-bytes 1G --nccl-step-factor 4 --nccl-dtype bf16 \
    --nccl-iterations 20 --nccl-warmup 5
  if [ -n "${NCCL_TESTS:-}" ] && [ -x "$NCCL_TESTS/all_reduce_perf" ]; then
    for t in all_reduce all_gather reduce_scatter; do
      step "nccl-tests-$t" 60 "$RAW/nccl-tests-$t.txt" "$NCCL_TESTS/${t}_perf" -g "$GPUS" \
        -b 1M -e 1G -f 4 -d bfloat16 -n 20 -w 5
    done
  else
    skip nccl-tests "no nccl-tests binaries (NCCL_TESTS=${NCCL_TESTS:-unset}; carry sources in $NCCL_TESTS_SRC)"
  fi
else
  skip agent-nccl "one GPU: no collective to test"
fi

# ---- training: the check's default shapes (fewer steps), beside PyTorch DDP with the same
# shapes (data parallel: 2+ GPUs). Not smaller shapes: the default scaling and exposed-comm
# floors are set for them, and a 6 ms step cannot hide its all-reduce on a healthy node (the
# first smoke, 4x H200 at 1cac93f: efficiency 0.81 for the agent, 0.83 for PyTorch DDP).
if [ "$GPUS" -ge 2 ]; then
  shape=(--steps 20 --warmup 3)
  agent agent-training 150 --checks training --training-steps 20 --training-warmup 3
  # The pod's way: NCCL and training with the host way's settings (bench/e2e/pod-multi.yaml),
  # their child processes under the pod's read-only root, TMPDIR and /dev/shm.
  pod_e2e pod-agent-multi 300 pod-multi.yaml passed
  for name in nccl training; do
    [ -f "$RAW/pod-agent-multi.json" ] && cp "$RAW/pod-agent-multi.json" "$RAW/pod-agent-$name.json"
  done
  step torch-training 150 - python3 -m torch.distributed.run --standalone --nproc_per_node "$GPUS" \
    bench/training_ref.py "${shape[@]}" --out "$RAW/torch-training.json"
else
  skip agent-training "one GPU: data-parallel training needs two"
fi

# ---- planted: a replica that never joins the training communicator (rank 1 skips
# ncclCommInitRank, through the hooks agent); the others wait inside it until the watchdog ends
# the training process, 10 s + 5 s grace after they entered it; the check must end in Error
# naming rank 1 as the one that never joined, marked planted, well inside its limit.
if [ "$GPUS" -lt 2 ]; then
  skip fault-training "one GPU: data-parallel training needs two"
elif [ -z "$HOOKS_AGENT" ] || [ ! -x "$HOOKS_AGENT" ]; then
  skip fault-training "no agent with planted-fault hooks (HOOKS_AGENT, or gpuval-agent-hooks from bench/gpu-e2e.sh pack)"
else
  step fault-training 90 - env GPUVAL_TRAINING_TEST_HANG_INIT=1 "$HOOKS_AGENT" run --checks training \
    --training-steps 5 --training-warmup 1 --training-timeout 10s -o "$RAW/fault-training.json"
fi

# ---- io: a temp dir (uid 65532 may write in it: the pod-like agent uses it too), beside fio
# (else dd) on the same dir
IO_DIR=${IO_DIR:-$(mktemp -d /tmp/gpuval-smoke-io.XXXXXX)}
mkdir -p "$IO_DIR"
chmod 1777 "$IO_DIR"
# Five rounds, the order turning each round so every side starts some of them (agent-io,
# fio-io, pod-agent-io; fio-io-2, pod-agent-io-2, agent-io-2; pod-agent-io-3, agent-io-3,
# fio-io-3; then -4 and -5 as rounds 1 and 2), after an unmeasured 4 GiB write: on this VM's
# disk each writer ran faster than the one before it (the gate at f7f69c1: 1395, 1447, 1536,
# 1461, 1547, 1661 MB/s in that order), so a side that always went first always lost; and a
# 2 GiB phase lasts about a second, so a side's best still moved by 10 % between gates (0.87 to
# 1.19 of fio, 2026-11-28; the shortfall moving between write and read, 2026-12-07): the files
# are 2 GiB each since, a phase of about two seconds. The summary takes each side's best.
io_args=(--checks io --io-dir "$IO_DIR" --io-file-size-mib 2048 --io-files 2 --io-concurrency 2)
io_host() { agent "agent-io$1" 90 "${io_args[@]}"; }
io_pod() { pod_e2e "pod-agent-io$1" 90 pod-io.yaml passed --io-host-path "$IO_DIR"; }
io_ref() {
  if [ -n "${FIO:-}" ] && [ -x "$FIO" ]; then
    step "fio-io$1" 90 "$RAW/fio-io$1.json" bash bench/fio_ref.sh "$FIO" "$IO_DIR" 2048 2 2 8192
  else
    step "dd-io$1" 90 "$RAW/dd-io$1.json" bash bench/io_ref.sh "$IO_DIR" 2048 2 2
  fi
}
step io-warmup 60 - bash -c 'dd if=/dev/zero of="$1/warmup" bs=8M count=512 oflag=direct conv=fsync \
  status=none; rm -f "$1/warmup"' _ "$IO_DIR"
for round in 1 2 3 4 5; do
  sfx=${round/#1/}; sfx=${sfx:+-$sfx}
  case $((round % 3)) in
    1) order=(io_host io_ref io_pod) ;;
    2) order=(io_ref io_pod io_host) ;;
    *) order=(io_pod io_host io_ref) ;;
  esac
  for side in "${order[@]}"; do "$side" "$sfx"; done
done

# ---- planted: memory held by a second process on GPU 0 during the memory check
rm -f "$RAW/holder.ready"
CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 python3 bench/gpu_hog.py hold 0.4 "$RAW/holder.ready" \
  >"$RAW/holder.log" 2>&1 &
holder=$!
if wait_for "$RAW/holder.ready" 60 "$holder"; then
  agent fault-memory 90 --checks memory --memory-fraction "$MEMORY_FRACTION" --gpus 0
else
  skip fault-memory "the holder never became ready (raw/holder.log)"
fi
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null

# ---- planted: a second process burning bf16 on GPU 0 during the burn
rm -f "$RAW/contend.ready" "$RAW/contend.stop"
CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 python3 bench/gpu_hog.py burn "$RAW/contend.ready" \
  "$RAW/contend.stop" >"$RAW/contend.log" 2>&1 &
contender=$!
if wait_for "$RAW/contend.ready" 60 "$contender"; then
  agent fault-compute 90 --checks compute --duration 10s --dtypes bf16 --gpus 0
else
  skip fault-compute "the contender never became ready (raw/contend.log)"
fi
touch "$RAW/contend.stop"
sleep 2
kill "$contender" 2>/dev/null
wait "$contender" 2>/dev/null

# ---- planted, the pod's way: NVML in the agent's container lists no other process. A bf16 burn
# on GPU 0 (bench/neighbour.sh, a host process) started before the validation is applied, then
# one that starts inside its compute burn; then the agent's container killed mid-run. Each must
# end busy or Error with no hardware action on the Node (gpu-e2e checks the Node's marks).
if [[ $ways == *pod* ]]; then
  pod_e2e pod-fault-before 120 pod-neighbour.yaml no-hardware-action \
    --hold-gpu-memory 0:0.01 --hold-command "exec bash bench/neighbour.sh 0"
  pod_e2e pod-fault-during 120 pod-neighbour.yaml no-hardware-action \
    --hold-gpu-memory 0:0.01 --hold-command "exec bash bench/neighbour.sh 8"
  pod_e2e pod-killed 90 pod-killed.yaml no-hardware-action --kill-agent-after 8 \
    --expect-reason "exit code 137"
else
  for name in pod-fault-before pod-fault-during pod-killed; do
    skip "$name" "no pod way on this machine (raw/log.txt)"
  done
fi

# ---- the operator flow from kubectl apply, and the fabric with a bad node (2+ GPUs)
scenarios=
[ "$GPUS" -ge 2 ] && scenarios="fabric-fault"
scenarios=${E2E_SCENARIOS:-$scenarios}
if [ "$E2E" = 0 ]; then
  skip e2e "E2E=0: the fabric flow was not part of this run"
elif [ -z "$scenarios" ]; then
  skip e2e "one GPU: no fabric (the operator flow ran as pod-agent-checks)"
elif [ ! -f .device-carry/e2e/gpuval.tar.xz ] || [ ! -f .device-carry/e2e/control-plane.tar.xz ]; then
  skip e2e "no packed binaries in .device-carry/e2e (run bench/gpu-e2e.sh pack here and carry .device-carry)"
else
  e2e_limit=$((BUDGET_S - SECONDS - 20))
  step e2e "$e2e_limit" - env BUDGET_S=$((e2e_limit - 15)) SCENARIOS="$scenarios" SPLIT="$GPUS" \
    bash bench/gpu-e2e.sh device "$RAW/e2e"
fi
rm -rf "$IO_DIR"

say "summary"
python3 bench/smoke_summary.py "$RAW" "$OUT/summary.json"
rc=$?
# The device tool brings back a limited number of files: raw/ travels as one archive too.
tar -C "$OUT" -czf "$OUT/raw.tar.gz" raw
say "done in ${SECONDS}s (summary exit $rc: 0 pass, 1 not)"
exit "$rc"
