//! What one run of the training check does: the model's shapes and the step's plan (gradient
//! buckets, checksum steps, FLOPs), from the spec.

use std::ops::Range;
use std::time::Duration;

use gpuval_crds::TrainingCheck;
use serde::{Deserialize, Serialize};

use crate::backend::GpuInfo;

/// Test hook, read only by the check: `GPU:STEP` flips one weight bit on the GPU with that
/// NVML index right after that step's update (steps counted from 1, warm-up included). Only in
/// agents built with the `test-hooks` feature ([`crate::test_hooks`]).
pub const CORRUPT_ENV: &str = "GPUVAL_TRAINING_TEST_CORRUPT";

/// The planted corruption of a test run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Corruption {
    /// NVML index of the GPU whose weights are changed.
    pub gpu: u32,
    /// After this step's update (from 1).
    pub step: u32,
}

impl Corruption {
    /// `GPU:STEP`, as [`CORRUPT_ENV`] holds it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("{CORRUPT_ENV}={text:?}: expected GPU:STEP (like 1:5)");
        let (gpu, step) = text.trim().split_once(':').ok_or_else(bad)?;
        let gpu = gpu.trim().parse().map_err(|_| bad())?;
        let step: u32 = step.trim().parse().map_err(|_| bad())?;
        if step == 0 {
            return Err(bad());
        }
        Ok(Self { gpu, step })
    }

    /// The corruption the environment plants, if any (a bad value is an error the check
    /// reports).
    pub fn from_env() -> Result<Option<Self>, String> {
        match crate::test_hooks::value(CORRUPT_ENV) {
            Some(v) => {
                let c = Self::parse(&v)?;
                tracing::warn!(
                    env = CORRUPT_ENV,
                    gpu = c.gpu,
                    step = c.step,
                    "test hook: a weight will be corrupted"
                );
                Ok(Some(c))
            }
            None => Ok(None),
        }
    }
}

/// What the child runs: the step, and its GPUs in rank order (the child sees exactly these,
/// rank r as CUDA device r).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    pub req: TrainingRequest,
    pub gpus: Vec<GpuInfo>,
    /// The simulated node's step (tests and demos only): the training process runs the
    /// simulator ([`super::sim::step_process`]) instead of the engine; None on real GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<super::sim::SimTraining>,
}

/// The training step as run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingRequest {
    pub hidden: u64,
    pub ffn_multiplier: u64,
    pub layers: u32,
    pub batch: u64,
    pub sequence: u64,
    pub bucket_bytes: u64,
    pub steps: u32,
    pub warmup: u32,
    pub checksum_every: u32,
    pub timeout: Duration,
    pub corrupt: Option<Corruption>,
}

/// Bytes per element (bf16).
pub const ELEMENT: u64 = 2;
/// SGD learning rate.
pub const LEARNING_RATE: f32 = 0.05;

fn positive(v: i32) -> u64 {
    u64::try_from(v.max(1)).unwrap_or(1)
}

impl TrainingRequest {
    pub fn from_spec(spec: &TrainingCheck) -> Self {
        Self {
            hidden: positive(spec.hidden_size).div_ceil(64) * 64,
            ffn_multiplier: positive(spec.ffn_multiplier),
            layers: u32::try_from(spec.layers.max(1)).unwrap_or(1),
            batch: positive(spec.batch_size),
            sequence: positive(spec.sequence_length),
            bucket_bytes: positive(spec.bucket_mib) << 20,
            steps: u32::try_from(spec.steps.max(1)).unwrap_or(1),
            warmup: u32::try_from(spec.warmup_steps.max(0)).unwrap_or(0),
            checksum_every: u32::try_from(spec.checksum_every.max(1)).unwrap_or(1),
            timeout: spec.timeout.as_std(),
            corrupt: None,
        }
    }

    /// Tokens per GPU per step (a multiple of 8 is not needed: every tensor's element count
    /// has the hidden size, a multiple of 64, as a factor).
    pub fn tokens(&self) -> u64 {
        self.batch * self.sequence
    }

