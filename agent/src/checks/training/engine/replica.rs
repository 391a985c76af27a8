//! One replica of the data-parallel step, on its own thread, GPU and streams: the synthetic
//! model's memory, the forward and backward GEMMs through cuBLAS, the activation and update
//! kernels, and the gradient buckets all-reduced on a second stream as soon as the backward
//! pass has produced them (an event per bucket orders the all-reduce after its gradients, and
//! the update waits for the last all-reduce, as DDP orders them).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, sys as blas};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};
use gpuval_crds::{Collective, NcclDtype};

use super::kernels::{Kernels, Ptr};
use crate::backend::cuda::buffer::DeviceBuffer;
use crate::checks::training::request::{ELEMENT, TrainingRequest};
use crate::nccl::bandwidth::Layout;
use crate::nccl::engine::comm::{Buffers, Comm};

/// How a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward, backward and an update with learning rate 0: no communication, weights kept.
    ComputeOnly,
    /// The all-reduce of every bucket overlapping the backward pass, then the SGD update.
    Overlapped,
}

/// Where the model's tensors live in the replica's one allocation.
struct Tensors {
    weights: Ptr,
    grads: Ptr,
    /// Each block's input (and the last block's output): layers + 1 of tokens × hidden.
    inputs: Vec<Ptr>,
    /// Each block's pre-activation and activation: tokens × inner.
    pre: Vec<Ptr>,
    post: Vec<Ptr>,
    /// Gradient scratch: tokens × inner, and two of tokens × hidden used in turn.
    inner_grad: Ptr,
    grad: [Ptr; 2],
}

impl Tensors {
    /// Carves the tensors out of `base` in the order [`TrainingRequest::bytes_per_gpu`] counts.
    fn carve(base: Ptr, req: &TrainingRequest) -> Self {
        let mut at = base;
        let mut take = |elems: u64| {
            let p = at;
            at += elems * ELEMENT;
            p
        };
        let (t, h, f) = (req.tokens(), req.hidden, req.inner());
        let layers = req.layers as usize;
        Self {
            weights: take(req.parameters()),
            grads: take(req.parameters()),
            inputs: (0..=layers).map(|_| take(t * h)).collect(),
            pre: (0..layers).map(|_| take(t * f)).collect(),
            post: (0..layers).map(|_| take(t * f)).collect(),
            inner_grad: take(t * f),
            grad: [take(t * h), take(t * h)],
        }
    }
}

/// One replica.
pub struct Replica {
    pub rank: u32,
    /// Replicas in the group.
    ranks: u32,
    pub gpu: u32,
    req: TrainingRequest,
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    comm_stream: Arc<CudaStream>,
    blas: CudaBlas,
    k: Kernels,
    t: Tensors,
    /// The buckets as matrix ranges, and an event per bucket.
    buckets: Vec<std::ops::Range<u32>>,
    ready: Vec<CudaEvent>,
    reduced: CudaEvent,
    pub start: CudaEvent,
    pub end: CudaEvent,
    sum: Ptr,
    pub comm: Option<Comm>,
    /// Freed last (declared last).
    _memory: DeviceBuffer,
}

fn de<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

