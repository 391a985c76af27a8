//! The host transfer check: host↔GPU bandwidth with pinned memory placed on the GPU's NUMA
//! node and with pageable memory, each GPU alone, then every GPU at once; a round trip
//! verified byte for byte.

mod cuda;
mod sim;

crate::check_result!(gpuval_crds::HostTransferResult);

use std::collections::BTreeMap;

use gpuval_crds::{
    GpuReport, HostTransferCheck, HostTransferResult, NodeReport, TransferRates, Verdict,
};

use crate::backend::{Backend, BackendError, GpuInfo};
use crate::check::NodeCheck;
use crate::judge::{Code, Judge, Says, plural, round_to, to_i64, verdict_of};
use crate::run_control::RunControl;
use crate::text::{columns, dash, indent, span};

const MIB: u64 = 1024 * 1024;

/// Host transfer parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTransferRequest {
    pub buffer_bytes: u64,
    /// Timed copies per sample (median of `samples`).
    pub iterations: u32,
    pub samples: u32,
    pub pinned: bool,
    pub pageable: bool,
}

/// Host-to-device and device-to-host rates of one GPU, GB/s (1e9).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DirectionRates {
    pub h2d_gbps: f64,
    pub d2h_gbps: f64,
}

/// What the host transfer check measured on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostTransferOutcome {
    /// Pinned memory, this GPU alone.
    pub pinned: Option<DirectionRates>,
    /// Pageable memory, this GPU alone.
    pub pageable: Option<DirectionRates>,
    /// Pinned memory while every GPU of the node transfers at once.
    pub pinned_concurrent: Option<DirectionRates>,
    /// NUMA node the host buffers were placed near (the GPU's, where known).
    pub numa_node: Option<u32>,
    /// Bytes that came back different after a host → device → host round trip.
    pub mismatches: u64,
    pub seconds: f64,
}

/// The host transfer check as its spec asks for it.
pub struct Host {
    pub spec: HostTransferCheck,
    pub request: HostTransferRequest,
}

impl Host {
    pub fn from_spec(spec: &HostTransferCheck) -> Self {
        Self {
            spec: spec.clone(),
            request: HostTransferRequest {
                buffer_bytes: u64::try_from(spec.buffer_mib.max(1)).unwrap_or(1) * MIB,
                iterations: 8,
                samples: 3,
                pinned: spec.pinned,
                pageable: spec.pageable,
            },
        }
    }
}

/// Each GPU's measurement, or why that GPU could not be measured.
pub type PerGpu = BTreeMap<u32, Result<HostTransferOutcome, BackendError>>;

impl NodeCheck for Host {
    const NAME: &'static str = "hostTransfer";
    type Outcome = PerGpu;

    fn measure(
        &self,
        backend: &Backend,
        gpus: &[GpuInfo],
        ctl: &RunControl<'_>,
    ) -> Result<PerGpu, BackendError> {
        let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
        Ok(match backend {
            Backend::Cuda(b) => b.host_transfer(&indices, &self.request, ctl),
            Backend::Simulated(b) => b.host_transfer(&indices, &self.request, ctl),
        })
    }

    /// Judges each GPU into its own report, then the relative rule over the pinned rates.
    fn judge(
        &self,
        judge: &Judge<'_>,
        gpus: &[GpuInfo],
        measured: Result<PerGpu, BackendError>,
        into: &mut NodeReport,
    ) {
        let mut per_gpu = measured.unwrap_or_default();
        for (gpu, report) in gpus.iter().zip(into.gpus.iter_mut()) {
            if let Some(r) = per_gpu.remove(&gpu.index) {
                report.host_transfer = Some(Judge::judged(r, |o| {
                    judge.host_transfer(gpu, &o, &self.spec)
                }));
            }
        }
        judge.relative_host(&mut into.gpus);
    }
}

impl Judge<'_> {
    /// Judges one GPU's host transfers: corrupted round trip, and the pinned floor (spec
    /// `minPinnedGbps`, else the model profile) in each direction.
    pub fn host_transfer(
        &self,
        gpu: &GpuInfo,
        out: &HostTransferOutcome,
        spec: &HostTransferCheck,
    ) -> HostTransferResult {
        let mut reasons = Vec::new();
        if out.mismatches > 0 {
            reasons.push(Code::HostTransferMismatch.says(format!(
                "GPU{}: {} byte{} differed after a host → GPU → host round trip",
                gpu.index,
                out.mismatches,
                plural(out.mismatches)
            )));
        }
        let floor = match spec.min_pinned_gbps {
            Some(v) => Some((f64::from(v), "spec minPinnedGbps".to_string())),
            None => self
                .profile_of(&gpu.name)
                .map(|p| (p.host_pinned_min_gbps, format!("{} profile", p.name))),
        };
        if let (Some(rates), Some((floor, source))) = (out.pinned, floor) {
            for (dir, v) in [
                ("host→device", rates.h2d_gbps),
                ("device→host", rates.d2h_gbps),
            ] {
                if v < floor {
                    reasons.push(Code::HostTransferSlow.says(format!(
                        "GPU{} {dir} pinned {v:.1} GB/s < {floor:.0} GB/s ({source})",
                        gpu.index
                    )));
                }
            }
        }
        HostTransferResult {
            verdict: verdict_of(&reasons),
            reasons,
            pinned: out.pinned.map(rates),
            pageable: out.pageable.map(rates),
            pinned_concurrent: out.pinned_concurrent.map(rates),
            numa_node: out.numa_node.and_then(|n| i32::try_from(n).ok()),
            mismatches: to_i64(out.mismatches),
            seconds: out.seconds,
        }
    }

    /// The relative rule for host transfers: a GPU's pinned rate (either direction) far below
    /// the other GPUs' fails.
    pub fn relative_host(&self, gpus: &mut [GpuReport]) {
        for (dir, pick) in [
            ("host→device pinned", h2d as fn(&GpuReport) -> Option<f64>),
            ("device→host pinned", d2h),
        ] {
            self.relative_per_gpu(gpus, Code::HostTransferSlow, dir, "GB/s", pick, |g| {
                g.host_transfer.as_mut()
            });
        }
    }
}

