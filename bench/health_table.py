#!/usr/bin/env python3
"""The table of bench/health-bench.sh: power, pulse, PCIe and memory depth per GPU on healthy
GPUs, then each planted fault with the verdict and reasons the agent gave.

    python3 bench/health_table.py RAW_DIR
"""
import os
import sys

from jsonfile import load_json


def load(raw, name):
    return load_json(os.path.join(raw, f"{name}.json"))


def fmt(v, spec="{:.0f}", none="-"):
    return none if v is None else spec.format(v)


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def per_gpu(check):
    """Makes `cells(result)`, the cells of one GPU's result of `check` after its index and
    verdict, into the rows of a report: one a GPU."""
    def wrap(cells):
        def rows(report):
            out = []
            for g in report.get("gpus", []):
                r = g.get(check) or {}
                out.append([g["index"], r.get("verdict", "-"), *cells(r)])
            return out
        return rows
    return wrap


@per_gpu("compute")
def power_rows(c):
    p = c.get("power") or {}
    bf16 = next((m["tflops"] for m in c.get("gemms", []) if m["dtype"] == "bf16"), None)
    throttle = ", ".join(f"{t['reason']} {100 * t['fraction']:.0f}%" for t in p.get("throttle", []))
    return [
        fmt(bf16), p.get("samples", "-"), fmt(p.get("medianW")),
        fmt(p.get("maxW")), fmt(p.get("limitW")), fmt(p.get("fraction"), "{:.3f}"),
        fmt(p.get("slowdownFraction"), "{:.3f}"), throttle or "-",
    ]


@per_gpu("compute")
def pulse_rows(c):
    u = c.get("pulse") or {}
    return [
        fmt(u.get("periodSeconds"), "{:g}"), u.get("cycles", "-"),
        fmt(u.get("minW")), fmt(u.get("maxW")), fmt(u.get("swingW")),
        f"{u.get('mismatches', '-')} of {u.get('comparisons', '-')}",
    ]


@per_gpu("hostTransfer")
def pcie_rows(h):
    p = h.get("pcie") or {}
    pinned = h.get("pinned") or {}
    link = f"Gen{p.get('linkGen', '?')} x{p.get('linkWidth', '?')}"
    most = f"Gen{p.get('maxGen', '?')} x{p.get('maxWidth', '?')} (GPU Gen{p.get('gpuMaxGen', '?')})"
    return [
        link, most, fmt(p.get("replays")), fmt(p.get("replaysTotal")),
        fmt(p.get("correctableErrors"), none="n/a"), fmt(p.get("uncorrectableErrors"), none="n/a"),
        f"{fmt(pinned.get('h2dGbps'), '{:.1f}')}/{fmt(pinned.get('d2hGbps'), '{:.1f}')}",
    ]


def remapped(r):
    """Remapped rows (correctable+uncorrectable, and whether a remap is pending)."""
    if not r:
        return "-"
    return f"{r.get('remappedCorrectable', '?')}+{r.get('remappedUncorrectable', '?')}" + \
        (" pending" if r.get("remapPending") else "")


@per_gpu("memory")
def memory_rows(m):
    pats = {p["pattern"]: p for p in m.get("patterns", [])}
    cells = [f"{pats[n]['mismatches']} bad, {pats[n]['gbps']:.0f} GB/s" if n in pats else "-"
             for n in ("address", "movingInversions", "random")]
    flips = m.get("bitFlips")
    flips = f"{flips['stuckAtOne']} 0→1, {flips['stuckAtZero']} 1→0" if flips else "none"
    return [
        fmt(m.get("testedGib"), "{:.1f}"), *cells, flips,
        f"{remapped(m.get('rowsBefore'))} → {remapped(m.get('rowsAfter'))}", fmt(m.get("seconds"), "{:.1f}"),
    ]


def fault_rows(raw):
    rows = []
    for name, what in (("fault-holder", "second process holds 40% of GPU 0's memory"),
                       ("fault-contend", "second process runs bf16 matmuls on GPU 0"),
                       ("fault-count", "expected GPU count one above what is present")):
        r = load(raw, name)
        if r is None:
            rows.append([what, "not run", "see steps.log"])
            continue
        reasons = "; ".join(f"[{f['code']}] {f['message']}" if isinstance(f, dict) else str(f)
                            for f in r.get("failures", [])) or "-"
        rows.append([what, r.get("verdict", "-"), reasons.replace("|", "/")])
    return rows


