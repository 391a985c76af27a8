//! Compute burn on one GPU: back-to-back n×n×n GEMMs (cublasLt for bf16, fp16 and tf32; cuBLAS
//! sgemm for plain fp32) into rotating result slots, every slot compared with the first on the
//! GPU (a GPU that computes wrong fails, as in gpu-burn), a sampled check of the first slot
//! against a CPU reference in f64, and an elementwise sin/exp kernel whose every run must match
//! the first. GEMM throughput is device-timed per batch; two batches stay in flight.
//!
//! A thread beside the burn samples NVML power and throttle reasons ([`measure`]); the burn
//! tells it which phase it is in. The pulse ([`Frame::pulse`]) runs GEMM batches for half of
//! each period and idles for the other half, comparing the result slots after every load
//! phase and against the CPU reference at the end.

use std::collections::VecDeque;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys as blas_sys};
use cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, ValidAsZeroBits, sys,
};
use gpuval_crds::Dtype;
use half::{bf16, f16};

use super::power::{self, Phase, PhaseCell, PowerOutcome, PulseOutcome, next_cycle_start};
use super::{ComputeOutcome, ComputeRequest, GemmOutcome, PulseRequest, TranscendentalOutcome};
use crate::backend::BackendError;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::buffer::{grid_for, timed};
use crate::backend::cuda::kernels::{Blas, Kernels, require_blas};
use crate::backend::cuda::launch::Kernel;
use crate::run_control::RunControl;

const SLOTS: usize = 4;
const BATCH: usize = 8;
/// Slot comparisons and a transcendental run every this many batches.
const CHECK_EVERY: u64 = 4;
const TRANS_ELEMS: u64 = 1 << 24;
const TRANS_ROUNDS: u32 = 64;
/// The longest sleep of the pulse's idle half between stop checks.
const IDLE_STEP: Duration = Duration::from_millis(20);

/// The check on one GPU: the burn (and pulse) with a thread beside it sampling power.
pub(super) fn measure(
    b: &CudaBackend,
    gpu: u32,
    req: &ComputeRequest,
    ctl: &RunControl<'_>,
) -> Result<ComputeOutcome, BackendError> {
    let phase = &PhaseCell::default();
    let (limit_w, default_limit_w) = b.nvml.power_limits(gpu);
    let (done, finished) = mpsc::channel::<()>();
    let (result, watched) = std::thread::scope(|s| {
        let nvml = &b.nvml;
        let sampler = s
            .spawn(move || power::watch(power::SAMPLE_EVERY, phase, || nvml.power(gpu), &finished));
        let result = b.on_gpu(gpu, |ctx, k| run(ctx, gpu, k, req, ctl, phase));
        drop(done);
        (result, sampler.join().unwrap_or_default())
    });
    result.map(|mut out| {
        out.power = PowerOutcome {
            limit_w,
            default_limit_w,
            ..watched
        };
        out
    })
}

/// Per-dtype comparison tolerances: (relative, absolute) between result slots, and the unit
/// roundoff used for the CPU reference check.
fn tolerance(d: Dtype) -> (f32, f32, f64) {
    match d {
        Dtype::Bf16 => (1e-2, 1e-2, 2f64.powi(-8)),
        Dtype::Fp16 => (2e-3, 2e-3, 2f64.powi(-11)),
        Dtype::Tf32 => (1e-3, 1e-3, 2f64.powi(-11)),
        Dtype::Fp32 => (1e-5, 1e-5, 2f64.powi(-20)),
    }
}

/// Element types the burn runs on, with their init and compare kernels.
trait Elem: DeviceRepr + ValidAsZeroBits + FromF32 + Copy + Send + Sync + 'static {
    fn init(k: &Kernels) -> &Kernel;
    fn compare(k: &Kernels) -> &Kernel;
    fn to_f64(self) -> f64;
}
/// `Elem` for one type: its init and compare kernels, and how it widens to f64.
macro_rules! elem {
    ($ty:ty, $init:ident, $compare:ident, |$x:ident| $to_f64:expr) => {
        impl Elem for $ty {
            fn init(k: &Kernels) -> &Kernel {
                &k.$init
            }
            fn compare(k: &Kernels) -> &Kernel {
                &k.$compare
            }
            fn to_f64(self) -> f64 {
                let $x = self;
                $to_f64
            }
        }
    };
}
elem!(bf16, init_bf16, compare_bf16, |x| f64::from(x.to_f32()));
elem!(f16, init_f16, compare_f16, |x| f64::from(x.to_f32()));
elem!(f32, init_f32, compare_f32, |x| f64::from(x));

