//! Acceptance certificates, decided here without I/O: what a run's certificates say (one per node from its result, one per validation
//! summarizing them, signed), the ConfigMaps that hold them (not owned by the validation, so
//! they outlive it) and which older ones the retention setting prunes. The shell
//! ([`crate::write::certificates`]) reads the results and the key, and writes.

use std::collections::BTreeMap;

use gpuval_crds::attestation::{self, AttestationError, Envelope};
use gpuval_crds::baseline::{Baselines, GpuRun};
use gpuval_crds::certificate::{
    self, CertificateMeta, CertificateOwner, NODE_KIND, NodeCertificate, NodeFabric, NodeInputs,
    NodeLine, Part, Settings, Subject, ValidationCertificate,
};
use gpuval_crds::result_meta::ReportMeta;
use gpuval_crds::seal::{self, Signed, VerifyError};
use gpuval_crds::{GpuNodeResult, GpuValidation, GpuValidationStatus, ResultSeen, Verdict, labels};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use gpuval_crds::certificate::{DATA_KEY, GPU_LABEL_PREFIX, KIND_LABEL, gpu_label, part_name};

/// Annotation on a node certificate's ConfigMap: its GPUs' runs (JSON
/// [`gpuval_crds::baseline::GpuRun`]s), so that a GPU's history is read from metadata alone.
pub const RUNS_ANNOTATION: &str = "gpuval.io/gpu-runs";
/// The ConfigMap that publishes the public key.
pub const PUBLIC_KEY_CONFIGMAP: &str = "gpuval-certificate-public-key";
/// Its data key holding the public key (PEM).
pub const PUBLIC_KEY_DATA: &str = "public.pem";
/// The Secret data key holding the private key (PKCS#8 PEM).
pub const PRIVATE_KEY_DATA: &str = "private.pem";

/// One signed certificate and what its ConfigMap is labelled with.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The node (None: the validation's certificate).
    pub node: Option<String>,
    pub gpu_uuids: Vec<String>,
    /// Its GPUs' runs, for their baselines (empty on the validation's certificate).
    pub runs: Vec<GpuRun>,
    /// Which part of a split validation certificate (None: a node's, or not split).
    pub part: Option<Part>,
    pub signed: Signed,
    /// The same document as an in-toto attestation (a DSSE envelope, the same key).
    pub attestation: Envelope,
}

