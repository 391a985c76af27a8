//! Host transfer check: host-to-device and device-to-host bandwidth of each GPU, with pinned
//! (page-locked, allocated near the GPU's NUMA node) and pageable host memory, each GPU alone
//! and then every GPU at once.
//!
//! Pinned copies are queued behind a start gate and device-timed; pageable copies are timed
//! on the wall clock around the whole copy, because the driver stages them through its own
//! pinned buffers on the calling thread. A host → device → host round trip of a pattern is
//! compared byte for byte. Each GPU's PCIe link is read while a batch of copies is in flight
//! (a link that trains down when idle shows its real width and speed only under load), and its
//! counters again once every GPU is done.

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaStream, sys};

use super::pcie::PcieOutcome;
use super::{Baseline, DirectionRates, HostTransferOutcome, HostTransferRequest};
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::buffer::DeviceBuffer;
use crate::backend::cuda::kernels::Kernels;
use crate::backend::cuda::timing::{self, Gate, rate};
use crate::backend::{BackendError, PcieReading};
use crate::judge::median;
use crate::run_control::RunControl;

/// Page-locked host memory freed on drop.
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
    /// Kept alive (and made current) until the memory is freed: a destroyed context has
    /// already freed it.
    ctx: Arc<CudaContext>,
}

// SAFETY: a plain owned allocation; access goes through &self / &mut self.
unsafe impl Send for PinnedBuffer {}
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Portable (usable from every context), not write-combined (the CPU reads it back).
    pub fn new(ctx: &Arc<CudaContext>, gpu: u32, len: usize) -> Result<Self, BackendError> {
        ctx.bind_to_thread()
            .map_err(|e| BackendError::gpu(gpu, "bind context", e))?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: allocates `len` bytes of pinned memory; freed once in Drop.
        unsafe { sys::cuMemHostAlloc(&mut p, len, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .result()
            .map_err(|e| {
                BackendError::gpu(
                    gpu,
                    format!("allocate {} MiB of pinned host memory", len >> 20),
                    e,
                )
            })?;
        Ok(Self {
            ptr: p.cast(),
            len,
            ctx: ctx.clone(),
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::warn!(error = %e, "binding the context to free pinned host memory failed");
        }
        // SAFETY: from cuMemHostAlloc, freed once; no copy is in flight (callers synchronize).
        if let Err(e) = unsafe { sys::cuMemFreeHost(self.ptr.cast()) }.result() {
            tracing::warn!(error = %e, "freeing pinned host memory failed");
        }
    }
}

/// One GPU's buffers for the check.
pub struct HostSide {
    pub gpu: u32,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    k: Kernels,
    gate: Gate,
    device: DeviceBuffer,
    pinned: PinnedBuffer,
    back: PinnedBuffer,
    pub numa_node: Option<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    H2d,
    D2h,
}

impl HostSide {
    /// Allocates the buffers; call on a thread already bound near the GPU.
    pub fn open(
        gpu: u32,
        ctx: Arc<CudaContext>,
        k: Kernels,
        bytes: usize,
        numa_node: Option<u32>,
    ) -> Result<Self, BackendError> {
        let stream = ctx
            .new_stream()
            .map_err(|e| BackendError::gpu(gpu, "create a stream", e))?;
        let device = DeviceBuffer::alloc_exact(&ctx, gpu, bytes as u64)?;
        let mut pinned = PinnedBuffer::new(&ctx, gpu, bytes)?;
        let back = PinnedBuffer::new(&ctx, gpu, bytes)?;
        fill_pattern(pinned.as_mut_slice(), u64::from(gpu));
        let gate = Gate::new(&ctx, gpu)?;
        Ok(Self {
            gpu,
            ctx,
            stream,
            k,
            gate,
            device,
            pinned,
            back,
            numa_node,
        })
    }

    /// Pinned rates (median of the samples), then the round-trip check. With `sync`, every
    /// GPU starts each direction together; a GPU that fails still waits at every barrier so
    /// the others are not left waiting.
    pub fn pinned_rates(
        &self,
        req: &HostTransferRequest,
        sync: Option<&Barrier>,
    ) -> Result<(DirectionRates, u64), BackendError> {
        let mut r = DirectionRates::default();
        let mut failed = None;
        for dir in [Dir::H2d, Dir::D2h] {
            if let Some(b) = sync {
                b.wait();
            }
            if failed.is_some() {
                continue;
            }
            // One untimed copy first: the first transfer of a buffer pays one-off costs (IOMMU
            // and page-table set-up) that are not the link's rate.
            if let Err(e) = self.warm_up(dir) {
                failed = Some(e);
                continue;
            }
            let mut rates = Vec::new();
            for _ in 0..req.samples.max(1) {
                match self.pinned_sample(dir, req.iterations.max(1)) {
                    Ok(v) => rates.push(v),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let m = median(rates).unwrap_or(0.0);
            match dir {
                Dir::H2d => r.h2d_gbps = m,
                Dir::D2h => r.d2h_gbps = m,
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        Ok((r, self.round_trip_mismatches()?))
    }

    fn pinned_sample(&self, dir: Dir, iterations: u32) -> Result<f64, BackendError> {
        let secs = timing::timed(
            &self.ctx,
            &self.stream,
            &self.k,
            self.gpu,
            Some(&self.gate),
            || (0..iterations).try_for_each(|_| self.copy_async(dir, self.pinned.ptr)),
        )?;
        Ok(rate(self.device.bytes * u64::from(iterations), secs))
    }

    fn warm_up(&self, dir: Dir) -> Result<(), BackendError> {
        self.copy_async(dir, self.pinned.ptr)?;
        self.stream
            .synchronize()
            .map_err(|e| BackendError::gpu(self.gpu, "synchronize", e))
    }

    fn copy_async(&self, dir: Dir, host: *mut u8) -> Result<(), BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| BackendError::gpu(self.gpu, "bind context", e))?;
        let n = self.device.bytes as usize;
        let s = self.stream.cu_stream();
        // SAFETY: `host` points at a live buffer of at least n bytes (pinned or pageable) and
        // the device buffer holds n bytes; every caller synchronizes the stream before the
        // host buffer can go away.
        let r = unsafe {
            match dir {
                Dir::H2d => sys::cuMemcpyHtoDAsync_v2(self.device.ptr, host.cast(), n, s),
                Dir::D2h => sys::cuMemcpyDtoHAsync_v2(host.cast(), self.device.ptr, n, s),
            }
        };
        r.result().map_err(|e| {
            let what = match dir {
                Dir::H2d => "copy host to device",
                Dir::D2h => "copy device to host",
            };
            BackendError::gpu(self.gpu, what, e)
        })
    }

    /// Pageable rates: ordinary (already touched) heap memory, wall-clock timed.
    pub fn pageable_rates(
        &self,
        req: &HostTransferRequest,
    ) -> Result<DirectionRates, BackendError> {
        let mut host = vec![0u8; self.device.bytes as usize];
        fill_pattern(&mut host, u64::from(self.gpu) ^ 0xfeed);
        let mut r = DirectionRates::default();
        for dir in [Dir::H2d, Dir::D2h] {
            let mut rates = Vec::new();
            for _ in 0..req.samples.max(1) {
                let t = Instant::now();
                for _ in 0..req.iterations.max(1) {
                    self.copy_async(dir, host.as_mut_ptr())?;
                }
                self.stream
                    .synchronize()
                    .map_err(|e| BackendError::gpu(self.gpu, "synchronize", e))?;
                rates.push(rate(
                    self.device.bytes * u64::from(req.iterations.max(1)),
                    t.elapsed().as_secs_f64(),
                ));
            }
            let m = median(rates).unwrap_or(0.0);
            match dir {
                Dir::H2d => r.h2d_gbps = m,
                Dir::D2h => r.d2h_gbps = m,
            }
        }
        Ok(r)
    }

    /// The PCIe link read by `read` while copies are in flight: about a dozen buffer-sized
    /// host-to-device copies are queued, `read` runs, then the copies are waited for.
    fn under_load(
        &self,
        read: impl FnOnce() -> Option<PcieReading>,
    ) -> Result<Option<PcieReading>, BackendError> {
        const LOAD_COPIES: usize = 12;
        for _ in 0..LOAD_COPIES {
            self.copy_async(Dir::H2d, self.pinned.ptr)?;
        }
        let reading = read();
        self.stream
            .synchronize()
            .map_err(|e| BackendError::gpu(self.gpu, "synchronize", e))?;
        Ok(reading)
    }

    /// Copies the pattern to the GPU and back into a second buffer; bytes that differ.
    fn round_trip_mismatches(&self) -> Result<u64, BackendError> {
        self.copy_async(Dir::H2d, self.pinned.ptr)?;
        self.copy_async(Dir::D2h, self.back.ptr)?;
        self.stream
            .synchronize()
            .map_err(|e| BackendError::gpu(self.gpu, "synchronize", e))?;
        let (a, b) = (self.pinned.as_slice(), self.back.as_slice());
        if a == b {
            return Ok(0);
        }
        Ok(a.iter().zip(b).filter(|(x, y)| x != y).count() as u64)
    }
}

/// How the check reaches one GPU's host side: `pin` binds the calling thread near the GPU (and
/// returns its NUMA node), `open` builds its buffers, `pcie` reads its PCIe link and counters.
struct Reach<'a> {
    pin: &'a (dyn Fn(u32) -> Option<u32> + Sync),
    open: &'a (dyn Fn(u32, Option<u32>) -> Result<HostSide, BackendError> + Sync),
    pcie: &'a (dyn Fn(u32) -> Option<PcieReading> + Sync),
}

/// Runs the whole check for every GPU: alone one at a time (the PCIe link read under load),
/// then pinned all at once; then every GPU's PCIe counters again. Every thread that allocates
/// or copies is first bound near its GPU. The counters' window starts at `baseline` (at this
/// check's start for a GPU it lacks).
fn run(
    gpus: &[u32],
    req: &HostTransferRequest,
    baseline: &Baseline,
    ctl: &RunControl<'_>,
    reach: &Reach<'_>,
) -> BTreeMap<u32, Result<HostTransferOutcome, BackendError>> {
    let before: Baseline = gpus
        .iter()
        .filter_map(|&g| {
            let r = baseline.get(&g).copied().or_else(|| (reach.pcie)(g));
            r.map(|r| (g, r))
        })
        .collect();
    let mut results = measure_all(gpus, req, ctl, reach);
    for (gpu, r) in results.iter_mut() {
        if let Ok(o) = r {
            o.pcie = Some(PcieOutcome {
                before: before.get(gpu).copied(),
                under_load: o.pcie.and_then(|p| p.under_load),
                after: (reach.pcie)(*gpu),
            });
        }
    }
    results
}

/// The transfers: every GPU alone, then pinned all at once.
fn measure_all(
    gpus: &[u32],
    req: &HostTransferRequest,
    ctl: &RunControl<'_>,
    reach: &Reach<'_>,
) -> BTreeMap<u32, Result<HostTransferOutcome, BackendError>> {
    let (pin, open) = (reach.pin, reach.open);
    let mut results = BTreeMap::new();
    let mut ready = Vec::new();
    for (gpu, side) in on_threads(gpus.iter().map(|&g| (g, g)), |g| open(g, pin(g))) {
        match side {
            Ok(s) => ready.push(s),
            Err(e) => {
                results.insert(gpu, Err(e));
            }
        }
    }

    let steps = ready.len() as f64 + 1.0;
    for (i, side) in ready.iter().enumerate() {
        if ctl.stopped() {
            results.insert(side.gpu, Err(BackendError::Stopped));
            continue;
        }
        let t = Instant::now();
        let measured = on_threads([(side.gpu, side)], |s| {
            pin(s.gpu);
            alone(s, req, || (reach.pcie)(s.gpu))
        })
        .pop()
        .map_or_else(
            || Err(BackendError::gpu(side.gpu, "host transfers", "no result")),
            |(_, r)| r,
        );
        ctl.progress(
            (i as f64 + 1.0) / steps,
            &format!("GPU{} host transfers", side.gpu),
        );
        results.insert(
            side.gpu,
            measured.map(|mut o| {
                o.seconds = t.elapsed().as_secs_f64();
                o
            }),
        );
    }

    if req.pinned && ready.len() > 1 && !ctl.stopped() {
        let ok: Vec<&HostSide> = ready
            .iter()
            .filter(|s| matches!(results.get(&s.gpu), Some(Ok(_))))
            .collect();
        let barrier = Barrier::new(ok.len());
        let together = on_threads(ok.iter().map(|s| (s.gpu, *s)), |side| {
            pin(side.gpu);
            side.pinned_rates(req, Some(&barrier))
        });
        for (gpu, r) in together {
            if let Some(Ok(o)) = results.get_mut(&gpu) {
                match r {
                    Ok((rates, bad)) => {
                        o.pinned_concurrent = Some(rates);
                        o.mismatches += bad;
                    }
                    Err(e) => {
                        results.insert(gpu, Err(e));
                    }
                }
            }
        }
        ctl.progress(1.0, "all GPUs at once");
    }
    results
}

/// Runs `f` on one thread per `(gpu, item)`, all at once, and returns each GPU's result in
/// order (a panicked thread becomes that GPU's error).
fn on_threads<T, R>(
    items: impl IntoIterator<Item = (u32, T)>,
    f: impl Fn(T) -> Result<R, BackendError> + Sync,
) -> Vec<(u32, Result<R, BackendError>)>
where
    T: Send,
    R: Send,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .into_iter()
            .map(|(gpu, item)| {
                let f = &f;
                (gpu, s.spawn(move || f(item)))
            })
            .collect();
        handles
            .into_iter()
            .map(|(gpu, h)| {
                let r = h.join().unwrap_or_else(|_| {
                    Err(BackendError::gpu(gpu, "host transfers", "thread panicked"))
                });
                (gpu, r)
            })
            .collect()
    })
}

