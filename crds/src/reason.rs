//! Why a check, a GPU or a node got its verdict, in a form an operator can act on: every reason
//! carries a stable [`Code`], a [`Severity`] (what it does to the verdict) and a recommended
//! [`Action`], beside its message in plain words.
//!
//! The codes are one table (the `codes!` invocation below): each code's default severity,
//! action, whether it is a performance figure measured once more before it fails, and what it
//! means. A reason cannot be made without a code; adding one is a row here (the exhaustive
//! matches follow from it) and a row in docs/checks-and-reasons.md's table of codes (a test compares them). A validation may raise or lower the severity of any code that is not an
//! Error ([`SeverityOverride`]): an Error means a check could not measure, never a hardware
//! verdict, so it is never turned into a pass.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::Verdict;

/// A JSON schema `{type: string, enum: [...]}` over an [`api_spelling!`] enum's `ALL`.
macro_rules! string_enum_schema {
    ($ty:ident, $description:literal) => {
        crate::schema_inline::inline_schema!($ty, |_| {
            let names: Vec<&str> = $ty::ALL.iter().map(|v| v.as_str()).collect();
            schemars::json_schema!({
                "type": "string",
                "enum": names,
                "description": $description,
            })
        });
    };
}

/// How much a reason weighs on its verdict.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub enum Severity {
    /// Worth knowing; the verdict does not change.
    Info,
    /// The verdict is at least Warn (the node still passes).
    Warn,
    /// The check could not measure: the verdict is at least Error (not a hardware verdict).
    Error,
    /// The verdict is Fail (the worst: a hardware fault leads over a check that could not run).
    #[default]
    Fail,
}

crate::spelling::api_spelling!(Severity {
    Info => "Info",
    Warn => "Warn",
    Fail => "Fail",
    Error => "Error",
});

impl Severity {
    /// The verdict a reason of this severity gives its result at least.
    pub fn verdict(self) -> Verdict {
        match self {
            Severity::Info => Verdict::Pass,
            Severity::Warn => Verdict::Warn,
            Severity::Fail => Verdict::Fail,
            Severity::Error => Verdict::Error,
        }
    }
}

string_enum_schema!(
    Severity,
    "How much a reason weighs on its verdict: Info (no change), Warn, Fail, or Error (could not measure)."
);

/// What an operator should do about a reason, from least to most drastic (so `max` of a node's
/// reasons is the one step that covers them all).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub enum Action {
    /// Nothing to do (or nothing gpuval can recommend: see the message).
    #[default]
    None,
    /// Run the validation again (the GPU was busy, a check could not run, a transient error).
    Rerun,
    /// Reset the GPU (`nvidia-smi -r`, or drain the node and reload the driver), then re-run.
    ResetGpu,
    /// Reboot the node (a GPU fell off the bus, links or fabric need re-training), then re-run.
    RebootNode,
    /// Report the GPU or the node for repair or replacement.
    ReplaceHardware,
}

crate::spelling::api_spelling!(Action {
    None => "None",
    Rerun => "Rerun",
    ResetGpu => "ResetGpu",
    RebootNode => "RebootNode",
    ReplaceHardware => "ReplaceHardware",
});

string_enum_schema!(
    Action,
    "What to do about it, least to most drastic: None, Rerun, ResetGpu, RebootNode, ReplaceHardware."
);

