//! The peer-to-peer check: every ordered GPU pair after a warm-up, in shuffled order:
//! unidirectional and bidirectional copy bandwidth (every copy verified), copy and load
//! latency, optionally host-staged copies, and the NVLink error counters before and after.

mod cuda;
mod judge;
mod link_errors;
mod render;
pub mod row;
mod sim;

pub use link_errors::{LINK_ERROR_WARN, LinkErrorMoves};
pub use render::{headline, section};

crate::check_result!(gpuval_crds::P2pResult);

use std::collections::HashMap;

use gpuval_crds::{NodeReport, P2pCheck, P2pResult};

use crate::backend::{Backend, GpuInfo};
use crate::check::given;
use crate::check::{JudgeNode, Measurement, NodeCheck, OnNode};
use crate::checks::host::Host;
use crate::judge::Judge;
use crate::link_floors::LinkFacts;

const MIB: u64 = 1024 * 1024;

/// Peer-to-peer check parameters for a set of GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct P2pRequest {
    /// Bytes per copy.
    pub buffer_bytes: u64,
    /// Timed copies per sample; the figure is the median of [`P2pRequest::samples`] samples.
    pub iterations: u32,
    pub samples: u32,
    /// Small (4-byte) copies timed back to back for the copy-engine latency.
    pub latency_copies: u32,
    /// Dependent loads in the device-side pointer chase.
    pub chase_steps: u32,
    /// Also measure every pair with peer access off (copies staged through host memory).
    pub host_staged: bool,
    /// Seed of the pair order (shuffled so a slow pair is not always measured at the same
    /// moment of the run).
    pub seed: u64,
}

/// What one ordered pair (`src` sends to `dst`) measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PairOutcome {
    pub src: u32,
    pub dst: u32,
    /// Peer access was possible and enabled (otherwise the driver stages copies through host
    /// memory and the device-side latency is not measured).
    pub peer_access: bool,
    /// `src → dst`, issued on the source GPU's copy engine, GB/s (1e9).
    pub unidirectional_gbps: f64,
    /// `src → dst` and `dst → src` at once, one stream each, sum of both directions.
    pub bidirectional_gbps: f64,
    /// One 4-byte copy, averaged over back-to-back copies, microseconds.
    pub copy_latency_us: f64,
    /// One dependent load by `dst` from `src`'s memory (pointer chase), nanoseconds.
    pub load_latency_ns: Option<f64>,
    /// The same copies with peer access off (host-staged), when asked for.
    pub staged_unidirectional_gbps: Option<f64>,
    pub staged_bidirectional_gbps: Option<f64>,
    /// 32-bit words that arrived wrong, over every verified copy.
    pub mismatches: u64,
    /// Why this pair could not be measured; the other pairs go on.
    pub error: Option<String>,
}

/// What the peer-to-peer check measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct P2pOutcome {
    /// In the order they were measured.
    pub pairs: Vec<PairOutcome>,
    pub seconds: f64,
}

