#!/usr/bin/env python3
"""The summary of a bench/gpu-smoke.sh run: summary.json from its raw directory.

    python3 bench/smoke_summary.py RAW_DIR OUT_JSON [--commit SHA] [--into-repo] [--results-dir DIR]

It holds the commit the run was made at (--commit, else RAW_DIR/commit.txt), the machine (GPU
count, model, driver), the ways the agent ran (`ways`, from RAW_DIR/ways.txt: `host`, the agent
run on the host, always; `pod`, the agent run the way a Kubernetes pod runs it, when ways.txt
names it), every figure beside its reference with the ratio, the target (ratio >= 0.97; io >=
0.97 of fio, or 0.90 of dd in runs without fio) and the way it ran, each check's verdict per way
(`checks` the host way's, `podChecks` the pod way's against the same references), each planted
fault and whether it was caught, the operator flow, every step's exit code, and `pass`: every
applicable check Pass (its node Pass or Warn) and every ratio at or above its target in every
way that ran, every fault caught, the operator flow Passed, the agent's topology matching
`nvidia-smi topo -m` cell by cell, the commit known.

A fault is caught when an expected code is found in the agent's report; a neighbour on a GPU
(another process holding its memory or burning on it, on the host or beside the pod-like agent)
only when, besides, the agent recommended no hardware action (the report's action None or Rerun,
and no reason anywhere recommending ResetGpu, RebootNode or ReplaceHardware): other work on a
GPU is not a hardware fault.

Whatever is missing (a report, a reference, a step) is recorded as missing, never as a zero, and
keeps `pass` false; `notPassing` says why. The operator flow's step (e2e) skipped on purpose
(its steps.tsv line `skipped` with a note) does not keep `pass` false: `notRun` names it, and
the scenarios it would have run.
--into-repo also writes it to bench/results/gpu-smoke/<date>-<gpus>x<model>/summary.json (or
under --results-dir). Exit 0 when the run passes, 1 when not, 2 on bad arguments.
"""
import argparse
import datetime
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jsonfile import load_json  # noqa: E402
from nccl_table import nccl_tests_rows  # noqa: E402

TARGET = 0.97
# Against dd, storage through a VM's virtual disk varied more from run to run than a GPU does (the
# first 4x H200 smoke: read 0.93 of dd, where bench/README.md's runs gave 1.04-1.40): runs whose io
# reference is dd keep the bench's own target, 0.90 of dd. fio, with the agent's block size, jobs
# and direct I/O, measures like for like: against it io has the GPU figures' target.
IO_TARGET_DD = 0.90
# The ways the agent steps ran: on the host (agent-*.json), and as the chart's own pod (the
# operator's agent pod as an OCI container, its stored report: pod-agent-*.json; raw/pod-way.txt
# names the runtime, `runc` since issue 50, a namespaced process before). The host way always;
# the pod way when raw/ways.txt names it.
WAYS = ("host", "pod")
BIG = 256 << 20  # NCCL figures at and above this size (where the floors apply)
ORDER = ["Skipped", "Pass", "Warn", "Fail", "Error"]
NCCL_FILES = {"allReduce": "all_reduce", "allGather": "all_gather", "reduceScatter": "reduce_scatter"}
NEIGHBOUR_FAULTS = [
    # name, way, agent report, codes any of which catches it (with no hardware action), what was planted
    ("memory-held", "host", "fault-memory", ["MemoryBusy", "ForeignProcess", "GpuBusy"],
     "a second process holds 40% of GPU 0's memory during the memory check"),
    ("compute-contended", "host", "fault-compute", ["ForeignProcess", "GpuBusy"],
     "a second process burns bf16 on GPU 0 during a 10 s burn"),
    ("pod-neighbour-before", "pod", "pod-fault-before", ["GpuBusy", "MemoryBusy", "ForeignProcess"],
     "a process burning bf16 on GPU 0 started before the agent pod's memory+compute run"),
    ("pod-neighbour-during", "pod", "pod-fault-during", ["GpuBusy", "MemoryBusy", "ForeignProcess"],
     "a process starts burning bf16 on GPU 0 inside the agent pod's compute burn"),
]
HARDWARE_ACTIONS = ("ResetGpu", "RebootNode", "ReplaceHardware")


