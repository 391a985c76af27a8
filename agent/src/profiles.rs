//! Built-in expectations per GPU model: the floors a GPU must reach when no explicit threshold
//! is set in the spec.
//!
//! The H200 floors are about 80% (memory) and 88% (GEMM) of what healthy GPUs sustained on this
//! project's 4×H200 machine with every GPU burning at once at its 700 W power cap
//! (`bench/results/2026-11-21-h200x4/`: fill+verify 4130–4350 GB/s; bf16 675–685, fp16 646–657,
//! tf32 348–351, fp32 51 TFLOP/s). Short bursts on a cool GPU run faster (bf16 about 800), so
//! these are floors for sustained burns. The H100 SXM shares the H200's compute and power limit;
//! its memory floor is lower (3.35 TB/s HBM3 against 4.8). The A100 floors come from published
//! figures (2039 GB/s HBM2e peak, 312 TFLOP/s bf16/fp16 dense, 156 tf32, 19.5 fp32 peak).
//!
//! Power: DCGM's targeted power test asks a GPU to hold at least 0.75 of its target; a GEMM burn
//! on every GPU of the 4×H200 machine drew a mean of 662 W against the 700 W limit (0.95), at
//! the power cap (`SwPowerCap`) the whole time. The floor here is that 0.75 of the enforced
//! limit, for the median sample of the burn: a GPU whose clocks are pulled down by a hardware
//! slowdown draws far less.
//!
//! Links: on HGX H100/H200 (NVLink 4 through NVSwitches) a healthy pair copies about 392 GB/s
//! one way and 785 both ways on the copy engines, and pinned host transfers reach about 55 GB/s
//! per direction on PCIe Gen5 x16 (`shared/research/cudarc-nvml.md`, measured on H200); the
//! floors are about 80% of that, so a link running at half width or a GPU trained at PCIe Gen4
//! (about 25 GB/s) fails. A100 (NVLink 3, 300 GB/s per direction peak; PCIe Gen4 x16): floors
//! from the published peaks.

use gpuval_crds::{Dtype, Profile};

/// What a healthy GPU of one model reaches (SXM parts, on an NVSwitch board).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelProfile {
    /// Short model name used in reasons (`H200 profile`).
    pub name: &'static str,
    /// Lowest fill+verify throughput: bytes written plus bytes read per second, in GB/s (1e9).
    pub memory_min_gbps: f64,
    /// Lowest sustained GEMM TFLOP/s per data type.
    pub tflops_min: [(Dtype, f64); 4],
    /// Active NVLink links each GPU should have.
    pub nvlink_links: Option<u32>,
    /// Every GPU pair must be connected by NVLink.
    pub require_nvlink: bool,
    /// Lowest peer-to-peer copy rate between two GPUs, GB/s: one direction, and both at once.
    pub p2p_unidirectional_min_gbps: f64,
    pub p2p_bidirectional_min_gbps: f64,
    /// Lowest pinned host transfer rate per direction, GB/s (a PCIe link of the GPU's
    /// generation at full width).
    pub host_pinned_min_gbps: f64,
    /// Lowest share of the enforced power limit the median sample of a burn must reach.
    pub power_min_fraction: f64,
}

impl ModelProfile {
    /// The TFLOP/s floor for one data type.
    pub fn tflops_min(&self, d: Dtype) -> Option<f64> {
        self.tflops_min
            .iter()
            .find(|(dt, _)| *dt == d)
            .map(|(_, v)| *v)
    }
}

/// What the H100 and H200 SXM share: the same SMs, clocks and 700 W cap, NVLink 4 through
/// NVSwitches, PCIe Gen5 x16. Only their memory differs.
const HOPPER_SXM: ModelProfile = ModelProfile {
    name: "Hopper",
    memory_min_gbps: 0.0,
    tflops_min: [
        (Dtype::Bf16, 600.0),
        (Dtype::Fp16, 570.0),
        (Dtype::Tf32, 300.0),
        (Dtype::Fp32, 45.0),
    ],
    nvlink_links: Some(18),
    require_nvlink: true,
    p2p_unidirectional_min_gbps: 320.0,
    p2p_bidirectional_min_gbps: 620.0,
    host_pinned_min_gbps: 40.0,
    power_min_fraction: 0.75,
};