/// Which library multiplies.
enum Engine {
    Lt(CudaBlasLT),
    Blas(CudaBlas),
}

/// One burn's device buffers: the inputs A and B and the rotating result slots.
struct Operands<T> {
    a: CudaSlice<T>,
    b: CudaSlice<T>,
    slots: Vec<CudaSlice<T>>,
}

/// Device-side results of the slot comparisons: the mismatch count and the largest relative
/// error (as f32 bits).
struct Tally {
    counters: CudaSlice<u64>,
    maxrel: CudaSlice<u32>,
}

struct Transcendental {
    input: CudaSlice<f32>,
    reference: CudaSlice<f32>,
    scratch: CudaSlice<f32>,
    counters: CudaSlice<u64>,
    maxrel: CudaSlice<u32>,
    outcome: TranscendentalOutcome,
}

fn run(
    ctx: &Arc<CudaContext>,
    gpu: u32,
    k: &Kernels,
    req: &ComputeRequest,
    ctl: &RunControl<'_>,
    phase: &PhaseCell,
) -> Result<ComputeOutcome, BackendError> {
    require_blas(Blas::WithLt)?;
    let started = Instant::now();
    let stream = ctx
        .new_stream()
        .map_err(|e| BackendError::gpu(gpu, "create a stream", e))?;
    let mut trans = if req.transcendentals {
        Some(Transcendental::new(&stream, k, gpu)?)
    } else {
        None
    };
    let n_dtypes = req.dtypes.len().max(1) as u32;
    let share = req.duration / n_dtypes;
    let mut out = ComputeOutcome::default();
    let frame = |index: usize| Frame {
        ctx,
        stream: &stream,
        gpu,
        k,
        n: req.matrix_size,
        budget: share,
        ctl,
        index,
        of: req.dtypes.len() + usize::from(req.pulse.is_some()),
        phase,
    };
    for (i, &dtype) in req.dtypes.iter().enumerate() {
        let frame = frame(i);
        let g = match dtype {
            Dtype::Bf16 => frame.burn::<bf16>(dtype, trans.as_mut())?,
            Dtype::Fp16 => frame.burn::<f16>(dtype, trans.as_mut())?,
            Dtype::Tf32 | Dtype::Fp32 => frame.burn::<f32>(dtype, trans.as_mut())?,
        };
        out.gemms.push(g);
        if ctl.stopped() {
            return Err(BackendError::Stopped);
        }
    }
    out.transcendental = trans.map(|t| t.outcome);
    if let Some(p) = &req.pulse {
        let frame = frame(req.dtypes.len());
        let dtype = req.dtypes.first().copied().unwrap_or(Dtype::Bf16);
        out.pulse = Some(match dtype {
            Dtype::Bf16 => frame.pulse::<bf16>(dtype, p)?,
            Dtype::Fp16 => frame.pulse::<f16>(dtype, p)?,
            Dtype::Tf32 | Dtype::Fp32 => frame.pulse::<f32>(dtype, p)?,
        });
    }
    out.seconds = started.elapsed().as_secs_f64();
    Ok(out)
}

struct Frame<'a> {
    ctx: &'a Arc<CudaContext>,
    stream: &'a Arc<CudaStream>,
    gpu: u32,
    k: &'a Kernels,
    n: usize,
    budget: Duration,
    ctl: &'a RunControl<'a>,
    index: usize,
    of: usize,
    /// What the GPU is doing, for the power samples.
    phase: &'a PhaseCell,
}

