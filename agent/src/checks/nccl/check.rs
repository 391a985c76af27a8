//! The NCCL check as the runner sees it: a [`NodeCheck`] over every GPU of the node.

use std::path::PathBuf;

use gpuval_crds::{NcclCheck, NodeReport, Verdict};

use super::judge::{JudgeContext, errored, failed_gpus, judge, skipped};
use super::nvlink_between_all;
use crate::backend::sim::{FabricFault, SimBackend, SimCheck};
use crate::backend::{Backend, BackendError, GpuInfo};
use crate::check::{JudgeNode, Measurement, NodeCheck, OnNode};
use crate::checks::host::Host;
use crate::checks::topology;
use crate::link_floors::LinkFacts;
use crate::nccl::NcclOutcome;
use crate::nccl::request::NcclRequest;
use crate::nccl::sim::SimFault;
use crate::run_control::RunControl;

/// The NCCL check as its spec asks for it.
pub struct Nccl {
    pub spec: NcclCheck,
    /// Where NCCL's own logs are kept (none: they are removed with the run's directory).
    pub log_dir: Option<PathBuf>,
}

/// What the check measured, or why it had nothing to measure.
#[derive(Debug)]
pub enum NcclMeasured {
    Ran {
        outcome: Box<NcclOutcome>,
        /// The topology showed NVLink between every pair of the GPUs.
        nvlink: bool,
        /// The check's GPUs' links, for floors no profile covers.
        facts: LinkFacts,
    },
    Skipped(&'static str),
}

impl Nccl {
    pub fn from_spec(spec: &NcclCheck, log_dir: Option<PathBuf>) -> Self {
        Self {
            spec: spec.clone(),
            log_dir,
        }
    }
}

impl NodeCheck for Nccl {
    const NAME: &'static str = "nccl";
    type Outcome = NcclMeasured;

    fn skipped(&self, gpus: &[GpuInfo]) -> Option<(&'static str, NcclMeasured)> {
        let why = "fewer than two GPUs: collectives need at least two";
        (gpus.len() < 2).then_some((why, NcclMeasured::Skipped(why)))
    }

    fn measure(&self, on: &OnNode<'_>) -> Measurement<NcclMeasured> {
        let &OnNode { backend, gpus, ctl } = on;
        let mut req = NcclRequest::from_spec(&self.spec, gpus);
        req.log_dir = self.log_dir.clone();
        let snapshot = backend.platform().topology().ok();
        let nvlink = snapshot
            .as_ref()
            .is_some_and(|snap| nvlink_between_all(&topology::derive(snap)));
        let facts = snapshot
            .map(|t| {
                let mut f = LinkFacts::from_readings(&t, &Host::read_baseline(backend, gpus));
                f.gpus.retain(|g, _| gpus.iter().any(|x| x.index == *g));
                f
            })
            .unwrap_or_default();
        let outcome = match backend {
            Backend::Cuda(_) => crate::nccl::run(&req, ctl),
            Backend::Simulated(b) => simulated(b, gpus, &req, ctl),
        }?;
        Ok(NcclMeasured::Ran {
            outcome: Box::new(outcome),
            nvlink,
            facts,
        })
    }