    /// Width of a block's inner layer.
    pub fn inner(&self) -> u64 {
        self.hidden * self.ffn_multiplier
    }

    /// Elements of one weight matrix (every block has two of the same size).
    pub fn matrix(&self) -> u64 {
        self.hidden * self.inner()
    }

    /// Weight matrices, in the order the backward pass produces their gradients.
    pub fn matrices(&self) -> u32 {
        2 * self.layers
    }

    /// Weights per replica.
    pub fn parameters(&self) -> u64 {
        self.matrix() * u64::from(self.matrices())
    }

    /// GEMM floating-point operations of one step on one GPU: two GEMMs forward and four
    /// backward per block, each 2·T·H·F, less the input gradient of the first block, which
    /// nothing needs.
    pub fn flops_per_step(&self) -> f64 {
        let gemm = 2.0 * self.tokens() as f64 * self.hidden as f64 * self.inner() as f64;
        gemm * (6.0 * f64::from(self.layers) - 1.0)
    }

    /// Gradient buckets as ranges of matrix numbers (backward order): consecutive matrices
    /// up to the bucket size, a matrix larger than it alone, as DDP fills its buckets.
    pub fn buckets(&self) -> Vec<Range<u32>> {
        let per = (self.bucket_bytes / (self.matrix() * ELEMENT)).max(1);
        let per = u32::try_from(per).unwrap_or(u32::MAX);
        let n = self.matrices();
        (0..n.div_ceil(per))
            .map(|b| b * per..((b + 1) * per).min(n))
            .collect()
    }

    /// Steps of the run with communication (warm-up included).
    pub fn total_steps(&self) -> u32 {
        self.warmup + self.steps
    }

    /// True when the replicas' weights are compared after step `step` (from 1): every
    /// `checksum_every` steps and after the last.
    pub fn compares_after(&self, step: u32) -> bool {
        step.is_multiple_of(self.checksum_every) || step == self.total_steps()
    }

    /// Device memory one replica needs, in bytes: weights and gradients, every block's input,
    /// pre-activation and activation, and the gradient scratch.
    pub fn bytes_per_gpu(&self) -> u64 {
        let (t, h, f) = (self.tokens(), self.hidden, self.inner());
        let layers = u64::from(self.layers);
        let elems =
            2 * self.parameters() + (layers + 1) * t * h + 2 * layers * t * f + t * f + 2 * t * h;
        elems * ELEMENT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_make_a_billion_parameter_step() {
        let r = TrainingRequest::from_spec(&TrainingCheck::default());
        assert_eq!(r.parameters(), 16 * 4096 * 16384);
        // 128 MiB matrices are each a bucket of their own under DDP's 25 MiB cap.
        assert_eq!(r.buckets().len(), 16);
        assert!(
            (r.flops_per_step() / 1e12 - 51.66).abs() < 0.1,
            "{}",
            r.flops_per_step()
        );
        assert!(r.bytes_per_gpu() < 12 << 30);
    }

    #[test]
    fn small_matrices_share_buckets_and_comparisons_end_the_run() {
        let spec = TrainingCheck {
            hidden_size: 256,
            layers: 5,
            bucket_mib: 1,
            steps: 7,
            warmup_steps: 1,
            checksum_every: 3,
            ..Default::default()
        };
        let r = TrainingRequest::from_spec(&spec);
        // A matrix is 256 × 1024 × 2 B = 512 KiB: two to a bucket, ten matrices.
        assert_eq!(r.buckets(), vec![0..2, 2..4, 4..6, 6..8, 8..10]);
        let compared: Vec<u32> = (1..=r.total_steps())
            .filter(|s| r.compares_after(*s))
            .collect();
        assert_eq!(compared, [3, 6, 8]);
    }

    #[test]
    fn the_corruption_hook_reads_gpu_and_step() {
        assert_eq!(Corruption::parse("1:5"), Ok(Corruption { gpu: 1, step: 5 }));
        assert!(Corruption::parse("1").is_err());
        assert!(Corruption::parse("1:0").is_err());
        assert!(Corruption::parse("x:2").is_err());
    }
}
