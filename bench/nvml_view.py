#!/usr/bin/env python3
"""What NVML shows of every GPU it lists, from wherever this runs (a pod's namespaces or the host):

    python3 bench/nvml_view.py [LABEL]       # one JSON line per GPU on stdout

Memory (v2: used and reserved; v1 used), the compute processes listed with their memory and their
sum, the per-process utilisation samples of the last 2 s (pids as NVML gives them), the GPU
utilisation samples of the last 2 s, power and SM clock. The gate (bench/gpu-smoke.sh) records it
beside the agent's pod-like runs: it is the evidence a PID namespace does not hide.
"""
import json
import sys
import time

import pynvml as n


def safe(f, *a):
    try:
        return f(*a)
    except n.NVMLError as e:
        return f"error: {e}"


def view(label):
    n.nvmlInit()
    since = int((time.time() - 2.0) * 1e6)
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        m1 = safe(n.nvmlDeviceGetMemoryInfo, h)
        m2 = safe(n.nvmlDeviceGetMemoryInfo, h, n.nvmlMemory_v2)
        procs = safe(n.nvmlDeviceGetComputeRunningProcesses, h)
        listed = [] if isinstance(procs, str) else [
            {"pid": p.pid, "mib": (p.usedGpuMemory or 0) >> 20} for p in procs]
        putil = safe(n.nvmlDeviceGetProcessUtilization, h, since)
        pu = putil if isinstance(putil, str) else [
            {"pid": s.pid, "sm": s.smUtil, "mem": s.memUtil} for s in putil]
        samples = safe(n.nvmlDeviceGetSamples, h, n.NVML_GPU_UTILIZATION_SAMPLES, since)
        util = samples if isinstance(samples, str) else [s.sampleValue.uiVal for s in samples[1]]
        out = {
            "label": label,
            "gpu": i,
            "uuid": safe(n.nvmlDeviceGetUUID, h),
            "used_mib_v1": None if isinstance(m1, str) else m1.used >> 20,
            "used_mib_v2": None if isinstance(m2, str) else m2.used >> 20,
            "reserved_mib_v2": None if isinstance(m2, str) else m2.reserved >> 20,
            "processes": listed if not isinstance(procs, str) else procs,
            "processes_mib": sum(p["mib"] for p in listed),
            "process_util": pu,
            "util_samples": util,
            "util_rates": safe(lambda: n.nvmlDeviceGetUtilizationRates(h).gpu),
            "power_w": safe(lambda: n.nvmlDeviceGetPowerUsage(h) / 1000),
            "sm_mhz": safe(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
        }
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    view(sys.argv[1] if len(sys.argv) > 1 else "")
