//! Signing and verifying a certificate ([`crate::certificate`]): canonical JSON, SHA-256
//! digests and ed25519 signatures (ring). Pure: keys come in as bytes, nothing is read or
//! written here.
//!
//! A [`Signed`] document carries the document, a [`Seal`] and the signature over the seal's
//! canonical JSON. The seal holds the SHA-256 of the whole document and a short digest of each
//! of its fields (leaf values by path, `results.gpus[0].memory.gbps`), so that verification,
//! once the signature holds, names each field that was changed, added or removed. The whole
//! document's digest is what makes the seal binding; the field digests only say where.

use std::collections::BTreeMap;

use ring::digest::{SHA256, digest};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::pem;

/// The one algorithm.
pub const ALGORITHM: &str = "ed25519";
/// Hex digits kept of each field's digest (diagnostic: the whole-document digest binds).
const FIELD_DIGEST_HEX: usize = 16;

/// A signed document (a certificate) as it is stored and exported.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Signed {
    pub document: Value,
    pub seal: Seal,
    /// Hex of the ed25519 signature over the seal's canonical JSON.
    pub signature: String,
}

/// What the signature covers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Seal {
    /// [`ALGORITHM`].
    pub algorithm: String,
    /// [`key_id`] of the signing key.
    pub key_id: String,
    /// SHA-256 (hex) of the document's canonical JSON.
    pub sha256: String,
    /// A short digest of each field of the document, by path.
    pub fields: BTreeMap<String, String>,
}

/// Why a certificate does not verify.
#[derive(thiserror::Error, Debug, PartialEq)]
pub enum VerifyError {
    #[error(
        "the certificate was signed by key {signed_by}, not by the key given ({given}): verify with the public key of the installation that issued it"
    )]
    WrongKey { signed_by: String, given: String },
    #[error(
        "the signature does not match the seal (key {key_id}): the seal or the signature was altered"
    )]
    BadSignature { key_id: String },
    #[error("the certificate was altered after signing: {}", fields.join(", "))]
    Tampered { fields: Vec<String> },
    #[error("the seal's algorithm is {0:?}, not ed25519")]
    Algorithm(String),
    #[error("the key is not usable: {0}")]
    Key(String),
    #[error("not a signed gpuval certificate: {0}")]
    Format(String),
}

/// Reads a signed certificate (JSON, as exported) and verifies it with the public key in
/// `key_pem`; gives the certificate back when it holds.
pub fn verify_text(certificate_json: &str, key_pem: &str) -> Result<Signed, VerifyError> {
    let signed: Signed = serde_json::from_str(certificate_json)
        .map_err(|e| VerifyError::Format(format!("{e} (expected document, seal and signature)")))?;
    let key = public_key_from_pem(key_pem)?;
    verify(&signed, &key)?;
    Ok(signed)
}

/// One line that says what a verified certificate certifies.
pub fn describe(signed: &Signed) -> String {
    format!(
        "valid: {}; signed by key {}",
        describe_document(&signed.document),
        signed.seal.key_id
    )
}

/// What certificate document `d` certifies: `node gpu-a: Pass with 8 GPU(s); validation quick
/// generation 1, finished ...`.
pub fn describe_document(d: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("?").to_string();
    let s = &d["subject"];
    let what = match s["node"].as_str() {
        Some(node) => format!(
            "node {node}: {} with {} GPU(s)",
            text(&d["verdict"]),
            d["hardware"]["gpus"].as_array().map_or(0, Vec::len)
        ),
        None => format!(
            "validation: {} with {} node(s){}",
            text(&d["phase"]),
            d["nodes"].as_array().map_or(0, Vec::len),
            match (d["part"]["index"].as_u64(), d["part"]["of"].as_u64()) {
                (Some(i), Some(of)) => format!(" (part {i} of {of})"),
                _ => String::new(),
            }
        ),
    };
    format!(
        "{what}; validation {} generation {}, finished {}",
        text(&s["validation"]),
        s["generation"],
        text(&s["finishedAt"]),
    )
}

/// The bytes of `value` as canonical JSON: object keys sorted, no whitespace, numbers and
/// strings as serde_json writes them (shortest round-trip form, the same on every machine).
pub fn canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(Value::String((*k).clone()).to_string().as_bytes());
                out.push(b':');
                if let Some(v) = map.get(*k) {
                    write_canonical(v, out);
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        leaf => out.extend_from_slice(leaf.to_string().as_bytes()),
    }
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(digest(&SHA256, bytes).as_ref())
}

