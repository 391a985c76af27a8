#!/usr/bin/env bash
# Installs a cargo subcommand at an exact version with its own lockfile, unless that version is
# already installed (so a cached ~/.cargo/bin makes this free):
#
#   scripts/install-cargo-tool.sh CRATE VERSION      e.g. cargo-deny 0.20.2
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 CRATE VERSION" >&2
  exit 2
fi
crate=$1
version=$2
sub=${crate#cargo-}
cargo=${CARGO:-cargo}

# `cargo deny --version` prints `cargo-deny 0.20.2`; the last word is the version.
if have=$("$cargo" "$sub" --version 2>/dev/null) && [ "${have##* }" = "$version" ]; then
  echo "$crate $version: already installed"
  exit 0
fi
start=$(date +%s)
"$cargo" install --locked "$crate@$version"
echo "$crate $version: installed in $(( $(date +%s) - start ))s"