def worst(verdicts):
    known = [v for v in verdicts if v in ORDER]
    return max(known, key=ORDER.index) if known else None


class Run:
    """What the raw directory holds, read once."""

    def __init__(self, raw):
        self.raw = raw
        self.steps = read_steps(os.path.join(raw, "steps.tsv"))
        named = (self.text("ways.txt") or "").split()
        self.ways = [w for w in WAYS if w == "host" or w in named]
        # The pod way's runtime (`runc: runc version 1.1.5` on pod-way.txt's first line).
        said = (self.text("pod-way.txt") or "").splitlines()
        self.pod_runtime = said[0].split(":")[0].strip() if said and ":" in said[0] else None
        self.pod_way = said

    def way_name(self, way):
        """The way as figures and faults name it: `host`, `pod: runc`."""
        if way == "pod" and self.pod_runtime:
            return f"pod: {self.pod_runtime}"
        return way

    def path(self, name):
        return os.path.join(self.raw, name)

    def json(self, name):
        return load_json(self.path(name))

    def text(self, name):
        try:
            with open(self.path(name)) as f:
                return f.read()
        except OSError:
            return None

    def why_missing(self, name, step):
        """Why raw/NAME is not there, from its step's line in steps.tsv."""
        s = self.steps.get(step)
        if s is None:
            return f"raw/{name} not found (step {step} did not run)"
        if s["rc"] == "skipped":
            return f"raw/{name} not found (step {step} skipped: {s['note']})"
        return f"raw/{name} not found or not whole JSON (step {step} exit {s['rc']}{'; ' + s['note'] if s['note'] else ''})"


def read_steps(path):
    steps = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return steps
    for line in lines[1:]:
        parts = line.split("\t")
        if len(parts) >= 4:
            steps[parts[0]] = {"step": parts[0], "rc": parts[1], "seconds": parts[2], "limit": parts[3],
                               "note": parts[4] if len(parts) > 4 else ""}
    return steps


def machine(run):
    text = run.text("machine.txt") or ""
    listed = [l for l in text.splitlines() if re.match(r"^GPU \d+:", l)]
    rows = [l.split(", ") for l in text.splitlines() if re.match(r"^\d+, ", l)]
    models = sorted({r[1] for r in rows if len(r) > 1})
    drivers = sorted({r[2] for r in rows if len(r) > 2})
    return {
        "gpus": len(listed) if listed else (len(rows) or None),
        "model": ", ".join(models) or None,
        "driver": ", ".join(drivers) or None,
    }


def figure(check, what, value, reference, tool, missing=None, target=TARGET):
    f = {"check": check, "what": what, "value": value, "reference": reference, "referenceTool": tool,
         "ratio": None, "target": target, "meets": False}
    if missing is None and value is None:
        missing = "the agent's figure"
    if missing is None and reference is None:
        missing = f"the reference ({tool})"
    if missing is None and reference <= 0:
        missing = f"the reference ({tool}) is {reference}"
    if missing is not None:
        f["missing"] = missing
        return f
    f["ratio"] = round(value / reference, 4)
    f["meets"] = f["ratio"] >= target
    return f


def gpu_list(ref, key, i):
    xs = (ref or {}).get(key)
    return xs[i] if isinstance(xs, list) and i < len(xs) else None


def way_step(way, step):
    """The agent step `step` (agent-memory) of a way: pod-agent-memory for the pod way."""
    return step if way == "host" else f"{way}-{step}"


def way_prefix(way):
    """What notPassing puts before a line about a way: nothing for the host way."""
    return "" if way == "host" else f"{way} way: "


def pod_step(run, step):
    """A pod-way gpu-e2e step: its exit code (0: gpu-e2e's own checks of the verdict, the node's
    line and the Node's marks held) and the lines of its summary.txt that say PASS or FAIL."""
    s = run.steps.get(step) or {}
    text = run.text(f"pod/{step}/summary.txt") or ""
    lines = [l for l in text.splitlines() if l.startswith(("PASS ", "FAIL ", "RESULT"))]
    return s.get("rc"), lines