/// SHA-256 of a serializable value's canonical JSON.
pub fn digest_of<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    Ok(sha256_hex(&canonical(&serde_json::to_value(value)?)))
}

/// The id of a public key: the first 16 hex digits of its SHA-256.
pub fn key_id(public_key: &[u8]) -> String {
    sha256_hex(public_key)[..16].to_string()
}

/// Each leaf of `value` by path, with a short digest of its canonical JSON (an empty object or
/// array is a leaf of its own).
pub fn field_digests(value: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(value, String::new(), &mut out);
    out
}

fn walk(value: &Value, path: String, out: &mut BTreeMap<String, String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(v, p, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                walk(v, format!("{path}[{i}]"), out);
            }
        }
        leaf => {
            let d = sha256_hex(&canonical(leaf));
            out.insert(path, d[..FIELD_DIGEST_HEX].to_string());
        }
    }
}

/// Signs `document` with the ed25519 key in `pkcs8` (DER, v1 or v2).
pub fn sign<T: Serialize>(document: &T, pkcs8: &[u8]) -> Result<Signed, VerifyError> {
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8)
        .map_err(|e| VerifyError::Key(format!("not an ed25519 PKCS#8 private key ({e})")))?;
    let document = serde_json::to_value(document)
        .map_err(|e| VerifyError::Key(format!("the document does not serialize: {e}")))?;
    let seal = Seal {
        algorithm: ALGORITHM.into(),
        key_id: key_id(pair.public_key().as_ref()),
        sha256: sha256_hex(&canonical(&document)),
        fields: field_digests(&document),
    };
    let signature = hex(pair.sign(&seal_bytes(&seal)).as_ref());
    Ok(Signed {
        document,
        seal,
        signature,
    })
}

/// Verifies `signed` with the raw 32-byte ed25519 `public_key`: the signature over the seal,
/// then the document against the seal, naming each field that differs.
pub fn verify(signed: &Signed, public_key: &[u8]) -> Result<(), VerifyError> {
    if signed.seal.algorithm != ALGORITHM {
        return Err(VerifyError::Algorithm(signed.seal.algorithm.clone()));
    }
    let given = key_id(public_key);
    let signature_holds = unhex(&signed.signature).is_some_and(|sig| {
        UnparsedPublicKey::new(&ED25519, public_key)
            .verify(&seal_bytes(&signed.seal), &sig)
            .is_ok()
    });
    if !signature_holds {
        if signed.seal.key_id != given {
            return Err(VerifyError::WrongKey {
                signed_by: signed.seal.key_id.clone(),
                given,
            });
        }
        return Err(VerifyError::BadSignature { key_id: given });
    }
    let now = field_digests(&signed.document);
    let mut fields: Vec<String> = Vec::new();
    for (path, d) in &signed.seal.fields {
        match now.get(path) {
            Some(n) if n == d => {}
            Some(_) => fields.push(format!("{path} (changed)")),
            None => fields.push(format!("{path} (removed)")),
        }
    }
    fields.extend(
        now.keys()
            .filter(|p| !signed.seal.fields.contains_key(*p))
            .map(|p| format!("{p} (added)")),
    );
    if fields.is_empty() && sha256_hex(&canonical(&signed.document)) != signed.seal.sha256 {
        fields.push("document (its digest differs)".into());
    }
    if fields.is_empty() {
        Ok(())
    } else {
        Err(VerifyError::Tampered { fields })
    }
}

/// The public key of a PKCS#8 private key.
pub fn public_key_of(pkcs8: &[u8]) -> Result<Vec<u8>, VerifyError> {
    Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8)
        .map(|p| p.public_key().as_ref().to_vec())
        .map_err(|e| VerifyError::Key(format!("not an ed25519 PKCS#8 private key ({e})")))
}

/// A public key from PEM (`PUBLIC KEY`, SubjectPublicKeyInfo) or a private key's PEM
/// (`PRIVATE KEY`, PKCS#8: its public half).
pub fn public_key_from_pem(text: &str) -> Result<Vec<u8>, VerifyError> {
    let block = pem::decode(text).map_err(VerifyError::Key)?;
    match block.label.as_str() {
        "PUBLIC KEY" => pem::ed25519_spki_key(&block.der).map_err(VerifyError::Key),
        "PRIVATE KEY" => public_key_of(&block.der),
        other => Err(VerifyError::Key(format!(
            "a PEM {other:?} block is not an ed25519 key: give a PUBLIC KEY (or PRIVATE KEY) PEM"
        ))),
    }
}

