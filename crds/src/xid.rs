//! Xid codes with their meaning: NVIDIA's name for each Xid a data-center GPU (Ampere and
//! newer) reports, what it means in a few words, the resolution NVIDIA's Xid catalogue gives
//! as the immediate action, and whether the catalogue treats it as fatal to the GPU. The facts
//! come from NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors); the descriptions are
//! ours. A fatal Xid seen during a run fails the GPU; any other warns.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::reason::{Action, Code};

/// The catalogue's immediate action for an Xid.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XidResolution {
    /// Nothing to do for the GPU (`IGNORE`).
    Ignore,
    /// Restart the application (`RESTART_APP`); often the application's own fault.
    RestartApp,
    /// Reset the GPU (`RESET_GPU`, and the ECC and NVLink workflows that start with a reset).
    ResetGpu,
    /// Reboot the node (`RESTART_BM`/`RESTART_VM`).
    Reboot,
    /// Check power and cooling connections (`CHECK_MECHANICALS`).
    CheckMechanicals,
    /// Report it to NVIDIA support (`CONTACT_SUPPORT`).
    Report,
}

crate::spelling::api_spelling!(XidResolution {
    Ignore => "Ignore",
    RestartApp => "RestartApp",
    ResetGpu => "ResetGpu",
    Reboot => "Reboot",
    CheckMechanicals => "CheckMechanicals",
    Report => "Report",
});

impl XidResolution {
    /// The action gpuval recommends for it.
    pub fn action(self) -> Action {
        match self {
            XidResolution::Ignore => Action::None,
            XidResolution::RestartApp => Action::Rerun,
            XidResolution::ResetGpu => Action::ResetGpu,
            XidResolution::Reboot => Action::RebootNode,
            XidResolution::CheckMechanicals | XidResolution::Report => Action::ReplaceHardware,
        }
    }

    /// In words, for a reason's message.
    pub fn words(self) -> &'static str {
        match self {
            XidResolution::Ignore => "no action needed",
            XidResolution::RestartApp => "restart the application",
            XidResolution::ResetGpu => "reset the GPU",
            XidResolution::Reboot => "reboot the node",
            XidResolution::CheckMechanicals => "check the GPU's power and cooling",
            XidResolution::Report => "report it to NVIDIA support",
        }
    }
}

/// One catalogue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEntry {
    pub xid: u32,
    /// NVIDIA's mnemonic (`ROBUST_CHANNEL_GPU_ECC_DBE`).
    pub name: &'static str,
    pub description: &'static str,
    pub resolution: XidResolution,
    /// The catalogue treats it as fatal to the GPU.
    pub fatal: bool,
}

impl XidEntry {
    /// The reason code of this Xid: fatal or not.
    pub fn code(&self) -> Code {
        if self.fatal {
            Code::XidFatal
        } else {
            Code::XidNonFatal
        }
    }
}

use XidResolution::{CheckMechanicals, Ignore, Reboot, Report, ResetGpu, RestartApp};

const fn e(
    xid: u32,
    name: &'static str,
    description: &'static str,
    resolution: XidResolution,
    fatal: bool,
) -> XidEntry {
    XidEntry {
        xid,
        name,
        description,
        resolution,
        fatal,
    }
}

