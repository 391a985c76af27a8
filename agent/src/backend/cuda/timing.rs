//! Timing of copy batches: device events around the batch, optionally behind a start gate (a
//! spin kernel that holds the stream until the host opens the gate, a word in pinned,
//! device-mapped host memory), so every copy is already enqueued when the clock starts and
//! enqueue cost stays out of the timing; and the rate and median helpers.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, LaunchConfig, sys};

use super::kernels::Kernels;
use crate::backend::BackendError;

/// How long a spin kernel waits before it lets its stream go anyway (a lost gate must not
/// hang the GPU).
const SPIN_LIMIT_NS: u64 = 5_000_000_000;

/// One gate word in pinned host memory, readable by every GPU (portable, device-mapped).
pub struct Gate {
    host: *mut u32,
    device: u64,
    /// Kept alive (and made current) until the word is freed.
    ctx: Arc<CudaContext>,
}

// SAFETY: the word is only written by the owner through `&self` methods with volatile stores,
// and read by GPU kernels; the pointer stays valid until Drop.
unsafe impl Send for Gate {}
unsafe impl Sync for Gate {}

impl Gate {
    pub fn new(ctx: &Arc<CudaContext>, gpu: u32) -> Result<Self, BackendError> {
        ctx.bind_to_thread()
            .map_err(|e| BackendError::gpu(gpu, "bind context", e))?;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: allocates 4 bytes of pinned host memory; freed in Drop.
        unsafe {
            sys::cuMemHostAlloc(
                &mut host,
                4,
                sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )
        }
        .result()
        .map_err(|e| BackendError::gpu(gpu, "allocate the pinned start gate", e))?;
        let host = host.cast::<u32>();
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: host came from cuMemHostAlloc with DEVICEMAP.
        let mapped =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) }.result();
        let gate = Self {
            host,
            device,
            ctx: ctx.clone(),
        };
        mapped.map_err(|e| BackendError::gpu(gpu, "map the start gate", e))?;
        gate.close();
        Ok(gate)
    }

    /// Queues a spin kernel on `stream` that waits for [`Gate::open`].
    pub fn hold(&self, stream: &Arc<CudaStream>, k: &Kernels) -> Result<(), BackendError> {
        let mut b = k.spin.on(stream);
        b.arg(&self.device).arg(&SPIN_LIMIT_NS);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: gv_spin only reads the gate word, which lives until Drop.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| BackendError::Other(format!("launch the start-gate kernel: {e}")))
    }

    pub fn open(&self) {
        // SAFETY: host points at a live 4-byte pinned allocation.
        unsafe { self.host.write_volatile(1) }
    }

    pub fn close(&self) {
        // SAFETY: as in open.
        unsafe { self.host.write_volatile(0) }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::warn!(error = %e, "binding the context to free the start gate failed");
        }
        // SAFETY: host came from cuMemHostAlloc and is freed once; every kernel that read it
        // has finished (its stream was synchronized by the timing that used it).
        if let Err(e) = unsafe { sys::cuMemFreeHost(self.host.cast()) }.result() {
            tracing::warn!(error = %e, "freeing the start gate failed");
        }
    }
}

/// Device time in seconds of the work `enqueue` queues on `stream`, behind `gate` when given.
/// The gate is opened on every path, so no spin kernel outlives the call. Work that blocks the
/// host while it runs (driver-staged copies) must not go behind a gate.
pub fn timed(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    k: &Kernels,
    gpu: u32,
    gate: Option<&Gate>,
    enqueue: impl FnOnce() -> Result<(), BackendError>,
) -> Result<f64, BackendError> {
    let err = |what: &'static str| move |e| BackendError::gpu(gpu, what, e);
    let start = ctx
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(err("create an event"))?;
    let end = ctx
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(err("create an event"))?;
    if let Some(g) = gate {
        g.close();
        g.hold(stream, k)?;
    }
    let queued = start
        .record(stream)
        .map_err(err("record an event"))
        .and_then(|_| enqueue())
        .and_then(|_| end.record(stream).map_err(err("record an event")));
    if let Some(g) = gate {
        g.open();
    }
    let synced = stream.synchronize().map_err(err("synchronize"));
    queued?;
    synced?;
    let ms = start.elapsed_ms(&end).map_err(err("read event time"))?;
    Ok(f64::from(ms) / 1e3)
}

/// Bytes per second in GB/s (1e9); 0 without a time.
pub fn rate(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_per_second() {
        assert_eq!(rate(2_000_000_000, 2.0), 1.0);
        assert_eq!(rate(5, 0.0), 0.0);
    }
}
