//! Memory check on one GPU: one large `cuMemAlloc` of a fraction of free memory, tested with
//! each pattern the request names, every word verified on the GPU:
//! - address: a pattern that depends on each word's address, filled and verified, then the
//!   same with the bitwise inverse (so every bit is tested as 0 and as 1);
//! - moving inversions (memtest): for zeros, 0x55, the eight walking-one bytes and a random
//!   word, fill the pattern, then read each word and write its inverse going up, then read the
//!   inverse and write the pattern going down;
//! - random: a random number sequence from a new seed, verified, then its inverse.
//!
//! Every kernel is device-timed; the verify kernels count the bits that flipped.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, LaunchConfig};
use gpuval_crds::{MemoryPattern, Mismatch};

use super::bits::BitTally;
use super::{MemoryOutcome, MemoryRequest, PatternOutcome};
use crate::backend::BackendError;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::buffer::{DeviceBuffer, grid_for, timed};
use crate::backend::cuda::kernels::Kernels;
use crate::backend::cuda::launch::Kernel;
use crate::backend::cuda::tally::Tally;
use crate::run_control::RunControl;

const BLOCK: u32 = 512;

/// The kernels over one buffer, with the counters they report into, shared by the check and
/// its self-test.
struct Tester<'a> {
    ctx: &'a Arc<CudaContext>,
    stream: Arc<CudaStream>,
    k: &'a Kernels,
    gpu: u32,
    cfg: LaunchConfig,
    ptr: u64,
    nvec: u64,
    tally: Tally,
}

/// One checked kernel's device time and the wrong words it found.
struct Checked {
    seconds: f64,
    mismatches: u64,
}