def memory_figures(run, report, _step):
    burst = run.json("torch-burst.json")
    why = None if burst else run.why_missing("torch-burst.json", "torch-burst")
    out = []
    for g in report.get("gpus", []):
        m = g.get("memory") or {}
        out.append(figure("memory", f"GPU{g['index']} memory fill+verify GB/s vs device-to-device copy",
                          m.get("gbps"), gpu_list(burst, "copy_gbps", g["index"]), "pytorch copy_", why))
    return out


def compute_figures(run, report, _step):
    ref = run.json("torch-compute.json")
    why = None if ref else run.why_missing("torch-compute.json", "torch-compute")
    tflops = ((ref or {}).get("matmul_sustained") or {}).get("bf16", {}).get("tflops")
    out = []
    for g in report.get("gpus", []):
        gemm = next((x for x in (g.get("compute") or {}).get("gemms", []) if x.get("dtype") == "bf16"), {})
        r = tflops[g["index"]] if isinstance(tflops, list) and g["index"] < len(tflops) else None
        out.append(figure("compute", f"GPU{g['index']} bf16 TFLOP/s, 10 s, every GPU at once",
                          gemm.get("tflops"), r, "pytorch sustained matmul", why))
    return out


def parse_nvbandwidth(text):
    """(header, {(row, column): GB/s}) of the matrix in one nvbandwidth test's output."""
    lines = (text or "").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("memcpy") and "bandwidth (GB/s)" in line and i + 1 < len(lines):
            cols = [int(c) for c in lines[i + 1].split() if c.isdigit()]
            cells = {}
            for row in lines[i + 2:]:
                f = row.split()
                if not f or not f[0].isdigit():
                    break
                for c, v in zip(cols, f[1:]):
                    try:
                        cells[(int(f[0]), c)] = float(v)
                    except ValueError:
                        pass  # N/A on the diagonal
            return line, cells
    return None, {}


class LinkRef:
    """The links reference: nvbandwidth's matrices when it ran, else PyTorch's link_ref.py."""

    def __init__(self, run):
        said = (run.text("links-ref.txt") or "").strip()
        self.tool = "nvbandwidth" if said.startswith("nvbandwidth") else "pytorch link_ref.py"
        self.missing = {}
        if self.tool == "nvbandwidth":
            self.nvb = {}
            for t in ("host_to_device_memcpy_ce", "device_to_host_memcpy_ce", "device_to_device_memcpy_write_ce",
                      "device_to_device_bidirectional_memcpy_write_ce"):
                header, cells = parse_nvbandwidth(run.text(f"nvbandwidth-{t}.txt"))
                if not cells:
                    self.missing[t] = run.why_missing(f"nvbandwidth-{t}.txt", f"nvbandwidth-{t}")
                self.nvb[t] = (header or "", cells)
        else:
            self.torch = run.json("torch-links.json")
            if not self.torch:
                why = run.why_missing("torch-links.json", "torch-links")
                self.missing = {k: why for k in ("host", "p2p")}

    def _cell(self, test, src, dst):
        """GB/s from src to dst in an nvbandwidth matrix (the header's arrow says which is the row)."""
        header, cells = self.nvb[test]
        return cells.get((dst, src) if "<-" in header and "<->" not in header else (src, dst))

    def p2p(self, src, dst):
        if self.tool == "nvbandwidth":
            uni = self._cell("device_to_device_memcpy_write_ce", src, dst)
            a = self._cell("device_to_device_bidirectional_memcpy_write_ce", src, dst)
            b = self._cell("device_to_device_bidirectional_memcpy_write_ce", dst, src)
            bidi = a + b if a is not None and b is not None else None
            return uni, bidi, self.missing.get("device_to_device_memcpy_write_ce"), \
                self.missing.get("device_to_device_bidirectional_memcpy_write_ce")
        pair = next((p for p in (self.torch or {}).get("p2p", []) if p["src"] == src and p["dst"] == dst), {})
        why = self.missing.get("p2p")
        return pair.get("uni_gbps"), pair.get("bidi_gbps"), why, why

    def host(self, gpu, direction):
        if self.tool == "nvbandwidth":
            test = "host_to_device_memcpy_ce" if direction == "h2d" else "device_to_host_memcpy_ce"
            header, cells = self.nvb[test]
            return cells.get((0, gpu)), self.missing.get(test)
        alone = ((self.torch or {}).get("host") or {}).get("alone", {}).get(str(gpu), {})
        return (alone.get("pinned") or {}).get(direction), self.missing.get("host")


