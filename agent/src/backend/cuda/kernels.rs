//! The device kernels (`kernels.cu`), compiled by NVRTC once per GPU architecture and loaded
//! into each GPU's context.

use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::launch::{Kernel, LaunchError};
use crate::backend::BackendError;

/// CUDA C source of every gpuval kernel.
pub const SOURCE: &str = include_str!("kernels.cu");

/// The NVRTC virtual architecture for a compute capability; PTX for it is JIT-compiled by the
/// driver for the exact GPU. None lets NVRTC choose its default.
pub fn arch_for(cc: (i32, i32)) -> Option<&'static str> {
    Some(match cc {
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

/// Checks that NVRTC can be loaded (cudarc panics on a missing library, so ask first).
pub fn require_nvrtc() -> Result<(), BackendError> {
    BackendError::library_present(
        // SAFETY: only probes dlopen for the library; no other state is touched.
        unsafe { cudarc::nvrtc::sys::is_culib_present() },
        "NVRTC (libnvrtc.so)",
        "install the CUDA runtime libraries (cuda-nvrtc) or put them on LD_LIBRARY_PATH",
    )
}

/// Which cuBLAS libraries a check loads: the GEMM burn also uses cuBLASLt, the training step
/// cuBLAS alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blas {
    Only,
    WithLt,
}

/// Checks that cuBLAS (and cuBLASLt where `which` says) can be loaded (cudarc panics on a missing
/// library, so ask first); the error names the first one missing.
pub fn require_blas(which: Blas) -> Result<(), BackendError> {
    // SAFETY: only probes dlopen for the libraries; no other state is touched.
    let blas = unsafe { cudarc::cublas::sys::is_culib_present() };
    // SAFETY: as above.
    let lt = which == Blas::Only || unsafe { cudarc::cublaslt::sys::is_culib_present() };
    const HINT: &str =
        "install the CUDA runtime libraries (libcublas) or put them on LD_LIBRARY_PATH";
    BackendError::library_present(blas, "cuBLAS (libcublas.so)", HINT)?;
    BackendError::library_present(lt, "cublasLt (libcublasLt.so)", HINT)
}

/// Compiles [`SOURCE`] to PTX for `cc`.
pub fn compile(cc: Option<(i32, i32)>) -> Result<String, BackendError> {
    compile_source(SOURCE, "gpuval_kernels.cu", "the gpuval kernels", cc)
}

/// Compiles a check's CUDA C source (`name` for NVRTC's messages, `what` for ours) to PTX for
/// compute capability `cc`, the way every check's kernels are built.
pub fn compile_source(
    source: &str,
    name: &str,
    what: &str,
    cc: Option<(i32, i32)>,
) -> Result<String, BackendError> {
    require_nvrtc()?;
    let opts = CompileOptions {
        arch: cc.and_then(arch_for),
        options: vec!["--std=c++17".into()],
        name: Some(name.into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map_err(|e| BackendError::Other(format!("compiling {what} with NVRTC failed: {e}")))?;
    Ok(ptx.to_src())
}

/// For tests that compile kernels: true when NVRTC can be loaded; false (the test skips) when
/// it cannot, unless `GPUVAL_REQUIRE_NVRTC` says it must (CI installs it from the
/// nvidia-cuda-nvrtc wheel; see tests/scripts/install-nvrtc.sh). Needs no GPU.
#[cfg(test)]
pub fn nvrtc_for_tests() -> bool {
    if require_nvrtc().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os("GPUVAL_REQUIRE_NVRTC").is_none(),
        "GPUVAL_REQUIRE_NVRTC is set but libnvrtc cannot be loaded (LD_LIBRARY_PATH?)"
    );
    eprintln!("skipped: libnvrtc not loadable here");
    false
}

/// For the test of each kernel source: `compile` builds PTX for Hopper and for Ampere, with an
/// entry for each of `names` (skipped where NVRTC cannot be loaded, as [`nvrtc_for_tests`] says).
#[cfg(test)]
pub fn assert_compiles_with_nvrtc(
    compile: impl Fn(Option<(i32, i32)>) -> Result<String, BackendError>,
    names: &[&str],
) {
    if !nvrtc_for_tests() {
        return;
    }
    for cc in [(9, 0), (8, 0)] {
        let ptx = compile(Some(cc)).unwrap_or_else(|e| panic!("{cc:?}: {e}"));
        for name in names {
            assert!(
                ptx.contains(&format!(".entry {name}")),
                "{name} missing from PTX for {cc:?}"
            );
            // Every launch is checked against these widths (launch.rs): each kernel's
            // parameter list must be readable from what NVRTC really emits.
            assert!(
                super::launch::entry_params(&ptx, name).is_some(),
                "{name}'s parameters cannot be read from the PTX for {cc:?}"
            );
        }
        let target = format!(".target sm_{}{}", cc.0, cc.1);
        assert!(ptx.contains(&target), "PTX not built for {target}");
    }
}

/// Every kernel, loaded in one context.
#[derive(Clone)]
pub struct Kernels {
    pub fill: Kernel,
    pub verify: Kernel,
    pub corrupt: Kernel,
    pub fill_const: Kernel,
    pub invert: Kernel,
    pub random_fill: Kernel,
    pub random_verify: Kernel,
    pub init_f32: Kernel,
    pub init_f16: Kernel,
    pub init_bf16: Kernel,
    pub compare_f32: Kernel,
    pub compare_f16: Kernel,
    pub compare_bf16: Kernel,
    pub transcendental: Kernel,
    pub spin: Kernel,
    pub chain_init: Kernel,
    pub chase: Kernel,
}

impl Kernels {
    pub fn load(ctx: &Arc<CudaContext>, ptx: &str) -> Result<Self, LaunchError> {
        let m = ctx.load_module(Ptx::from_src(ptx))?;
        // Each field is the kernel of the same name with the `gv_` prefix.
        macro_rules! load {
            ($($field:ident),+ $(,)?) => {
                Self {
                    $($field: Kernel::load(&m, ptx, concat!("gv_", stringify!($field)))?,)+
                }
            };
        }
        Ok(load!(
            fill,
            verify,
            corrupt,
            fill_const,
            invert,
            random_fill,
            random_verify,
            init_f32,
            init_f16,
            init_bf16,
            compare_f32,
            compare_f16,
            compare_bf16,
            transcendental,
            spin,
            chain_init,
            chase,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles the real kernel source with NVRTC when the library is loadable.
    #[test]
    fn kernels_compile_with_nvrtc_for_hopper_and_ampere() {
        assert_compiles_with_nvrtc(
            compile,
            &[
                "gv_fill",
                "gv_verify",
                "gv_corrupt",
                "gv_fill_const",
                "gv_invert",
                "gv_random_fill",
                "gv_random_verify",
                "gv_init_f32",
                "gv_init_f16",
                "gv_init_bf16",
                "gv_compare_f32",
                "gv_compare_f16",
                "gv_compare_bf16",
                "gv_transcendental",
                "gv_spin",
                "gv_chain_init",
                "gv_chase",
            ],
        );
    }

    /// The p2p check's verify launch passed seven arguments to the eight-parameter gv_verify
    /// and failed on every pair of real hosts; read from the real PTX, that launch is refused.
    #[test]
    fn gv_verify_from_nvrtc_refuses_the_seven_argument_launch() {
        if !nvrtc_for_tests() {
            return;
        }
        let ptx = compile(Some((9, 0))).unwrap_or_else(|e| panic!("{e}"));
        let declared = super::super::launch::entry_params(&ptx, "gv_verify")
            .unwrap_or_else(|| panic!("gv_verify's parameters not readable"));
        assert_eq!(declared, [8, 8, 4, 4, 8, 8, 4, 8]);
        let seven = &declared[..7];
        assert!(super::super::launch::check_arguments("gv_verify", &declared, seven).is_err());
        assert!(super::super::launch::check_arguments("gv_verify", &declared, &declared).is_ok());
    }

    #[test]
    fn known_architectures_map_to_virtual_targets() {
        assert_eq!(arch_for((9, 0)), Some("compute_90"));
        assert_eq!(arch_for((8, 0)), Some("compute_80"));
        assert_eq!(arch_for((1, 0)), None);
    }
}
