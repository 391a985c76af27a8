//! The acceptance certificate: what was tested, on which hardware, with which software and
//! settings, and what came of it, in a form another party can check ([`crate::seal`] signs and
//! verifies it). One per node ([`NodeCertificate`]) and one per validation
//! ([`ValidationCertificate`]) summarizing the nodes'. Built here from the report and the
//! validation, with no I/O: the operator (or the agent on bare metal) reads what it needs and
//! hands it in.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::report::{NodeReport, Verdict};

/// The `format` of a node certificate.
pub const NODE_FORMAT: &str = "gpuval.io/node-certificate/v1";
/// The `format` of a validation certificate.
pub const VALIDATION_FORMAT: &str = "gpuval.io/validation-certificate/v1";

/// Where certificates are kept: the ConfigMap data key of a certificate.
pub const DATA_KEY: &str = "certificate.json";
/// The label that marks certificate ConfigMaps (`node` or `validation`).
pub const KIND_LABEL: &str = "gpuval.io/certificate";
/// The label key prefix of a certificate's GPUs (`gpu.gpuval.io/GPU-...`).
pub const GPU_LABEL_PREFIX: &str = "gpu.gpuval.io/";
/// Label on a validation certificate that is split: on part 1 (named as an unsplit one) the
/// number of parts, on each later part its number ([`Part`]).
pub const PARTS_LABEL: &str = "gpuval.io/certificate-parts";
pub const PART_LABEL: &str = "gpuval.io/certificate-part";

/// The label key naming GPU `uuid` on its certificates: the UUID itself where it is a valid
/// label name, else a hash of it (the operator labels with it, the plugin selects by it).
pub fn gpu_label(uuid: &str) -> String {
    let valid = !uuid.is_empty()
        && uuid.len() <= 63
        && uuid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && uuid.starts_with(|c: char| c.is_ascii_alphanumeric())
        && uuid.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        format!("{GPU_LABEL_PREFIX}{uuid}")
    } else {
        format!(
            "{GPU_LABEL_PREFIX}h{:016x}",
            crate::result::fnv1a(uuid.as_bytes())
        )
    }
}

/// Whose a certificate is, as its labels say: a node's, or a validation's own (each by its
/// label value, [`crate::labels::node_value`] of the name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum CertificateOwner {
    Node(String),
    Validation(String),
}

/// A certificate ConfigMap's labels: the one type the operator writes them through and every
/// reader (the operator's pruning, the plugin) reads them through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateMeta {
    /// The validation's name.
    pub validation: String,
    pub generation: i64,
    /// The node of a node certificate; None for the validation's own.
    pub node: Option<String>,
    /// The GPUs it covers (each labelled by [`gpu_label`]: written, never read back, since a
    /// UUID that is no label name is labelled by its hash).
    pub gpu_uuids: Vec<String>,
    /// Which part of a split validation certificate it is (None: not split).
    pub part: Option<Part>,
}

impl CertificateMeta {
    /// The labels: managed by the operator, the validation, its generation, the kind (`node`
    /// or `validation`), the node, and one per GPU.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let Self {
            validation,
            generation,
            node,
            gpu_uuids,
            part,
        } = self;
        use crate::labels;
        let mut l = BTreeMap::from([
            (
                labels::MANAGED_BY_KEY.to_string(),
                labels::MANAGED_BY.to_string(),
            ),
            (
                labels::VALIDATION.to_string(),
                labels::node_value(validation),
            ),
            (labels::GENERATION.to_string(), generation.to_string()),
            (
                KIND_LABEL.to_string(),
                kind_value(node.is_some()).to_string(),
            ),
        ]);
        if let Some(n) = node {
            l.insert(labels::NODE.to_string(), labels::node_value(n));
        }
        for u in gpu_uuids {
            l.insert(gpu_label(u), "true".to_string());
        }
        match part {
            Some(p) if p.index > 1 => {
                l.insert(PART_LABEL.to_string(), p.index.to_string());
            }
            Some(p) => {
                l.insert(PARTS_LABEL.to_string(), p.of.to_string());
            }
            None => {}
        }
        l
    }

    /// Whose this certificate is.
    pub fn owner(&self) -> CertificateOwner {
        match &self.node {
            Some(n) => CertificateOwner::Node(crate::labels::node_value(n)),
            None => CertificateOwner::Validation(crate::labels::node_value(&self.validation)),
        }
    }

    /// Whose the certificate labelled `labels` is; None when they do not mark a certificate
    /// (an owner label missing reads as empty).
    pub fn owner_in(labels: &BTreeMap<String, String>) -> Option<CertificateOwner> {
        let value = |key: &str| labels.get(key).cloned().unwrap_or_default();
        match labels.get(KIND_LABEL)?.as_str() {
            NODE_KIND => Some(CertificateOwner::Node(value(crate::labels::NODE))),
            _ => Some(CertificateOwner::Validation(value(
                crate::labels::VALIDATION,
            ))),
        }
    }
}