/// Fisher–Yates with a small xorshift generator: the order is reproducible from the seed.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut x = seed | 1;
    for i in (1..items.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// The order `n` GPUs' pairs are measured in: every ordered pair of positions `(src, dst)`,
/// shuffled by `seed`.
pub fn measuring_order(n: usize, seed: u64) -> Vec<(usize, usize)> {
    let mut order: Vec<(usize, usize)> = (0..n)
        .flat_map(|a| (0..n).filter(move |b| *b != a).map(move |b| (a, b)))
        .collect();
    shuffle(&mut order, seed);
    order
}

/// The peer-to-peer check as its spec asks for it.
pub struct P2p {
    pub spec: P2pCheck,
    pub request: P2pRequest,
}

impl P2p {
    /// `seed` orders the pairs (None: a new order each run).
    pub fn from_spec(spec: &P2pCheck, seed: Option<u64>) -> Self {
        Self {
            spec: spec.clone(),
            request: P2pRequest {
                buffer_bytes: u64::try_from(spec.buffer_mib.max(1)).unwrap_or(1) * MIB,
                iterations: u32::try_from(spec.iterations.max(1)).unwrap_or(1),
                samples: 3,
                latency_copies: 100,
                chase_steps: 20_000,
                host_staged: spec.host_staged,
                seed: seed.unwrap_or_else(clock_seed),
            },
        }
    }
}

/// What the check measured: the pairs and how the NVLink error counters moved meanwhile.
#[derive(Debug, Default)]
pub struct P2pMeasured {
    pub pairs: P2pOutcome,
    pub link_errors: LinkErrorMoves,
    /// The node's NVLink and PCIe links, where the floors come from when no profile has them.
    pub facts: LinkFacts,
}

impl NodeCheck for P2p {
    const NAME: &'static str = "p2p";
    type Outcome = P2pMeasured;

    fn skipped(&self, gpus: &[GpuInfo]) -> Option<(&'static str, P2pMeasured)> {
        (gpus.len() < 2).then(|| ("fewer than two GPUs", P2pMeasured::default()))
    }

    fn measure(&self, on: &OnNode<'_>) -> Measurement<P2pMeasured> {
        let &OnNode { backend, gpus, ctl } = on;
        let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
        let platform = backend.platform();
        let before: HashMap<u32, _> = indices
            .iter()
            .filter_map(|&g| platform.nvlink_errors(g).ok().map(|e| (g, e)))
            .collect();
        let pairs = match backend {
            Backend::Cuda(b) => b.p2p(&indices, &self.request, ctl),
            Backend::Simulated(b) => b.p2p(&indices, &self.request, ctl),
        }?;
        let mut link_errors = LinkErrorMoves::default();
        for &g in &indices {
            if let (Some(b), Ok(a)) = (before.get(&g), platform.nvlink_errors(g)) {
                link_errors.add(g, b, &a);
            }
        }
        let facts = platform
            .topology()
            .map(|t| LinkFacts::from_readings(&t, &Host::read_baseline(backend, gpus)))
            .unwrap_or_default();
        Ok(P2pMeasured {
            pairs,
            link_errors,
            facts,
        })
    }

    fn judge(&self, on: &JudgeNode<'_>, measured: Measurement<P2pMeasured>, into: &mut NodeReport) {
        into.p2p = Some(match measured {
            Ok(m) => on
                .judge
                .p2p(on.gpus, &m.pairs, &self.spec, &m.link_errors, &m.facts),
            Err(e) => P2pResult {
                buffer_mib: self.spec.buffer_mib,
                iterations: self.spec.iterations,
                ..Judge::errored(&e)
            },
        });
    }
}

/// A seed that differs from run to run.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

/// Command-line flags of the peer-to-peer check.
#[derive(clap::Args, Debug, Clone, Default)]
#[group(skip)]
pub struct Flags {
    /// Peer-to-peer copy size in MiB.
    #[arg(long)]
    pub p2p_buffer_mib: Option<i32>,
    /// Peer-to-peer timed copies per sample.
    #[arg(long)]
    pub p2p_iterations: Option<i32>,
    /// Also measure every pair with peer access off (host-staged copies).
    #[arg(long)]
    pub host_staged: bool,
}

impl Flags {
    /// Applies the flags that were given to the check's settings.
    pub fn apply(&self, spec: &mut P2pCheck) {
        let Self {
            p2p_buffer_mib,
            p2p_iterations,
            host_staged,
        } = self;
        given(&mut spec.buffer_mib, p2p_buffer_mib);
        given(&mut spec.iterations, p2p_iterations);
        spec.host_staged |= *host_staged;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_is_a_reproducible_permutation() {
        let mut a: Vec<u32> = (0..56).collect();
        let mut b = a.clone();
        shuffle(&mut a, 7);
        shuffle(&mut b, 7);
        assert_eq!(a, b);
        assert_ne!(a, (0..56).collect::<Vec<_>>(), "the order should change");
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..56).collect::<Vec<_>>());
    }
}
