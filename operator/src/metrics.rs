//! Prometheus metrics, served at `/metrics`.

use gpuval_crds::{NodeVerdict, Phase};
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
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
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
}
