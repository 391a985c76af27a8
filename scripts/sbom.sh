#!/usr/bin/env bash
# CycloneDX SBOMs (JSON, specification 1.5) of release binaries, one per binary, from
# Cargo.lock and the workspace's manifests, made by cargo-cyclonedx (`make tools`):
#
#   scripts/sbom.sh DEST_DIR BINARY...        e.g. scripts/sbom.sh target/dist gpuval-agent
#
# DEST_DIR/BINARY.cdx.json names the binary and lists every crate its package links for this
# platform (dev- and build-only dependencies left out), each with its version, package URL,
# license and the checksum Cargo.lock records. SOURCE_DATE_EPOCH, when set, drops the random
# serial number so the same sources give the same file.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 DEST_DIR BINARY..." >&2
  exit 2
fi
cargo=${CARGO:-cargo}
if ! "$cargo" cyclonedx --version >/dev/null 2>&1; then
  echo "error: cargo-cyclonedx is required: make tools (cargo install --locked cargo-cyclonedx@VERSION)" >&2
  exit 1
fi
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
dest=$(cd "$1" && pwd)
shift

# cargo-cyclonedx writes NAME_bin.cdx.json beside the Cargo.toml of every workspace member
# that has binaries; the ones asked for are moved to DEST_DIR, the others removed.
generated() { find "$root" -mindepth 2 -maxdepth 2 -type f -name '*_bin.cdx.json'; }
cleanup() { generated | while read -r f; do rm -f "$f"; done; }
trap cleanup EXIT
cleanup
(cd "$root" && "$cargo" cyclonedx --quiet --format json --spec-version 1.5 \
  --describe binaries --all --no-build-deps)

for bin in "$@"; do
  found=$(generated | grep "/${bin}_bin\.cdx\.json$" || true)
  if [ -z "$found" ] || [ "$(printf '%s\n' "$found" | wc -l)" -ne 1 ]; then
    echo "error: cargo-cyclonedx wrote no single SBOM for binary $bin (found: ${found:-none})" >&2
    exit 1
  fi
  if ! grep -q '"bomFormat": *"CycloneDX"' "$found"; then
    echo "error: $found is not a CycloneDX document" >&2
    exit 1
  fi
  mv -f "$found" "$dest/$bin.cdx.json"
  echo "$dest/$bin.cdx.json"
done
