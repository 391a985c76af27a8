#!/usr/bin/env bash
# The reference figures for the agent's io check: `dd` with direct I/O on the same directory.
# C parallel writers (bs=8M, oflag=direct, conv=fsync), then C parallel readers (iflag=direct),
# each phase timed as a whole; FILES files of SIZE_MIB MiB spread over the C streams.
# Prints one JSON line {"dd_write_mbps":..,"dd_read_mbps":..} (MB/s = 1e6 bytes/s) and removes
# its files.
#
#   bench/io_ref.sh DIR SIZE_MIB FILES CONCURRENCY
#
# Compare with the agent on the same directory in the same call, e.g.:
#   gpuval-agent run --backend sim --checks io --io-dir DIR --io-file-size-mib SIZE_MIB \
#     --io-files FILES --io-concurrency C --json | jq '.io | {writeMbps, readMbps}'
set -euo pipefail

if [[ $# -ne 4 ]]; then
  echo "usage: $0 DIR SIZE_MIB FILES CONCURRENCY" >&2
  exit 2
fi
dir=$1 size_mib=$2 files=$3 conc=$4
for n in "$size_mib" "$files" "$conc"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "SIZE_MIB, FILES and CONCURRENCY must be positive whole numbers" >&2; exit 2; }
done
if (( size_mib % 8 != 0 )); then
  echo "SIZE_MIB must be a multiple of 8 (dd writes 8 MiB blocks)" >&2
  exit 2
fi
[[ -d $dir && -w $dir ]] || { echo "$dir is not a writable directory" >&2; exit 2; }

work=$(mktemp -d "$dir/io-ref.XXXXXX")
trap 'rm -rf "$work"' EXIT
count=$(( size_mib / 8 ))

now() { date +%s.%N; }

# Worker w handles files w, w+C, w+2C, ... one after the other (like the agent's workers).
phase() {
  local mode=$1 pids=() w f
  for (( w = 0; w < conc; w++ )); do
    (
      for (( f = w; f < files; f += conc )); do
        if [[ $mode == write ]]; then
          dd if=/dev/zero of="$work/f$f" bs=8M count="$count" oflag=direct conv=fsync status=none
        else
          dd if="$work/f$f" of=/dev/null bs=8M iflag=direct status=none
        fi
      done
    ) &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

bytes=$(( size_mib * 1024 * 1024 * files ))
t0=$(now); phase write; t1=$(now)
phase read; t2=$(now)
awk -v b="$bytes" -v t0="$t0" -v t1="$t1" -v t2="$t2" \
  'BEGIN { printf "{\"dd_write_mbps\":%.1f,\"dd_read_mbps\":%.1f}\n", b / (t1 - t0) / 1e6, b / (t2 - t1) / 1e6 }'
