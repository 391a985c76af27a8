#!/usr/bin/env bash
# Splits a release binary into what ships and what stays for symbolizing crashes:
#
#   scripts/split-debug.sh BINARY DEST_DIR
#
# DEST_DIR/NAME        the binary without its debug sections. Its symbol table stays, so a panic's
#                      backtrace still names functions; a .gnu_debuglink names NAME.debug.
# DEST_DIR/NAME.debug  the DWARF (line tables, compressed) and symbols. gdb, addr2line and eu-stack
#                      find it beside the binary, or by the build ID both files share
#                      (/usr/lib/debug/.build-id/XX/REST.debug, or a debuginfod server).
#
# BINARY is left as built (cargo's output), so running this again gives the same files.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BINARY DEST_DIR" >&2
  exit 2
fi
objcopy=${OBJCOPY:-objcopy}
readelf=${READELF:-readelf}
for tool in "$objcopy" "$readelf"; do
  command -v "$tool" >/dev/null 2>&1 || { echo "error: $tool is required (GNU binutils)" >&2; exit 1; }
done
# The section table of a file, read whole first: `readelf | grep -q` under pipefail fails when
# grep stops at its match and readelf takes SIGPIPE, which a large binary makes likely.
sections() { "$readelf" -S -W "$1"; }

bin=$(realpath "$1")
name=$(basename "$bin")
mkdir -p "$2"
dest=$(realpath "$2")
if [ "$dest/$name" = "$bin" ]; then
  echo "error: DEST_DIR must not hold BINARY itself ($bin)" >&2
  exit 2
fi
if ! grep -q ' \.debug_line ' <<<"$(sections "$bin")"; then
  echo "error: $bin has no debug line tables (already stripped, or built without debug info)" >&2
  exit 1
fi

work=$(mktemp -d "$dest/.split-debug.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$objcopy" --only-keep-debug --compress-debug-sections=zlib "$bin" "$work/$name.debug"
chmod 0644 "$work/$name.debug"
# The debug link records the file name and its CRC; objcopy reads the file by that name, so
# run where it lies.
(cd "$work" && "$objcopy" --strip-debug --add-gnu-debuglink="$name.debug" "$bin" "$name")
if grep -Eq ' \.debug_(info|line) ' <<<"$(sections "$work/$name")"; then
  echo "error: $work/$name still has debug sections" >&2
  exit 1
fi
mv -f "$work/$name.debug" "$dest/$name.debug"
mv -f "$work/$name" "$dest/$name"
printf '%s: %s bytes as built, %s shipped, %s in %s.debug\n' "$name" \
  "$(stat -c %s "$bin")" "$(stat -c %s "$dest/$name")" "$(stat -c %s "$dest/$name.debug")" "$name"
