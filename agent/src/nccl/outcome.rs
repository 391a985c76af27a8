//! What a sweep measured, before judging. Serialisable: the sweep runs in a child process
//! and comes back as JSON.

use gpuval_crds::Collective;
use serde::{Deserialize, Serialize};

use super::transport::TransportSummary;
use crate::backend::{BackendError, Side};

/// One size of one collective: the slowest rank's time per collective.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RowOutcome {
    /// nccl-tests' size and count columns.
    pub bytes: u64,
    pub count: u64,
    /// Seconds per collective, out of place.
    pub seconds: f64,
    /// The same in place, where the collective has an in-place form.
    pub in_place_seconds: Option<f64>,
    /// Wrong elements over every rank and both placements.
    pub wrong: u64,
}

/// One collective's sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CurveOutcome {
    pub collective: Collective,
    pub rows: Vec<RowOutcome>,
}

/// Wrong elements that one rank received in one verified collective.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankMismatch {
    pub rank: u32,
    pub collective: Collective,
    pub bytes: u64,
    pub in_place: bool,
    pub elements: u64,
    /// Byte offset of the first wrong element in the rank's output.
    pub first_offset: u64,
}

/// Where in a step a collective was when the sweep stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    WarmUp,
    Timed,
    Verification,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::WarmUp => "warm-up",
            Phase::Timed => "timed",
            Phase::Verification => "verification",
        }
    }
}

/// Why a sweep was cut short.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AbortCause {
    /// The collectives did not complete within the timeout.
    Timeout { seconds: f64 },
    /// NCCL reported an error on the communicator (asynchronous, or when a collective was
    /// queued), with the side its result and NCCL's words put it on.
    NcclError {
        message: String,
        #[serde(default = "peer_side")]
        side: Side,
    },
    /// A CUDA call failed.
    Cuda { message: String },
    /// The run was asked to stop.
    Stopped,
}

/// A sweep that stopped early: which collective, size and rank, and why. The communicators
/// were aborted (`ncclCommAbort`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Abort {
    pub collective: Collective,
    pub bytes: u64,
    pub in_place: bool,
    pub phase: Phase,
    pub rank: u32,
    pub cause: AbortCause,
}

/// One sweep over every requested collective and size.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepOutcome {
    /// From `ncclGetVersion` (`2.28.3`).
    pub nccl_version: Option<String>,
    /// The curves measured, up to where the sweep stopped.
    pub curves: Vec<CurveOutcome>,
    pub mismatches: Vec<RankMismatch>,
    pub abort: Option<Abort>,
    /// Parsed from NCCL's own log of the run (filled in by the parent process).
    pub transport: Option<TransportSummary>,
    pub seconds: f64,
}

/// Everything the check measured on the node.
#[derive(Debug, Clone)]
pub struct NcclOutcome {
    /// NVML index of each rank's GPU.
    pub gpus: Vec<u32>,
    /// The NCCL library that was used (`/usr/lib/x86_64-linux-gnu/libnccl.so.2`).
    pub library: Option<String>,
    /// With NCCL's default transports.
    pub sweep: Result<SweepOutcome, BackendError>,
    /// With peer-to-peer off, when asked for.
    pub p2p_off: Option<Result<SweepOutcome, BackendError>>,
    /// How the figures were taken (a size limit applied, say).
    pub notes: Vec<String>,
    pub seconds: f64,
}

/// The side of an NCCL error recorded without one: a peer's, as NCCL reports most of them.
fn peer_side() -> Side {
    Side::Peer
}