def link_figures(run, report, _step):
    ref = LinkRef(run)
    out = []
    for p in ((report.get("p2p") or {}).get("pairs") or []):
        uni, bidi, why_u, why_b = ref.p2p(p["src"], p["dst"])
        pair = f"GPU{p['src']}->GPU{p['dst']}"
        out.append(figure("p2p", f"{pair} unidirectional GB/s", p.get("unidirectionalGbps"), uni, ref.tool, why_u))
        out.append(figure("p2p", f"{pair} bidirectional GB/s (both ways, summed)", p.get("bidirectionalGbps"), bidi,
                          ref.tool, why_b))
    for g in report.get("gpus", []):
        pinned = (g.get("hostTransfer") or {}).get("pinned") or {}
        for d, key in (("h2d", "h2dGbps"), ("d2h", "d2hGbps")):
            r, why = ref.host(g["index"], d)
            out.append(figure("hostTransfer", f"GPU{g['index']} pinned {d} GB/s", pinned.get(key), r, ref.tool, why))
    return out


def nccl_figures(run, report, _step):
    out = []
    curves = {c["collective"]: c["rows"] for c in (((report.get("nccl") or {}).get("sweep") or {}).get("curves") or [])}
    for coll, file in NCCL_FILES.items():
        name = f"nccl-tests-{file}.txt"
        theirs = nccl_tests_rows(run.path(name))
        why = None if theirs else run.why_missing(name, f"nccl-tests-{file}")
        if why and "nccl-tests" in run.steps and run.steps["nccl-tests"]["rc"] == "skipped":
            why = f"raw/{name} not found (nccl-tests skipped: {run.steps['nccl-tests']['note']})"
        rows = [r for r in curves.get(coll, []) if r["bytes"] >= BIG]
        if not rows:
            out.append(figure("nccl", f"{coll} busbw GB/s at >= 256 MiB", None, None, "nccl-tests",
                              f"no {coll} rows at >= 256 MiB in the agent's report"))
        for r in rows:
            t = theirs.get(r["bytes"])
            out.append(figure("nccl", f"{coll} busbw GB/s at {r['bytes'] >> 20} MiB", r.get("busbwGbps"),
                              t[2] if t else None, "nccl-tests",
                              why or (None if t else f"nccl-tests has no row at {r['bytes']} B")))
    return out


def training_figures(run, report, _step):
    ref = run.json("torch-training.json")
    why = None if ref else run.why_missing("torch-training.json", "torch-training")
    figs = ((report.get("training") or {}).get("figures") or {})
    return [figure("training", "samples/s per GPU", figs.get("samplesPerSecondPerGpu"),
                   (ref or {}).get("samples_per_s_per_gpu"), "pytorch DDP", why)]


# The io step runs the agent (each way) and the reference in turn, up to IO_ROUNDS rounds on the
# same directory (agent-io, fio-io, pod-agent-io, then -2 and -3 with each side first in one
# round, then -4 and -5; dd-io and two or three rounds in older runs): a VM's disk varies from one second to the next, so
# each side is taken at its best of its rounds, the same rule for all.
IO_ROUNDS = 5


def io_rounds(run, stem):
    """The reports of rounds stem, stem-2, ... (None where a round left none)."""
    names = [f"{stem}.json"] + [f"{stem}-{i}.json" for i in range(2, IO_ROUNDS + 1)]
    return [run.json(n) for n in names]


class IoRef:
    """The io reference: fio when the run has fio rounds (a fio-io step or report; one that
    left no report is a missing reference, never dd in its place), at the GPU figures' target;
    else dd, at 0.90 (runs before fio)."""

    def __init__(self, run):
        self.fio = any(n.startswith("fio-io") for n in run.steps) or any(io_rounds(run, "fio-io"))
        stem = "fio-io" if self.fio else "dd-io"
        self.tool, self.label = ("fio", "fio") if self.fio else ("dd", "dd direct")
        self.target = TARGET if self.fio else IO_TARGET_DD
        self.rounds = [r for r in io_rounds(run, stem) if r]
        self.missing = None if self.rounds else run.why_missing(f"{stem}.json", stem)

    def key(self, direction):
        return f"{self.tool}_{direction}_mbps"


