//! The certificate of a run outside Kubernetes (`gpuval-agent run --certificate-key`): the same
//! signed artifact the operator writes per node, built from the report and the settings the run
//! used, signed with the operator's key format (ed25519 PKCS#8 PEM).

use std::path::{Path, PathBuf};

use gpuval_crds::NodeReport;
use gpuval_crds::certificate::{self, NodeInputs, Settings, Subject};
use gpuval_crds::seal::{self, Signed};

use crate::config::RunSettings;

/// The subject's validation name of a run outside Kubernetes.
pub const BARE_METAL: &str = "bare-metal";

/// The signed certificate of `report`, run with `settings` read from `source` (a settings
/// file, or the defaults and flags), signed with the PKCS#8 PEM `key_pem`.
pub fn sign(
    report: &NodeReport,
    settings: &RunSettings,
    source: &str,
    key_pem: &str,
) -> Result<Signed, String> {
    let RunSettings {
        checks,
        thresholds,
        expect,
        severity_overrides,
    } = settings;
    let spec = serde_json::json!({
        "checks": checks,
        "thresholds": thresholds,
        "expect": expect,
        "severityOverrides": severity_overrides,
    });
    let report_sha256 = seal::digest_of(report).map_err(|e| format!("the report: {e}"))?;
    let c = certificate::node_certificate(
        report,
        NodeInputs {
            subject: Subject {
                validation: BARE_METAL.into(),
                uid: None,
                generation: 0,
                node: report.node.clone(),
                finished_at: report.finished_at.clone(),
            },
            settings: Settings {
                source: source.to_string(),
                spec,
                floors: Vec::new(),
            },
            image: None,
            image_id: None,
            fabric: None,
            report_sha256,
        },
    );
    let pkcs8 = seal::private_key_from_pem(key_pem).map_err(|e| e.to_string())?;
    seal::sign(&c, &pkcs8).map_err(|e| e.to_string())
}

/// Where the certificate of the report at `report` goes: beside it, `NAME.cert.json`.
pub fn path_beside(report: &Path) -> PathBuf {
    let stem = report
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report".into());
    report.with_file_name(format!("{stem}.cert.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_metal_certificate_verifies_with_the_key_s_public_half() {
        let mut der = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        der.extend([4u8; 32]);
        let pem = gpuval_crds::pem::encode("PRIVATE KEY", &der);
        let report = NodeReport {
            node: Some("host1".into()),
            finished_at: "2026-01-01T00:00:00Z".into(),
            ..Default::default()
        };
        let signed = sign(&report, &RunSettings::default(), "settings.yaml", &pem).expect("sign");
        let public = seal::public_key_of(&der).expect("public");
        assert_eq!(seal::verify(&signed, &public), Ok(()));
        assert_eq!(signed.document["subject"]["validation"], BARE_METAL);
        assert_eq!(signed.document["subject"]["node"], "host1");
        assert_eq!(signed.document["settings"]["source"], "settings.yaml");
        assert!(signed.document["settings"]["spec"]["checks"]["memory"].is_object());
        assert!(sign(&report, &RunSettings::default(), "x", "not a key").is_err());
        assert_eq!(
            path_beside(Path::new("/tmp/out/report.json")),
            PathBuf::from("/tmp/out/report.cert.json")
        );
    }
}