/// The code table: `Variant => (default severity, default action, performance, "meaning")`.
/// Generates [`Code`] with `ALL`, `as_str`, `severity`, `action`, `is_performance` and
/// `meaning`; the API spelling of a code is its variant name.
macro_rules! codes {
    ($($variant:ident => ($severity:ident, $action:ident, $perf:literal, $meaning:literal),)+) => {
        /// A reason's stable code (its API spelling is the variant name). See each variant's
        /// meaning, default severity and action in [`Code::meaning`], [`Code::severity`] and
        /// [`Code::action`].
        #[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code {
            $(#[doc = $meaning] $variant,)+
        }

        impl Code {
            /// Every code, in table order.
            pub const ALL: [Code; [$(stringify!($variant)),+].len()] = [$(Code::$variant),+];

            /// The code as the API writes it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => stringify!($variant),)+
                }
            }

            /// The severity a reason of this code has unless the spec overrides it.
            pub fn severity(self) -> Severity {
                match self {
                    $(Code::$variant => Severity::$severity,)+
                }
            }

            /// The action a reason of this code recommends (an Xid's comes from its catalogue
            /// entry instead).
            pub fn action(self) -> Action {
                match self {
                    $(Code::$variant => Action::$action,)+
                }
            }

            /// True for a performance figure below its floor or its peers that the runner
            /// measures once more before it fails (`spec.thresholds.remeasure`): the memory,
            /// compute, host transfer and peer-to-peer figures.
            pub fn is_performance(self) -> bool {
                match self {
                    $(Code::$variant => $perf,)+
                }
            }

            /// What the code means, in a sentence.
            pub fn meaning(self) -> &'static str {
                match self {
                    $(Code::$variant => $meaning,)+
                }
            }
        }
    };
}

