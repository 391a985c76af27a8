//! Raw device memory and launch sizing shared by the checks' CUDA code.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, result, sys};

use crate::backend::BackendError;

const ALIGN: u64 = 2 << 20;

/// A raw device allocation freed on drop.
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    pub ptr: sys::CUdeviceptr,
    pub bytes: u64,
}

impl DeviceBuffer {
    /// Allocates up to `want` bytes, backing off in steps when the driver refuses (free memory
    /// as reported includes what the context itself still needs).
    pub fn alloc_up_to(ctx: &Arc<CudaContext>, gpu: u32, want: u64) -> Result<Self, BackendError> {
        ctx.bind_to_thread()
            .map_err(|e| BackendError::gpu(gpu, "bind context", e))?;
        let mut bytes = want / ALIGN * ALIGN;
        let step = (want / 100).max(256 << 20) / ALIGN * ALIGN;
        for _ in 0..20 {
            if bytes == 0 {
                break;
            }
            // SAFETY: plain cuMemAlloc in the bound context; freed in Drop.
            match unsafe { result::malloc_sync(bytes as usize) } {
                Ok(ptr) => {
                    return Ok(Self {
                        ctx: ctx.clone(),
                        ptr,
                        bytes,
                    });
                }
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                    bytes = bytes.saturating_sub(step)
                }
                Err(e) => return Err(BackendError::gpu(gpu, format!("allocate {bytes} bytes"), e)),
            }
        }
        Err(BackendError::gpu(
            gpu,
            "allocate test memory",
            format!("the driver refused even {bytes} bytes"),
        ))
    }
}

impl DeviceBuffer {
    /// Allocates exactly `bytes` (rounded up to 16), or says how much was asked for.
    pub fn alloc_exact(ctx: &Arc<CudaContext>, gpu: u32, bytes: u64) -> Result<Self, BackendError> {
        ctx.bind_to_thread()
            .map_err(|e| BackendError::gpu(gpu, "bind context", e))?;
        let bytes = bytes.div_ceil(16).max(1) * 16;
        // SAFETY: plain cuMemAlloc in the bound context; freed in Drop.
        let ptr = unsafe { result::malloc_sync(bytes as usize) }
            .map_err(|e| BackendError::gpu(gpu, format!("allocate {} MiB", bytes >> 20), e))?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
            bytes,
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: ptr came from cuMemAlloc in this context and is freed once.
            if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                tracing::warn!(error = %e, "freeing GPU test memory failed");
            }
        }
    }
}

pub fn grid_for(ctx: &Arc<CudaContext>, blocks_per_sm: u32) -> u32 {
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .unwrap_or(80);
    (sms.max(1) as u32) * blocks_per_sm
}

/// Runs `launch` between two timing events and returns its device time in seconds.
pub fn timed<E: From<cudarc::driver::DriverError>>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    launch: impl FnOnce() -> Result<(), E>,
) -> Result<f64, E> {
    let start = ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
    start.record(stream)?;
    launch()?;
    end.record(stream)?;
    end.synchronize()?;
    Ok(f64::from(start.elapsed_ms(&end)?) / 1e3)
}
