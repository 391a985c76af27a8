#!/usr/bin/env python3
"""Side-by-side table of the agent's NCCL sweeps and nccl-tests' from one bench run.

    python3 bench/nccl_table.py OUT_DIR > OUT_DIR/table.md

Reads OUT_DIR/agent.json (the node report of `gpuval-agent run --checks nccl`), OUT_DIR/nccl-tests-<coll>.txt (the
*_perf outputs) and OUT_DIR/default-sweep-seconds.txt. Out-of-place figures are compared at
every size both measured; the targets: bus bandwidth ratio agent / nccl-tests >= 0.97 at every
size of 256 MiB and more, time ratio <= 1.1 at the smallest size, default sweep < 60 s.
"""
import json
import os
import sys

COLLECTIVES = [("allReduce", "all_reduce"), ("allGather", "all_gather"), ("reduceScatter", "reduce_scatter")]
BIG = 256 << 20
BUSBW_TARGET = 0.97
LATENCY_TARGET = 1.1
WALL_TARGET = 60.0


def nccl_tests_rows(path):
    """size -> (time us, algbw, busbw, wrong) of the out-of-place columns."""
    rows = {}
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            fields = line.split()
            if not fields or line.lstrip().startswith("#") or len(fields) < 10:
                continue
            if not (fields[0].isdigit() and fields[1].isdigit()):
                continue
            tail = fields[-8:]
            try:
                rows[int(fields[0])] = (float(tail[0]), float(tail[1]), float(tail[2]), tail[3])
            except ValueError:
                continue
    return rows


def human(n):
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def main(out):
    with open(os.path.join(out, "agent.json")) as f:
        agent = json.load(f)
    # `gpuval-agent run --output` writes the node report; the check's result is its `nccl`.
    agent = agent.get("nccl", agent)
    curves = {c["collective"]: c["rows"] for c in (agent.get("sweep") or {}).get("curves", [])}
    lines = ["# nccl check vs nccl-tests", ""]
    t = (agent.get("sweep") or {}).get("transport") or {}
    lines.append(
        f"GPUs {agent.get('gpus')}, {agent.get('dtype')}, {agent.get('iterations')} iterations after "
        f"{agent.get('warmupIterations')} warm-up; NCCL {agent.get('ncclVersion')} ({agent.get('library')}); "
        f"transport {', '.join(t.get('kinds', [])) or '?'}, {t.get('channels', '?')} channels; agent verdict {agent.get('verdict')}"
    )
    lines.append("")
    summary = []
    for name, file in COLLECTIVES:
        ours = {r["bytes"]: r for r in curves.get(name, [])}
        theirs = nccl_tests_rows(os.path.join(out, f"nccl-tests-{file}.txt"))
        sizes = sorted(set(ours) & set(theirs))
        if not sizes:
            lines += [f"## {name}", "", "no common sizes", ""]
            continue
        lines += [f"## {name} (out of place)", "",
                  "| size | agent us | nccl-tests us | time ratio | agent busbw | nccl-tests busbw | busbw ratio | agent wrong | nccl-tests #wrong |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        big_ratios = []
        for s in sizes:
            a, (nt_us, _, nt_bus, nt_wrong) = ours[s], theirs[s]
            tr = a["timeMicros"] / nt_us if nt_us > 0 else float("nan")
            br = a["busbwGbps"] / nt_bus if nt_bus > 0 else float("nan")
            if s >= BIG:
                big_ratios.append((br, s))
            lines.append(f"| {human(s)} | {a['timeMicros']:.2f} | {nt_us:.2f} | {tr:.3f} | {a['busbwGbps']:.2f} | {nt_bus:.2f} | "
                         f"{br:.3f} | {a['wrong']} | {nt_wrong} |")
        lines.append("")
        small = sizes[0]
        lat = ours[small]["timeMicros"] / theirs[small][0] if theirs[small][0] > 0 else float("nan")
        worst = min(big_ratios) if big_ratios else (float("nan"), 0)
        summary.append((name, worst, small, lat))
    lines += ["## Targets", "", "| collective | lowest busbw ratio at >= 256 MiB (>= 0.97) | time ratio at the smallest size (<= 1.1) |", "| --- | --- | --- |"]
    for name, (br, at), small, lat in summary:
        ok_b = "meets" if br >= BUSBW_TARGET else "MISSES"
        ok_l = "meets" if lat <= LATENCY_TARGET else "MISSES"
        lines.append(f"| {name} | {br:.3f} at {human(at)} ({ok_b}) | {lat:.3f} at {human(small)} ({ok_l}) |")
    wall_path = os.path.join(out, "default-sweep-seconds.txt")
    if os.path.exists(wall_path):
        with open(wall_path) as f:
            wall = float(f.read().strip() or "nan")
        lines += ["", f"Full default sweep (all-reduce, 8 B to 4 GiB, start to exit): {wall:.1f} s "
                      f"({'meets' if wall < WALL_TARGET else 'MISSES'} the < {WALL_TARGET:.0f} s target)"]
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: nccl_table.py OUT_DIR")
    main(sys.argv[1])
