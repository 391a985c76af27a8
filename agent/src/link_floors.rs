//! Bandwidth floors from what the node is: the NVLink generation and active link count NVML
//! reports, the PCIe generation and width, and the node's own measured peer-to-peer rate. Every
//! link check (p2p pairs, pinned host transfers, NCCL bus bandwidth) gets a floor on any GPU
//! model and any GPU count this way, and every floor carries its source, which the report shows.
//!
//! The shares of the theoretical peak come from this project's measurements on HGX H100 and
//! H200 (NVLink 4 through NVSwitch, PCIe Gen5 x16; `bench/results/`): a pair copies 392–397 GB/s
//! of NVLink 4's 450 one way (0.87), 781–785 of 900 both ways; pinned host transfers reach
//! 55.5 of Gen5 x16's 63 GB/s (0.88); NCCL all-reduce, all-gather and reduce-scatter bus
//! bandwidth reached 282–349 GB/s on 2 GPUs and 360–370 on 4 (0.72–0.95 of the pair's measured
//! one-way rate). Each floor sits about 20 % under the lowest healthy figure, so a link at half
//! width, a GPU trained a PCIe generation down, or collectives at half speed fail.

use std::collections::BTreeMap;

use crate::backend::{PcieReading, TopologySnapshot};

/// Share of a link's one-way peak a peer copy must reach (H100/H200: 0.87 measured).
pub const NVLINK_COPY_SHARE: f64 = 0.70;
/// Share of the smaller PCIe link's peak a peer copy over PCIe must reach (through a PCIe
/// switch or the root complex; the CPU's bridge often halves it).
pub const PCIE_PEER_SHARE: f64 = 0.40;
/// Share of the PCIe link's peak a pinned host transfer must reach (0.88 measured on Gen5 x16).
pub const HOST_SHARE: f64 = 0.63;
/// Share of the node's measured one-way p2p rate NCCL's bus bandwidth must reach (0.72 lowest
/// measured, on 2 GPUs).
pub const NCCL_SHARE_OF_P2P: f64 = 0.55;
/// Share of the one-way link peak NCCL's bus bandwidth must reach when no p2p was measured.
pub const NCCL_SHARE_OF_PEAK: f64 = 0.50;
/// The same over PCIe only (NCCL through PCIe peer access or host memory).
pub const NCCL_SHARE_OF_PCIE: f64 = 0.30;

/// A floor and where it came from, as the report states it.
#[derive(Debug, Clone, PartialEq)]
pub struct Floor {
    pub gbps: f64,
    pub source: String,
}

impl Floor {
    fn share(peak: &Peak, share: f64) -> Self {
        Self {
            gbps: round1(peak.gbps * share),
            source: format!("{share:.2} × {}", peak.describe()),
        }
    }
}

/// A link's one-way theoretical peak and what it was computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct Peak {
    pub gbps: f64,
    pub what: String,
}

impl Peak {
    fn describe(&self) -> String {
        format!("{} ({:.0} GB/s one way)", self.what, self.gbps)
    }
}

/// One-way GB/s of one NVLink link of a generation (NVLink 1: P100; 2: V100; 3: A100;
/// 4: H100/H200; 5: B200/GB200).
pub fn nvlink_link_gbps(generation: u32) -> Option<f64> {
    match generation {
        1 => Some(20.0),
        2..=4 => Some(25.0),
        5 => Some(50.0),
        _ => None,
    }
}

/// One-way GB/s of one PCIe lane of a generation, after line encoding.
pub fn pcie_lane_gbps(generation: u32) -> Option<f64> {
    match generation {
        1 => Some(0.25),
        2 => Some(0.5),
        3 => Some(0.985),
        4 => Some(1.969),
        5 => Some(3.938),
        6 => Some(7.563),
        _ => None,
    }
}

/// One GPU's links as NVML reports them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuLinks {
    pub bus_id: String,
    /// Active NVLink links: their generation and whether they reach an NVSwitch (else the
    /// bus id of the GPU at the other end, where NVML names it).
    pub nvlinks: Vec<NvlinkFact>,
    /// The PCIe generation and width the GPU and its slot allow together.
    pub pcie: Option<(u32, u32)>,
}

/// One active NVLink link.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NvlinkFact {
    pub generation: Option<u32>,
    pub to_switch: bool,
    pub remote_bus_id: Option<String>,
}

/// The node's links, by NVML index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkFacts {
    pub gpus: BTreeMap<u32, GpuLinks>,
}

/// Nothing known of the node's links (no floor comes from them).
pub static NO_FACTS: LinkFacts = LinkFacts {
    gpus: BTreeMap::new(),
};

