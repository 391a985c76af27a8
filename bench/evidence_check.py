#!/usr/bin/env python3
"""Checks a gate run's evidence (gpu-e2e's OUT/evidence) with the standard readers, here after
the device call: each in-toto attestation verifies with securesystemslib's DSSE against the
published key (tests/scripts/dsse-verify.py) and fails once tampered (a GPU's serial or a
node's verdict changed in the payload, the signature kept) and under another key; the run's
JUnit report parses with junitparser (tests/scripts/junit-read.py). Prints what it found, one
line a check; exits 0 when every check holds.

    PYTHONPATH=<evidence readers> bench/evidence_check.py EVIDENCE_DIR

(the readers: `tests/scripts/install-chart-tools.sh` prints EVIDENCE_PYTHONPATH.)
"""
import base64
import json
import os
import subprocess
import sys
import tempfile

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "tests", "scripts")


def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *args],
                          capture_output=True, text=True, check=False)


def tampered(envelope, edit):
    statement = json.loads(base64.b64decode(envelope["payload"]))
    edit(statement)
    out = dict(envelope)
    out["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    return out


def edit_of(statement):
    """A change a forger would want: a node's first GPU serial, a validation's first node
    verdict, or (a validation without a node certificate) its phase."""
    p = statement["predicate"]
    if p.get("hardware", {}).get("gpus"):
        def edit(s):
            s["predicate"]["hardware"]["gpus"][0]["serial"] = "1650924060077"
        return "a GPU serial", edit

    if p.get("nodes"):
        def edit(s):
            s["predicate"]["nodes"][0]["verdict"] = "Pass" if p["nodes"][0]["verdict"] != "Pass" else "Fail"
        return "a node's verdict", edit

    def edit(s):
        s["predicate"]["phase"] = "Passed" if p.get("phase") != "Passed" else "Failed"
    return "the run's phase", edit


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    key, keyid = os.path.join(d, "public.pem"), open(os.path.join(d, "keyId")).read().strip()
    other = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        other_key = os.path.join(tmp, "other.pem")
        open(other_key, "wb").write(other)
        for name in sorted(f for f in os.listdir(d) if f.endswith(".intoto.json")):
            path = os.path.join(d, name)
            envelope = json.load(open(path))
            good = run("dsse-verify.py", path, key, keyid)
            said = json.loads(good.stdout) if good.returncode == 0 else {}
            subjects = [s["name"] for s in said.get("subjects", [])]
            print(f"{name}: verifies={good.returncode == 0} {said.get('predicateType')} subjects={subjects}")
            ok &= good.returncode == 0
            what, edit = edit_of(json.loads(base64.b64decode(envelope["payload"])))
            bad = os.path.join(tmp, "tampered.json")
            json.dump(tampered(envelope, edit), open(bad, "w"))
            forged = run("dsse-verify.py", bad, key, keyid)
            print(f"{name}: {what} changed -> exit {forged.returncode} {forged.stderr.strip()}")
            ok &= forged.returncode == 1
            wrong = run("dsse-verify.py", path, other_key, keyid)
            print(f"{name}: another key -> exit {wrong.returncode} {wrong.stderr.strip()}")
            ok &= wrong.returncode == 1
    junit = run("junit-read.py", os.path.join(d, "junit.xml"))
    ok &= junit.returncode == 0
    for s in json.loads(junit.stdout or "[]"):
        bad = [f"{c['classname']} {c['name']}: {r['kind']} {r['type']}" for c in s["cases"] for r in c["results"]]
        print(f"junit.xml: suite {s['name']}: {s['tests']} tests, {s['failures']} failures, "
              f"{s['errors']} errors, {s['skipped']} skipped; {bad}")
    print("ALL EVIDENCE CHECKS HOLD" if ok else "SOME EVIDENCE CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
