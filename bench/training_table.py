#!/usr/bin/env python3
"""Side-by-side table of bench/training-bench.sh's outputs: the agent's training check and
PyTorch DDP, per round, with the ratios the issue asks for."""
import os
import sys

from jsonfile import load_json as load


def main(out):
    rows = []
    print("| round | tool | step ms (median) | p99 | compute-only ms | one-GPU ms | samples/s/GPU | samples/s node | exposed comm ms | scaling eff. | TFLOP/s/GPU |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for rnd in ["a", "b"]:
        a = load(os.path.join(out, f"agent-{rnd}.json"))
        t = (a or {}).get("training") or {}
        f = t.get("figures")
        ddp = load(os.path.join(out, f"torch-ddp-{rnd}.json"))
        one = load(os.path.join(out, f"torch-1gpu-{rnd}.json"))
        if f:
            print(f"| {rnd} | agent ({t.get('verdict')}) | {f['stepMillis']:.2f} | {f['stepMillisP99']:.2f} | "
                  f"{f['computeOnlyStepMillis']:.2f} | {f['singleGpuStepMillis']:.2f} | "
                  f"{f['samplesPerSecondPerGpu']:.2f} | {f['samplesPerSecond']:.2f} | "
                  f"{f['exposedCommMillis']:.2f} | {f['scalingEfficiency']:.3f} | {f['tflopsPerGpu']:.0f} |")
        if ddp and one:
            eff = ddp["step_ms"] and one["step_ms"] / ddp["step_ms"]
            exposed = max(0.0, ddp["step_ms"] - ddp["compute_only_step_ms"])
            print(f"| {rnd} | PyTorch DDP | {ddp['step_ms']:.2f} | {ddp['step_ms_p99']:.2f} | "
                  f"{ddp['compute_only_step_ms']:.2f} | {one['step_ms']:.2f} | "
                  f"{ddp['samples_per_s_per_gpu']:.2f} | {ddp['samples_per_s']:.2f} | "
                  f"{exposed:.2f} | {eff:.3f} | {ddp['tflops_per_gpu']:.0f} |")
        if f and ddp:
            rows.append((rnd, f["samplesPerSecondPerGpu"] / ddp["samples_per_s_per_gpu"]))
    print()
    for rnd, r in rows:
        print(f"- round {rnd}: agent samples/s per GPU / PyTorch DDP = {r:.3f} (target >= 0.95)")
    c = load(os.path.join(out, "agent-corrupt.json"))
    if c:
        t = c.get("training") or {}
        d = (t.get("replicas") or {}).get("divergence")
        gpus = [(g["index"], g["verdict"]) for g in c.get("gpus", [])]
        print(f"- planted corruption: training {t.get('verdict')}, divergence {d}, GPU verdicts {gpus}")


if __name__ == "__main__":
    main(sys.argv[1])