/// The PKCS#8 DER of a `PRIVATE KEY` PEM.
pub fn private_key_from_pem(text: &str) -> Result<Vec<u8>, VerifyError> {
    let block = pem::decode(text).map_err(VerifyError::Key)?;
    if block.label != "PRIVATE KEY" {
        return Err(VerifyError::Key(format!(
            "a PEM {:?} block is not a private key: give a PKCS#8 PRIVATE KEY PEM (openssl genpkey -algorithm ed25519)",
            block.label
        )));
    }
    public_key_of(&block.der)?;
    Ok(block.der)
}

fn seal_bytes(seal: &Seal) -> Vec<u8> {
    // A Seal always serializes (strings and a map of strings).
    canonical(&serde_json::to_value(seal).unwrap_or(Value::Null))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of hex text `s` (None: odd length or not hex).
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // An ed25519 PKCS#8 v1 key (as `openssl genpkey -algorithm ed25519` writes it) built from a
    // fixed seed, so that the tests need no randomness.
    fn key(seed: u8) -> Vec<u8> {
        let mut der = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        der.extend([seed; 32]);
        der
    }

    fn doc() -> Value {
        json!({
            "format": "test",
            "hardware": {"gpus": [{"uuid": "GPU-a", "serial": "S1"}, {"uuid": "GPU-b", "serial": "S2"}]},
            "settings": {"spec": {"memory": {"fraction": 0.9}}},
            "results": {"gpus": [{"memory": {"gbps": 3012.5}}], "empty": []},
        })
    }

    #[test]
    fn canonical_json_sorts_keys_and_has_no_whitespace() {
        let a = json!({"b": 1, "a": {"d": [1.5, "x"], "c": null}});
        assert_eq!(
            String::from_utf8(canonical(&a)).expect("utf8"),
            r#"{"a":{"c":null,"d":[1.5,"x"]},"b":1}"#
        );
        // The same document parsed from differently ordered text gives the same bytes.
        let b: Value = serde_json::from_str(r#"{ "b" : 1, "a": {"c": null, "d": [1.5, "x"]} }"#)
            .expect("json");
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(
            String::from_utf8(canonical(&json!({"s": "é\"\n", "f": 0.1}))).expect("utf8"),
            r#"{"f":0.1,"s":"é\"\n"}"#
        );
    }

    #[test]
    fn a_signed_document_verifies_with_its_key() {
        let k = key(7);
        let signed = sign(&doc(), &k).expect("sign");
        let public = public_key_of(&k).expect("public");
        assert_eq!(verify(&signed, &public), Ok(()));
        // Through a file: serialized and read back.
        let text = serde_json::to_string_pretty(&signed).expect("serialize");
        let back: Signed = serde_json::from_str(&text).expect("parse");
        assert_eq!(verify(&back, &public), Ok(()));
    }

    fn tampered(f: impl FnOnce(&mut Value)) -> Result<(), VerifyError> {
        let k = key(7);
        let mut signed = sign(&doc(), &k).expect("sign");
        f(&mut signed.document);
        verify(&signed, &public_key_of(&k).expect("public"))
    }

    #[test]
    fn figures_read_back_from_text_verify_to_the_last_bit() {
        // Measured rates have full-precision fractions; each must parse back to the bits that
        // were signed (serde_json's float_roundtrip).
        let figures: Vec<f64> = (1..2000)
            .map(|i| f64::from(i) * 1_234.567_891 / 7.0)
            .collect();
        let k = key(5);
        let signed = sign(&json!({ "figures": figures }), &k).expect("sign");
        let back: Signed =
            serde_json::from_str(&serde_json::to_string(&signed).expect("json")).expect("parse");
        assert_eq!(verify(&back, &public_key_of(&k).expect("public")), Ok(()));
    }

    #[test]
    fn a_changed_figure_is_named() {
        let r = tampered(|d| d["results"]["gpus"][0]["memory"]["gbps"] = json!(3100.0));
        assert_eq!(
            r,
            Err(VerifyError::Tampered {
                fields: vec!["results.gpus[0].memory.gbps (changed)".into()]
            })
        );
    }

    #[test]
    fn swapped_serials_are_both_named() {
        let r = tampered(|d| {
            d["hardware"]["gpus"][0]["serial"] = json!("S2");
            d["hardware"]["gpus"][1]["serial"] = json!("S1");
        });
        assert_eq!(
            r,
            Err(VerifyError::Tampered {
                fields: vec![
                    "hardware.gpus[0].serial (changed)".into(),
                    "hardware.gpus[1].serial (changed)".into()
                ]
            })
        );
    }

    #[test]
    fn changed_settings_are_named_whether_changed_added_or_removed() {
        let r = tampered(|d| {
            d["settings"]["spec"]["memory"]["fraction"] = json!(0.5);
            d["settings"]["spec"]["compute"] = json!({"seconds": 1});
        });
        assert_eq!(
            r,
            Err(VerifyError::Tampered {
                fields: vec![
                    "settings.spec.memory.fraction (changed)".into(),
                    "settings.spec.compute.seconds (added)".into()
                ]
            })
        );
        let r = tampered(|d| {
            if let Some(m) = d["results"].as_object_mut() {
                m.remove("empty");
            }
        });
        assert_eq!(
            r,
            Err(VerifyError::Tampered {
                fields: vec!["results.empty (removed)".into()]
            })
        );
    }

    #[test]
    fn an_altered_signature_or_seal_fails_as_a_bad_signature() {
        let k = key(7);
        let public = public_key_of(&k).expect("public");
        let mut signed = sign(&doc(), &k).expect("sign");
        let mut sig = signed.signature.clone().into_bytes();
        sig[0] = if sig[0] == b'0' { b'1' } else { b'0' };
        signed.signature = String::from_utf8(sig).expect("ascii");
        assert_eq!(
            verify(&signed, &public),
            Err(VerifyError::BadSignature {
                key_id: key_id(&public)
            })
        );
        // A seal rewritten to match a tampered document fails the same way.
        let mut signed = sign(&doc(), &k).expect("sign");
        signed.document["hardware"]["gpus"][0]["serial"] = json!("FORGED");
        signed.seal.fields = field_digests(&signed.document);
        signed.seal.sha256 = sha256_hex(&canonical(&signed.document));
        assert!(matches!(
            verify(&signed, &public),
            Err(VerifyError::BadSignature { .. })
        ));
    }

    #[test]
    fn the_wrong_key_is_named_with_both_ids() {
        let signed = sign(&doc(), &key(7)).expect("sign");
        let other = public_key_of(&key(9)).expect("public");
        assert_eq!(
            verify(&signed, &other),
            Err(VerifyError::WrongKey {
                signed_by: key_id(&public_key_of(&key(7)).expect("public")),
                given: key_id(&other),
            })
        );
        // Re-signed with another key: still not the buyer's key.
        let resigned = sign(&signed.document, &key(9)).expect("sign");
        let buyer = public_key_of(&key(7)).expect("public");
        assert!(matches!(
            verify(&resigned, &buyer),
            Err(VerifyError::WrongKey { .. })
        ));
    }

    #[test]
    fn a_certificate_file_verifies_and_junk_is_named() {
        let k = key(7);
        let signed = sign(
            &json!({"subject": {"validation": "v", "generation": 1, "node": "n1", "finishedAt": "t"}, "verdict": "Pass", "hardware": {"gpus": [{}]}}),
            &k,
        )
        .expect("sign");
        let text = serde_json::to_string(&signed).expect("json");
        let public_pem = pem::encode(
            "PUBLIC KEY",
            &pem::ed25519_spki(&public_key_of(&k).expect("public")),
        );
        let back = verify_text(&text, &public_pem).expect("verifies");
        let line = describe(&back);
        assert!(
            line.starts_with("valid: node n1: Pass with 1 GPU(s); validation v generation 1"),
            "{line}"
        );
        assert!(matches!(
            verify_text("{}", &public_pem),
            Err(VerifyError::Format(_))
        ));
    }

    #[test]
    fn keys_read_from_pem_round_trip() {
        let k = key(3);
        let public = public_key_of(&k).expect("public");
        let private_pem = pem::encode("PRIVATE KEY", &k);
        let public_pem = pem::encode("PUBLIC KEY", &pem::ed25519_spki(&public));
        assert_eq!(private_key_from_pem(&private_pem), Ok(k));
        assert_eq!(public_key_from_pem(&public_pem), Ok(public.clone()));
        assert_eq!(public_key_from_pem(&private_pem), Ok(public));
        assert!(matches!(
            private_key_from_pem(&public_pem),
            Err(VerifyError::Key(m)) if m.contains("not a private key")
        ));
        assert!(matches!(
            public_key_from_pem("junk"),
            Err(VerifyError::Key(_))
        ));
    }
}