/// The [`KIND_LABEL`] value of a node certificate.
pub const NODE_KIND: &str = "node";
/// The [`KIND_LABEL`] value of a validation's own certificate.
pub const VALIDATION_KIND: &str = "validation";

fn kind_value(of_node: bool) -> &'static str {
    if of_node { NODE_KIND } else { VALIDATION_KIND }
}

/// What a certificate is about: which run of which validation, and when it ended.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    /// The GpuValidation's name (or `bare-metal` for an agent run on its own).
    pub validation: String,
    /// The validation's uid, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    pub generation: i64,
    /// The node (a certificate per validation has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// RFC 3339: when the run ended (the report's end for a node).
    pub finished_at: String,
}

/// One GPU's identity.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuIdentity {
    pub index: i32,
    pub uuid: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board_part_number: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vbios: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inforom: Option<String>,
    pub memory_total_mib: i64,
}

/// The node's hardware: its GPUs, its host (DMI) and its network adapters, as far as readable.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Hardware {
    pub gpus: Vec<GpuIdentity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::report::HostIdentity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<crate::report::NicIdentity>,
}

/// The software the figures were measured with.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Software {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
    pub agent_version: String,
    /// `cuda` or `simulated`.
    pub backend: String,
    pub simulated: bool,
    /// The agent image (as configured; a digest where the reference has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The image as the node ran it: the agent container's `imageID` from its pod's status
    /// (`docker.io/library/gpuval-agent@sha256:...`, a digest however the image was named),
    /// where the pod status gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
}

/// The settings in force and where they came from.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// Where `spec` came from (`GpuValidation default/quick generation 3`, a settings file).
    pub source: String,
    /// The validation's spec as the API server held it (every threshold and setting).
    pub spec: serde_json::Value,
    /// Each floor the report judged against and its source (floors read from the hardware or
    /// a profile rather than from the spec).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<crate::report::BandwidthFloor>,
}

/// The fabric test's outcome for one node.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeFabric {
    /// The fabric phase of the validation (`Passed`, `Failed`, ...).
    pub phase: String,
    /// The nodes this one was tested with.
    pub partners: Vec<String>,
    /// True when the fabric test named this node as failed or suspect.
    pub named: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_bandwidth_gbps: Option<f64>,
    /// What this node's agent measured, round by round.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured: Vec<crate::fabric::FabricOutcome>,
}

/// The SHA-256 of a raw report's canonical JSON.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReportDigest {
    pub node: String,
    pub sha256: String,
}

/// One node's certificate.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeCertificate {
    /// [`NODE_FORMAT`].
    pub format: String,
    pub subject: Subject,
    pub hardware: Hardware,
    pub software: Software,
    pub settings: Settings,
    pub verdict: Verdict,
    /// The node's failure (or warning) codes, worst first, comma-separated.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub codes: String,
    /// Every figure and verdict: the node's report as the agent wrote it.
    pub results: NodeReport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<NodeFabric>,
    pub report: ReportDigest,
}

/// One node's line in a validation certificate.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeLine {
    pub node: String,
    pub verdict: Verdict,
    pub gpu_uuids: Vec<String>,
    /// The node certificate's digest (SHA-256 of its canonical JSON).
    pub certificate_sha256: String,
    pub report_sha256: String,
}

