#!/usr/bin/env bash
# A neighbour on one GPU for `gpu-e2e --hold-command` (issue 50's planted neighbours): a bf16
# burn (bench/gpu_hog.py) on GPU $GPUVAL_HOLD_GPU, a host process outside the agent's container.
#
#   bench/neighbour.sh 0       # burning before it says `holding` (before the validation is applied)
#   bench/neighbour.sh DELAY   # says `holding` at once, starts burning DELAY seconds later
#
# It burns until its stdin closes (gpu-e2e closes it when the run ends), then stops the burn.
set -uo pipefail
delay=${1:-0}
here=$(cd "$(dirname "$0")" && pwd)
d=$(mktemp -d /tmp/gpuval-neighbour.XXXXXX)
export CUDA_VISIBLE_DEVICES=${GPUVAL_HOLD_GPU:-0} CUDA_DEVICE_ORDER=PCI_BUS_ID
burn() {
  python3 "$here/gpu_hog.py" burn "$d/ready" "$d/stop" >&2 &
  echo $! >"$d/pid"
}
if [ "$delay" = 0 ]; then
  burn
  for _ in $(seq 600); do [ -e "$d/ready" ] && break; sleep 0.1; done
  [ -e "$d/ready" ] || { echo "neighbour.sh: the burn never became ready" >&2; exit 1; }
  echo "holding: a bf16 burn on GPU $CUDA_VISIBLE_DEVICES, started before the agent"
else
  echo "holding: a bf16 burn on GPU $CUDA_VISIBLE_DEVICES starts in ${delay}s"
  (sleep "$delay"; burn; echo "neighbour.sh: burning from $(date +%T)" >&2) &
fi
cat >/dev/null
touch "$d/stop"
sleep 2
[ -f "$d/pid" ] && kill "$(cat "$d/pid")" 2>/dev/null
wait
rm -rf "$d"