/// One GPU alone: pinned and pageable rates, and its PCIe link read under load.
fn alone(
    side: &HostSide,
    req: &HostTransferRequest,
    pcie: impl FnOnce() -> Option<PcieReading>,
) -> Result<HostTransferOutcome, BackendError> {
    let mut out = HostTransferOutcome {
        numa_node: side.numa_node,
        pcie: Some(PcieOutcome {
            under_load: side.under_load(pcie)?,
            ..Default::default()
        }),
        ..Default::default()
    };
    if req.pinned {
        let (rates, bad) = side.pinned_rates(req, None)?;
        out.pinned = Some(rates);
        out.mismatches += bad;
    }
    if req.pageable {
        out.pageable = Some(side.pageable_rates(req)?);
    }
    Ok(out)
}

/// An index-dependent byte pattern (cheap; every 8-byte word differs).
fn fill_pattern(buf: &mut [u8], seed: u64) {
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let v = (i as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(seed)
            .rotate_left(17)
            .to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

impl CudaBackend {
    /// Host transfers of each of `gpus`, alone and all at once, with their PCIe links.
    pub(crate) fn host_transfer(
        &self,
        gpus: &[u32],
        req: &HostTransferRequest,
        baseline: &Baseline,
        ctl: &RunControl<'_>,
    ) -> BTreeMap<u32, Result<HostTransferOutcome, BackendError>> {
        let bytes = usize::try_from(req.buffer_bytes).unwrap_or(usize::MAX);
        let pin = |gpu: u32| self.nvml.pin_thread_near(gpu);
        let open = |gpu: u32, numa: Option<u32>| {
            self.on_gpu(gpu, |ctx, k| {
                HostSide::open(gpu, ctx.clone(), k.clone(), bytes, numa)
            })
        };
        let pcie = |gpu: u32| self.nvml.pcie(gpu).ok();
        let reach = Reach {
            pin: &pin,
            open: &open,
            pcie: &pcie,
        };
        run(gpus, req, baseline, ctl, &reach)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_words_differ_and_depend_on_seed() {
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        fill_pattern(&mut a, 1);
        fill_pattern(&mut b, 2);
        assert_ne!(a, b);
        assert_ne!(a[0..8], a[8..16]);
        let mut odd = vec![0u8; 13];
        fill_pattern(&mut odd, 1);
        assert_eq!(odd[..8], a[..8]);
    }
}
