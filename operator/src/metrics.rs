//! Prometheus metrics, served at `/metrics`: the operator's own counters, and the fleet's
//! figures ([`Fleet`]): per GPU, per GPU pair and per node, from each node's latest result.
//!
//! Series of the fleet's figures, per node of G GPUs that ran every check: per GPU, memory 1,
//! TFLOP/s one per dtype burned (up to 4), host 2 and verdict 1; per ordered pair, p2p
//! unidirectional 1 (G·(G−1)); per node, verdict 1, last-validated time 1 and NCCL bus
//! bandwidth one per collective (up to 5). A node of 8 GPUs: 64 + 56 + 7 = 127 series at most,
//! so a fleet of 10,000 GPUs (1,250 such nodes) costs about 159,000 series, and nothing grows
//! with the number of runs: a node keeps only its latest result's series, and a node that
//! leaves the cluster loses its series. A node's figures are held compactly ([`HeldFigure`]:
//! 16 bytes each, the GPUs' UUIDs and models once per node), about 2.5 KB for such a node.

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpuval_crds::{NodeVerdict, Phase, Verdict};
use gpuval_view::figures::{Figure, Kind, Scope};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    pub verdict: String,
}

/// Every metric the operator exports.
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Counter,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub validations: Family<PhaseLabels, Gauge>,
    pub node_verdicts: Family<VerdictLabels, Counter>,
    pub pods_created: Counter,
    /// Heap in use (set at each scrape from [`crate::heap::in_use`]).
    pub heap_bytes: Gauge,
    /// The figures of each node's latest result.
    pub fleet: std::sync::Arc<Fleet>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gpuval");
        let reconciles = Counter::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let validations = Family::<PhaseLabels, Gauge>::default();
        let node_verdicts = Family::<VerdictLabels, Counter>::default();
        let pods_created = Counter::default();
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by error kind",
            reconcile_errors.clone(),
        );
        registry.register(
            "validations",
            "GpuValidations by phase",
            validations.clone(),
        );
        registry.register(
            "node_verdicts",
            "Final node verdicts reached, by verdict",
            node_verdicts.clone(),
        );
        registry.register(
            "agent_pods_created",
            "Agent pods created",
            pods_created.clone(),
        );
        let heap_bytes = Gauge::default();
        registry.register(
            "operator_heap_bytes",
            "Heap the operator has allocated and not freed (its caches, records and buffers)",
            heap_bytes.clone(),
        );
        let fleet = std::sync::Arc::new(Fleet::default());
        registry.register_collector(Box::new(fleet.clone()));
        Self {
            fleet,
            registry,
            reconciles,
            reconcile_errors,
            validations,
            node_verdicts,
            pods_created,
            heap_bytes,
        }
    }
}

impl Metrics {
    /// Counts final node verdicts just reached (a step's `new_verdicts`, once its status is
    /// written).
    pub fn count_new_verdicts(&self, verdicts: &[NodeVerdict]) {
        for v in verdicts {
            self.node_verdicts
                .get_or_create(&VerdictLabels {
                    verdict: v.as_str().to_string(),
                })
                .inc();
        }
    }

    /// Sets the validations-by-phase gauge from every validation's phase (a validation
    /// without one counts as Pending); every phase is exported, zero included.
    pub fn set_phases(&self, phases: impl IntoIterator<Item = Option<Phase>>) {
        let phases: Vec<Phase> = phases.into_iter().map(Option::unwrap_or_default).collect();
        for phase in Phase::ALL {
            let n = phases.iter().filter(|p| **p == phase).count();
            self.validations
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str().to_string(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        self.heap_bytes
            .set(i64::try_from(crate::heap::in_use()).unwrap_or(i64::MAX));
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// What the metrics keep of one node's latest result.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeLatest {
    pub validation: String,
    /// The result object's uid and creation time (unix seconds): a later result replaces it.
    pub result_uid: String,
    pub created: i64,
    pub verdict: Verdict,
    /// When its agent finished (unix seconds), if the report says.
    pub finished: Option<f64>,
    pub simulated: bool,
    /// Each GPU's index, UUID, model and verdict.
    pub gpus: Vec<(i32, String, String, Verdict)>,
    /// The figures exported (p2p bidirectional is not).
    pub figures: Vec<HeldFigure>,
}

/// What a held figure is about: the node, a GPU or an ordered GPU pair (NVML indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    Node,
    Gpu(u8),
    Pair(u8, u8),
}

/// One exported figure as the fleet holds it: 16 bytes (the GPU's UUID and model are in
/// [`NodeLatest::gpus`]; the qualifier is one of a few known words, by its place in
/// [`qualifiers`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeldFigure {
    pub value: f64,
    pub on: On,
    pub kind: Kind,
    qualifier: u8,
}

impl HeldFigure {
    /// `f` as held; None for a figure that is not exported, or whose GPU index or qualifier
    /// the fleet cannot hold (an index above 255, a word not in [`qualifiers`]).
    pub fn of(f: &Figure) -> Option<Self> {
        let index = |i: i32| u8::try_from(i).ok();
        let on = match &f.scope {
            Scope::Node => On::Node,
            Scope::Gpu { index: i, .. } => On::Gpu(index(*i)?),
            Scope::Pair { src, dst } => On::Pair(index(*src)?, index(*dst)?),
        };
        let qualifier = match (f.kind, f.qualifier.as_str()) {
            (Kind::P2pGbps, "unidirectional") => 0,
            (Kind::P2pGbps, _) => return None,
            (_, q) => u8::try_from(qualifiers().iter().position(|k| *k == q)?).ok()?,
        };
        Some(Self {
            value: f.value,
            on,
            kind: f.kind,
            qualifier,
        })
    }

