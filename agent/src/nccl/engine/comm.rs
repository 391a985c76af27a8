//! One rank's NCCL communicator, through cudarc's raw bindings (the safe `Comm` panics when an
//! abort fails and records events on every buffer; the sweep uses raw device pointers).

use std::ffi::CStr;

use cudarc::nccl::sys;
use gpuval_crds::{Collective, NcclDtype};

use crate::backend::Side;
use crate::nccl::bandwidth::Layout;

/// An NCCL call that failed, with NCCL's own words and whose side its result and words put
/// the failure on ([`side_of`]).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{call}: {message}")]
pub struct NcclCallError {
    pub call: &'static str,
    pub message: String,
    pub side: Side,
}

/// NCCL's words of a connection to a peer that broke: the peer's process exited, or closed,
/// reset or refused the connection, or stopped answering. NCCL reports a peer's exit as a
/// remote error on some ranks and as a system or internal error on others (real H100s), so
/// for those two only its own words tell.
const PEER_WORDS: [&str; 7] = [
    "remote process exited",
    "closed by remote peer",
    "connection reset",
    "connection refused",
    "broken pipe",
    "remote error",
    "timed out",
];

/// Whose side a failed NCCL call is on, from its result and NCCL's own words (never the
/// agent's): a remote error is a peer's; a system or internal error is a peer's when NCCL says
/// a connection to a peer broke; anything else (a CUDA error, invalid usage such as no network
/// interface, an invalid argument) is this side's.
pub fn side_of(r: sys::ncclResult_t, nccl_words: &str) -> Side {
    use sys::ncclResult_t as R;
    let text = nccl_words.to_lowercase();
    match r {
        R::ncclRemoteError => Side::Peer,
        R::ncclSystemError | R::ncclInternalError
            if PEER_WORDS.iter().any(|w| text.contains(w)) =>
        {
            Side::Peer
        }
        _ => Side::Own,
    }
}

fn error_text(r: sys::ncclResult_t, comm: sys::ncclComm_t) -> String {
    // SAFETY: ncclGetErrorString returns a static string for any result code.
    let base = unsafe { CStr::from_ptr(sys::ncclGetErrorString(r)) }
        .to_string_lossy()
        .into_owned();
    // NCCL's detail of its last error, also for a call that has no communicator yet
    // (`ncclCommInitRank`): NCCL keeps the last error per thread and does not use `comm` here,
    // and its detail is what tells a peer's broken connection from this side's failure.
    // SAFETY: comm is a live communicator or null, both of which NCCL accepts (it documents the
    // argument as unused); the returned string stays valid until the next NCCL call on this
    // thread and is copied at once.
    let last = unsafe { sys::ncclGetLastError(comm) };
    let detail = if last.is_null() {
        String::new()
    } else {
        // SAFETY: non-null, NUL-terminated, owned by NCCL.
        unsafe { CStr::from_ptr(last) }
            .to_string_lossy()
            .trim()
            .to_string()
    };
    if detail.is_empty() {
        base
    } else {
        format!("{base} ({detail})")
    }
}

fn check(
    r: sys::ncclResult_t,
    call: &'static str,
    comm: sys::ncclComm_t,
) -> Result<(), NcclCallError> {
    match r {
        sys::ncclResult_t::ncclSuccess => Ok(()),
        other => {
            let message = error_text(other, comm);
            Err(NcclCallError {
                call,
                side: side_of(other, &message),
                message,
            })
        }
    }
}

/// `ncclGetUniqueId`: the id every rank joins the communicator with.
pub fn unique_id() -> Result<sys::ncclUniqueId, NcclCallError> {
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: writes the 128-byte id.
    check(
        unsafe { sys::ncclGetUniqueId(&mut id) },
        "ncclGetUniqueId",
        std::ptr::null_mut(),
    )?;
    Ok(id)
}

/// `ncclGetVersion` as `2.28.3`.
pub fn version() -> Option<String> {
    let mut code = 0;
    // SAFETY: writes one int.
    let r = unsafe { sys::ncclGetVersion(&mut code) };
    (r == sys::ncclResult_t::ncclSuccess).then(|| format_version(code))
}

