//! Kernel launches checked against the parameters the kernel itself declares.
//!
//! `cuLaunchKernel` reads exactly as many parameters as the kernel declares, through the
//! pointer array it is given, and trusts their widths. A launch that passes one argument too
//! few makes the driver read past the array: it refuses with `CUDA_ERROR_INVALID_VALUE` when it
//! finds a null there, or runs the kernel on garbage when it does not. That is how the p2p
//! check failed on every pair of real multi-GPU hosts after `gv_verify` gained a parameter and
//! one of its two launch sites did not. Nothing without a GPU could see it.
//!
//! So every gpuval kernel is loaded as a [`Kernel`] that knows its parameters' widths (read from
//! the PTX it was loaded from) and launched through a [`Launch`] that records the width of each
//! argument pushed. A launch whose arguments differ from the declaration is refused before the
//! driver sees it, with an error naming the kernel and both lists ([`check_arguments`], the
//! same rule the tests apply to every kernel source without a GPU).

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DriverError, LaunchArgs, LaunchConfig,
    PushKernelArg,
};

/// Why a launch did not happen.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The arguments pushed do not match the kernel's parameters: a gpuval bug, never hardware.
    #[error(
        "kernel {kernel} declares {} parameter(s) of widths {declared:?} bytes but the launch \
         passed {} of widths {passed:?} (a gpuval bug: the Rust launch and the CUDA kernel \
         disagree; report it with this message)",
        declared.len(),
        passed.len()
    )]
    Arguments {
        kernel: String,
        declared: Vec<u8>,
        passed: Vec<u8>,
    },
    /// A kernel named in the code is not in the PTX it was loaded from.
    #[error("kernel {0} is not in the compiled PTX (a gpuval bug: report it)")]
    Missing(String),
    #[error(transparent)]
    Driver(#[from] DriverError),
}

/// The rule a launch must keep: as many arguments as the kernel declares, each as wide.
pub fn check_arguments(kernel: &str, declared: &[u8], passed: &[u8]) -> Result<(), LaunchError> {
    if declared == passed {
        return Ok(());
    }
    Err(LaunchError::Arguments {
        kernel: kernel.to_string(),
        declared: declared.to_vec(),
        passed: passed.to_vec(),
    })
}

/// The widths in bytes of `.entry name(...)`'s parameters in `ptx`; None when the entry is not
/// there or a parameter has a form gpuval's kernels never use (structs, arrays).
pub fn entry_params(ptx: &str, name: &str) -> Option<Vec<u8>> {
    let head = format!(".entry {name}(");
    let start = ptx.find(&head)? + head.len();
    let body = &ptx[start..];
    let list = &body[..body.find(')')?];
    list.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(param_width)
        .collect()
}

/// `.param .u64 gv_fill_param_0` → 8.
fn param_width(decl: &str) -> Option<u8> {
    let mut words = decl.split_whitespace();
    if words.next()? != ".param" {
        return None;
    }
    match words.next()? {
        ".u64" | ".s64" | ".b64" | ".f64" => Some(8),
        ".u32" | ".s32" | ".b32" | ".f32" => Some(4),
        ".u16" | ".s16" | ".b16" | ".f16" => Some(2),
        ".u8" | ".s8" | ".b8" => Some(1),
        _ => None,
    }
}

/// A kernel loaded into one context, with the parameter widths its PTX declares.
#[derive(Clone, Debug)]
pub struct Kernel {
    name: Arc<str>,
    func: CudaFunction,
    params: Arc<[u8]>,
}

impl Kernel {
    /// Loads `name` from `module`, which was built from `ptx`.
    pub fn load(module: &Arc<CudaModule>, ptx: &str, name: &str) -> Result<Self, LaunchError> {
        let params = entry_params(ptx, name).ok_or_else(|| LaunchError::Missing(name.into()))?;
        Ok(Self {
            name: name.into(),
            func: module.load_function(name)?,
            params: params.into(),
        })
    }

    /// The kernel's name in the CUDA source.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Starts a launch of this kernel on `stream`.
    pub fn on<'a>(&'a self, stream: &'a Arc<CudaStream>) -> Launch<'a> {
        Launch {
            kernel: self,
            args: stream.launch_builder(&self.func),
            passed: Vec::with_capacity(self.params.len()),
        }
    }
}

