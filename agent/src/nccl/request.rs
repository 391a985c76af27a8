//! The check's request, built from the spec and the node's GPUs, and the part of it a sweep
//! process needs.

use std::path::PathBuf;
use std::time::Duration;

use gpuval_crds::{Collective, NcclCheck, NcclDtype};
use serde::{Deserialize, Serialize};

use super::bandwidth::{Layout, human_bytes, size_ladder};
use crate::backend::GpuInfo;

/// The largest size of the default sweep.
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;
/// Send and receive buffers together may take at most this share of a GPU's free memory (NCCL
/// needs room of its own).
const BUFFER_SHARE_OF_FREE: u64 = 2;

/// One rank's GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankGpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-xxxxxxxx-...`: how the sweep process is pointed at it (CUDA_VISIBLE_DEVICES).
    pub uuid: String,
}

/// What the check runs.
#[derive(Debug, Clone, PartialEq)]
pub struct NcclRequest {
    /// In rank order.
    pub gpus: Vec<RankGpu>,
    pub sweep: SweepRequest,
    /// Also run the sweep with NCCL_P2P_DISABLE=1, in its own process.
    pub transports: bool,
    /// Keep NCCL's logs here (bench and debugging); they are deleted otherwise.
    pub log_dir: Option<PathBuf>,
    /// How the request differs from what the spec asked (a size limit applied).
    pub notes: Vec<String>,
    /// Variables set for every sweep process on top of the agent's (the fabric test's
    /// `NCCL_COMM_ID` and the validation's `NCCL_*`).
    pub env: Vec<(String, String)>,
    /// How long a sweep process may stay silent beyond the collective timeout while it starts
    /// (None: [`crate::worker::SILENCE_GRACE`]).
    pub setup_allowance: Option<Duration>,
}

/// What one sweep process runs: every collective at every size, out of place and in place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepRequest {
    pub ranks: u32,
    pub collectives: Vec<Collective>,
    /// Requested sizes (bytes); each collective lays them out as nccl-tests does.
    pub sizes: Vec<u64>,
    pub dtype: NcclDtype,
    pub iterations: u32,
    pub warmup: u32,
    /// How long one batch of collectives may take before the communicators are aborted.
    pub timeout_ms: u64,
    /// This process's part of a communicator that spans processes (the fabric test: its ranks
    /// are `first_rank..first_rank + ranks` of `size`); None: the communicator is this
    /// process's GPUs alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world: Option<WorldSlot>,
    /// The simulated node's sweep (tests and demos only): the sweep process runs the
    /// simulator ([`super::sim`]) instead of NCCL; None on real GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<super::sim::SimSweep>,
}

/// Where a process's ranks sit in a communicator over several processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorldSlot {
    pub size: u32,
    pub first_rank: u32,
}

impl SweepRequest {
    /// Ranks in the whole communicator.
    pub fn world_size(&self) -> u32 {
        self.world.map_or(self.ranks, |w| w.size)
    }

    /// The communicator rank of this process's `local` rank (its `local`-th visible GPU).
    pub fn global_rank(&self, local: u32) -> u32 {
        self.world.map_or(local, |w| w.first_rank + local)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.max(1))
    }

    /// The largest send or receive buffer any step needs, bytes.
    pub fn buffer_bytes(&self) -> u64 {
        self.collectives
            .iter()
            .flat_map(|c| self.sizes.iter().map(move |s| (*c, *s)))
            .map(|(c, s)| {
                Layout::new(c, s, self.dtype.size(), u64::from(self.world_size())).bytes()
            })
            .max()
            .unwrap_or(0)
    }
}

