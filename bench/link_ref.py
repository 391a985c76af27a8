"""PyTorch references for the agent's link checks, run on the same GPUs in the same call.

  p2p   every ordered pair: dst.copy_(src) of a BUFFER_MIB buffer, ITER copies per sample, median
        of 3 samples (unidirectional); both directions at once on two streams, one per device,
        sum of both (bidirectional); 100 back-to-back 4-byte copies (latency, µs per copy)
  host  per GPU alone: pinned and pageable host->device and device->host, ITER copies per
        sample, median of 3; then pinned with every GPU at once (one process per GPU)
GB/s are decimal (1e9 bytes per second). Prints one JSON object on stdout.
"""
import argparse
import json
import multiprocessing as mp
import statistics
import time

import torch


def wall(fn, devs):
    for d in devs:
        torch.cuda.synchronize(d)
    t = time.perf_counter()
    fn()
    for d in devs:
        torch.cuda.synchronize(d)
    return time.perf_counter() - t


def p2p(buffer_mib, iters):
    n = torch.cuda.device_count()
    nbytes = buffer_mib << 20
    bufs = {}
    for d in range(n):
        with torch.cuda.device(d):
            bufs[d] = (
                torch.empty(nbytes, dtype=torch.uint8, device=d).random_(0, 255),
                torch.empty(nbytes, dtype=torch.uint8, device=d),
            )
    streams = {d: torch.cuda.Stream(device=d) for d in range(n)}
    pairs = []
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            send_a, recv_a = bufs[a]
            send_b, recv_b = bufs[b]
            peer = torch.cuda.can_device_access_peer(a, b)
            for _ in range(2):  # warm-up (also enables peer access inside PyTorch)
                recv_b.copy_(send_a)

            def uni():
                with torch.cuda.device(a):
                    for _ in range(iters):
                        recv_b.copy_(send_a, non_blocking=True)

            def bidi():
                with torch.cuda.stream(streams[a]):
                    for _ in range(iters):
                        recv_b.copy_(send_a, non_blocking=True)
                with torch.cuda.stream(streams[b]):
                    for _ in range(iters):
                        recv_a.copy_(send_b, non_blocking=True)

            tiny_src, tiny_dst = send_a[:4], recv_b[:4]

            def tiny():
                with torch.cuda.device(a):
                    for _ in range(100):
                        tiny_dst.copy_(tiny_src, non_blocking=True)

            u = statistics.median(nbytes * iters / wall(uni, [a, b]) / 1e9 for _ in range(3))
            bi = statistics.median(2 * nbytes * iters / wall(bidi, [a, b]) / 1e9 for _ in range(3))
            lat = statistics.median(wall(tiny, [a, b]) * 1e6 / 100 for _ in range(3))
            ok = bool(torch.equal(recv_b, send_a.to(recv_b.device)))
            pairs.append({"src": a, "dst": b, "peer_access": peer, "uni_gbps": u,
                          "bidi_gbps": bi, "copy_latency_us": lat, "verified": ok})
    return pairs


def host_alone(dev, buffer_mib, iters, pinned):
    nbytes = buffer_mib << 20
    with torch.cuda.device(dev):
        h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        h.fill_(7)
        g = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        g.copy_(h)
        out = {}
        for name, fn in (("h2d", lambda: g.copy_(h, non_blocking=pinned)),
                         ("d2h", lambda: h.copy_(g, non_blocking=pinned))):
            def run():
                for _ in range(iters):
                    fn()
            out[name] = statistics.median(nbytes * iters / wall(run, [dev]) / 1e9 for _ in range(3))
        return out


def host_worker(dev, buffer_mib, iters, barrier, q):
    torch.cuda.set_device(dev)
    nbytes = buffer_mib << 20
    h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    g = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    g.copy_(h)
    out = {}
    for name, fn in (("h2d", lambda: g.copy_(h, non_blocking=True)),
                     ("d2h", lambda: h.copy_(g, non_blocking=True))):
        rates = []
        for _ in range(3):
            barrier.wait()

            def run():
                for _ in range(iters):
                    fn()
            rates.append(nbytes * iters / wall(run, [dev]) / 1e9)
        out[name] = statistics.median(rates)
    q.put((dev, out))


def host(buffer_mib, iters):
    n = torch.cuda.device_count()
    alone = {d: {"pinned": host_alone(d, buffer_mib, iters, True),
                 "pageable": host_alone(d, buffer_mib, iters, False)} for d in range(n)}
    together = {}
    if n > 1:
        ctx = mp.get_context("spawn")
        barrier, q = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=host_worker, args=(d, buffer_mib, iters, barrier, q))
                 for d in range(n)]
        for p in procs:
            p.start()
        for _ in procs:
            d, r = q.get(timeout=300)
            together[d] = r
        for p in procs:
            p.join()
    return {"alone": alone, "together": together}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--p2p-mib", type=int, default=512)
    ap.add_argument("--p2p-iters", type=int, default=16)
    ap.add_argument("--host-mib", type=int, default=256)
    ap.add_argument("--host-iters", type=int, default=8)
    a = ap.parse_args()
    out = {"torch": torch.__version__, "gpus": torch.cuda.device_count()}
    if out["gpus"] > 1:
        out["p2p"] = p2p(a.p2p_mib, a.p2p_iters)
    out["host"] = host(a.host_mib, a.host_iters)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
