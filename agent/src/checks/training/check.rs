//! The training check as the runner sees it: a [`NodeCheck`] over every GPU of the node (one
//! data-parallel group, one communicator).

use gpuval_crds::{NodeReport, TrainingCheck, TrainingResult, Verdict};

use super::judge::judge;
use super::outcome::TrainingOutcome;
use super::request::{Corruption, TrainingRequest};
use crate::backend::{Backend, BackendError, GpuInfo};
use crate::check::{JudgeNode, Measurement, NodeCheck, OnNode};
use crate::judge::{Judge, Says};

/// The training check as its spec asks for it.
pub struct Training {
    pub spec: TrainingCheck,
}

/// What the check measured, or why it had nothing to measure.
#[derive(Debug)]
pub enum TrainingMeasured {
    Ran(Box<TrainingOutcome>),
    Skipped(&'static str),
}

impl Training {
    pub fn from_spec(spec: &TrainingCheck) -> Self {
        Self { spec: spec.clone() }
    }
}

impl NodeCheck for Training {
    const NAME: &'static str = "training";
    type Outcome = TrainingMeasured;

    fn skipped(&self, gpus: &[GpuInfo]) -> Option<(&'static str, TrainingMeasured)> {
        let why = "fewer than two GPUs: data-parallel training needs at least two";
        (gpus.len() < 2).then_some((why, TrainingMeasured::Skipped(why)))
    }

    fn measure(&self, on: &OnNode<'_>) -> Measurement<TrainingMeasured> {
        let &OnNode { backend, gpus, ctl } = on;
        let mut req = TrainingRequest::from_spec(&self.spec);
        req.corrupt = Corruption::from_env().map_err(BackendError::Other)?;
        let outcome = match backend {
            Backend::Cuda(_) => super::child::run(gpus, &req, ctl),
            Backend::Simulated(b) => super::sim::run(b, gpus, &req, ctl),
        }?;
        Ok(TrainingMeasured::Ran(Box::new(outcome)))
    }

    /// The node's `training` result; a GPU whose replica diverged (or ran far slower than its
    /// peers) fails too.
    fn judge(
        &self,
        on: &JudgeNode<'_>,
        measured: Measurement<TrainingMeasured>,
        into: &mut NodeReport,
    ) {
        let hooks = planted_hooks();
        let result = match measured {
            Ok(TrainingMeasured::Ran(outcome)) => {
                let mut judged = judge(&self.spec, &outcome, on.judge.tolerance());
                for hook in &hooks {
                    crate::test_hooks::mark_planted(&mut judged.result.reasons, hook);
                    crate::test_hooks::mark_planted(judged.gpus.iter_mut().map(|g| &mut g.1), hook);
                }
                for (gpu, why) in judged.gpus {
                    if let Some(g) = into
                        .gpus
                        .iter_mut()
                        .find(|g| i32::try_from(gpu).ok() == Some(g.index))
                    {
                        g.verdict = g.verdict.max(Verdict::Fail);
                        crate::judge::push_unique(&mut g.reasons, [why]);
                    }
                }
                judged.result
            }
            Ok(TrainingMeasured::Skipped(why)) => TrainingResult {
                verdict: Verdict::Skipped,
                reasons: vec![crate::judge::Code::NotApplicable.says(why)],
                ..Default::default()
            },
            Err(e) => {
                let mut result: TrainingResult = Judge::errored(&e);
                for hook in &hooks {
                    crate::test_hooks::mark_planted(&mut result.reasons, hook);
                }
                result
            }
        };
        into.training = Some(result);
    }
}

/// `NAME=VALUE` of each planted-fault hook of this check that is set (built in and not blank).
fn planted_hooks() -> Vec<String> {
    [super::request::CORRUPT_ENV, super::engine::HANG_INIT_ENV]
        .into_iter()
        .filter_map(|name| crate::test_hooks::value(name).map(|v| format!("{name}={v}")))
        .collect()
}
