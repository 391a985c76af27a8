#!/usr/bin/env bash
# Operator scale benchmark (not a test): N fake GPU nodes, one validation over all of them, the
# release operator as its own process, and fake agents that store each node's result as soon as
# its pod is bound. Every result carries the same simulated 8-GPU H200 report, made here by
# `gpuval-agent run --simulate` with the checks of bench/scale-checks.yaml (it says
# "simulated": true; only the node's name differs). Writes bench/results/scale-<date>/scale-<N>.json
# and the report it used.
#
#   bench/scale.sh            # 1000 and 2000 nodes
#   bench/scale.sh 200 500    # any node counts
#   SCALE_OUT=dir bench/scale.sh 1000
set -euo pipefail
cd "$(dirname "$0")/.."
tests/scripts/build-control-plane.sh >/dev/null
# One build of the three packages (one feature set: a second invocation would rebuild them).
cargo build --release -p gpuval-operator -p gpuval-agent -p gpuval-tests \
  --bin gpuval-operator --bin gpuval-agent --bin scale
out="${SCALE_OUT:-bench/results/scale-$(date -u +%F)}"
mkdir -p "$out"
report="$out/sim-report-8xH200.json"
io_dir="$(mktemp -d)"
trap 'rm -rf "$io_dir"' EXIT
target/release/gpuval-agent run --simulate gpus=8,model=H200 --config bench/scale-checks.yaml \
  --io-dir "$io_dir" --output "$report" >/dev/null
for n in ${@:-1000 2000}; do
  target/release/scale --nodes "$n" --operator target/release/gpuval-operator \
    --report "$report" --out "$out"
done