def best(items, key):
    """The best of the numbers under `key` in `items`, and all of them."""
    xs = [x.get(key) for x in items if isinstance(x.get(key), (int, float))]
    return (max(xs) if xs else None), xs


def io_figures(run, report, step):
    ref = IoRef(run)
    agents = [report] + [r for r in io_rounds(run, step)[1:] if r]
    out = []
    for direction, own in (("write", "writeMbps"), ("read", "readMbps")):
        value, values = best([a.get("io") or {} for a in agents], own)
        reference, references = best(ref.rounds, ref.key(direction))
        f = figure("io", f"{direction} MB/s", value, reference, ref.label, ref.missing, target=ref.target)
        f["rounds"] = {"agent": values, "reference": references, "rule": "best of each side's rounds, run in turn"}
        out.append(f)
    return out


# check -> (agent step (the host way's), the check's own verdicts in its report, its figures,
# needs 2+ GPUs)
CHECKS = {
    "topology": ("agent-topology", lambda r: [(r.get("topology") or {}).get("verdict")], None, False),
    "memory": ("agent-memory", lambda r: [(g.get("memory") or {}).get("verdict") for g in r.get("gpus", [])],
               memory_figures, False),
    "compute": ("agent-compute", lambda r: [(g.get("compute") or {}).get("verdict") for g in r.get("gpus", [])],
                compute_figures, False),
    "p2p": ("agent-links", lambda r: [(r.get("p2p") or {}).get("verdict")], None, True),
    "hostTransfer": ("agent-links", lambda r: [(g.get("hostTransfer") or {}).get("verdict")
                                               for g in r.get("gpus", [])], link_figures, False),
    "nccl": ("agent-nccl", lambda r: [(r.get("nccl") or {}).get("verdict")], nccl_figures, True),
    "training": ("agent-training", lambda r: [(r.get("training") or {}).get("verdict")], training_figures, True),
    "io": ("agent-io", lambda r: [(r.get("io") or {}).get("verdict")], io_figures, False),
}


def reasons(report):
    """Every reason anywhere in a report (a dict with a code and a message), each once."""
    found = []

    def walk(x):
        if isinstance(x, dict):
            if isinstance(x.get("code"), str) and "message" in x and x not in found:
                found.append(x)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(report)
    return found


def codes(report):
    """Every reason code anywhere in a report."""
    return sorted({r["code"] for r in reasons(report)})


def checks_and_figures(run, gpus, way):
    """The checks and figures of one way, each saying the way."""
    checks, figures = {}, []
    for name, (step, own, figs, pairs) in CHECKS.items():
        step = way_step(way, step)
        if pairs and gpus == 1:
            checks[name] = {"verdict": "Skipped", "notApplicable": "one GPU", "way": way}
            continue
        report = run.json(f"{step}.json")
        if not report:
            why = run.why_missing(f"{step}.json", step)
            checks[name] = {"verdict": None, "missing": why, "way": way}
            if figs:
                figures.append(figure(name, "every figure of the check", None, None, "-", why))
            continue
        verdicts = [v for v in own(report) if v is not None]
        checks[name] = {"verdict": worst(verdicts) if verdicts else None, "nodeVerdict": report.get("verdict"),
                        "codes": codes(report), "report": f"raw/{step}.json", "way": way}
        if not verdicts:
            checks[name]["missing"] = f"raw/{step}.json has no {name} result"
        if figs:
            figures += figs(run, report, step)
    if way == "host" and "topo-compare" in run.steps:
        checks["topology"]["nvidiaSmiCompareExit"] = run.steps["topo-compare"]["rc"]
    for c in checks.values():
        c["way"] = run.way_name(way)
    for f in figures:
        f["way"] = run.way_name(way)
    return checks, figures