codes! {
    // ---- the node as a whole: inventory, expectations, versions, the run ----
    GpuCountMismatch => (Fail, RebootNode, false, "NVML sees a different number of GPUs than the node should have (its nvidia.com/gpu capacity, its nvidia.com/gpu.count label, or the DRA driver's ResourceSlices); the checks were not run."),
    GpuCountUnexpected => (Fail, None, false, "NVML sees a different number of GPUs than spec.expect.gpuCount asks for: a finding of what the spec expects, not a measured fault (a typo in the spec, or a GPU the node lost), so it takes no action on the node; the checks were not run."),
    DraAllocationMismatch => (Fail, Rerun, false, "The GPUs NVML shows the agent are not the ones its Dynamic Resource Allocation claim was given (both lists are named); the checks were not run."),
    GpuBusIdMismatch => (Fail, None, false, "A PCI bus id listed in spec.expect.pciBusIds has no GPU (or a GPU sits at one not listed): a finding of what the spec expects, not a measured fault, so it takes no action on the node (fix the spec, or look at the node); the checks were not run."),
    NoGpus => (Error, RebootNode, false, "The driver reports no GPU at all."),
    InventoryFailed => (Error, Rerun, false, "The GPUs could not be inventoried (NVML refused)."),
    PersistenceModeUnexpected => (Warn, None, false, "A GPU's persistence mode is not what spec.expect.persistenceMode asks for."),
    EccModeUnexpected => (Fail, None, false, "A GPU's ECC mode is not what spec.expect.eccMode asks for (default On); a finding of what the spec expects, not a measured fault, so it takes no action on the node; changing the mode takes effect after a GPU reset."),
    MigModeUnexpected => (Fail, None, false, "A GPU's MIG mode is not what spec.expect.migMode asks for (default Off); a finding of what the spec expects, not a measured fault, so it takes no action on the node; changing the mode takes effect after a GPU reset."),
    VbiosMixed => (Warn, None, false, "The GPUs of one node run different VBIOS versions."),
    GpuExcludedFromCuda => (Warn, None, false, "NVML lists a GPU that CUDA_VISIBLE_DEVICES (or the container's device list) leaves out: it was not tested."),
    GpuInvisibleToCuda => (Fail, RebootNode, false, "NVML lists a GPU that CUDA cannot see although nothing restricts CUDA's devices: it was not tested."),
    ForeignProcess => (Error, Rerun, false, "A process that is not the agent's ran on a GPU under test (its pid, name and memory are named): the GPU was busy, so its figures are not judged as hardware; stop it and rerun."),
    GpuBusy => (Error, Rerun, false, "Other work used a GPU under test, seen without a process list (memory held by processes the agent cannot see, as from another PID namespace, or utilisation while the agent ran nothing on it; what, how much and when are named): its figures are not judged as hardware; free the GPU and rerun."),
    GpuHeldByNoPod => (Error, Rerun, false, "A GPU under test held memory or load that no process the agent can see and no pod the kubelet lists holds (the PodResources API is mounted): a host process, a container given the GPU without asking for it, or a GPU left stuck by a fault (Xid 31/43/79-class); its figures are not judged as hardware. Free it and rerun; where it is seen in consecutive runs the operator recommends ResetGpu for the node."),
    GpuBusyAllowed => (Warn, None, false, "Other work used a GPU under test where the administrator allows sharing GPUs (what, how much and when are named): its figures may reflect the sharing."),
    FigureWhileBusy => (Error, Rerun, false, "A figure fell short on a GPU that was busy with other work (or a node-level figure a busy GPU took part in): it may reflect the sharing, so it is judged neither a fault nor a pass (the message keeps the figure and the code it would have had); rerun when the GPU is free."),
    ForeignProcessAllowed => (Warn, None, false, "A process that is not the agent's ran on a GPU under test, where the administrator allows sharing GPUs."),
    ProcessUnidentified => (Warn, None, false, "A process NVML cannot name ran on a GPU under test (another PID namespace?): if it is not the agent's, stop it and rerun."),
    RunStopped => (Error, Rerun, false, "The run was stopped (SIGTERM) before it finished."),
    CheckCouldNotRun => (Error, Rerun, false, "A check could not run (a GPU operation failed, memory was refused, an internal error)."),
    LibraryMissing => (Error, None, false, "A library the check needs is not installed (the message says which and how to install it)."),
    TempDirUnusable => (Error, None, false, "The agent's temporary directory (TMPDIR) cannot hold the working directory of the NCCL, training or fabric child process (read-only, missing or full; the path is named): the installation's setting, not the node's; give the agent a writable TMPDIR (the chart's pod mounts one at /tmp)."),
    MeasurementMissing => (Error, Rerun, false, "A check that was asked for produced no figure for a GPU: never a pass."),
    SecondMeasurement => (Info, None, false, "A performance figure fell short, was measured again, and the second measurement decided."),
    // ---- GPU health and telemetry during the run ----
    XidFatal => (Fail, ResetGpu, false, "The driver reported an Xid that NVIDIA's catalogue treats as fatal to the GPU; the action is the catalogue's."),
    XidNonFatal => (Warn, Rerun, false, "The driver reported an Xid that NVIDIA's catalogue does not treat as fatal (often the application's); the action is the catalogue's."),
    XidUnknown => (Warn, None, false, "The driver reported an Xid that is not in gpuval's catalogue: look it up in NVIDIA's Xid catalogue."),
    EccUncorrectable => (Fail, ResetGpu, false, "Uncorrectable ECC errors during the run."),
    ClockThrottled => (Warn, None, false, "Clocks were slowed by hardware slowdown or thermal limits (a power cap is not counted)."),
    BelowOwnBaseline => (Warn, Rerun, false, "A GPU's figure fell more than the tolerance below its own baseline (the median of its last passing runs on this node) while still clearing the model's floor: measure again, and if it stays, plan to replace the GPU before it fails."),
    RowRemapFailure => (Fail, ReplaceHardware, false, "Row remapping failed: the GPU's memory has no spare rows left."),
    RowRemapPending => (Fail, ResetGpu, false, "A row remapping is pending; a GPU reset applies it."),
    RowsRemapped => (Warn, None, false, "Rows were remapped after uncorrectable errors (the GPU copes; watch the count)."),
    PcieLinkDegraded => (Warn, None, false, "A GPU's PCIe link runs below its maximum generation or width."),
    // ---- memory ----
    MemoryMismatch => (Fail, ReplaceHardware, false, "Words of GPU memory read back different from what was written."),
    MemoryBandwidthLow => (Fail, ResetGpu, true, "Memory fill+verify throughput below its floor or far below the node's other GPUs."),
    MemoryBusy => (Error, Rerun, false, "Another process held GPU memory when the check started: the GPU was busy, which is not a hardware verdict; free it and rerun."),
    MemoryUndertested => (Fail, Rerun, false, "Much less memory was tested than asked for."),
    MemoryRowsRemapped => (Warn, ResetGpu, false, "Rows were remapped while the memory test ran (or a remapping became pending); a GPU reset applies the remapping."),
    MemoryPagesRetired => (Warn, ResetGpu, false, "Pages were retired while the memory test ran (or a retirement became pending); a GPU reset retires them."),
    // ---- compute ----
    ComputeMismatch => (Fail, ReplaceHardware, false, "GEMM or transcendental results differed between identical runs (silent data corruption)."),
    ComputeSlow => (Fail, ResetGpu, true, "Sustained TFLOP/s below its floor or far below the node's other GPUs."),
    PowerBelowTarget => (Fail, ReplaceHardware, true, "The burn's median power draw was below its share of the enforced power limit (spec minPowerFraction, else the model profile's)."),
    PowerLimitLowered => (Warn, None, false, "The GPU's enforced power limit is set below its default limit (a cap someone set: the figures are measured under it)."),
    BurnClocksSlowed => (Fail, ReplaceHardware, false, "Hardware or thermal slowdown held the clocks down in more than the allowed share of the burn's samples (spec maxSlowdownFraction)."),
    PulseMismatch => (Fail, ReplaceHardware, false, "GEMM results differed after the pulse's load-and-idle cycles (the GPU computes wrongly under power swings)."),
    // ---- host transfers ----
    HostTransferMismatch => (Fail, ReplaceHardware, false, "Bytes differed after a host → GPU → host round trip."),
    HostTransferSlow => (Fail, RebootNode, true, "Pinned host↔GPU bandwidth below its floor or far below the node's other GPUs."),
    PcieLinkBelowCapability => (Fail, RebootNode, false, "Under load, a GPU's PCIe link ran below the generation or width both the GPU and its slot support."),
    PcieLinkBelowExpected => (Fail, RebootNode, false, "Under load, a GPU's PCIe link ran below the generation or width spec.checks.hostTransfer.pcie expects."),
    PcieSlotBelowGpu => (Warn, None, false, "A GPU sits in a PCIe slot whose maximum generation is below the GPU's own."),
    PcieReplays => (Warn, None, false, "A GPU's PCIe replay counter rose during the run, within the allowed count."),
    PcieReplaysOverLimit => (Fail, ReplaceHardware, false, "A GPU's PCIe replay counter rose during the run by more than the allowed count (pcie maxReplays)."),
    PcieCorrectableErrors => (Warn, None, false, "A GPU's PCIe link logged correctable AER errors during the run, within the allowed count."),
    PcieCorrectableOverLimit => (Fail, ReplaceHardware, false, "A GPU's PCIe link logged more correctable AER errors during the run than allowed (pcie maxCorrectableErrors)."),
    PcieUncorrectableErrors => (Fail, ReplaceHardware, false, "A GPU's PCIe link logged more uncorrectable (non-fatal or fatal) AER errors during the run than allowed (pcie maxUncorrectableErrors, default 0)."),
    // ---- peer to peer and topology ----
    P2pMismatch => (Fail, ReplaceHardware, false, "Words arrived corrupted in a GPU-to-GPU copy."),
    P2pNoPeerAccess => (Fail, RebootNode, false, "Two GPUs that should reach each other directly cannot (copies go through host memory)."),
    P2pSlow => (Fail, RebootNode, true, "A GPU pair's bandwidth below its floor or far below the other pairs."),
    P2pLatencyHigh => (Fail, RebootNode, true, "A GPU pair's copy latency above the spec's ceiling."),
    P2pPairError => (Error, Rerun, false, "A GPU pair could not be measured."),
    NvlinkRecovery => (Fail, RebootNode, false, "An NVLink link retrained (recovery events) during the check."),
    NvlinkErrors => (Warn, None, false, "An NVLink link's replay and CRC counters rose far above the noise during the check."),
    NvlinkNotConnected => (Fail, RebootNode, false, "Two GPUs that should be linked by NVLink are connected another way."),
    NvlinkLinksInactive => (Fail, RebootNode, false, "A GPU has fewer active NVLink links than expected."),
    NvlinkLinkChanged => (Fail, RebootNode, false, "An NVLink link changed state during the run."),
    NotApplicable => (Info, None, false, "The check does not apply to this node (one GPU has no pairs, say)."),
    // ---- NCCL, training, file I/O ----
    NcclWrongResult => (Fail, ReplaceHardware, false, "An NCCL collective delivered wrong elements to a GPU."),
    NcclTransportFallback => (Fail, RebootNode, false, "NCCL fell back from NVLink peer-to-peer to shared memory or the network."),
    NcclBandwidthLow => (Fail, RebootNode, false, "NCCL bus bandwidth below its floor, or small collectives slower than the ceiling."),
    NcclAborted => (Error, Rerun, false, "A collective hung or NCCL failed; the communicators were aborted."),
    TrainingDiverged => (Fail, ReplaceHardware, false, "Replicas of the training step ended with different weights (silent data corruption)."),
    TrainingSlow => (Fail, RebootNode, false, "The training step's throughput, scaling or overlap fell short."),
    TrainingIncomplete => (Error, Rerun, false, "The training step stopped early or measured no step."),
    IoMismatch => (Fail, ReplaceHardware, false, "File data read back different from what was written."),
    IoDeviceError => (Fail, ReplaceHardware, false, "The disk under the io check's directory failed an operation with an I/O error (EIO, ENXIO, ENODEV) or read back fewer bytes than were written (the file and operation are named): the node's disk, not the installation; have it checked or replaced."),
    IoSlow => (Fail, None, false, "File write or read throughput below the spec's floor."),
    IoError => (Error, Rerun, false, "The file I/O check could not run or finish (the message says why)."),
    IoDirUnusable => (Error, None, false, "The io check's directory is missing, not a directory, read-only, not writable by the agent or too small for the files asked for (the path is named): the installation's setting, not the node's disk; fix the directory or the settings."),
    // ---- reports written before reasons had codes ----
    Unclassified => (Fail, None, false, "A reason from a report written before reasons carried codes."),
}

