//! NVML for the real backend: inventory, topology readings, telemetry, ECC counters and Xid
//! events, through nvml-wrapper (raw calls where the wrapper is wrong; see the research notes).
//!
//! GPUs are named by NVML index. Anything NVML reports as not supported becomes `None`.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuval_crds::{GpuHealth, RowHealth, SystemInfo};
use nvml_wrapper::bitmasks::InitFlags;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, Sampling, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS, NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR,
    NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR, NVML_FI_DEV_POWER_INSTANT, NVML_FI_DEV_REMAPPED_COR,
    NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING, NVML_FI_DEV_REMAPPED_UNC,
    NVML_FI_DEV_RETIRED_DBE, NVML_FI_DEV_RETIRED_PENDING, NVML_FI_DEV_RETIRED_SBE,
};
use nvml_wrapper::{Device, EventSet, Nvml, cuda_driver_version_major, cuda_driver_version_minor};
use tracing::debug;

use crate::backend::{
    BackendError, ErrorCounters, GpuInfo, GpuProcess, Inventory, LinkErrors, LinkReading,
    Occupancy, PcieReading, PowerReading, TelemetrySample, TopoGpu, TopologySnapshot, XidEvent,
};
use crate::pci::{normalize_bus_id, parse_ranges, set_bits};

/// `NVML_NVLINK_MAX_LINKS` in nvml.h.
const MAX_LINKS: u32 = 18;
/// `NVML_AFFINITY_SCOPE_NODE` in nvml.h.
const AFFINITY_SCOPE_NODE: u32 = 0;
/// NVML's value for an Xid it could not identify.
const XID_UNKNOWN: u64 = 999;
/// Most events taken from the set in one poll.
const MAX_DRAIN: usize = 1024;

const MISSING_LIBRARY: &str = "NVML (libnvidia-ml.so.1)";
const MISSING_LIBRARY_HINT: &str =
    "install the NVIDIA driver, or run the agent where the driver's libraries are mounted";

/// Throttle-reason flags and their NVML names without the `nvmlClocksThrottleReason` prefix.
/// `UserDefinedClocks` (deprecated alias of `ApplicationsClocksSetting`) is left out.
const THROTTLE_NAMES: [(ThrottleReasons, &str); 9] = [
    (ThrottleReasons::GPU_IDLE, "GpuIdle"),
    (
        ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
        "ApplicationsClocksSetting",
    ),
    (ThrottleReasons::SW_POWER_CAP, "SwPowerCap"),
    (ThrottleReasons::HW_SLOWDOWN, "HwSlowdown"),
    (ThrottleReasons::SYNC_BOOST, "SyncBoost"),
    (ThrottleReasons::SW_THERMAL_SLOWDOWN, "SwThermalSlowdown"),
    (ThrottleReasons::HW_THERMAL_SLOWDOWN, "HwThermalSlowdown"),
    (
        ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
        "HwPowerBrakeSlowdown",
    ),
    (
        ThrottleReasons::DISPLAY_CLOCK_SETTING,
        "DisplayClockSetting",
    ),
];

/// The host's NVML session. NVML is initialised once and never shut down (the `Nvml` is
/// leaked), so devices and the Xid event set can borrow it for `'static`.
pub struct NvmlHost {
    nvml: &'static Nvml,
    xid: Mutex<XidState>,
}

impl std::fmt::Debug for NvmlHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlHost").finish_non_exhaustive()
    }
}

/// The Xid event set, created on the first poll.
enum XidState {
    NotStarted,
    Watching(XidWatch),
    /// No GPU could be registered, or NVML refused the set.
    Unavailable,
}

/// An event set registered for critical Xid errors, with the UUID → index map of its GPUs.
struct XidWatch {
    set: EventSet<'static>,
    gpus: Vec<(String, u32)>,
}

impl NvmlHost {
    /// Loads `libnvidia-ml.so.1` and initialises NVML. Missing library → `MissingLibrary`;
    /// driver present but no GPU → `NoGpu`. Each successful call leaks one `Nvml`.
    pub fn init() -> Result<NvmlHost, BackendError> {
        let nvml = open_nvml()?;
        let count = nvml
            .device_count()
            .map_err(|e| BackendError::Other(format!("NVML device count: {e}")))?;
        if count == 0 {
            return Err(BackendError::NoGpu("NVML reports 0 GPUs".to_string()));
        }
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        Ok(NvmlHost {
            nvml,
            xid: Mutex::new(XidState::NotStarted),
        })
    }

    /// Number of GPUs NVML sees (including ones this process may not be allowed to use).
    pub fn device_count(&self) -> Result<u32, BackendError> {
        self.nvml
            .device_count()
            .map_err(|e| BackendError::Other(format!("NVML device count: {e}")))
    }

    /// The UUID (`GPU-…`) of NVML index `gpu`.
    pub fn uuid(&self, gpu: u32) -> Result<String, BackendError> {
        self.device(gpu)?
            .uuid()
            .map_err(|e| BackendError::gpu(gpu, "read UUID", e))
    }

