#!/usr/bin/env bash
# `make test`'s runner: `cargo test` over the whole workspace (ARGS are cargo test's), its whole
# output kept in target/test-output.log. The terminal gets one line per test binary as it runs,
# then every failure in full, then the closing counts, where a test that could not run here
# (it printed `SKIPPED: why`, as the browser and real-node tests do without their tools) is
# counted as skipped, not passed. The exit code is cargo's.
#
#   tests/scripts/run-tests.sh [CARGO TEST ARGS...]
set -uo pipefail
cd "$(dirname "$0")/../.."
log=${CARGO_TARGET_DIR:-target}/test-output.log
mkdir -p "$(dirname "$log")"
"${CARGO:-cargo}" test "$@" 2>&1 | tee "$log" | grep --line-buffered -E '^ +Running |^test result: ' |
  sed -u -E 's/^ +Running (.*) \(.*/running \1/'
rc=${PIPESTATUS[0]}
python3 - "$log" "$rc" <<'EOF'
import re
import sys

text = open(sys.argv[1], errors="replace").read()
passed = failed = ignored = 0
for m in re.finditer(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", text, re.M):
    passed, failed, ignored = passed + int(m[1]), failed + int(m[2]), ignored + int(m[3])
skipped = re.findall(r"^SKIPPED: .*$", text, re.M)
# Each failing test's output: libtest lists them between `failures:` and the names under a
# second `failures:` (with --show-output the passing tests' output sits under `successes:`).
blocks = []
for section in re.finditer(r"^failures:\n\n(.*?)^failures:\n", text, re.M | re.S):
    blocks += re.findall(r"^---- .*?(?=^---- |\Z)", section[1], re.M | re.S)
build = re.findall(r"^error(?:\[E\d+\])?: .*$", text, re.M)
if blocks or build:
    print("\n==== failures (the whole output: %s)" % sys.argv[1])
    for b in blocks:
        print(b.rstrip()[:6000] + "\n")
    for e in build[:20]:
        print(e)
if skipped:
    print("\n==== could not run here (counted as skipped):")
    for s in sorted(set(skipped)):
        print(f"  {s} ({skipped.count(s)}x)")
n_skipped = min(len(skipped), passed)
print()
if passed + failed + ignored == 0 and sys.argv[2] != "0":
    print(f"no test ran: cargo test ended with exit {sys.argv[2]} (the errors above)")
else:
    print(f"{passed - n_skipped} passed, {failed} failed, {n_skipped + ignored} skipped")
EOF
exit "$rc"