/// The codes whose cause is the installation's configuration, not the node's hardware (an io
/// check without a host path the administrator allowed, a library the image lacks). A finding
/// of only these is the validation's error: it never labels a node Fail, never sets
/// `GpuValidated=False` and never taints; the operator and the views ask
/// [`Code::is_configuration`].
/// The codes of findings that come from what a validation's spec expects of the node
/// (`spec.expect`: a GPU count, bus ids, modes) rather than from a measurement: their category
/// is [`crate::Evidence::Spec`], they say so and take no action on the node.
pub const SPEC_CODES: [Code; 5] = [
    Code::GpuCountUnexpected,
    Code::GpuBusIdMismatch,
    Code::PersistenceModeUnexpected,
    Code::EccModeUnexpected,
    Code::MigModeUnexpected,
];

pub const CONFIGURATION_CODES: [Code; 4] = [
    Code::IoError,
    Code::IoDirUnusable,
    Code::LibraryMissing,
    Code::TempDirUnusable,
];

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Code {
    type Err = crate::spelling::UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Code::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| crate::spelling::UnknownValue {
                kind: "reason code",
                value: s.to_string(),
                expected: Code::ALL
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

impl Code {
    /// True when a validation may change this code's severity: every code but those that mean
    /// a check could not measure (Error) and the legacy one.
    pub fn is_overridable(self) -> bool {
        self.severity() != Severity::Error && self != Code::Unclassified
    }

    /// True when other work on the same GPU can make a figure fall short this way: the
    /// performance figures ([`Code::is_performance`]), the node's NCCL and training figures,
    /// memory that could not be tested, a figure below the GPU's own baseline and clocks held
    /// down through the burn. Such a
    /// finding on a GPU that was busy becomes [`Code::FigureWhileBusy`], never a hardware one.
    pub fn sharing_can_lower(self) -> bool {
        self.is_performance()
            || matches!(
                self,
                Code::NcclBandwidthLow
                    | Code::TrainingSlow
                    | Code::MemoryUndertested
                    | Code::BelowOwnBaseline
                    // Another process's load heats the GPU and draws its power: the slowdown
                    // it brings is the sharing's (seen on an H100 beside a neighbour's burn).
                    | Code::BurnClocksSlowed
            )
    }

    /// True for the findings that say a GPU was busy with other work (a process named, memory
    /// or load seen without one, memory held at the memory check's start): evidence about the
    /// GPU's use, never about its hardware.
    pub fn is_busy(self) -> bool {
        matches!(
            self,
            Code::ForeignProcess
                | Code::ForeignProcessAllowed
                | Code::GpuBusy
                | Code::GpuHeldByNoPod
                | Code::GpuBusyAllowed
                | Code::MemoryBusy
        )
    }

    /// True for a finding about a GPU's use rather than its hardware: one that says the GPU
    /// was busy ([`Code::is_busy`]) or a figure not judged because it was
    /// ([`Code::FigureWhileBusy`]). Its category is [`crate::Evidence::Busy`].
    pub fn is_about_sharing(self) -> bool {
        self.is_busy() || self == Code::FigureWhileBusy
    }

    /// True for the findings whose cause is the cluster, not the node: the run was stopped
    /// (SIGTERM: an eviction, a preemption, a drain) before it finished.
    pub fn is_infrastructure(self) -> bool {
        matches!(self, Code::RunStopped)
    }

    /// True when this code's finding comes from the spec's expectation ([`SPEC_CODES`]).
    pub fn is_from_spec(self) -> bool {
        SPEC_CODES.contains(&self)
    }

    /// True when this code's cause is configuration, not hardware ([`CONFIGURATION_CODES`]).
    pub fn is_configuration(self) -> bool {
        CONFIGURATION_CODES.contains(&self)
    }

    /// True when `codes` (a result's or node line's comma-separated codes) is not empty and
    /// every code in it is a configuration code: the finding says nothing about the node. An
    /// unknown code counts as hardware.
    pub fn only_configuration(codes: &str) -> bool {
        let mut any = false;
        for c in codes.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            match c.parse::<Code>() {
                Ok(code) if code.is_configuration() => any = true,
                _ => return false,
            }
        }
        any
    }

    /// The codes a validation may override, in table order.
    pub fn overridable() -> impl Iterator<Item = Code> {
        Code::ALL.into_iter().filter(|c| c.is_overridable())
    }
}

string_enum_schema!(
    Code,
    "A reason's stable code (see the README's list of codes)."
);

/// The schema of an overridable code: the codes a validation may name.
fn overridable_code_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = Code::overridable().map(Code::as_str).collect();
    schemars::json_schema!({
        "type": "string",
        "enum": names,
        "maxLength": MAX_CODE_LEN,
        "description": "The reason code whose severity changes (a code whose default severity is Error cannot be overridden: a check that could not measure never passes).",
    })
}

