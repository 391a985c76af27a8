//! The administrator's settings of how agent pods get their GPUs (`--gpu-allocation`,
//! `--dra-device-class`, `--dra-driver`); [`crate::decide::reconcile::allocation`] decides from them.

/// The device class of NVIDIA's DRA driver (one GPU a device).
pub const DEFAULT_DEVICE_CLASS: &str = "gpu.nvidia.com";
/// The driver name NVIDIA's DRA driver publishes its ResourceSlices under.
pub const DEFAULT_DRIVER: &str = "gpu.nvidia.com";

/// `--gpu-allocation`: how agent pods get their GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// DRA on nodes whose GPUs appear in the driver's ResourceSlices, the extended resource
    /// elsewhere.
    #[default]
    Auto,
    /// Always the `nvidia.com/gpu` extended resource (ResourceSlices are not read).
    ExtendedResource,
    /// Always a DRA claim; a node with no GPU in the driver's ResourceSlices is not selected.
    Dra,
}

impl Mode {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::ExtendedResource => "extendedResource",
            Mode::Dra => "dra",
        }
    }

    /// Parses the flag's spelling.
    pub fn parse(s: &str) -> Result<Mode, String> {
        [Mode::Auto, Mode::ExtendedResource, Mode::Dra]
            .into_iter()
            .find(|m| m.as_str() == s.trim())
            .ok_or_else(|| {
                format!("--gpu-allocation {s:?} is not a mode: use auto, extendedResource or dra")
            })
    }
}

/// The administrator's allocation settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub mode: Mode,
    /// The DeviceClass agent claims ask for (`--dra-device-class`).
    pub device_class: String,
    /// The driver whose ResourceSlices list the GPUs (`--dra-driver`).
    pub driver: String,
}

impl Default for Allocation {
    fn default() -> Self {
        Allocation {
            mode: Mode::Auto,
            device_class: DEFAULT_DEVICE_CLASS.into(),
            driver: DEFAULT_DRIVER.into(),
        }
    }
}

impl Allocation {
    /// True when the operator reads ResourceSlices at all.
    pub fn reads_slices(&self) -> bool {
        self.mode != Mode::ExtendedResource
    }
}
