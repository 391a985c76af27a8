//! The checks a plan asks for, as steps in their rows' order: measured in turn (a check asked to
//! run beside another on a thread beside it), judged, measured again where they fell short, and
//! held to bring a result back.

use gpuval_crds::NodeReport;

use super::Plan;
use super::row::{Pending, Row, Step, When};
use super::topology::{Topology, TopologyMeasured};
use crate::check::{JudgeNode, Measurement, NodeCheck, Stage};
use crate::run_control::RunControl;

/// The checks a plan asks for, each with its row.
pub struct Planned {
    steps: Vec<(&'static Row, Box<dyn Step>)>,
}

impl Planned {
    /// `simulated`: whether the GPU figures come from the simulated backend.
    pub fn new(plan: &Plan, simulated: bool) -> Self {
        let steps = plan
            .rows
            .iter()
            .filter_map(|row| (row.plan)(plan, simulated).map(|step| (*row, step)))
            .collect();
        Self { steps }
    }

    fn topology(&self) -> Option<&Topology> {
        self.steps.iter().find_map(|(_, s)| s.sampled_topology())
    }

    /// The first topology reading, taken before any check loads the GPUs (the runner's
    /// sampler re-reads it every [`Planned::resample_every`]).
    pub fn first_topology(&self, stage: &Stage<'_>) -> Option<Measurement<TopologyMeasured>> {
        let t = self.topology()?;
        let ctl = RunControl::new(stage.stop, &|_, _| {});
        Some(NodeCheck::measure(t, &stage.node_under(&ctl)))
    }

    /// How often the topology is re-read during the run.
    pub fn resample_every(&self) -> std::time::Duration {
        self.topology()
            .map_or(std::time::Duration::from_secs(30), Topology::resample_every)
    }

    /// Lets each check read what it needs before any check loads the GPUs.
    pub fn prepare(&mut self, stage: &Stage<'_>) {
        for (_, s) in &mut self.steps {
            s.prepare(stage);
        }
    }

    /// Measures the checks in their rows' order, each that asked to run beside another on a
    /// thread beside it (alone and last when that one did not run). A check after a stop
    /// request is not started, unless it sees the stop itself. `before` is called with the name
    /// of each check that loads the GPUs before it starts, while the agent runs nothing on them
    /// (the runner looks for other work then). Returns what judges each measurement.
    pub fn measure(&self, stage: &Stage<'_>, before: &dyn Fn(&str)) -> Vec<Pending<'_>> {
        let may_start = |s: &dyn Step| !stage.stopped() || s.starts_after_stop();
        let mut pending = Vec::new();
        let mut measured = vec![false; self.steps.len()];
        for (i, (_, step)) in self.steps.iter().enumerate() {
            if step.when() != When::InTurn || !may_start(step.as_ref()) {
                continue;
            }
            if step.loads_gpus() {
                before(step.name());
            }
            let beside: Vec<usize> = (0..self.steps.len())
                .filter(|&j| self.steps[j].1.when() == When::Beside(step.name()))
                .filter(|&j| may_start(self.steps[j].1.as_ref()))
                .collect();
            std::thread::scope(|s| {
                let threads: Vec<_> = beside
                    .iter()
                    .map(|&j| s.spawn(move || self.steps[j].1.measure(stage)))
                    .collect();
                pending.push(step.measure(stage));
                // Wait for the checks beside it here, so that none overlaps a later check.
                for (&j, t) in beside.iter().zip(threads) {
                    pending.push(t.join().unwrap_or_else(|_| self.steps[j].1.lost()));
                    measured[j] = true;
                }
            });
            measured[i] = true;
        }
        for (i, (_, step)) in self.steps.iter().enumerate() {
            let alone = matches!(step.when(), When::Beside(_)) && !measured[i];
            if alone && may_start(step.as_ref()) {
                if step.loads_gpus() {
                    before(step.name());
                }
                pending.push(step.measure(stage));
            }
        }
        pending
    }

    /// Judges what was measured into `report`, whose `gpus` (one per GPU of `on.gpus`, in
    /// order) already exist.
    pub fn judge(on: &JudgeNode<'_>, pending: Vec<Pending<'_>>, report: &mut NodeReport) {
        for p in pending {
            p(on, report);
        }
    }

    /// Judges the topology measured at the start (with what the sampler's re-reads found).
    pub fn judge_topology(
        &self,
        on: &JudgeNode<'_>,
        measured: Option<Measurement<TopologyMeasured>>,
        report: &mut NodeReport,
    ) {
        if let (Some(t), Some(m)) = (self.topology(), measured) {
            t.judge(on, m, report);
        }
    }

    /// A check that was asked for and produced no result for a GPU (or for the node) gets an
    /// Error result saying so: a measurement that is missing is never a pass.
    pub fn require_results(&self, report: &mut NodeReport) {
        for (row, _) in &self.steps {
            row.slot.fill_missing(report, row.name);
        }
    }

    /// Measures again, once, each check whose results fell short on performance alone, on
    /// `stage` (the same GPUs), and judges it like the first time; a result that fell short on
    /// performance alone takes the second measurement's, with a note that says so
    /// ([`super::remeasure`]). The overrides apply first: a figure whose code the spec lowered
    /// below Fail is not measured again. Returns the names of the checks measured again.
    pub fn remeasure(
        &self,
        stage: &Stage<'_>,
        on: &JudgeNode<'_>,
        report: &mut NodeReport,
    ) -> Vec<&'static str> {
        super::apply_overrides(report, &on.judge.overrides);
        self.steps
            .iter()
            .filter(|(_, s)| s.remeasure(stage, on, report))
            .map(|(_, s)| s.name())
            .collect()
    }

    /// The checks that do not load the GPUs, alone, judged into `report`: for a node whose
    /// GPUs could not be inventoried.
    pub fn without_gpus(&self, stage: &Stage<'_>, on: &JudgeNode<'_>, report: &mut NodeReport) {
        for (_, s) in self.steps.iter().filter(|(_, s)| !s.loads_gpus()) {
            s.measure(stage)(on, report);
        }
    }
}