/// Why a run's certificates could not be signed.
#[derive(thiserror::Error, Debug)]
pub enum SignError {
    #[error("signing a certificate: {0}")]
    Seal(#[from] VerifyError),
    #[error("signing an attestation: {0}")]
    Attestation(#[from] AttestationError),
    #[error("serializing a certificate: {0}")]
    Json(#[from] serde_json::Error),
}

/// The most a certificate ConfigMap's data may hold: the API server refuses a ConfigMap whose
/// data passes 1 MiB; a quarter of it is left for the metadata and the pretty-printing.
pub const MAX_CERTIFICATE_BYTES: usize = 768 * 1024;

/// The agent image: as the operator was configured with it, and as each node ran it (its pod's
/// `imageID`, by node, where the pod status gave one).
#[derive(Debug, Clone, Default)]
pub struct AgentImage {
    pub configured: String,
    pub ran: BTreeMap<String, String>,
}

/// The certificates of `gv`'s run that `status` ends, from its `results` (only those of the
/// run's generation that are bound to this validation and not closed count:
/// [`gpuval_crds::binding::counts_for`]), signed with `pkcs8`: each node's, then the
/// validation's.
pub fn sign_run(
    gv: &GpuValidation,
    status: &GpuValidationStatus,
    results: &[GpuNodeResult],
    image: &AgentImage,
    pkcs8: &[u8],
) -> Result<Vec<Issued>, SignError> {
    let generation = gv.metadata.generation.unwrap_or(0);
    let uid = gv.metadata.uid.as_deref().unwrap_or_default();
    let mut run: Vec<&GpuNodeResult> = results
        .iter()
        .filter(|r| r.spec.generation == generation && r.status.is_some())
        .filter(|r| gpuval_crds::binding::counts_for(&r.metadata, uid))
        .collect();
    run.sort_by(|a, b| a.spec.node_name.cmp(&b.spec.node_name));
    let nodes: Vec<String> = run.iter().map(|r| r.spec.node_name.clone()).collect();
    let settings = settings_of(gv);
    let mut ended = gv.clone();
    ended.status = Some(status.clone());
    let mut out = Vec::new();
    let mut lines = Vec::new();
    for r in run {
        let mut c = node_certificate(gv, status, r, &nodes, &settings, image);
        c.verdict = certified(&ended, r, c.verdict);
        let uuids: Vec<String> = c.hardware.gpus.iter().map(|g| g.uuid.clone()).collect();
        lines.push(NodeLine {
            node: r.spec.node_name.clone(),
            verdict: c.verdict,
            gpu_uuids: uuids.clone(),
            certificate_sha256: seal::digest_of(&c)?,
            report_sha256: c.report.sha256.clone(),
        });
        let finished = c.subject.finished_at.clone();
        out.push(Issued {
            node: Some(r.spec.node_name.clone()),
            gpu_uuids: uuids,
            runs: c
                .results
                .gpus
                .iter()
                .map(|g| gpuval_crds::baseline::gpu_run(g, &finished))
                .collect(),
            part: None,
            signed: seal::sign(&c, pkcs8)?,
            attestation: attestation::sign(&attestation::node_statement(&c)?, pkcs8)?,
        });
    }
    let summary = ValidationCertificate {
        format: certificate::VALIDATION_FORMAT.into(),
        subject: subject(gv, None, status_time(status)),
        phase: status.phase.map(|p| p.to_string()).unwrap_or_default(),
        settings,
        nodes: lines,
        fabric: status
            .fabric
            .as_ref()
            .and_then(|f| serde_json::to_value(f).ok()),
        part: None,
    };
    out.extend(validation_parts(summary, pkcs8, MAX_CERTIFICATE_BYTES)?);
    Ok(out)
}

/// The validation's certificate signed whole, or, when its signed text passes `max_bytes`,
/// split into as few parts as keep each under it ([`Part`]), the nodes' lines shared out in
/// order. Later parts come first and part 1 last: the shell writes them in this order, and
/// part 1 existing means the run's certificates are all written.
pub fn validation_parts(
    whole: ValidationCertificate,
    pkcs8: &[u8],
    max_bytes: usize,
) -> Result<Vec<Issued>, SignError> {
    let issued = |doc: &ValidationCertificate| -> Result<Issued, SignError> {
        Ok(Issued {
            node: None,
            gpu_uuids: Vec::new(),
            runs: Vec::new(),
            part: doc.part,
            signed: seal::sign(doc, pkcs8)?,
            attestation: attestation::sign(&attestation::validation_statement(doc)?, pkcs8)?,
        })
    };
    let one = issued(&whole)?;
    let size = stored_len(&one)?;
    if size <= max_bytes || whole.nodes.len() < 2 {
        return Ok(vec![one]);
    }
    let lines = whole.nodes.len();
    let mut of = size.div_ceil(max_bytes).clamp(2, lines);
    loop {
        let per = lines.div_ceil(of);
        let parts: Vec<Issued> = whole
            .nodes
            .chunks(per)
            .enumerate()
            .map(|(i, chunk)| {
                let index = u32::try_from(i + 1).unwrap_or(u32::MAX);
                issued(&ValidationCertificate {
                    nodes: chunk.to_vec(),
                    fabric: if index == 1 {
                        whole.fabric.clone()
                    } else {
                        None
                    },
                    part: Some(Part {
                        index,
                        of: u32::try_from(lines.div_ceil(per)).unwrap_or(u32::MAX),
                    }),
                    ..whole.clone()
                })
            })
            .collect::<Result<_, _>>()?;
        let largest = parts
            .iter()
            .map(stored_len)
            .try_fold(0, |m, l| l.map(|l| m.max(l)))?;
        if largest <= max_bytes || per == 1 {
            return Ok(parts.into_iter().rev().collect());
        }
        of += 1;
    }
}

/// The bytes of `i`'s certificate and attestation as a certificate ConfigMap holds them.
fn stored_len(i: &Issued) -> Result<usize, serde_json::Error> {
    Ok(serde_json::to_string_pretty(&i.signed)?.len()
        + serde_json::to_string(&i.attestation)?.len())
}

/// The verdict node result `r`'s certificate signs in run `ended` (its terminal status):
/// as the node's final line says ([`gpuval_crds::final_line`], [`FinalLine::certified`]), so a
/// node the fabric test named is never certified as passing, and a line that is no hardware
/// evidence never signs a failure. A certificate records a simulated backend in its software
/// section, so simulated results are read as they are.
///
/// [`FinalLine::certified`]: gpuval_crds::FinalLine::certified
pub fn certified(ended: &GpuValidation, r: &GpuNodeResult, reported: Verdict) -> Verdict {
    // A result without a verdict label is read as one whose report says nothing more.
    let meta = ReportMeta::read(r.metadata.labels.as_ref(), r.metadata.annotations.as_ref());
    let (simulated, summary, codes) = meta
        .map(|m| (m.simulated, m.summary, m.codes))
        .unwrap_or_default();
    let seen = ResultSeen {
        name: r.metadata.name.clone().unwrap_or_default(),
        generation: r.spec.generation,
        verdict: Some(reported),
        reported: r.status.is_some(),
        simulated,
        summary,
        codes,
        action: gpuval_crds::Action::None,
        created: r.metadata.creation_timestamp.as_ref().map(|t| t.0),
    };
    let trust = gpuval_crds::Trust {
        trust_simulated: true,
    };
    match gpuval_crds::final_line(ended, &r.spec.node_name, Some(&seen), trust) {
        Some(line) => line.certified(reported),
        None if reported.passes() => Verdict::Error,
        None => reported,
    }
}

fn status_time(status: &GpuValidationStatus) -> String {
    status
        .completion_time
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default()
}

fn subject(gv: &GpuValidation, node: Option<String>, finished_at: String) -> Subject {
    Subject {
        validation: gv.metadata.name.clone().unwrap_or_default(),
        uid: gv.metadata.uid.clone(),
        generation: gv.metadata.generation.unwrap_or(0),
        node,
        finished_at,
    }
}

fn settings_of(gv: &GpuValidation) -> Settings {
    Settings {
        source: format!(
            "GpuValidation {}/{} generation {}",
            gv.metadata.namespace.as_deref().unwrap_or(""),
            gv.metadata.name.as_deref().unwrap_or(""),
            gv.metadata.generation.unwrap_or(0)
        ),
        spec: serde_json::to_value(&gv.spec).unwrap_or_default(),
        floors: Vec::new(),
    }
}

fn node_certificate(
    gv: &GpuValidation,
    status: &GpuValidationStatus,
    r: &GpuNodeResult,
    nodes: &[String],
    settings: &Settings,
    image: &AgentImage,
) -> NodeCertificate {
    let report = r.status.clone().unwrap_or_default();
    let node = r.spec.node_name.clone();
    let fabric = status.fabric.as_ref().map(|f| NodeFabric {
        phase: f.phase.to_string(),
        partners: nodes.iter().filter(|n| **n != node).cloned().collect(),
        named: f.failed_nodes.contains(&node) || f.suspects.contains(&node),
        bus_bandwidth_gbps: f.bus_bandwidth_gbps,
        measured: r
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(labels::FABRIC_OUTCOMES))
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default(),
    });
    let report_sha256 = seal::digest_of(&report).unwrap_or_default();
    let image_id = image.ran.get(&node).cloned();
    certificate::node_certificate(
        &report,
        NodeInputs {
            subject: subject(gv, Some(node), report.finished_at.clone()),
            settings: settings.clone(),
            image: Some(image.configured.clone()),
            image_id,
            fabric,
            report_sha256,
        },
    )
}

/// The ConfigMap name of a certificate: one per run (validation uid and generation) and node,
/// or per run for the validation's. Generation 1 has no mark (the names certificates always
/// had); a later generation is marked `.g<generation>` after the uid, which no node name can
/// begin with, so each run's names are its own.
pub fn name(validation: &str, uid: &str, generation: i64, node: Option<&str>) -> String {
    let short_uid: String = uid.chars().filter(|c| *c != '-').take(8).collect();
    let run = if generation > 1 {
        format!("{short_uid}.g{generation}")
    } else {
        short_uid
    };
    let base = match node {
        Some(n) => format!("gpuval-cert-{validation}-{run}-{n}"),
        None => format!("gpuval-cert-{validation}-{run}"),
    };
    gpuval_crds::result::shortened(base, gpuval_crds::names::DNS1123_SUBDOMAIN_MAX)
}

/// The ConfigMap holding `signed`, labelled with its validation, generation, node and GPUs; no
/// owner, so it outlives the validation.
pub fn config_map(
    gv: &GpuValidation,
    namespace: &str,
    i: &Issued,
) -> Result<ConfigMap, serde_json::Error> {
    let Issued {
        node,
        gpu_uuids,
        runs,
        part,
        signed,
        attestation,
    } = i;
    let node = node.as_deref();
    let validation = gv.metadata.name.clone().unwrap_or_default();
    let uid = gv.metadata.uid.clone().unwrap_or_default();
    let generation = gv.metadata.generation.unwrap_or(0);
    let l = CertificateMeta {
        validation: validation.clone(),
        generation,
        node: node.map(str::to_string),
        gpu_uuids: gpu_uuids.clone(),
        part: *part,
    }
    .labels();
    let first = name(&validation, &uid, generation, node);
    let name = match part {
        Some(p) if p.index > 1 => part_name(&first, p.index),
        _ => first,
    };
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            labels: Some(l),
            annotations: (!runs.is_empty())
                .then(|| serde_json::to_string(runs))
                .transpose()?
                .map(|r| BTreeMap::from([(RUNS_ANNOTATION.to_string(), r)])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (DATA_KEY.to_string(), serde_json::to_string_pretty(signed)?),
            (
                attestation::DATA_KEY.to_string(),
                serde_json::to_string(attestation)?,
            ),
        ])),
        immutable: Some(true),
        ..Default::default()
    })
}