/// The catalogue, by Xid.
pub const CATALOGUE: &[XidEntry] = &[
    e(
        8,
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "the GPU stopped processing a channel (idle timeout)",
        RestartApp,
        false,
    ),
    e(
        11,
        "ROBUST_CHANNEL_GR_ERROR_MISSING_HW",
        "an invalid or corrupted command stream",
        RestartApp,
        false,
    ),
    e(
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION",
        "a graphics/compute engine exception (often an out-of-range access by the application)",
        RestartApp,
        false,
    ),
    e(
        31,
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "a GPU memory page fault (usually an illegal address in the application)",
        RestartApp,
        false,
    ),
    e(
        32,
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "an invalid or corrupted command stream reached the push-buffer DMA engine",
        RestartApp,
        false,
    ),
    e(
        38,
        "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT",
        "a watchdog timeout in the context-switch firmware",
        Ignore,
        false,
    ),
    e(
        39,
        "ROBUST_CHANNEL_CE0_ERROR",
        "a copy engine exception",
        RestartApp,
        false,
    ),
    e(
        40,
        "ROBUST_CHANNEL_CE1_ERROR",
        "a copy engine exception",
        RestartApp,
        false,
    ),
    e(
        41,
        "ROBUST_CHANNEL_CE2_ERROR",
        "a copy engine exception",
        RestartApp,
        false,
    ),
    e(
        43,
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "a channel was stopped after a fault in the application",
        Ignore,
        false,
    ),
    e(
        44,
        "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW",
        "a fault during a context switch",
        Ignore,
        false,
    ),
    e(
        45,
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "a channel was torn down early (after another error, or the application ended)",
        RestartApp,
        false,
    ),
    e(
        46,
        "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR",
        "the GPU stopped processing (a timeout)",
        ResetGpu,
        true,
    ),
    e(
        48,
        "ROBUST_CHANNEL_GPU_ECC_DBE",
        "a double-bit (uncorrectable) ECC error in GPU memory",
        ResetGpu,
        true,
    ),
    e(
        54,
        "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
        "clocks reduced for lack of auxiliary power",
        CheckMechanicals,
        true,
    ),
    e(
        57,
        "FB_LINK_TRAINING_FAILURE_ERROR",
        "the memory interface failed to train",
        Report,
        true,
    ),
    e(
        58,
        "FB_MEMORY_ERROR",
        "an unstable GPU memory interface",
        Report,
        true,
    ),
    e(
        61,
        "PMU_BREAKPOINT",
        "an internal micro-controller hit a breakpoint",
        Report,
        true,
    ),
    e(
        62,
        "PMU_HALT_ERROR",
        "an internal micro-controller halted",
        ResetGpu,
        true,
    ),
    e(
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "a memory page was retired or a row marked for remapping",
        Ignore,
        false,
    ),
    e(
        64,
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        "retiring a memory page or remapping a row failed",
        ResetGpu,
        true,
    ),
    e(
        68,
        "ROBUST_CHANNEL_NVDEC0_ERROR",
        "a video decoder exception",
        RestartApp,
        false,
    ),
    e(
        69,
        "ROBUST_CHANNEL_GR_CLASS_ERROR",
        "a graphics engine class error",
        RestartApp,
        false,
    ),
    e(74, "NVLINK_ERROR", "an NVLink error", ResetGpu, true),
    e(
        79,
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "the GPU has fallen off the bus",
        Reboot,
        true,
    ),
    e(
        80,
        "PBDMA_PUSHBUFFER_CRC_MISMATCH",
        "corrupted data was sent to the GPU",
        RestartApp,
        false,
    ),
    e(
        92,
        "EXCESSIVE_SBE_INTERRUPTS",
        "a high rate of single-bit (corrected) ECC errors",
        Ignore,
        false,
    ),
    e(
        93,
        "INFOROM_ERASE_LIMIT_EXCEEDED",
        "the InfoROM's erase limit was exceeded",
        Ignore,
        false,
    ),
    e(
        94,
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        "a contained ECC error (only the application that touched it was stopped)",
        RestartApp,
        false,
    ),
    e(
        95,
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "an uncontained ECC error (every application on the GPU is affected)",
        ResetGpu,
        true,
    ),
    e(
        109,
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        "a context switch timed out",
        ResetGpu,
        true,
    ),
    e(110, "SEC_FAULT_ERROR", "a security fault", ResetGpu, true),
    e(
        119,
        "GSP_RPC_TIMEOUT",
        "the GPU System Processor did not answer the driver in time",
        ResetGpu,
        true,
    ),
    e(
        120,
        "GSP_ERROR",
        "the GPU System Processor reported an error",
        ResetGpu,
        true,
    ),
    e(121, "C2C_ERROR", "a chip-to-chip link error", Ignore, false),
    e(
        136,
        "ALI_TRAINING_FAIL",
        "NVLink link training failed",
        ResetGpu,
        true,
    ),
    e(
        137,
        "NVLINK_FLA_PRIV_ERR",
        "an NVLink fabric address privilege error",
        Ignore,
        false,
    ),
    e(
        140,
        "UNRECOVERABLE_ECC_ERROR_ESCAPE",
        "an uncorrectable ECC error escaped containment",
        ResetGpu,
        true,
    ),
    e(
        143,
        "GPU_INIT_ERROR",
        "the GPU failed to initialize",
        ResetGpu,
        true,
    ),
    e(
        144,
        "NVLINK_SAW_ERROR",
        "an NVLink (fifth generation) SAW error",
        ResetGpu,
        true,
    ),
    e(
        145,
        "NVLINK_RLW_ERROR",
        "an NVLink (fifth generation) RLW error",
        ResetGpu,
        true,
    ),
    e(
        146,
        "NVLINK_TLW_ERROR",
        "an NVLink (fifth generation) TLW error",
        ResetGpu,
        true,
    ),
    e(
        147,
        "NVLINK_TREX_ERROR",
        "an NVLink (fifth generation) TREX error",
        ResetGpu,
        true,
    ),
    e(
        148,
        "NVLINK_NVLPW_CTRL_ERROR",
        "an NVLink (fifth generation) NVLPW control error",
        ResetGpu,
        true,
    ),
    e(
        149,
        "NVLINK_NETIR_ERROR",
        "an NVLink (fifth generation) NETIR error",
        ResetGpu,
        true,
    ),
    e(
        150,
        "NVLINK_MSE_ERROR",
        "an NVLink (fifth generation) MSE error",
        ResetGpu,
        true,
    ),
    e(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "the GPU's recovery action changed (follow the Xid that caused it)",
        Ignore,
        false,
    ),
    e(
        155,
        "NVLINK_SW_DEFINED_ERROR",
        "a software-defined NVLink error",
        ResetGpu,
        true,
    ),
    e(
        156,
        "RESOURCE_RETIREMENT_EVENT",
        "a GPU resource was retired",
        ResetGpu,
        true,
    ),
    e(
        157,
        "RESOURCE_RETIREMENT_FAILURE",
        "retiring a GPU resource failed",
        Ignore,
        false,
    ),
    e(
        158,
        "GPU_FATAL_TIMEOUT",
        "the GPU timed out fatally",
        ResetGpu,
        true,
    ),
];

