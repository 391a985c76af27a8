//! One rank of the sweep, on its own thread with its own GPU and stream: every step is
//! inputs, warm-up, a timed batch between two device events, then an untimed verification run
//! whose output the GPU compares element by element.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, result, sys};
use cudarc::nccl::sys as nccl;
use gpuval_crds::Collective;

use super::comm::{Buffers, Comm};
use super::kernels::{CheckArgs, Kernels};
use super::sync::{InCall, Interrupted, Shared, WaitError, wait_for};
use crate::backend::Side;
use crate::backend::cuda::buffer::DeviceBuffer;
use crate::nccl::bandwidth::Layout;
use crate::nccl::outcome::{Abort, AbortCause, Phase};
use crate::nccl::request::SweepRequest;

/// What one rank measured in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub collective: Collective,
    pub bytes: u64,
    pub count: u64,
    pub in_place: bool,
    /// Device seconds per collective on this rank.
    pub seconds: f64,
    pub wrong: u64,
    pub first_wrong: Option<u64>,
}

/// Why a rank ended early.
#[derive(Debug, Clone, PartialEq)]
pub enum RankError {
    /// Before its communicator was ready (context, memory, kernels, NCCL init).
    Setup(SetupError),
    /// The sweep was aborted; the reason is in the shared state.
    Aborted,
}

/// A rank's setup that failed: in words, and whose side it is on (its own GPU work always; an
/// NCCL call as [`super::comm::NcclCallError::side`] says).
#[derive(Debug, Clone, PartialEq)]
pub struct SetupError {
    pub message: String,
    pub side: Side,
}

impl SetupError {
    /// A failure on this node's own side.
    pub fn own(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            side: Side::Own,
        }
    }
}

/// What a rank needs to start.
pub struct RankSetup<'a> {
    pub rank: u32,
    pub req: &'a SweepRequest,
    pub id: nccl::ncclUniqueId,
    pub ptx: &'a str,
    pub shared: &'a Shared<'a>,
    /// Test hook: this rank never joins a collective.
    pub skip: bool,
    /// Called after every step this rank finishes.
    pub on_step: &'a (dyn Fn(u32, &StepRecord) + Sync),
}

/// Runs every step on this rank and returns what it measured, and how it ended; ends with
/// the communicator destroyed, or aborted on any failure.
pub fn run(s: RankSetup<'_>) -> (Vec<StepRecord>, Result<(), RankError>) {
    let mut rank = match Rank::open(&s) {
        Ok(r) => r,
        Err(e) => {
            // The other ranks must not wait in ncclCommInitRank for this one.
            s.shared.abort_setup();
            return (Vec::new(), Err(RankError::Setup(SetupError::own(e))));
        }
    };
    if s.shared.barrier().is_err() {
        rank.finish(false);
        return (Vec::new(), Err(RankError::Aborted));
    }
    s.shared.in_call(
        s.rank,
        Some(InCall {
            what: "ncclCommInitRank",
            since: Instant::now(),
            step: None,
        }),
    );
    let comm = Comm::init(s.req.world_size(), s.id, s.req.global_rank(s.rank));
    s.shared.in_call(s.rank, None);
    match comm {
        Ok(c) => rank.comm = Some(c),
        Err(e) => {
            s.shared.abort_setup();
            rank.finish(false);
            return (
                Vec::new(),
                Err(RankError::Setup(SetupError {
                    message: format!("rank {}: {e}", s.rank),
                    side: e.side,
                })),
            );
        }
    }
    let mut steps = Vec::new();
    let ended = rank.sweep(&s, &mut steps);
    let what = if ended.is_ok() {
        "ncclCommDestroy"
    } else {
        "ncclCommAbort"
    };
    s.shared.in_call(
        s.rank,
        Some(InCall {
            what,
            since: Instant::now(),
            step: None,
        }),
    );
    rank.finish(ended.is_ok());
    s.shared.in_call(s.rank, None);
    (steps, ended)
}

