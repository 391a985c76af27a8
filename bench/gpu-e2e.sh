#!/usr/bin/env bash
# Issue 7: the whole gpuval flow on real GPUs in one call, from `kubectl apply` to a verdict.
#
#   bench/gpu-e2e.sh pack            # here: build, strip and compress everything the GPU
#                                    # machine needs into .device-carry/e2e/ (git-ignored)
#   bench/gpu-e2e.sh device OUT_DIR  # on the GPU machine, from the repository root: unpack to
#                                    # /tmp, run the scenarios on the real GPUs, write OUT_DIR
#   bench/gpu-e2e.sh local [OUT_DIR] # here: the same scenarios from the same packed files, with
#                                    # the SIMULATED backend (proves the script end to end)
#   bench/gpu-e2e.sh collect OUT_DIR DEST  # here: keep the YAML and summaries of a device run
#                                    # (OUT_DIR as fetched) in DEST, e.g. bench/results/DATE-h200x4-e2e
#
# Scenarios (each a fresh control plane: etcd, kube-apiserver, kube-controller-manager; this
# host registered as a Node with its real GPU count; the real gpuval-operator binary; the agent
# run for its pod by tests/src/bin/gpu_e2e.rs):
#   1 standard         bench/e2e/standard.yaml must end Passed with real figures
#   2 fault-memory     another process holds HOLD_FRACTION of GPU HOLD_GPU's memory; the
#                      validation must end Failed naming this node, that GPU and the reason
#   3 fault-threshold  a bf16 floor no GPU reaches; Failed naming every GPU (run only while
#                      enough of the time budget is left)
# OUT_DIR gets summary.log (every scenario's summary and wall time) and e2e.tar.gz (per
# scenario: validation.yaml, results.yaml, summary.txt, run.log, logs/).
#
# With SCENARIOS="fabric fabric-fault" it runs instead the fabric test through the operator,
# (SCENARIOS may also name `standard`, run first: bench/gpu-smoke.sh asks for "standard fabric-fault")
# this host registered as SPLIT (2) Nodes with its GPUs dealt out (bench/e2e/fabric*.yaml):
#   fabric             every node passes its checks and the fabric rounds; Passed
#   fabric-fault       the last node's NCCL is given no network interface; with SPLIT of 3 or
#                      more, that node, and no other, is named at fault (its healthy peers see
#                      "remote process exited" and must not be named: issue 32); with two, it
#                      is a suspect, none is named and neither is Failed (nothing proves which)
#   fabric-floor       the last node's agent sends on its sockets at THROTTLE_MBPS (400 MB/s,
#                      bench/e2e/throttle.c preloaded into it alone; simulated: net=40 GB/s)
#                      so that only groups holding it miss the bus-bandwidth floor of
#                      bench/e2e/fabric-floor.yaml; that node, and no other, is named, or the
#                      report says it could not localize (needs SPLIT of 3 or more: with two
#                      nodes nothing can be cleared; FLOOR_GBPS, 1 (the spec takes whole GB/s), lies between the healthy
#                      and the throttled figure)
# Environment: BUDGET_S (default 570: the whole device call must stay under 10 minutes),
# HOLD_GPU (2), HOLD_FRACTION (0.25), PACK_CONTROLLER_MANAGER (1; 0 leaves it out), SCENARIOS,
# SPLIT.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARRY=.device-carry/e2e
TOOLS_SRC=${GPUVAL_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuval/tools-k8s1.36.3}/bin
BUDGET_S=${BUDGET_S:-570}
HOLD_GPU=${HOLD_GPU:-2}
HOLD_FRACTION=${HOLD_FRACTION:-0.25}
START=$(date +%s.%N)