impl LinkFacts {
    /// From NVML's topology readings and each GPU's PCIe reading.
    pub fn from_readings(topo: &TopologySnapshot, pcie: &BTreeMap<u32, PcieReading>) -> Self {
        let mut gpus = BTreeMap::new();
        for g in &topo.gpus {
            let nvlinks = g
                .links
                .iter()
                .filter(|l| l.active)
                .map(|l| NvlinkFact {
                    generation: l.version,
                    to_switch: l.remote_type.as_deref() == Some("SWITCH"),
                    remote_bus_id: l.remote_bus_id.clone(),
                })
                .collect();
            let pcie = pcie.get(&g.index).and_then(|r| r.max_gen.zip(r.max_width));
            gpus.insert(
                g.index,
                GpuLinks {
                    bus_id: g.pci_bus_id.clone(),
                    nvlinks,
                    pcie,
                },
            );
        }
        Self { gpus }
    }

    /// The NVLink generation the node's links share (the newest reported).
    fn nvlink_generation(&self) -> Option<u32> {
        self.gpus
            .values()
            .flat_map(|g| g.nvlinks.iter().filter_map(|l| l.generation))
            .max()
    }

    /// Links a GPU of this node should have active towards the NVSwitches: the most any of its
    /// GPUs has, so a GPU that lost links is held to what its peers have.
    fn switch_links(&self) -> usize {
        self.gpus
            .values()
            .map(|g| g.nvlinks.iter().filter(|l| l.to_switch).count())
            .max()
            .unwrap_or(0)
    }

    /// Active links from `src` straight to `dst` (no NVSwitch between them).
    fn direct_links(&self, src: u32, dst: u32) -> usize {
        let (Some(s), Some(d)) = (self.gpus.get(&src), self.gpus.get(&dst)) else {
            return 0;
        };
        s.nvlinks
            .iter()
            .filter(|l| {
                !l.to_switch
                    && l.remote_bus_id
                        .as_deref()
                        .is_some_and(|b| same_bus(b, &d.bus_id))
            })
            .count()
    }

    /// The one-way NVLink peak between two GPUs, where NVLink joins them.
    pub fn nvlink_peak(&self, src: u32, dst: u32) -> Option<Peak> {
        let generation = self.nvlink_generation()?;
        let per_link = nvlink_link_gbps(generation)?;
        let switched = [src, dst].iter().all(|g| {
            self.gpus
                .get(g)
                .is_some_and(|x| x.nvlinks.iter().any(|l| l.to_switch))
        });
        let (links, how) = if switched {
            (self.switch_links(), "through NVSwitch")
        } else {
            (self.direct_links(src, dst), "direct")
        };
        (links > 0).then(|| Peak {
            gbps: per_link * links as f64,
            what: format!("NVLink {generation} × {links} links {how} (NVML)"),
        })
    }

    /// The one-way PCIe peak of a GPU's link at the generation and width it and its slot allow.
    pub fn pcie_peak(&self, gpu: u32) -> Option<Peak> {
        let (generation, width) = self.gpus.get(&gpu)?.pcie?;
        Some(Peak {
            gbps: pcie_lane_gbps(generation)? * f64::from(width),
            what: format!("PCIe Gen{generation} x{width} (NVML)"),
        })
    }

    /// The smaller of two GPUs' PCIe peaks (what a copy between them over PCIe can reach).
    fn pcie_pair_peak(&self, src: u32, dst: u32) -> Option<Peak> {
        let (a, b) = (self.pcie_peak(src)?, self.pcie_peak(dst)?);
        Some(if b.gbps < a.gbps { b } else { a })
    }

    /// Floors for a pair's copies, one way and both ways: from NVLink where it joins them,
    /// else from PCIe.
    pub fn p2p_floors(&self, src: u32, dst: u32) -> Option<(Floor, Floor)> {
        let (peak, share) = match self.nvlink_peak(src, dst) {
            Some(p) => (p, NVLINK_COPY_SHARE),
            None => (self.pcie_pair_peak(src, dst)?, PCIE_PEER_SHARE),
        };
        let uni = Floor::share(&peak, share);
        let bidi = Floor {
            gbps: round1(2.0 * uni.gbps),
            source: format!("both ways: 2 × {}", uni.source),
        };
        Some((uni, bidi))
    }

    /// The pinned host transfer floor of one GPU, per direction.
    pub fn host_floor(&self, gpu: u32) -> Option<Floor> {
        Some(Floor::share(&self.pcie_peak(gpu)?, HOST_SHARE))
    }

