#!/usr/bin/env bash
# Churn benchmark (issue 55; not a test): bench/scale.sh's cluster (N fake GPU nodes, one
# validation over all of them, the release operator as its own process under its own service
# account, fake agents that store each node's result once its pod is bound), run quiet and then
# under churn: the validation's own Nodes written at a realistic rate (CHURN_PER_NODE writes a
# second per node, default 0.05: one write per node every 20 s) and bursts of BURST writes a
# second (default 100) on unrelated Nodes and Pods, 5 s in every 10. Writes
# bench/results/churn-<date>/scale-<N>.json (quiet) and scale-<N>-churn-<R>-<B>.json (churn),
# each with the time from the apply to the first agent pod and to the verdict, the operator's
# CPU and memory, and its writes as the API server's audit log counts them.
#
#   bench/churn.sh              # 1000 nodes
#   bench/churn.sh 1000 10000   # any node counts
set -euo pipefail
cd "$(dirname "$0")/.."
tests/scripts/build-control-plane.sh >/dev/null
cargo build --release -p gpuval-operator -p gpuval-tests --bin gpuval-operator --bin scale
out="${CHURN_OUT:-bench/results/churn-$(date -u +%F)}"
report="${CHURN_REPORT:-bench/results/scale-2026-11-23c/sim-report-8xH200.json}"
per_node="${CHURN_PER_NODE:-0.05}"
burst="${BURST:-100}"
mkdir -p "$out"
for n in ${@:-1000}; do
  rate=$(python3 -c "print(max(1.0, $n * $per_node))")
  target/release/scale --nodes "$n" --operator target/release/gpuval-operator \
    --report "$report" --out "$out"
  target/release/scale --nodes "$n" --operator target/release/gpuval-operator \
    --report "$report" --out "$out" --churn "$rate" --burst "$burst"
done
