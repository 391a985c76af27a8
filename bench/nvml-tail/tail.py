"""How long NVML's GPU utilisation samples keep showing work after it ends.

Burns GPU 0 with bf16 matmuls for BURN_S seconds (PyTorch), synchronizes, then reads
nvmlDeviceGetSamples(GPU_UTILIZATION) for WATCH_S seconds and prints every sample's timestamp
relative to the end of the work and its value, with the gap between samples (the sample period).
Run several times: `python3 tail.py [BURN_S] [WATCH_S] [ROUNDS]`. Needs only PyTorch and the
driver's libnvidia-ml.so.1.
"""
import ctypes
import json
import sys
import time

import torch

BURN_S = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
WATCH_S = float(sys.argv[2]) if len(sys.argv) > 2 else 2.5
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3

nvml = ctypes.CDLL("libnvidia-ml.so.1")


class Sample(ctypes.Structure):
    _fields_ = [("ts", ctypes.c_ulonglong), ("value", ctypes.c_ulonglong)]


def check(rc, what):
    if rc != 0:
        raise SystemExit(f"{what}: NVML error {rc}")


check(nvml.nvmlInit_v2(), "init")
dev = ctypes.c_void_p()
check(nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)), "handle")


def samples(since_us):
    kind = ctypes.c_int()
    count = ctypes.c_uint(0)
    rc = nvml.nvmlDeviceGetSamples(dev, 1, ctypes.c_ulonglong(since_us), ctypes.byref(kind),
                                   ctypes.byref(count), None)
    if rc == 6 or count.value == 0:  # NOT_FOUND: no samples yet
        return []
    buf = (Sample * count.value)()
    rc = nvml.nvmlDeviceGetSamples(dev, 1, ctypes.c_ulonglong(since_us), ctypes.byref(kind),
                                   ctypes.byref(count), buf)
    if rc == 6:
        return []
    check(rc, "samples")
    # kind 0..: double, uint, ulong, ulonglong, slonglong; utilisation is an unsigned int.
    return [(s.ts, s.value & 0xFFFFFFFF) for s in buf[: count.value]]


def burn(seconds):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(8):
            a @ b
        torch.cuda.synchronize()


out = []
for r in range(ROUNDS):
    burn(BURN_S)
    torch.cuda.synchronize()
    ended_us = int(time.time() * 1e6)
    time.sleep(WATCH_S)
    seen = [(ts - ended_us, v) for ts, v in samples(ended_us - 2_000_000)]
    gaps = [b[0] - a[0] for a, b in zip(seen, seen[1:])]
    after = [(round(t / 1000), v) for t, v in seen if t >= -500_000]
    print(f"round {r}: samples (ms after the work ended, %):", after)
    print(f"round {r}: gaps between samples, ms:", [round(g / 1000) for g in gaps])
    out.append({"round": r, "samples_ms_pct": after, "gaps_ms": [round(g / 1000) for g in gaps]})
    time.sleep(1.0)
print(json.dumps({"burn_s": BURN_S, "watch_s": WATCH_S, "rounds": out}))
