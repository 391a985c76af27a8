//! Host transfers on the simulated backend (tests and demos only): every link at the model's
//! PCIe generation, x16; `replay=N:K` adds K to GPU N's replay counter during the run.
use std::collections::BTreeMap;

use super::pcie::PcieOutcome;
use super::{Baseline, DirectionRates, HostTransferOutcome, HostTransferRequest};
use crate::backend::sim::{SimBackend, SimCheck, jitter, listed};
use crate::backend::{BackendError, PcieReading};
use crate::run_control::RunControl;

/// The replay counter of a simulated GPU when the run starts (since the driver loaded).
const REPLAYS_AT_START: u64 = 12;

impl SimBackend {
    /// GPU `gpu`'s PCIe reading at the start of the run, or at its end (`after`: with the
    /// planted replays added). None for a GPU that does not exist.
    pub(crate) fn pcie_reading(&self, gpu: u32, after: bool) -> Option<PcieReading> {
        if gpu >= self.spec.gpus {
            return None;
        }
        let gen_ = u32::try_from(self.spec.model.pcie_gen()).unwrap_or(0);
        let planted: u64 = self
            .spec
            .health
            .replay
            .iter()
            .filter(|(g, _)| *g == gpu)
            .map(|(_, n)| n)
            .sum();
        Some(PcieReading {
            link_gen: Some(gen_),
            link_width: Some(16),
            max_gen: Some(gen_),
            max_width: Some(16),
            gpu_max_gen: Some(gen_),
            replays: Some(REPLAYS_AT_START + if after { planted } else { 0 }),
            correctable: Some(0),
            nonfatal: Some(0),
            fatal: Some(0),
        })
    }

    pub(crate) fn host_transfer(
        &self,
        gpus: &[u32],
        req: &HostTransferRequest,
        baseline: &Baseline,
        _ctl: &RunControl<'_>,
    ) -> BTreeMap<u32, Result<HostTransferOutcome, BackendError>> {
        gpus.iter()
            .map(|&g| {
                let r = self.begin(SimCheck::Host, g).map(|_| {
                    let rate = self.spec.model.host_gbps()
                        * self.spec.slowdown(SimCheck::Host, g)
                        * (1.0 + 0.004 * jitter(g, 30));
                    let both = DirectionRates {
                        h2d_gbps: rate,
                        d2h_gbps: rate * 1.003,
                    };
                    let scaled = |f: f64| DirectionRates {
                        h2d_gbps: both.h2d_gbps * f,
                        d2h_gbps: both.d2h_gbps * f,
                    };
                    HostTransferOutcome {
                        pinned: req.pinned.then_some(both),
                        pageable: req.pageable.then(|| scaled(0.3)),
                        pinned_concurrent: (req.pinned && gpus.len() > 1).then(|| scaled(0.97)),
                        numa_node: Some(self.socket(g)),
                        mismatches: if listed(&self.spec.fail, SimCheck::Host, g) {
                            64
                        } else {
                            0
                        },
                        seconds: 1.0,
                        pcie: Some(PcieOutcome {
                            before: baseline
                                .get(&g)
                                .copied()
                                .or_else(|| self.pcie_reading(g, false)),
                            under_load: self.pcie_reading(g, true),
                            after: self.pcie_reading(g, true),
                        }),
                    }
                });
                (g, r)
            })
            .collect()
    }
}