impl<'a> Tester<'a> {
    fn new(
        ctx: &'a Arc<CudaContext>,
        gpu: u32,
        k: &'a Kernels,
        buf: &DeviceBuffer,
        max_log: usize,
    ) -> Result<Self, BackendError> {
        let err = |what: &'static str| move |e| BackendError::gpu(gpu, what, e);
        let stream = ctx.new_stream().map_err(err("create a stream"))?;
        let tally = Tally::new(&stream, max_log).map_err(err("allocate the counters"))?;
        Ok(Self {
            ctx,
            stream,
            k,
            gpu,
            cfg: LaunchConfig {
                grid_dim: (grid_for(ctx, 8), 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            ptr: buf.ptr,
            nvec: buf.bytes / 16,
            tally,
        })
    }

    fn err<E: std::fmt::Display>(&self, what: &'static str) -> impl Fn(E) -> BackendError + use<E> {
        let gpu = self.gpu;
        move |e| BackendError::gpu(gpu, what, e)
    }

    /// Runs one writing kernel (`args` after the buffer and its length) and times it.
    fn write(&self, f: &Kernel, args: &[u32]) -> Result<f64, BackendError> {
        timed(self.ctx, &self.stream, || {
            let mut b = f.on(&self.stream);
            b.arg(&self.ptr).arg(&self.nvec);
            for a in args {
                b.arg(a);
            }
            // SAFETY: every writing kernel (gv_fill, gv_fill_const, gv_random_fill) takes the
            // buffer, its length in 16-byte vectors and u32 arguments, and writes only those
            // nvec vectors.
            unsafe { b.launch(self.cfg) }.map(|_| ())
        })
        .map_err(self.err("fill"))
    }

    /// Runs one checking kernel (`args` after the buffer and its length, before the counters)
    /// with fresh counters, times it, and reads what it found.
    fn check(
        &mut self,
        f: &Kernel,
        args: &[u32],
        out: &mut MemoryOutcome,
        max_logged: usize,
    ) -> Result<Checked, BackendError> {
        self.tally
            .reset(&self.stream)
            .map_err(self.err("reset counters"))?;
        let (stream, cfg, ptr, nvec) = (&self.stream, self.cfg, self.ptr, self.nvec);
        let tally = &mut self.tally;
        let seconds = timed(self.ctx, stream, || {
            let mut b = f.on(stream);
            b.arg(&ptr).arg(&nvec);
            for a in args {
                b.arg(a);
            }
            tally.push(&mut b);
            // SAFETY: every checking kernel (gv_verify, gv_invert, gv_random_verify) takes the
            // buffer, its length in vectors, u32 arguments, then the tally (counters[2],
            // log[2 * max_log], max_log, bits[64]) as `Tally::new` sized it; it reads (and
            // gv_invert writes) only the nvec vectors.
            unsafe { b.launch(cfg) }.map(|_| ())
        })
        .map_err(self.err("verify"))?;
        let mismatches = self.collect(out, max_logged)?;
        Ok(Checked {
            seconds,
            mismatches,
        })
    }

    /// Reads the counters and adds the first logged mismatches to `out`; returns the wrong words.
    fn collect(&self, out: &mut MemoryOutcome, max_logged: usize) -> Result<u64, BackendError> {
        let c = self
            .stream
            .clone_dtoh(&self.tally.counters)
            .map_err(self.err("read counters"))?;
        if c[0] == 0 {
            return Ok(0);
        }
        let l = self
            .stream
            .clone_dtoh(&self.tally.log)
            .map_err(self.err("read the mismatch log"))?;
        let logged = (c[1] as usize).min(self.tally.max_log as usize);
        for e in l.chunks_exact(2).take(logged) {
            if out.first_mismatches.len() >= max_logged {
                break;
            }
            out.first_mismatches.push(Mismatch {
                offset: i64::try_from(e[0] * 4).unwrap_or(i64::MAX),
                expected: format!("{:#010x}", e[1] >> 32),
                actual: format!("{:#010x}", e[1] & 0xffff_ffff),
            });
        }
        Ok(c[0])
    }

    fn bit_tally(&self) -> Result<BitTally, BackendError> {
        let b = self
            .stream
            .clone_dtoh(&self.tally.bits)
            .map_err(self.err("read the bit counters"))?;
        Ok(BitTally::from_device(&b))
    }

    fn bytes(&self) -> u64 {
        self.nvec * 16
    }

    /// One address pass: the pattern, then its inverse, each filled and verified.
    fn address(
        &mut self,
        seed: u32,
        out: &mut MemoryOutcome,
        max_logged: usize,
    ) -> Result<PatternOutcome, BackendError> {
        let mut p = PatternOutcome::new(MemoryPattern::Address);
        for inv in [0u32, u32::MAX] {
            let fill = self.write(&self.k.fill, &[seed, inv])?;
            let k = self.k;
            let v = self.check(&k.verify, &[seed, inv], out, max_logged)?;
            out.fill_seconds += fill;
            out.verify_seconds += v.seconds;
            out.bytes_written += self.bytes();
            out.bytes_read += self.bytes();
            p.add(fill + v.seconds, 2 * self.bytes(), v.mismatches);
        }
        Ok(p)
    }

    /// One moving-inversions pass over every pattern word of [`inversion_words`].
    fn moving_inversions(
        &mut self,
        random: u32,
        out: &mut MemoryOutcome,
        max_logged: usize,
        ctl: &RunControl<'_>,
    ) -> Result<PatternOutcome, BackendError> {
        let mut p = PatternOutcome::new(MemoryPattern::MovingInversions);
        let k = self.k;
        for word in inversion_words(random) {
            if ctl.stopped() {
                return Err(BackendError::Stopped);
            }
            let fill = self.write(&k.fill_const, &[word])?;
            p.add(fill, self.bytes(), 0);
            for (want, next, down) in [(word, !word, 0u32), (!word, word, 1u32)] {
                let c = self.check(&k.invert, &[want, next, down], out, max_logged)?;
                p.add(c.seconds, 2 * self.bytes(), c.mismatches);
            }
        }
        Ok(p)
    }

    /// One random pass: the sequence from `seed` filled and verified, then its inverse.
    fn random(
        &mut self,
        seed: u32,
        out: &mut MemoryOutcome,
        max_logged: usize,
    ) -> Result<PatternOutcome, BackendError> {
        let mut p = PatternOutcome::new(MemoryPattern::Random);
        let k = self.k;
        for inv in [0u32, u32::MAX] {
            let fill = self.write(&k.random_fill, &[seed, inv])?;
            let v = self.check(&k.random_verify, &[seed, inv], out, max_logged)?;
            p.add(fill + v.seconds, 2 * self.bytes(), v.mismatches);
        }
        Ok(p)
    }
}

impl PatternOutcome {
    fn new(pattern: MemoryPattern) -> Self {
        Self {
            pattern,
            passes: 0,
            bytes: 0,
            seconds: 0.0,
            mismatches: 0,
        }
    }

    fn add(&mut self, seconds: f64, bytes: u64, mismatches: u64) {
        self.seconds += seconds;
        self.bytes += bytes;
        self.mismatches += mismatches;
    }

    /// Adds one pass of the same pattern.
    fn merge(&mut self, pass: PatternOutcome) {
        self.passes += 1;
        self.add(pass.seconds, pass.bytes, pass.mismatches);
    }
}

/// The words moving inversions runs with: all zeros (its inverse all ones), 0x55 in every byte
/// (and 0xAA), each of the eight walking-one bytes (and walking zeros), and one random word.
pub fn inversion_words(random: u32) -> Vec<u32> {
    let mut words = vec![0x0000_0000, 0x5555_5555];
    words.extend((0..8).map(|b| 0x0101_0101u32 << b));
    words.push(random);
    words
}

/// A seed for a random pass: different every run (from the clock and the pass), reported in
/// nothing, so that two runs test different data.
fn fresh_seed(gpu: u32, pass: u32) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() ^ (d.as_secs() as u32));
    nanos ^ gpu.wrapping_mul(0x85eb_ca6b) ^ pass.wrapping_mul(0x9e37_79b9)
}