/// Where a validation certificate too large for one ConfigMap (the API server keeps a
/// ConfigMap's data under 1 MiB: about 800 nodes' lines) is split: part `index` of `of`, each
/// part a whole signed certificate (subject, phase, settings) with its share of the nodes' lines
/// in node order; part 1 also carries the fabric status.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// 1-based.
    pub index: u32,
    pub of: u32,
}

/// A later part of a split validation certificate (its [`PART_LABEL`]): read through part 1,
/// never counted or picked on its own.
pub fn is_later_part(labels: &BTreeMap<String, String>) -> bool {
    labels.contains_key(PART_LABEL)
}

/// The ConfigMap name of part `index` (2 or later) of a split validation certificate whose
/// part 1 is named `first`: `first` marked `.p<index>`, which neither a node's certificate
/// (`-<node>` after the run) nor a later generation (`.g<n>`) can end in.
pub fn part_name(first: &str, index: u32) -> String {
    crate::result::shortened(
        format!("{first}.p{index}"),
        crate::names::DNS1123_SUBDOMAIN_MAX,
    )
}

/// How many parts the validation certificate labelled `labels` was split into (1: not split).
pub fn parts_of(labels: &BTreeMap<String, String>) -> u32 {
    labels
        .get(PARTS_LABEL)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// A validation's certificate: its settings and each node's line.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValidationCertificate {
    /// [`VALIDATION_FORMAT`].
    pub format: String,
    pub subject: Subject,
    /// The validation's phase when the run ended.
    pub phase: String,
    pub settings: Settings,
    pub nodes: Vec<NodeLine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<serde_json::Value>,
    /// Set only when the certificate is split ([`Part`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<Part>,
}

/// What a node certificate is made from, beside the report.
#[derive(Clone, Debug, Default)]
pub struct NodeInputs {
    pub subject: Subject,
    pub settings: Settings,
    pub image: Option<String>,
    /// The image as the node ran it (the pod status's `imageID`), where known.
    pub image_id: Option<String>,
    pub fabric: Option<NodeFabric>,
    /// SHA-256 (hex) of the report's canonical JSON ([`crate::seal::sha256_hex`]).
    pub report_sha256: String,
}

/// The certificate of the node that wrote `report`.
pub fn node_certificate(report: &NodeReport, inputs: NodeInputs) -> NodeCertificate {
    let NodeInputs {
        subject,
        settings,
        image,
        image_id,
        fabric,
        report_sha256,
    } = inputs;
    let versions = report.versions();
    let system = report.system.clone().unwrap_or_default();
    let mut settings = settings;
    settings.floors = report
        .gpus
        .iter()
        .filter_map(|g| g.host_transfer.as_ref())
        .flat_map(|h| h.floors.iter().cloned())
        .collect();
    settings.floors.dedup();
    NodeCertificate {
        format: NODE_FORMAT.into(),
        hardware: Hardware {
            gpus: report.gpus.iter().map(gpu_identity).collect(),
            host: system.host.clone(),
            nics: system.nics.clone(),
        },
        software: Software {
            driver: versions.driver,
            cuda: versions.cuda,
            nccl: versions.nccl,
            agent_version: report.agent_version.clone(),
            backend: report.backend.clone(),
            simulated: report.simulated,
            image,
            image_id,
        },
        settings,
        verdict: report.verdict,
        codes: report.codes(),
        results: report.clone(),
        fabric,
        report: ReportDigest {
            node: subject.node.clone().unwrap_or_default(),
            sha256: report_sha256,
        },
        subject,
    }
}

fn gpu_identity(g: &crate::report::GpuReport) -> GpuIdentity {
    let h = g.health.clone().unwrap_or_default();
    GpuIdentity {
        index: g.index,
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        pci_bus_id: g.pci_bus_id.clone(),
        serial: h.serial,
        board_part_number: h.board_part_number,
        vbios: h.vbios_version,
        inforom: h.inforom_version,
        memory_total_mib: g.memory_total_mib,
    }
}