impl Frame<'_> {
    fn err<E: std::fmt::Display>(&self, what: &str) -> impl Fn(E) -> BackendError + '_ {
        let what = what.to_string();
        move |e| BackendError::gpu(self.gpu, what.clone(), e)
    }

    fn cfg(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (grid_for(self.ctx, 4), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One dtype's burn: operands, engine, warm-up and reference check, the timed loop, and
    /// the comparison tallies at the end.
    fn burn<T: Elem>(
        &self,
        dtype: Dtype,
        trans: Option<&mut Transcendental>,
    ) -> Result<GemmOutcome, BackendError>
    where
        CudaBlasLT: Matmul<T>,
        CudaBlas: Gemm<T>,
    {
        let started = Instant::now();
        let (mut ops, engine) = self.warmed_up::<T>(dtype)?;
        // The reference check on slot 0.
        let (ref_bad, ref_worst) = self.reference_check(dtype, &ops.a, &ops.b, &ops.slots[0])?;

        let mut tally = self.tally()?;
        let mut out = GemmOutcome {
            mismatches: ref_bad,
            max_rel_error: ref_worst,
            ..GemmOutcome::nothing(dtype)
        };
        self.batches(&engine, &mut ops, &mut tally, &mut out, trans)?;
        self.finish(&tally, &mut out)?;
        out.wall_seconds = started.elapsed().as_secs_f64();
        Ok(out)
    }

    /// The operands and engine of a `dtype` burn, warmed up (heuristics, clocks): the first two
    /// result slots computed.
    fn warmed_up<T: Elem>(&self, dtype: Dtype) -> Result<(Operands<T>, Engine), BackendError>
    where
        CudaBlasLT: Matmul<T>,
        CudaBlas: Gemm<T>,
    {
        let mut ops = self.operands::<T>()?;
        let engine = self.engine(dtype)?;
        for slot in ops.slots.iter_mut().take(2) {
            self.gemm(&engine, &ops.a, &ops.b, slot)?;
        }
        self.stream.synchronize().map_err(self.err("warm-up"))?;
        Ok((ops, engine))
    }

    /// Allocates A, B and the zeroed result slots, and fills A and B with their patterns.
    fn operands<T: Elem>(&self) -> Result<Operands<T>, BackendError> {
        let n = self.n;
        let elems = (n * n) as u64;
        let stream = self.stream;
        // SAFETY: every element is written by the init kernel before it is read.
        let mut a = unsafe { stream.alloc::<T>(n * n) }.map_err(self.err("allocate A"))?;
        let mut b = unsafe { stream.alloc::<T>(n * n) }.map_err(self.err("allocate B"))?;
        let mut slots: Vec<CudaSlice<T>> = Vec::with_capacity(SLOTS);
        for _ in 0..SLOTS {
            slots.push(
                stream
                    .alloc_zeros::<T>(n * n)
                    .map_err(self.err("allocate a result slot"))?,
            );
        }
        self.init(&mut a, elems, 0x1234_5678)?;
        self.init(&mut b, elems, 0x0bad_cafe)?;
        Ok(Operands { a, b, slots })
    }

    /// Creates the GEMM engine: cuBLAS for plain fp32, cublasLt for the others.
    fn engine(&self, dtype: Dtype) -> Result<Engine, BackendError> {
        let stream = self.stream;
        Ok(match dtype {
            Dtype::Fp32 => Engine::Blas(
                CudaBlas::new(stream.clone())
                    .map_err(|e| BackendError::gpu(self.gpu, "create a cuBLAS handle", e))?,
            ),
            _ => Engine::Lt(
                CudaBlasLT::new(stream.clone())
                    .map_err(|e| BackendError::gpu(self.gpu, "create a cublasLt handle", e))?,
            ),
        })
    }

    /// Allocates the zeroed mismatch counter and largest-relative-error cell.
    fn tally(&self) -> Result<Tally, BackendError> {
        let counters = self
            .stream
            .alloc_zeros::<u64>(1)
            .map_err(self.err("allocate counters"))?;
        let maxrel = self
            .stream
            .alloc_zeros::<u32>(1)
            .map_err(self.err("allocate counters"))?;
        Ok(Tally { counters, maxrel })
    }

    /// The timed loop until the budget is spent or the run stops: batches with two in flight,
    /// slot comparisons and a transcendental run every CHECK_EVERY batches, progress.
    fn batches<T: Elem>(
        &self,
        engine: &Engine,
        ops: &mut Operands<T>,
        tally: &mut Tally,
        out: &mut GemmOutcome,
        mut trans: Option<&mut Transcendental>,
    ) -> Result<(), BackendError>
    where
        CudaBlasLT: Matmul<T>,
        CudaBlas: Gemm<T>,
    {
        let mut inflight: VecDeque<(CudaEvent, CudaEvent)> = VecDeque::new();
        let loop_start = Instant::now();
        let mut batch_no: u64 = 0;
        self.phase.set(Phase::Burn);
        let _other = PhaseReset(self.phase);
        loop {
            let done = loop_start.elapsed() >= self.budget || self.ctl.stopped();
            if !done {
                inflight.push_back(self.batch(engine, ops)?);
                batch_no += 1;
                if batch_no.is_multiple_of(CHECK_EVERY) {
                    self.compare_slots(&ops.slots, tally, out)?;
                    if let Some(t) = trans.as_deref_mut() {
                        t.run(self)?;
                    }
                }
            }
            self.drain(&mut inflight, done, out)?;
            if done {
                break;
            }
            if out.iterations == 0 {
                continue;
            }
            self.report(loop_start, out);
        }
        Ok(())
    }

    /// Queues one batch of BATCH GEMMs into the rotating slots between two recorded events.
    fn batch<T: Elem>(
        &self,
        engine: &Engine,
        ops: &mut Operands<T>,
    ) -> Result<(CudaEvent, CudaEvent), BackendError>
    where
        CudaBlasLT: Matmul<T>,
        CudaBlas: Gemm<T>,
    {
        let stream = self.stream;
        let start = self.event()?;
        start.record(stream).map_err(self.err("record an event"))?;
        for i in 0..BATCH {
            self.gemm(engine, &ops.a, &ops.b, &mut ops.slots[i % SLOTS])?;
        }
        let end = self.event()?;
        end.record(stream).map_err(self.err("record an event"))?;
        Ok((start, end))
    }

    /// Queues the comparison of every result slot after the first with the first.
    fn compare_slots<T: Elem>(
        &self,
        slots: &[CudaSlice<T>],
        tally: &mut Tally,
        out: &mut GemmOutcome,
    ) -> Result<(), BackendError> {
        let elems = (self.n * self.n) as u64;
        let (rtol, atol, _) = tolerance(out.dtype);
        let (first, rest) = slots.split_at(1);
        for slot in rest {
            self.compare(
                &first[0],
                slot,
                elems,
                rtol,
                atol,
                &mut tally.counters,
                &mut tally.maxrel,
            )?;
            out.comparisons += 1;
        }
        Ok(())
    }

    /// Keeps two batches in flight (all of them drained once `done`): waits for the oldest and
    /// adds its device time, iterations and FLOPs to `out`.
    fn drain(
        &self,
        inflight: &mut VecDeque<(CudaEvent, CudaEvent)>,
        done: bool,
        out: &mut GemmOutcome,
    ) -> Result<(), BackendError> {
        let flops_per = 2.0 * (self.n as f64).powi(3);
        while inflight.len() > 1 || (done && !inflight.is_empty()) {
            let Some((s, e)) = inflight.pop_front() else {
                break;
            };
            e.synchronize().map_err(self.err("wait for a GEMM batch"))?;
            let ms = s.elapsed_ms(&e).map_err(self.err("read a timer"))?;
            out.gemm_seconds += f64::from(ms) / 1e3;
            out.iterations += BATCH as u64;
            out.flops += flops_per * BATCH as f64;
        }
        Ok(())
    }

    /// Reports progress over all dtypes and the GEMM throughput so far.
    fn report(&self, loop_start: Instant, out: &GemmOutcome) {
        let dtype = out.dtype;
        let frac = (self.index as f64
            + (loop_start.elapsed().as_secs_f64() / self.budget.as_secs_f64()).min(1.0))
            / self.of as f64;
        self.ctl.progress(
            frac,
            &format!(
                "{dtype} {:.0} TFLOP/s",
                out.flops / out.gemm_seconds.max(1e-9) / 1e12
            ),
        );
    }

    /// The power pulse: GEMM batches for the first half of each period and idle for the second,
    /// cycles aligned to the request's epoch, the result slots compared after each load phase;
    /// then every slot recomputed and compared, and the CPU reference check.
    fn pulse<T: Elem>(&self, dtype: Dtype, req: &PulseRequest) -> Result<PulseOutcome, BackendError>
    where
        CudaBlasLT: Matmul<T>,
        CudaBlas: Gemm<T>,
    {
        let started = Instant::now();
        let (mut ops, engine) = self.warmed_up::<T>(dtype)?;
        let mut tally = self.tally()?;
        let mut g = GemmOutcome::nothing(dtype);
        let _other = PhaseReset(self.phase);
        let end = started + req.duration;
        let mut cycles = 0u64;
        while !self.ctl.stopped() {
            let start = req.epoch + next_cycle_start(req.epoch.elapsed(), req.period);
            if cycles > 0 && start + req.period > end {
                break;
            }
            self.phase.set(Phase::PulseIdle);
            self.idle_until(start);
            self.phase.set(Phase::PulseLoad);
            self.load_until(start + req.period / 2, &engine, &mut ops, &mut g)?;
            self.compare_slots(&ops.slots, &mut tally, &mut g)?;
            self.phase.set(Phase::PulseIdle);
            cycles += 1;
            let done = (started.elapsed().as_secs_f64() / req.duration.as_secs_f64()).min(1.0);
            self.ctl.progress(
                (self.index as f64 + done) / self.of as f64,
                &format!("pulse cycle {cycles}"),
            );
        }
        self.phase.set(Phase::Other);
        for slot in ops.slots.iter_mut() {
            self.gemm(&engine, &ops.a, &ops.b, slot)?;
        }
        self.compare_slots(&ops.slots, &mut tally, &mut g)?;
        let (ref_bad, ref_worst) = self.reference_check(dtype, &ops.a, &ops.b, &ops.slots[0])?;
        self.finish(&tally, &mut g)?;
        Ok(PulseOutcome {
            period_seconds: req.period.as_secs_f64(),
            seconds: started.elapsed().as_secs_f64(),
            cycles,
            comparisons: g.comparisons,
            mismatches: g.mismatches + ref_bad,
            max_rel_error: g.max_rel_error.max(ref_worst),
        })
    }

    /// Queues GEMM batches (two in flight) until `until`, then waits for the last.
    fn load_until<T: Elem>(
        &self,
        until: Instant,
        engine: &Engine,
        ops: &mut Operands<T>,
        g: &mut GemmOutcome,
    ) -> Result<(), BackendError>
    where
        CudaBlasLT: Matmul<T>,
        CudaBlas: Gemm<T>,
    {
        let mut inflight = VecDeque::new();
        while Instant::now() < until && !self.ctl.stopped() {
            inflight.push_back(self.batch(engine, ops)?);
            self.drain(&mut inflight, false, g)?;
        }
        self.drain(&mut inflight, true, g)
    }

    /// Leaves the GPU idle until `until` (the idle half of a pulse cycle), in short steps so a
    /// stop is seen.
    fn idle_until(&self, until: Instant) {
        loop {
            let now = Instant::now();
            if now >= until || self.ctl.stopped() {
                return;
            }
            std::thread::sleep((until - now).min(IDLE_STEP));
        }
    }

    /// Waits for the burn to finish and adds the device-side comparison tallies to `out`.
    fn finish(&self, tally: &Tally, out: &mut GemmOutcome) -> Result<(), BackendError> {
        let stream = self.stream;
        stream.synchronize().map_err(self.err("finish the burn"))?;
        let c = stream
            .clone_dtoh(&tally.counters)
            .map_err(self.err("read counters"))?;
        let r = stream
            .clone_dtoh(&tally.maxrel)
            .map_err(self.err("read counters"))?;
        out.mismatches += c[0];
        out.max_rel_error = out.max_rel_error.max(f64::from(f32::from_bits(r[0])));
        Ok(())
    }

    fn event(&self) -> Result<CudaEvent, BackendError> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(self.err("create an event"))
    }

    fn init<T: Elem>(&self, buf: &mut CudaSlice<T>, n: u64, seed: u32) -> Result<(), BackendError> {
        let mut b = T::init(self.k).on(self.stream);
        b.arg(buf).arg(&n).arg(&seed);
        // SAFETY: the init kernel writes n elements of buf.
        unsafe { b.launch(self.cfg()) }
            .map(|_| ())
            .map_err(self.err("initialise inputs"))
    }

    #[allow(clippy::too_many_arguments)]
    fn compare<T: Elem>(
        &self,
        reference: &CudaSlice<T>,
        other: &CudaSlice<T>,
        n: u64,
        rtol: f32,
        atol: f32,
        counters: &mut CudaSlice<u64>,
        maxrel: &mut CudaSlice<u32>,
    ) -> Result<(), BackendError> {
        let mut b = T::compare(self.k).on(self.stream);
        b.arg(reference)
            .arg(other)
            .arg(&n)
            .arg(&rtol)
            .arg(&atol)
            .arg(counters)
            .arg(maxrel);
        // SAFETY: reads n elements of both slots, updates one counter each.
        unsafe { b.launch(self.cfg()) }
            .map(|_| ())
            .map_err(self.err("compare results"))
    }

    fn gemm<T: Elem>(
        &self,
        engine: &Engine,
        a: &CudaSlice<T>,
        b: &CudaSlice<T>,
        c: &mut CudaSlice<T>,
    ) -> Result<(), BackendError>
    where
        CudaBlasLT: Matmul<T>,
        CudaBlas: Gemm<T>,
    {
        let n = self.n;
        let r = match engine {
            Engine::Lt(lt) => {
                let cfg = MatmulConfig {
                    transa: false,
                    transb: false,
                    transc: false,
                    m: n as u64,
                    n: n as u64,
                    k: n as u64,
                    alpha: 1.0,
                    lda: n as i64,
                    ldb: n as i64,
                    beta: 0.0,
                    ldc: n as i64,
                    stride_a: None,
                    stride_b: None,
                    stride_c: None,
                    stride_bias: None,
                    batch_size: None,
                };
                // SAFETY: a, b, c are n×n column-major matrices of T on this stream.
                unsafe { lt.matmul(cfg, a, b, c, None, None) }.map_err(|e| e.to_string())
            }
            Engine::Blas(blas) => {
                let cfg = GemmConfig {
                    transa: blas_sys::cublasOperation_t::CUBLAS_OP_N,
                    transb: blas_sys::cublasOperation_t::CUBLAS_OP_N,
                    m: n as i32,
                    n: n as i32,
                    k: n as i32,
                    alpha: T::one(),
                    lda: n as i32,
                    ldb: n as i32,
                    beta: T::zero(),
                    ldc: n as i32,
                };
                // SAFETY: as above.
                unsafe { blas.gemm(cfg, a, b, c) }.map_err(|e| e.to_string())
            }
        };
        r.map_err(|e| BackendError::gpu(self.gpu, "GEMM", e))
    }

    /// Compares 16 sampled elements of C = A·B with an f64 dot product on the CPU. Returns the
    /// elements outside the dtype's error bound and the largest relative error.
    fn reference_check<T: Elem>(
        &self,
        dtype: Dtype,
        a: &CudaSlice<T>,
        b: &CudaSlice<T>,
        c: &CudaSlice<T>,
    ) -> Result<(u64, f64), BackendError> {
        let n = self.n;
        let ha = self
            .stream
            .clone_dtoh(a)
            .map_err(self.err("copy A to the host"))?;
        let hb = self
            .stream
            .clone_dtoh(b)
            .map_err(self.err("copy B to the host"))?;
        let hc = self
            .stream
            .clone_dtoh(c)
            .map_err(self.err("copy C to the host"))?;
        let (_, _, eps) = tolerance(dtype);
        let mut bad = 0;
        let mut worst: f64 = 0.0;
        for s in 0..16usize {
            let i = (s * 2_654_435_761usize) % n;
            let j = (s * 40_503usize + 17) % n;
            let (mut dot, mut sq) = (0.0f64, 0.0f64);
            for kk in 0..n {
                let p = ha[i + kk * n].to_f64() * hb[kk + j * n].to_f64();
                dot += p;
                sq += p * p;
            }
            let got = hc[i + j * n].to_f64();
            let bound = 8.0 * eps * (dot.abs() + sq.sqrt());
            let diff = (got - dot).abs();
            // NaN never passes.
            if diff.is_nan() || diff > bound {
                bad += 1;
            }
            worst = worst.max(diff / dot.abs().max(1e-12));
        }
        Ok((bad, worst))
    }
}