elapsed() { echo "$(date +%s.%N) $START" | awk '{printf "%.1f", $1 - $2}'; }
say() { printf '[%6ss] %s\n' "$(elapsed)" "$*"; }
die() { echo "gpu-e2e.sh: $*" >&2; exit 2; }
size() { stat -c %s "$1"; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

pack() {
    local target=${CARGO_TARGET_DIR:-target}
    local stage
    stage=$(mktemp -d)
    # The agent with planted-fault hooks, for the GPU gate's fault steps alone (the images and
    # `make release` leave them out); built first, since the plain build below takes its place.
    say "cargo build --release --features test-hooks (gpuval-agent-hooks)"
    cargo build --release -p gpuval-agent --features test-hooks --bin gpuval-agent || die "cargo build (hooks) failed"
    strip -o "$stage/gpuval-agent-hooks" "$target/release/gpuval-agent" || die "strip gpuval-agent-hooks failed"
    say "cargo build --release (gpuval-agent, gpuval-operator, gpu-e2e)"
    cargo build --release -p gpuval-agent -p gpuval-operator -p gpuval-tests \
        --bin gpuval-agent --bin gpuval-operator --bin gpu-e2e || die "cargo build failed"
    mkdir -p "$CARRY"
    for b in gpuval-agent gpuval-operator gpu-e2e; do
        strip -o "$stage/$b" "$target/release/$b" || die "strip $b failed"
    done
    say "compressing our binaries"
    tar -C "$stage" -c gpuval-agent gpuval-agent-hooks gpuval-operator gpu-e2e |
        xz -T0 --lzma2=preset=9e,dict=64MiB > "$CARRY/gpuval.tar.xz" || die "xz failed"

    local cp=(etcd kube-apiserver)
    [ "${PACK_CONTROLLER_MANAGER:-1}" = 1 ] && cp+=(kube-controller-manager)
    local b
    for b in "${cp[@]}"; do [ -x "$TOOLS_SRC/$b" ] || die "$TOOLS_SRC/$b missing: run tests/scripts/build-control-plane.sh"; done
    # One solid archive with a window larger than all of it: kube-apiserver and
    # kube-controller-manager share most of their code. Slow (minutes), so it is kept while the
    # binaries are unchanged.
    local stamp
    stamp=$(cd "$TOOLS_SRC" && sha256sum "${cp[@]}" | sha256sum | cut -c1-16)
    if [ -f "$CARRY/control-plane.tar.xz" ] && [ "$(cat "$CARRY/control-plane.stamp" 2>/dev/null)" = "$stamp" ]; then
        say "control-plane.tar.xz is up to date (${cp[*]})"
    else
        say "compressing ${cp[*]} (xz -9e, 256 MiB window; a few minutes)"
        tar -C "$TOOLS_SRC" -c "${cp[@]}" |
            xz -T1 --lzma2=preset=9e,dict=256MiB > "$CARRY/control-plane.tar.xz.part" || die "xz failed"
        mv "$CARRY/control-plane.tar.xz.part" "$CARRY/control-plane.tar.xz"
        echo "$stamp" > "$CARRY/control-plane.stamp"
    fi
    (cd "$CARRY" && sha256sum gpuval.tar.xz control-plane.tar.xz > SHA256SUMS)

    echo
    printf '%-28s %12s %12s\n' "file" "unpacked" "packed"
    local total_raw=0 f raw
    for f in gpuval-agent gpuval-agent-hooks gpuval-operator gpu-e2e; do
        raw=$(size "$stage/$f"); total_raw=$((total_raw + raw))
        printf '  %-26s %12s\n' "$f" "$(mib "$raw")"
    done
    printf '%-28s %12s %12s\n' "gpuval.tar.xz" "" "$(mib "$(size "$CARRY/gpuval.tar.xz")")"
    for f in "${cp[@]}"; do
        raw=$(size "$TOOLS_SRC/$f"); total_raw=$((total_raw + raw))
        printf '  %-26s %12s\n' "$f" "$(mib "$raw")"
    done
    printf '%-28s %12s %12s\n' "control-plane.tar.xz" "" "$(mib "$(size "$CARRY/control-plane.tar.xz")")"
    rm -rf "$stage"
    local repo carry
    repo=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
    carry=$(du -sb .device-carry | cut -f1)
    echo
    echo "binaries unpacked:               $(mib "$total_raw")"
    echo "repository (tracked + untracked): $(mib "$repo")"
    echo ".device-carry (all of it):        $(mib "$carry")"
    echo "travels in all:                   $(mib $((repo + carry))) of 64 MiB"
    [ $((repo + carry)) -lt $((64 * 1048576)) ] || die "too big for the device call (64 MiB)"
    other=$(find .device-carry -type f ! -path "$CARRY/*" | head -5)
    [ -z "$other" ] || echo "note: .device-carry holds other files too (counted above): $other"
}

# Unpacks the carried archives into $1 (xz, else Python's lzma: the GPU machine has Python).
unpack() {
    local dest=$1 f
    [ -f "$CARRY/gpuval.tar.xz" ] && [ -f "$CARRY/control-plane.tar.xz" ] ||
        die "$CARRY is not packed: run bench/gpu-e2e.sh pack first"
    if command -v sha256sum > /dev/null; then
        (cd "$CARRY" && sha256sum -c --quiet SHA256SUMS) || die "$CARRY does not match SHA256SUMS"
    fi
    mkdir -p "$dest/bin"
    for f in "$CARRY/gpuval.tar.xz" "$CARRY/control-plane.tar.xz"; do
        if command -v xz > /dev/null; then
            xz -dc "$f" | tar -x -C "$dest/bin" || die "unpack $f failed"
        else
            python3 -c 'import sys, tarfile
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], **kw)' \
                "$f" "$dest/bin" || die "unpack $f failed"
        fi
    done
    chmod +x "$dest/bin/"*
}