    /// The facts of one GPU's PCIe link alone (what the host transfer check reads itself).
    pub fn of_pcie(gpu: u32, reading: &PcieReading) -> Self {
        let links = GpuLinks {
            pcie: reading.max_gen.zip(reading.max_width),
            ..GpuLinks::default()
        };
        Self {
            gpus: BTreeMap::from([(gpu, links)]),
        }
    }

    /// The NCCL bus bandwidth floor over `gpus`: from the node's own measured p2p one-way
    /// median where the p2p check measured it in this run, else from the links' peak (the
    /// slowest pair's).
    pub fn nccl_floor(&self, gpus: &[u32], measured_p2p: Option<f64>) -> Option<Floor> {
        if let Some(p2p) = measured_p2p.filter(|v| *v > 0.0) {
            return Some(Floor {
                gbps: round1(p2p * NCCL_SHARE_OF_P2P),
                source: format!(
                    "{NCCL_SHARE_OF_P2P:.2} × this node's measured p2p one-way median ({p2p:.0} GB/s)"
                ),
            });
        }
        let pairs = gpus
            .iter()
            .flat_map(|&a| gpus.iter().filter(move |&&b| b != a).map(move |&b| (a, b)));
        let mut slowest: Option<(Peak, f64)> = None;
        for (a, b) in pairs {
            let candidate = match self.nvlink_peak(a, b) {
                Some(p) => (p, NCCL_SHARE_OF_PEAK),
                None => (self.pcie_pair_peak(a, b)?, NCCL_SHARE_OF_PCIE),
            };
            let lower = slowest
                .as_ref()
                .is_none_or(|(p, s)| candidate.0.gbps * candidate.1 < p.gbps * s);
            if lower {
                slowest = Some(candidate);
            }
        }
        slowest.map(|(peak, share)| Floor::share(&peak, share))
    }
}