/// NCCL's version code as text: `major×10000 + minor×100 + patch` from 2.9 on, `major×1000
/// + minor×100 + patch` before.
pub fn format_version(code: i32) -> String {
    if code >= 20900 {
        format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100)
    }
}

fn data_type(d: NcclDtype) -> sys::ncclDataType_t {
    match d {
        NcclDtype::Bf16 => sys::ncclDataType_t::ncclBfloat16,
        NcclDtype::Fp32 => sys::ncclDataType_t::ncclFloat32,
    }
}

/// A communicator; aborted on drop unless it was destroyed cleanly first.
pub struct Comm {
    raw: sys::ncclComm_t,
    rank: u32,
}

// SAFETY: an NCCL communicator may be used from any one thread at a time; each rank's thread
// owns its communicator.
unsafe impl Send for Comm {}

/// Device buffers a collective reads and writes (raw device addresses).
#[derive(Debug, Clone, Copy)]
pub struct Buffers {
    pub send: u64,
    pub recv: u64,
}

impl Comm {
    /// `ncclCommInitRank` on the calling thread's current CUDA device; every rank must call it
    /// at the same time.
    pub fn init(ranks: u32, id: sys::ncclUniqueId, rank: u32) -> Result<Self, NcclCallError> {
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        let (n, r) = (
            i32::try_from(ranks).unwrap_or(i32::MAX),
            i32::try_from(rank).unwrap_or(0),
        );
        // SAFETY: raw receives the new communicator; id is the shared unique id.
        check(
            unsafe { sys::ncclCommInitRank(&mut raw, n, id, r) },
            "ncclCommInitRank",
            std::ptr::null_mut(),
        )?;
        Ok(Self { raw, rank })
    }

    /// An error NCCL found while collectives ran (a peer failed, a network error), if any.
    pub fn async_error(&self) -> Option<String> {
        self.async_failure().map(|e| e.message)
    }

