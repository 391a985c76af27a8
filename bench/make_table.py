"""Side-by-side table (markdown) of a gpu-bench.sh run: agent figures against PyTorch's."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import links_table  # noqa: E402

raw = sys.argv[1]


def load(name):
    p = os.path.join(raw, name)
    return json.load(open(p)) if os.path.exists(p) else None


def med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


burst = load("torch-burst.json") or {}
def sustained(name):
    return (load(name) or {}).get("matmul_sustained", {})


sus = {**sustained("torch-sustained.json"), **sustained("torch-dtypes.json")}
short = sustained("torch-short.json")
ashort = load("agent-short.json") or {}
mem08 = load("agent-memory-0.8.json") or {}
bf16 = load("agent-bf16.json") or {}
dts = load("agent-dtypes.json") or {}
machine = open(os.path.join(raw, "machine.txt")).read().splitlines()
topo = open(os.path.join(raw, "topo-compare.txt")).read().strip() if os.path.exists(os.path.join(raw, "topo-compare.txt")) else "?"
selftest = open(os.path.join(raw, "selftest.txt")).read().strip() if os.path.exists(os.path.join(raw, "selftest.txt")) else "?"

intro = bf16 or load("agent-links.json") or load("agent-io.json") or {}
if any((load(n) or {}).get("simulated") for n in os.listdir(raw) if n.startswith("agent-") and n.endswith(".json")):
    print("**SIMULATED BACKEND: these figures are not from real GPUs.**\n")
print(f"# gpuval agent vs PyTorch\n\nMachine: {', '.join(l for l in machine[:1])}; {len(intro.get('gpus', []))} GPU(s); "
      f"torch {burst.get('torch') or (load('torch-links.json') or {}).get('torch')} (CUDA {burst.get('cuda')}); agent {intro.get('agentVersion')} backend {intro.get('backend')}; "
      f"started {intro.get('startedAt')}\n")
print("Ratios are agent / PyTorch on the same GPU in the same call. Targets from the issues in brackets.\n")

if mem08 or bf16:
    print("## Memory: fill + verify of the same bytes (GB/s = bytes written + read per second)\n")
    print("| GPU | tested GiB | agent fill | agent verify | agent fill+verify | torch fill+verify | ratio [≥4x] | D2D copy (r+w) | agent / copy [≥0.80] | mismatches |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, g in enumerate(mem08.get("gpus", [])):
        m = g.get("memory") or {}
        tv = (burst.get("memverify") or [{}] * 99)[i] if burst.get("memverify") else {}
        cp = (burst.get("copy_gbps") or [float("nan")] * 99)[i]
        tg = tv.get("gbps", float("nan"))
        print(f"| {g['index']} | {m.get('testedGib', 0):.1f} | {m.get('fillGbps', 0):.0f} | {m.get('verifyGbps', 0):.0f} | {m.get('gbps', 0):.0f} | "
              f"{tg:.0f} | {m.get('gbps', 0) / tg:.2f}x | {cp:.0f} | {m.get('gbps', 0) / cp:.2f} | {m.get('mismatches')} |")

    print("\n## Memory at the default fraction (0.95 of free)\n")
    print("| GPU | tested GiB | fill+verify GB/s | mismatches | verdict |")
    print("|---|---|---|---|---|")
    for g in bf16.get("gpus", []):
        m = g.get("memory") or {}
        print(f"| {g['index']} | {m.get('testedGib', 0):.1f} | {m.get('gbps', 0):.0f} | {m.get('mismatches')} | {m.get('verdict')} |")

    print("\n## Compute: TFLOP/s, n = 8192, every GPU at once\n")
    print("Sustained: agent and PyTorch each run back-to-back GEMMs for the same time on all GPUs (the long bf16 burn, then 20 s per other dtype); "
          "the GPUs run at their power cap (see telemetry), so this is the like-for-like figure. Burst: PyTorch's 10 products after 3 warm-ups on a cool GPU.\n")
    print("| GPU | dtype | agent sustained | torch sustained | agent / torch [≥0.97] | torch burst | agent / burst | agent mismatches | max rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rep in (bf16, dts):
        for g in rep.get("gpus", []):
            for gm in (g.get("compute") or {}).get("gemms", []):
                d = gm["dtype"]
                b = (burst.get("matmul_burst_tflops") or {}).get(d, [float("nan")] * 99)[g["index"]]
                st = sus.get(d, {}).get("tflops", [float("nan")] * 99)[g["index"]]
                print(f"| {g['index']} | {d} | {gm['tflops']:.1f} | {st:.1f} | {gm['tflops'] / st:.3f} | {b:.1f} | {gm['tflops'] / b:.3f} | {gm['mismatches']} | {gm['maxRelError']:.2e} |")

    print("\n## Compute: short burn, 5 s bf16, every GPU at once\n")
    print("| GPU | agent | torch | agent / torch [≥0.97] |")
    print("|---|---|---|---|")
    for g in ashort.get("gpus", []):
        for gm in (g.get("compute") or {}).get("gemms", []):
            st = short.get("bf16", {}).get("tflops", [float("nan")] * 99)[g["index"]]
            print(f"| {g['index']} | {gm['tflops']:.1f} | {st:.1f} | {gm['tflops'] / st:.3f} |")

    print("\n## Telemetry during the bf16 burn\n")
    print("| GPU | SM clock MHz min/mean/max | temp °C max | power W max | throttle reasons | verdict |")
    print("|---|---|---|---|---|---|")
    for g in bf16.get("gpus", []):
        t = g.get("telemetry") or {}
        sm, te, pw = t.get("smClockMhz") or {}, t.get("temperatureC") or {}, t.get("powerW") or {}
        print(f"| {g['index']} | {sm.get('min', 0):.0f}/{sm.get('mean', 0):.0f}/{sm.get('max', 0):.0f} | {te.get('max', 0):.0f} | {pw.get('max', 0):.0f} | "
              f"{', '.join(t.get('throttleReasons', [])) or '-'} | {g.get('verdict')} |")

    print(f"\n## Topology\n\n```\n{topo}\n```\n\n## Memory self-test\n\n```\n{selftest}\n```\n")
    print(f"Node verdict (bf16 run): **{bf16.get('verdict')}** {'; '.join(bf16.get('failures', []))}")

links_table.render(raw)
