#!/usr/bin/env python3
"""A second process on one GPU, planted beside an agent check (bench faults).

    python3 bench/gpu_hog.py hold FRACTION READY_FILE        # hold FRACTION of the GPU's memory
    python3 bench/gpu_hog.py burn READY_FILE STOP_FILE       # bf16 8192^3 matmuls until STOP_FILE

Pick the GPU with CUDA_VISIBLE_DEVICES (and CUDA_DEVICE_ORDER=PCI_BUS_ID so that its index is
NVML's). READY_FILE is created once the memory is held or the first products are done; `hold`
runs until it is killed, `burn` until STOP_FILE exists, then prints what it reached.
"""
import os
import sys
import time

import torch


def hold(fraction, ready):
    free, total = torch.cuda.mem_get_info()
    held = torch.empty(int(total * fraction) // 4, dtype=torch.float32, device="cuda")
    held.fill_(1.0)
    torch.cuda.synchronize()
    print(f"holding {held.numel() * 4 / 2**30:.1f} GiB of {total / 2**30:.1f} ({free / 2**30:.1f} was free)", flush=True)
    open(ready, "w").close()
    while True:
        time.sleep(1)


def burn(ready, stop):
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    open(ready, "w").close()
    count, t0 = 0, time.time()
    while not os.path.exists(stop):
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        count += 20
    dt = time.time() - t0
    print(f"contender: {count} products, {2 * n**3 * count / dt / 1e12:.0f} TFLOP/s over {dt:.0f}s", flush=True)


def main(argv):
    if len(argv) == 4 and argv[1] == "hold":
        hold(float(argv[2]), argv[3])
    elif len(argv) == 4 and argv[1] == "burn":
        burn(argv[2], argv[3])
    else:
        sys.exit("usage: gpu_hog.py hold FRACTION READY_FILE | burn READY_FILE STOP_FILE")


if __name__ == "__main__":
    main(sys.argv)