def neighbour_fault(run, name, way, step, expect, planted):
    """Other work on GPU 0 beside the agent: caught when an expected code is found and the agent
    recommended no hardware action (its action None or Rerun, no reason saying ResetGpu,
    RebootNode or ReplaceHardware)."""
    f = {"name": name, "way": run.way_name(way), "planted": planted, "expect": expect, "caught": False}
    report = run.json(f"{step}.json")
    if report is None:
        f["missing"] = run.why_missing(f"{step}.json", step)
        return f
    found = codes(report)
    action = report.get("action", "None")  # the report's default, as the agent reads it
    hardware = [{k: r.get(k) for k in ("code", "action", "message")} for r in reasons(report)
                if r.get("action") in HARDWARE_ACTIONS]
    f.update(found=found, verdict=report.get("verdict"), action=action, hardwareActions=hardware,
             caught=any(c in found for c in expect) and action in ("None", "Rerun") and not hardware)
    if way == "pod" and run.pod_runtime:
        # Through the operator: gpu-e2e also held the node's line (Error, not Hardware evidence)
        # and the Node (no failure taint, no Fail label).
        rc, lines = pod_step(run, step)
        f.update(operatorFlowExit=rc, operatorFlow=lines)
        f["caught"] = f["caught"] and rc == "0"
    return f


def pod_killed(run):
    """The agent pod's container killed mid-run: caught when gpu-e2e saw the node end Error
    naming exit code 137, with evidence other than Hardware and no mark on the Node."""
    f = {"name": "pod-killed", "way": run.way_name("pod"), "caught": False,
         "planted": "SIGKILL to every process of the agent pod's container 8 s into a 2-minute burn",
         "expect": ["node Error naming exit code 137", "no Hardware evidence", "no failure taint or Fail label"]}
    s = run.steps.get("pod-killed")
    if s is None or s["rc"] == "skipped":
        f["missing"] = run.why_missing("pod/pod-killed/summary.txt", "pod-killed")
        return f
    rc, lines = pod_step(run, "pod-killed")
    f.update(operatorFlowExit=rc, operatorFlow=lines, caught=rc == "0")
    return f


def fault_why(f):
    """Why a fault is not caught, for notPassing."""
    if f.get("missing"):
        return f"fault {f['name']} not caught: {f['missing']}"
    why = f"fault {f['name']} not caught: found {f.get('found', [])}, expected one of {f['expect']}"
    hardware = [f"{r['code']} {r['action']}" for r in f.get("hardwareActions", [])]
    if hardware or f.get("action", "None") not in ("None", "Rerun"):
        why += f"; the agent recommended a hardware action (action {f['action']}" + \
            (f"; {', '.join(hardware)})" if hardware else ")")
    return why


def faults(run, gpus):
    out = [neighbour_fault(run, *fault) for fault in NEIGHBOUR_FAULTS if fault[1] in run.ways]
    if "pod" in run.ways and run.pod_runtime:
        out.append(pod_killed(run))
    if gpus and gpus >= 2:
        out.append(training_never_joined(run))
        out.append(e2e_scenario(run, "fabric-fault", "the fabric: this host as <gpus> nodes, the last one's NCCL "
                                "given no network interface; with 3+ nodes that node and no other must be named, with "
                                "2 it must be the suspect and neither node Failed"))
    return out


# The fault-training step: its step timeout (--training-timeout), the watchdog's grace, and what
# process start, kernel compilation, cuBLAS and the weights may add before the replicas meet.
TRAINING_HANG_TIMEOUT_S, TRAINING_HANG_GRACE_S, TRAINING_HANG_SETUP_S = 10, 5, 45


