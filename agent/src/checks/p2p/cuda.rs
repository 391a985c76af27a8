//! Peer-to-peer check: every ordered GPU pair, after a warm-up, in shuffled order.
//!
//! Method (after nvbandwidth and the CUDA samples, see `shared/research/cudarc-nvml.md` §6):
//! - Buffers come from plain `cuMemAlloc`: peer access to stream-ordered pool memory is not
//!   granted by `cuCtxEnablePeerAccess` and silently falls back to a slow path.
//! - Copies are `cuMemcpyPeerAsync` on non-blocking streams (never the legacy NULL stream,
//!   which serialises the two directions of a bidirectional test), queued behind a start gate
//!   and timed with device events.
//! - Unidirectional: issued on the source GPU (a copy-engine write). Bidirectional: one stream
//!   per direction, started by the same event, the sum of both directions.
//! - Every copied buffer is verified on the receiving GPU against the sender's
//!   address-dependent pattern, so a link that corrupts data fails rather than only runs slow.
//! - Latency, two ways: a 4-byte copy averaged over back-to-back copies (copy-engine operation
//!   latency), and a one-thread pointer chase by the receiving GPU through the sender's memory
//!   (load-to-use latency over the link).
//! - Host-staged (when asked): the same copies before peer access is enabled, which the
//!   driver stages through host memory.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig, result, sys};

use super::{P2pOutcome, P2pRequest, PairOutcome, measuring_order};
use crate::backend::BackendError;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::buffer::{DeviceBuffer, grid_for};
use crate::backend::cuda::kernels::Kernels;
use crate::backend::cuda::launch::LaunchError;
use crate::backend::cuda::tally::Tally;
use crate::backend::cuda::timing::{self, Gate, rate};
use crate::judge::median;
use crate::run_control::RunControl;

/// Size of each GPU's pointer-chase chain, and the distance between its slots (one cache line
/// and then some, so consecutive loads never share a line).
const CHAIN_BYTES: u64 = 2 << 20;
const CHAIN_STRIDE: u64 = 128;
/// Copies in the warm-up of each pair and direction.
const WARMUP_COPIES: u32 = 2;
/// Host-staged copies are an order of magnitude slower; fewer keep the check short.
const STAGED_MAX_ITERATIONS: u32 = 4;

/// One GPU's side of the check.
struct Peer {
    gpu: u32,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    k: Kernels,
    send: DeviceBuffer,
    recv: DeviceBuffer,
    chain: DeviceBuffer,
    seed: u32,
}

/// Everything a GPU needs, opened by the backend (which owns the NVML index → ordinal map and
/// the compiled kernels).
struct PeerSetup {
    pub gpu: u32,
    pub ctx: Arc<CudaContext>,
    pub kernels: Kernels,
}

