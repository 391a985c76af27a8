//! The elementwise kernels of the training step (`kernels.cu`): compiled by NVRTC once per
//! run, loaded into each replica's context.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;

use crate::backend::BackendError;
use crate::backend::cuda::buffer::grid_for;
use crate::backend::cuda::kernels::compile_source;
use crate::backend::cuda::launch::{Kernel, LaunchError};

/// CUDA C source of the training kernels.
pub const SOURCE: &str = include_str!("kernels.cu");
/// Every kernel's name in [`SOURCE`].
pub const NAMES: [&str; 7] = [
    "gv_train_fill",
    "gv_train_gelu",
    "gv_train_gelu_back",
    "gv_train_loss_grad",
    "gv_train_sgd",
    "gv_train_checksum",
    "gv_train_perturb",
];

const BLOCK: u32 = 256;
const BLOCKS_PER_SM: u32 = 8;

/// Compiles [`SOURCE`] to PTX for compute capability `cc`.
pub fn compile(cc: Option<(i32, i32)>) -> Result<String, BackendError> {
    compile_source(
        SOURCE,
        "gpuval_training.cu",
        "the training check kernels",
        cc,
    )
}

/// The kernels in one replica's context.
pub struct Kernels {
    fill: Kernel,
    gelu: Kernel,
    gelu_back: Kernel,
    loss_grad: Kernel,
    sgd: Kernel,
    checksum: Kernel,
    perturb: Kernel,
    grid: u32,
}

/// Raw device addresses of bf16 tensors.
pub type Ptr = u64;

impl Kernels {
    pub fn load(ctx: &Arc<CudaContext>, ptx: &str) -> Result<Self, LaunchError> {
        let m = ctx.load_module(Ptx::from_src(ptx))?;
        let f = |name: &str| Kernel::load(&m, ptx, name);
        Ok(Self {
            fill: f(NAMES[0])?,
            gelu: f(NAMES[1])?,
            gelu_back: f(NAMES[2])?,
            loss_grad: f(NAMES[3])?,
            sgd: f(NAMES[4])?,
            checksum: f(NAMES[5])?,
            perturb: f(NAMES[6])?,
            grid: grid_for(ctx, BLOCKS_PER_SM),
        })
    }

    /// Enough blocks for `n` items, at most a few per multiprocessor (the kernels stride).
    fn cfg(&self, n: u64) -> LaunchConfig {
        let blocks = u32::try_from(n.div_ceil(u64::from(BLOCK))).unwrap_or(u32::MAX);
        LaunchConfig {
            grid_dim: (blocks.clamp(1, self.grid.max(1)), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// `n` elements at `out` set to `scale` × a hash of (index, seed).
    pub fn fill(&self, s: &Arc<CudaStream>, out: Ptr, n: u64, seed: u64, scale: f32) -> Done {
        let mut b = self.fill.on(s);
        b.arg(&out).arg(&n).arg(&seed).arg(&scale);
        // SAFETY: writes n bf16 elements at out, inside a buffer the caller sized.
        unsafe { b.launch(self.cfg(n)) }.map(|_| ())
    }

    /// `z = gelu(a)` over `n` elements (a multiple of 8).
    pub fn gelu(&self, s: &Arc<CudaStream>, a: Ptr, z: Ptr, n: u64) -> Done {
        let n8 = n / 8;
        let mut b = self.gelu.on(s);
        b.arg(&a).arg(&z).arg(&n8);
        // SAFETY: reads and writes n elements inside buffers the caller sized.
        unsafe { b.launch(self.cfg(n8)) }.map(|_| ())
    }

    /// `g *= gelu'(a)` over `n` elements (a multiple of 8).
    pub fn gelu_back(&self, s: &Arc<CudaStream>, a: Ptr, g: Ptr, n: u64) -> Done {
        let n8 = n / 8;
        let mut b = self.gelu_back.on(s);
        b.arg(&a).arg(&g).arg(&n8);
        // SAFETY: as for gelu.
        unsafe { b.launch(self.cfg(n8)) }.map(|_| ())
    }

    /// `dy = scale × y` over `n` elements (a multiple of 8).
    pub fn loss_grad(&self, s: &Arc<CudaStream>, y: Ptr, dy: Ptr, n: u64, scale: f32) -> Done {
        let n8 = n / 8;
        let mut b = self.loss_grad.on(s);
        b.arg(&y).arg(&dy).arg(&n8).arg(&scale);
        // SAFETY: as for gelu.
        unsafe { b.launch(self.cfg(n8)) }.map(|_| ())
    }

    /// `w -= lr × g` over `n` elements (a multiple of 8).
    pub fn sgd(&self, s: &Arc<CudaStream>, w: Ptr, g: Ptr, n: u64, lr: f32) -> Done {
        let n8 = n / 8;
        let mut b = self.sgd.on(s);
        b.arg(&w).arg(&g).arg(&n8).arg(&lr);
        // SAFETY: as for gelu.
        unsafe { b.launch(self.cfg(n8)) }.map(|_| ())
    }

    /// Adds the checksum of `n` elements at `w` to the u64 at `out` (zero it first).
    pub fn checksum(&self, s: &Arc<CudaStream>, w: Ptr, n: u64, out: Ptr) -> Done {
        let mut b = self.checksum.on(s);
        b.arg(&w).arg(&n).arg(&out);
        // SAFETY: reads n elements at w and adds to one u64 at out.
        unsafe { b.launch(self.cfg(n)) }.map(|_| ())
    }

    /// Flips the lowest bit of element `i` at `w` (the test-only planted corruption).
    pub fn perturb(&self, s: &Arc<CudaStream>, w: Ptr, i: u64) -> Done {
        let mut b = self.perturb.on(s);
        b.arg(&w).arg(&i);
        // SAFETY: the caller passes an index inside the weights.
        unsafe { b.launch(LaunchConfig::for_num_elems(1)) }.map(|_| ())
    }
}

/// What a launch returns.
pub type Done = Result<(), LaunchError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles the real kernel source with NVRTC when the library is loadable.
    #[test]
    fn training_kernels_compile_with_nvrtc() {
        crate::backend::cuda::kernels::assert_compiles_with_nvrtc(compile, &NAMES);
    }
}