def training_never_joined(run):
    """Rank 1 never joins the training communicator: caught when the training result is Error,
    names rank 1 as the one that never joined, says the fault was planted, and the step ended
    within the timeout, the grace and setup (the watchdog ended it, not the step's limit)."""
    f = {"name": "training-never-joined", "way": "host", "caught": False,
         "planted": "rank 1's replica never calls ncclCommInitRank (GPUVAL_TRAINING_TEST_HANG_INIT=1, "
                    "the hooks agent)",
         "expect": ["training Error", "rank 1 ... never joined", "PLANTED FAULT",
                    f"ended within {TRAINING_HANG_TIMEOUT_S + TRAINING_HANG_GRACE_S + TRAINING_HANG_SETUP_S}s"]}
    report = run.json("fault-training.json")
    if report is None:
        f["missing"] = run.why_missing("fault-training.json", "fault-training")
        return f
    training = report.get("training") or {}
    messages = [r.get("message", "") for r in training.get("reasons") or []]
    step = run.steps.get("fault-training") or {}
    try:
        seconds = float(step.get("seconds"))
    except (TypeError, ValueError):
        seconds = None
    bound = TRAINING_HANG_TIMEOUT_S + TRAINING_HANG_GRACE_S + TRAINING_HANG_SETUP_S
    named = any(re.search(r"rank 1 \(GPU \d+\) never joined", m) for m in messages)
    planted = any(m.startswith("PLANTED FAULT") for m in messages)
    f.update(verdict=training.get("verdict"), found=codes(report), messages=messages[:3],
             stepSeconds=seconds, boundSeconds=bound)
    f["caught"] = (training.get("verdict") == "Error" and named and planted
                   and seconds is not None and seconds <= bound)
    return f


def e2e_skipped(run):
    """The note of the e2e step when it was skipped on purpose (rc `skipped`), else None."""
    s = run.steps.get("e2e")
    return (s["note"] or "no reason given") if s and s["rc"] == "skipped" else None


def e2e_scenario(run, scenario, planted=None):
    """A gpu-e2e.sh scenario's outcome from raw/e2e/summary.log (its runner checks the expected
    verdict, node, GPU and reason, and exits 0 when they all hold). A fault scenario's agent runs
    on the host (a local process for its pod). `skipped` holds the e2e step's note when that
    step was skipped on purpose."""
    f = {"name": scenario}
    if planted:
        f.update(way="host", planted=planted, expect=["the named node at fault"], caught=False)
    if e2e_skipped(run) is not None:
        f["skipped"] = e2e_skipped(run)
    log = run.text("e2e/summary.log")
    m = re.search(rf"^== {re.escape(scenario)}: exit (\d+), wall ([\d.]+)s", log or "", re.M)
    ok = bool(m) and m.group(1) == "0"
    if m:
        f.update(exit=int(m.group(1)), wallSeconds=float(m.group(2)))
    elif log and re.search(rf"{re.escape(scenario)}: SKIPPED \(([^)]*)\)", log):
        f["missing"] = "skipped: " + re.search(rf"{re.escape(scenario)}: SKIPPED \(([^)]*)\)", log).group(1)
    else:
        f["missing"] = run.why_missing("e2e/summary.log", "e2e") if log is None else \
            f"raw/e2e/summary.log has no {scenario} outcome"
    if planted:
        f["caught"] = ok
    else:
        f["passed"] = ok
    return f


def operator_flow(run):
    """The operator flow from kubectl apply to Passed: the pod way's pod-agent-checks (the real
    operator, its agent pod as a container) where the pod way ran under a runtime, else the
    e2e step's `standard` scenario (the agent a local process for its pod)."""
    if not (run.pod_runtime and "pod-agent-checks" in run.steps):
        return e2e_scenario(run, "standard")
    rc, lines = pod_step(run, "pod-agent-checks")
    f = {"name": "pod-agent-checks", "way": run.way_name("pod"), "exit": rc, "lines": lines,
         "passed": rc == "0"}
    if rc != "0":
        f["missing"] = run.why_missing("pod/pod-agent-checks/summary.txt", "pod-agent-checks")
    return f


def checks_why(checks, way):
    """Why a way's checks do not pass, for notPassing."""
    why = []
    for name, c in checks.items():
        if c.get("notApplicable"):
            continue
        if c.get("verdict") != "Pass":
            why.append(f"{way_prefix(way)}check {name}: {c.get('verdict') or c.get('missing')}")
        elif c.get("nodeVerdict") not in ("Pass", "Warn"):
            why.append(f"{way_prefix(way)}check {name}: the node's verdict is {c.get('nodeVerdict')} "
                       f"({', '.join(c.get('codes', []))})")
    return why


def figures_why(figures):
    """Why figures do not meet their targets, for notPassing."""
    return [f"{way_prefix(f['way'])}{f['check']} {f['what']}: "
            + (f"missing {f['missing']}" if "missing" in f else f"ratio {f['ratio']} < {f['target']}")
            for f in figures if not f["meets"]]