    /// The node's `nccl` result; a GPU that received wrong elements fails too.
    fn judge(
        &self,
        on: &JudgeNode<'_>,
        measured: Measurement<NcclMeasured>,
        into: &mut NodeReport,
    ) {
        let profile = on
            .gpus
            .first()
            .and_then(|g| on.judge.profile_of(&g.name))
            .map(|p| p.name);
        let result = match measured {
            Ok(NcclMeasured::Ran {
                outcome,
                nvlink,
                facts,
            }) => {
                let cx = JudgeContext {
                    spec: &self.spec,
                    nvlink,
                    profile,
                    facts: &facts,
                    measured_p2p: measured_p2p(into),
                };
                judge(&cx, &outcome)
            }
            Ok(NcclMeasured::Skipped(why)) => skipped(&self.spec, why),
            Err(e) => errored(&self.spec, &e),
        };
        let mut result = result;
        if let Some(v) = crate::test_hooks::value(crate::nccl::engine::SKIP_RANK_ENV) {
            let hook = format!("{}={v}", crate::nccl::engine::SKIP_RANK_ENV);
            crate::test_hooks::mark_planted(&mut result.reasons, &hook);
        }
        for gpu in failed_gpus(&result) {
            if let Some(g) = into.gpus.iter_mut().find(|g| g.index == gpu) {
                g.verdict = g.verdict.max(Verdict::Fail);
                let why = gpuval_crds::Reason::new(
                    gpuval_crds::Code::NcclWrongResult,
                    format!("GPU{gpu}: NCCL collectives delivered wrong elements"),
                );
                crate::judge::push_unique(&mut g.reasons, [why]);
            }
        }
        into.nccl = Some(result);
    }
}

/// The node's measured p2p one-way median in this run, where the p2p check passed: the rate
/// NCCL's bus bandwidth is held to when no profile floor covers the node.
fn measured_p2p(report: &NodeReport) -> Option<f64> {
    let p2p = report.p2p.as_ref().filter(|r| r.verdict == Verdict::Pass)?;
    crate::judge::median(
        p2p.pairs
            .iter()
            .filter(|p| p.error.is_none() && p.unidirectional_gbps > 0.0)
            .map(|p| p.unidirectional_gbps)
            .collect(),
    )
}

/// The check on the simulated node, with the faults its spec plants.
fn simulated(
    b: &SimBackend,
    gpus: &[GpuInfo],
    req: &NcclRequest,
    ctl: &RunControl<'_>,
) -> Result<NcclOutcome, BackendError> {
    for g in gpus {
        b.begin(SimCheck::Nccl, g.index)?;
    }
    let spec = &b.spec;
    let mut faults: Vec<SimFault> = gpus
        .iter()
        .filter(|g| crate::backend::sim::listed(&spec.fail, SimCheck::Nccl, g.index))
        .filter_map(|g| {
            let rank = gpus.iter().position(|x| x.index == g.index)?;
            Some(SimFault::WrongResult {
                rank: u32::try_from(rank).ok()?,
            })
        })
        .collect();
    let slow: f64 = gpus
        .iter()
        .map(|g| spec.slowdown(SimCheck::Nccl, g.index))
        .fold(1.0, f64::min);
    if slow < 1.0 {
        faults.push(SimFault::Slow(slow));
    }
    faults.extend(spec.fabric.iter().map(|f| match f {
        FabricFault::Hang => SimFault::Hang,
        FabricFault::Shm => SimFault::ShmFallback,
    }));
    crate::nccl::sim::run(spec.gpus, spec.model.as_str(), &faults, req, ctl)
}

#[cfg(test)]
mod tests {
    use gpuval_crds::{P2pPair, P2pResult};

    use super::*;

    fn with_p2p(verdict: Verdict, rates: &[f64]) -> NodeReport {
        NodeReport {
            p2p: Some(P2pResult {
                verdict,
                pairs: rates
                    .iter()
                    .map(|&r| P2pPair {
                        unidirectional_gbps: r,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Only a p2p check that passed speaks for the node's links; its median sets the floor.
    #[test]
    fn the_floor_source_is_the_median_of_a_passing_p2p_check() {
        assert_eq!(
            measured_p2p(&with_p2p(Verdict::Pass, &[390.0, 396.0, 392.0])),
            Some(392.0)
        );
        assert_eq!(
            measured_p2p(&with_p2p(Verdict::Fail, &[390.0, 396.0, 392.0])),
            None
        );
        assert_eq!(measured_p2p(&with_p2p(Verdict::Pass, &[])), None);
        assert_eq!(measured_p2p(&NodeReport::default()), None);
    }
}