/// One kernel launch being built: the arguments, and the width of each.
pub struct Launch<'a> {
    kernel: &'a Kernel,
    args: LaunchArgs<'a>,
    passed: Vec<u8>,
}

impl<'a> Launch<'a> {
    /// Pushes the next argument.
    pub fn arg(&mut self, arg: impl KernelArg<'a>) -> &mut Self {
        self.passed.push(arg.push(&mut self.args));
        self
    }

    /// Launches, unless the arguments differ from the kernel's parameters.
    ///
    /// # Safety
    /// As for cudarc's `LaunchArgs::launch`: the arguments must be what the kernel reads and
    /// writes, and every buffer must hold what the kernel touches under `cfg`.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), LaunchError> {
        check_arguments(self.kernel.name(), &self.kernel.params, &self.passed)?;
        // SAFETY: the caller vouches for the arguments' meaning; their count and widths were
        // just checked against the kernel's own declaration.
        unsafe { self.args.launch(cfg) }?;
        Ok(())
    }
}

/// What may be passed to a kernel, and its width as the kernel sees it. Device buffers pass as
/// 8-byte device pointers, whether a cudarc slice or a raw `CUdeviceptr` (`u64`).
pub trait KernelArg<'a> {
    /// Pushes the argument onto `args` and returns its width in bytes.
    fn push(self, args: &mut LaunchArgs<'a>) -> u8;
}

macro_rules! scalar_arg {
    ($($t:ty),+) => {$(
        impl<'a> KernelArg<'a> for &'a $t {
            fn push(self, args: &mut LaunchArgs<'a>) -> u8 {
                args.arg(self);
                std::mem::size_of::<$t>() as u8
            }
        }
    )+};
}
scalar_arg!(u64, u32, f32, i32);

impl<'a, T> KernelArg<'a> for &'a CudaSlice<T> {
    fn push(self, args: &mut LaunchArgs<'a>) -> u8 {
        args.arg(self);
        8
    }
}

impl<'a, T> KernelArg<'a> for &'a mut CudaSlice<T> {
    fn push(self, args: &mut LaunchArgs<'a>) -> u8 {
        args.arg(self);
        8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "
.visible .entry gv_verify(
\t.param .u64 gv_verify_param_0,
\t.param .u64 gv_verify_param_1,
\t.param .u32 gv_verify_param_2,
\t.param .u32 gv_verify_param_3,
\t.param .u64 gv_verify_param_4,
\t.param .u64 gv_verify_param_5,
\t.param .u32 gv_verify_param_6,
\t.param .u64 gv_verify_param_7
)
{
}
.visible .entry gv_none()
{
}
";

    #[test]
    fn reads_each_parameters_width_from_the_ptx() {
        assert_eq!(
            entry_params(PTX, "gv_verify"),
            Some(vec![8, 8, 4, 4, 8, 8, 4, 8])
        );
        assert_eq!(entry_params(PTX, "gv_none"), Some(vec![]));
        assert_eq!(entry_params(PTX, "gv_missing"), None);
        // A prefix of another kernel's name is not that kernel.
        assert_eq!(entry_params(PTX, "gv_ver"), None);
    }

    #[test]
    fn a_launch_one_argument_short_is_refused_with_both_lists() {
        // The p2p check's verify launch before the fix: gv_verify without its bit tally.
        let err = check_arguments(
            "gv_verify",
            &[8, 8, 4, 4, 8, 8, 4, 8],
            &[8, 8, 4, 4, 8, 8, 4],
        )
        .expect_err("seven arguments for eight parameters must be refused");
        let text = err.to_string();
        assert!(text.contains("gv_verify"), "{text}");
        assert!(text.contains("declares 8 parameter(s)"), "{text}");
        assert!(text.contains("passed 7"), "{text}");
    }

    #[test]
    fn a_launch_with_a_narrower_argument_is_refused() {
        assert!(check_arguments("k", &[8, 4], &[4, 4]).is_err());
        assert!(check_arguments("k", &[8, 4], &[8, 4]).is_ok());
    }
}