def not_passing(commit, mach, by_way, figures, planted, operator):
    """Every reason the run does not pass (empty when it passes)."""
    why = []
    if commit is None:
        why.append("commit unknown: pass --commit or set GPUVAL_COMMIT for the run")
    if not mach["gpus"]:
        why.append("machine unknown: raw/machine.txt lists no GPU")
    compare = by_way["host"]["topology"].get("nvidiaSmiCompareExit")
    if compare != "0":
        why.append("topology: `gpuval-agent topo --compare` against `nvidia-smi topo -m` "
                   + ("did not run" if compare is None else f"exit {compare} (raw/topo-compare.log)"))
    for way, checks in by_way.items():
        why += checks_why(checks, way)
    why += figures_why(figures)
    why += [fault_why(f) for f in planted if not f["caught"] and "skipped" not in f]
    if not operator["passed"] and "skipped" not in operator:
        why.append(f"operator flow ({operator['name']}): " + (operator.get("missing") or f"exit {operator.get('exit')}"))
    return why


def not_run(planted, operator, run=None, gpus=None):
    """What was skipped on purpose (the operator flow's step), so not held against `pass`, and
    what the machine could not show (one GPU: a pod given some of the host's GPUs)."""
    out = [f"operator flow ({operator['name']}): skipped: {operator['skipped']}"] if "skipped" in operator else []
    out += [f"fault {f['name']}: skipped: {f['skipped']}" for f in planted if "skipped" in f]
    if run is not None and run.pod_runtime and gpus == 1:
        out.append("pod given some of the host's GPUs never touching the others: needs two GPUs or more")
    return out


def summarize(raw, commit=None):
    run = Run(raw)
    mach = machine(run)
    if commit is None:
        commit = (run.text("commit.txt") or "").strip() or None
    by_way, figures = {}, []
    for way in run.ways:
        by_way[way], figs = checks_and_figures(run, mach["gpus"], way)
        figures += figs
    planted = faults(run, mach["gpus"])
    operator = operator_flow(run)
    why = not_passing(commit, mach, by_way, figures, planted, operator)
    summary = {
        "commit": commit,
        "started": (run.text("started.txt") or "").strip() or None,
        "machine": mach,
        "ways": [run.way_name(w) for w in run.ways],
        "podWay": run.pod_way or None,
        "target": TARGET,
        "references": {"links": LinkRef(run).tool, "nccl": "nccl-tests", "compute": "pytorch",
                       "memory": "pytorch", "training": "pytorch DDP", "io": IoRef(run).tool},
        "checks": by_way["host"],
    }
    if "pod" in by_way:
        summary["podChecks"] = by_way["pod"]
    summary.update({
        "figures": figures,
        "faults": planted,
        "operatorFlow": operator,
        "steps": list(run.steps.values()),
        "pass": not why,
        "notPassing": why,
        "notRun": not_run(planted, operator, run, mach["gpus"]),
    })
    return summary


def repo_dir(summary):
    """<date>-<gpus>x<model>, e.g. 2026-11-27-4xh100."""
    date = (summary.get("started") or "")[:10] or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    model = (summary["machine"].get("model") or "unknown").split(", ")[0]
    model = re.sub(r"^NVIDIA\s+", "", model).split()[0].lower() if model.strip() else "unknown"
    model = re.sub(r"[^a-z0-9]+", "-", model)
    return f"{date}-{summary['machine'].get('gpus') or 0}x{model}"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw")
    ap.add_argument("out")
    ap.add_argument("--commit")
    ap.add_argument("--into-repo", action="store_true")
    ap.add_argument("--results-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                          "results", "gpu-smoke"))
    a = ap.parse_args(argv)
    if not os.path.isdir(a.raw):
        print(f"smoke_summary.py: {a.raw} is not a directory (give the raw/ of a gpu-smoke.sh run)", file=sys.stderr)
        return 2
    summary = summarize(a.raw, a.commit)
    text = json.dumps(summary, indent=1) + "\n"
    targets = [a.out]
    if a.into_repo:
        targets.append(os.path.join(a.results_dir, repo_dir(summary), "summary.json"))
    for path in targets:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}")
    print("PASS" if summary["pass"] else "NOT PASSING:\n  " + "\n  ".join(summary["notPassing"]))
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
