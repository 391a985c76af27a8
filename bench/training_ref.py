#!/usr/bin/env python3
"""PyTorch reference for the agent's training check: the same synthetic step with DDP.

Per GPU: `layers` blocks of Linear(hidden, hidden*ffn) -> GELU(tanh) -> Linear(hidden*ffn, hidden),
no bias, bf16 weights; a fresh batch of batch*seq tokens drawn on the GPU each step; the output
gradient y/T (the agent's loss gradient); DDP with bucket_cap_mb=bucket (its defaults otherwise);
plain SGD (lr 0.05); torch.compile off. Three phases, as the agent runs them: the step with no
communication (DDP's no_sync), then the step with DDP's all-reduce overlapping the backward pass.
Each step is timed with CUDA events from the batch to the end of the update; a step's time is
the slowest rank's. With one process there is no DDP and no all-reduce (the one-GPU figure).

    torchrun --nproc_per_node 2 bench/training_ref.py --out torch-2gpu.json
    CUDA_VISIBLE_DEVICES=0 python3 bench/training_ref.py --out torch-1gpu.json
"""
import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.up = nn.Linear(hidden, inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def p99(values):
    v = sorted(values)
    return v[min(len(v) - 1, int(-(-0.99 * (len(v) - 1) // 1)))]


def run_phase(model, opt, args, tokens, device, sync, world):
    times = []
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for step in range(args.warmup + args.steps):
        start.record()
        x = torch.randn(tokens, args.hidden, device=device, dtype=torch.bfloat16)
        ctx = model.no_sync() if (world > 1 and not sync) else _null()
        with ctx:
            y = model(x)
            y.backward(gradient=y.detach() * (1.0 / tokens))
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(start.elapsed_time(end) / 1e3)
    if world > 1:
        t = torch.tensor(times, device=device, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times = t.tolist()
    return times


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--bucket-mib", type=int, default=25)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    if world > 1:
        dist.init_process_group("nccl", device_id=device)
    torch.manual_seed(1234)  # the same initial weights on every rank (DDP broadcasts them too)
    inner = args.hidden * args.ffn
    model = nn.Sequential(*[Block(args.hidden, inner) for _ in range(args.layers)])
    model = model.to(device=device, dtype=torch.bfloat16)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[local], bucket_cap_mb=args.bucket_mib
        )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tokens = args.batch * args.seq
    torch.manual_seed(1000 + rank)  # each rank its own data

    compute = run_phase(model, opt, args, tokens, device, False, world)
    overlapped = run_phase(model, opt, args, tokens, device, True, world)
    flops = 2.0 * tokens * args.hidden * inner * (6 * args.layers - 1)
    step = statistics.median(overlapped)
    out = {
        "tool": "pytorch-ddp" if world > 1 else "pytorch-1gpu",
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if world > 1 else None,
        "world": world,
        "shape": vars(args),
        "step_ms": step * 1e3,
        "step_ms_p99": p99(overlapped) * 1e3,
        "compute_only_step_ms": statistics.median(compute) * 1e3,
        "samples_per_s_per_gpu": args.batch / step,
        "samples_per_s": args.batch / step * world,
        "tflops_per_gpu": flops / step / 1e12,
        "steps": overlapped,
    }
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(json.dumps({k: v for k, v in out.items() if k != "steps"}))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
