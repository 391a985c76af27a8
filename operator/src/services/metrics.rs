//! Prometheus metrics, served at `/metrics`: the operator's own counters, and the fleet's
//! figures ([`Fleet`]): per GPU, per GPU pair and per node, from each node's latest result.
//!
//! Series of the fleet's figures, per node of G GPUs that ran every check: per GPU, memory 1,
//! TFLOP/s one per dtype burned (up to 4), host 2 and verdict 1; per ordered pair, p2p
//! unidirectional 1 (G·(G−1)); per node, verdict 1, last-validated time 1, NCCL bus
//! bandwidth one per collective (up to 5) and training throughput 1. A node of 8 GPUs:
//! 64 + 56 + 8 = 128 series at most, so a fleet of 10,000 GPUs (1,250 such nodes) costs about
//! 160,000 series, and nothing grows
//! with the number of runs: a node keeps only its latest result's series, and a node that
//! leaves the cluster loses its series. A node's figures are held compactly ([`HeldFigure`]:
//! 16 bytes each, the GPUs' UUIDs and models once per node), about 2.5 KB for such a node.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpuval_crds::{Evidence, NodeVerdict, Phase, Verdict};
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
    /// `true` for validations whose results came from the simulated backend.
    pub simulated: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    pub verdict: String,
    /// `true` for verdicts of validations whose results came from the simulated backend.
    pub simulated: String,
}

/// Every metric the operator exports.
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Counter,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub validations: Family<PhaseLabels, Gauge>,
    pub node_verdicts: Family<VerdictLabels, Counter>,
    pub pods_created: Counter,
    /// Heap in use (set at each scrape from [`crate::services::heap::in_use`]).
    pub heap_bytes: Gauge,
    /// The figures of each node's latest result.
    pub fleet: std::sync::Arc<Fleet>,
    /// The InfiniBand/RoCE ports of each node's latest fabric test.
    pub ports: std::sync::Arc<crate::services::port_metrics::FabricPorts>,
    /// The length of the last scrape's text.
    last_len: AtomicUsize,
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
        let ports = std::sync::Arc::new(crate::services::port_metrics::FabricPorts::default());
        registry.register_collector(Box::new(ports.clone()));
        Self {
            fleet,
            ports,
            registry,
            reconciles,
            reconcile_errors,
            validations,
            node_verdicts,
            pods_created,
            heap_bytes,
            last_len: AtomicUsize::new(0),
        }
    }
}

impl Metrics {
    /// Counts final node verdicts just reached (a step's `new_verdicts`, once its status is
    /// written), of a validation whose results are `simulated` or not.
    pub fn count_new_verdicts(&self, verdicts: &[NodeVerdict], simulated: bool) {
        for v in verdicts {
            self.node_verdicts
                .get_or_create(&VerdictLabels {
                    verdict: v.as_str().to_string(),
                    simulated: bool_str(simulated).to_string(),
                })
                .inc();
        }
    }