/// NVML writes bus ids with 4 or 8 hex digits of domain and in either case.
fn same_bus(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        let s = s.to_ascii_lowercase();
        match s.split_once(':') {
            Some((domain, rest)) => format!("{:0>8}:{rest}", domain.trim_start_matches('0')),
            None => s,
        }
    };
    norm(a) == norm(b)
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` GPUs with `links` active NVLink links of `generation` each to NVSwitches, on PCIe of
    /// `pcie` (generation, width).
    fn switched(n: u32, generation: u32, links: usize, pcie: (u32, u32)) -> LinkFacts {
        LinkFacts {
            gpus: (0..n)
                .map(|i| {
                    (
                        i,
                        GpuLinks {
                            bus_id: format!("00000000:{:02x}:00.0", 0x18 + i),
                            nvlinks: vec![
                                NvlinkFact {
                                    generation: Some(generation),
                                    to_switch: true,
                                    remote_bus_id: None,
                                };
                                links
                            ],
                            pcie: Some(pcie),
                        },
                    )
                })
                .collect(),
        }
    }

    fn pcie_only(n: u32, pcie: (u32, u32)) -> LinkFacts {
        let mut f = switched(n, 4, 0, pcie);
        for g in f.gpus.values_mut() {
            g.nvlinks.clear();
        }
        f
    }

    #[test]
    fn every_listed_model_and_gpu_count_gets_p2p_host_and_nccl_floors() {
        // (model, NVLink generation, links, PCIe, expected p2p one-way floor, host floor)
        let models = [
            ("A100 SXM", 3, 12, (4, 16), 210.0, 19.8),
            ("H100 SXM", 4, 18, (5, 16), 315.0, 39.7),
            ("H200 SXM", 4, 18, (5, 16), 315.0, 39.7),
            ("B200", 5, 18, (5, 16), 630.0, 39.7),
        ];
        for (model, generation, links, pcie, uni, host) in models {
            for n in [2, 4, 8] {
                let f = switched(n, generation, links, pcie);
                let (u, b) = f
                    .p2p_floors(0, n - 1)
                    .unwrap_or_else(|| panic!("{model} {n}"));
                assert_eq!(u.gbps, uni, "{model} × {n}: {}", u.source);
                assert_eq!(b.gbps, 2.0 * uni, "{model} × {n}");
                assert!(
                    u.source
                        .contains(&format!("NVLink {generation} × {links} links")),
                    "{}",
                    u.source
                );
                let h = f
                    .host_floor(n - 1)
                    .unwrap_or_else(|| panic!("{model} host"));
                assert_eq!(h.gbps, host, "{model}: {}", h.source);
                let gpus: Vec<u32> = (0..n).collect();
                let nccl = f
                    .nccl_floor(&gpus, None)
                    .unwrap_or_else(|| panic!("{model} nccl"));
                assert!(
                    nccl.gbps > 0.4 * uni && nccl.gbps < uni,
                    "{model} × {n}: {nccl:?}"
                );
            }
        }
    }

    #[test]
    fn hopper_floors_match_the_measured_profiles() {
        // The H100/H200 profile's p2p floor (320) and the 2×H200 NCCL floor (225) agree with
        // what the facts give, within a few percent.
        let f = switched(2, 4, 18, (5, 16));
        let (u, _) = f.p2p_floors(0, 1).unwrap_or_else(|| panic!("floors"));
        assert!((u.gbps - 320.0).abs() / 320.0 < 0.03, "{u:?}");
        let nccl = f
            .nccl_floor(&[0, 1], None)
            .unwrap_or_else(|| panic!("nccl"));
        assert_eq!(nccl.gbps, 225.0, "{nccl:?}");
    }

    #[test]
    fn pcie_only_nodes_get_floors_from_the_smaller_link() {
        let mut f = pcie_only(4, (5, 16));
        f.gpus.get_mut(&3).unwrap_or_else(|| panic!("gpu 3")).pcie = Some((4, 16));
        let (u, _) = f.p2p_floors(0, 3).unwrap_or_else(|| panic!("floors"));
        assert_eq!(u.gbps, round1(1.969 * 16.0 * PCIE_PEER_SHARE));
        assert!(u.source.contains("PCIe Gen4 x16"), "{}", u.source);
        let (u, _) = f.p2p_floors(0, 1).unwrap_or_else(|| panic!("floors"));
        assert!(u.source.contains("PCIe Gen5 x16"), "{}", u.source);
        let nccl = f
            .nccl_floor(&[0, 1, 2, 3], None)
            .unwrap_or_else(|| panic!("nccl"));
        assert!(
            nccl.source.contains("PCIe Gen4 x16"),
            "the slowest pair sets it: {nccl:?}"
        );
    }

    #[test]
    fn a_gpu_that_lost_links_is_held_to_its_peers_count() {
        let mut f = switched(4, 4, 18, (5, 16));
        f.gpus
            .get_mut(&2)
            .unwrap_or_else(|| panic!("gpu 2"))
            .nvlinks
            .truncate(9);
        let (u, _) = f.p2p_floors(0, 2).unwrap_or_else(|| panic!("floors"));
        assert_eq!(u.gbps, 315.0, "{u:?}");
    }

    #[test]
    fn direct_nvlink_counts_only_the_links_between_the_pair() {
        // Two GPUs bridged by 4 NVLink 3 links, no switch (PCIe A100 with a bridge).
        let mut f = pcie_only(3, (4, 16));
        let bus1 = f.gpus[&1].bus_id.clone();
        let bus0 = f.gpus[&0].bus_id.to_uppercase();
        let link = |to: String| NvlinkFact {
            generation: Some(3),
            to_switch: false,
            remote_bus_id: Some(to),
        };
        f.gpus.get_mut(&0).unwrap_or_else(|| panic!("0")).nvlinks = vec![link(bus1); 4];
        f.gpus.get_mut(&1).unwrap_or_else(|| panic!("1")).nvlinks = vec![link(bus0); 4];
        let (u, _) = f.p2p_floors(0, 1).unwrap_or_else(|| panic!("floors"));
        assert_eq!(u.gbps, 70.0, "{u:?}");
        assert!(u.source.contains("× 4 links direct"), "{}", u.source);
        // GPU2 has no bridge: PCIe.
        let (u, _) = f.p2p_floors(0, 2).unwrap_or_else(|| panic!("floors"));
        assert!(u.source.contains("PCIe"), "{}", u.source);
    }

    #[test]
    fn nccl_prefers_the_nodes_own_measured_p2p() {
        let f = switched(4, 4, 18, (5, 16));
        let nccl = f
            .nccl_floor(&[0, 1, 2, 3], Some(392.0))
            .unwrap_or_else(|| panic!("nccl"));
        assert_eq!(nccl.gbps, 215.6);
        assert!(nccl.source.contains("measured p2p"), "{}", nccl.source);
    }

    #[test]
    fn nothing_known_gives_no_floor() {
        let f = LinkFacts::default();
        assert!(f.p2p_floors(0, 1).is_none());
        assert!(f.host_floor(0).is_none());
        assert!(f.nccl_floor(&[0, 1], None).is_none());
        assert!(nvlink_link_gbps(9).is_none());
        assert!(pcie_lane_gbps(0).is_none());
    }

    #[test]
    fn bus_ids_compare_across_nvml_spellings() {
        assert!(same_bus("00000000:18:00.0", "0000:18:00.0"));
        assert!(same_bus("00000000:AB:00.0", "00000000:ab:00.0"));
        assert!(!same_bus("00000000:18:00.0", "00000000:19:00.0"));
    }
}
