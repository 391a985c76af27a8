//! One rank's NCCL communicator, through cudarc's raw bindings (the safe `Comm` panics when an
//! abort fails and records events on every buffer; the sweep uses raw device pointers).

use std::ffi::CStr;
use std::time::{Duration, Instant};

use cudarc::nccl::sys;
use gpuval_crds::{Collective, NcclDtype};

use crate::checks::nccl::bandwidth::Layout;

/// An NCCL call that failed, with NCCL's own words.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{call}: {message}")]
pub struct NcclCallError {
    pub call: &'static str,
    pub message: String,
}

fn error_text(r: sys::ncclResult_t, comm: sys::ncclComm_t) -> String {
    // SAFETY: ncclGetErrorString returns a static string for any result code.
    let base = unsafe { CStr::from_ptr(sys::ncclGetErrorString(r)) }
        .to_string_lossy()
        .into_owned();
    if comm.is_null() {
        return base;
    }
    // SAFETY: comm is a live communicator; the returned string stays valid until the next
    // NCCL call on this thread and is copied at once.
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
        other => Err(NcclCallError {
            call,
            message: error_text(other, comm),
        }),
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
    version_code().map(format_version)
}

/// `ncclGetVersion`'s code (`22803` for 2.28.3).
fn version_code() -> Option<i32> {
    let mut code = 0;
    // SAFETY: writes one int.
    let r = unsafe { sys::ncclGetVersion(&mut code) };
    (r == sys::ncclResult_t::ncclSuccess).then_some(code)
}

/// `NCCL_CONFIG_UNDEF_INT`: a field NCCL fills with its default.
const UNDEF_INT: i32 = i32::MIN;
/// `NCCL_CONFIG_INITIALIZER`'s magic.
const CONFIG_MAGIC: u32 = 0xcafe_beef;
/// The longest pause between two polls of a non-blocking communicator.
const READY_POLL: Duration = Duration::from_millis(10);

/// `NCCL_CONFIG_INITIALIZER` as the loaded library (`version`, its `ncclGetVersion` code)
/// would write it, with `blocking = 0`: every other field unset, so NCCL keeps its defaults.
fn nonblocking_config(version: i32) -> sys::ncclConfig_t {
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: CONFIG_MAGIC,
        version: u32::try_from(version).unwrap_or(0),
        blocking: 0,
        cgaClusterSize: UNDEF_INT,
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: UNDEF_INT,
        trafficClass: UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: UNDEF_INT,
        CTAPolicy: UNDEF_INT,
        shrinkShare: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        nChannelsPerNetPeer: UNDEF_INT,
        nvlinkCentricSched: UNDEF_INT,
        graphUsageMode: UNDEF_INT,
        numRmaCtx: UNDEF_INT,
        maxP2pPeers: UNDEF_INT,
    }
}

/// What one look at a non-blocking communicator found.
#[derive(Debug, Clone, PartialEq)]
pub enum Readiness {
    Ready,
    InProgress,
    Failed(String),
}

/// How waiting for a non-blocking communicator ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Waited {
    Ready,
    Failed(String),
    /// Not ready by the deadline.
    TimedOut,
    /// `interrupted` said to give up (another rank failed, the run was stopped).
    Interrupted,
}