/// The catalogue entry of `xid`, if gpuval knows it.
pub fn lookup(xid: i64) -> Option<&'static XidEntry> {
    let xid = u32::try_from(xid).ok()?;
    CATALOGUE.iter().find(|e| e.xid == xid)
}

/// An Xid seen during a run, with its meaning (in a GPU's telemetry summary).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct XidSeen {
    pub xid: i64,
    /// How many times it was reported.
    pub count: i64,
    /// NVIDIA's mnemonic; absent for an Xid not in gpuval's catalogue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<XidResolution>,
    /// The catalogue treats it as fatal: the GPU fails.
    pub fatal: bool,
}

impl XidSeen {
    /// `xid` seen `count` times, with its catalogue entry.
    pub fn new(xid: i64, count: i64) -> Self {
        let entry = lookup(xid);
        Self {
            xid,
            count,
            name: entry.map(|e| e.name.to_string()),
            description: entry.map(|e| e.description.to_string()),
            resolution: entry.map(|e| e.resolution),
            fatal: entry.is_some_and(|e| e.fatal),
        }
    }

    /// The reason this Xid gives its GPU: `GPU2: Xid 48 (ROBUST_CHANNEL_GPU_ECC_DBE: a
    /// double-bit ... ) during the run, 2 times; NVIDIA: reset the GPU`.
    pub fn reason(&self, gpu: i32) -> crate::reason::Reason {
        use crate::reason::Reason;
        let times = if self.count > 1 {
            format!(", {} times", self.count)
        } else {
            String::new()
        };
        match lookup(self.xid) {
            Some(e) => Reason::new(
                e.code(),
                format!(
                    "GPU{gpu}: Xid {} ({}: {}) during the run{times}; NVIDIA's catalogue: {}",
                    self.xid,
                    e.name,
                    e.description,
                    e.resolution.words()
                ),
            )
            .with_action(e.resolution.action()),
            None => Reason::new(
                Code::XidUnknown,
                format!(
                    "GPU{gpu}: Xid {} during the run{times}; not in gpuval's catalogue (see NVIDIA's Xid catalogue)",
                    self.xid
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reason::Severity;

    #[test]
    fn the_catalogue_is_sorted_unique_and_named() {
        assert!(CATALOGUE.windows(2).all(|w| w[0].xid < w[1].xid));
        assert!(
            CATALOGUE
                .iter()
                .all(|e| !e.name.is_empty() && !e.description.is_empty())
        );
    }

    #[test]
    fn well_known_xids_carry_the_catalogue_resolution() {
        let fell_off = lookup(79).expect("79");
        assert!(fell_off.fatal);
        assert_eq!(fell_off.resolution.action(), Action::RebootNode);
        let dbe = lookup(48).expect("48");
        assert!(dbe.fatal);
        assert_eq!(dbe.resolution, XidResolution::ResetGpu);
        let page_fault = lookup(31).expect("31");
        assert!(!page_fault.fatal);
        assert_eq!(page_fault.resolution.action(), Action::Rerun);
        assert!(
            !lookup(63).expect("63").fatal,
            "a row marked for remapping warns"
        );
        assert!(lookup(94).is_some_and(|e| !e.fatal) && lookup(95).is_some_and(|e| e.fatal));
        assert_eq!(lookup(-1), None);
        assert_eq!(lookup(999), None);
    }

    #[test]
    fn a_seen_xid_becomes_a_reason_with_its_meaning() {
        let r = XidSeen::new(48, 2).reason(3);
        assert_eq!(
            (r.code, r.severity, r.action),
            (Code::XidFatal, Severity::Fail, Action::ResetGpu)
        );
        assert_eq!(
            r.message,
            "GPU3: Xid 48 (ROBUST_CHANNEL_GPU_ECC_DBE: a double-bit (uncorrectable) ECC error in GPU memory) during the run, 2 times; NVIDIA's catalogue: reset the GPU"
        );
        let app = XidSeen::new(13, 1).reason(0);
        assert_eq!(
            (app.code, app.severity, app.action),
            (Code::XidNonFatal, Severity::Warn, Action::Rerun)
        );
        let unknown = XidSeen::new(999, 1);
        assert!(!unknown.fatal && unknown.name.is_none());
        assert_eq!(unknown.reason(1).code, Code::XidUnknown);
    }
}