/// The longest code (the schema's bound, which keeps the uniqueness rule's CEL cost low).
pub const MAX_CODE_LEN: usize = 40;

/// The schema of an override's severity: Info, Warn or Fail (never Error).
fn override_severity_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["Info", "Warn", "Fail"],
        "description": "The severity reasons of that code get: Info (noted, no effect on the verdict), Warn or Fail.",
    })
}

/// One reason: its code, severity, recommended action and message.
#[derive(Serialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct Reason {
    pub code: Code,
    pub severity: Severity,
    pub action: Action,
    /// In plain words, naming the GPU, pair, link or file (`GPU3 memory: 2 mismatched words`).
    pub message: String,
}

impl Reason {
    /// A reason with its code's default severity and action.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            severity: code.severity(),
            action: code.action(),
            message: message.into(),
        }
    }

    /// The same reason recommending `action` (an Xid's catalogue entry, say).
    pub fn with_action(mut self, action: Action) -> Self {
        self.action = action;
        self
    }

    /// The same reason with `severity`.
    pub fn with_severity(mut self, severity: Severity) -> Self {
        self.severity = severity;
        self
    }

    /// `[ResetGpu] GPU3: Xid 48 ...`: the message with its action when there is one.
    pub fn with_action_prefix(&self) -> String {
        match self.action {
            Action::None => self.message.clone(),
            a => format!("[{a}] {}", self.message),
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::ops::Deref for Reason {
    type Target = str;
    fn deref(&self) -> &str {
        &self.message
    }
}

impl PartialEq<str> for Reason {
    fn eq(&self, other: &str) -> bool {
        self.message == other
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.message == *other
    }
}

impl PartialEq<String> for Reason {
    fn eq(&self, other: &String) -> bool {
        &self.message == other
    }
}

/// What a stored reason may look like: the object, or the plain string of a report written
/// before reasons carried codes (kept readable: `bench/results/` holds such reports). The
/// report's schema leaves `code` a string, so an agent newer than the CRD can still store a
/// code the CRD does not list.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredReason {
    Full {
        code: String,
        severity: Severity,
        action: Action,
        message: String,
    },
    Text(String),
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match StoredReason::deserialize(d)? {
            StoredReason::Full {
                code,
                severity,
                action,
                message,
            } => Reason {
                // A code from a newer agent reads as Unclassified rather than failing the whole
                // report; the message still says what happened.
                code: code.parse().unwrap_or(Code::Unclassified),
                severity,
                action,
                message,
            },
            StoredReason::Text(message) => Reason::new(Code::Unclassified, message),
        })
    }
}

