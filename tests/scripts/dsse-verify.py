#!/usr/bin/env python3
"""Verifies a DSSE envelope holding an in-toto Statement with securesystemslib, the Secure
Systems Lab's maintained DSSE implementation (what in-toto's own tools build on), not with
gpuval's code: ed25519 over DSSE's pre-authentication encoding, with the issuer's public key.

    dsse-verify.py ENVELOPE.json PUBLIC.pem [KEYID]

KEYID is the id the issuer publishes beside its key (the ConfigMap
gpuval-certificate-public-key's keyId); securesystemslib matches a signature to a key by it
(default: the envelope's first signature's, which selects the signature to check: the key
given is what binds). Needs `pip install 'securesystemslib[crypto]'`.
Prints the Statement's type, predicate type and subjects as JSON and exits 0 when it verifies;
exits 1 naming why when it does not; 2 when the files cannot be read.
"""
import json
import sys

from cryptography.hazmat.primitives.serialization import load_pem_public_key
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1], encoding="utf-8") as f:
            envelope = Envelope.from_dict(json.load(f))
        keyid = sys.argv[3] if len(sys.argv) == 4 else next(iter(envelope.signatures), "")
        with open(sys.argv[2], "rb") as f:
            key = SSlibKey.from_crypto(load_pem_public_key(f.read()), keyid=keyid)
    except (OSError, ValueError, KeyError) as e:
        print(f"cannot read the envelope or the key: {e}", file=sys.stderr)
        return 2
    try:
        envelope.verify([key], 1)
    except VerificationError as e:
        print(f"does not verify: {e}", file=sys.stderr)
        return 1
    if envelope.payload_type != "application/vnd.in-toto+json":
        print(f"does not verify: payloadType {envelope.payload_type}", file=sys.stderr)
        return 1
    statement = json.loads(envelope.payload)
    print(json.dumps({
        "type": statement.get("_type"),
        "predicateType": statement.get("predicateType"),
        "subjects": [
            {"name": s.get("name"), "digest": s.get("digest"), "annotations": s.get("annotations", {})}
            for s in statement.get("subject", [])
        ],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
