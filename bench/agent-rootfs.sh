#!/usr/bin/env bash
# The agent image, assembled on a GPU machine from its own CUDA runtime and the carried agent,
# laid out as the Dockerfile's `agent` target lays it out (issue 50): what a container of that
# image sees, and nothing of the host's beyond it.
#
#   bench/agent-rootfs.sh OUT_DIR AGENT_BIN
#
# OUT_DIR/rootfs gets /usr/local/bin/gpuval-agent; cuBLAS, cuBLASLt, NVRTC and its builtins in
# /usr/local/cuda/lib64; NCCL's runtime (libnccl.so.2) in /usr/lib/x86_64-linux-gnu with the
# libnccl.so link in /usr/local/lib/gpuval-nccl; every library those need (from the host's
# loader), the loader's cache, and empty mount points. The driver (libcuda, NVML) is NOT in the
# image: the container runtime mounts it from the host (the CDI spec, bench/cdi-from-host.sh).
# OUT_DIR/image.json holds the image's env, entrypoint and user, as the Dockerfile sets them.
# The CUDA libraries are looked up in CUDA_LIB_DIRS (default: /usr/local/cuda/lib64, the CUDA
# target dir, PyTorch's nvidia/* wheels), then the loader's cache; a missing one fails the script
# (a missing library would make the pod's checks fail in a way the host's run would not), unless
# ROOTFS_ALLOW_MISSING=1 (the simulated backend loads none of them: bench/gpu-e2e.sh local).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 OUT_DIR AGENT_BIN" >&2
  exit 2
fi
OUT=$1
AGENT=$2
ROOT=$OUT/rootfs
rm -rf "$ROOT"
mkdir -p "$ROOT"/{usr/local/bin,usr/local/cuda/lib64,usr/local/lib/gpuval-nccl,usr/lib/x86_64-linux-gnu,lib64,etc}
mkdir -p "$ROOT"/{tmp,proc,sys,dev,var/lib/gpuval-agent,var/lib/gpuval-io,usr/local/nvidia,var/run/gpuval-gate}
chmod 1777 "$ROOT/tmp"
install -m 0755 "$AGENT" "$ROOT/usr/local/bin/gpuval-agent"

dirs=${CUDA_LIB_DIRS:-}
if [ -z "$dirs" ]; then
  dirs="/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib"
  site=$(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null || true)
  dirs="$dirs $site"
fi
# find NAME-GLOB: the first file matching it in the CUDA dirs, else in the loader's cache.
find_lib() {
  local d f
  for d in $dirs; do
    for f in "$d"/$1; do [ -e "$f" ] && { readlink -f "$f"; return 0; }; done
  done
  ldconfig -p | awk -v n="$1" '{ if ($1 ~ "^" n) { print $NF; exit } }' | xargs -r readlink -f
}
copied=()
# put NAME-GLOB DEST_DIR SONAME: the library found for the glob, as SONAME in DEST_DIR.
put() {
  local src
  src=$(find_lib "$1")
  if [ -z "$src" ] || [ ! -e "$src" ]; then
    echo "agent-rootfs.sh: $1 not found in $dirs or the loader's cache" >&2
    [ "${ROOTFS_ALLOW_MISSING:-0}" = 1 ] && return 0
    exit 1
  fi
  cp -L "$src" "$ROOT/$2/$3"
  copied+=("$ROOT/$2/$3")
  echo "  $3 <- $src"
}
echo "the image's CUDA libraries:"
put 'libcublas.so.1[0-9]*' usr/local/cuda/lib64 libcublas.so.13
put 'libcublasLt.so.1[0-9]*' usr/local/cuda/lib64 libcublasLt.so.13
put 'libnvrtc.so.1[0-9]*' usr/local/cuda/lib64 libnvrtc.so.13
put 'libnvrtc-builtins.so.1[0-9]*' usr/local/cuda/lib64 libnvrtc-builtins.so.13.0
put 'libnccl.so.2*' usr/lib/x86_64-linux-gnu libnccl.so.2
ln -sf /usr/lib/x86_64-linux-gnu/libnccl.so.2 "$ROOT/usr/local/lib/gpuval-nccl/libnccl.so"

# What those need, and the agent: the host's libraries (the base image's, in the Dockerfile).
for f in "$ROOT/usr/local/bin/gpuval-agent" "${copied[@]}"; do
  LD_LIBRARY_PATH="$ROOT/usr/local/cuda/lib64:$ROOT/usr/lib/x86_64-linux-gnu" ldd "$f" 2>/dev/null |
    awk '/=> \// {print $3} /^\t\/lib64/ {print $1}'
done | sort -u | while read -r lib; do
  case $lib in
    "$ROOT"/*) continue ;;
    */ld-linux-x86-64.so.2) cp -L "$lib" "$ROOT/lib64/ld-linux-x86-64.so.2" ;;
    *) cp -Ln "$lib" "$ROOT/usr/lib/x86_64-linux-gnu/" ;;
  esac
done
[ -e "$ROOT/lib64/ld-linux-x86-64.so.2" ] || cp -L /lib64/ld-linux-x86-64.so.2 "$ROOT/lib64/"
printf '/usr/lib/x86_64-linux-gnu\n/usr/local/cuda/lib64\n' >"$ROOT/etc/ld.so.conf"
ldconfig -r "$ROOT"
# The base image's trust store (ca-certificates in NVIDIA's CUDA images): the agent's TLS client
# loads it even where the kubeconfig names the API server's CA.
for ca in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
  if [ -f "$ca" ]; then
    mkdir -p "$ROOT/etc/ssl/certs"
    cp -L "$ca" "$ROOT/etc/ssl/certs/ca-certificates.crt"
    break
  fi
done
echo "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin" >"$ROOT/etc/passwd"
echo "nonroot:x:65532:" >"$ROOT/etc/group"

cat >"$OUT/image.json" <<'EOF'
{
  "env": [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/lib/gpuval-nccl:/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    "NVIDIA_VISIBLE_DEVICES=all",
    "NVIDIA_DRIVER_CAPABILITIES=compute,utility"
  ],
  "entrypoint": ["/usr/local/bin/gpuval-agent"],
  "uid": 65532,
  "gid": 65532
}
EOF
echo "image: $(du -sh "$ROOT" | cut -f1) in $ROOT"
