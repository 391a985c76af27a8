//! The key figures of a node report, flat: what the operator exports as metrics and what
//! [`crate::diff()`] compares. Every figure here is a rate (higher is better).

use gpuval_crds::{GpuReport, NcclSweep, NodeReport};
use serde::{Deserialize, Serialize};

/// What a figure is about.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub enum Scope {
    /// The node as a whole (NCCL runs one communicator over every GPU).
    Node,
    /// One GPU: NVML index, UUID and model name.
    Gpu {
        index: i32,
        uuid: String,
        model: String,
    },
    /// An ordered GPU pair, by NVML index.
    Pair { src: i32, dst: i32 },
}

/// The kind of a figure; each has one unit and at most one qualifier.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    /// Memory fill+verify, GB/s.
    MemoryGbps,
    /// Sustained GEMM TFLOP/s; qualifier: the dtype.
    Tflops,
    /// Pinned host transfers of this GPU alone, GB/s; qualifier: `h2d` or `d2h`.
    HostGbps,
    /// Peer-to-peer copy bandwidth, GB/s; qualifier: `unidirectional` or `bidirectional`.
    P2pGbps,
    /// NCCL bus bandwidth at the largest size of the default-transport sweep, GB/s;
    /// qualifier: the collective.
    NcclBusbwGbps,
    /// The training step's samples per second over every GPU of the node (with the all-reduce
    /// overlapping the backward pass).
    TrainingSamplesPerSecond,
}

impl Kind {
    /// The metric name part (`memory_gbps`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::MemoryGbps => "memory_gbps",
            Kind::Tflops => "tflops",
            Kind::HostGbps => "host_gbps",
            Kind::P2pGbps => "p2p_gbps",
            Kind::NcclBusbwGbps => "nccl_busbw_gbps",
            Kind::TrainingSamplesPerSecond => "training_samples_per_second",
        }
    }
    /// The unit as a person reads it.
    pub fn unit(self) -> &'static str {
        match self {
            Kind::Tflops => "TFLOP/s",
            Kind::TrainingSamplesPerSecond => "samples/s",
            Kind::MemoryGbps | Kind::HostGbps | Kind::P2pGbps | Kind::NcclBusbwGbps => "GB/s",
        }
    }
    /// What it measures, in words.
    pub fn words(self) -> &'static str {
        match self {
            Kind::MemoryGbps => "memory",
            Kind::Tflops => "GEMM",
            Kind::HostGbps => "host pinned",
            Kind::P2pGbps => "p2p",
            Kind::NcclBusbwGbps => "NCCL bus bandwidth",
            Kind::TrainingSamplesPerSecond => "training throughput",
        }
    }
}

/// One figure of one run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Figure {
    pub scope: Scope,
    pub kind: Kind,
    /// The dtype, direction or collective (empty for memory).
    pub qualifier: String,
    pub value: f64,
}

impl Figure {
    /// `GPU3 memory GB/s`, `GPU0->GPU1 p2p unidirectional GB/s`, `NCCL bus bandwidth allReduce GB/s`.
    pub fn describe(&self) -> String {
        let who = match &self.scope {
            Scope::Node => String::new(),
            Scope::Gpu { index, .. } => format!("GPU{index} "),
            Scope::Pair { src, dst } => format!("GPU{src}->GPU{dst} "),
        };
        let q = if self.qualifier.is_empty() {
            String::new()
        } else {
            format!(" {}", self.qualifier)
        };
        format!("{who}{}{q} {}", self.kind.words(), self.kind.unit())
    }
}

/// A figure of one GPU, before its scope is attached: kind, qualifier, value.
pub type GpuFigure = (Kind, &'static str, f64);

/// The memory check's figure of one GPU.
pub fn memory(g: &GpuReport) -> Vec<GpuFigure> {
    g.memory
        .iter()
        .map(|m| (Kind::MemoryGbps, "", m.gbps))
        .collect()
}

/// The compute check's figures of one GPU: TFLOP/s per dtype.
pub fn compute(g: &GpuReport) -> Vec<GpuFigure> {
    g.compute
        .iter()
        .flat_map(|c| &c.gemms)
        .map(|gemm| (Kind::Tflops, gemm.dtype.as_str(), gemm.tflops))
        .collect()
}

/// The host transfer check's figures of one GPU: pinned, each direction.
pub fn host(g: &GpuReport) -> Vec<GpuFigure> {
    let pinned = g.host_transfer.as_ref().and_then(|h| h.pinned);
    pinned
        .iter()
        .flat_map(|p| {
            [
                (Kind::HostGbps, "h2d", p.h2d_gbps),
                (Kind::HostGbps, "d2h", p.d2h_gbps),
            ]
        })
        .collect()
}

/// The peer-to-peer check's figures: each ordered pair, both directions.
pub fn p2p(report: &NodeReport) -> Vec<Figure> {
    let mut out = Vec::new();
    for p in report.p2p.iter().flat_map(|p| &p.pairs) {
        let scope = Scope::Pair {
            src: p.src,
            dst: p.dst,
        };
        for (q, v) in [
            ("unidirectional", p.unidirectional_gbps),
            ("bidirectional", p.bidirectional_gbps),
        ] {
            out.push(Figure {
                scope: scope.clone(),
                kind: Kind::P2pGbps,
                qualifier: q.into(),
                value: v,
            });
        }
    }
    out
}

/// The NCCL check's figures: bus bandwidth at the largest size of each collective.
pub fn nccl(report: &NodeReport) -> Vec<Figure> {
    let sweep = report.nccl.as_ref().and_then(|n| n.sweep.as_ref());
    sweep.map(|s| nccl_peaks(s).collect()).unwrap_or_default()
}

/// The training check's figure: samples per second over the node.
pub fn training(report: &NodeReport) -> Vec<Figure> {
    let figures = report.training.as_ref().and_then(|t| t.figures.as_ref());
    figures
        .map(|f| Figure {
            scope: Scope::Node,
            kind: Kind::TrainingSamplesPerSecond,
            qualifier: String::new(),
            value: f.samples_per_second,
        })
        .into_iter()
        .collect()
}

/// Bus bandwidth at the largest size of each collective's curve.
fn nccl_peaks(sweep: &NcclSweep) -> impl Iterator<Item = Figure> + '_ {
    sweep.curves.iter().filter_map(|c| {
        let last = c.rows.iter().max_by_key(|r| r.bytes)?;
        Some(Figure {
            scope: Scope::Node,
            kind: Kind::NcclBusbwGbps,
            qualifier: c.collective.as_str().into(),
            value: last.busbw_gbps,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::node_figures;

    #[test]
    fn a_report_gives_each_gpu_its_figures_and_each_pair_both_directions() {
        let r = crate::sample::report();
        let f = node_figures(&r);
        let gpu1_mem = f
            .iter()
            .find(|f| f.kind == Kind::MemoryGbps && matches!(f.scope, Scope::Gpu { index: 1, .. }))
            .expect("GPU1 memory");
        assert_eq!(gpu1_mem.value, 4100.0);
        assert_eq!(gpu1_mem.describe(), "GPU1 memory GB/s");
        let pairs = f.iter().filter(|f| f.kind == Kind::P2pGbps).count();
        assert_eq!(pairs, 4, "two ordered pairs, two directions each");
        let nccl = f
            .iter()
            .find(|f| f.kind == Kind::NcclBusbwGbps)
            .expect("nccl");
        assert_eq!((nccl.qualifier.as_str(), nccl.value), ("allReduce", 300.0));
        assert_eq!(nccl.describe(), "NCCL bus bandwidth allReduce GB/s");
    }
}
