//! The host transfer check: host↔GPU bandwidth with pinned memory placed on the GPU's NUMA
//! node and with pageable memory, each GPU alone, then every GPU at once; a round trip
//! verified byte for byte; each GPU's PCIe link under load and its replay and AER counters
//! over the run ([`pcie`]).

mod cuda;
pub mod pcie;
pub mod row;
mod sim;

crate::check_result!(gpuval_crds::HostTransferResult);

use std::collections::BTreeMap;

use gpuval_crds::{
    BandwidthFloor, GpuReport, HostTransferCheck, HostTransferResult, NodeReport, TransferRates,
    Verdict,
};

use self::pcie::PcieOutcome;
use crate::backend::{Backend, BackendError, GpuInfo, PcieReading};
use crate::check::{JudgeNode, Measurement, NodeCheck, OnNode};
use crate::judge::{Code, Judge, Says, plural, round_to, to_i64, verdict_of};
use crate::link_floors::LinkFacts;
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
    /// The PCIe link and its counters (None where NVML could not be read).
    pub pcie: Option<PcieOutcome>,
}

/// Each GPU's PCIe reading at the start of the run.
pub type Baseline = BTreeMap<u32, PcieReading>;

/// The host transfer check as its spec asks for it.
#[derive(Clone)]
pub struct Host {
    pub spec: HostTransferCheck,
    pub request: HostTransferRequest,
    /// PCIe readings taken before the first GPU check: where the counters' window starts (the
    /// check reads them itself at its start where this has none).
    pub baseline: Baseline,
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
            baseline: Baseline::new(),
        }
    }

    /// Every GPU's PCIe reading now (those that cannot be read are left out).
    pub fn read_baseline(backend: &Backend, gpus: &[GpuInfo]) -> Baseline {
        gpus.iter()
            .filter_map(|g| {
                let r = match backend {
                    Backend::Cuda(b) => b.nvml.pcie(g.index).ok(),
                    Backend::Simulated(b) => b.pcie_reading(g.index, false),
                };
                r.map(|r| (g.index, r))
            })
            .collect()
    }

    /// This check with its counters' window starting at `baseline`.
    pub fn with_baseline(&self, baseline: Baseline) -> Self {
        Self {
            baseline,
            ..self.clone()
        }
    }
}

/// Each GPU's measurement, or why that GPU could not be measured.
pub type PerGpu = BTreeMap<u32, Result<HostTransferOutcome, BackendError>>;

impl NodeCheck for Host {
    const NAME: &'static str = "hostTransfer";
    type Outcome = PerGpu;

    fn measure(&self, on: &OnNode<'_>) -> Measurement<PerGpu> {
        let &OnNode { backend, gpus, ctl } = on;
        let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
        Ok(match backend {
            Backend::Cuda(b) => b.host_transfer(&indices, &self.request, &self.baseline, ctl),
            Backend::Simulated(b) => b.host_transfer(&indices, &self.request, &self.baseline, ctl),
        })
    }

