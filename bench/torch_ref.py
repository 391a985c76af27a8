"""PyTorch references for the gpuval agent bench, run on the same GPUs in the same call.

Each reference mirrors what the agent measures:
  copy      device-to-device copy of a large buffer, bytes read + written per second
  memverify fill a buffer with an address-dependent int32 pattern and verify it by comparison
            (torch elementwise ops), bytes written + read per second, same size as the agent
  matmul    torch.matmul n x n x n per dtype: 'burst' (mean of 10 after 3 warm-ups, random data)
            and 'sustained' (back-to-back for a duration, all GPUs at once, one process per GPU)
Prints one JSON object on stdout.
"""
import argparse
import json
import multiprocessing as mp
import time

import torch

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}


def timed(fn, dev, reps):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(dev)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 1e3


def on(dev, fn, *args):
    with torch.cuda.device(dev):
        return fn(dev, *args)


def copy_rate(dev, gib=4):
    n = gib << 28  # int32 elements
    a = torch.empty(n, dtype=torch.int32, device=dev).random_()
    b = torch.empty_like(a)
    b.copy_(a)
    t = timed(lambda: b.copy_(a), dev, 10)
    del a, b
    return 2 * n * 4 * 10 / t / 1e9


def base_pattern(m, dev):
    # An address-dependent int32 pattern for one chunk (int32 arithmetic wraps on CUDA).
    h = torch.arange(m, device=dev, dtype=torch.int32) * -1640531535 + 7
    h = h ^ (h >> 16)
    h = h * -2048144789
    return h ^ (h >> 13)


def memverify_rate(dev, nbytes, chunk=1 << 28):
    """The PyTorch way to fill and compare-verify: the expected pattern is computed once per
    1 GiB chunk and XOR-keyed per chunk (so every address gets its own value); fill writes
    base ^ key, verify counts (buf != base ^ key)."""
    n = nbytes // 4
    buf = torch.empty(n, dtype=torch.int32, device=dev)
    base = base_pattern(min(chunk, n), dev)
    keys = [(k * 0x61C88647 + 0x3C6EF372) % (1 << 32) - (1 << 31) for k in range(n // chunk + 1)]
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for k, off in enumerate(range(0, n, chunk)):
        m = min(chunk, n - off)
        torch.bitwise_xor(base[:m], keys[k], out=buf[off:off + m])
    torch.cuda.synchronize(dev)
    t1 = time.perf_counter()
    bad = torch.zeros((), dtype=torch.int64, device=dev)
    for k, off in enumerate(range(0, n, chunk)):
        m = min(chunk, n - off)
        bad += (buf[off:off + m] != (base[:m] ^ keys[k])).sum()
    torch.cuda.synchronize(dev)
    t2 = time.perf_counter()
    bad = int(bad)
    del buf, base
    torch.cuda.empty_cache()
    return {"bytes": n * 4, "fill_gbps": n * 4 / (t1 - t0) / 1e9, "verify_gbps": n * 4 / (t2 - t1) / 1e9,
            "gbps": 2 * n * 4 / (t2 - t0) / 1e9, "mismatches": bad}


def matmul_burst(dev, dtype, n):
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    a = torch.empty(n, n, dtype=DT[dtype], device=dev).uniform_(-1, 1)
    b = torch.empty(n, n, dtype=DT[dtype], device=dev).uniform_(-1, 1)
    for _ in range(3):
        a @ b
    t = timed(lambda: a @ b, dev, 10)
    return 2 * n ** 3 * 10 / t / 1e12


def sustained_worker(args):
    gpu, dtype, n, seconds = args
    dev = torch.device("cuda", gpu)
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    a = torch.empty(n, n, dtype=DT[dtype], device=dev).uniform_(-1, 1)
    b = torch.empty(n, n, dtype=DT[dtype], device=dev).uniform_(-1, 1)
    c = torch.empty_like(a)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize(dev)
    total, flops, start = 0.0, 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        total += timed(lambda: torch.matmul(a, b, out=c), dev, 8)
        flops += 2 * n ** 3 * 8
    return gpu, flops / total / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bf16,fp16,tf32,fp32")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--memverify-gib", type=float, default=0)
    ap.add_argument("--sustained", default="", help="dtype:seconds for the all-GPU sustained run")
    ap.add_argument("--phase", default="burst", choices=["burst", "sustained"])
    a = ap.parse_args()
    ngpu = torch.cuda.device_count()
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": [torch.cuda.get_device_name(i) for i in range(ngpu)]}
    if a.phase == "burst":
        devs = [torch.device("cuda", i) for i in range(ngpu)]
        out["copy_gbps"] = [on(d, copy_rate) for d in devs]
        if a.memverify_gib > 0:
            out["memverify"] = [on(d, memverify_rate, int(a.memverify_gib * (1 << 30))) for d in devs]
        out["matmul_burst_tflops"] = {t: [on(d, matmul_burst, t, a.n) for d in devs] for t in a.dtypes.split(",")}
    else:
        # "bf16:60,fp16:20": each dtype in turn, all GPUs at once (one process per GPU).
        out["matmul_sustained"] = {}
        ctx = mp.get_context("spawn")
        with ctx.Pool(ngpu) as pool:
            for part in a.sustained.split(","):
                dtype, secs = part.split(":")
                res = pool.map(sustained_worker, [(i, dtype, a.n, float(secs)) for i in range(ngpu)])
                out["matmul_sustained"][dtype] = {"seconds": float(secs), "tflops": [t for _, t in sorted(res)]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