crate::schema_inline::inline_schema!(Reason, |g| {
    schemars::json_schema!({
        "type": "object",
        "description": "Why a verdict is what it is: a stable code, its severity, the recommended action, and the message in plain words.",
        "properties": {
            "code": {"type": "string", "description": "The reason's stable code (README: reason codes)."},
            "severity": g.subschema_for::<Severity>(),
            "action": g.subschema_for::<Action>(),
            "message": {"type": "string"},
        },
        "required": ["code", "severity", "action", "message"],
    })
});

/// The verdict of a result whose reasons are `reasons`: the worst their severities give, Pass
/// with none.
pub fn verdict_of(reasons: &[Reason]) -> Verdict {
    reasons
        .iter()
        .map(|r| r.severity.verdict())
        .max()
        .unwrap_or(Verdict::Pass)
}

/// The reasons' messages joined with `"; "`.
pub fn messages(reasons: &[Reason]) -> String {
    reasons
        .iter()
        .map(|r| r.message.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The most drastic action among `reasons`.
pub fn action_of<'a>(reasons: impl IntoIterator<Item = &'a Reason>) -> Action {
    reasons
        .into_iter()
        .map(|r| r.action)
        .max()
        .unwrap_or(Action::None)
}

/// `spec.severityOverrides[]`: reasons of `code` get `severity` instead of their default.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeverityOverride {
    #[schemars(schema_with = "overridable_code_schema")]
    pub code: Code,
    #[schemars(schema_with = "override_severity_schema")]
    pub severity: Severity,
}

