#!/usr/bin/env bash
# A CDI spec of this host's NVIDIA GPUs, made from its driver files as `nvidia-ctk cdi
# generate` makes one on a node with the NVIDIA container toolkit (issue 50): a device per GPU
# (`nvidia.com/gpu=<NVML index>`, its /dev/nvidiaN by the driver's Device Minor), and for every
# GPU container the control and UVM device nodes (and nvidia-caps where present) and the
# driver's user-space libraries, mounted read-only at /usr/local/nvidia (where the agent image's
# LD_LIBRARY_PATH looks, as on GKE and the GPU Operator's driver container).
#
#   bench/cdi-from-host.sh OUT_FILE            # this host's GPUs (nvidia-smi)
#   FAKE_GPUS=N bench/cdi-from-host.sh OUT_FILE  # N stand-in devices on /dev/null (simulated runs)
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_FILE" >&2
  exit 2
fi
OUT=$1
if [ -n "${FAKE_GPUS:-}" ]; then
  python3 - "$OUT" "$FAKE_GPUS" <<'PY'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
spec = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": str(i), "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}", "hostPath": "/dev/null"}]}} for i in range(n)],
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/dev/null"}]}}
json.dump(spec, open(out, "w"), indent=1)
print(f"CDI spec: {n} stand-in device(s) (simulated) in {out}")
PY
  exit 0
fi
# The driver's libraries: their folder when it is /usr/local/nvidia's, else each file.
libcuda=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
[ -n "$libcuda" ] || libcuda=$(ls /usr/local/nvidia/lib64/libcuda.so.1 2>/dev/null || true)
[ -n "$libcuda" ] || { echo "cdi-from-host.sh: no libcuda.so.1 on this host" >&2; exit 1; }
nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader >/tmp/cdi-gpus.csv
python3 - "$OUT" "$(readlink -f "$libcuda")" /tmp/cdi-gpus.csv <<'PY'
import glob, json, os, sys
out, libcuda, gpus_csv = sys.argv[1:]
devices = []
for line in open(gpus_csv):
    index, bus = [x.strip() for x in line.split(",")]
    bus = bus.lower()
    info, proc_dir = None, None
    for cand in (bus[4:], bus):
        p = f"/proc/driver/nvidia/gpus/{cand}/information"
        if os.path.exists(p):
            info, proc_dir = open(p).read(), os.path.dirname(p)
    minor = index
    for l in (info or "").splitlines():
        if l.startswith("Device Minor"):
            minor = l.split()[-1]
    device = {"name": index, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{minor}"}]}}
    if proc_dir:
        # A container not given this GPU sees its driver folder masked.
        device["annotations"] = {"gpuval.io/driver-proc": proc_dir}
    devices.append(device)
nodes = [p for p in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] if os.path.exists(p)]
nodes += sorted(p for p in glob.glob("/dev/nvidia-caps/*") if not os.path.isdir(p))
libdir = os.path.dirname(libcuda)
if libdir.startswith("/usr/local/nvidia/"):
    mounts = [{"hostPath": "/usr/local/nvidia", "containerPath": "/usr/local/nvidia", "options": ["ro", "nosuid", "nodev", "bind"]}]
else:
    names = ["libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4", "libcudadebugger.so.1"]
    mounts = []
    for n in names:
        p = os.path.join(libdir, n)
        if os.path.exists(p):
            mounts.append({"hostPath": os.path.realpath(p), "containerPath": f"/usr/local/nvidia/lib64/{n}", "options": ["ro", "nosuid", "nodev", "bind"]})
spec = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": devices,
        "containerEdits": {"deviceNodes": [{"path": p} for p in nodes], "mounts": mounts}}
json.dump(spec, open(out, "w"), indent=1)
print(f"CDI spec: {len(devices)} GPU(s), {len(nodes)} shared device node(s), driver from {libdir}: {out}")
PY
