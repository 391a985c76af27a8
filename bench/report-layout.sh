#!/usr/bin/env bash
# How long headless Chromium takes to load and lay out the 1,000-node HTML report (the test
# `report_html::a_thousand_node_report_is_one_small_page_that_opens_at_once` builds the page and
# prints the figure its in-page probe measured). Runs it RUNS times (5) and appends the figures,
# the machine and the commit to bench/results/report-layout/<date>.txt.
#
#   bench/report-layout.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [RUNS]" >&2; exit 2; }
command -v chromium >/dev/null || command -v chromium-browser >/dev/null ||
  { echo "report-layout.sh: needs Chromium (apt-get install chromium)" >&2; exit 2; }
out=bench/results/report-layout/$(date -u +%Y-%m-%d).txt
mkdir -p "$(dirname "$out")"
figures=()
for ((i = 1; i <= runs; i++)); do
  line=$(cargo test -q -p gpuval-tests --test report_html a_thousand_node_report -- --nocapture 2>&1 |
    grep -o 'loaded and laid out in [0-9]* ms' || true)
  [ -n "$line" ] || { echo "run $i: no figure (did the test run?)" >&2; exit 1; }
  figures+=("${line//[!0-9]/}")
done
sorted=$(printf '%s\n' "${figures[@]}" | sort -n | tr '\n' ' ')
{
  echo "$(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) on $(nproc) cores, $(chromium --version 2>/dev/null || chromium-browser --version)"
  echo "1,000-node report, load and layout (ms, sorted): $sorted"
} | tee -a "$out"