/// H200 SXM.
pub static H200: ModelProfile = ModelProfile {
    name: "H200",
    memory_min_gbps: 3400.0,
    ..HOPPER_SXM
};

/// H100 SXM.
pub static H100: ModelProfile = ModelProfile {
    name: "H100",
    memory_min_gbps: 2450.0,
    ..HOPPER_SXM
};

/// A100 SXM (80 GB).
pub static A100: ModelProfile = ModelProfile {
    name: "A100",
    memory_min_gbps: 1500.0,
    tflops_min: [
        (Dtype::Bf16, 230.0),
        (Dtype::Fp16, 230.0),
        (Dtype::Tf32, 110.0),
        (Dtype::Fp32, 15.0),
    ],
    nvlink_links: Some(12),
    require_nvlink: true,
    p2p_unidirectional_min_gbps: 200.0,
    p2p_bidirectional_min_gbps: 380.0,
    host_pinned_min_gbps: 20.0,
    power_min_fraction: 0.75,
};

/// The profile that applies to a GPU: forced by the spec setting, or picked by the NVML name
/// under `Auto`. PCIe and NVL variants get no profile under `Auto` (relative rule only).
pub fn profile_for(setting: Profile, gpu_name: &str) -> Option<&'static ModelProfile> {
    match setting {
        Profile::H100 => Some(&H100),
        Profile::H200 => Some(&H200),
        Profile::A100 => Some(&A100),
        Profile::None => None,
        Profile::Auto => auto_profile(gpu_name),
    }
}

fn auto_profile(gpu_name: &str) -> Option<&'static ModelProfile> {
    let name = gpu_name.to_ascii_uppercase();
    let sxm = !name.contains("PCIE") && !name.contains("NVL");
    if !sxm {
        None
    } else if name.contains("H200") {
        Some(&H200)
    } else if name.contains("H100") {
        Some(&H100)
    } else if name.contains("A100") {
        Some(&A100)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto(name: &str) -> Option<&'static str> {
        profile_for(Profile::Auto, name).map(|p| p.name)
    }

    #[test]
    fn auto_matches_nvml_names() {
        assert_eq!(auto("NVIDIA H200"), Some("H200"));
        assert_eq!(auto("NVIDIA H200 (simulated)"), Some("H200"));
        assert_eq!(auto("NVIDIA H100 80GB HBM3"), Some("H100"));
        assert_eq!(auto("NVIDIA A100-SXM4-80GB"), Some("A100"));
    }

    #[test]
    fn auto_skips_pcie_nvl_and_unknown() {
        assert_eq!(auto("NVIDIA H100 PCIe"), None);
        assert_eq!(auto("NVIDIA H100 NVL"), None);
        assert_eq!(auto("NVIDIA H200 NVL"), None);
        assert_eq!(auto("NVIDIA A100-PCIE-40GB"), None);
        assert_eq!(auto("NVIDIA L40S"), None);
        assert_eq!(auto(""), None);
    }

    #[test]
    fn explicit_setting_forces_profile() {
        assert_eq!(
            profile_for(Profile::H100, "NVIDIA L40S").map(|p| p.name),
            Some("H100")
        );
        assert_eq!(
            profile_for(Profile::A100, "NVIDIA H200").map(|p| p.name),
            Some("A100")
        );
        assert!(profile_for(Profile::None, "NVIDIA H200").is_none());
    }

    #[test]
    fn tflops_floors_cover_every_dtype() {
        for p in [&H100, &H200, &A100] {
            for d in Dtype::ALL {
                assert!(p.tflops_min(d).is_some_and(|v| v > 0.0), "{} {d}", p.name);
            }
        }
        assert_eq!(H200.tflops_min(Dtype::Bf16), Some(600.0));
        assert_eq!(A100.tflops_min(Dtype::Tf32), Some(110.0));
    }

    #[test]
    fn power_floors_are_dcgms_targeted_power_share() {
        for p in [&H100, &H200, &A100] {
            assert_eq!(p.power_min_fraction, 0.75, "{}", p.name);
        }
    }
}