    /// Driver versions, hostname, and every GPU's static facts and health signals.
    pub fn inventory(&self) -> Result<Inventory, BackendError> {
        let gpus = (0..self.device_count()?)
            .map(|gpu| self.gpu_info(gpu))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Inventory {
            system: self.system_info(),
            gpus,
            hidden: Vec::new(),
        })
    }

    /// Raw topology readings: pair ancestors, affinities, NVLink link states.
    pub fn topology(&self) -> Result<TopologySnapshot, BackendError> {
        let count = self.device_count()?;
        let words = cpu_words();
        let gpus = (0..count)
            .map(|gpu| self.topo_gpu(gpu, words))
            .collect::<Result<Vec<_>, _>>()?;
        let ancestors = (0..count)
            .map(|i| (0..count).map(|j| self.ancestor(i, j)).collect())
            .collect();
        Ok(TopologySnapshot { gpus, ancestors })
    }

    /// One telemetry sample: clocks, temperature, power draw, active throttle reasons.
    pub fn sample(&self, gpu: u32) -> Result<TelemetrySample, BackendError> {
        let dev = self.device(gpu)?;
        let throttle = optional(
            gpu,
            "read clock throttle reasons",
            dev.current_throttle_reasons(),
        )?;
        Ok(TelemetrySample {
            sm_clock_mhz: optional(gpu, "read SM clock", dev.clock_info(Clock::SM))?.map(f64::from),
            memory_clock_mhz: optional(gpu, "read memory clock", dev.clock_info(Clock::Memory))?
                .map(f64::from),
            temperature_c: optional(
                gpu,
                "read temperature",
                dev.temperature(TemperatureSensor::Gpu),
            )?
            .map(f64::from),
            power_w: optional(gpu, "read power draw", dev.power_usage())?
                .map(|mw| f64::from(mw) / 1000.0),
            throttle_reasons: throttle.map(throttle_names).unwrap_or_default(),
        })
    }

    /// Volatile (since driver load) corrected and uncorrected ECC totals.
    pub fn error_counters(&self, gpu: u32) -> Result<ErrorCounters, BackendError> {
        let dev = self.device(gpu)?;
        let count = |kind| dev.total_ecc_errors(kind, EccCounter::Volatile);
        Ok(ErrorCounters {
            ecc_corrected: optional(
                gpu,
                "read corrected ECC count",
                count(MemoryError::Corrected),
            )?,
            ecc_uncorrected: optional(
                gpu,
                "read uncorrected ECC count",
                count(MemoryError::Uncorrected),
            )?,
        })
    }

    /// The enforced and the default power limit, W (None where NVML does not give them).
    pub fn power_limits(&self, gpu: u32) -> (Option<f64>, Option<f64>) {
        let Ok(dev) = self.device(gpu) else {
            return (None, None);
        };
        let watts = |what, r: Result<u32, NvmlError>| logged(what, r).map(milliwatts);
        (
            watts("enforced power limit", dev.enforced_power_limit()),
            watts("default power limit", dev.power_management_limit_default()),
        )
    }

    /// Power draw (NVML's averaged reading and, where the driver has it, the instantaneous one)
    /// and the active throttle reasons: what the compute check samples during its burn. None
    /// when the GPU cannot be opened.
    pub fn power(&self, gpu: u32) -> Option<PowerReading> {
        let dev = self.device(gpu).ok()?;
        let instant = logged(
            "instantaneous power",
            dev.field_values_for(&[FieldId(NVML_FI_DEV_POWER_INSTANT)]),
        )
        .and_then(|v| v.into_iter().next())
        .and_then(|s| s.and_then(|s| s.value).ok())
        .and_then(sample_i64)
        .filter(|mw| *mw > 0)
        .map(|mw| mw as f64 / 1000.0);
        Some(PowerReading {
            average_w: logged("power draw", dev.power_usage()).map(milliwatts),
            instant_w: instant,
            throttle: logged("throttle reasons", dev.current_throttle_reasons())
                .map(throttle_names)
                .unwrap_or_default(),
        })
    }

    /// The GPU's PCIe link now, what it and its slot allow, and its error counters (the replay
    /// counter; the AER counters where the driver exposes them as field values).
    pub fn pcie(&self, gpu: u32) -> Result<PcieReading, BackendError> {
        let dev = self.device(gpu)?;
        let read = |what, r| optional(gpu, what, r);
        let [correctable, nonfatal, fatal] = self.fields(
            gpu,
            &dev,
            "read PCIe error counters",
            [
                NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS,
                NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR,
                NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR,
            ],
        )?;
        let count = |v: Option<i64>| v.and_then(|n| u64::try_from(n).ok());
        Ok(PcieReading {
            link_gen: read("read PCIe link generation", dev.current_pcie_link_gen())?,
            link_width: read("read PCIe link width", dev.current_pcie_link_width())?,
            max_gen: read("read max PCIe link generation", dev.max_pcie_link_gen())?,
            max_width: read("read max PCIe link width", dev.max_pcie_link_width())?,
            gpu_max_gen: self.gpu_max_pcie_gen(gpu, &dev),
            replays: read("read the PCIe replay counter", dev.pcie_replay_counter())?
                .map(u64::from),
            correctable: count(correctable),
            nonfatal: count(nonfatal),
            fatal: count(fatal),
        })
    }

    /// Remapped rows (Ampere and later) and retired pages (before Ampere) now.
    pub fn rows(&self, gpu: u32) -> Result<RowHealth, BackendError> {
        let dev = self.device(gpu)?;
        let [cor, unc, pending, failure] = remapped_rows(gpu, &dev)?;
        let [sbe, dbe, retire_pending] = self.fields(
            gpu,
            &dev,
            "read retired-page fields",
            [
                NVML_FI_DEV_RETIRED_SBE,
                NVML_FI_DEV_RETIRED_DBE,
                NVML_FI_DEV_RETIRED_PENDING,
            ],
        )?;
        Ok(RowHealth {
            remapped_correctable: cor,
            remapped_uncorrectable: unc,
            remap_pending: pending.map(|v| v != 0),
            remap_failure: failure.map(|v| v != 0),
            retired_single_bit: sbe,
            retired_double_bit: dbe,
            retire_pending: retire_pending.map(|v| v != 0),
        })
    }

    /// Field values by id: None for each the driver does not give (or where it gives none).
    fn fields<const N: usize>(
        &self,
        gpu: u32,
        dev: &Device<'static>,
        what: &str,
        ids: [u32; N],
    ) -> Result<[Option<i64>; N], BackendError> {
        let mut out = [None; N];
        let Some(samples) = optional(gpu, what, dev.field_values_for(&ids.map(FieldId)))? else {
            return Ok(out);
        };
        for (slot, sample) in out.iter_mut().zip(samples) {
            *slot = logged(what, sample.and_then(|s| s.value)).and_then(sample_i64);
        }
        Ok(out)
    }

    /// Raw `nvmlDeviceGetGpuMaxPcieLinkGeneration` (the GPU's own maximum, whatever the slot
    /// allows; the wrapper does not have it).
    fn gpu_max_pcie_gen(&self, gpu: u32, dev: &Device<'static>) -> Option<u32> {
        let lib = self.nvml.lib();
        if lib.nvmlDeviceGetGpuMaxPcieLinkGeneration.as_ref().is_err() {
            return None;
        }
        let mut raw: u32 = 0;
        // SAFETY: the symbol is present (checked above), the handle belongs to a device of the
        // live (leaked) NVML session, and `raw` is a valid out-pointer for a c_uint.
        let code = unsafe { lib.nvmlDeviceGetGpuMaxPcieLinkGeneration(dev.handle(), &mut raw) };
        match nvml_try(code) {
            Ok(()) => Some(raw).filter(|g| *g > 0),
            Err(e) => {
                debug!(gpu, error = %e, "NVML refused the GPU's own max PCIe generation");
                None
            }
        }
    }

    /// Binds the calling thread to the CPUs nearest the GPU (so pinned host memory it
    /// allocates lands on the GPU's NUMA node) and returns that node, where known. A host
    /// where NVML cannot set affinity (a container without the permission, say) just runs
    /// unbound.
    pub fn pin_thread_near(&self, gpu: u32) -> Option<u32> {
        let mut dev = self.device(gpu).ok()?;
        if let Err(e) = dev.set_cpu_affinity() {
            debug!(gpu, error = %e, "could not bind the thread near the GPU");
        }
        let bus = bus_id(gpu, &dev).ok()?;
        numa_nodes(gpu, &dev, &bus).first().copied()
    }

    /// The compute and graphics processes NVML lists on the GPU, named where NVML can.
    pub fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, BackendError> {
        let dev = self.device(gpu)?;
        let compute = dev
            .running_compute_processes()
            .map_err(|e| BackendError::gpu(gpu, "list compute processes", e))?;
        // Graphics processes are optional: some GPUs and drivers do not report them.
        let graphics = dev.running_graphics_processes().unwrap_or_default();
        let listed = compute
            .into_iter()
            .map(|p| (p, false))
            .chain(graphics.into_iter().map(|p| (p, true)));
        Ok(listed
            .map(|(p, graphics)| GpuProcess {
                pid: p.pid,
                name: self.nvml.sys_process_name(p.pid, 256).ok(),
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
                graphics,
            })
            .collect())
    }

    /// Device-wide use of the GPU: memory in use between two process lists, the utilisation
    /// and per-process SM samples since `since`, power and SM clock. Only the device's memory
    /// figure is required; the rest is None or empty where NVML does not give it.
    pub fn occupancy(&self, gpu: u32, since: SystemTime) -> Result<Occupancy, BackendError> {
        let dev = self.device(gpu)?;
        let since_us = since
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let listed_before = self.processes(gpu)?;
        let used_bytes = dev
            .memory_info()
            .map(|m| m.used)
            .map_err(|e| BackendError::gpu(gpu, "read memory in use", e))?;
        let listed_after = self.processes(gpu)?;
        let mut samples = no_samples_is_empty(dev.samples(Sampling::GpuUtilization, since_us));
        // In the order taken: the idle rule judges the later ones.
        samples.sort_by_key(|s| s.timestamp);
        let utilization = samples
            .into_iter()
            .filter(|s| s.timestamp >= since_us)
            .filter_map(|s| sample_i64(s.value))
            .map(|v| u32::try_from(v.clamp(0, 100)).unwrap_or(0))
            .collect();
        let process_sm = no_samples_is_empty(dev.process_utilization_stats(since_us))
            .into_iter()
            .filter(|s| s.timestamp >= since_us)
            .map(|s| (s.pid, s.sm_util))
            .collect();
        Ok(Occupancy {
            used_bytes: Some(used_bytes),
            listed_before,
            listed_after,
            utilization,
            process_sm,
            power_w: logged("power draw", dev.power_usage()).map(milliwatts),
            sm_clock_mhz: logged("SM clock", dev.clock_info(Clock::SM)).map(f64::from),
        })
    }

    /// Error counters of every active NVLink link of the GPU (empty without NVLink).
    pub fn nvlink_errors(&self, gpu: u32) -> Result<Vec<LinkErrors>, BackendError> {
        let dev = self.device(gpu)?;
        let mut out = Vec::new();
        for link in 0..MAX_LINKS {
            let nv = dev.link_wrapper_for(link);
            match nv.is_active() {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) if is_unsupported(&e) || matches!(e, NvmlError::InvalidArg) => break,
                Err(e) => {
                    return Err(BackendError::gpu(
                        gpu,
                        format!("read NVLink {link} state"),
                        e,
                    ));
                }
            }
            let read = |c| logged("NVLink error counter", nv.error_counter(c)).unwrap_or(0);
            out.push(LinkErrors {
                link,
                replay: read(ErrorCounter::DlReplay),
                recovery: read(ErrorCounter::DlRecovery),
                crc_flit: read(ErrorCounter::DlCrcFlit),
                crc_data: read(ErrorCounter::DlCrcData),
            });
        }
        Ok(out)
    }

    /// Critical Xid events: waits up to `timeout` for the first, then takes whatever else is
    /// queued. When no GPU can report Xids it sleeps `timeout` and returns nothing, so callers
    /// can use it as their pacing wait. NVML errors are logged and give no events.
    pub fn poll_xid(&self, timeout: Duration) -> Vec<XidEvent> {
        let mut state = self.xid.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*state, XidState::NotStarted) {
            *state = self.start_xid_watch();
        }
        match &*state {
            XidState::Watching(watch) => watch.poll(timeout),
            _ => {
                drop(state);
                std::thread::sleep(timeout);
                Vec::new()
            }
        }
    }

    fn device(&self, gpu: u32) -> Result<Device<'static>, BackendError> {
        self.nvml.device_by_index(gpu).map_err(|e| match e {
            NvmlError::InvalidArg => BackendError::NoSuchGpu(gpu),
            e => BackendError::gpu(gpu, "open the device", e),
        })
    }

    fn system_info(&self) -> SystemInfo {
        SystemInfo {
            driver_version: logged("driver version", self.nvml.sys_driver_version()),
            cuda_driver_version: logged("CUDA driver version", self.nvml.sys_cuda_driver_version())
                .map(format_cuda_version),
            nvml_version: logged("NVML version", self.nvml.sys_nvml_version()),
            hostname: crate::backend::hostname(),
            nccl_version: None,
            host: crate::host_identity::host(std::path::Path::new("/sys")),
            nics: crate::host_identity::nics(std::path::Path::new("/sys")),
        }
    }

    fn gpu_info(&self, gpu: u32) -> Result<GpuInfo, BackendError> {
        let dev = self.device(gpu)?;
        let memory = dev
            .memory_info()
            .map_err(|e| BackendError::gpu(gpu, "read memory info", e))?;
        Ok(GpuInfo {
            index: gpu,
            uuid: dev
                .uuid()
                .map_err(|e| BackendError::gpu(gpu, "read UUID", e))?,
            name: dev
                .name()
                .map_err(|e| BackendError::gpu(gpu, "read name", e))?,
            pci_bus_id: bus_id(gpu, &dev)?,
            memory_total_bytes: memory.total,
            memory_free_bytes: memory.free,
            compute_capability: optional(
                gpu,
                "read compute capability",
                dev.cuda_compute_capability(),
            )?
            .map(|c| (c.major, c.minor)),
            health: health(gpu, &dev)?,
        })
    }

    fn topo_gpu(&self, gpu: u32, cpu_words: usize) -> Result<TopoGpu, BackendError> {
        let dev = self.device(gpu)?;
        let pci_bus_id = bus_id(gpu, &dev)?;
        Ok(TopoGpu {
            index: gpu,
            cpu_affinity: optional(gpu, "read CPU affinity", dev.cpu_affinity(cpu_words))?
                .unwrap_or_default(),
            numa_nodes: numa_nodes(gpu, &dev, &pci_bus_id),
            links: self.links(gpu, &dev)?,
            pci_bus_id,
        })
    }

    /// NVML common ancestor of two GPUs as `HOSTBRIDGE` etc.; None on the diagonal or on error.
    fn ancestor(&self, i: u32, j: u32) -> Option<String> {
        if i == j {
            return None;
        }
        let (a, b) = (
            self.nvml.device_by_index(i).ok()?,
            self.nvml.device_by_index(j).ok()?,
        );
        match a.topology_common_ancestor(b) {
            Ok(level) => Some(level_name(level).to_string()),
            Err(e) => {
                debug!(gpu = i, peer = j, error = %e, "NVML refused the topology common ancestor");
                None
            }
        }
    }

    /// Links 0.. until NVML says the link does not exist (empty for GPUs without NVLink).
    fn links(&self, gpu: u32, dev: &Device<'static>) -> Result<Vec<LinkReading>, BackendError> {
        let mut out = Vec::new();
        for link in 0..MAX_LINKS {
            let nv = dev.link_wrapper_for(link);
            let active = match nv.is_active() {
                Ok(active) => active,
                Err(NvmlError::InvalidArg) => break,
                Err(e) if is_unsupported(&e) => break,
                Err(e) => {
                    return Err(BackendError::gpu(
                        gpu,
                        format!("read NVLink {link} state"),
                        e,
                    ));
                }
            };
            let mut reading = LinkReading {
                link,
                active,
                remote_bus_id: None,
                remote_type: None,
                version: None,
            };
            if active {
                reading.remote_bus_id =
                    logged("NVLink remote PCI info", nv.remote_pci_info()).map(|p| p.bus_id);
                reading.remote_type = self.remote_type(gpu, dev, link);
                reading.version =
                    logged("NVLink version", nv.version()).and_then(nvlink_generation);
            }
            out.push(reading);
        }
        Ok(out)
    }

    /// Raw `nvmlDeviceGetNvLinkRemoteDeviceType` (the wrapper's version always says Unknown).
    fn remote_type(&self, gpu: u32, dev: &Device<'static>, link: u32) -> Option<String> {
        let lib = self.nvml.lib();
        if lib.nvmlDeviceGetNvLinkRemoteDeviceType.as_ref().is_err() {
            return None;
        }
        let mut raw: u32 = 0xFF;
        // SAFETY: the symbol is present (checked above), the handle belongs to a device of the
        // live (leaked) NVML session, and `raw` is a valid out-pointer for the C enum (c_uint).
        let code = unsafe { lib.nvmlDeviceGetNvLinkRemoteDeviceType(dev.handle(), link, &mut raw) };
        match nvml_try(code) {
            Ok(()) => Some(remote_type_name(raw).to_string()),
            Err(e) => {
                debug!(gpu, link, error = %e, "NVML refused the NVLink remote device type");
                None
            }
        }
    }

    fn start_xid_watch(&self) -> XidState {
        let mut gpus = self.xid_capable_gpus();
        while !gpus.is_empty() {
            let set = match self.nvml.create_event_set() {
                Ok(set) => set,
                Err(e) => {
                    debug!(error = %e, "NVML could not create an event set; no Xid events");
                    return XidState::Unavailable;
                }
            };
            match self.register_xid(set, &gpus) {
                Ok(set) => return XidState::Watching(XidWatch { set, gpus }),
                // The wrapper frees the set on a failed registration: drop that GPU, start over.
                Err(failed) => {
                    gpus.remove(failed);
                }
            }
        }
        debug!("no GPU supports critical Xid events");
        XidState::Unavailable
    }

    /// `(uuid, index)` of every GPU whose supported events include critical Xid errors.
    fn xid_capable_gpus(&self) -> Vec<(String, u32)> {
        let count = self.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|gpu| {
                let dev = self.nvml.device_by_index(gpu).ok()?;
                let types = logged("supported event types", dev.supported_event_types())?;
                if !types.contains(EventTypes::CRITICAL_XID_ERROR) {
                    return None;
                }
                Some((logged("UUID", dev.uuid())?, gpu))
            })
            .collect()
    }

    /// Registers every GPU; on failure, the position of the GPU that failed.
    fn register_xid(
        &self,
        mut set: EventSet<'static>,
        gpus: &[(String, u32)],
    ) -> Result<EventSet<'static>, usize> {
        for (pos, (_, gpu)) in gpus.iter().enumerate() {
            let dev = self.nvml.device_by_index(*gpu).map_err(|e| {
                debug!(gpu, error = %e, "cannot open GPU for Xid events");
                pos
            })?;
            set = dev
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| {
                    debug!(gpu, error = %e.error, "cannot register GPU for Xid events");
                    pos
                })?;
        }
        Ok(set)
    }
}