struct Rank {
    /// This process's rank index: its visible GPU and its records.
    rank: u32,
    /// Its rank in the communicator (differs when the communicator spans processes).
    global: u32,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    /// Taken (and leaked) only when the stream never goes idle after an abort.
    buffers: Option<(DeviceBuffer, DeviceBuffer)>,
    send: u64,
    recv: u64,
    result: CudaSlice<u64>,
    start: CudaEvent,
    end: CudaEvent,
    comm: Option<Comm>,
    skip: bool,
}

/// Where a step was and what went wrong, turned into the shared abort (None: another rank
/// aborted first and its reason stands).
struct Failure(Phase, Option<AbortCause>);

impl Failure {
    fn at(phase: Phase) -> impl Fn(AbortCause) -> Self {
        move |cause| Failure(phase, Some(cause))
    }
}

impl Rank {
    fn open(s: &RankSetup<'_>) -> Result<Self, String> {
        let r = s.rank;
        let err = |what: &'static str| {
            move |e: cudarc::driver::DriverError| format!("rank {r}: {what}: {e}")
        };
        let ctx = CudaContext::new(r as usize).map_err(err("open the CUDA context"))?;
        ctx.bind_to_thread().map_err(err("bind the context"))?;
        let stream = ctx.new_stream().map_err(err("create a stream"))?;
        let kernels = Kernels::load(&ctx, s.ptx)
            .map_err(|e| format!("rank {r}: load the check kernels: {e}"))?;
        let bytes = s.req.buffer_bytes().max(16);
        let send = DeviceBuffer::alloc_exact(&ctx, r, bytes).map_err(|e| e.to_string())?;
        let recv = DeviceBuffer::alloc_exact(&ctx, r, bytes).map_err(|e| e.to_string())?;
        let result = stream
            .alloc_zeros::<u64>(2)
            .map_err(err("allocate the check counters"))?;
        let event = || ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT));
        let (start, end) = (
            event().map_err(err("create an event"))?,
            event().map_err(err("create an event"))?,
        );
        let (send_ptr, recv_ptr) = (send.ptr, recv.ptr);
        Ok(Self {
            rank: r,
            global: s.req.global_rank(r),
            ctx,
            stream,
            kernels,
            buffers: Some((send, recv)),
            send: send_ptr,
            recv: recv_ptr,
            result,
            start,
            end,
            comm: None,
            skip: s.skip,
        })
    }

    fn sweep(&mut self, s: &RankSetup<'_>, out: &mut Vec<StepRecord>) -> Result<(), RankError> {
        let req = s.req;
        s.shared.barrier().map_err(|_| RankError::Aborted)?;
        for (c, &collective) in req.collectives.iter().enumerate() {
            for (i, &size) in req.sizes.iter().enumerate() {
                let layout = Layout::new(
                    collective,
                    size,
                    req.dtype.size(),
                    u64::from(req.world_size()),
                );
                if layout.bytes() == 0 {
                    continue;
                }
                for in_place in [false, true] {
                    if in_place && !layout.has_in_place() {
                        continue;
                    }
                    let seed = step_seed(c, i, in_place);
                    match self.step(s, &layout, in_place, seed) {
                        Ok(rec) => {
                            (s.on_step)(self.rank, &rec);
                            out.push(rec);
                        }
                        Err(Failure(_, None)) => return Err(RankError::Aborted),
                        Err(Failure(phase, Some(cause))) => {
                            s.shared.abort(Abort {
                                collective,
                                bytes: layout.bytes(),
                                in_place,
                                phase,
                                rank: self.rank,
                                cause,
                            });
                            return Err(RankError::Aborted);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn step(
        &mut self,
        s: &RankSetup<'_>,
        l: &Layout,
        in_place: bool,
        seed: u32,
    ) -> Result<StepRecord, Failure> {
        let req = s.req;
        let args = |seed| CheckArgs {
            collective: l.collective,
            dtype: req.dtype,
            rank: self.global,
            ranks: req.world_size(),
            count: l.count,
            seed,
        };
        self.inputs(l, in_place, &args(seed))
            .map_err(Failure::at(Phase::WarmUp))?;
        for _ in 0..req.warmup {
            self.launch(s, l, in_place, Phase::WarmUp)
                .map_err(Failure::at(Phase::WarmUp))?;
        }
        self.wait(s, Phase::WarmUp)?;
        s.shared
            .barrier()
            .map_err(|i| Failure(Phase::Timed, interrupted(i)))?;
        self.start
            .record(&self.stream)
            .map_err(|e| Failure(Phase::Timed, Some(cuda(e))))?;
        for _ in 0..req.iterations {
            self.launch(s, l, in_place, Phase::Timed)
                .map_err(Failure::at(Phase::Timed))?;
        }
        self.wait(s, Phase::Timed)?;
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(|e| Failure(Phase::Timed, Some(cuda(e))))?;
        let seconds = f64::from(ms) / 1e3 / f64::from(req.iterations.max(1));

        let verify = args(seed ^ 0x5bd1_e995);
        self.inputs(l, in_place, &verify)
            .map_err(Failure::at(Phase::Verification))?;
        s.shared
            .barrier()
            .map_err(|i| Failure(Phase::Verification, interrupted(i)))?;
        self.launch(s, l, in_place, Phase::Verification)
            .map_err(Failure::at(Phase::Verification))?;
        self.wait(s, Phase::Verification)?;
        let (wrong, first) = self
            .check(l, in_place, &verify)
            .map_err(Failure::at(Phase::Verification))?;
        Ok(StepRecord {
            collective: l.collective,
            bytes: l.bytes(),
            count: l.count,
            in_place,
            seconds,
            wrong,
            first_wrong: first.map(|j| j * l.element),
        })
    }

    /// Where this rank's input and output of a step live: (input address, output address,
    /// output elements).
    fn places(&self, l: &Layout, in_place: bool) -> (u64, u64, u64) {
        let r = u64::from(self.global);
        if !in_place {
            return (self.send, self.recv, l.recv);
        }
        let base = self.recv;
        (
            base + l.send_offset * r * l.element,
            base + l.recv_offset * r * l.element,
            l.recv,
        )
    }

    /// Poisons the receive buffer (all ones: NaN in both types) and writes the inputs.
    fn inputs(&self, l: &Layout, in_place: bool, a: &CheckArgs) -> Result<(), AbortCause> {
        let (input, _, _) = self.places(l, in_place);
        let out_bytes = usize::try_from(l.send.max(l.recv) * l.element).unwrap_or(usize::MAX);
        self.ctx.bind_to_thread().map_err(cuda)?;
        // SAFETY: the receive buffer holds the largest layout of the sweep.
        unsafe { result::memset_d8_async(self.recv, 0xff, out_bytes, self.stream.cu_stream()) }
            .map_err(cuda)?;
        self.kernels
            .fill(&self.stream, input, l.send, a)
            .map_err(cuda)?;
        self.stream.synchronize().map_err(cuda)
    }

    fn launch(
        &self,
        s: &RankSetup<'_>,
        l: &Layout,
        in_place: bool,
        phase: Phase,
    ) -> Result<(), AbortCause> {
        if self.skip {
            return Ok(());
        }
        let req = s.req;
        let call = InCall {
            what: "collective",
            since: Instant::now(),
            step: Some((l.collective, l.bytes(), in_place, phase)),
        };
        s.shared.in_call(self.rank, Some(call));
        let r = self.launch_now(l, in_place, req);
        s.shared.in_call(self.rank, None);
        r
    }

    fn launch_now(&self, l: &Layout, in_place: bool, req: &SweepRequest) -> Result<(), AbortCause> {
        let comm = self.comm.as_ref().ok_or(AbortCause::NcclError {
            message: "no communicator".into(),
            side: Side::Own,
        })?;
        let b = Buffers {
            send: self.send,
            recv: self.recv,
        };
        comm.launch(l, in_place, req.dtype, b, &self.stream)
            .map_err(|e| AbortCause::NcclError {
                message: e.to_string(),
                side: e.side,
            })
    }

    /// Records the end event and waits for it, checking NCCL's asynchronous error and the
    /// deadline.
    fn wait(&self, s: &RankSetup<'_>, phase: Phase) -> Result<(), Failure> {
        self.end
            .record(&self.stream)
            .map_err(|e| Failure(phase, Some(cuda(e))))?;
        let timeout = s.req.timeout();
        let deadline = Instant::now() + timeout;
        let comm = self.comm.as_ref();
        let done = || self.end.try_is_complete().map_err(|e| e.to_string());
        // The side of NCCL's error, when the failure was NCCL's (else it was the CUDA event's).
        let nccl_side = std::cell::Cell::new(None);
        let failed = || {
            let e = comm.and_then(Comm::async_failure)?;
            nccl_side.set(Some(e.side));
            Some(e.message)
        };
        wait_for(s.shared, deadline, done, failed).map_err(|e| {
            let cause = match (e, nccl_side.get()) {
                (WaitError::Timeout, _) => Some(AbortCause::Timeout {
                    seconds: timeout.as_secs_f64(),
                }),
                (WaitError::Failed(message), Some(side)) => {
                    Some(AbortCause::NcclError { message, side })
                }
                (WaitError::Failed(message), None) => Some(AbortCause::Cuda { message }),
                (WaitError::Interrupted(i), _) => interrupted(i),
            };
            Failure(phase, cause)
        })
    }

    /// Compares the output with what it must be; (wrong elements, first wrong element).
    fn check(
        &mut self,
        l: &Layout,
        in_place: bool,
        a: &CheckArgs,
    ) -> Result<(u64, Option<u64>), AbortCause> {
        let (_, output, n) = self.places(l, in_place);
        self.stream
            .memcpy_htod(&[0u64, u64::MAX], &mut self.result)
            .map_err(cuda)?;
        let (counters, _guard) =
            cudarc::driver::DevicePtrMut::device_ptr_mut(&mut self.result, &self.stream);
        self.kernels
            .check(&self.stream, output, n, a, counters)
            .map_err(cuda)?;
        drop(_guard);
        let got = self.stream.clone_dtoh(&self.result).map_err(cuda)?;
        let wrong = got.first().copied().unwrap_or(0);
        let first = got.get(1).copied().filter(|f| *f != u64::MAX);
        Ok((wrong, first))
    }

    /// Destroys the communicator after a clean sweep, aborts it otherwise; buffers are freed
    /// only once the stream is idle (leaked, with a warning, if it never gets there).
    fn finish(&mut self, clean: bool) {
        if let Some(comm) = self.comm.take() {
            if clean {
                if let Err(e) = comm.destroy() {
                    tracing::warn!(rank = self.rank, error = %e, "destroying the NCCL communicator failed");
                }
            } else {
                comm.abort();
            }
        }
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let idle = (|| -> Result<bool, cudarc::driver::DriverError> {
            let ev = self.stream.record_event(None)?;
            while !ev.try_is_complete()? {
                if Instant::now() >= deadline {
                    return Ok(false);
                }
                std::thread::yield_now();
            }
            Ok(true)
        })();
        if !matches!(idle, Ok(true)) {
            tracing::warn!(
                rank = self.rank,
                "the GPU stream did not go idle; leaving its buffers allocated"
            );
            std::mem::forget(self.buffers.take());
        }
    }
}

fn cuda(e: impl std::fmt::Display) -> AbortCause {
    AbortCause::Cuda {
        message: e.to_string(),
    }
}

/// None when another rank aborted first (its reason stands).
fn interrupted(i: Interrupted) -> Option<AbortCause> {
    match i {
        Interrupted::Aborted => None,
        Interrupted::Stopped => Some(AbortCause::Stopped),
    }
}

/// A different input seed for every step, so data left from an earlier step never passes.
fn step_seed(collective: usize, size: usize, in_place: bool) -> u32 {
    let x = (collective as u32).wrapping_mul(0x9e37_79b9) ^ (size as u32).wrapping_mul(0x85eb_ca6b);
    x ^ u32::from(in_place).wrapping_mul(0xc2b2_ae35) ^ 0x2545_f491
}