# run_scenario NAME TIMEOUT_S ARGS...: the runner with a wall-clock limit within the budget.
run_scenario() {
    local name=$1 limit=$2
    shift 2
    local left t0 rc
    left=$(awk -v b="$BUDGET_S" -v e="$(elapsed)" 'BEGIN {printf "%d", b - e}')
    [ "$limit" -le "$left" ] || limit=$left
    if [ "$limit" -lt 30 ]; then
        say "$name: SKIPPED (only ${left}s of the ${BUDGET_S}s budget left)" | tee -a "$OUT/summary.log"
        SKIPPED="$SKIPPED $name"
        return 0
    fi
    mkdir -p "$WORK/$name"
    say "scenario $name (limit ${limit}s)" | tee -a "$OUT/summary.log"
    t0=$(date +%s.%N)
    timeout -k 10 "$limit" "$BIN/gpu-e2e" --out "$WORK/$name" "$@" > "$WORK/$name/run.log" 2> "$WORK/$name/stderr.log"
    rc=$?
    local wall
    wall=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.1f", $1 - $2}')
    {
        echo "== $name: exit $rc, wall ${wall}s"
        if [ -f "$WORK/$name/summary.txt" ]; then cat "$WORK/$name/summary.txt"; else tail -n 25 "$WORK/$name/run.log" "$WORK/$name/stderr.log"; fi
        echo
    } | tee -a "$OUT/summary.log"
    [ "$rc" = 0 ] || FAILED="$FAILED $name"
}