impl XidWatch {
    fn poll(&self, timeout: Duration) -> Vec<XidEvent> {
        let mut out = Vec::new();
        let mut wait_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        while out.len() < MAX_DRAIN {
            match self.set.wait(wait_ms) {
                Ok(data) => out.extend(self.event(data)),
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    debug!(error = %e, "NVML event wait failed");
                    if out.is_empty() {
                        // Keep the caller's pace when NVML fails at once (a lost GPU).
                        std::thread::sleep(timeout);
                    }
                    break;
                }
            }
            wait_ms = 0;
        }
        out
    }

    fn event(&self, data: EventData<'static>) -> Option<XidEvent> {
        let xid = match data.event_data? {
            XidError::Value(v) => v,
            XidError::Unknown => XID_UNKNOWN,
        };
        let uuid = logged("UUID of the Xid event's GPU", data.device.uuid())?;
        let gpu = self
            .gpus
            .iter()
            .find(|(u, _)| *u == uuid)
            .map(|(_, gpu)| *gpu)?;
        Some(XidEvent { gpu, xid })
    }
}

/// `init_with_flags(NO_GPUS)` so a GPU-less host gives `NoGpu`, not an init error; plain
/// `init` on drivers without `nvmlInitWithFlags`.
fn open_nvml() -> Result<Nvml, BackendError> {
    match Nvml::init_with_flags(InitFlags::NO_GPUS) {
        Ok(nvml) => Ok(nvml),
        Err(NvmlError::FailedToLoadSymbol(_)) => Nvml::init().map_err(init_error),
        Err(e) => Err(init_error(e)),
    }
}

