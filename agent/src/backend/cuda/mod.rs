//! Real backend: cudarc (CUDA driver, NVRTC, cuBLAS/cublasLt) for the checks, NVML for
//! inventory, topology and telemetry. Libraries are loaded at run time; a missing one is a clear
//! error, never a panic (cudarc panics on a missing library, so presence is checked first).

pub mod buffer;
pub mod kernels;
pub mod launch;
pub mod nvml;
pub mod tally;
pub mod timing;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::CudaContext;

use self::kernels::Kernels;
use self::nvml::NvmlHost;
use super::{
    BackendError, BackendKind, ErrorCounters, GpuInfo, GpuProcess, HiddenGpu, Inventory,
    LinkErrors, Platform, TelemetrySample, TopologySnapshot, XidEvent,
};

/// The real GPU backend.
pub struct CudaBackend {
    pub(crate) nvml: NvmlHost,
    /// NVML index → CUDA ordinal (matched by UUID; CUDA orders GPUs differently and honours
    /// CUDA_VISIBLE_DEVICES).
    ordinals: BTreeMap<u32, usize>,
    /// PTX per compute capability, compiled once.
    ptx: Mutex<HashMap<(i32, i32), Arc<String>>>,
    /// The pids NVML gave the agent's own process: those that appeared on the GPUs while this
    /// backend opened its CUDA contexts. In a container NVML reports the host's pids, which
    /// differ from the agent's own view of itself.
    own_pids: BTreeSet<u32>,
}

fn driver_missing() -> BackendError {
    BackendError::MissingLibrary {
        library: "the CUDA driver (libcuda.so.1)".into(),
        hint: "install the NVIDIA driver, or run where the driver's libraries are mounted (NVIDIA container toolkit)".into(),
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from the 16 UUID bytes.
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let h: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

impl CudaBackend {
    /// Loads NVML and the CUDA driver and maps every visible GPU.
    pub fn new() -> Result<Self, BackendError> {
        let nvml = NvmlHost::init()?;
        // SAFETY: only probes dlopen for libcuda.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(driver_missing());
        }
        let before = listed_pids(&nvml);
        let count = CudaContext::device_count()
            .map_err(|e| BackendError::NoGpu(format!("cuDeviceGetCount: {e}")))?;
        let mut by_uuid = HashMap::new();
        for ord in 0..count.max(0) as usize {
            let ctx = CudaContext::new(ord)
                .map_err(|e| BackendError::Other(format!("CUDA device {ord}: {e}")))?;
            let uuid = ctx
                .uuid()
                .map_err(|e| BackendError::Other(format!("CUDA device {ord} UUID: {e}")))?;
            let bytes: [u8; 16] = uuid.bytes.map(|b| b as u8);
            by_uuid.insert(format_uuid(&bytes), ord);
        }
        let mut ordinals = BTreeMap::new();
        for idx in 0..nvml.device_count()? {
            let uuid = nvml.uuid(idx)?;
            if let Some(&ord) = by_uuid
                .get(&uuid.to_ascii_lowercase())
                .or_else(|| by_uuid.get(&uuid))
            {
                ordinals.insert(idx, ord);
            }
        }
        if ordinals.is_empty() {
            return Err(BackendError::NoGpu(
                "NVML lists GPUs but CUDA sees none of them (CUDA_VISIBLE_DEVICES?)".into(),
            ));
        }
        let own_pids = listed_pids(&nvml).difference(&before).copied().collect();
        Ok(Self {
            nvml,
            ordinals,
            ptx: Mutex::new(HashMap::new()),
            own_pids,
        })
    }

    /// A CUDA context on the GPU with this NVML index.
    pub(crate) fn context(&self, gpu: u32) -> Result<Arc<CudaContext>, BackendError> {
        let ord = *self
            .ordinals
            .get(&gpu)
            .ok_or(BackendError::NoSuchGpu(gpu))?;
        CudaContext::new(ord).map_err(|e| BackendError::gpu(gpu, "open a CUDA context", e))
    }

    /// Runs `f` with a context on the GPU with this NVML index and the kernels loaded into it:
    /// how a check's CUDA code reaches one GPU.
    pub(crate) fn on_gpu<T>(
        &self,
        gpu: u32,
        f: impl FnOnce(&Arc<CudaContext>, &Kernels) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let ctx = self.context(gpu)?;
        let kernels = self.kernels(gpu, &ctx)?;
        f(&ctx, &kernels)
    }

    /// The kernels, compiled for this GPU's architecture (once) and loaded into its context.
    pub(crate) fn kernels(
        &self,
        gpu: u32,
        ctx: &Arc<CudaContext>,
    ) -> Result<Kernels, BackendError> {
        let cc = ctx
            .compute_capability()
            .map_err(|e| BackendError::gpu(gpu, "read compute capability", e))?;
        let ptx = {
            let mut cache = self
                .ptx
                .lock()
                .map_err(|_| BackendError::Other("kernel cache poisoned".into()))?;
            match cache.get(&cc) {
                Some(p) => p.clone(),
                None => {
                    let p = Arc::new(kernels::compile(Some(cc))?);
                    cache.insert(cc, p.clone());
                    p
                }
            }
        };
        Kernels::load(ctx, &ptx).map_err(|e| BackendError::gpu(gpu, "load the gpuval kernels", e))
    }
}

/// Every pid NVML lists on any GPU now (a GPU it cannot list adds none).
fn listed_pids(nvml: &NvmlHost) -> BTreeSet<u32> {
    let count = nvml.device_count().unwrap_or(0);
    (0..count)
        .filter_map(|g| nvml.processes(g).ok())
        .flatten()
        .map(|p| p.pid)
        .collect()
}

impl Platform for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    /// The GPUs CUDA can see (CUDA_VISIBLE_DEVICES, or a container's device list): a pod given
    /// two of eight GPUs checks those two, though NVML on the host lists all eight.
    fn inventory(&self) -> Result<Inventory, BackendError> {
        let mut inv = self.nvml.inventory()?;
        let (seen, hidden): (Vec<GpuInfo>, Vec<GpuInfo>) = inv
            .gpus
            .into_iter()
            .partition(|g| self.ordinals.contains_key(&g.index));
        inv.gpus = seen;
        inv.hidden = hidden
            .into_iter()
            .map(|g| HiddenGpu {
                index: g.index,
                uuid: g.uuid,
                pci_bus_id: g.pci_bus_id,
            })
            .collect();
        Ok(inv)
    }

    fn topology(&self) -> Result<TopologySnapshot, BackendError> {
        Ok(visible_only(self.nvml.topology()?, |i| {
            self.ordinals.contains_key(&i)
        }))
    }

    fn nvlink_errors(&self, gpu: u32) -> Result<Vec<LinkErrors>, BackendError> {
        self.nvml.nvlink_errors(gpu)
    }

    fn sample(&self, gpu: u32) -> Result<TelemetrySample, BackendError> {
        self.nvml.sample(gpu)
    }

    fn error_counters(&self, gpu: u32) -> Result<ErrorCounters, BackendError> {
        self.nvml.error_counters(gpu)
    }

    fn poll_xid(&self, timeout: Duration) -> Vec<XidEvent> {
        self.nvml.poll_xid(timeout)
    }

    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, BackendError> {
        self.nvml.processes(gpu)
    }

    fn occupancy(
        &self,
        gpu: u32,
        since: std::time::SystemTime,
    ) -> Result<super::Occupancy, BackendError> {
        self.nvml.occupancy(gpu, since)
    }

    fn own_pids(&self) -> Vec<u32> {
        self.own_pids.iter().copied().collect()
    }
}

