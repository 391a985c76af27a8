//! Host transfers on the simulated backend (tests and demos only).
use std::collections::BTreeMap;

use super::{DirectionRates, HostTransferOutcome, HostTransferRequest};
use crate::backend::BackendError;
use crate::backend::sim::{SimBackend, SimCheck, jitter, listed};
use crate::run_control::RunControl;

impl SimBackend {
    pub(crate) fn host_transfer(
        &self,
        gpus: &[u32],
        req: &HostTransferRequest,
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
                    }
                });
                (g, r)
            })
            .collect()
    }
}
