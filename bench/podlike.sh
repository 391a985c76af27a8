#!/usr/bin/env bash
# Runs a command the way the chart's agent pod runs the agent, on a bare GPU host (issue 42):
#
#   bench/podlike.sh GPUS CMD [ARGS...]     # as root; GPUS: NVML indices (0,1), or `all`
#
# - its own PID namespace (NVML lists only the processes inside it) and mount namespace, with a
#   fresh /proc;
# - a /dev of its own holding only what the NVIDIA container runtime gives a pod: null, zero,
#   full, random, urandom, tty, nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset and the
#   device nodes of GPUS (the other GPUs' nodes are absent, and their /proc/driver/nvidia/gpus
#   entries are emptied, as the runtime masks them); a memory-backed /dev/shm of 4 GiB (the
#   chart's `dshm` volume);
# - user and group 65532 (the image's USER), no supplementary groups, no capabilities in any
#   set, `no_new_privs` (allowPrivilegeEscalation: false), and a bare environment: the caller's PATH, HOME,
#   the image's LD_LIBRARY_PATH plus the caller's, and any GPUVAL_*, NCCL_* and CUDA_DEVICE_ORDER
#   the caller set.
#
# What it cannot copy from a pod: the cgroup limits and the seccomp profile (RuntimeDefault
# refuses few calls a user without capabilities could make anyway). The command's files must be
# readable by 65532, and where it writes must be writable by 65532 (PODLIKE_OWN=DIR chowns DIR
# first).
set -euo pipefail
POD_UID=${POD_UID:-65532}
if [ "${1:-}" != --inside ]; then
  if [ $# -lt 2 ]; then
    echo "usage: $0 GPUS CMD [ARGS...]   (GPUS: NVML indices like 0,1, or all)" >&2
    exit 2
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "podlike.sh: start it as root (it builds the namespaces, then drops to $POD_UID)" >&2
    exit 2
  fi
  for tool in unshare setpriv mount nvidia-smi; do
    command -v "$tool" >/dev/null || { echo "podlike.sh: $tool is missing" >&2; exit 2; }
  done
  [ -n "${PODLIKE_OWN:-}" ] && chown -R "$POD_UID:$POD_UID" "$PODLIKE_OWN"
  exec unshare --pid --fork --kill-child --mount --propagation private --mount-proc -- bash "$0" --inside "$@"
fi
shift
gpus=$1
shift

# The device minors of the GPUs given (NVML index -> bus id -> the driver's Device Minor).
keep=()
while IFS=, read -r index bus; do
  bus=$(echo "$bus" | tr -d ' ' | tr 'A-F' 'a-f')
  dir=/proc/driver/nvidia/gpus/${bus#????}
  [ -d "$dir" ] || dir=/proc/driver/nvidia/gpus/$bus
  if [ "$gpus" = all ] || [[ ",$gpus," == *",$index,"* ]]; then
    # `Device Minor: \t 0`: the number is the line's last field.
    minor=$(awk '/Device Minor/{print $NF}' "$dir/information" 2>/dev/null || true)
    if ! [[ $minor =~ ^[0-9]+$ ]]; then
      echo "podlike.sh: no Device Minor in $dir/information; taking /dev/nvidia$index for GPU $index" >&2
      minor=$index
    fi
    keep+=("nvidia$minor")
  elif [ -d "$dir" ]; then
    # The runtime masks the GPUs a container was not given.
    mount -t tmpfs -o ro,size=4k tmpfs "$dir"
  fi
done < <(nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader)
if [ ${#keep[@]} -eq 0 ]; then
  echo "podlike.sh: none of GPUs $gpus is on this host" >&2
  exit 2
fi

host_dev=$(mktemp -d /tmp/podlike-hostdev.XXXXXX)
mount --bind /dev "$host_dev"
mount -t tmpfs -o mode=755,size=64k tmpfs /dev
for n in null zero full random urandom tty nvidiactl nvidia-uvm nvidia-uvm-tools nvidia-modeset "${keep[@]}"; do
  [ -e "$host_dev/$n" ] || continue
  touch "/dev/$n"
  mount --bind "$host_dev/$n" "/dev/$n"
done
umount -l "$host_dev"
rmdir "$host_dev"
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777,size=4g tmpfs /dev/shm
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr

pass=("PATH=$PATH" HOME=/tmp
  "LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib:/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
while IFS='=' read -r name _; do
  case $name in GPUVAL_* | NCCL_* | CUDA_DEVICE_ORDER | TORCH_* | NVSHMEM_* | PYTHON*) pass+=("$name=${!name}") ;; esac
done < <(env)
exec setpriv --reuid "$POD_UID" --regid "$POD_UID" --clear-groups --inh-caps=-all \
  --ambient-caps=-all --bounding-set=-all --no-new-privs -- env -i "${pass[@]}" "$@"
