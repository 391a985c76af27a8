# shellcheck shell=bash
# The GPU gate's pod way (issue 50), sourced by bench/gpu-smoke.sh: the chart's own agent pod, as
# the operator writes it, run as an OCI container under runc on this GPU machine.
#
# pod_setup          runc (Debian's package from .device-carry/deb-runc, with libseccomp2 where the
#                    host lacks it), the control plane and the gpuval binaries packed by
#                    `bench/gpu-e2e.sh pack`, the agent image (bench/agent-rootfs.sh: this machine's
#                    CUDA runtime and the agent, laid out as the Dockerfile does) and a CDI spec of
#                    the host's GPUs (bench/cdi-from-host.sh); writes raw/pod-way.txt; false (with
#                    the reason in raw/log.txt) when any is missing
# pod_e2e NAME LIMIT VALIDATION EXPECT [ARGS...]
#                    gpu-e2e with bench/e2e/VALIDATION, --expect EXPECT and ARGS, the agent pod under
#                    runc; its stored report in raw/NAME.json, its YAML and logs in raw/pod/NAME/
#
# Uses gpu-smoke.sh's step, skip, say, RAW, AGENT and BUDGET_S.

POD_TOOLS=/tmp/gpuval-pod-tools
POD_IMAGE=/tmp/gpuval-pod-image
POD_CDI=/tmp/gpuval-pod-cdi.json
POD_RUNC_ROOT=/tmp/gpuval-runc-root
RUNC=
E2E_BIN=/tmp/gpuval-smoke-bin/gpu-e2e
OPERATOR_BIN=/tmp/gpuval-smoke-bin/gpuval-operator

pod_way_missing() {
  echo "the pod way cannot run: $*" | tee -a "$RAW/log.txt" >&2
  return 1
}

# unpack_xz ARCHIVE DEST: with xz, else Python's lzma.
unpack_xz() {
  mkdir -p "$2"
  if command -v xz >/dev/null; then
    xz -dc "$1" | tar -x -C "$2"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$1" "$2"
  fi
}

pod_runc() {
  local deb
  if command -v runc >/dev/null; then
    RUNC=$(command -v runc)
    return 0
  fi
  ls .device-carry/deb-runc/runc_*.deb >/dev/null 2>&1 || { pod_way_missing "no runc here and none carried (.device-carry/deb-runc)"; return 1; }
  mkdir -p "$POD_RUNC_ROOT"
  for deb in .device-carry/deb-runc/*.deb; do dpkg -x "$deb" "$POD_RUNC_ROOT"; done
  RUNC=$POD_RUNC_ROOT/usr/sbin/runc
  # runc re-executes itself inside the container's namespaces (runc init) with a bare
  # environment: libseccomp must be where the loader looks without LD_LIBRARY_PATH.
  if ! ldconfig -p | grep -q 'libseccomp\.so\.2 '; then
    cp -n "$POD_RUNC_ROOT"/usr/lib/x86_64-linux-gnu/libseccomp.so.2* /usr/lib/x86_64-linux-gnu/ && ldconfig
  fi
  "$RUNC" --version >"$RAW/runc-version.txt" 2>&1 || { pod_way_missing "runc does not start: $(head -c 300 "$RAW/runc-version.txt")"; return 1; }
}

pod_setup() {
  [ "$(id -u)" = 0 ] || { pod_way_missing "runc needs root"; return 1; }
  [ -x "$E2E_BIN" ] && [ -x "$OPERATOR_BIN" ] || { pod_way_missing "no gpu-e2e or gpuval-operator (run with AGENT=packed after bench/gpu-e2e.sh pack)"; return 1; }
  [ -f .device-carry/e2e/control-plane.tar.xz ] || { pod_way_missing "no .device-carry/e2e/control-plane.tar.xz"; return 1; }
  pod_runc || return 1
  unpack_xz .device-carry/e2e/control-plane.tar.xz "$POD_TOOLS/bin" || { pod_way_missing "unpacking the control plane failed"; return 1; }
  bash bench/agent-rootfs.sh "$POD_IMAGE" "$AGENT" >"$RAW/pod-image.log" 2>&1 \
    || { pod_way_missing "the agent image could not be assembled (raw/pod-image.log)"; return 1; }
  bash bench/cdi-from-host.sh "$POD_CDI" >"$RAW/pod-cdi.log" 2>&1 \
    || { pod_way_missing "no CDI spec of this host's GPUs (raw/pod-cdi.log)"; return 1; }
  cp "$POD_CDI" "$RAW/pod-cdi.json"
  {
    echo "runc: $(head -n 1 "$RAW/runc-version.txt")"
    echo "agent pod: the operator's own pod spec (k8s mode, read-only root, uid 65532, no capabilities, its volumes)"
    echo "$(tail -n 1 "$RAW/pod-image.log")"
    echo "GPUs: $(tail -n 1 "$RAW/pod-cdi.log")"
  } >"$RAW/pod-way.txt"
  cat "$RAW/pod-way.txt"
}

pod_e2e() {
  local name=$1 limit=$2 validation=$3 expect=$4
  shift 4
  [[ ${ways:-} == *pod* ]] || return 0
  rm -f "$RAW/$name.json"
  mkdir -p "$RAW/pod"
  step "$name" "$limit" - env GPUVAL_TOOLS_DIR="$POD_TOOLS" "$E2E_BIN" \
    --validation "bench/e2e/$validation" --expect "$expect" --out "$RAW/pod/$name" \
    --report-json "$RAW/$name.json" --timeout $((limit - 20)) \
    --agent-bin "$AGENT" --operator-bin "$OPERATOR_BIN" \
    --runc "$RUNC" --image "$POD_IMAGE" --cdi "$POD_CDI" "$@"
  rm -rf "$RAW/pod/$name/runc-state"
  return 0
}