fn init_error(e: NvmlError) -> BackendError {
    match e {
        NvmlError::LibloadingError(_)
        | NvmlError::LibraryNotFound
        | NvmlError::FailedToLoadSymbol(_) => {
            debug!(error = %e, "NVML library not loadable");
            BackendError::MissingLibrary {
                library: MISSING_LIBRARY.into(),
                hint: MISSING_LIBRARY_HINT.into(),
            }
        }
        NvmlError::DriverNotLoaded => {
            BackendError::NoGpu("the NVIDIA kernel driver is not loaded".to_string())
        }
        e => BackendError::Other(format!("NVML initialisation failed: {e}")),
    }
}

/// True for errors that mean "this GPU or driver does not have it".
fn is_unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

/// Not supported → `None`; other errors → a `BackendError` naming the GPU and the request.
fn optional<T>(
    gpu: u32,
    what: &str,
    result: Result<T, NvmlError>,
) -> Result<Option<T>, BackendError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_unsupported(&e) => Ok(None),
        Err(e) => Err(BackendError::gpu(gpu, what, e)),
    }
}

/// NVML's samples, or none: NotFound means no sample was taken since the timestamp, and a
/// GPU or driver without them gives none either (logged).
fn no_samples_is_empty<T>(result: Result<Vec<T>, NvmlError>) -> Vec<T> {
    match result {
        Ok(v) => v,
        Err(NvmlError::NotFound) => Vec::new(),
        Err(e) => {
            debug!(error = %e, "NVML: cannot read utilisation samples");
            Vec::new()
        }
    }
}

