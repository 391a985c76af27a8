"""Link and storage sections of the bench table: agent p2p / host transfers against PyTorch,
agent file I/O against dd. Called by make_table.py; prints markdown."""
import json
import os

NAN = float("nan")


def _load(raw, name):
    p = os.path.join(raw, name)
    return json.load(open(p)) if os.path.exists(p) else None


def _rng(xs, fmt="{:.2f}"):
    xs = [x for x in xs if x == x]
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def p2p_section(raw, summary):
    agent = _load(raw, "agent-links.json") or {}
    torch = _load(raw, "torch-links.json") or {}
    p2p = agent.get("p2p")
    if not p2p or not p2p.get("pairs"):
        return
    ref = {(p["src"], p["dst"]): p for p in torch.get("p2p", [])}
    print(f"\n## Peer to peer: every ordered pair ({p2p['bufferMib']} MiB x {p2p['iterations']} copies, median of 3)\n")
    print("Agent: cuMemcpyPeerAsync on the copy engines, issued on the sender, behind a start gate, device-timed; "
          "bidirectional = both directions at once on two streams, summed. PyTorch: `dst.copy_(src)` the same "
          "number of times (bidirectional: one stream per device), wall-timed between synchronizations.\n")
    print("| pair | verdict | agent uni GB/s | torch uni | ratio [≥0.97] | agent bidi GB/s | torch bidi | ratio [≥0.97] | "
          "agent copy µs | torch copy µs | agent load ns | staged uni / bidi | bad words |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ru, rb = [], []
    for p in sorted(p2p["pairs"], key=lambda p: (p["src"], p["dst"])):
        t = ref.get((p["src"], p["dst"]), {})
        tu, tb = t.get("uni_gbps", NAN), t.get("bidi_gbps", NAN)
        ru.append(p["unidirectionalGbps"] / tu)
        rb.append(p["bidirectionalGbps"] / tb)
        staged = (f"{p.get('stagedUnidirectionalGbps', NAN):.0f} / {p.get('stagedBidirectionalGbps', NAN):.0f}"
                  if "stagedUnidirectionalGbps" in p else "-")
        print(f"| GPU{p['src']}->GPU{p['dst']} | {p['verdict']} | {p['unidirectionalGbps']:.1f} | {tu:.1f} | {ru[-1]:.3f} | "
              f"{p['bidirectionalGbps']:.1f} | {tb:.1f} | {rb[-1]:.3f} | {p['copyLatencyMicros']:.2f} | "
              f"{t.get('copy_latency_us', NAN):.2f} | {p.get('loadLatencyNanos', NAN):.0f} | {staged} | {p['mismatches']} |")
    uni = [p["unidirectionalGbps"] for p in p2p["pairs"]]
    bidi = [p["bidirectionalGbps"] for p in p2p["pairs"]]
    print(f"\np2p verdict: **{p2p['verdict']}** {'; '.join(p2p.get('reasons', []))} "
          f"({p2p['seconds']:.1f} s for {len(p2p['pairs'])} pairs)")
    if p2p.get("nvlinkErrors"):
        print(f"\nNVLink counters that moved: {'; '.join(p2p['nvlinkErrors'])}")
    summary += [("p2p unidirectional GB/s", _rng(uni, "{:.0f}")), ("… ÷ PyTorch copy_", _rng(ru, "{:.3f}")),
                ("p2p bidirectional GB/s", _rng(bidi, "{:.0f}")), ("… ÷ PyTorch two streams", _rng(rb, "{:.3f}"))]


def host_section(raw, summary):
    agent = _load(raw, "agent-links.json") or {}
    torch = (_load(raw, "torch-links.json") or {}).get("host", {})
    rows = [g for g in agent.get("gpus", []) if g.get("hostTransfer")]
    if not rows:
        return
    print("\n## Host transfers (256 MiB x 8 copies, median of 3)\n")
    print("Agent: pinned buffers allocated near the GPU's NUMA node, device-timed behind a start gate; pageable "
          "wall-timed. PyTorch: `copy_` from `pin_memory=True` / ordinary tensors, wall-timed; all at once = one process per GPU.\n")
    print("| GPU | dir | agent pinned | torch pinned | ratio [≥0.97] | agent all-at-once | torch all-at-once | ratio | "
          "agent pageable | torch pageable | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    pinned = []
    for g in rows:
        h = g["hostTransfer"]
        i = str(g["index"])
        alone = torch.get("alone", {}).get(i, {})
        together = torch.get("together", {}).get(i, {})
        for d, key in (("h2d", "h2dGbps"), ("d2h", "d2hGbps")):
            ap = (h.get("pinned") or {}).get(key, NAN)
            tp = alone.get("pinned", {}).get(d, NAN)
            ac = (h.get("pinnedConcurrent") or {}).get(key, NAN)
            tc = together.get(d, NAN)
            ag = (h.get("pageable") or {}).get(key, NAN)
            tg = alone.get("pageable", {}).get(d, NAN)
            ratios.append(ap / tp)
            pinned.append(ap)
            print(f"| {i} | {d} | {ap:.1f} | {tp:.1f} | {ap / tp:.3f} | {ac:.1f} | {tc:.1f} | {ac / tc:.3f} | "
                  f"{ag:.1f} | {tg:.1f} | {h['verdict']} |")
    summary += [("host pinned GB/s (each direction, alone)", _rng(pinned, "{:.1f}")),
                ("… ÷ PyTorch pinned copy_", _rng(ratios, "{:.3f}"))]


def io_section(raw, summary):
    runs = []
    for a, d in (("agent-io.json", "dd-io.json"), ("agent-io-2.json", "dd-io-2.json")):
        agent, dd = _load(raw, a), _load(raw, d)
        if agent and agent.get("io") and dd:
            runs.append((agent["io"], dd))
    if not runs:
        return
    disk = open(os.path.join(raw, "io-disk.txt")).read().strip() if os.path.exists(os.path.join(raw, "io-disk.txt")) else "?"
    print("\n## File I/O against dd on the same disk (4 files x 1 GiB, 4 at once, fsync)\n")
    print(f"```\n{disk}\n```\n")
    print("| run | agent write MB/s | dd write (oflag=direct conv=fsync) | ratio [≥0.90] | agent read MB/s | dd read (iflag=direct) | "
          "ratio [≥0.90] | O_DIRECT | verified | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rw, rr = [], []
    for n, (io, dd) in enumerate(runs, 1):
        w, r = io.get("writeMbps", NAN), io.get("readMbps", NAN)
        dw, dr = dd.get("dd_write_mbps", NAN), dd.get("dd_read_mbps", NAN)
        rw.append(w / dw)
        rr.append(r / dr)
        print(f"| {n} | {w:.0f} | {dw:.0f} | {w / dw:.3f} | {r:.0f} | {dr:.0f} | {r / dr:.3f} | "
              f"{io.get('directIo')} | {io.get('mismatches', '?')} bad | {io.get('verdict')} |")
    burn = _load(raw, "agent-io-burn.json")
    if burn and burn.get("io"):
        io = burn["io"]
        tf = [gm["tflops"] for g in burn.get("gpus", []) for gm in (g.get("compute") or {}).get("gemms", [])]
        print(f"\nDuring a 30 s bf16 burn on every GPU: write {io.get('writeMbps', NAN):.0f} MB/s, read "
              f"{io.get('readMbps', NAN):.0f} MB/s, verdict {io.get('verdict')}; bf16 {_rng(tf, '{:.0f}')} TFLOP/s meanwhile.")
    summary += [("io write ÷ dd", _rng(rw, "{:.3f}")), ("io read ÷ dd", _rng(rr, "{:.3f}"))]


def render(raw):
    summary = []
    p2p_section(raw, summary)
    host_section(raw, summary)
    io_section(raw, summary)
    if summary:
        print("\n## Links and storage summary\n\n| figure | value |\n|---|---|")
        for k, v in summary:
            print(f"| {k} | {v} |")