fn h2d(g: &GpuReport) -> Option<f64> {
    pinned(g).map(|r| r.h2d_gbps)
}

fn d2h(g: &GpuReport) -> Option<f64> {
    pinned(g).map(|r| r.d2h_gbps)
}

fn pinned(g: &GpuReport) -> Option<TransferRates> {
    g.host_transfer
        .as_ref()
        .filter(|h| !matches!(h.verdict, Verdict::Error | Verdict::Skipped))
        .and_then(|h| h.pinned)
        .filter(|r| r.h2d_gbps > 0.0 && r.d2h_gbps > 0.0)
}

fn rates(r: DirectionRates) -> TransferRates {
    TransferRates {
        h2d_gbps: round_to(r.h2d_gbps, 2),
        d2h_gbps: round_to(r.d2h_gbps, 2),
    }
}

/// Command-line flags of the host transfer check.
#[derive(clap::Args, Debug, Clone, Default)]
#[group(skip)]
pub struct Flags {
    /// Host transfer copy size in MiB.
    #[arg(long)]
    pub host_buffer_mib: Option<i32>,
}

impl Flags {
    /// Applies the flags that were given to the check's settings.
    pub fn apply(&self, spec: &mut HostTransferCheck) {
        let Self { host_buffer_mib } = self;
        crate::config::given(&mut spec.buffer_mib, host_buffer_mib);
    }
}

/// The headline's part: `host pinned 55.1-55.5 GB/s`.
pub fn headline(report: &NodeReport) -> Vec<String> {
    let host: Vec<f64> = report
        .gpus
        .iter()
        .filter_map(|g| g.host_transfer.as_ref().and_then(|h| h.pinned))
        .flat_map(|r| [r.h2d_gbps, r.d2h_gbps])
        .collect();
    if host.is_empty() {
        return Vec::new();
    }
    vec![format!("host pinned {} GB/s", span(&host, 1))]
}

/// Host transfer rates per GPU, when measured.
pub fn section(report: &NodeReport) -> String {
    let measured: Vec<&GpuReport> = report
        .gpus
        .iter()
        .filter(|g| g.host_transfer.is_some())
        .collect();
    if measured.is_empty() {
        return String::new();
    }
    let rates = |r: Option<TransferRates>| {
        r.map_or_else(dash, |r| format!("{:.1}/{:.1}", r.h2d_gbps, r.d2h_gbps))
    };
    let mut rows = vec![
        [
            "GPU",
            "PINNED H2D/D2H GB/s",
            "ALL AT ONCE",
            "PAGEABLE",
            "VERDICT",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for g in measured {
        if let Some(h) = &g.host_transfer {
            rows.push(vec![
                g.index.to_string(),
                rates(h.pinned),
                rates(h.pinned_concurrent),
                rates(h.pageable),
                h.verdict.to_string(),
            ]);
        }
    }
    format!("host transfers:\n{}", indent(&columns(&rows)))
}

#[cfg(test)]
mod tests {
    use gpuval_crds::{Checks, Profile};

    use super::*;
    use crate::judge::testing::{h200, judge};

    #[test]
    fn host_transfer_floor_and_round_trip() {
        let checks = Checks::default();
        let j = judge(&checks, Profile::Auto);
        let out = HostTransferOutcome {
            pinned: Some(DirectionRates {
                h2d_gbps: 26.2,
                d2h_gbps: 55.0,
            }),
            mismatches: 2,
            ..Default::default()
        };
        let r = j.host_transfer(&h200(5), &out, &HostTransferCheck::default());
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            [
                "GPU5: 2 bytes differed after a host → GPU → host round trip",
                "GPU5 host→device pinned 26.2 GB/s < 40 GB/s (H200 profile)",
            ]
        );
        let spec = HostTransferCheck {
            min_pinned_gbps: Some(20),
            ..Default::default()
        };
        let clean = HostTransferOutcome {
            mismatches: 0,
            ..out
        };
        assert_eq!(
            j.host_transfer(&h200(5), &clean, &spec).verdict,
            Verdict::Pass
        );
    }
}