/// The value, or `None` with a debug log.
fn logged<T>(what: &str, result: Result<T, NvmlError>) -> Option<T> {
    result
        .map_err(|e| debug!(error = %e, "NVML: cannot read {what}"))
        .ok()
}

fn bus_id(gpu: u32, dev: &Device<'static>) -> Result<String, BackendError> {
    dev.pci_info()
        .map(|p| p.bus_id)
        .map_err(|e| BackendError::gpu(gpu, "read PCI info", e))
}

fn health(gpu: u32, dev: &Device<'static>) -> Result<GpuHealth, BackendError> {
    let [cor, unc, pending, failure] = remapped_rows(gpu, dev)?;
    let link = |what, r: Result<u32, NvmlError>| {
        optional(gpu, what, r).map(|v| v.and_then(|n| i32::try_from(n).ok()))
    };
    Ok(GpuHealth {
        ecc_enabled: optional(gpu, "read ECC mode", dev.is_ecc_enabled())?
            .map(|m| m.currently_enabled),
        remapped_rows_correctable: cor,
        remapped_rows_uncorrectable: unc,
        remapped_rows_pending: pending.map(|v| v != 0),
        remapped_rows_failure: failure.map(|v| v != 0),
        pcie_gen: link("read PCIe link generation", dev.current_pcie_link_gen())?,
        pcie_max_gen: link("read max PCIe link generation", dev.max_pcie_link_gen())?,
        pcie_width: link("read PCIe link width", dev.current_pcie_link_width())?,
        pcie_max_width: link("read max PCIe link width", dev.max_pcie_link_width())?,
        persistence_mode: optional(gpu, "read persistence mode", dev.is_in_persistent_mode())?,
        mig_mode: optional(gpu, "read MIG mode", dev.mig_mode())?.map(|m| m.current != 0),
        vbios_version: optional(gpu, "read VBIOS version", dev.vbios_version())?,
        // Identity for the certificate: informational, so a board that cannot say is no error.
        serial: logged("the board serial", dev.serial()),
        board_part_number: logged("the board part number", dev.board_part_number()),
        inforom_version: logged("the InfoROM image version", dev.info_rom_image_version()),
    })
}