/// The check: a buffer of `req.fraction` of free memory, each pattern `req.passes` times.
pub(super) fn run(
    ctx: &Arc<CudaContext>,
    gpu: u32,
    k: &Kernels,
    req: &MemoryRequest,
    ctl: &RunControl<'_>,
) -> Result<MemoryOutcome, BackendError> {
    let (free, total) = ctx
        .mem_get_info()
        .map_err(|e| BackendError::gpu(gpu, "read free memory", e))?;
    let want = (free as f64 * req.fraction.clamp(0.0, 1.0)) as u64;
    let buf = DeviceBuffer::alloc_up_to(ctx, gpu, want)?;
    let mut out = MemoryOutcome {
        total_bytes: total as u64,
        free_bytes_before: free as u64,
        bytes_tested: buf.bytes,
        passes: req.passes,
        ..Default::default()
    };
    let mut t = Tester::new(ctx, gpu, k, &buf, req.max_logged)?;
    let steps = (req.patterns.len() as u32 * req.passes.max(1)) as f64;
    let mut step = 0.0;
    for &pattern in &req.patterns {
        let mut total = PatternOutcome::new(pattern);
        for pass in 0..req.passes.max(1) {
            if ctl.stopped() {
                return Err(BackendError::Stopped);
            }
            let seed: u32 = 0x6a09_e667 ^ pass.wrapping_mul(0x9e37_79b9);
            let one = match pattern {
                MemoryPattern::Address => t.address(seed, &mut out, req.max_logged)?,
                MemoryPattern::MovingInversions => {
                    t.moving_inversions(fresh_seed(gpu, pass), &mut out, req.max_logged, ctl)?
                }
                MemoryPattern::Random => {
                    t.random(fresh_seed(gpu, pass), &mut out, req.max_logged)?
                }
            };
            out.mismatches += one.mismatches;
            total.merge(one);
            step += 1.0;
            report(ctl, step / steps, pattern, buf.bytes, &out);
        }
        out.patterns.push(total);
    }
    out.bits = t.bit_tally()?;
    Ok(out)
}

/// Reports progress: the pattern, the size under test and the mismatches found so far.
fn report(
    ctl: &RunControl<'_>,
    done: f64,
    pattern: MemoryPattern,
    bytes: u64,
    out: &MemoryOutcome,
) {
    ctl.progress(
        done,
        &format!(
            "{pattern} {:.1} GiB, {} mismatches",
            bytes as f64 / (1u64 << 30) as f64,
            out.mismatches
        ),
    );
}

/// Self-test of the detection path: fill, flip one bit in `count` known words, verify. Returns
/// how many mismatches the verify kernel found (must equal `count`) and the flipped bits it
/// counted (one per word).
fn selftest_on(
    ctx: &Arc<CudaContext>,
    gpu: u32,
    k: &Kernels,
    bytes: u64,
    count: u32,
) -> Result<(u64, BitTally), BackendError> {
    let buf = DeviceBuffer::alloc_up_to(ctx, gpu, bytes)?;
    let mut t = Tester::new(ctx, gpu, k, &buf, 1)?;
    let (seed, inv) = (7u32, 0u32);
    t.write(&k.fill, &[seed, inv])?;
    let nwords = buf.bytes / 4;
    let mut b = k.corrupt.on(&t.stream);
    b.arg(&buf.ptr).arg(&nwords).arg(&count);
    // SAFETY: gv_corrupt touches words < nwords only.
    unsafe { b.launch(LaunchConfig::for_num_elems(count.max(1))) }
        .map_err(|e| BackendError::gpu(gpu, "corrupt", e))?;
    let mut scratch = MemoryOutcome::default();
    let found = t.check(&k.verify, &[seed, inv], &mut scratch, 1)?;
    Ok((found.mismatches, t.bit_tally()?))
}

/// The memory check's self-test on one GPU: `count` bit flips planted in `bytes` of memory;
/// returns how many wrong words the verify kernel found (all of them, on a healthy GPU) and
/// how many flipped bits it counted (the same number).
pub fn selftest(
    b: &CudaBackend,
    gpu: u32,
    bytes: u64,
    count: u32,
) -> Result<(u64, u64), BackendError> {
    let (words, bits) = b.on_gpu(gpu, |ctx, k| selftest_on(ctx, gpu, k, bytes, count))?;
    let flipped = bits.to_one.iter().chain(&bits.to_zero).sum();
    Ok((words, flipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inversion_words_cover_zeros_alternating_and_walking_ones() {
        let w = inversion_words(0xdead_beef);
        assert_eq!(w.len(), 11);
        assert_eq!(&w[..3], &[0, 0x5555_5555, 0x0101_0101]);
        assert_eq!(w[9], 0x8080_8080);
        assert_eq!(w[10], 0xdead_beef);
        // every bit position is 1 in some walking-one word
        let ones = w[2..10].iter().fold(0u32, |a, b| a | b);
        assert_eq!(ones, u32::MAX);
    }
}
