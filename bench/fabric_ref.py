"""The fabric test's reference: the same all-reduce through torch.distributed, two processes
(one GPU each, rank from RANK, rendezvous from MASTER_ADDR/MASTER_PORT), NCCL forced onto its
network transport by the caller's environment (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1).

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29600 python3 bench/fabric_ref.py BYTES ITERS WARMUP

Rank 0 prints one JSON line: bytes, seconds per all-reduce, algbw and busbw (GB/s, as
nccl-tests defines them: busbw = algbw * 2(n-1)/n)."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    size, iters, warmup = (int(a) for a in sys.argv[1:4])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)  # CUDA_VISIBLE_DEVICES gives each process its one GPU
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.ones(size // 2, dtype=torch.bfloat16, device="cuda")
    for _ in range(warmup):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iters
    t = torch.tensor([seconds], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    seconds = t.item()
    algbw = size / seconds / 1e9
    if rank == 0:
        print(json.dumps({"bytes": size, "seconds": seconds, "algbw_gbps": algbw,
                          "busbw_gbps": algbw * 2 * (world - 1) / world}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