    /// The dtype, direction or collective (empty for memory and p2p).
    pub fn qualifier(&self) -> &'static str {
        qualifiers()
            .get(usize::from(self.qualifier))
            .copied()
            .unwrap_or_default()
    }
}

/// The qualifiers a held figure may have: none, every dtype, both host directions, every
/// collective.
pub fn qualifiers() -> &'static [&'static str] {
    static ALL: OnceLock<Vec<&'static str>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut q = vec!["", "h2d", "d2h"];
        q.extend(gpuval_crds::Dtype::ALL.map(gpuval_crds::Dtype::as_str));
        q.extend(gpuval_crds::nccl::Collective::ALL.map(gpuval_crds::nccl::Collective::as_str));
        q
    })
}

impl NodeLatest {
    /// What the metrics keep of `report`, the result `uid` created at `created` for `validation`.
    pub fn from_report(
        validation: &str,
        uid: &str,
        created: i64,
        report: &gpuval_crds::NodeReport,
    ) -> Self {
        Self {
            validation: validation.to_string(),
            result_uid: uid.to_string(),
            created,
            verdict: report.verdict,
            finished: report
                .finished_at
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok()
                .map(|t| t.as_millisecond() as f64 / 1000.0),
            simulated: report.simulated,
            gpus: report
                .gpus
                .iter()
                .map(|g| (g.index, g.uuid.clone(), g.name.clone(), g.verdict))
                .collect(),
            figures: gpuval_view::node_figures(report)
                .iter()
                .filter_map(HeldFigure::of)
                .collect(),
        }
    }
}

/// The latest result's figures of every node, exported on each scrape.
#[derive(Debug, Default)]
pub struct Fleet(Mutex<BTreeMap<String, NodeLatest>>);

impl Fleet {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, NodeLatest>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `latest` for `node` unless a result created later is already held.
    pub fn update(&self, node: &str, latest: NodeLatest) {
        let mut map = self.lock();
        if map
            .get(node)
            .is_none_or(|held| held.created <= latest.created)
        {
            map.insert(node.to_string(), latest);
        }
    }

    /// True when a result of `node` created after `created`, or the result `uid` itself, is held.
    pub fn has_newer_or_same(&self, node: &str, uid: &str, created: i64) -> bool {
        self.lock()
            .get(node)
            .is_some_and(|h| h.result_uid == uid || h.created > created)
    }

    /// Drops the nodes `exists` says are gone from the cluster.
    pub fn retain_nodes(&self, exists: impl Fn(&str) -> bool) {
        self.lock().retain(|node, _| exists(node));
    }
}