    /// Sets the validations-by-phase gauge from every validation's (phase, simulated) (a
    /// validation without a phase counts as Pending); every phase is exported, zero included,
    /// for real and simulated validations apart.
    pub fn set_phases(&self, phases: impl IntoIterator<Item = (Option<Phase>, bool)>) {
        let phases: Vec<(Phase, bool)> = phases
            .into_iter()
            .map(|(p, s)| (p.unwrap_or_default(), s))
            .collect();
        for simulated in [false, true] {
            for phase in Phase::ALL {
                let n = phases.iter().filter(|p| **p == (phase, simulated)).count();
                self.validations
                    .get_or_create(&PhaseLabels {
                        phase: phase.as_str().to_string(),
                        simulated: bool_str(simulated).to_string(),
                    })
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        self.heap_bytes
            .set(i64::try_from(crate::services::heap::in_use()).unwrap_or(i64::MAX));
        // Sized like the last scrape's text, so a fleet's megabytes are not grown by doubling.
        let mut out = String::with_capacity(self.last_len.load(Ordering::Relaxed));
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        self.last_len.store(out.len(), Ordering::Relaxed);
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
    /// What kind of evidence it is: a pass, or a failure whose codes are the hardware's, is
    /// [`Evidence::Hardware`]; a busy GPU, infrastructure or configuration is not.
    pub evidence: Evidence,
    /// When the node's last hardware evidence was reached (unix seconds): this result's
    /// `finished` when it is hardware evidence, else the one held before it. A busy GPU or a
    /// run that failed to start never refreshes it.
    pub last_evidence: Option<f64>,
    /// The node's final line in the result's validation, where it is other than a pass
    /// ([`final_verdicts`]): the verdict and evidence exported, not the result's own.
    pub line: Option<(Verdict, Evidence)>,
}

impl NodeLatest {
    /// The verdict exported: the node's final line where it is no pass, else the result's.
    pub fn shown(&self) -> Verdict {
        self.shown_line().0
    }

    /// The verdict and evidence exported: the node's final line where it is no pass, else the
    /// result's.
    pub fn shown_line(&self) -> (Verdict, Evidence) {
        self.line
            .filter(|(v, _)| !v.passes())
            .unwrap_or((self.verdict, self.evidence))
    }
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
        let finished = report
            .finished_at
            .parse::<k8s_openapi::jiff::Timestamp>()
            .ok()
            .map(|t| t.as_millisecond() as f64 / 1000.0);
        let evidence = evidence_of(report);
        Self {
            validation: validation.to_string(),
            result_uid: uid.to_string(),
            created,
            verdict: report.verdict,
            finished,
            evidence,
            last_evidence: finished.filter(|_| evidence == Evidence::Hardware),
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
            line: None,
        }
    }
}

/// What kind of evidence `report` is: a pass is the hardware's; a finding, as its codes say
/// ([`Evidence::of_codes`]).
pub fn evidence_of(report: &gpuval_crds::NodeReport) -> Evidence {
    if report.verdict.passes() {
        Evidence::Hardware
    } else {
        Evidence::of_codes(&report.codes())
    }
}

/// The latest result's figures of every node, exported on each scrape, and the final lines of
/// the validations' status that say otherwise than their results (a node the fabric named, a
/// busy or infrastructure line): a line and the result it is about may arrive in either order.
#[derive(Debug, Default)]
pub struct Fleet {
    held: Mutex<BTreeMap<String, NodeLatest>>,
    /// Node -> (validation, its final line's verdict and evidence there), the latest status
    /// write's.
    lines: Mutex<BTreeMap<String, (String, Verdict, Evidence)>>,
    /// When each node's verdict record says its last hardware verdict was reached (unix
    /// seconds): the last-validated time of a node whose held result is no hardware evidence
    /// and came with none held before it (after a restart).
    recorded: Mutex<BTreeMap<String, f64>>,
}

impl Fleet {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, NodeLatest>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (String, Verdict, Evidence)>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, f64>> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that `node`'s verdict record was judged on hardware evidence reached at `at`
    /// (unix seconds): a held result without a time of its own takes it.
    pub fn note_evidence(&self, node: &str, at: f64) {
        self.recorded().insert(node.to_string(), at);
        if let Some(held) = self.lock().get_mut(node)
            && held.last_evidence.is_none()
        {
            held.last_evidence = Some(at);
        }
    }

    /// Keeps `latest` for `node` unless a result created later is already held, or `latest`
    /// is simulated and a real result is held (a simulated result never hides real figures).
    /// A final line already known for the node in the result's validation comes with it; a
    /// result that is no hardware evidence keeps the time of the node's last hardware evidence
    /// held before it (of the same kind, real or simulated).
    pub fn update(&self, node: &str, mut latest: NodeLatest) {
        latest.line = self
            .lines()
            .get(node)
            .filter(|(v, _, _)| *v == latest.validation)
            .map(|(_, verdict, evidence)| (*verdict, *evidence));
        let mut map = self.lock();
        let held = map.get(node);
        if held.is_none_or(|held| {
            held.created <= latest.created && (held.simulated || !latest.simulated)
        }) {
            if latest.last_evidence.is_none() {
                latest.last_evidence = held
                    .filter(|h| h.simulated == latest.simulated)
                    .and_then(|h| h.last_evidence)
                    .or_else(|| self.recorded().get(node).copied());
            }
            map.insert(node.to_string(), latest);
        }
    }

    /// Takes validation `validation`'s final lines as its status now says them (`lines`: each
    /// node with a final line, [`final_verdicts`]); a node it no longer lists goes back to its
    /// result's verdict. A node whose held result is that validation's is exported with its
    /// line's verdict: a node whose own checks passed but whose fabric failed is never
    /// exported as Pass.
    pub fn set_lines(&self, validation: &str, lines: &[(String, Verdict, Evidence)]) {
        let mut known = self.lines();
        known.retain(|node, (v, _, _)| v != validation || lines.iter().any(|(n, _, _)| n == node));
        for (node, verdict, evidence) in lines {
            known.insert(node.clone(), (validation.to_string(), *verdict, *evidence));
        }
        drop(known);
        for (node, held) in self.lock().iter_mut() {
            if held.validation == validation {
                held.line = lines
                    .iter()
                    .find(|(n, _, _)| n == node)
                    .map(|(_, v, e)| (*v, *e));
                if held
                    .line
                    .is_some_and(|(v, e)| !v.passes() && e == Evidence::Hardware)
                {
                    held.last_evidence = held.finished.or(held.last_evidence);
                }
            }
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
        self.lines().retain(|node, _| exists(node));
        self.recorded().retain(|node, _| exists(node));
    }
}

/// The final lines of validation `gv` whose status is now `status`, each node's as one
/// verdict ([`gpuval_crds::FinalLine::shown`]), for every node the status lists with a final
/// verdict or the fabric test named. Simulated results are read as they are (every series says
/// `simulated`).
pub fn final_verdicts(
    gv: &gpuval_crds::GpuValidation,
    status: &gpuval_crds::GpuValidationStatus,
) -> Vec<(String, Verdict, Evidence)> {
    let mut run = gv.clone();
    run.status = Some(status.clone());
    let trust = gpuval_crds::Trust {
        trust_simulated: true,
    };
    let named = status.fabric.iter().flat_map(|f| f.failed_nodes.iter());
    let mut nodes: Vec<&String> = status.nodes.iter().map(|l| &l.name).chain(named).collect();
    nodes.sort();
    nodes.dedup();
    nodes
        .into_iter()
        .filter_map(|node| {
            let line = gpuval_crds::final_line(&run, node, None, trust)?;
            Some((node.clone(), line.shown(None), line.evidence))
        })
        .collect()
}

/// The label pairs of one series, borrowed from the held node (nothing is copied per scrape).
type Pairs<'a, const N: usize> = [(&'static str, &'a str); N];

/// A GPU's labels (node, gpu, uuid, model), then `extra`.
type GpuLabels<'a, const N: usize> = (
    Pairs<'a, 1>,
    ([(&'static str, i32); 1], (Pairs<'a, 2>, Pairs<'a, N>)),
);

fn gpu_labels<'a, const N: usize>(
    node: &'a str,
    n: &'a NodeLatest,
    index: i32,
    extra: Pairs<'a, N>,
) -> GpuLabels<'a, N> {
    let (uuid, model) = n
        .gpus
        .iter()
        .find(|g| g.0 == index)
        .map(|g| (g.1.as_str(), g.2.as_str()))
        .unwrap_or_default();
    (
        [("node", node)],
        (
            [("gpu", index)],
            ([("uuid", uuid), ("model", model)], extra),
        ),
    )
}

/// Writes one gauge series.
fn series(
    family: &mut prometheus_client::encoding::MetricEncoder<'_>,
    labels: &impl EncodeLabelSet,
    value: f64,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(family.encode_family(labels)?)
}

/// Writes the series of the family `name` over every held node, straight from what each node
/// holds: a scrape allocates only its output, however many series the fleet has.
fn write_family(
    enc: &mut DescriptorEncoder<'_>,
    name: &'static str,
    help: &str,
    nodes: &BTreeMap<String, NodeLatest>,
) -> Result<(), std::fmt::Error> {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    if name == "fleet_nodes" {
        for simulated in [false, true] {
            let n = nodes.values().filter(|n| n.simulated == simulated).count();
            series(&mut family, &[("simulated", bool_str(simulated))], n as f64)?;
        }
        return Ok(());
    }
    for (node, n) in nodes {
        write_node(&mut family, name, node, n)?;
    }
    Ok(())
}

fn bool_str(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

/// Writes `node`'s series of the family `name`; every series carries `simulated` (true when
/// the figures come from the simulated backend: never about real hardware).
fn write_node(
    family: &mut prometheus_client::encoding::MetricEncoder<'_>,
    name: &'static str,
    node: &str,
    n: &NodeLatest,
) -> Result<(), std::fmt::Error> {
    let sim = [("simulated", bool_str(n.simulated))];
    match name {
        "node_verdict" => {
            let labels = [
                ("node", node),
                ("validation", n.validation.as_str()),
                ("verdict", n.shown().as_str()),
                ("evidence", n.shown_line().1.as_str()),
            ];
            return series(family, &(labels, sim), 1.0);
        }
        "node_last_validated_timestamp_seconds" => {
            return match n.last_evidence {
                Some(t) => series(family, &([("node", node)], sim), t),
                None => Ok(()),
            };
        }
        "gpu_verdict" => {
            for g in &n.gpus {
                let labels = gpu_labels(node, n, g.0, [("verdict", g.3.as_str())]);
                series(family, &(labels, sim), 1.0)?;
            }
            return Ok(());
        }
        _ => {}
    }
    for f in n.figures.iter().filter(|f| family_of(f) == Some(name)) {
        match f.on {
            On::Gpu(index) if f.kind == Kind::MemoryGbps => series(
                family,
                &(gpu_labels(node, n, index.into(), []), sim),
                f.value,
            )?,
            On::Gpu(index) => {
                let key = if f.kind == Kind::Tflops {
                    "dtype"
                } else {
                    "direction"
                };
                let labels = gpu_labels(node, n, index.into(), [(key, f.qualifier())]);
                series(family, &(labels, sim), f.value)?
            }
            On::Pair(src, dst) => {
                let labels = ([("node", node)], [("src", src), ("dst", dst)]);
                series(family, &(labels, sim), f.value)?
            }
            On::Node if f.kind == Kind::TrainingSamplesPerSecond => {
                series(family, &([("node", node)], sim), f.value)?
            }
            On::Node => {
                let labels = [("node", node), ("collective", f.qualifier())];
                series(family, &(labels, sim), f.value)?
            }
        }
    }
    Ok(())
}

/// The family a held figure is exported in, if any.
fn family_of(f: &HeldFigure) -> Option<&'static str> {
    Some(match (f.on, f.kind) {
        (On::Gpu(_), Kind::MemoryGbps) => "gpu_memory_gbps",
        (On::Gpu(_), Kind::Tflops) => "gpu_tflops",
        (On::Gpu(_), Kind::HostGbps) => "gpu_host_gbps",
        (On::Pair(..), Kind::P2pGbps) => "p2p_gbps",
        (On::Node, Kind::NcclBusbwGbps) => "node_nccl_busbw_gbps",
        (On::Node, Kind::TrainingSamplesPerSecond) => "node_training_samples_per_second",
        _ => return None,
    })
}

/// Each fleet family (without the `gpuval_` prefix) and its help; dashboards and alerts may
/// name these.
pub const FLEET_FAMILIES: [(&str, &str); 10] = [
    (
        "node_verdict",
        "Verdict of the node's final line (1 for its verdict), with the kind of evidence it is (Hardware, Busy, Infrastructure, Configuration, Spec)",
    ),
    (
        "node_last_validated_timestamp_seconds",
        "When the node's last hardware evidence was reached (its agent finished), unix seconds: a busy GPU or infrastructure trouble never refreshes it",
    ),
    (
        "node_nccl_busbw_gbps",
        "NCCL bus bandwidth at the largest size, GB/s, by collective",
    ),
    (
        "node_training_samples_per_second",
        "Training step throughput over every GPU of the node, samples/s",
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
        for (name, help) in FLEET_FAMILIES {
            let exported =
                name == "fleet_nodes" || nodes.values().any(|n| node_has_family(n, name));
            if exported {
                write_family(&mut enc, name, help, &nodes)?;
            }
        }
        Ok(())
    }
}

/// True when `n` has a series in the family `name` (a family without series is left out).
fn node_has_family(n: &NodeLatest, name: &str) -> bool {
    match name {
        "node_verdict" => true,
        "node_last_validated_timestamp_seconds" => n.last_evidence.is_some(),
        "gpu_verdict" => !n.gpus.is_empty(),
        _ => n.figures.iter().any(|f| family_of(f) == Some(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn metric_labels_use_the_api_names() {
        let m = Metrics::default();
        m.count_new_verdicts(&[NodeVerdict::DeadlineExceeded, NodeVerdict::Passed], false);
        m.count_new_verdicts(&[NodeVerdict::Passed], true);
        m.set_phases([
            (Some(Phase::Running), false),
            (None, false),
            (Some(Phase::Running), false),
            (Some(Phase::Passed), true),
        ]);
        let text = m.encode();
        for want in [
            r#"gpuval_node_verdicts_total{verdict="DeadlineExceeded",simulated="false"} 1"#,
            r#"gpuval_node_verdicts_total{verdict="Passed",simulated="true"} 1"#,
            r#"gpuval_validations{phase="Running",simulated="false"} 2"#,
            r#"gpuval_validations{phase="Pending",simulated="false"} 1"#,
            r#"gpuval_validations{phase="Failed",simulated="false"} 0"#,
            r#"gpuval_validations{phase="Passed",simulated="true"} 1"#,
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
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
    fn every_check_s_figures_are_exported_in_the_families_its_views_name() {
        let exported: Vec<&str> = FLEET_FAMILIES.iter().map(|(n, _)| *n).collect();
        for c in gpuval_view::checks::CHECK_VIEWS {
            for family in c.metric_families {
                assert!(
                    exported.contains(family),
                    "{}: {family} is not exported",
                    c.section
                );
            }
            for kind in c.figures {
                let scope = match kind {
                    Kind::P2pGbps => Scope::Pair { src: 0, dst: 1 },
                    Kind::NcclBusbwGbps | Kind::TrainingSamplesPerSecond => Scope::Node,
                    Kind::MemoryGbps | Kind::Tflops | Kind::HostGbps => Scope::Gpu {
                        index: 0,
                        uuid: "GPU-a".into(),
                        model: "NVIDIA H200".into(),
                    },
                };
                let qualifier = match kind {
                    Kind::P2pGbps => "unidirectional",
                    Kind::Tflops => "bf16",
                    Kind::HostGbps => "h2d",
                    Kind::NcclBusbwGbps => "allReduce",
                    Kind::MemoryGbps | Kind::TrainingSamplesPerSecond => "",
                };
                let figure = Figure {
                    scope,
                    kind: *kind,
                    qualifier: qualifier.into(),
                    value: 1.0,
                };
                let held = HeldFigure::of(&figure).expect("held");
                let family = family_of(&held).unwrap_or_else(|| panic!("{kind:?} is not exported"));
                assert!(
                    c.metric_families.contains(&family),
                    "{}: {family}",
                    c.section
                );
            }
        }
    }

    #[test]
    fn a_node_exports_its_training_throughput() {
        let m = Metrics::default();
        let mut r = report(4300.0, Verdict::Pass);
        r.training = Some(gpuval_crds::TrainingResult {
            figures: Some(gpuval_crds::TrainingFigures {
                samples_per_second: 38.5,
                ..Default::default()
            }),
            ..Default::default()
        });
        m.fleet
            .update("gpu-a", NodeLatest::from_report("v1", "u1", 10, &r));
        let text = m.encode();
        assert!(
            text.contains(
                r#"gpuval_node_training_samples_per_second{node="gpu-a",simulated="true"} 38.5"#
            ),
            "{text}"
        );
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
            text.contains(&format!(
                "gpuval_gpu_memory_gbps{{{gpu},simulated=\"true\"}} 3900.0"
            )),
            "{text}"
        );
        assert!(text.contains(r#"gpuval_node_verdict{node="gpu-a",validation="v2",verdict="Fail",evidence="Hardware",simulated="true"} 1.0"#), "{text}");
        assert!(
            text.contains(
                r#"gpuval_p2p_gbps{node="gpu-a",src="0",dst="1",simulated="true"} 390.5"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"gpuval_node_last_validated_timestamp_seconds{node="gpu-a",simulated="true"} 1795421100.0"#
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
        assert!(
            text.contains(r#"gpuval_fleet_nodes{simulated="false"} 0.0"#),
            "{text}"
        );
    }

    #[test]
    fn every_fleet_series_says_whether_it_is_simulated_and_a_simulated_result_never_hides_a_real_one()
     {
        let m = Metrics::default();
        let mut real = NodeLatest::from_report("real", "u1", 10, &report(4300.0, Verdict::Pass));
        real.simulated = false;
        m.fleet.update("gpu-a", real);
        m.fleet.update(
            "gpu-a",
            NodeLatest::from_report("demo", "u2", 20, &report(1.0, Verdict::Fail)),
        );
        m.fleet.update(
            "gpu-b",
            NodeLatest::from_report("demo", "u3", 20, &report(1.0, Verdict::Pass)),
        );
        let text = m.encode();
        assert!(
            text.contains(
                r#"validation="real",verdict="Pass",evidence="Hardware",simulated="false""#
            ),
            "{text}"
        );
        assert!(
            !text.contains(r#"validation="demo",verdict="Fail""#),
            "{text}"
        );
        for line in text
            .lines()
            .filter(|l| l.starts_with("gpuval_") && l.contains("node="))
        {
            assert!(line.contains("simulated=\""), "{line}");
        }
        assert!(
            text.contains(r#"gpuval_fleet_nodes{simulated="false"} 1.0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"gpuval_fleet_nodes{simulated="true"} 1.0"#),
            "{text}"
        );
    }

    /// A node whose own checks passed but which the fabric named is exported as Fail: its final
    /// line's verdict, not its result's; another validation's naming does not touch it.
    #[test]
    fn a_node_the_fabric_named_is_exported_as_failed_not_as_its_results_pass() {
        let m = Metrics::default();
        for node in ["vm-2", "vm-3"] {
            let mut l = NodeLatest::from_report("fab", node, 10, &report(4300.0, Verdict::Pass));
            l.simulated = false;
            m.fleet.update(node, l);
        }
        m.fleet.set_lines(
            "other",
            &[("vm-2".to_string(), Verdict::Fail, Evidence::Hardware)],
        );
        m.fleet.set_lines(
            "fab",
            &[
                ("vm-3".to_string(), Verdict::Fail, Evidence::Hardware),
                ("gone".to_string(), Verdict::Fail, Evidence::Hardware),
            ],
        );
        let text = m.encode();
        let verdict_of = |node: &str| {
            text.lines()
                .find(|l| l.starts_with("gpuval_node_verdict{") && l.contains(node))
                .map(str::to_string)
                .unwrap_or_default()
        };
        assert!(verdict_of("vm-3").contains(r#"verdict="Fail""#), "{text}");
        assert!(verdict_of("vm-2").contains(r#"verdict="Pass""#), "{text}");
    }

    /// Staleness counts from the last hardware evidence: a busy GPU's result (or any other
    /// finding that is not the hardware's) never refreshes the node's last-validated time, and
    /// its Error verdict is exported as busy, which the failure alert does not match.
    #[test]
    fn a_busy_result_never_refreshes_the_last_validated_time() {
        let m = Metrics::default();
        let mut pass = report(4300.0, Verdict::Pass);
        pass.simulated = false;
        m.fleet
            .update("gpu-a", NodeLatest::from_report("v1", "u1", 10, &pass));
        let mut busy = report(0.0, Verdict::Error);
        busy.simulated = false;
        busy.finished_at = "2026-12-01T08:05:00Z".into();
        busy.failures = vec![gpuval_crds::Reason::new(
            gpuval_crds::Code::GpuBusy,
            "GPU0 busy: 70 GiB held",
        )];
        m.fleet
            .update("gpu-a", NodeLatest::from_report("v2", "u2", 20, &busy));
        let text = m.encode();
        let pass_at = pass
            .finished_at
            .parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap()
            .as_second();
        assert!(
            text.contains(&format!(
                r#"gpuval_node_last_validated_timestamp_seconds{{node="gpu-a",simulated="false"}} {pass_at}.0"#
            )),
            "{text}"
        );
        assert!(
            text.contains(r#"gpuval_node_verdict{node="gpu-a",validation="v2",verdict="Error",evidence="Busy",simulated="false"} 1.0"#),
            "{text}"
        );
        // After a restart the busy result is the first held: the node's record gives the time.
        let restarted = Metrics::default();
        restarted
            .fleet
            .update("gpu-a", NodeLatest::from_report("v2", "u2", 20, &busy));
        assert!(
            !restarted
                .encode()
                .contains("gpuval_node_last_validated_timestamp_seconds{"),
            "no time before the record is read"
        );
        restarted.fleet.note_evidence("gpu-a", pass_at as f64);
        assert!(
            restarted.encode().contains(&format!(
                r#"gpuval_node_last_validated_timestamp_seconds{{node="gpu-a",simulated="false"}} {pass_at}.0"#
            )),
            "from the record"
        );
        // The next hardware verdict moves it on.
        let mut fail = report(1.0, Verdict::Fail);
        fail.simulated = false;
        fail.finished_at = "2026-12-02T08:05:00Z".into();
        m.fleet
            .update("gpu-a", NodeLatest::from_report("v3", "u3", 30, &fail));
        let text = m.encode();
        assert!(
            text.contains(r#"gpuval_node_last_validated_timestamp_seconds{node="gpu-a",simulated="false"} 1796198700.0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"verdict="Fail",evidence="Hardware""#),
            "{text}"
        );
    }

    /// The metrics read the one final line: a fabric-named node is Fail and a busy line Error
    /// whichever of the status and the result comes first; a later status without the line
    /// gives the node back its result's verdict.
    #[test]
    fn metrics_read_the_final_line_whichever_comes_first() {
        let gv: gpuval_crds::GpuValidation = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
            "metadata": {"name": "fab", "generation": 1}, "spec": {"checks": {}},
        }))
        .expect("validation");
        let status: gpuval_crds::GpuValidationStatus = serde_json::from_value(serde_json::json!({
            "observedGeneration": 1, "phase": "Failed",
            "nodes": [{"name": "vm-1", "verdict": "Error", "evidence": "Busy", "result": "fab-vm-1"},
                      {"name": "vm-4", "verdict": "Running"}],
            "fabric": {"phase": "Failed", "nodes": 3, "rounds": 2, "failedNodes": ["vm-3"]},
        }))
        .expect("status");
        let lines = final_verdicts(&gv, &status);
        assert_eq!(
            lines,
            vec![
                ("vm-1".to_string(), Verdict::Error, Evidence::Busy),
                ("vm-3".to_string(), Verdict::Fail, Evidence::Hardware)
            ]
        );
        let m = Metrics::default();
        let held = |node: &str| {
            let mut l = NodeLatest::from_report("fab", node, 10, &report(4300.0, Verdict::Pass));
            l.simulated = false;
            l
        };
        m.fleet.update("vm-1", held("vm-1"));
        m.fleet.set_lines("fab", &lines);
        m.fleet.update("vm-3", held("vm-3"));
        m.fleet.update("vm-2", held("vm-2"));
        let verdict_of = |m: &Metrics, node: &str| {
            m.encode()
                .lines()
                .find(|l| l.starts_with("gpuval_node_verdict{") && l.contains(node))
                .map(str::to_string)
                .unwrap_or_default()
        };
        assert!(verdict_of(&m, "vm-1").contains(r#"verdict="Error""#));
        assert!(verdict_of(&m, "vm-3").contains(r#"verdict="Fail""#));
        assert!(verdict_of(&m, "vm-2").contains(r#"verdict="Pass""#));
        m.fleet.set_lines("fab", &[]);
        assert!(verdict_of(&m, "vm-3").contains(r#"verdict="Pass""#));
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
