#!/usr/bin/env bash
# On the GPU machine, from the repository root: bench/nvml-tail/tail.py, then the packed agent's
# memory check followed by its compute check (the order in which the e2e gate saw 16% "before
# compute") ROUNDS times, each report's busy findings listed (SKIP_TAIL=1: the agent's rounds
# alone). OUT_DIR gets tail.log, agent-N.json.
set -uo pipefail
out=${1:?usage: run.sh OUT_DIR}
rounds=${ROUNDS:-4}
mkdir -p "$out" /tmp/nvml-tail-bin
xz -dc .device-carry/e2e/gpuval.tar.xz | tar -x -C /tmp/nvml-tail-bin gpuval-agent
if [ "${SKIP_TAIL:-0}" != 1 ]; then
  python3 bench/nvml-tail/tail.py 3 2.5 3 >"$out/tail.log" 2>&1
  tail -n 7 "$out/tail.log"
fi
for i in $(seq 1 "$rounds"); do
  /tmp/nvml-tail-bin/gpuval-agent run --checks memory,compute --duration 10s \
    -o "$out/agent-$i.json" >"$out/agent-$i.log" 2>&1
  python3 - "$out/agent-$i.json" "$i" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
busy = [x["message"] for g in r["gpus"] for x in g.get("reasons", []) if "Busy" in x["code"]]
print(f"agent run {sys.argv[2]}: node {r['verdict']}; busy findings: {busy or 'none'}")
PY
done