/// Sets the phase back to `Other` when dropped (the end of a burn, or an error).
struct PhaseReset<'a>(&'a PhaseCell);

impl Drop for PhaseReset<'_> {
    fn drop(&mut self) {
        self.0.set(Phase::Other);
    }
}

/// One/zero for each element type (the cuBLAS alpha and beta).
trait Scalars {
    fn one() -> Self;
    fn zero() -> Self;
}
impl<T: Elem> Scalars for T {
    fn one() -> Self {
        T::from_f32(1.0)
    }
    fn zero() -> Self {
        T::from_f32(0.0)
    }
}

trait FromF32 {
    fn from_f32(v: f32) -> Self;
}
impl FromF32 for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}
impl FromF32 for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl FromF32 for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Transcendental {
    fn new(stream: &Arc<CudaStream>, k: &Kernels, gpu: u32) -> Result<Self, BackendError> {
        let err = |what: &'static str| move |e| BackendError::gpu(gpu, what, e);
        let mut input =
            unsafe { stream.alloc::<f32>(TRANS_ELEMS as usize) }.map_err(err("allocate"))?;
        let reference = stream
            .alloc_zeros::<f32>(TRANS_ELEMS as usize)
            .map_err(err("allocate"))?;
        let scratch = stream
            .alloc_zeros::<f32>(TRANS_ELEMS as usize)
            .map_err(err("allocate"))?;
        let counters = stream.alloc_zeros::<u64>(1).map_err(err("allocate"))?;
        let maxrel = stream.alloc_zeros::<u32>(1).map_err(err("allocate"))?;
        let seed = 99u32;
        let mut bld = k.init_f32.on(stream);
        bld.arg(&mut input).arg(&TRANS_ELEMS).arg(&seed);
        // SAFETY: writes TRANS_ELEMS floats of input.
        unsafe { bld.launch(LaunchConfig::for_num_elems(1 << 20)) }
            .map_err(|e| BackendError::gpu(gpu, "initialise", e))?;
        Ok(Self {
            input,
            reference,
            scratch,
            counters,
            maxrel,
            outcome: TranscendentalOutcome::default(),
        })
    }

