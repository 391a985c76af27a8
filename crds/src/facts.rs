//! Node and fleet facts: what every node should look like (`spec.expect`: its GPU count, where
//! its GPUs sit, their persistence, ECC and MIG modes), what a node's agent found (the node's
//! `facts` in its report, with its driver, VBIOS, CUDA and NCCL versions), and the fleet's
//! versions in the validation's status with the nodes that differ from the majority.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::Verdict;

/// The most bus ids `spec.expect.pciBusIds` may list.
pub const MAX_BUS_IDS: usize = 64;
/// A PCI bus id as NVML or `lspci -D` writes it: `[domain:]bus:device.function`, hex.
pub const BUS_ID_PATTERN: &str = r"^([0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$";

/// What a mode should be.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModeExpectation {
    On,
    Off,
    /// Not judged (reported only).
    Any,
}

crate::spelling::api_spelling!(ModeExpectation {
    On => "On",
    Off => "Off",
    Any => "Any",
});

impl ModeExpectation {
    /// True when a GPU whose mode is `on` meets this expectation.
    pub fn accepts(self, on: bool) -> bool {
        match self {
            ModeExpectation::On => on,
            ModeExpectation::Off => !on,
            ModeExpectation::Any => true,
        }
    }
}

/// `spec.expect`: what every selected node should look like, checked right after the GPUs are
/// inventoried. A wrong GPU count or bus id fails the node at once, before the long checks.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Expect {
    /// GPUs every node should show. Default: the node's `nvidia.com/gpu` capacity, else its
    /// `nvidia.com/gpu.count` label (GPU Feature Discovery); on bare metal, not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub gpu_count: Option<i32>,
    /// PCI bus ids every node's GPUs should sit at (`0000:18:00.0`, or `18:00.0` for domain 0),
    /// for fleets that share one board layout: a missing GPU is named by its slot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_BUS_IDS), inner(regex(pattern = BUS_ID_PATTERN)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub pci_bus_ids: Vec<String>,
    /// Persistence mode (default Any: reported, not judged; a mismatch warns).
    #[serde(default = "any")]
    pub persistence_mode: ModeExpectation,
    /// ECC mode (default On; a mismatch fails the GPU).
    #[serde(default = "on")]
    pub ecc_mode: ModeExpectation,
    /// MIG mode (default Off; a mismatch fails the GPU).
    #[serde(default = "off")]
    pub mig_mode: ModeExpectation,
}

fn any() -> ModeExpectation {
    ModeExpectation::Any
}
fn on() -> ModeExpectation {
    ModeExpectation::On
}
fn off() -> ModeExpectation {
    ModeExpectation::Off
}

impl Default for Expect {
    fn default() -> Self {
        Self {
            gpu_count: None,
            pci_bus_ids: Vec::new(),
            persistence_mode: any(),
            ecc_mode: on(),
            mig_mode: off(),
        }
    }
}

/// `00000000:18:00.0`, `0000:18:00.0` and `18:00.0` alike: (domain, bus, device, function) as
/// numbers, or None for something that is not a bus id.
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let s = s.trim();
    let (domain, rest) = match s.matches(':').count() {
        2 => s.split_once(':')?,
        1 => ("0", s),
        _ => return None,
    };
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |v: &str| u32::from_str_radix(v, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

/// The canonical form of a bus id (`0000:18:00.0`), or the input when it does not parse.
pub fn canonical_bus_id(s: &str) -> String {
    match parse_bus_id(s) {
        Some((d, b, dev, f)) => format!("{d:04x}:{b:02x}:{dev:02x}.{f:x}"),
        None => s.to_string(),
    }
}

/// Where a node's GPU count expectation came from.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CountSource {
    /// `spec.expect.gpuCount`.
    Spec,
    /// The node's `nvidia.com/gpu` capacity.
    Capacity,
    /// The node's `nvidia.com/gpu.count` label (GPU Feature Discovery).
    Label,
    /// The GPUs a Dynamic Resource Allocation driver published for the node in its
    /// ResourceSlices.
    ResourceSlice,
}

crate::spelling::api_spelling!(CountSource {
    Spec => "Spec",
    Capacity => "Capacity",
    Label => "Label",
    ResourceSlice => "ResourceSlice",
});

impl CountSource {
    /// In words, for a reason's message.
    pub fn words(self) -> &'static str {
        match self {
            CountSource::Spec => "spec.expect.gpuCount",
            CountSource::Capacity => "the node's nvidia.com/gpu capacity",
            CountSource::Label => "the node's nvidia.com/gpu.count label",
            CountSource::ResourceSlice => "the node's GPUs in the DRA driver's ResourceSlices",
        }
    }

    /// Parses the API spelling (what the operator passes the agent).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// The node label GPU Feature Discovery sets to the node's GPU count.
pub const GFD_COUNT_LABEL: &str = "nvidia.com/gpu.count";

/// The versions a node runs. A node whose GPUs run different VBIOS versions lists them joined
/// with `+`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Versions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vbios: Option<String>,
    /// The CUDA version the driver supports (`12.8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    /// The NCCL library the agent found (`2.28.3`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
}

/// A versioned component of a node.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "lowercase")]
pub enum Component {
    Driver,
    Vbios,
    Cuda,
    Nccl,
}

crate::spelling::api_spelling!(Component {
    Driver => "driver",
    Vbios => "vbios",
    Cuda => "cuda",
    Nccl => "nccl",
});