/// Overrides by code, as a judge applies them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides(BTreeMap<Code, Severity>);

impl Overrides {
    /// The overrides of a spec. Codes that may not be overridden (the schema refuses them) and
    /// an Error severity are ignored here, so a missing measurement never becomes a pass.
    pub fn new(list: &[SeverityOverride]) -> Self {
        Self(
            list.iter()
                .filter(|o| o.code.is_overridable() && o.severity != Severity::Error)
                .map(|o| (o.code, o.severity))
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The severity the spec gives `code`, if it changes it.
    pub fn get(&self, code: Code) -> Option<Severity> {
        self.0.get(&code).copied()
    }

    /// Applies the overrides to `reasons`; true when any severity changed.
    pub fn apply(&self, reasons: &mut [Reason]) -> bool {
        let mut changed = false;
        for r in reasons.iter_mut() {
            if let Some(s) = self.get(r.code)
                && r.severity != s
            {
                r.severity = s;
                changed = true;
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_codes_are_the_installation_s_error_not_the_node_s() {
        assert!(Code::IoError.is_configuration() && Code::LibraryMissing.is_configuration());
        assert!(!Code::MemoryMismatch.is_configuration());
        assert!(Code::only_configuration("IoError"));
        assert!(Code::only_configuration("LibraryMissing, IoError"));
        // A hardware code beside it, an unknown code or nothing at all is not configuration.
        assert!(!Code::only_configuration("MemoryMismatch,IoError"));
        assert!(!Code::only_configuration("IoError,NoSuchCode"));
        assert!(!Code::only_configuration(""));
        // Every configuration code means a check could not measure: never a hardware verdict.
        for c in CONFIGURATION_CODES {
            assert_eq!(c.severity(), Severity::Error, "{c}");
        }
    }

    #[test]
    fn codes_are_distinct_and_parse_back() {
        let mut names: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        for c in Code::ALL {
            assert_eq!(c.as_str().parse::<Code>(), Ok(c));
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
            assert!(!c.meaning().is_empty());
        }
        assert!(names.iter().all(|n| n.len() <= MAX_CODE_LEN));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Code::ALL.len());
        let e = "MemoryMismach".parse::<Code>().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown reason code 'MemoryMismach': use one of GpuCountMismatch, ")
        );
    }

    #[test]
    fn only_codes_that_are_not_errors_are_overridable() {
        assert!(Code::RowsRemapped.is_overridable());
        assert!(!Code::MeasurementMissing.is_overridable());
        assert!(!Code::CheckCouldNotRun.is_overridable());
        assert!(!Code::Unclassified.is_overridable());
        assert!(Code::overridable().all(|c| c.severity() != Severity::Error));
    }

    #[test]
    fn performance_codes_are_the_figures_that_fall_short() {
        let perf: Vec<Code> = Code::ALL
            .into_iter()
            .filter(|c| c.is_performance())
            .collect();
        assert!(perf.contains(&Code::MemoryBandwidthLow) && perf.contains(&Code::ComputeSlow));
        assert!(perf.iter().all(|c| c.severity() == Severity::Fail));
        assert!(!Code::MemoryMismatch.is_performance());
    }

    #[test]
    fn a_reason_serializes_as_an_object_and_old_strings_still_read() {
        let r = Reason::new(Code::MemoryMismatch, "GPU3 memory: 2 mismatched words");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"code": "MemoryMismatch", "severity": "Fail", "action": "ReplaceHardware", "message": "GPU3 memory: 2 mismatched words"})
        );
        assert_eq!(serde_json::from_value::<Reason>(v).unwrap(), r);
        let old: Reason = serde_json::from_value(serde_json::json!("GPU1: slow")).unwrap();
        assert_eq!(
            (old.code, old.message.as_str()),
            (Code::Unclassified, "GPU1: slow")
        );
        assert!(r == "GPU3 memory: 2 mismatched words");
    }

    #[test]
    fn overrides_change_severity_but_never_make_an_error_pass() {
        let o = Overrides::new(&[
            SeverityOverride {
                code: Code::RowsRemapped,
                severity: Severity::Fail,
            },
            SeverityOverride {
                code: Code::MeasurementMissing,
                severity: Severity::Info,
            },
        ]);
        let mut rs = vec![
            Reason::new(Code::RowsRemapped, "GPU1: 2 rows remapped"),
            Reason::new(Code::MeasurementMissing, "GPU1 memory: no figure"),
        ];
        assert_eq!(verdict_of(&rs[..1]), Verdict::Warn);
        assert!(o.apply(&mut rs));
        assert_eq!(rs[0].severity, Severity::Fail);
        assert_eq!(rs[1].severity, Severity::Error);
        assert_eq!(verdict_of(&rs), Verdict::Fail, "a Fail leads over an Error");
        assert_eq!(verdict_of(&rs[1..]), Verdict::Error);
        assert!(!o.apply(&mut rs), "applying twice changes nothing");
        assert_eq!(verdict_of(&[]), Verdict::Pass);
        assert_eq!(action_of(&rs), Action::Rerun);
    }
}
