//! The verification kernels (`kernels.cu`): compiled by NVRTC once per sweep process, loaded
//! into each rank's context, and launched outside the timed region.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;
use gpuval_crds::{Collective, NcclDtype};

use crate::backend::BackendError;
use crate::backend::cuda::kernels::compile_source;
use crate::backend::cuda::launch::{Kernel, LaunchError};
use crate::nccl::verify::value_range;

/// CUDA C source of the check's kernels.
pub const SOURCE: &str = include_str!("kernels.cu");

const BLOCK: u32 = 256;
const BLOCKS_PER_SM: u32 = 8;

/// Compiles [`SOURCE`] to PTX for compute capability `cc`.
pub fn compile(cc: Option<(i32, i32)>) -> Result<String, BackendError> {
    compile_source(SOURCE, "gpuval_nccl.cu", "the NCCL check kernels", cc)
}

/// The collective's code in `kernels.cu`.
fn code(c: Collective) -> u32 {
    match c {
        Collective::AllReduce => 0,
        Collective::AllGather => 1,
        Collective::ReduceScatter => 2,
        Collective::Broadcast => 3,
        Collective::AllToAll => 4,
    }
}

fn dtype_code(d: NcclDtype) -> u32 {
    match d {
        NcclDtype::Fp32 => 0,
        NcclDtype::Bf16 => 1,
    }
}

/// Who fills or checks what: the data type, the rank, and for checks the collective and its
/// count.
pub struct CheckArgs {
    pub collective: Collective,
    pub dtype: NcclDtype,
    pub rank: u32,
    pub ranks: u32,
    pub count: u64,
    pub seed: u32,
}

/// The kernels, loaded in one rank's context.
pub struct Kernels {
    fill: Kernel,
    check: Kernel,
    grid: u32,
}

impl Kernels {
    pub fn load(ctx: &Arc<CudaContext>, ptx: &str) -> Result<Self, LaunchError> {
        let m = ctx.load_module(Ptx::from_src(ptx))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .unwrap_or(80);
        Ok(Self {
            fill: Kernel::load(&m, ptx, "gv_nccl_fill")?,
            check: Kernel::load(&m, ptx, "gv_nccl_check")?,
            grid: u32::try_from(sms.max(1)).unwrap_or(80) * BLOCKS_PER_SM,
        })
    }

    fn cfg(&self, n: u64) -> LaunchConfig {
        let needed = n.div_ceil(u64::from(BLOCK)).max(1);
        LaunchConfig {
            grid_dim: (
                u32::try_from(needed).unwrap_or(u32::MAX).min(self.grid),
                1,
                1,
            ),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Queues the fill of `n` elements at `ptr` with what `a.rank` sends.
    pub fn fill(
        &self,
        stream: &Arc<CudaStream>,
        ptr: u64,
        n: u64,
        a: &CheckArgs,
    ) -> Result<(), LaunchError> {
        if n == 0 {
            return Ok(());
        }
        let (dt, range) = (dtype_code(a.dtype), value_range(a.ranks));
        let mut b = self.fill.on(stream);
        b.arg(&ptr)
            .arg(&n)
            .arg(&dt)
            .arg(&a.rank)
            .arg(&a.seed)
            .arg(&range);
        // SAFETY: writes n elements of the dtype at ptr, inside a buffer the caller sized.
        unsafe { b.launch(self.cfg(n)) }.map(|_| ())
    }

    /// Queues the comparison of `n` output elements at `ptr`; `result` (two u64: wrong count,
    /// lowest wrong index) must be set to `[0, u64::MAX]` first.
    pub fn check(
        &self,
        stream: &Arc<CudaStream>,
        ptr: u64,
        n: u64,
        a: &CheckArgs,
        result: u64,
    ) -> Result<(), LaunchError> {
        if n == 0 {
            return Ok(());
        }
        let (coll, dt, range, root) = (
            code(a.collective),
            dtype_code(a.dtype),
            value_range(a.ranks),
            0u32,
        );
        let mut b = self.check.on(stream);
        b.arg(&ptr)
            .arg(&n)
            .arg(&dt)
            .arg(&coll)
            .arg(&a.rank)
            .arg(&a.ranks)
            .arg(&a.count)
            .arg(&a.seed)
            .arg(&range)
            .arg(&root)
            .arg(&result);
        // SAFETY: reads n elements at ptr (inside the receive buffer) and updates two u64 at
        // result.
        unsafe { b.launch(self.cfg(n)) }.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles the real kernel source with NVRTC when the library is loadable.
    #[test]
    fn nccl_kernels_compile_with_nvrtc() {
        crate::backend::cuda::kernels::assert_compiles_with_nvrtc(
            compile,
            &["gv_nccl_fill", "gv_nccl_check"],
        );
    }

    #[test]
    fn codes_match_the_kernel_source() {
        for (c, name) in [
            (Collective::AllReduce, "GV_ALL_REDUCE"),
            (Collective::AllGather, "GV_ALL_GATHER"),
            (Collective::ReduceScatter, "GV_REDUCE_SCATTER"),
            (Collective::Broadcast, "GV_BROADCAST"),
            (Collective::AllToAll, "GV_ALL_TO_ALL"),
        ] {
            assert!(
                SOURCE.contains(&format!("#define {name} {}", code(c))),
                "{name}"
            );
        }
    }
}