/// NVML's milliwatts in watts.
fn milliwatts(mw: u32) -> f64 {
    f64::from(mw) / 1000.0
}

/// Field values 142–145: remapped rows correctable, uncorrectable, pending, failure.
fn remapped_rows(gpu: u32, dev: &Device<'static>) -> Result<[Option<i64>; 4], BackendError> {
    let ids = [
        NVML_FI_DEV_REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_UNC,
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_FAILURE,
    ]
    .map(FieldId);
    let mut out = [None; 4];
    let Some(samples) = optional(gpu, "read remapped-row fields", dev.field_values_for(&ids))?
    else {
        return Ok(out);
    };
    for (slot, sample) in out.iter_mut().zip(samples) {
        *slot = logged("a remapped-row field", sample.and_then(|s| s.value)).and_then(sample_i64);
    }
    Ok(out)
}

fn sample_i64(v: SampleValue) -> Option<i64> {
    match v {
        SampleValue::F64(f) if f.is_finite() => Some(f as i64),
        SampleValue::F64(_) => None,
        SampleValue::U32(u) => Some(i64::from(u)),
        SampleValue::U64(u) => i64::try_from(u).ok(),
        SampleValue::I64(i) => Some(i),
    }
}

/// NUMA nodes from NVML's memory affinity; the sysfs `numa_node` of the GPU when NVML gives none.
fn numa_nodes(gpu: u32, dev: &Device<'static>, bus_id: &str) -> Vec<u32> {
    match dev.memory_affinity(node_words(), AFFINITY_SCOPE_NODE) {
        Ok(words) if words.iter().any(|w| *w != 0) => return set_bits(&words),
        Ok(_) => debug!(gpu, "NVML memory affinity is empty"),
        Err(e) => debug!(gpu, error = %e, "NVML memory affinity unavailable"),
    }
    sysfs_numa_node(bus_id).into_iter().collect()
}

