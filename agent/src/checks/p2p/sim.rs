//! The peer-to-peer check on the simulated backend (tests and demos only).
use super::{P2pOutcome, P2pRequest, PairOutcome, measuring_order};
use crate::backend::BackendError;
use crate::backend::sim::{SimBackend, SimCheck, jitter, listed, spend};
use crate::run_control::RunControl;

impl SimBackend {
    pub(crate) fn p2p(
        &self,
        gpus: &[u32],
        req: &P2pRequest,
        ctl: &RunControl<'_>,
    ) -> Result<P2pOutcome, BackendError> {
        for &g in gpus {
            self.begin(SimCheck::P2p, g)?;
        }
        spend(ctl, self.short_wall(), |done| done, "peer-to-peer pairs")?;
        let (uni, bidi, copy_us, load_ns) = self.spec.model.p2p();
        let pairs: Vec<PairOutcome> = measuring_order(gpus.len(), req.seed)
            .into_iter()
            .map(|(a, b)| {
                let (src, dst) = (gpus[a], gpus[b]);
                let slow =
                    self.spec.slowdown(SimCheck::P2p, src) * self.spec.slowdown(SimCheck::P2p, dst);
                let wobble = 1.0 + 0.005 * jitter(src * 64 + dst, 20);
                let fail = listed(&self.spec.fail, SimCheck::P2p, src)
                    || listed(&self.spec.fail, SimCheck::P2p, dst);
                PairOutcome {
                    src,
                    dst,
                    peer_access: true,
                    unidirectional_gbps: uni * slow * wobble,
                    bidirectional_gbps: bidi * slow * wobble,
                    copy_latency_us: copy_us / slow.max(0.01),
                    load_latency_ns: Some(load_ns / slow.max(0.01)),
                    staged_unidirectional_gbps: req.host_staged.then_some(37.5 * wobble),
                    staged_bidirectional_gbps: req.host_staged.then_some(41.0 * wobble),
                    mismatches: if fail { 12 } else { 0 },
                    error: None,
                }
            })
            .collect();
        ctl.progress(1.0, &format!("{} pairs", pairs.len()));
        Ok(P2pOutcome {
            seconds: pairs.len() as f64 * 0.2,
            pairs,
        })
    }
}