scenarios() {
    local backend=$1
    FAILED="" SKIPPED=""
    local sim=() hold=() reason_mem="another process holds GPU memory"
    if [ "$backend" = sim ]; then
        sim=(--backend sim --simulate "gpus=4,model=H200,timescale=0.01")
        # The simulator cannot hold memory: it plants corrupted words on the same GPU instead,
        # and a stand-in holder exercises the helper process's start, wait and stop.
        hold=(--backend sim --simulate "gpus=4,model=H200,timescale=0.01,fail=memory@$HOLD_GPU"
            --hold-command 'echo "holding nothing (simulated backend; GPU$GPUVAL_HOLD_GPU, fraction $GPUVAL_HOLD_FRACTION)"; exec cat')
        reason_mem="mismatched word"
    fi
    if [ -n "${SCENARIOS:-}" ]; then
        local want
        for want in $SCENARIOS; do
            case "$want" in
                standard | fabric | fabric-fault | fabric-floor) ;;
                *) die "SCENARIOS: unknown scenario $want (standard, fabric, fabric-fault, fabric-floor; unset runs the standard three)" ;;
            esac
        done
        case " $SCENARIOS " in *" standard "*)
            run_scenario standard 300 --validation bench/e2e/standard.yaml --expect passed --timeout 240 "${sim[@]}" ;;
        esac
        fabric_scenarios "$backend"
        return
    fi
    run_scenario standard 300 --validation bench/e2e/standard.yaml --expect passed --timeout 240 "${sim[@]}"
    if [ "$backend" = cuda ]; then
        echo "reference, agent bench on 4x H200 (bench/results/2026-11-21-h200x4/table.md): memory fill+verify" \
            "4332-4355 GB/s; bf16 8192^3 sustained 60 s, all GPUs at once, 677-687 TFLOP/s at the 700 W cap" | tee -a "$OUT/summary.log"
    fi
    run_scenario fault-memory 180 --validation bench/e2e/fault-memory.yaml --expect failed --timeout 150 \
        --hold-gpu-memory "$HOLD_GPU:$HOLD_FRACTION" --expect-gpu "$HOLD_GPU" \
        --expect-reason "$reason_mem" "${hold[@]}"
    run_scenario fault-threshold 150 --validation bench/e2e/fault-threshold.yaml --expect failed --timeout 120 \
        --expect-gpu all --expect-reason "TFLOP/s < 1500 TFLOP/s (spec minTflops)" "${sim[@]}"
}

# The fabric test through the operator: this host registered as SPLIT Nodes (its GPUs dealt
# out), once healthy and once with NCCL on the last node pointed at no interface.
fabric_scenarios() {
    local backend=$1 split=${SPLIT:-2} last
    last=$((split - 1))
    local sim=() fault=(--node-env "$last:NCCL_SOCKET_IFNAME=gpuval-no-such-if")
    # A slow NIC on the last node: bench/e2e/throttle.c, preloaded into its agent alone, caps
    # what it sends on its sockets to THROTTLE_MBPS (400 MB/s). (NCCL_SOCKET_NTHREADS=1 and
    # NCCL_NSOCKS_PERTHREAD=1 are no cap: NCCL's default is the main thread and one socket.)
    local throttle=/tmp/gpuval-throttle.so
    local capped=(--node-env "$last:LD_PRELOAD=$throttle" --node-env "$last:GPUVAL_THROTTLE_MBPS=${THROTTLE_MBPS:-400}")
    if [ "$backend" = sim ]; then
        sim=(--backend sim --simulate "gpus=$split,model=H200,timescale=0.01")
        fault=(--node-env "$last:GPUVAL_SIMULATE=gpus=1,model=H200,timescale=0.01,netfault=local")
        capped=(--node-env "$last:GPUVAL_SIMULATE=gpus=1,model=H200,timescale=0.01,net=40")
    fi
    case " $SCENARIOS " in *" fabric "*)
        run_scenario fabric 280 --validation bench/e2e/fabric.yaml --expect passed --timeout 240 \
            --split "$split" "${sim[@]}" ;;
    esac
    case " $SCENARIOS " in *" fabric-fault "*)
        run_scenario fabric-fault 280 --validation bench/e2e/fabric-fault.yaml --expect failed --timeout 240 \
            --split "$split" --expect-node "$last" "${sim[@]}" "${fault[@]}" ;;
    esac
    case " $SCENARIOS " in *" fabric-floor "*)
        local floor_yaml="$OUT/fabric-floor.yaml"
        if [ "$backend" = cuda ]; then
            cc -shared -fPIC -O2 -o "$throttle" bench/e2e/throttle.c -ldl -lpthread \
                || die "building bench/e2e/throttle.c failed"
        fi
        # Simulated: healthy groups give 380 GB/s, those holding the capped node 38. On GPUs over
        # sockets: about 3.6 GB/s healthy (issue 32's 4-node run), the throttled node's groups
        # under THROTTLE_MBPS.
        local floor=${FLOOR_GBPS:-1}
        [ "$backend" = sim ] && floor=${FLOOR_GBPS:-100}
        sed "s/minBusBandwidthGbps: .*/minBusBandwidthGbps: $floor/" \
            bench/e2e/fabric-floor.yaml > "$floor_yaml"
        run_scenario fabric-floor 280 --validation "$floor_yaml" --expect failed --timeout 240 \
            --split "$split" --expect-node "$last" "${sim[@]}" "${capped[@]}" ;;
    esac
}