/// Opens every GPU, then measures every ordered pair: host-staged first when asked, then with
/// peer access where both sides allow it.
fn run(
    setups: Vec<PeerSetup>,
    req: &P2pRequest,
    ctl: &RunControl<'_>,
) -> Result<P2pOutcome, BackendError> {
    let started = Instant::now();
    let bytes = req.buffer_bytes.max(16) / 16 * 16;
    let mut peers = Vec::with_capacity(setups.len());
    for s in setups {
        peers.push(Peer::open(s, bytes)?);
    }
    let Some(first) = peers.first() else {
        return Ok(P2pOutcome::default());
    };
    let gate = Gate::new(&first.ctx, first.gpu)?;

    let (order, mut pairs) = plan(&peers, req.seed);
    let mut progress = Progress {
        ctl,
        done: 0.0,
        steps: order.len() as f64 * if req.host_staged { 2.0 } else { 1.0 },
    };
    if req.host_staged {
        measure_staged(&peers, &order, &mut pairs, req, &mut progress)?;
    }
    connect(&peers, &order, &mut pairs)?;
    measure_peered(&peers, &order, &mut pairs, &gate, req, &mut progress)?;

    Ok(P2pOutcome {
        pairs,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Steps of the run done so far, out of all of them.
struct Progress<'a, 'b> {
    ctl: &'a RunControl<'b>,
    done: f64,
    steps: f64,
}

impl Progress<'_, '_> {
    /// Counts one more step done and reports it with `note`.
    fn step(&mut self, note: &str) {
        self.done += 1.0;
        self.ctl.progress(self.done / self.steps, note);
    }
}

/// Every ordered pair of peers (as indices) in shuffled order, and an empty outcome for each.
fn plan(peers: &[Peer], seed: u64) -> (Vec<(usize, usize)>, Vec<PairOutcome>) {
    let order = measuring_order(peers.len(), seed);
    let pairs: Vec<PairOutcome> = order
        .iter()
        .map(|&(a, b)| PairOutcome {
            src: peers[a].gpu,
            dst: peers[b].gpu,
            ..Default::default()
        })
        .collect();
    (order, pairs)
}

/// The host-staged pass: peer access off everywhere, then each pair's copies (fewer of them)
/// and checks; a pair's failure is noted on it.
fn measure_staged(
    peers: &[Peer],
    order: &[(usize, usize)],
    pairs: &mut [PairOutcome],
    req: &P2pRequest,
    progress: &mut Progress<'_, '_>,
) -> Result<(), BackendError> {
    for (a, b) in all_pairs(peers.len()) {
        set_peer_access(&peers[a], &peers[b], false)?;
    }
    let staged = P2pRequest {
        iterations: req.iterations.min(STAGED_MAX_ITERATIONS),
        ..req.clone()
    };
    for (pair, &(a, b)) in pairs.iter_mut().zip(order) {
        if progress.ctl.stopped() {
            return Err(BackendError::Stopped);
        }
        let (src, dst) = (&peers[a], &peers[b]);
        let measured = uni(src, dst, None, &staged)
            .and_then(|u| Ok((u, bidi(src, dst, None, &staged)?)))
            .and_then(|r| Ok((r, verify_pair(src, dst)?)));
        match measured {
            Ok(((u, bi), bad)) => {
                pair.staged_unidirectional_gbps = Some(u);
                pair.staged_bidirectional_gbps = Some(bi);
                pair.mismatches += bad;
            }
            Err(e) => pair.error = Some(format!("host-staged: {e}")),
        }
        progress.step(&format!("staged GPU{}->GPU{}", src.gpu, dst.gpu));
    }
    Ok(())
}

/// Turns peer access on for every pair that can reach each other both ways, notes it on each
/// ordered pair, and warms every pair up.
fn connect(
    peers: &[Peer],
    order: &[(usize, usize)],
    pairs: &mut [PairOutcome],
) -> Result<(), BackendError> {
    // Peer access is turned on for a pair only when each side can reach the other, since
    // it is enabled in both directions.
    let mut reachable = vec![vec![false; peers.len()]; peers.len()];
    for (a, b) in all_pairs(peers.len()) {
        let both = can_access(&peers[a], &peers[b])? && can_access(&peers[b], &peers[a])?;
        if both {
            set_peer_access(&peers[a], &peers[b], true)?;
        }
        reachable[a][b] = both;
        reachable[b][a] = both;
    }
    for (pair, &(a, b)) in pairs.iter_mut().zip(order) {
        pair.peer_access = reachable[a][b];
        warm_up(&peers[a], &peers[b])?;
    }
    Ok(())
}

/// The main pass: every pair measured in turn; a pair's failure is added to its notes.
fn measure_peered(
    peers: &[Peer],
    order: &[(usize, usize)],
    pairs: &mut [PairOutcome],
    gate: &Gate,
    req: &P2pRequest,
    progress: &mut Progress<'_, '_>,
) -> Result<(), BackendError> {
    for (pair, &(a, b)) in pairs.iter_mut().zip(order) {
        if progress.ctl.stopped() {
            return Err(BackendError::Stopped);
        }
        let (src, dst) = (&peers[a], &peers[b]);
        if let Err(e) = measure_pair(src, dst, gate, req, pair) {
            let note = pair
                .error
                .take()
                .map(|n| format!("{n}; "))
                .unwrap_or_default();
            pair.error = Some(format!("{note}{e}"));
        }
        progress.step(&format!(
            "GPU{}->GPU{} {:.0} GB/s",
            src.gpu, dst.gpu, pair.unidirectional_gbps
        ));
    }
    Ok(())
}

fn measure_pair(
    src: &Peer,
    dst: &Peer,
    gate: &Gate,
    req: &P2pRequest,
    pair: &mut PairOutcome,
) -> Result<(), BackendError> {
    let gate = pair.peer_access.then_some(gate);
    pair.unidirectional_gbps = uni(src, dst, gate, req)?;
    pair.mismatches += verify(dst, src.seed)?;
    pair.bidirectional_gbps = bidi(src, dst, gate, req)?;
    pair.mismatches += verify_pair(src, dst)?;
    pair.copy_latency_us = copy_latency(src, dst, gate, req.latency_copies.max(1))?;
    if pair.peer_access {
        pair.load_latency_ns = Some(chase(src, dst, req.chase_steps.max(1))?);
    }
    Ok(())
}

impl Peer {
    fn open(s: PeerSetup, bytes: u64) -> Result<Self, BackendError> {
        let gpu = s.gpu;
        let err = |what: &'static str| move |e| BackendError::gpu(gpu, what, e);
        let stream = s.ctx.new_stream().map_err(err("create a stream"))?;
        let send = DeviceBuffer::alloc_exact(&s.ctx, gpu, bytes)?;
        let recv = DeviceBuffer::alloc_exact(&s.ctx, gpu, bytes)?;
        let chain = DeviceBuffer::alloc_exact(&s.ctx, gpu, CHAIN_BYTES)?;
        let peer = Self {
            gpu,
            seed: 0x5eed_0000 ^ gpu.wrapping_mul(0x9e37_79b9),
            ctx: s.ctx,
            stream,
            k: s.kernels,
            send,
            recv,
            chain,
        };
        peer.fill_send()
            .map_err(|e| BackendError::gpu(gpu, "fill the send buffer", e))?;
        peer.init_chain()
            .map_err(|e| BackendError::gpu(gpu, "build the pointer-chase chain", e))?;
        peer.stream.synchronize().map_err(err("synchronize"))?;
        Ok(peer)
    }

    fn cfg(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (grid_for(&self.ctx, 4), 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn fill_send(&self) -> Result<(), LaunchError> {
        let nvec = self.send.bytes / 16;
        let inv = 0u32;
        let mut b = self.k.fill.on(&self.stream);
        b.arg(&self.send.ptr).arg(&nvec).arg(&self.seed).arg(&inv);
        // SAFETY: gv_fill writes nvec 16-byte vectors inside the send buffer.
        unsafe { b.launch(self.cfg()) }.map(|_| ())
    }

    fn init_chain(&self) -> Result<(), LaunchError> {
        let nodes = CHAIN_BYTES / CHAIN_STRIDE;
        // An odd jump of about a third of the chain: consecutive loads land far apart.
        let step = (nodes / 3) | 1;
        let mut b = self.k.chain_init.on(&self.stream);
        b.arg(&self.chain.ptr)
            .arg(&nodes)
            .arg(&CHAIN_STRIDE)
            .arg(&step);
        // SAFETY: writes one u64 at each of `nodes` slots inside the chain buffer.
        unsafe { b.launch(self.cfg()) }.map(|_| ())
    }
}

/// Every unordered pair as `(a, b)` with a < b.
fn all_pairs(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).flat_map(move |a| (a + 1..n).map(move |b| (a, b)))
}

fn can_access(a: &Peer, b: &Peer) -> Result<bool, BackendError> {
    let mut yes = 0;
    // SAFETY: plain query of two valid devices.
    unsafe { sys::cuDeviceCanAccessPeer(&mut yes, a.ctx.cu_device(), b.ctx.cu_device()) }
        .result()
        .map_err(|e| {
            BackendError::gpu(a.gpu, format!("ask whether GPU{} is reachable", b.gpu), e)
        })?;
    Ok(yes == 1)
}

/// Turns peer access on or off in both directions; "already so" is fine.
fn set_peer_access(a: &Peer, b: &Peer, on: bool) -> Result<(), BackendError> {
    for (from, to) in [(a, b), (b, a)] {
        from.ctx
            .bind_to_thread()
            .map_err(|e| BackendError::gpu(from.gpu, "bind context", e))?;
        // SAFETY: both contexts are alive; the calls only change the mapping state.
        let r = unsafe {
            if on {
                sys::cuCtxEnablePeerAccess(to.ctx.cu_ctx(), 0)
            } else {
                sys::cuCtxDisablePeerAccess(to.ctx.cu_ctx())
            }
        };
        match r {
            sys::CUresult::CUDA_SUCCESS
            | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            | sys::CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => {}
            other => {
                let what = if on { "enable" } else { "disable" };
                return Err(BackendError::gpu(
                    from.gpu,
                    format!("{what} peer access to GPU{}", to.gpu),
                    other
                        .result()
                        .err()
                        .map_or_else(String::new, |e| e.to_string()),
                ));
            }
        }
    }
    Ok(())
}

/// Queues `count` copies of `bytes` from `src`'s send buffer to `dst`'s receive buffer on
/// `stream`.
fn queue_copies(
    src: &Peer,
    dst: &Peer,
    stream: &CudaStream,
    bytes: u64,
    count: u32,
) -> Result<(), BackendError> {
    // The stream's own context must be current when work is queued on it.
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| BackendError::gpu(src.gpu, "bind context", e))?;
    for _ in 0..count {
        // SAFETY: both buffers hold at least `bytes` and outlive the stream's work (every
        // caller synchronizes before returning).
        unsafe {
            result::memcpy_peer_async(
                dst.ctx.cu_ctx(),
                dst.recv.ptr,
                src.ctx.cu_ctx(),
                src.send.ptr,
                bytes as usize,
                stream.cu_stream(),
            )
        }
        .map_err(|e| BackendError::gpu(src.gpu, format!("copy to GPU{}", dst.gpu), e))?;
    }
    Ok(())
}

fn warm_up(a: &Peer, b: &Peer) -> Result<(), BackendError> {
    queue_copies(a, b, &a.stream, a.send.bytes, WARMUP_COPIES)?;
    queue_copies(b, a, &b.stream, b.send.bytes, WARMUP_COPIES)?;
    sync(a)?;
    sync(b)
}

fn sync(p: &Peer) -> Result<(), BackendError> {
    p.stream
        .synchronize()
        .map_err(|e| BackendError::gpu(p.gpu, "synchronize", e))
}

/// Device time of work queued by `enqueue` on `src`'s stream (see [`timing::timed`]).
fn gated(
    src: &Peer,
    gate: Option<&Gate>,
    enqueue: impl FnOnce() -> Result<(), BackendError>,
) -> Result<f64, BackendError> {
    timing::timed(&src.ctx, &src.stream, &src.k, src.gpu, gate, enqueue)
}

/// `src → dst` GB/s: the median of the samples.
fn uni(src: &Peer, dst: &Peer, gate: Option<&Gate>, req: &P2pRequest) -> Result<f64, BackendError> {
    let bytes = src.send.bytes;
    let iterations = req.iterations.max(1);
    let mut rates = Vec::new();
    for _ in 0..req.samples.max(1) {
        let secs = gated(src, gate, || {
            queue_copies(src, dst, &src.stream, bytes, iterations)
        })?;
        rates.push(rate(bytes * u64::from(iterations), secs));
    }
    Ok(median(rates).unwrap_or(0.0))
}

/// `src ⇄ dst` at once, GB/s of both directions together: the median of the samples. The
/// destination's stream starts on an event recorded after the gate, and the source's end waits
/// for the destination's, so the time spans both directions.
fn bidi(
    src: &Peer,
    dst: &Peer,
    gate: Option<&Gate>,
    req: &P2pRequest,
) -> Result<f64, BackendError> {
    let bytes = src.send.bytes;
    let iterations = req.iterations.max(1);
    let mut rates = Vec::new();
    for _ in 0..req.samples.max(1) {
        let secs = gated(src, gate, || {
            after(dst, src)?;
            queue_copies(src, dst, &src.stream, bytes, iterations)?;
            queue_copies(dst, src, &dst.stream, bytes, iterations)?;
            after(src, dst)
        })?;
        sync(dst)?;
        rates.push(rate(2 * bytes * u64::from(iterations), secs));
    }
    Ok(median(rates).unwrap_or(0.0))
}

/// Makes `waiter`'s stream wait for what `first`'s stream has queued so far.
fn after(waiter: &Peer, first: &Peer) -> Result<(), BackendError> {
    let done = first
        .stream
        .record_event(None)
        .map_err(|e| BackendError::gpu(first.gpu, "record an event", e))?;
    waiter
        .stream
        .wait(&done)
        .map_err(|e| BackendError::gpu(waiter.gpu, "wait on an event", e))
}

/// Microseconds per 4-byte copy, back to back.
fn copy_latency(
    src: &Peer,
    dst: &Peer,
    gate: Option<&Gate>,
    copies: u32,
) -> Result<f64, BackendError> {
    let secs = gated(src, gate, || queue_copies(src, dst, &src.stream, 4, copies))?;
    Ok(secs * 1e6 / f64::from(copies))
}

/// Nanoseconds per dependent load by `dst` through `src`'s chain (warmed once first).
fn chase(src: &Peer, dst: &Peer, steps: u32) -> Result<f64, BackendError> {
    let err = |what: &'static str| move |e| BackendError::gpu(dst.gpu, what, e);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut out = [0u64; 2];
    let mut chase_out: CudaSlice<u64> = dst
        .stream
        .alloc_zeros(2)
        .map_err(err("allocate the chase output"))?;
    for n in [u64::from(steps.min(1000)), u64::from(steps)] {
        let mut b = dst.k.chase.on(&dst.stream);
        b.arg(&src.chain.ptr).arg(&n).arg(&mut chase_out);
        // SAFETY: gv_chase follows pointers that gv_chain_init wrote inside src's chain buffer
        // (peer access is on) and writes two u64 into chase_out.
        unsafe { b.launch(cfg) }
            .map_err(|e| BackendError::gpu(dst.gpu, "launch the pointer chase", e))?;
        out.copy_from_slice(
            &dst.stream
                .clone_dtoh(&chase_out)
                .map_err(err("read the pointer chase"))?,
        );
    }
    Ok(out[1] as f64 / f64::from(steps.max(1)))
}

/// Verifies `dst`'s receive buffer against the pattern of the GPU that sent it.
fn verify(dst: &Peer, sender_seed: u32) -> Result<u64, BackendError> {
    let err = |what: &'static str| move |e| BackendError::gpu(dst.gpu, what, e);
    let mut tally = Tally::new(&dst.stream, 1).map_err(err("allocate the counters"))?;
    let nvec = dst.recv.bytes / 16;
    let inv = 0u32;
    let mut b = dst.k.verify.on(&dst.stream);
    b.arg(&dst.recv.ptr).arg(&nvec).arg(&sender_seed).arg(&inv);
    tally.push(&mut b);
    // SAFETY: reads nvec vectors of the receive buffer; writes only the tally, which
    // `Tally::new` sized for gv_verify.
    unsafe { b.launch(dst.cfg()) }
        .map_err(|e| BackendError::gpu(dst.gpu, "verify received data", e))?;
    let c = dst
        .stream
        .clone_dtoh(&tally.counters)
        .map_err(err("read counters"))?;
    Ok(c.first().copied().unwrap_or(0))
}

/// After a bidirectional test each side holds the other's pattern.
fn verify_pair(src: &Peer, dst: &Peer) -> Result<u64, BackendError> {
    Ok(verify(dst, src.seed)? + verify(src, dst.seed)?)
}

impl CudaBackend {
    /// Every ordered pair of `gpus`.
    pub(crate) fn p2p(
        &self,
        gpus: &[u32],
        req: &P2pRequest,
        ctl: &RunControl<'_>,
    ) -> Result<P2pOutcome, BackendError> {
        let mut setups = Vec::with_capacity(gpus.len());
        for &gpu in gpus {
            setups.push(self.on_gpu(gpu, |ctx, kernels| {
                Ok(PeerSetup {
                    gpu,
                    ctx: ctx.clone(),
                    kernels: kernels.clone(),
                })
            })?);
        }
        run(setups, req, ctl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unordered_pair_once() {
        let p: Vec<_> = all_pairs(4).collect();
        assert_eq!(p, [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]);
    }
}
