//! Memory check on one GPU: one large `cuMemAlloc` of a fraction of free memory, filled with an
//! address-dependent pattern and verified word by word on the GPU, then the same with the
//! bitwise inverse (so every bit is tested as 0 and as 1). Fill and verify are device-timed.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use gpuval_crds::Mismatch;

use super::{MemoryOutcome, MemoryRequest};
use crate::backend::BackendError;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::buffer::{DeviceBuffer, grid_for, timed};
use crate::backend::cuda::kernels::Kernels;
use crate::run_control::RunControl;

const BLOCK: u32 = 512;

/// The fill and verify launches over one buffer, shared by the check and its self-test.
struct Pattern<'a> {
    stream: &'a Arc<CudaStream>,
    k: &'a Kernels,
    cfg: LaunchConfig,
    ptr: u64,
    nvec: u64,
}

impl Pattern<'_> {
    fn fill(&self, seed: u32, inv: u32) -> Result<(), cudarc::driver::DriverError> {
        let mut b = self.stream.launch_builder(&self.k.fill);
        b.arg(&self.ptr).arg(&self.nvec).arg(&seed).arg(&inv);
        // SAFETY: gv_fill writes nvec 16-byte vectors inside the buffer at ptr.
        unsafe { b.launch(self.cfg) }.map(|_| ())
    }

    fn verify(
        &self,
        seed: u32,
        inv: u32,
        counters: &mut CudaSlice<u64>,
        log: &mut CudaSlice<u64>,
        max_log: u32,
    ) -> Result<(), cudarc::driver::DriverError> {
        let mut b = self.stream.launch_builder(&self.k.verify);
        b.arg(&self.ptr)
            .arg(&self.nvec)
            .arg(&seed)
            .arg(&inv)
            .arg(counters)
            .arg(log)
            .arg(&max_log);
        // SAFETY: gv_verify reads nvec vectors and writes counters[2] and log[2 * max_log],
        // which the callers allocate with those sizes.
        unsafe { b.launch(self.cfg) }.map(|_| ())
    }
}

