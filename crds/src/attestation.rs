//! A certificate as an in-toto attestation, the form supply-chain tools verify: an in-toto v1
//! Statement in a DSSE envelope signed with the certificate's own ed25519 key, so that a
//! standard DSSE verifier checks it offline (the tests use securesystemslib's); `kubectl gpuval
//! verify` and `gpuval-agent verify` check it too. Pure: keys come in as bytes.
//!
//! - **Subjects**: a node attestation's are the node's GPUs (name `gpu/<UUID>`, digest the
//!   SHA-256 of `gpuval.io/gpu-identity/v1\n<UUID>\n<board serial>`, the serial empty where
//!   unreadable; the UUID and serial also as annotations) and its raw report (name
//!   `report/<validation>/<node>`, digest the report's SHA-256 as the certificate holds it). A
//!   validation attestation's are its nodes' certificates (`certificate/<node>`, their digests).
//! - **Predicate**: the certificate document itself, under predicate type
//!   [`NODE_PREDICATE`] or [`VALIDATION_PREDICATE`] (schemas in `docs/attestation/`).
//! - **Envelope**: `payloadType` [`PAYLOAD_TYPE`], the Statement's canonical JSON as payload,
//!   one signature over DSSE's pre-authentication encoding, `keyid` the key's id as published
//!   (`gpuval-certificate-public-key`'s `keyId`).

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::certificate::{NodeCertificate, ValidationCertificate};
use crate::seal::{canonical, key_id, sha256_hex};

/// The in-toto Statement type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// DSSE's payload type for in-toto.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The predicate of a node's attestation: its [`NodeCertificate`].
pub const NODE_PREDICATE: &str = "https://gpuval.io/attestation/node/v1";
/// The predicate of a validation's attestation: its [`ValidationCertificate`].
pub const VALIDATION_PREDICATE: &str = "https://gpuval.io/attestation/validation/v1";
/// Where a certificate ConfigMap holds the attestation (the DSSE envelope, JSON).
pub const DATA_KEY: &str = "attestation.intoto.json";
/// What a GPU subject's digest covers before the UUID and serial.
const GPU_IDENTITY: &str = "gpuval.io/gpu-identity/v1";

/// An in-toto v1 resource descriptor, as a Statement's subject.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Subject {
    pub name: String,
    pub digest: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An in-toto v1 Statement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Value,
}

/// A DSSE envelope.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Envelope {
    /// Base64 (standard, padded) of the Statement's bytes.
    pub payload: String,
    pub payload_type: String,
    pub signatures: Vec<EnvelopeSignature>,
}

/// One signature of an envelope.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EnvelopeSignature {
    pub keyid: String,
    /// Base64 of the ed25519 signature over the pre-authentication encoding.
    pub sig: String,
}

/// Why an attestation cannot be made or does not verify.
#[derive(thiserror::Error, Debug, PartialEq)]
pub enum AttestationError {
    #[error("not a DSSE envelope of an in-toto statement: {0}")]
    Format(String),
    #[error(
        "no signature of the attestation verifies with the key given ({given}; signed by {signed_by}): the envelope was altered, or verify with the issuer's public key"
    )]
    BadSignature { given: String, signed_by: String },
    #[error("the statement's subjects do not match its predicate: {0}")]
    Subjects(String),
    #[error("the key is not usable: {0}")]
    Key(String),
}

/// The subject naming GPU `uuid` with board serial `serial`.
pub fn gpu_subject(uuid: &str, serial: Option<&str>) -> Subject {
    let serial = serial.unwrap_or_default();
    let identity = format!("{GPU_IDENTITY}\n{uuid}\n{serial}");
    let mut annotations = BTreeMap::from([("uuid".to_string(), uuid.to_string())]);
    if !serial.is_empty() {
        annotations.insert("serial".into(), serial.to_string());
    }
    Subject {
        name: format!("gpu/{uuid}"),
        digest: sha256(sha256_hex(identity.as_bytes())),
        annotations,
    }
}