fn sysfs_numa_node(bus_id: &str) -> Option<u32> {
    let path = format!(
        "/sys/bus/pci/devices/{}/numa_node",
        normalize_bus_id(bus_id)
    );
    parse_numa_node(&std::fs::read_to_string(path).ok()?)
}

/// A sysfs `numa_node` value; `-1` (unknown) → None.
fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// 64-bit words needed for a bitmask over the CPUs in `/sys/devices/system/cpu/online`.
fn cpu_words() -> usize {
    let cpus = highest_id("/sys/devices/system/cpu/online")
        .map(|max| max as usize + 1)
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1);
    words_for(cpus)
}

/// 64-bit words needed for a bitmask over the NUMA nodes in `/sys/devices/system/node/possible`.
fn node_words() -> usize {
    words_for(highest_id("/sys/devices/system/node/possible").map_or(1, |max| max as usize + 1))
}

fn words_for(bits: usize) -> usize {
    bits.div_ceil(64).max(1)
}

fn highest_id(path: &str) -> Option<u32> {
    parse_ranges(&std::fs::read_to_string(path).ok()?)?
        .into_iter()
        .max()
}

/// `13000` → `"13.0"`.
fn format_cuda_version(v: i32) -> String {
    format!(
        "{}.{}",
        cuda_driver_version_major(v),
        cuda_driver_version_minor(v)
    )
}

fn level_name(level: TopologyLevel) -> &'static str {
    match level {
        TopologyLevel::Internal => "INTERNAL",
        TopologyLevel::Single => "SINGLE",
        TopologyLevel::Multiple => "MULTIPLE",
        TopologyLevel::HostBridge => "HOSTBRIDGE",
        TopologyLevel::Node => "NODE",
        TopologyLevel::System => "SYSTEM",
    }
}

/// `nvmlIntNvLinkDeviceType_t` → name.
fn remote_type_name(raw: u32) -> &'static str {
    match raw {
        0 => "GPU",
        1 => "IBMNPU",
        2 => "SWITCH",
        _ => "UNKNOWN",
    }
}

/// `nvmlNvlinkVersion_t` → NVLink generation (1.0, 2.0/2.2, 3.0/3.1, 4.0, 5.0).
fn nvlink_generation(version: u32) -> Option<u32> {
    match version {
        1 => Some(1),
        2 | 3 => Some(2),
        4 | 5 => Some(3),
        6 => Some(4),
        7 => Some(5),
        _ => None,
    }
}