/// The check: fill and verify a buffer of `req.fraction` of free memory, with the pattern and
/// then its inverse, `req.passes` times.
pub(super) fn run(
    ctx: &Arc<CudaContext>,
    gpu: u32,
    k: &Kernels,
    req: &MemoryRequest,
    ctl: &RunControl<'_>,
) -> Result<MemoryOutcome, BackendError> {
    let err = |what: &str| {
        let what = what.to_string();
        move |e: cudarc::driver::DriverError| BackendError::gpu(gpu, what, e)
    };
    let stream = ctx.new_stream().map_err(err("create a stream"))?;
    let (free, total) = ctx.mem_get_info().map_err(err("read free memory"))?;
    let want = (free as f64 * req.fraction.clamp(0.0, 1.0)) as u64;
    let buf = DeviceBuffer::alloc_up_to(ctx, gpu, want)?;
    let nvec = buf.bytes / 16;
    let mut out = MemoryOutcome {
        total_bytes: total as u64,
        free_bytes_before: free as u64,
        bytes_tested: buf.bytes,
        passes: req.passes,
        ..Default::default()
    };

    let max_log = req.max_logged.max(1);
    let mut counters = stream
        .alloc_zeros::<u64>(2)
        .map_err(err("allocate counters"))?;
    let mut log = stream
        .alloc_zeros::<u64>(2 * max_log)
        .map_err(err("allocate the mismatch log"))?;
    let cfg = LaunchConfig {
        grid_dim: (grid_for(ctx, 8), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let steps = (req.passes.max(1) * 2) as f64;
    let pattern = Pattern {
        stream: &stream,
        k,
        cfg,
        ptr: buf.ptr,
        nvec,
    };

    for pass in 0..req.passes.max(1) {
        for (half, inv) in [0u32, u32::MAX].into_iter().enumerate() {
            if ctl.stopped() {
                return Err(BackendError::Stopped);
            }
            let seed: u32 = 0x6a09_e667 ^ pass.wrapping_mul(0x9e37_79b9);
            out.fill_seconds +=
                timed(ctx, &stream, || pattern.fill(seed, inv)).map_err(err("fill"))?;
            out.bytes_written += nvec * 16;

            stream
                .memset_zeros(&mut counters)
                .map_err(err("reset counters"))?;
            let max_log_u32 = max_log as u32;
            out.verify_seconds += timed(ctx, &stream, || {
                pattern.verify(seed, inv, &mut counters, &mut log, max_log_u32)
            })
            .map_err(err("verify"))?;
            out.bytes_read += nvec * 16;

            collect(&stream, gpu, &counters, &log, req, &mut out)?;
            let done = (pass as f64 * 2.0 + half as f64 + 1.0) / steps;
            report(ctl, done, buf.bytes, &out);
        }
    }
    Ok(out)
}

/// Reads the verify counters and adds the mismatches, and the first of those logged, to `out`.
fn collect(
    stream: &Arc<CudaStream>,
    gpu: u32,
    counters: &CudaSlice<u64>,
    log: &CudaSlice<u64>,
    req: &MemoryRequest,
    out: &mut MemoryOutcome,
) -> Result<(), BackendError> {
    let err =
        |what: &'static str| move |e: cudarc::driver::DriverError| BackendError::gpu(gpu, what, e);
    let max_log = req.max_logged.max(1);
    let c = stream.clone_dtoh(counters).map_err(err("read counters"))?;
    if c[0] > 0 {
        out.mismatches += c[0];
        let l = stream
            .clone_dtoh(log)
            .map_err(err("read the mismatch log"))?;
        let logged = (c[1] as usize).min(max_log);
        for e in l.chunks_exact(2).take(logged) {
            if out.first_mismatches.len() >= req.max_logged {
                break;
            }
            out.first_mismatches.push(Mismatch {
                offset: (e[0] * 4) as i64,
                expected: format!("{:#010x}", e[1] >> 32),
                actual: format!("{:#010x}", e[1] & 0xffff_ffff),
            });
        }
    }
    Ok(())
}

/// Reports progress: the size under test, the throughput so far and the mismatches found.
fn report(ctl: &RunControl<'_>, done: f64, bytes: u64, out: &MemoryOutcome) {
    let gbps =
        (out.bytes_written + out.bytes_read) as f64 / (out.fill_seconds + out.verify_seconds) / 1e9;
    ctl.progress(
        done,
        &format!(
            "{:.1} GiB, {gbps:.0} GB/s, {} mismatches",
            bytes as f64 / (1u64 << 30) as f64,
            out.mismatches
        ),
    );
}

/// Self-test of the detection path: fill, flip one bit in `count` known words, verify. Returns
/// how many mismatches the verify kernel found (must equal `count`).
fn selftest_on(
    ctx: &Arc<CudaContext>,
    gpu: u32,
    k: &Kernels,
    bytes: u64,
    count: u32,
) -> Result<u64, BackendError> {
    let err =
        |what: &'static str| move |e: cudarc::driver::DriverError| BackendError::gpu(gpu, what, e);
    let stream = ctx.new_stream().map_err(err("create a stream"))?;
    let buf = DeviceBuffer::alloc_up_to(ctx, gpu, bytes)?;
    let nvec = buf.bytes / 16;
    let nwords = buf.bytes / 4;
    let ptr: u64 = buf.ptr;
    let (seed, inv) = (7u32, 0u32);
    let cfg = LaunchConfig {
        grid_dim: (grid_for(ctx, 8), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut counters = stream
        .alloc_zeros::<u64>(2)
        .map_err(err("allocate counters"))?;
    let mut log = stream.alloc_zeros::<u64>(2).map_err(err("allocate log"))?;
    let pattern = Pattern {
        stream: &stream,
        k,
        cfg,
        ptr,
        nvec,
    };
    pattern.fill(seed, inv).map_err(err("fill"))?;
    let mut b = stream.launch_builder(&k.corrupt);
    b.arg(&ptr).arg(&nwords).arg(&count);
    // SAFETY: gv_corrupt touches words < nwords only.
    unsafe { b.launch(LaunchConfig::for_num_elems(count.max(1))) }.map_err(err("corrupt"))?;
    pattern
        .verify(seed, inv, &mut counters, &mut log, 1)
        .map_err(err("verify"))?;
    let c = stream.clone_dtoh(&counters).map_err(err("read counters"))?;
    Ok(c[0])
}

/// The memory check's self-test on one GPU: `count` bit flips planted in `bytes` of memory;
/// returns how many the verify kernel found (all of them, on a healthy GPU).
pub fn selftest(b: &CudaBackend, gpu: u32, bytes: u64, count: u32) -> Result<u64, BackendError> {
    b.on_gpu(gpu, |ctx, k| selftest_on(ctx, gpu, k, bytes, count))
}
