//! The pure half of `kubectl gpuval certificate`, `verify` and `history`: which certificate
//! ConfigMap a name means, and a GPU's figures over time from its certificates.

use std::collections::BTreeSet;

use gpuval_crds::certificate::{CertificateMeta, CertificateOwner, NodeCertificate, gpu_figures};
use gpuval_crds::seal::Signed;
use k8s_openapi::api::core::v1::ConfigMap;

pub use gpuval_crds::certificate::{DATA_KEY, GPU_LABEL_PREFIX, KIND_LABEL};

/// The certificate text of `cm`, or (`attestation`) its in-toto attestation's (the DSSE
/// envelope beside it).
pub fn text(cm: &ConfigMap, attestation: bool) -> Result<&str, String> {
    let name = cm.metadata.name.as_deref().unwrap_or("?");
    let key = if attestation {
        gpuval_crds::attestation::DATA_KEY
    } else {
        DATA_KEY
    };
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(String::as_str)
        .ok_or_else(|| match attestation {
            true => format!(
                "ConfigMap {name} has no {key}: it was written before gpuval wrote attestations (export the certificate without --attestation)"
            ),
            false => format!("ConfigMap {name} has no {key}: it is not a gpuval certificate"),
        })
}

/// The other parts of a split validation certificate `cm` (its part 1), by ConfigMap name, with
/// a line that says so; None when it is not split.
pub fn other_parts(cm: &ConfigMap) -> Option<String> {
    let l = cm.metadata.labels.clone().unwrap_or_default();
    let of = gpuval_crds::certificate::parts_of(&l);
    let first = cm.metadata.name.as_deref()?;
    (of > 1).then(|| {
        let names: Vec<String> = (2..=of)
            .map(|k| gpuval_crds::certificate::part_name(first, k))
            .collect();
        format!(
            "this is part 1 of {of} of the validation's certificate (too many nodes for one ConfigMap); the others: {}",
            names.join(", ")
        )
    })
}

/// Of the certificate ConfigMaps `of_validation` (those labelled with one validation), the one
/// of `node`, or without a node the validation's own; the newest where several.
pub fn pick<'a>(
    of_validation: &'a [ConfigMap],
    validation: &str,
    node: Option<&str>,
) -> Result<&'a ConfigMap, String> {
    let wanted = |cm: &&ConfigMap| {
        let l = cm.metadata.labels.clone().unwrap_or_default();
        if gpuval_crds::certificate::is_later_part(&l) {
            return false;
        }
        let owner = CertificateMeta::owner_in(&l);
        match node {
            Some(n) => owner == Some(CertificateOwner::Node(gpuval_crds::labels::node_value(n))),
            None => matches!(owner, Some(CertificateOwner::Validation(_))),
        }
    };
    of_validation
        .iter()
        .filter(wanted)
        .max_by_key(|cm| cm.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .ok_or_else(|| match node {
            Some(n) => format!(
                "no certificate of node {n:?} in validation {validation:?}: `kubectl get configmaps -l {KIND_LABEL}` lists them"
            ),
            None => format!(
                "no certificate named {validation:?} and no validation of that name has one: `kubectl get configmaps -l {KIND_LABEL}` lists them"
            ),
        })
}

/// The label selector of GPU `uuid`'s certificates (the operator's label, or its hash form).
pub fn gpu_selector(uuid: &str) -> String {
    gpuval_crds::certificate::gpu_label(uuid)
}