fn sha256(hex: String) -> BTreeMap<String, String> {
    BTreeMap::from([("sha256".to_string(), hex)])
}

/// The Statement of node certificate `c`: its GPUs and its report as subjects, the certificate
/// as predicate.
pub fn node_statement(c: &NodeCertificate) -> Result<Statement, AttestationError> {
    let mut subject: Vec<Subject> = c
        .hardware
        .gpus
        .iter()
        .map(|g| gpu_subject(&g.uuid, g.serial.as_deref()))
        .collect();
    subject.push(Subject {
        name: format!("report/{}/{}", c.subject.validation, c.report.node),
        digest: sha256(c.report.sha256.clone()),
        annotations: BTreeMap::new(),
    });
    Ok(Statement {
        type_: STATEMENT_TYPE.into(),
        subject,
        predicate_type: NODE_PREDICATE.into(),
        predicate: to_value(c)?,
    })
}

/// The Statement of validation certificate `c` (or one part of it): its nodes' certificates
/// as subjects, the certificate as predicate.
pub fn validation_statement(c: &ValidationCertificate) -> Result<Statement, AttestationError> {
    Ok(Statement {
        type_: STATEMENT_TYPE.into(),
        subject: c
            .nodes
            .iter()
            .map(|l| Subject {
                name: format!("certificate/{}", l.node),
                digest: sha256(l.certificate_sha256.clone()),
                annotations: BTreeMap::new(),
            })
            .collect(),
        predicate_type: VALIDATION_PREDICATE.into(),
        predicate: to_value(c)?,
    })
}

fn to_value<T: Serialize>(v: &T) -> Result<Value, AttestationError> {
    serde_json::to_value(v).map_err(|e| AttestationError::Format(format!("serialize: {e}")))
}

/// DSSE's pre-authentication encoding: `DSSEv1 <len(type)> <type> <len(body)> <body>`.
pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// Signs `statement` with the ed25519 key in `pkcs8` into a DSSE envelope.
pub fn sign(statement: &Statement, pkcs8: &[u8]) -> Result<Envelope, AttestationError> {
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8)
        .map_err(|e| AttestationError::Key(format!("not an ed25519 PKCS#8 private key ({e})")))?;
    let body = canonical(&to_value(statement)?);
    let sig = pair.sign(&pae(PAYLOAD_TYPE, &body));
    Ok(Envelope {
        payload: STANDARD.encode(&body),
        payload_type: PAYLOAD_TYPE.into(),
        signatures: vec![EnvelopeSignature {
            keyid: key_id(pair.public_key().as_ref()),
            sig: STANDARD.encode(sig.as_ref()),
        }],
    })
}

/// Verifies `envelope` with the raw 32-byte ed25519 `public_key`: a signature over the
/// pre-authentication encoding, then the Statement's type and its subjects against its
/// predicate (each GPU and the report of a node's, each node certificate of a validation's).
/// Gives the Statement back when it holds.
pub fn verify(envelope: &Envelope, public_key: &[u8]) -> Result<Statement, AttestationError> {
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(AttestationError::Format(format!(
            "payloadType {:?}, not {PAYLOAD_TYPE}",
            envelope.payload_type
        )));
    }
    let body = STANDARD
        .decode(&envelope.payload)
        .map_err(|e| AttestationError::Format(format!("payload is not base64: {e}")))?;
    let message = pae(&envelope.payload_type, &body);
    let key = UnparsedPublicKey::new(&ED25519, public_key);
    let holds = envelope.signatures.iter().any(|s| {
        STANDARD
            .decode(&s.sig)
            .is_ok_and(|sig| key.verify(&message, &sig).is_ok())
    });
    if !holds {
        let signed_by: Vec<&str> = envelope
            .signatures
            .iter()
            .map(|s| s.keyid.as_str())
            .collect();
        return Err(AttestationError::BadSignature {
            given: key_id(public_key),
            signed_by: signed_by.join(", "),
        });
    }
    let statement: Statement = serde_json::from_slice(&body)
        .map_err(|e| AttestationError::Format(format!("the payload is no Statement: {e}")))?;
    if statement.type_ != STATEMENT_TYPE {
        return Err(AttestationError::Format(format!(
            "_type {:?}, not {STATEMENT_TYPE}",
            statement.type_
        )));
    }
    let expected = match statement.predicate_type.as_str() {
        NODE_PREDICATE => node_statement(&from_value(&statement.predicate)?)?,
        VALIDATION_PREDICATE => validation_statement(&from_value(&statement.predicate)?)?,
        other => {
            return Err(AttestationError::Format(format!(
                "predicateType {other:?} is not gpuval's"
            )));
        }
    };
    if expected.subject != statement.subject {
        let names = |s: &[Subject]| s.iter().map(|x| x.name.clone()).collect::<Vec<_>>();
        return Err(AttestationError::Subjects(format!(
            "the statement names {:?}, its predicate {:?}",
            names(&statement.subject),
            names(&expected.subject)
        )));
    }
    Ok(statement)
}