/// The ConfigMap that publishes the public key (`public.pem`, and its `keyId`).
pub fn public_key_map(namespace: &str, public: &[u8]) -> ConfigMap {
    let pem = gpuval_crds::pem::encode("PUBLIC KEY", &gpuval_crds::pem::ed25519_spki(public));
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(PUBLIC_KEY_CONFIGMAP.into()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                labels::MANAGED_BY_KEY.to_string(),
                labels::MANAGED_BY.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (PUBLIC_KEY_DATA.to_string(), pem),
            ("keyId".to_string(), seal::key_id(public)),
        ])),
        ..Default::default()
    }
}

/// The GPU runs recorded on certificate ConfigMaps (their [`RUNS_ANNOTATION`]); an annotation
/// that does not parse is skipped.
pub fn runs_of(metas: &[ObjectMeta]) -> Vec<GpuRun> {
    metas
        .iter()
        .filter_map(|m| m.annotations.as_ref()?.get(RUNS_ANNOTATION))
        .filter_map(|s| serde_json::from_str::<Vec<GpuRun>>(s).ok())
        .flatten()
        .collect()
}

/// Node names per list of certificate metadata: a set-based selector of this many values stays
/// a few kilobytes of URL.
pub const NODES_PER_LIST: usize = 100;

/// The label selectors that list the node certificates of `nodes`, [`NODES_PER_LIST`] nodes
/// each: `gpuval.io/certificate=node,gpuval.io/node in (a,b,...)`.
pub fn node_selectors(nodes: &[String]) -> Vec<String> {
    nodes
        .chunks(NODES_PER_LIST)
        .map(|chunk| {
            let values: Vec<String> = chunk.iter().map(|n| labels::node_value(n)).collect();
            format!(
                "{KIND_LABEL}={NODE_KIND},{} in ({})",
                labels::NODE,
                values.join(",")
            )
        })
        .collect()
}