/// Looks at `look` until the communicator is ready or failed, `interrupted` says to give up,
/// or `now` reaches `deadline`; `pause` waits between looks, never past the deadline. The
/// clock and the pause are parameters, so that the deadline logic is tested without waiting.
pub fn wait_ready(
    deadline: Instant,
    mut look: impl FnMut() -> Readiness,
    mut interrupted: impl FnMut() -> bool,
    now: impl Fn() -> Instant,
    mut pause: impl FnMut(Duration),
) -> Waited {
    loop {
        match look() {
            Readiness::Ready => return Waited::Ready,
            Readiness::Failed(e) => return Waited::Failed(e),
            Readiness::InProgress => {}
        }
        if interrupted() {
            return Waited::Interrupted;
        }
        let left = deadline.saturating_duration_since(now());
        if left.is_zero() {
            return Waited::TimedOut;
        }
        pause(left.min(READY_POLL));
    }
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
    /// Made non-blocking ([`Comm::init_within`]): a call may answer `ncclInProgress`, and the
    /// next waits (at most this long) until the communicator is ready again.
    settle: Option<Duration>,
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
        Ok(Self {
            raw,
            rank,
            settle: None,
        })
    }

    /// [`Comm::init`] that gives up after `timeout`: a non-blocking `ncclCommInitRankConfig`,
    /// then `ncclCommGetAsyncError` until the communicator is ready, it fails, `interrupted`
    /// says to give up, or the timeout passes; a communicator not ready then is aborted. Later
    /// calls on it that answer `ncclInProgress` wait for it up to `timeout` again.
    pub fn init_within(
        ranks: u32,
        id: sys::ncclUniqueId,
        rank: u32,
        timeout: Duration,
        interrupted: impl FnMut() -> bool,
    ) -> Result<Self, NcclCallError> {
        const CALL: &str = "ncclCommInitRankConfig";
        let deadline = Instant::now() + timeout;
        let mut config = nonblocking_config(version_code().unwrap_or(0));
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        let (n, r) = (
            i32::try_from(ranks).unwrap_or(i32::MAX),
            i32::try_from(rank).unwrap_or(0),
        );
        // SAFETY: raw receives the new communicator; id is the shared unique id; config is a
        // valid ncclConfig_t that outlives the call.
        let started = unsafe { sys::ncclCommInitRankConfig(&mut raw, n, id, r, &mut config) };
        // Owned from here: dropped (aborted) on every error path.
        let comm = Self {
            raw,
            rank,
            settle: Some(timeout),
        };
        if started != sys::ncclResult_t::ncclInProgress {
            check(started, CALL, raw)?;
        }
        let waited = wait_ready(
            deadline,
            || comm.readiness(),
            interrupted,
            Instant::now,
            std::thread::sleep,
        );
        let message = match waited {
            Waited::Ready => return Ok(comm),
            Waited::Failed(e) => e,
            Waited::TimedOut => format!(
                "the communicator of {ranks} ranks was not ready within {:.0}s (a rank that \
                 never joined, or a network that does not connect); it was aborted",
                timeout.as_secs_f64()
            ),
            Waited::Interrupted => {
                "another rank failed before the communicator was ready; it was aborted".into()
            }
        };
        Err(NcclCallError {
            call: CALL,
            message,
        })
    }

    fn readiness(&self) -> Readiness {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: queries the live communicator.
        let r = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut state) };
        match (r, state) {
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess) => Readiness::Ready,
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclInProgress) => {
                Readiness::InProgress
            }
            (sys::ncclResult_t::ncclSuccess, bad) | (bad, _) => {
                Readiness::Failed(error_text(bad, self.raw))
            }
        }
    }

    /// [`check`] for a call on this communicator: on a non-blocking one, `ncclInProgress`
    /// waits until the communicator is ready again (NCCL asks that before the next call).
    fn settled(&self, r: sys::ncclResult_t, call: &'static str) -> Result<(), NcclCallError> {
        let Some(limit) = self
            .settle
            .filter(|_| r == sys::ncclResult_t::ncclInProgress)
        else {
            return check(r, call, self.raw);
        };
        let waited = wait_ready(
            Instant::now() + limit,
            || self.readiness(),
            || false,
            Instant::now,
            std::thread::sleep,
        );
        let message = match waited {
            Waited::Ready => return Ok(()),
            Waited::Failed(e) => e,
            Waited::TimedOut | Waited::Interrupted => {
                format!("still in progress after {:.0}s", limit.as_secs_f64())
            }
        };
        Err(NcclCallError { call, message })
    }

    /// An error NCCL found while collectives ran (a peer failed, a network error), if any.
    pub fn async_error(&self) -> Option<String> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: queries the live communicator.
        let r = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut state) };
        match (r, state) {
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess)
            | (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclInProgress) => None,
            (sys::ncclResult_t::ncclSuccess, bad) => Some(error_text(bad, self.raw)),
            (bad, _) => Some(error_text(bad, self.raw)),
        }
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
        self.settled(r, call)
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
        let ended = self.settled(unsafe { sys::ncclGroupEnd() }, "ncclGroupEnd");
        queued.and(ended)
    }

    /// Finalizes and destroys the communicator (after its work is done).
    pub fn destroy(mut self) -> Result<(), NcclCallError> {
        // SAFETY: the communicator is live and owned; a non-blocking one is waited for.
        let finalized = self.settled(
            unsafe { sys::ncclCommFinalize(self.raw) },
            "ncclCommFinalize",
        );
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
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

    /// A clock that moves only when the code under test pauses.
    struct FakeClock {
        now: std::cell::Cell<Instant>,
        pauses: std::cell::Cell<u32>,
    }

    impl FakeClock {
        fn new() -> Self {
            Self {
                now: std::cell::Cell::new(Instant::now()),
                pauses: std::cell::Cell::new(0),
            }
        }
        fn pause(&self, d: Duration) {
            self.now.set(self.now.get() + d);
            self.pauses.set(self.pauses.get() + 1);
        }
    }

    #[test]
    fn a_communicator_that_never_gets_ready_times_out_at_its_deadline_and_not_before() {
        let clock = FakeClock::new();
        let deadline = clock.now.get() + Duration::from_secs(120);
        let waited = wait_ready(
            deadline,
            || Readiness::InProgress,
            || false,
            || clock.now.get(),
            |d| clock.pause(d),
        );
        assert_eq!(waited, Waited::TimedOut);
        assert_eq!(clock.now.get(), deadline, "no pause runs past the deadline");
        assert_eq!(
            clock.pauses.get(),
            12_000,
            "120 s in pauses of {READY_POLL:?}"
        );
    }

    #[test]
    fn a_ready_failed_or_interrupted_communicator_ends_the_wait_at_once() {
        let clock = FakeClock::new();
        let start = clock.now.get();
        let deadline = start + Duration::from_secs(120);
        let looks = std::cell::Cell::new(0);
        let ready_on_third = || {
            looks.set(looks.get() + 1);
            if looks.get() < 3 {
                Readiness::InProgress
            } else {
                Readiness::Ready
            }
        };
        let now = || clock.now.get();
        let waited = wait_ready(deadline, ready_on_third, || false, now, |d| clock.pause(d));
        assert_eq!(waited, Waited::Ready);
        assert_eq!(clock.now.get() - start, READY_POLL * 2);
        let failed = wait_ready(
            deadline,
            || Readiness::Failed("remote process exited".into()),
            || false,
            now,
            |d| clock.pause(d),
        );
        assert_eq!(failed, Waited::Failed("remote process exited".into()));
        let before = clock.now.get();
        let stopped = wait_ready(
            deadline,
            || Readiness::InProgress,
            || true,
            now,
            |d| clock.pause(d),
        );
        assert_eq!(stopped, Waited::Interrupted);
        assert_eq!(clock.now.get(), before, "no pause once interrupted");
    }

    #[test]
    fn the_config_is_nccl_s_initializer_for_the_loaded_version_with_blocking_off() {
        let c = nonblocking_config(22803);
        assert_eq!(c.size, std::mem::size_of::<sys::ncclConfig_t>());
        assert_eq!((c.magic, c.version, c.blocking), (0xcafe_beef, 22803, 0));
        assert_eq!(
            (c.cgaClusterSize, c.minCTAs, c.maxCTAs),
            (i32::MIN, i32::MIN, i32::MIN)
        );
        assert!(c.netName.is_null() && c.commName.is_null());
    }

    #[test]
    fn version_codes_read_like_nccl_prints_them() {
        assert_eq!(format_version(22803), "2.28.3");
        assert_eq!(format_version(21905), "2.19.5");
        assert_eq!(format_version(2804), "2.8.4");
    }
}