    /// Judges each GPU into its own report, then the relative rule over the pinned rates.
    fn judge(&self, on: &JudgeNode<'_>, measured: Measurement<PerGpu>, into: &mut NodeReport) {
        let &JudgeNode { judge, gpus } = on;
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
    /// Judges one GPU's host transfers: corrupted round trip, the pinned floor (spec
    /// `minPinnedGbps`, else the model profile) in each direction, and the PCIe link and its
    /// counters.
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
                .map(|p| (p.host_pinned_min_gbps, format!("{} profile", p.name)))
                .or_else(|| {
                    let reading = out.pcie.as_ref()?.before?;
                    let f = LinkFacts::of_pcie(gpu.index, &reading).host_floor(gpu.index)?;
                    Some((f.gbps, f.source))
                }),
        };
        if let (Some(rates), Some((floor, source))) = (out.pinned, floor.as_ref()) {
            for (dir, v) in [
                ("host→device", rates.h2d_gbps),
                ("device→host", rates.d2h_gbps),
            ] {
                if v < *floor {
                    reasons.push(Code::HostTransferSlow.says(format!(
                        "GPU{} {dir} pinned {v:.1} GB/s < {floor:.0} GB/s ({source})",
                        gpu.index
                    )));
                }
            }
        }
        let pcie = out.pcie.as_ref().map(|p| {
            let (result, more) = pcie::judge(gpu.index, p, &spec.pcie.clone().unwrap_or_default());
            reasons.extend(more);
            result
        });
        HostTransferResult {
            verdict: verdict_of(&reasons),
            reasons,
            pinned: out.pinned.map(rates),
            pageable: out.pageable.map(rates),
            pinned_concurrent: out.pinned_concurrent.map(rates),
            numa_node: out.numa_node.and_then(|n| i32::try_from(n).ok()),
            mismatches: to_i64(out.mismatches),
            seconds: out.seconds,
            pcie,
            floors: floor
                .map(|(gbps, source)| BandwidthFloor {
                    what: "pinned per direction".into(),
                    gbps,
                    source,
                })
                .into_iter()
                .collect(),
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
    /// PCIe replays tolerated per GPU over the run (default 8; some but fewer: a Warn).
    #[arg(long)]
    pub pcie_max_replays: Option<i64>,
    /// Correctable PCIe (AER) errors tolerated per GPU over the run (default 8).
    #[arg(long)]
    pub pcie_max_correctable: Option<i64>,
    /// The PCIe generation every GPU must run at under load (default: what GPU and slot allow).
    #[arg(long)]
    pub pcie_expect_gen: Option<i32>,
    /// The PCIe lane count every GPU must run at under load (default: what GPU and slot allow).
    #[arg(long)]
    pub pcie_expect_width: Option<i32>,
}

impl Flags {
    /// Applies the flags that were given to the check's settings.
    pub fn apply(&self, spec: &mut HostTransferCheck) {
        let Self {
            host_buffer_mib,
            pcie_max_replays,
            pcie_max_correctable,
            pcie_expect_gen,
            pcie_expect_width,
        } = self;
        crate::check::given(&mut spec.buffer_mib, host_buffer_mib);
        let any = pcie_max_replays.is_some()
            || pcie_max_correctable.is_some()
            || pcie_expect_gen.is_some()
            || pcie_expect_width.is_some();
        if any {
            let p = spec.pcie.get_or_insert_with(Default::default);
            p.max_replays = pcie_max_replays.or(p.max_replays);
            p.max_correctable_errors = pcie_max_correctable.or(p.max_correctable_errors);
            p.expect_gen = pcie_expect_gen.or(p.expect_gen);
            p.expect_width = pcie_expect_width.or(p.expect_width);
        }
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
            "PCIE UNDER LOAD",
            "REPLAYS",
            "AER COR/UNC",
            "VERDICT",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for g in measured {
        if let Some(h) = &g.host_transfer {
            let p = h.pcie.clone().unwrap_or_default();
            let n = |v: Option<i64>| v.map_or_else(dash, |v| v.to_string());
            let link = match (p.link_gen, p.link_width) {
                (Some(g), Some(w)) => format!("Gen{g} x{w}"),
                _ => dash(),
            };
            rows.push(vec![
                g.index.to_string(),
                rates(h.pinned),
                rates(h.pinned_concurrent),
                rates(h.pageable),
                link,
                n(p.replays),
                format!("{}/{}", n(p.correctable_errors), n(p.uncorrectable_errors)),
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

    /// A GPU no profile knows (a PCIe L40S, a B200) is held to a floor from its own PCIe link,
    /// and the report says so.
    #[test]
    fn without_a_profile_the_floor_comes_from_the_pcie_link() {
        use crate::backend::PcieReading;
        let checks = Checks::default();
        let j = judge(&checks, Profile::Auto);
        let gpu = GpuInfo {
            name: "NVIDIA L40S".into(),
            ..h200(2)
        };
        let gen4 = PcieReading {
            max_gen: Some(4),
            max_width: Some(16),
            ..Default::default()
        };
        let out = HostTransferOutcome {
            pinned: Some(DirectionRates {
                h2d_gbps: 12.0,
                d2h_gbps: 25.0,
            }),
            pcie: Some(PcieOutcome {
                before: Some(gen4),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = j.host_transfer(&gpu, &out, &HostTransferCheck::default());
        assert_eq!(r.verdict, Verdict::Fail, "{:?}", r.reasons);
        assert_eq!(
            r.reasons.first().map(|x| x.message.as_str()),
            Some(
                "GPU2 host→device pinned 12.0 GB/s < 20 GB/s (0.63 × PCIe Gen4 x16 (NVML) (32 GB/s one way))"
            )
        );
        assert_eq!(r.floors.len(), 1);
        assert_eq!(r.floors[0].gbps, 19.8);
        assert!(
            r.floors[0].source.contains("PCIe Gen4 x16"),
            "{:?}",
            r.floors
        );
        // The same GPU with an H200 profile keeps the profile's measured floor.
        let r = j.host_transfer(&h200(2), &out, &HostTransferCheck::default());
        assert!(
            r.floors[0].source.contains("H200 profile"),
            "{:?}",
            r.floors
        );
    }

    #[test]
    fn pcie_findings_join_the_host_transfer_verdict() {
        use crate::backend::PcieReading;
        let checks = Checks::default();
        let j = judge(&checks, Profile::Auto);
        let reading = |replays| PcieReading {
            link_gen: Some(5),
            link_width: Some(16),
            max_gen: Some(5),
            max_width: Some(16),
            replays: Some(replays),
            ..Default::default()
        };
        let out = |after| HostTransferOutcome {
            pinned: Some(DirectionRates {
                h2d_gbps: 55.0,
                d2h_gbps: 55.0,
            }),
            pcie: Some(PcieOutcome {
                before: Some(reading(10)),
                under_load: Some(reading(10)),
                after: Some(reading(after)),
            }),
            ..Default::default()
        };
        let r = j.host_transfer(&h200(1), &out(12), &HostTransferCheck::default());
        assert_eq!(r.verdict, Verdict::Warn);
        assert_eq!(r.reasons, ["GPU1 PCIe: 2 replays during the run"]);
        assert_eq!(r.pcie.as_ref().and_then(|p| p.link_gen), Some(5));
        let r = j.host_transfer(&h200(1), &out(50), &HostTransferCheck::default());
        assert_eq!(r.verdict, Verdict::Fail);
        let mut spec = HostTransferCheck::default();
        Flags {
            pcie_max_replays: Some(100),
            pcie_expect_gen: Some(5),
            ..Default::default()
        }
        .apply(&mut spec);
        let p = spec.pcie.clone().expect("pcie limits");
        assert_eq!(
            (p.max_replays, p.expect_gen, p.expect_width),
            (Some(100), Some(5), None)
        );
        assert_eq!(
            j.host_transfer(&h200(1), &out(50), &spec).verdict,
            Verdict::Warn
        );
    }

    #[test]
    fn planted_replays_fail_that_gpu_over_the_whole_run() {
        let checks = gpuval_crds::Checks {
            memory: Some(Default::default()),
            host_transfer: Some(HostTransferCheck::default()),
            ..Default::default()
        };
        let report = crate::judge::testing::simulated_run("gpus=2,replay=1:40", checks);
        let h = |i: usize| report.gpus[i].host_transfer.clone().expect("host transfer");
        assert_eq!(h(0).verdict, Verdict::Pass, "{:?}", h(0).reasons);
        assert_eq!(h(0).pcie.and_then(|p| p.replays), Some(0));
        assert_eq!(h(1).verdict, Verdict::Fail);
        assert_eq!(
            h(1).reasons,
            ["GPU1 PCIe: 40 replays during the run, more than the 8 allowed"]
        );
        let table = crate::render::table(&report);
        assert!(table.contains("Gen5 x16"), "{table}");
    }
}
