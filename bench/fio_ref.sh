#!/usr/bin/env bash
# The reference figures for the agent's io check: fio with the agent's own pattern of I/O on the
# same directory. CONCURRENCY jobs each write then read FILES/CONCURRENCY files of SIZE_MIB MiB
# in BS_KIB blocks, direct I/O, one request in flight per job (psync: the agent's workers make
# one blocking call at a time), each file fsynced as it is closed (the agent fsyncs every file),
# and each file grown by its writes as the agent's are (--fallocate=none: by default fio
# allocates a file's blocks before the timed writes, which the agent's new files do not have;
# on ext4 every direct write past the end of a file also updates its size in the journal);
# each phase timed by fio. Prints one JSON line {"fio_write_mbps":..,"fio_read_mbps":..,...}
# (MB/s = 1e6 bytes/s) and removes its files.
#
#   bench/fio_ref.sh FIO DIR SIZE_MIB FILES CONCURRENCY [BS_KIB]     # BS_KIB: 8192 (the agent's)
set -euo pipefail

if [[ $# -lt 5 || $# -gt 6 ]]; then
  echo "usage: $0 FIO DIR SIZE_MIB FILES CONCURRENCY [BS_KIB]" >&2
  exit 2
fi
fio=$1 dir=$2 size_mib=$3 files=$4 conc=$5 bs_kib=${6:-8192}
for n in "$size_mib" "$files" "$conc" "$bs_kib"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "SIZE_MIB, FILES, CONCURRENCY and BS_KIB must be positive whole numbers" >&2; exit 2; }
done
[[ -x $fio ]] || { echo "$fio is not an executable fio" >&2; exit 2; }
[[ -d $dir && -w $dir ]] || { echo "$dir is not a writable directory" >&2; exit 2; }
(( files % conc == 0 )) || { echo "FILES must be a multiple of CONCURRENCY (each job takes as many files)" >&2; exit 2; }

work=$(mktemp -d "$dir/fio-ref.XXXXXX")
trap 'rm -rf "$work"' EXIT
per_job=$(( files / conc ))

# phase RW: one fio run of CONCURRENCY jobs over the same files (the job name fixes the names).
phase() {
  "$fio" --name=gpuval --directory="$work" --rw="$1" --bs="${bs_kib}k" --direct=1 \
    --ioengine=psync --iodepth=1 --numjobs="$conc" --nrfiles="$per_job" \
    --filesize="${size_mib}m" --size="$(( size_mib * per_job ))m" --file_service_type=sequential \
    --fallocate=none --fsync_on_close=1 --group_reporting --output-format=json
}

write=$(phase write)
read=$(phase read)
python3 - "$write" "$read" "$bs_kib" "$conc" <<'EOF'
import json
import sys

w, r = (json.loads(x)["jobs"][0] for x in sys.argv[1:3])
print(json.dumps({
    "fio_write_mbps": round(w["write"]["bw_bytes"] / 1e6, 1),
    "fio_read_mbps": round(r["read"]["bw_bytes"] / 1e6, 1),
    "bs_kib": int(sys.argv[3]),
    "numjobs": int(sys.argv[4]),
    "iodepth": 1,
    "direct": 1,
}))
EOF