impl Versions {
    /// Each component's version, where known.
    pub fn get(&self, c: Component) -> Option<&str> {
        let Versions {
            driver,
            vbios,
            cuda,
            nccl,
        } = self;
        match c {
            Component::Driver => driver,
            Component::Vbios => vbios,
            Component::Cuda => cuda,
            Component::Nccl => nccl,
        }
        .as_deref()
    }

    fn slot(&mut self, c: Component) -> &mut Option<String> {
        match c {
            Component::Driver => &mut self.driver,
            Component::Vbios => &mut self.vbios,
            Component::Cuda => &mut self.cuda,
            Component::Nccl => &mut self.nccl,
        }
    }

    /// The result annotation's form: `driver=570.86.15,vbios=96.00.99.00.01,cuda=12.8`.
    pub fn annotation(&self) -> String {
        Component::ALL
            .into_iter()
            .filter_map(|c| self.get(c).map(|v| format!("{c}={v}")))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Reads [`Versions::annotation`]'s form; unknown components and malformed parts are left out.
    pub fn parse_annotation(s: &str) -> Self {
        let mut v = Versions::default();
        for part in s.split(',') {
            let Some((k, value)) = part.split_once('=') else {
                continue;
            };
            let value = value.trim();
            if let Some(c) = Component::ALL.into_iter().find(|c| c.as_str() == k.trim())
                && !value.is_empty()
            {
                *v.slot(c) = Some(value.to_string());
            }
        }
        v
    }
}

/// What the agent found of the node as a whole: its GPUs against the expectation, and its
/// versions. Judged before the checks run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeFacts {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<crate::reason::Reason>,
    /// GPUs the node should have, where known, and where that came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_gpus: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_from: Option<CountSource>,
    /// GPUs NVML sees, and their bus ids.
    pub gpus_seen: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bus_ids_seen: Vec<String>,
    /// Bus ids of `spec.expect.pciBusIds` with no GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_bus_ids: Vec<String>,
    pub versions: Versions,
    /// GPUs NVML lists that CUDA does not see: not tested, and named here with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden_gpus: Vec<HiddenGpu>,
}

/// A GPU NVML lists that CUDA cannot see, so no check reached it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HiddenGpu {
    pub index: i32,
    pub uuid: String,
    pub pci_bus_id: String,
    /// Why CUDA does not see it (`CUDA_VISIBLE_DEVICES=0,1` left it out).
    pub reason: String,
}

/// Most nodes listed per component in `status.fleet` as differing from the majority.
pub const MAX_LISTED_DIFFERING: usize = 20;
/// Most distinct versions listed per component.
pub const MAX_LISTED_VERSIONS: usize = 10;

/// `status.fleet`: the versions across the validation's nodes. Nodes that differ from the
/// majority give a Warn (the run's phase is unchanged).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FleetStatus {
    /// Pass when every node runs the majority's versions, Warn when some do not.
    pub verdict: Verdict,
    /// The drift in a line (`driver: 1 of 3 nodes differ from 570.86.15 (gpu-c 535.104.05)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Nodes whose versions are known.
    pub nodes: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<FleetComponent>,
}

/// One component across the fleet.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FleetComponent {
    /// `driver`, `vbios`, `cuda` or `nccl`.
    pub component: String,
    /// The version most nodes run (on a tie, the highest).
    pub majority: String,
    /// Each version with how many nodes run it, the most common first (at most 10).
    pub versions: Vec<VersionCount>,
    /// Nodes not on the majority's version (at most 20; `differingNotListed` counts the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub differing: Vec<NodeVersion>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub differing_not_listed: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// A version and how many nodes run it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionCount {
    pub version: String,
    pub nodes: i32,
}

/// A node and the version it runs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeVersion {
    pub node: String,
    pub version: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_compare_in_any_spelling() {
        let want = Some((0, 0x18, 0, 0));
        assert_eq!(parse_bus_id("00000000:18:00.0"), want);
        assert_eq!(parse_bus_id("0000:18:00.0"), want);
        assert_eq!(parse_bus_id("18:00.0"), want);
        assert_eq!(parse_bus_id("18:00"), None);
        assert_eq!(parse_bus_id("zz:00.0"), None);
        assert_eq!(canonical_bus_id("00000000:5D:00.0"), "0000:5d:00.0");
        let re = regex::Regex::new(BUS_ID_PATTERN).unwrap();
        for ok in ["00000000:18:00.0", "0000:9a:00.0", "18:00.0"] {
            assert!(re.is_match(ok), "{ok}");
        }
        for bad in ["18:00", "0000:18:00.8", "gpu0"] {
            assert!(!re.is_match(bad), "{bad}");
        }
    }

    #[test]
    fn modes_and_defaults() {
        let e = Expect::default();
        assert!(e.ecc_mode.accepts(true) && !e.ecc_mode.accepts(false));
        assert!(e.mig_mode.accepts(false) && !e.mig_mode.accepts(true));
        assert!(e.persistence_mode.accepts(false) && e.persistence_mode.accepts(true));
        let parsed: Expect = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed, e);
    }

    #[test]
    fn versions_round_trip_through_the_annotation() {
        let v = Versions {
            driver: Some("570.86.15".into()),
            vbios: Some("96.00.99.00.01+96.00.89.00.01".into()),
            cuda: Some("12.8".into()),
            nccl: None,
        };
        let a = v.annotation();
        assert_eq!(
            a,
            "driver=570.86.15,vbios=96.00.99.00.01+96.00.89.00.01,cuda=12.8"
        );
        assert_eq!(Versions::parse_annotation(&a), v);
        assert_eq!(
            Versions::parse_annotation("junk,driver=1,colour=red,nccl="),
            Versions {
                driver: Some("1".into()),
                ..Default::default()
            }
        );
    }
}