    /// The first run writes the reference; every later run is compared with it exactly.
    fn run(&mut self, f: &Frame<'_>) -> Result<(), BackendError> {
        let first = self.outcome.iterations == 0;
        let cfg = f.cfg();
        let k = f.k;
        let stream = f.stream;
        let (input, target) = (
            &self.input,
            if first {
                &mut self.reference
            } else {
                &mut self.scratch
            },
        );
        let secs = timed(f.ctx, stream, || {
            let mut b = k.transcendental.on(stream);
            b.arg(input)
                .arg(target)
                .arg(&TRANS_ELEMS)
                .arg(&TRANS_ROUNDS);
            // SAFETY: reads and writes TRANS_ELEMS floats.
            unsafe { b.launch(cfg) }.map(|_| ())
        })
        .map_err(f.err("transcendental kernel"))?;
        self.outcome.seconds += secs;
        self.outcome.iterations += 1;
        self.outcome.elements = TRANS_ELEMS;
        if !first {
            f.compare(
                &self.reference,
                &self.scratch,
                TRANS_ELEMS,
                0.0,
                0.0,
                &mut self.counters,
                &mut self.maxrel,
            )?;
            let c = stream
                .clone_dtoh(&self.counters)
                .map_err(f.err("read counters"))?;
            self.outcome.mismatches = c[0];
        }
        Ok(())
    }
}