run_all() {
    local backend=$1
    OUT=$(realpath -m "$2")
    mkdir -p "$OUT"
    : > "$OUT/summary.log"
    local dest
    dest=$(mktemp -d /tmp/gpue2e.XXXXXX)
    say "unpacking $CARRY into $dest" | tee -a "$OUT/summary.log"
    unpack "$dest"
    say "unpacked: $(ls "$dest/bin" | tr '\n' ' ')" | tee -a "$OUT/summary.log"
    BIN=$dest/bin
    WORK=$dest/out
    export GPUVAL_TOOLS_DIR=$dest
    {
        echo "host $(hostname), $(uname -r), $(nproc) CPUs, backend $backend"
        if [ "$backend" = cuda ]; then
            nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1
        fi
        "$BIN/gpuval-agent" inventory $([ "$backend" = sim ] && echo --simulate gpus=4,model=H200) 2>&1
    } | tee -a "$OUT/summary.log"
    local ngpu=4
    [ "$backend" = cuda ] && ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    if [ "$ngpu" -gt 0 ] && [ "$HOLD_GPU" -ge "$ngpu" ]; then
        HOLD_GPU=$((ngpu - 1))
        echo "only $ngpu GPU(s): the memory fault goes to GPU$HOLD_GPU" | tee -a "$OUT/summary.log"
    fi
    scenarios "$backend"
    tar -C "$WORK" -czf "$OUT/e2e.tar.gz" . || echo "tar failed" | tee -a "$OUT/summary.log"
    rm -rf "$dest"
    if [ -z "$FAILED$SKIPPED" ]; then
        say "ALL SCENARIOS PASS (total $(elapsed)s)" | tee -a "$OUT/summary.log"
        return 0
    fi
    say "FAILED:${FAILED:- none}; SKIPPED:${SKIPPED:- none} (total $(elapsed)s)" | tee -a "$OUT/summary.log"
    return 1
}

# The committed part of a run: summary.log, and per scenario the YAML and summary.
collect() {
    local src=$1 dest=$2 tmp d
    [ -f "$src/e2e.tar.gz" ] || die "$src/e2e.tar.gz not found"
    tmp=$(mktemp -d)
    tar -xzf "$src/e2e.tar.gz" -C "$tmp" || die "unpack $src/e2e.tar.gz failed"
    mkdir -p "$dest"
    cp "$src/summary.log" "$dest/"
    for d in "$tmp"/*/; do
        d=$(basename "$d")
        mkdir -p "$dest/$d"
        cp "$tmp/$d/"{validation.yaml,results.yaml,summary.txt,run.log} "$dest/$d/" 2>/dev/null
    done
    rm -rf "$tmp"
    find "$dest" -type f | sort
}

case "${1:-}" in
    pack) pack ;;
    collect)
        [ $# = 3 ] || die "usage: $0 collect OUT_DIR DEST"
        collect "$2" "$3"
        ;;
    device)
        [ $# = 2 ] || die "usage: $0 device OUT_DIR"
        run_all cuda "$2"
        ;;
    local) run_all sim "${2:-/tmp/gpu-e2e-local}" ;;
    *) die "usage: $0 pack | device OUT_DIR | local [OUT_DIR] | collect OUT_DIR DEST" ;;
esac
