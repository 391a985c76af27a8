#!/usr/bin/env bash
# Operator scale benchmark (not a test): N fake GPU nodes, one validation over all of them, the
# release operator as its own process, and a fake agent that writes each node's result as soon as
# its pod is bound. Writes bench/results/scale-<date>/scale-<N>.json.
#
#   bench/scale.sh            # 1000 and 5000 nodes
#   bench/scale.sh 200        # any node counts
set -euo pipefail
cd "$(dirname "$0")/.."
tests/scripts/build-control-plane.sh >/dev/null
cargo build --release -p gpuval-operator
cargo build -p gpuval-tests --bin scale
out="bench/results/scale-$(date -u +%F)"
for n in "${@:-1000 5000}"; do
  for m in $n; do
    target/debug/scale --nodes "$m" --operator target/release/gpuval-operator --out "$out"
  done
done