impl Replica {
    /// Opens the replica on `ctx`: streams, cuBLAS, kernels, memory, events.
    pub fn open(
        (rank, ranks): (u32, u32),
        gpu: u32,
        ctx: Arc<CudaContext>,
        ptx: &str,
        req: &TrainingRequest,
    ) -> Result<Self, String> {
        ctx.bind_to_thread().map_err(de("bind the context"))?;
        let compute = ctx.new_stream().map_err(de("create a stream"))?;
        let comm_stream = ctx.new_stream().map_err(de("create a stream"))?;
        let blas =
            CudaBlas::new(compute.clone()).map_err(|e| format!("create a cuBLAS handle: {e}"))?;
        let k = Kernels::load(&ctx, ptx).map_err(de("load the training kernels"))?;
        let bytes = req.bytes_per_gpu() + 16;
        let memory = DeviceBuffer::alloc_exact(&ctx, gpu, bytes)
            .map_err(|e| format!("{e} for the model (lower layers, hiddenSize or batchSize)"))?;
        let t = Tensors::carve(memory.ptr, req);
        let sum = memory.ptr + req.bytes_per_gpu();
        let buckets = req.buckets();
        let plain = || ctx.new_event(None).map_err(de("create an event"));
        let timing = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(de("create an event"))
        };
        let ready = buckets.iter().map(|_| plain()).collect::<Result<_, _>>()?;
        Ok(Self {
            rank,
            ranks,
            gpu,
            req: req.clone(),
            reduced: plain()?,
            start: timing()?,
            end: timing()?,
            ctx,
            compute,
            comm_stream,
            blas,
            k,
            t,
            buckets,
            ready,
            sum,
            comm: None,
            _memory: memory,
        })
    }

    fn matrix_ptr(&self, base: Ptr, m: u32) -> Ptr {
        base + u64::from(m) * self.req.matrix() * ELEMENT
    }

    /// Sets the weights every replica starts from (the same seeds on every GPU).
    pub fn init_weights(&self) -> Result<(), String> {
        let (h, f) = (self.req.hidden as f32, self.req.inner() as f32);
        for m in 0..self.req.matrices() {
            // Even matrices are down projections (fan-in = inner), odd ones up projections.
            let fan_in = if m % 2 == 0 { f } else { h };
            let scale = (3.0 / fan_in).sqrt();
            let p = self.matrix_ptr(self.t.weights, m);
            self.k
                .fill(
                    &self.compute,
                    p,
                    self.req.matrix(),
                    0x5eed_0000 + u64::from(m),
                    scale,
                )
                .map_err(de("initialise the weights"))?;
        }
        self.compute
            .synchronize()
            .map_err(de("initialise the weights"))
    }

    /// C = op(A)·op(B) in column-major bf16 with fp32 accumulation.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        ta: bool,
        tb: bool,
        m: u64,
        n: u64,
        k: u64,
        a: Ptr,
        lda: u64,
        b: Ptr,
        ldb: u64,
        c: Ptr,
    ) -> Result<(), String> {
        let op = |t: bool| {
            if t {
                blas::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let i = |v: u64| i32::try_from(v).map_err(|_| format!("GEMM dimension {v} is too large"));
        let (alpha, beta) = (1.0f32, 0.0f32);
        let bf = blas::cudaDataType::CUDA_R_16BF;
        // SAFETY: a, b and c are device tensors of this context sized for these dimensions
        // (carved from the replica's allocation); alpha and beta live through the call.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                op(ta),
                op(tb),
                i(m)?,
                i(n)?,
                i(k)?,
                (&alpha as *const f32).cast::<c_void>(),
                a as *const c_void,
                bf,
                i(lda)?,
                b as *const c_void,
                bf,
                i(ldb)?,
                (&beta as *const f32).cast::<c_void>(),
                c as *mut c_void,
                bf,
                i(m)?,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        }
        .map_err(|e| format!("cublasGemmEx: {e}"))
    }

    /// Queues one step on the compute (and communication) stream, between the start and
    /// end events. `data_seed` picks this step's synthetic batch.
    pub fn queue_step(&self, mode: Mode, data_seed: u64) -> Result<(), String> {
        let (t, h, f) = (self.req.tokens(), self.req.hidden, self.req.inner());
        let s = &self.compute;
        self.start.record(s).map_err(de("record an event"))?;
        let x0 = self.t.inputs[0];
        self.k
            .fill(s, x0, t * h, data_seed, 1.0)
            .map_err(de("generate the batch"))?;
        let layers = self.req.layers;
        for l in 0..layers as usize {
            let (w1, w2) = self.block_weights(l);
            self.gemm(
                false,
                false,
                f,
                t,
                h,
                w1,
                f,
                self.t.inputs[l],
                h,
                self.t.pre[l],
            )?;
            self.k
                .gelu(s, self.t.pre[l], self.t.post[l], t * f)
                .map_err(de("activation"))?;
            self.gemm(
                false,
                false,
                h,
                t,
                f,
                w2,
                h,
                self.t.post[l],
                f,
                self.t.inputs[l + 1],
            )?;
        }
        let out = self.t.inputs[layers as usize];
        let scale = 1.0 / t as f32;
        self.k
            .loss_grad(s, out, self.t.grad[0], t * h, scale)
            .map_err(de("loss gradient"))?;
        self.backward(mode)?;
        let lr = match mode {
            Mode::ComputeOnly => 0.0,
            Mode::Overlapped => {
                s.wait(&self.reduced)
                    .map_err(de("wait for the all-reduce"))?;
                crate::checks::training::request::LEARNING_RATE / self.ranks() as f32
            }
        };
        self.k
            .sgd(s, self.t.weights, self.t.grads, self.req.parameters(), lr)
            .map_err(de("SGD update"))?;
        self.end.record(s).map_err(de("record an event"))
    }

    fn ranks(&self) -> u32 {
        self.ranks.max(1)
    }

    /// (up, down) projection weights of block `l`; matrices are numbered in backward order.
    fn block_weights(&self, l: usize) -> (Ptr, Ptr) {
        let down = 2 * (self.req.layers - 1 - l as u32);
        (
            self.matrix_ptr(self.t.weights, down + 1),
            self.matrix_ptr(self.t.weights, down),
        )
    }

    fn backward(&self, mode: Mode) -> Result<(), String> {
        let (t, h, f) = (self.req.tokens(), self.req.hidden, self.req.inner());
        let s = &self.compute;
        let mut cur = 0;
        for l in (0..self.req.layers as usize).rev() {
            let (w1, w2) = self.block_weights(l);
            let down = 2 * (self.req.layers - 1 - l as u32);
            let dy = self.t.grad[cur];
            let g = self.t.inner_grad;
            // dW2 = dY · Zᵀ (hidden × inner).
            self.gemm(
                false,
                true,
                h,
                f,
                t,
                dy,
                h,
                self.t.post[l],
                f,
                self.matrix_ptr(self.t.grads, down),
            )?;
            self.gradient_done(mode, down)?;
            // dZ = W2ᵀ · dY, then through the activation.
            self.gemm(true, false, f, t, h, w2, h, dy, h, g)?;
            self.k
                .gelu_back(s, self.t.pre[l], g, t * f)
                .map_err(de("activation gradient"))?;
            // dW1 = dA · Xᵀ (inner × hidden).
            self.gemm(
                false,
                true,
                f,
                h,
                t,
                g,
                f,
                self.t.inputs[l],
                h,
                self.matrix_ptr(self.t.grads, down + 1),
            )?;
            self.gradient_done(mode, down + 1)?;
            if l > 0 {
                // dX = W1ᵀ · dA, the previous block's output gradient.
                self.gemm(true, false, h, t, f, w1, f, g, f, self.t.grad[1 - cur])?;
                cur = 1 - cur;
            }
        }
        Ok(())
    }

    /// After matrix `m`'s gradient is queued: when it completes a bucket, the communication
    /// stream waits for it and all-reduces the bucket in place.
    fn gradient_done(&self, mode: Mode, m: u32) -> Result<(), String> {
        if mode != Mode::Overlapped {
            return Ok(());
        }
        let Some(b) = self.buckets.iter().position(|r| r.end == m + 1) else {
            return Ok(());
        };
        let Some(comm) = &self.comm else {
            return Err("no communicator".into());
        };
        let range = &self.buckets[b];
        self.ready[b]
            .record(&self.compute)
            .map_err(de("record an event"))?;
        self.comm_stream
            .wait(&self.ready[b])
            .map_err(de("order the all-reduce"))?;
        let ptr = self.matrix_ptr(self.t.grads, range.start);
        let bytes = u64::from(range.end - range.start) * self.req.matrix() * ELEMENT;
        let layout = Layout::new(
            Collective::AllReduce,
            bytes,
            ELEMENT,
            u64::from(self.ranks()),
        );
        comm.launch(
            &layout,
            true,
            NcclDtype::Bf16,
            Buffers {
                send: ptr,
                recv: ptr,
            },
            &self.comm_stream,
        )
        .map_err(|e| e.to_string())?;
        if b + 1 == self.buckets.len() {
            self.reduced
                .record(&self.comm_stream)
                .map_err(de("record an event"))?;
        }
        Ok(())
    }

    /// The step's device time, once its end event has completed.
    pub fn step_seconds(&self) -> Result<f64, String> {
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(de("read the step's events"))?;
        Ok(f64::from(ms) / 1e3)
    }

    /// The checksum of this replica's weights (after the queued work).
    pub fn checksum(&self) -> Result<u64, String> {
        let s = &self.compute;
        // SAFETY: the 8-byte counter lies inside the replica's allocation.
        unsafe { result::memset_d8_async(self.sum, 0, 8, s.cu_stream()) }
            .map_err(de("clear the checksum"))?;
        self.k
            .checksum(s, self.t.weights, self.req.parameters(), self.sum)
            .map_err(de("checksum the weights"))?;
        s.synchronize().map_err(de("checksum the weights"))?;
        let mut out = [0u64; 1];
        self.ctx.bind_to_thread().map_err(de("bind the context"))?;
        // SAFETY: copies the 8-byte counter into `out`; the stream that wrote it is idle.
        unsafe { result::memcpy_dtoh_sync(&mut out, self.sum) }.map_err(de("read the checksum"))?;
        Ok(out[0])
    }

    /// The test-only planted corruption: one weight bit flipped, in the middle of the first
    /// matrix.
    pub fn perturb(&self) -> Result<(), String> {
        self.k
            .perturb(&self.compute, self.t.weights, self.req.matrix() / 2)
            .map_err(de("plant the corruption"))?;
        self.compute
            .synchronize()
            .map_err(de("plant the corruption"))
    }
}