/// The topology of the GPUs `visible` keeps, the common-ancestor matrix cut to match.
fn visible_only(topo: TopologySnapshot, visible: impl Fn(u32) -> bool) -> TopologySnapshot {
    let TopologySnapshot { gpus, ancestors } = topo;
    let keep: Vec<bool> = gpus.iter().map(|g| visible(g.index)).collect();
    let cut = |row: Vec<Option<String>>| -> Vec<Option<String>> {
        row.into_iter()
            .zip(&keep)
            .filter_map(|(v, k)| k.then_some(v))
            .collect()
    };
    TopologySnapshot {
        ancestors: ancestors
            .into_iter()
            .zip(&keep)
            .filter_map(|(row, k)| k.then(|| cut(row)))
            .collect(),
        gpus: gpus.into_iter().filter(|g| visible(g.index)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_is_cut_to_the_visible_gpus() {
        let gpu = |index| super::super::TopoGpu {
            index,
            pci_bus_id: String::new(),
            cpu_affinity: Vec::new(),
            numa_nodes: Vec::new(),
            links: Vec::new(),
        };
        let cell = |i: u32, j: u32| (i != j).then(|| format!("{i}{j}"));
        let topo = TopologySnapshot {
            gpus: (0..3).map(gpu).collect(),
            ancestors: (0..3)
                .map(|i| (0..3).map(|j| cell(i, j)).collect())
                .collect(),
        };
        let cut = visible_only(topo, |i| i != 1);
        assert_eq!(
            cut.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            vec![0, 2]
        );
        assert_eq!(
            cut.ancestors,
            vec![vec![None, Some("02".into())], vec![Some("20".into()), None]]
        );
    }

    #[test]
    fn uuid_formatting_matches_nvml() {
        let b = [
            0xde, 0xad, 0xbe, 0xef, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a,
            0x0b, 0x0c,
        ];
        assert_eq!(format_uuid(&b), "GPU-deadbeef-0102-0304-0506-0708090a0b0c");
    }
}