/// Each GPU's figures in a report, by name (`memory.gbps`, `compute.bf16.tflops`, ...): what
/// a GPU's history compares run by run.
pub fn gpu_figures(g: &crate::report::GpuReport) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    if let Some(m) = &g.memory {
        out.insert("memory.gbps".to_string(), m.gbps);
    }
    if let Some(c) = &g.compute {
        for gemm in &c.gemms {
            out.insert(format!("compute.{}.tflops", gemm.dtype), gemm.tflops);
        }
    }
    if let Some(p) = g.host_transfer.as_ref().and_then(|h| h.pinned.as_ref()) {
        out.insert("hostTransfer.pinned.h2dGbps".to_string(), p.h2d_gbps);
        out.insert("hostTransfer.pinned.d2hGbps".to_string(), p.d2h_gbps);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_labels_read_back_as_whose_they_are() {
        let long = format!("node-{}", "x".repeat(80));
        let node = CertificateMeta {
            validation: "burn-in".into(),
            generation: 3,
            node: Some(long.clone()),
            gpu_uuids: vec!["GPU-1".into()],
            part: None,
        };
        let l = node.labels();
        assert_eq!(l[KIND_LABEL], NODE_KIND);
        assert!(l.contains_key(&gpu_label("GPU-1")));
        assert_eq!(CertificateMeta::owner_in(&l), Some(node.owner()));
        assert_eq!(
            node.owner(),
            CertificateOwner::Node(crate::labels::node_value(&long))
        );
        let own = CertificateMeta { node: None, ..node };
        let l = own.labels();
        assert_eq!(l[KIND_LABEL], VALIDATION_KIND);
        assert!(!l.contains_key(crate::labels::NODE));
        assert_eq!(
            CertificateMeta::owner_in(&l),
            Some(CertificateOwner::Validation("burn-in".into()))
        );
        assert_eq!(CertificateMeta::owner_in(&BTreeMap::new()), None);
        assert!(!is_later_part(&l) && parts_of(&l) == 1);
        let first = CertificateMeta {
            part: Some(Part { index: 1, of: 3 }),
            ..own.clone()
        };
        let l = first.labels();
        assert!(!is_later_part(&l) && parts_of(&l) == 3);
        let later = CertificateMeta {
            part: Some(Part { index: 3, of: 3 }),
            ..own
        };
        assert!(is_later_part(&later.labels()));
    }
    use crate::report::{GpuHealth, GpuReport, MemoryResult, SystemInfo};

    fn report() -> NodeReport {
        NodeReport {
            agent_version: "0.1.0".into(),
            backend: "cuda".into(),
            node: Some("n1".into()),
            finished_at: "2026-01-01T00:00:00Z".into(),
            system: Some(SystemInfo {
                driver_version: Some("570.1".into()),
                host: Some(crate::report::HostIdentity {
                    serial: Some("HOST1".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            gpus: vec![GpuReport {
                index: 0,
                uuid: "GPU-a".into(),
                health: Some(GpuHealth {
                    serial: Some("S1".into()),
                    board_part_number: Some("699-1".into()),
                    vbios_version: Some("96.00".into()),
                    inforom_version: Some("G520".into()),
                    ..Default::default()
                }),
                memory: Some(MemoryResult {
                    gbps: 3000.0,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_node_certificate_carries_identity_software_and_the_report() {
        let r = report();
        let c = node_certificate(
            &r,
            NodeInputs {
                subject: Subject {
                    validation: "v".into(),
                    node: Some("n1".into()),
                    ..Default::default()
                },
                report_sha256: "abc".into(),
                ..Default::default()
            },
        );
        assert_eq!(c.format, NODE_FORMAT);
        let g = &c.hardware.gpus[0];
        assert_eq!(
            (
                g.uuid.as_str(),
                g.serial.as_deref(),
                g.board_part_number.as_deref(),
                g.vbios.as_deref(),
                g.inforom.as_deref()
            ),
            (
                "GPU-a",
                Some("S1"),
                Some("699-1"),
                Some("96.00"),
                Some("G520")
            )
        );
        assert_eq!(
            c.hardware.host.and_then(|h| h.serial).as_deref(),
            Some("HOST1")
        );
        assert_eq!(c.software.driver.as_deref(), Some("570.1"));
        assert_eq!(c.results, r);
        assert_eq!(c.report.node, "n1");
        assert_eq!(c.report.sha256, "abc");
        assert_eq!(gpu_figures(&r.gpus[0]).get("memory.gbps"), Some(&3000.0));
    }
}