fn from_value<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, AttestationError> {
    serde_json::from_value(v.clone())
        .map_err(|e| AttestationError::Format(format!("the predicate does not read: {e}")))
}

/// Reads an envelope (JSON, as exported) and verifies it with the public key in `key_pem`.
pub fn verify_text(envelope_json: &str, key_pem: &str) -> Result<Statement, AttestationError> {
    let envelope: Envelope =
        serde_json::from_str(envelope_json).map_err(|e| AttestationError::Format(e.to_string()))?;
    let key = crate::seal::public_key_from_pem(key_pem)
        .map_err(|e| AttestationError::Key(e.to_string()))?;
    verify(&envelope, &key)
}

/// Where the predicates' JSON schemas are committed, relative to the repository root (written
/// by `make crds`, held to the code by a test).
pub const SCHEMA_FILES: [&str; 2] = [
    "docs/attestation/node-v1.schema.json",
    "docs/attestation/validation-v1.schema.json",
];

/// The JSON schemas of the two predicates, in [`SCHEMA_FILES`] order, as committed (pretty,
/// with a trailing newline).
pub fn predicate_schemas() -> Result<[String; 2], serde_json::Error> {
    let with_id = |mut s: schemars::Schema, id: &str| {
        s.insert("$id".into(), Value::String(id.into()));
        serde_json::to_string_pretty(&s).map(|t| t + "\n")
    };
    Ok([
        with_id(schemars::schema_for!(NodeCertificate), NODE_PREDICATE)?,
        with_id(
            schemars::schema_for!(ValidationCertificate),
            VALIDATION_PREDICATE,
        )?,
    ])
}

/// One line that says what a verified attestation attests.
pub fn describe(statement: &Statement, keyid: &str) -> String {
    format!(
        "valid in-toto attestation ({}, {} subject(s)): {}; signed by key {keyid}",
        statement.predicate_type,
        statement.subject.len(),
        crate::seal::describe_document(&statement.predicate)
    )
}