impl NcclRequest {
    /// The request for `gpus` (rank order = this order) from the spec. The largest size is
    /// the spec's, or 4 GiB, brought down (to a power of two) where two buffers of it would
    /// take more than half of the smallest GPU's free memory.
    pub fn from_spec(spec: &NcclCheck, gpus: &[GpuInfo]) -> Self {
        let free = gpus.iter().map(|g| g.memory_free_bytes).min().unwrap_or(0);
        let fits = largest_fitting(free);
        let mut notes = Vec::new();
        let asked = spec.max_bytes.map(|b| u64::try_from(b).unwrap_or(0));
        let max = match asked {
            Some(m) if m <= fits => m,
            Some(m) => {
                notes.push(format!(
                    "largest size {} brought down to {}: two buffers of it must fit in half of the {} free on the smallest GPU",
                    human_bytes(m),
                    human_bytes(fits),
                    human_bytes(free)
                ));
                fits
            }
            None => DEFAULT_MAX_BYTES.min(fits),
        };
        let min = u64::try_from(spec.min_bytes)
            .unwrap_or(1)
            .clamp(1, max.max(1));
        let factor = u64::try_from(spec.step_factor).unwrap_or(2);
        Self {
            gpus: gpus
                .iter()
                .map(|g| RankGpu {
                    index: g.index,
                    uuid: g.uuid.clone(),
                })
                .collect(),
            sweep: SweepRequest {
                ranks: u32::try_from(gpus.len()).unwrap_or(u32::MAX),
                collectives: dedup(&spec.collectives),
                sizes: size_ladder(min, max, factor),
                dtype: spec.dtype,
                iterations: u32::try_from(spec.iterations.max(1)).unwrap_or(1),
                warmup: u32::try_from(spec.warmup_iterations.max(0)).unwrap_or(0),
                timeout_ms: u64::try_from(spec.timeout.as_std().as_millis()).unwrap_or(u64::MAX),
                world: None,
                simulated: None,
            },
            transports: spec.transports,
            log_dir: None,
            notes,
            env: Vec::new(),
            setup_allowance: None,
        }
    }
}

/// The largest power of two of which two buffers fit in half of `free` bytes (0 when nothing
/// does); at least 4 GiB on an 80 GB GPU.
fn largest_fitting(free: u64) -> u64 {
    let room = free / BUFFER_SHARE_OF_FREE / 2;
    if room == 0 {
        0
    } else {
        1 << (63 - room.leading_zeros())
    }
}

fn dedup(collectives: &[Collective]) -> Vec<Collective> {
    let mut out: Vec<Collective> = Vec::new();
    for c in collectives {
        if !out.contains(c) {
            out.push(*c);
        }
    }
    if out.is_empty() {
        out.push(Collective::AllReduce);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::GpuHealth;

    fn gpu(index: u32, free_gib: u64) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H200".into(),
            pci_bus_id: String::new(),
            memory_total_bytes: free_gib << 30,
            memory_free_bytes: free_gib << 30,
            compute_capability: Some((9, 0)),
            health: GpuHealth::default(),
        }
    }

    #[test]
    fn default_sweep_is_8_bytes_to_4_gib_on_big_gpus() {
        let req = NcclRequest::from_spec(&NcclCheck::default(), &[gpu(0, 140), gpu(1, 139)]);
        let s = &req.sweep;
        assert_eq!(s.sizes.first(), Some(&8));
        assert_eq!(s.sizes.last(), Some(&(4 << 30)));
        assert_eq!(
            (s.ranks, s.iterations, s.warmup, s.timeout_ms),
            (2, 20, 5, 60_000)
        );
        assert_eq!(s.buffer_bytes(), 4 << 30);
        assert_eq!(req.gpus[1].uuid, "GPU-1");
        assert!(req.notes.is_empty());
        // 80 GB parts still get 4 GiB.
        let h100 = NcclRequest::from_spec(&NcclCheck::default(), &[gpu(0, 79), gpu(1, 79)]);
        assert_eq!(h100.sweep.sizes.last(), Some(&(4 << 30)));
    }

    #[test]
    fn small_gpus_get_a_smaller_largest_size_and_a_note() {
        let req = NcclRequest::from_spec(&NcclCheck::default(), &[gpu(0, 15), gpu(1, 40)]);
        assert_eq!(
            req.sweep.sizes.last(),
            Some(&(2 << 30)),
            "15 GiB free: 3.75 GiB fits"
        );
        assert!(req.notes.is_empty(), "the default is not a request");
        let spec = NcclCheck {
            max_bytes: Some(16 << 30),
            collectives: vec![Collective::AllGather, Collective::AllGather],
            ..Default::default()
        };
        let req = NcclRequest::from_spec(&spec, &[gpu(0, 15), gpu(1, 15)]);
        assert_eq!(req.sweep.sizes.last(), Some(&(2 << 30)));
        assert_eq!(req.sweep.collectives, [Collective::AllGather]);
        assert!(
            req.notes[0].starts_with("largest size 16 GiB brought down to 2 GiB"),
            "{:?}",
            req.notes
        );
    }
}