def ref_power(raw):
    """Median and max power per GPU over the PyTorch burn's nvidia-smi samples."""
    per = {}
    try:
        with open(os.path.join(raw, "ref-power.csv")) as f:
            for line in f:
                cells = [c.strip() for c in line.split(",")]
                try:
                    per.setdefault(int(cells[0]), []).append(float(cells[1]))
                except (ValueError, IndexError):
                    continue
    except OSError:
        return {}
    out = {}
    for gpu, w in per.items():
        w.sort()
        # The burn is the top of the trace: the samples above half the peak (warm-up and tail off).
        hot = [x for x in w if x > w[-1] / 2] or w
        out[gpu] = (hot[len(hot) // 2], w[-1])
    return out


def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}"


def reference_rows(raw):
    """The agent's figures beside PyTorch's on the same GPUs, in the same call."""
    burst = load_json(os.path.join(raw, "ref-burst.json")) or {}
    sus = ((load_json(os.path.join(raw, "ref-sustained.json")) or {}).get("matmul_sustained") or {}).get("bf16") or {}
    links = ((load_json(os.path.join(raw, "ref-links.json")) or {}).get("host") or {}).get("alone") or {}
    watts = ref_power(raw)
    power, memory, pcie = (load(raw, n) or {} for n in ("power", "memory", "pcie"))
    by = lambda rep: {g["index"]: g for g in rep.get("gpus", [])}
    power, memory, pcie = by(power), by(memory), by(pcie)
    rows = []
    for i in sorted(set(power) | set(memory) | set(pcie)):
        c = (power.get(i) or {}).get("compute") or {}
        tf = next((m["tflops"] for m in c.get("gemms", []) if m["dtype"] == "bf16"), None)
        tfl = sus.get("tflops") or []
        tf_ref = tfl[i] if i < len(tfl) else None
        w = (c.get("power") or {}).get("medianW")
        w_ref = watts.get(i, (None, None))[0]
        pats = {p["pattern"]: p for p in ((memory.get(i) or {}).get("memory") or {}).get("patterns", [])}
        mem = (pats.get("address") or {}).get("gbps")
        mv = burst.get("memverify") or []
        mem_ref = mv[i]["gbps"] if i < len(mv) else None
        copy = burst.get("copy_gbps") or []
        copy_ref = copy[i] if i < len(copy) else None
        pinned = ((pcie.get(i) or {}).get("hostTransfer") or {}).get("pinned") or {}
        host_ref = (links.get(str(i)) or links.get(i) or {}).get("pinned") or {}
        rows.append([
            i, fmt(tf), fmt(tf_ref), ratio(tf, tf_ref), fmt(w), fmt(w_ref), ratio(w, w_ref),
            fmt(mem), fmt(copy_ref), ratio(mem, copy_ref), fmt(mem_ref),
            f"{fmt(pinned.get('h2dGbps'), '{:.1f}')}/{fmt(pinned.get('d2hGbps'), '{:.1f}')}",
            f"{fmt(host_ref.get('h2d'), '{:.1f}')}/{fmt(host_ref.get('d2h'), '{:.1f}')}",
        ])
    return rows


def main():
    raw = sys.argv[1]
    parts = ["# health bench", ""]
    sections = [
        ("power (bf16 burn)", "power", power_rows,
         ["GPU", "verdict", "bf16 TFLOP/s", "samples", "median W", "max W", "limit W", "share", "slowed", "throttle reasons"]),
        ("pulse", "pulse", pulse_rows,
         ["GPU", "verdict", "period s", "cycles", "min W", "max W", "swing W", "mismatches"]),
        ("PCIe (memory + host transfers)", "pcie", pcie_rows,
         ["GPU", "verdict", "under load", "most allowed", "replays", "replays total", "AER cor", "AER unc", "pinned H2D/D2H GB/s"]),
        ("memory depth", "memory", memory_rows,
         ["GPU", "verdict", "GiB", "address", "movingInversions", "random", "bits flipped", "rows before → after", "seconds"]),
    ]
    for title, name, rows_of, header in sections:
        report = load(raw, name)
        parts.append(f"## {title}")
        parts.append("")
        if report is None:
            parts.append(f"(no {name}.json: see steps.log)")
        else:
            parts.append(f"node verdict: {report.get('verdict')}")
            parts.append("")
            parts.append(table(header, rows_of(report)))
        parts.append("")
    parts.append("## beside PyTorch (same GPUs, same call)")
    parts.append("")
    parts.append("agent bf16 TFLOP/s and median W from the power burn; PyTorch's from its own burn of the same "
                 "length with nvidia-smi sampling every 200 ms; memory: the agent's address pattern (fill + "
                 "verify, bytes written + read) against a PyTorch device copy (bytes read + written), and "
                 "PyTorch's own fill/compare of 8 GiB (elementwise ops, for scale); host: pinned GB/s, one GPU at a time.")
    parts.append("")
    parts.append(table(["GPU", "bf16 TFLOP/s", "torch", "ratio", "median W", "torch W", "ratio",
                        "memory GB/s", "torch copy", "ratio", "torch fill/verify", "pinned H2D/D2H", "torch H2D/D2H"],
                       reference_rows(raw)))
    parts.append("")
    parts.append("## planted faults")
    parts.append("")
    parts.append(table(["fault", "node verdict", "first failures"], fault_rows(raw)))
    print("\n".join(parts))


if __name__ == "__main__":
    main()