/// GPU `uuid`'s figures over time, oldest first, one row per certificate: when, validation,
/// node, the GPU's verdict and each figure. Certificates that do not parse are named below.
pub fn history(uuid: &str, certificates: &[ConfigMap]) -> String {
    // [finished, validation, node, verdict] and the figures, per certificate.
    type Row = ([String; 4], std::collections::BTreeMap<String, f64>);
    let mut rows: Vec<Row> = Vec::new();
    let mut skipped = Vec::new();
    for cm in certificates {
        let parsed = text(cm, false).and_then(|t| {
            let s: Signed = serde_json::from_str(t).map_err(|e| e.to_string())?;
            serde_json::from_value::<NodeCertificate>(s.document).map_err(|e| e.to_string())
        });
        let c = match parsed {
            Ok(c) => c,
            Err(e) => {
                skipped.push(format!(
                    "{}: {e}",
                    cm.metadata.name.as_deref().unwrap_or("?")
                ));
                continue;
            }
        };
        let Some(g) = c.results.gpus.iter().find(|g| g.uuid == uuid) else {
            continue;
        };
        rows.push((
            [
                c.subject.finished_at.clone(),
                c.subject.validation.clone(),
                c.subject.node.clone().unwrap_or_default(),
                g.verdict.to_string(),
            ],
            gpu_figures(g),
        ));
    }
    rows.sort_by(|a, b| a.0[0].cmp(&b.0[0]));
    let figures: BTreeSet<String> = rows.iter().flat_map(|r| r.1.keys().cloned()).collect();
    let mut out = format!("GPU {uuid}: {} certificate(s)\n", rows.len());
    let mut header = vec!["FINISHED", "VALIDATION", "NODE", "VERDICT"];
    header.extend(figures.iter().map(String::as_str));
    out.push_str(&header.join("\t"));
    out.push('\n');
    for (columns, figs) in &rows {
        let mut line = columns.to_vec();
        for f in &figures {
            line.push(figs.get(f).map_or("-".to_string(), |v| format!("{v:.1}")));
        }
        out.push_str(&line.join("\t"));
        out.push('\n');
    }
    for s in skipped {
        out.push_str(&format!("not read: {s}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::{GpuReport, MemoryResult, NodeReport};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn cert_map(name: &str, finished: &str, gbps: f64, labels: &[(&str, &str)]) -> ConfigMap {
        let c = NodeCertificate {
            subject: gpuval_crds::certificate::Subject {
                validation: "v".into(),
                node: Some("n1".into()),
                finished_at: finished.into(),
                ..Default::default()
            },
            results: NodeReport {
                gpus: vec![GpuReport {
                    uuid: "GPU-a".into(),
                    memory: Some(MemoryResult {
                        gbps,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let signed = Signed {
            document: serde_json::to_value(&c).expect("json"),
            seal: gpuval_crds::seal::Seal {
                algorithm: "ed25519".into(),
                key_id: String::new(),
                sha256: String::new(),
                fields: BTreeMap::new(),
            },
            signature: String::new(),
        };
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                DATA_KEY.to_string(),
                serde_json::to_string(&signed).expect("json"),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn history_lists_a_gpus_figures_oldest_first() {
        let maps = [
            cert_map("c2", "2026-02-01T00:00:00Z", 2700.0, &[]),
            cert_map("c1", "2026-01-01T00:00:00Z", 3000.0, &[]),
        ];
        let h = history("GPU-a", &maps);
        let lines: Vec<&str> = h.lines().collect();
        assert_eq!(lines[0], "GPU GPU-a: 2 certificate(s)");
        assert_eq!(lines[1], "FINISHED\tVALIDATION\tNODE\tVERDICT\tmemory.gbps");
        assert!(
            lines[2].starts_with("2026-01-01") && lines[2].ends_with("3000.0"),
            "{h}"
        );
        assert!(lines[3].ends_with("2700.0"), "{h}");
    }

    #[test]
    fn pick_finds_the_node_or_the_validation_certificate_and_names_what_is_missing() {
        let maps = [
            cert_map(
                "node-a",
                "t",
                1.0,
                &[(KIND_LABEL, "node"), ("gpuval.io/node", "a")],
            ),
            cert_map("summary", "t", 1.0, &[(KIND_LABEL, "validation")]),
        ];
        assert_eq!(
            pick(&maps, "v", Some("a")).map(|c| c.metadata.name.clone()),
            Ok(Some("node-a".into()))
        );
        assert_eq!(
            pick(&maps, "v", None).map(|c| c.metadata.name.clone()),
            Ok(Some("summary".into()))
        );
        assert!(pick(&maps, "v", Some("b")).is_err_and(|e| e.contains("node \"b\"")));
        assert_eq!(gpu_selector("GPU-a"), "gpu.gpuval.io/GPU-a");
        assert_eq!(other_parts(&maps[1]), None);
    }

    #[test]
    fn a_split_validation_certificate_is_picked_by_its_part_1_which_names_the_others() {
        let first = "gpuval-cert-v-0123abcd";
        let later = gpuval_crds::certificate::part_name(first, 2);
        // Part 2 is the newer ConfigMap (written first, but the clock may say otherwise).
        let maps = [
            cert_map(
                first,
                "t",
                1.0,
                &[
                    (KIND_LABEL, "validation"),
                    (gpuval_crds::certificate::PARTS_LABEL, "2"),
                ],
            ),
            cert_map(
                &later,
                "t",
                1.0,
                &[
                    (KIND_LABEL, "validation"),
                    (gpuval_crds::certificate::PART_LABEL, "2"),
                ],
            ),
        ];
        let picked = pick(&maps, "v", None).expect("part 1");
        assert_eq!(picked.metadata.name.as_deref(), Some(first));
        let note = other_parts(picked).expect("split");
        assert!(
            note.contains("part 1 of 2") && note.contains(&later),
            "{note}"
        );
    }
}