/// A family's series: its label pairs and value.
type Series = Vec<(Vec<(&'static str, String)>, f64)>;

fn gauge_family(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: &Series,
) -> Result<(), std::fmt::Error> {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// The series of every family, by metric name, from the held nodes.
fn fleet_series(nodes: &BTreeMap<String, NodeLatest>) -> BTreeMap<&'static str, Series> {
    let mut out: BTreeMap<&'static str, Series> = BTreeMap::new();
    for (node, n) in nodes {
        let node_label = ("node", node.clone());
        out.entry("node_verdict").or_default().push((
            vec![
                node_label.clone(),
                ("validation", n.validation.clone()),
                ("verdict", n.verdict.as_str().into()),
                ("simulated", n.simulated.to_string()),
            ],
            1.0,
        ));
        if let Some(t) = n.finished {
            out.entry("node_last_validated_timestamp_seconds")
                .or_default()
                .push((vec![node_label.clone()], t));
        }
        let gpu_labels = |index: i32| -> Vec<(&'static str, String)> {
            let (uuid, model) = n
                .gpus
                .iter()
                .find(|g| g.0 == index)
                .map(|g| (g.1.clone(), g.2.clone()))
                .unwrap_or_default();
            vec![
                node_label.clone(),
                ("gpu", index.to_string()),
                ("uuid", uuid),
                ("model", model),
            ]
        };
        for g in &n.gpus {
            let mut l = gpu_labels(g.0);
            l.push(("verdict", g.3.as_str().into()));
            out.entry("gpu_verdict").or_default().push((l, 1.0));
        }
        for f in &n.figures {
            let q = || f.qualifier().to_string();
            let (name, labels) = match (f.on, f.kind) {
                (On::Gpu(index), Kind::MemoryGbps) => ("gpu_memory_gbps", gpu_labels(index.into())),
                (On::Gpu(index), Kind::Tflops) => {
                    let mut l = gpu_labels(index.into());
                    l.push(("dtype", q()));
                    ("gpu_tflops", l)
                }
                (On::Gpu(index), Kind::HostGbps) => {
                    let mut l = gpu_labels(index.into());
                    l.push(("direction", q()));
                    ("gpu_host_gbps", l)
                }
                (On::Pair(src, dst), Kind::P2pGbps) => (
                    "p2p_gbps",
                    vec![
                        node_label.clone(),
                        ("src", src.to_string()),
                        ("dst", dst.to_string()),
                    ],
                ),
                (On::Node, Kind::NcclBusbwGbps) => (
                    "node_nccl_busbw_gbps",
                    vec![node_label.clone(), ("collective", q())],
                ),
                _ => continue,
            };
            out.entry(name).or_default().push((labels, f.value));
        }
    }
    out
}

/// Each fleet family (without the `gpuval_` prefix) and its help; dashboards and alerts may
/// name these.
pub const FLEET_FAMILIES: [(&str, &str); 9] = [
    (
        "node_verdict",
        "Verdict of the node's latest result (1 for its verdict)",
    ),
    (
        "node_last_validated_timestamp_seconds",
        "When the node's latest result's agent finished, unix seconds",
    ),
    (
        "node_nccl_busbw_gbps",
        "NCCL bus bandwidth at the largest size, GB/s, by collective",
    ),
    (
        "gpu_verdict",
        "Verdict of each GPU in its node's latest result (1 for its verdict)",
    ),
    ("gpu_memory_gbps", "Memory fill+verify throughput, GB/s"),
    ("gpu_tflops", "Sustained GEMM TFLOP/s, by dtype"),
    (
        "gpu_host_gbps",
        "Pinned host transfer rate of the GPU alone, GB/s, by direction (h2d, d2h)",
    ),
    (
        "p2p_gbps",
        "Peer-to-peer unidirectional copy bandwidth, GB/s, by ordered GPU pair",
    ),
    (
        "fleet_nodes",
        "Nodes whose latest result's figures are held",
    ),
];

impl Collector for Fleet {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let nodes = self.lock();
        let mut series = fleet_series(&nodes);
        series.insert("fleet_nodes", vec![(vec![], nodes.len() as f64)]);
        drop(nodes);
        for (name, help) in FLEET_FAMILIES {
            if let Some(s) = series.get(name) {
                gauge_family(&mut enc, name, help, s)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn metric_labels_use_the_api_names() {
        let m = Metrics::default();
        m.count_new_verdicts(&[NodeVerdict::DeadlineExceeded, NodeVerdict::Passed]);
        m.set_phases([Some(Phase::Running), None, Some(Phase::Running)]);
        let text = m.encode();
        assert!(
            text.contains("gpuval_node_verdicts_total{verdict=\"DeadlineExceeded\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("gpuval_validations{phase=\"Running\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("gpuval_validations{phase=\"Pending\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("gpuval_validations{phase=\"Failed\"} 0"),
            "{text}"
        );
    }

    fn report(gbps: f64, verdict: Verdict) -> gpuval_crds::NodeReport {
        serde_json::from_value(serde_json::json!({
            "simulated": true, "backend": "simulated", "agentVersion": "0.1.0",
            "startedAt": "2026-11-23T08:00:00Z", "finishedAt": "2026-11-23T08:05:00Z",
            "verdict": verdict,
            "gpus": [{"index": 0, "uuid": "GPU-a", "name": "NVIDIA H200", "memoryTotalMib": 1,
                      "verdict": verdict,
                      "memory": {"verdict": verdict, "testedGib": 1.0, "fraction": 0.5, "passes": 1,
                                 "fillGbps": 1.0, "verifyGbps": 1.0, "gbps": gbps, "mismatches": 0, "seconds": 1.0}}],
            "p2p": {"verdict": "Pass", "bufferMib": 64, "iterations": 1, "seconds": 1.0,
                    "pairs": [{"src": 0, "dst": 1, "verdict": "Pass", "peerAccess": true,
                               "unidirectionalGbps": 390.5, "bidirectionalGbps": 780.0,
                               "copyLatencyMicros": 2.0, "mismatches": 0}]}
        }))
        .expect("a report")
    }

    #[test]
    fn a_node_exports_its_latest_results_figures_only() {
        let m = Metrics::default();
        m.fleet.update(
            "gpu-a",
            NodeLatest::from_report("v1", "u1", 10, &report(4300.0, Verdict::Pass)),
        );
        m.fleet.update(
            "gpu-a",
            NodeLatest::from_report("v2", "u2", 20, &report(3900.0, Verdict::Fail)),
        );
        // An older result seen late does not replace the newer one.
        m.fleet.update(
            "gpu-a",
            NodeLatest::from_report("v0", "u0", 5, &report(1.0, Verdict::Pass)),
        );
        let text = m.encode();
        let gpu = r#"node="gpu-a",gpu="0",uuid="GPU-a",model="NVIDIA H200""#;
        assert!(
            text.contains(&format!("gpuval_gpu_memory_gbps{{{gpu}}} 3900.0")),
            "{text}"
        );
        assert!(text.contains(r#"gpuval_node_verdict{node="gpu-a",validation="v2",verdict="Fail",simulated="true"} 1.0"#), "{text}");
        assert!(
            text.contains(r#"gpuval_p2p_gbps{node="gpu-a",src="0",dst="1"} 390.5"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"gpuval_node_last_validated_timestamp_seconds{node="gpu-a"} 1795421100.0"#
            ),
            "{text}"
        );
        assert_eq!(text.matches("gpuval_node_verdict{").count(), 1, "{text}");
        assert!(m.fleet.has_newer_or_same("gpu-a", "u1", 10));
        assert!(!m.fleet.has_newer_or_same("gpu-a", "u3", 30));
        m.fleet.retain_nodes(|n| n != "gpu-a");
        let text = m.encode();
        assert!(
            !text.contains("gpu-a"),
            "a node that left has no series: {text}"
        );
        assert!(text.contains("gpuval_fleet_nodes{} 0.0"), "{text}");
    }

    #[test]
    fn figures_are_held_in_16_bytes_with_their_qualifiers() {
        assert_eq!(std::mem::size_of::<HeldFigure>(), 16);
        let gpu = |q: &str, kind| Figure {
            scope: Scope::Gpu {
                index: 3,
                uuid: "GPU-x".into(),
                model: "NVIDIA H200".into(),
            },
            kind,
            qualifier: q.into(),
            value: 1.5,
        };
        let held = HeldFigure::of(&gpu("fp16", Kind::Tflops)).unwrap();
        assert_eq!(
            (held.on, held.qualifier(), held.value),
            (On::Gpu(3), "fp16", 1.5)
        );
        assert_eq!(
            HeldFigure::of(&gpu("d2h", Kind::HostGbps))
                .unwrap()
                .qualifier(),
            "d2h"
        );
        assert_eq!(
            HeldFigure::of(&gpu("", Kind::MemoryGbps))
                .unwrap()
                .qualifier(),
            ""
        );
        assert_eq!(
            HeldFigure::of(&gpu("fp99", Kind::Tflops)),
            None,
            "an unknown word"
        );
        let pair = |q: &str| Figure {
            scope: Scope::Pair { src: 0, dst: 300 },
            kind: Kind::P2pGbps,
            qualifier: q.into(),
            value: 1.0,
        };
        assert_eq!(
            HeldFigure::of(&pair("unidirectional")),
            None,
            "GPU 300 cannot be held"
        );
        let pair = Figure {
            scope: Scope::Pair { src: 0, dst: 1 },
            ..pair("bidirectional")
        };
        assert_eq!(
            HeldFigure::of(&pair),
            None,
            "bidirectional p2p is not exported"
        );
    }
}