fn throttle_names(reasons: ThrottleReasons) -> Vec<String> {
    THROTTLE_NAMES
        .iter()
        .filter(|(flag, _)| reasons.contains(*flag))
        .map(|(_, name)| name.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_never_panics_and_names_the_library() {
        match NvmlHost::init() {
            Ok(host) => assert!(host.device_count().expect("count") > 0),
            Err(BackendError::MissingLibrary { library, hint }) => {
                assert_eq!(library, MISSING_LIBRARY);
                assert_eq!(hint, MISSING_LIBRARY_HINT);
            }
            Err(BackendError::NoGpu(_)) => {}
            Err(other) => panic!("unexpected init error: {other}"),
        }
    }

    /// On a GPU host: `cargo test -p gpuval-agent real_nvml -- --ignored --nocapture`.
    /// Checks our matrix against `nvidia-smi topo -m`; with `GPUVAL_CAPTURE_DIR` set, writes the
    /// snapshot and nvidia-smi's text there (fixture candidates).
    #[test]
    #[ignore = "needs an NVIDIA GPU and nvidia-smi"]
    fn real_nvml_matches_nvidia_smi() {
        use crate::checks::topology::{compare, derive, parse_nvidia_smi, render};
        let host = NvmlHost::init().expect("NVML initialises");
        let inventory = host.inventory().expect("inventory");
        println!(
            "{}",
            serde_json::to_string_pretty(&inventory).expect("json")
        );
        for gpu in 0..host.device_count().expect("count") {
            println!("GPU{gpu} {}", host.uuid(gpu).expect("uuid"));
            println!("  sample {:?}", host.sample(gpu).expect("sample"));
            println!("  ecc {:?}", host.error_counters(gpu).expect("ecc"));
            println!("  power {:?} {:?}", host.power_limits(gpu), host.power(gpu));
            println!("  pcie {:?}", host.pcie(gpu).expect("pcie"));
            println!("  rows {:?}", host.rows(gpu).expect("rows"));
        }
        println!("xid {:?}", host.poll_xid(Duration::from_millis(300)));
        let snap = host.topology().expect("topology");
        let snap_json = serde_json::to_string_pretty(&snap).expect("json");
        let report = derive(&snap);
        println!("{}", render(&report));
        let out = std::process::Command::new("nvidia-smi")
            .args(["topo", "-m"])
            .output();
        let text = String::from_utf8_lossy(&out.expect("nvidia-smi runs").stdout).into_owned();
        println!("{text}");
        if let Ok(dir) = std::env::var("GPUVAL_CAPTURE_DIR") {
            let dir = std::path::Path::new(&dir);
            std::fs::write(dir.join("snapshot.json"), snap_json + "\n").expect("write");
            std::fs::write(dir.join("nvidia-smi.txt"), &text).expect("write");
        }
        let smi = parse_nvidia_smi(&text).expect("nvidia-smi output parses");
        assert_eq!(compare(&report, &smi), Vec::<String>::new());
    }

    #[test]
    fn host_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<NvmlHost>();
    }

    #[test]
    fn nvlink_versions_map_to_generations() {
        let got: Vec<Option<u32>> = (0..=8).map(nvlink_generation).collect();
        assert_eq!(
            got,
            [
                None,
                Some(1),
                Some(2),
                Some(2),
                Some(3),
                Some(3),
                Some(4),
                Some(5),
                None
            ]
        );
    }

    #[test]
    fn remote_types_and_levels_have_names() {
        assert_eq!(
            [0, 1, 2, 255, 7].map(remote_type_name),
            ["GPU", "IBMNPU", "SWITCH", "UNKNOWN", "UNKNOWN"]
        );
        assert_eq!(level_name(TopologyLevel::HostBridge), "HOSTBRIDGE");
        assert_eq!(level_name(TopologyLevel::Internal), "INTERNAL");
    }

    #[test]
    fn throttle_reasons_use_nvml_names() {
        let r = ThrottleReasons::SW_POWER_CAP
            | ThrottleReasons::HW_SLOWDOWN
            | ThrottleReasons::GPU_IDLE;
        assert_eq!(throttle_names(r), ["GpuIdle", "SwPowerCap", "HwSlowdown"]);
        assert!(throttle_names(ThrottleReasons::NONE).is_empty());
    }

    #[test]
    fn small_conversions() {
        assert_eq!(format_cuda_version(13000), "13.0");
        assert_eq!(format_cuda_version(12090), "12.9");
        assert_eq!(parse_numa_node("1\n"), Some(1));
        assert_eq!(parse_numa_node("-1\n"), None);
        assert_eq!(sample_i64(SampleValue::U32(3)), Some(3));
        assert_eq!(sample_i64(SampleValue::U64(u64::MAX)), None);
        assert_eq!(sample_i64(SampleValue::F64(f64::NAN)), None);
        assert_eq!([0, 1, 64, 65, 192].map(words_for), [1, 1, 1, 2, 3]);
    }

    #[test]
    fn unsupported_becomes_none() {
        assert_eq!(
            optional::<u32>(0, "read x", Err(NvmlError::NotSupported)).ok(),
            Some(None)
        );
        let err =
            optional::<u32>(3, "read temperature", Err(NvmlError::GpuLost)).expect_err("error");
        assert!(
            err.to_string().starts_with("GPU3: read temperature:"),
            "{err}"
        );
    }

    #[test]
    fn missing_library_maps_to_missing_library() {
        assert!(matches!(
            init_error(NvmlError::LibraryNotFound),
            BackendError::MissingLibrary { .. }
        ));
        assert!(matches!(
            init_error(NvmlError::DriverNotLoaded),
            BackendError::NoGpu(_)
        ));
    }
}