/// The certificate metadata `metas` grouped by the node each was written for, keyed by the
/// node's names among `nodes` (its label value may be a hash of a long name).
pub fn by_node(nodes: &[String], metas: Vec<ObjectMeta>) -> BTreeMap<String, Vec<ObjectMeta>> {
    let names: BTreeMap<String, &String> =
        nodes.iter().map(|n| (labels::node_value(n), n)).collect();
    let mut out: BTreeMap<String, Vec<ObjectMeta>> = BTreeMap::new();
    for m in metas {
        let owner = m.labels.as_ref().and_then(CertificateMeta::owner_in);
        let node = match &owner {
            Some(CertificateOwner::Node(v)) => names.get(v),
            _ => None,
        };
        if let Some(node) = node {
            out.entry((*node).clone()).or_default().push(m);
        }
    }
    out
}

/// The `GPUVAL_BASELINES` value for a node with `history`: None when no GPU has a passing run.
pub fn baselines_env(history: &[GpuRun], runs: usize, tolerance: f64) -> Option<String> {
    let b: Baselines = gpuval_crds::baseline::baselines(history, runs, tolerance);
    if b.gpus.is_empty() {
        return None;
    }
    serde_json::to_string(&b).ok()
}

/// The certificate ConfigMaps beyond the newest `keep` of each node (node certificates) and of
/// each validation name (validation certificates), oldest first by creation time then name.
pub fn to_prune(existing: &[ConfigMap], keep: usize) -> Vec<String> {
    let mut groups: BTreeMap<CertificateOwner, Vec<(String, String)>> = BTreeMap::new();
    let mut parts: BTreeMap<String, u32> = BTreeMap::new();
    for cm in existing {
        let l = cm.metadata.labels.clone().unwrap_or_default();
        // A split certificate counts once, as its part 1, and goes with it.
        if certificate::is_later_part(&l) {
            continue;
        }
        let Some(owner) = CertificateMeta::owner_in(&l) else {
            continue;
        };
        let name = cm.metadata.name.clone().unwrap_or_default();
        parts.insert(name, certificate::parts_of(&l));
        let created = cm
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default();
        groups
            .entry(owner)
            .or_default()
            .push((created, cm.metadata.name.clone().unwrap_or_default()));
    }
    let mut out = Vec::new();
    for (_, mut items) in groups {
        items.sort();
        let extra = items.len().saturating_sub(keep);
        for (_, first) in items.into_iter().take(extra) {
            let of = parts.get(&first).copied().unwrap_or(1);
            out.extend((2..=of).map(|k| part_name(&first, k)));
            out.push(first);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::{NodeReport, Phase};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn node_certificates_are_listed_a_hundred_nodes_at_a_time() {
        let nodes: Vec<String> = (0..250).map(|i| format!("gpu-{i:03}")).collect();
        let selectors = node_selectors(&nodes);
        assert_eq!(selectors.len(), 3);
        assert!(
            selectors[0].starts_with(&format!(
                "{KIND_LABEL}=node,{} in (gpu-000,gpu-001,",
                labels::NODE
            )),
            "{}",
            selectors[0]
        );
        assert!(selectors[2].ends_with("gpu-249)"), "{}", selectors[2]);
        assert!(node_selectors(&[]).is_empty());
    }

    #[test]
    fn metadata_goes_to_the_node_it_was_written_for_long_names_included() {
        let long = format!("node-{}", "x".repeat(80));
        let nodes = vec!["a".to_string(), long.clone()];
        let meta = |node: &str, name: &str| ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                CertificateMeta {
                    validation: "v".into(),
                    generation: 1,
                    node: Some(node.into()),
                    gpu_uuids: Vec::new(),
                    part: None,
                }
                .labels(),
            ),
            ..Default::default()
        };
        let grouped = by_node(
            &nodes,
            vec![
                meta("a", "c1"),
                meta(&long, "c2"),
                meta("elsewhere", "c3"),
                meta("a", "c4"),
            ],
        );
        let names =
            |n: &str| -> Vec<String> { grouped[n].iter().filter_map(|m| m.name.clone()).collect() };
        assert_eq!(names("a"), ["c1", "c4"]);
        assert_eq!(names(&long), ["c2"]);
        assert_eq!(grouped.len(), 2, "a node not asked for is left out");
    }

    fn status(phase: Phase, generation: i64) -> GpuValidationStatus {
        GpuValidationStatus {
            phase: Some(phase),
            observed_generation: Some(generation),
            ..Default::default()
        }
    }

    fn gv() -> GpuValidation {
        let mut gv = GpuValidation::new("quick", crate::decide::selection::tests::spec());
        gv.metadata.uid = Some("0123abcd-ef".into());
        gv.metadata.generation = Some(2);
        gv
    }

    /// Node `node`'s result of generation `generation` of [`gv`], bound as the operator binds it.
    fn result(node: &str, generation: i64, uuid: &str) -> GpuNodeResult {
        let binding = gpuval_crds::binding::Binding {
            validation_uid: "0123abcd-ef".into(),
            generation,
            node: node.into(),
            pod: crate::decide::pod::pod_name("quick", node, generation),
            pod_uid: format!("pod-{node}"),
        };
        let mut r = binding.result("quick", "ns");
        r.status = Some(NodeReport {
            node: Some(node.into()),
            gpus: vec![gpuval_crds::GpuReport {
                uuid: uuid.into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        r
    }

    /// `img`, run on node `a` as its digest; node `b`'s pod gave none.
    fn image() -> AgentImage {
        AgentImage {
            configured: "img".into(),
            ran: BTreeMap::from([("a".into(), "docker.io/library/img@sha256:abc".into())]),
        }
    }

    fn key() -> Vec<u8> {
        let mut der = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        der.extend([1u8; 32]);
        der
    }

    #[test]
    fn a_run_gives_a_verified_certificate_per_node_and_one_summary() {
        let results = [
            result("b", 2, "GPU-b"),
            result("a", 2, "GPU-a"),
            result("old", 1, "GPU-o"),
        ];
        let signed =
            sign_run(&gv(), &status(Phase::Passed, 2), &results, &image(), &key()).expect("sign");
        assert_eq!(signed.len(), 3, "two nodes of generation 2 and the summary");
        let public = seal::public_key_of(&key()).expect("public");
        for i in &signed {
            assert_eq!(seal::verify(&i.signed, &public), Ok(()));
            let statement = attestation::verify(&i.attestation, &public).expect("attestation");
            assert_eq!(
                statement.predicate, i.signed.document,
                "the certificate, attested"
            );
        }
        let software = |i: usize| signed[i].signed.document["software"].clone();
        assert_eq!(software(0)["image"], "img");
        assert_eq!(software(0)["imageId"], "docker.io/library/img@sha256:abc");
        assert!(
            software(1).get("imageId").is_none(),
            "b's pod gave no digest"
        );
        assert_eq!(signed[0].node.as_deref(), Some("a"));
        assert_eq!(signed[0].gpu_uuids, vec!["GPU-a".to_string()]);
        let summary: ValidationCertificate =
            serde_json::from_value(signed[2].signed.document.clone()).expect("summary");
        let nodes: Vec<&str> = summary.nodes.iter().map(|l| l.node.as_str()).collect();
        assert_eq!(nodes, ["a", "b"]);
        assert_eq!(summary.phase, "Passed");
        let cm = config_map(&gv(), "ns", &signed[0]).expect("cm");
        let runs = runs_of(std::slice::from_ref(&cm.metadata));
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].uuid, "GPU-a");
        let env = baselines_env(&runs, 5, 0.1).expect("a passing run gives a baseline");
        assert!(env.contains("\"GPU-a\""), "{env}");
        let l = cm.metadata.labels.expect("labels");
        assert_eq!(
            l.get("gpu.gpuval.io/GPU-a").map(String::as_str),
            Some("true")
        );
        assert_eq!(l.get(KIND_LABEL).map(String::as_str), Some("node"));
        assert!(cm.metadata.owner_references.is_none());
        assert_eq!(
            cm.metadata.name.as_deref(),
            Some("gpuval-cert-quick-0123abcd.g2-a")
        );
        assert_eq!(l.get(labels::GENERATION).map(String::as_str), Some("2"));
        let data = cm.data.expect("data");
        let text = data
            .get(attestation::DATA_KEY)
            .expect("the attestation beside it");
        let pem = gpuval_crds::pem::encode("PUBLIC KEY", &gpuval_crds::pem::ed25519_spki(&public));
        attestation::verify_text(text, &pem).expect("the stored attestation verifies");
    }

    #[test]
    fn each_run_of_a_validation_has_certificate_names_of_its_own() {
        let uid = "0123abcd-ef";
        // Generation 1 keeps the names certificates always had.
        assert_eq!(
            name("quick", uid, 1, Some("a")),
            "gpuval-cert-quick-0123abcd-a"
        );
        assert_eq!(name("quick", uid, 1, None), "gpuval-cert-quick-0123abcd");
        assert_eq!(name("quick", uid, 2, None), "gpuval-cert-quick-0123abcd.g2");
        // A later run never takes an earlier one's name, whatever its nodes are called.
        assert_ne!(
            name("quick", uid, 2, Some("a")),
            name("quick", uid, 1, Some("g2-a"))
        );
        assert_ne!(
            name("quick", uid, 2, Some("a")),
            name("quick", uid, 1, Some("a"))
        );
        let long = name("quick", uid, 3, Some(&"n".repeat(300)));
        assert!(
            long.len() <= gpuval_crds::names::DNS1123_SUBDOMAIN_MAX,
            "{long}"
        );
    }

    #[test]
    fn only_results_bound_to_the_run_and_open_are_certified() {
        let mut closed = result("late", 2, "GPU-late");
        closed
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(labels::CLOSED.into(), "DeadlineExceeded".into());
        let mut earlier = result("earlier", 2, "GPU-earlier");
        earlier
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                labels::VALIDATION_UID.into(),
                "a-validation-of-the-same-name-before".into(),
            );
        let mut unbound = result("unbound", 2, "GPU-unbound");
        unbound.metadata.annotations = None;
        let results = [result("a", 2, "GPU-a"), closed, earlier, unbound];
        let signed =
            sign_run(&gv(), &status(Phase::Passed, 2), &results, &image(), &key()).expect("sign");
        let nodes: Vec<Option<&str>> = signed.iter().map(|i| i.node.as_deref()).collect();
        assert_eq!(nodes, [Some("a"), None], "a and the summary only");
    }

    #[test]
    fn gpu_labels_are_label_safe() {
        assert_eq!(gpu_label("GPU-1a2b"), "gpu.gpuval.io/GPU-1a2b");
        let odd = gpu_label("GPU/with spaces");
        assert!(
            odd.starts_with("gpu.gpuval.io/h") && odd.len() == 14 + 17,
            "{odd}"
        );
    }

    #[test]
    fn retention_keeps_the_newest_of_each_node_and_validation() {
        let cm = |name: &str, kind: &str, owner: &str, secs: i64| {
            let key = if kind == "node" {
                labels::NODE
            } else {
                labels::VALIDATION
            };
            ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    labels: Some(BTreeMap::from([
                        (KIND_LABEL.to_string(), kind.to_string()),
                        (key.to_string(), owner.to_string()),
                    ])),
                    creation_timestamp: Some(Time(
                        k8s_openapi::jiff::Timestamp::from_second(secs).expect("time"),
                    )),
                    ..Default::default()
                },
                ..Default::default()
            }
        };
        let all = [
            cm("a3", "node", "a", 30),
            cm("a1", "node", "a", 10),
            cm("a2", "node", "a", 20),
            cm("b1", "node", "b", 5),
            cm("v1", "validation", "quick", 1),
            cm("v2", "validation", "quick", 2),
        ];
        assert_eq!(to_prune(&all, 2), ["a1"]);
        assert_eq!(to_prune(&all, 1), ["a1", "a2", "v1"]);
    }

    /// A validation certificate of `nodes` 8-GPU nodes, as sign_run makes it.
    fn big_summary(nodes: usize) -> ValidationCertificate {
        let hex = |i: usize, salt: &str| seal::sha256_hex(format!("{salt}{i}").as_bytes());
        ValidationCertificate {
            format: certificate::VALIDATION_FORMAT.into(),
            subject: subject(&gv(), None, "2026-12-07T12:00:00Z".into()),
            phase: "Passed".into(),
            settings: settings_of(&gv()),
            nodes: (0..nodes)
                .map(|i| NodeLine {
                    node: format!("gpu-node-{i:05}.rack-{:02}.example.internal", i % 40),
                    verdict: Verdict::Pass,
                    gpu_uuids: (0..8)
                        .map(|g| format!("GPU-{}", &hex(i * 8 + g, "gpu")[..32]))
                        .collect(),
                    certificate_sha256: hex(i, "cert"),
                    report_sha256: hex(i, "report"),
                })
                .collect(),
            fabric: Some(serde_json::json!({"phase": "Passed"})),
            part: None,
        }
    }

    #[test]
    fn a_validation_certificate_too_large_for_a_configmap_is_split_into_parts_that_each_fit() {
        let public = seal::public_key_of(&key()).expect("public");
        // Small: one certificate, named and labelled as always.
        let small = validation_parts(big_summary(3), &key(), MAX_CERTIFICATE_BYTES).expect("sign");
        assert_eq!(small.len(), 1);
        assert_eq!(small[0].part, None);
        // 1,200 nodes (over 1 MiB whole, the size the API server refused at 1,000 nodes of a
        // scale run): parts, each a verified certificate whose ConfigMap fits.
        let whole = big_summary(1200);
        let parts = validation_parts(whole.clone(), &key(), MAX_CERTIFICATE_BYTES).expect("sign");
        assert!(parts.len() >= 2, "{} part(s)", parts.len());
        let last = parts.last().expect("part 1");
        assert_eq!(
            last.part.map(|p| p.index),
            Some(1),
            "part 1 is written last"
        );
        let mut nodes = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        let first = name("quick", "0123abcd-ef", 2, None);
        for p in parts.iter().rev() {
            assert_eq!(seal::verify(&p.signed, &public), Ok(()));
            let doc: ValidationCertificate =
                serde_json::from_value(p.signed.document.clone()).expect("part");
            assert_eq!(doc.part, p.part);
            assert_eq!(doc.part.map(|x| x.of), Some(parts.len() as u32));
            assert_eq!(doc.fabric.is_some(), doc.part.map(|x| x.index) == Some(1));
            nodes.extend(doc.nodes.into_iter().map(|l| l.node));
            let cm = config_map(&gv(), "ns", p).expect("cm");
            let bytes = serde_json::to_vec(&cm).expect("json").len();
            assert!(bytes < 1 << 20, "a part's ConfigMap is {bytes} bytes");
            let name = cm.metadata.name.clone().expect("name");
            let l = cm.metadata.labels.clone().expect("labels");
            match p.part.map(|x| x.index) {
                Some(1) => {
                    assert_eq!(name, first);
                    assert_eq!(certificate::parts_of(&l), parts.len() as u32);
                }
                Some(k) => {
                    assert_eq!(name, part_name(&first, k));
                    assert!(certificate::is_later_part(&l));
                }
                None => panic!("a part without its number"),
            }
            names.insert(name);
        }
        let all: Vec<String> = whole.nodes.iter().map(|l| l.node.clone()).collect();
        assert_eq!(nodes, all, "every node once, in order");
        // Retention counts the split certificate once and prunes all its parts with part 1.
        let at = |secs: i64| {
            Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(secs).expect("time"),
            ))
        };
        let mut maps: Vec<ConfigMap> = parts
            .iter()
            .map(|p| config_map(&gv(), "ns", p).expect("cm"))
            .collect();
        for m in &mut maps {
            m.metadata.creation_timestamp = at(10);
        }
        let mut newer = config_map(&gv(), "ns", &small[0]).expect("cm");
        newer.metadata.name = Some("gpuval-cert-quick-newer".into());
        newer.metadata.creation_timestamp = at(20);
        maps.push(newer);
        assert!(to_prune(&maps, 2).is_empty(), "two runs kept");
        let pruned: std::collections::BTreeSet<String> = to_prune(&maps, 1).into_iter().collect();
        assert_eq!(pruned, names);
    }
}
