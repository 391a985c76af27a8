//! Prometheus metrics, served at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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
        Self {
            registry,
            reconciles,
            reconcile_errors,
            validations,
            node_verdicts,
            pods_created,
        }
    }
}

impl Metrics {
    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