/// Why an exported certificate or attestation does not verify.
#[derive(thiserror::Error, Debug, PartialEq)]
pub enum ExportedError {
    #[error(transparent)]
    Certificate(#[from] crate::seal::VerifyError),
    #[error(transparent)]
    Attestation(#[from] AttestationError),
}

/// Verifies an exported certificate or its attestation, whichever `json` is, with the public
/// key in `key_pem`: the line that says what it certifies.
pub fn verify_exported(json: &str, key_pem: &str) -> Result<String, ExportedError> {
    if is_envelope(json) {
        let statement = verify_text(json, key_pem)?;
        let key = crate::seal::public_key_from_pem(key_pem)?;
        Ok(describe(&statement, &key_id(&key)))
    } else {
        Ok(crate::seal::describe(&crate::seal::verify_text(
            json, key_pem,
        )?))
    }
}

/// True when `json` looks like a DSSE envelope (it has a `payloadType`), not a certificate.
pub fn is_envelope(json: &str) -> bool {
    serde_json::from_str::<Value>(json)
        .ok()
        .is_some_and(|v| v.get("payloadType").is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificate::{GpuIdentity, Hardware, ReportDigest, Subject as Who};

    fn key() -> Vec<u8> {
        let rng = ring::rand::SystemRandom::new();
        Ed25519KeyPair::generate_pkcs8(&rng)
            .expect("a key")
            .as_ref()
            .to_vec()
    }

    fn cert() -> NodeCertificate {
        NodeCertificate {
            format: crate::certificate::NODE_FORMAT.into(),
            subject: Who {
                validation: "quick".into(),
                node: Some("gpu-a".into()),
                ..Default::default()
            },
            hardware: Hardware {
                gpus: vec![
                    GpuIdentity {
                        uuid: "GPU-1".into(),
                        serial: Some("1650924060001".into()),
                        ..Default::default()
                    },
                    GpuIdentity {
                        index: 1,
                        uuid: "GPU-2".into(),
                        serial: Some("1650924060002".into()),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
            report: ReportDigest {
                node: "gpu-a".into(),
                sha256: "ab".repeat(32),
            },
            ..Default::default()
        }
    }

    /// The envelope with its Statement replaced by `edit`'s, the signature kept.
    fn forged(e: &Envelope, edit: impl Fn(&mut Value)) -> Envelope {
        let mut v: Value =
            serde_json::from_slice(&STANDARD.decode(&e.payload).expect("base64")).expect("json");
        edit(&mut v);
        Envelope {
            payload: STANDARD.encode(canonical(&v)),
            ..e.clone()
        }
    }

    #[test]
    fn a_signed_node_attestation_verifies_and_names_its_gpus_and_report() {
        let k = key();
        let public = crate::seal::public_key_of(&k).expect("public");
        let e = sign(&node_statement(&cert()).expect("statement"), &k).expect("signed");
        let s = verify(&e, &public).expect("verifies");
        let names: Vec<&str> = s.subject.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["gpu/GPU-1", "gpu/GPU-2", "report/quick/gpu-a"]);
        assert_eq!(s.subject[2].digest["sha256"], "ab".repeat(32));
        assert_eq!(s.subject[0].annotations["serial"], "1650924060001");
        assert_eq!(e.signatures[0].keyid, key_id(&public));
        // DSSE's encoding, byte for byte.
        assert_eq!(pae("t", b"ab"), b"DSSEv1 1 t 2 ab");
    }

    #[test]
    fn a_changed_serial_figure_or_key_never_verifies() {
        let k = key();
        let public = crate::seal::public_key_of(&k).expect("public");
        let e = sign(&node_statement(&cert()).expect("statement"), &k).expect("signed");
        let serial = forged(&e, |v| {
            v["predicate"]["hardware"]["gpus"][0]["serial"] = "999".into();
        });
        let figure = forged(&e, |v| v["predicate"]["results"]["verdict"] = "Fail".into());
        for bad in [serial, figure] {
            assert!(matches!(
                verify(&bad, &public),
                Err(AttestationError::BadSignature { .. })
            ));
        }
        let other = crate::seal::public_key_of(&key()).expect("public");
        let e2 = verify(&e, &other).expect_err("another key");
        assert!(
            e2.to_string()
                .contains("verify with the issuer's public key"),
            "{e2}"
        );
    }

    #[test]
    fn subjects_that_disagree_with_the_predicate_are_refused_even_when_signed() {
        let k = key();
        let public = crate::seal::public_key_of(&k).expect("public");
        let mut s = node_statement(&cert()).expect("statement");
        s.subject.swap(0, 1);
        let e = sign(&s, &k).expect("signed");
        assert!(matches!(
            verify(&e, &public),
            Err(AttestationError::Subjects(_))
        ));
        assert!(is_envelope(&serde_json::to_string(&e).expect("json")));
        assert!(!is_envelope("{\"document\": {}}"));
    }
}