    /// [`Comm::async_error`] with the side its result and NCCL's words put it on.
    pub fn async_failure(&self) -> Option<NcclCallError> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: queries the live communicator.
        let r = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut state) };
        let bad = match (r, state) {
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess)
            | (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclInProgress) => return None,
            (sys::ncclResult_t::ncclSuccess, bad) => bad,
            (bad, _) => bad,
        };
        let message = error_text(bad, self.raw);
        Some(NcclCallError {
            call: "ncclCommGetAsyncError",
            side: side_of(bad, &message),
            message,
        })
    }

    /// Queues one collective on `stream`, laid out as nccl-tests lays it out.
    pub fn launch(
        &self,
        layout: &Layout,
        in_place: bool,
        dtype: NcclDtype,
        b: Buffers,
        stream: &cudarc::driver::CudaStream,
    ) -> Result<(), NcclCallError> {
        let stream = stream.cu_stream() as sys::cudaStream_t;
        let dt = data_type(dtype);
        let elt = layout.element;
        let rank = u64::from(self.rank);
        let (send, recv) = if in_place {
            (
                b.recv + layout.send_offset * rank * elt,
                b.recv + layout.recv_offset * rank * elt,
            )
        } else {
            (b.send, b.recv)
        };
        let (sp, rp) = (
            send as *const std::ffi::c_void,
            recv as *mut std::ffi::c_void,
        );
        let count = usize::try_from(layout.count).unwrap_or(usize::MAX);
        let sum = sys::ncclRedOp_t::ncclSum;
        // SAFETY (every arm): the buffers were allocated for the largest layout of the sweep
        // and outlive the stream's work (the caller waits for it); the communicator is live.
        let (r, call) = match layout.collective {
            Collective::AllReduce => (
                unsafe { sys::ncclAllReduce(sp, rp, count, dt, sum, self.raw, stream) },
                "ncclAllReduce",
            ),
            Collective::AllGather => (
                unsafe { sys::ncclAllGather(sp, rp, count, dt, self.raw, stream) },
                "ncclAllGather",
            ),
            Collective::ReduceScatter => (
                unsafe { sys::ncclReduceScatter(sp, rp, count, dt, sum, self.raw, stream) },
                "ncclReduceScatter",
            ),
            Collective::Broadcast => (
                unsafe { sys::ncclBroadcast(sp, rp, count, dt, 0, self.raw, stream) },
                "ncclBroadcast",
            ),
            Collective::AllToAll => return self.all_to_all(layout, send, recv, dt, stream),
        };
        check(r, call, self.raw)
    }

    /// All-to-all as grouped sends and receives, one pair per peer (as nccl-tests does).
    fn all_to_all(
        &self,
        layout: &Layout,
        send: u64,
        recv: u64,
        dt: sys::ncclDataType_t,
        stream: sys::cudaStream_t,
    ) -> Result<(), NcclCallError> {
        let chunk = layout.count * layout.element;
        let count = usize::try_from(layout.count).unwrap_or(usize::MAX);
        // SAFETY: group calls only batch what follows.
        check(unsafe { sys::ncclGroupStart() }, "ncclGroupStart", self.raw)?;
        let mut queued = Ok(());
        for peer in 0..layout.ranks {
            let p = i32::try_from(peer).unwrap_or(0);
            let (s, r) = (send + peer * chunk, recv + peer * chunk);
            // SAFETY: each chunk lies inside the send or receive buffer (ranks × count elements).
            let sent = check(
                unsafe { sys::ncclSend(s as *const _, count, dt, p, self.raw, stream) },
                "ncclSend",
                self.raw,
            );
            // SAFETY: as above.
            let got = check(
                unsafe { sys::ncclRecv(r as *mut _, count, dt, p, self.raw, stream) },
                "ncclRecv",
                self.raw,
            );
            queued = queued.and(sent).and(got);
        }
        // SAFETY: closes the group opened above, on every path.
        let ended = check(unsafe { sys::ncclGroupEnd() }, "ncclGroupEnd", self.raw);
        queued.and(ended)
    }

    /// Finalizes and destroys the communicator (after its work is done).
    pub fn destroy(mut self) -> Result<(), NcclCallError> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        // SAFETY: raw is live and owned; it is not used again.
        let finalized = check(
            unsafe { sys::ncclCommFinalize(raw) },
            "ncclCommFinalize",
            raw,
        );
        // SAFETY: as above; destroy frees it whether or not finalize succeeded.
        let destroyed = check(
            unsafe { sys::ncclCommDestroy(raw) },
            "ncclCommDestroy",
            std::ptr::null_mut(),
        );
        finalized.and(destroyed)
    }

    /// `ncclCommAbort`: stops this rank's NCCL kernels and frees the communicator.
    pub fn abort(mut self) {
        self.abort_raw();
    }

    fn abort_raw(&mut self) {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if raw.is_null() {
            return;
        }
        // SAFETY: raw is live and owned; it is not used again.
        let r = unsafe { sys::ncclCommAbort(raw) };
        if r != sys::ncclResult_t::ncclSuccess {
            tracing::warn!(rank = self.rank, error = %error_text(r, std::ptr::null_mut()), "ncclCommAbort failed");
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.abort_raw();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_read_like_nccl_prints_them() {
        assert_eq!(format_version(22803), "2.28.3");
        assert_eq!(format_version(21905), "2.19.5");
        assert_eq!(format_version(2804), "2.8.4");
    }
}

#[cfg(test)]
mod side_tests {
    use super::*;
    use sys::ncclResult_t as R;

    #[test]
    fn a_remote_error_is_a_peers_and_a_system_error_only_when_nccl_says_a_peer_broke() {
        // The words NCCL gave on a healthy rank of real H100s when a peer had no interface.
        let exited = "remote process exited or there was a network error (NCCL: socketProgress: \
                      Connection closed by remote peer 10.0.0.4<43122>)";
        assert_eq!(side_of(R::ncclRemoteError, "anything"), Side::Peer);
        assert_eq!(side_of(R::ncclSystemError, exited), Side::Peer);
        assert_eq!(
            side_of(R::ncclInternalError, "Connection refused"),
            Side::Peer
        );
        assert_eq!(
            side_of(R::ncclSystemError, "unhandled system error"),
            Side::Own
        );
        // No interface on this node: invalid usage, this side's whatever else it says.
        assert_eq!(
            side_of(
                R::ncclInvalidUsage,
                "invalid usage (NET/IB : No IP interface found.)"
            ),
            Side::Own
        );
        assert_eq!(side_of(R::ncclUnhandledCudaError, exited), Side::Own);
    }
}
