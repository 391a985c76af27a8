//! The check's command-line flags (flattened into `gpuval-agent run`): each overrides the same
//! field of the spec's `checks.training` when the check is on.

use gpuval_crds::{Duration, TrainingCheck};

use crate::check::given;

/// Training check flags.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
#[group(skip)]
pub struct Flags {
    /// Training: hidden size (a multiple of 64).
    #[arg(long = "training-hidden", id = "training_hidden")]
    pub hidden: Option<i32>,
    /// Training: blocks.
    #[arg(long = "training-layers", id = "training_layers")]
    pub layers: Option<i32>,
    /// Training: sequences per GPU per step.
    #[arg(long = "training-batch", id = "training_batch")]
    pub batch: Option<i32>,
    /// Training: tokens per sequence.
    #[arg(long = "training-seq", id = "training_seq")]
    pub sequence: Option<i32>,
    /// Training: gradient bucket size, MiB (DDP's bucket_cap_mb).
    #[arg(long = "training-bucket-mib", id = "training_bucket_mib")]
    pub bucket_mib: Option<i32>,
    /// Training: timed steps.
    #[arg(long = "training-steps", id = "training_steps")]
    pub steps: Option<i32>,
    /// Training: untimed steps before them.
    #[arg(long = "training-warmup", id = "training_warmup")]
    pub warmup: Option<i32>,
    /// Training: compare the replicas' weights every this many steps.
    #[arg(long = "training-checksum-every", id = "training_checksum_every")]
    pub checksum_every: Option<i32>,
    /// Training: a step not done after this aborts the communicators (like 120s).
    #[arg(long = "training-timeout", id = "training_timeout")]
    pub timeout: Option<Duration>,
    /// Training: fail below this many samples/s per GPU.
    #[arg(
        long = "training-min-samples-per-gpu",
        id = "training_min_samples_per_gpu"
    )]
    pub min_samples: Option<f64>,
    /// Training: fail below this scaling efficiency (0 to 1).
    #[arg(long = "training-min-scaling", id = "training_min_scaling")]
    pub min_scaling: Option<f64>,
    /// Training: fail above this share of the step in exposed communication (0 to 1).
    #[arg(long = "training-max-exposed-comm", id = "training_max_exposed_comm")]
    pub max_exposed: Option<f64>,
}

impl Flags {
    /// Applies the flags that were given to the check's settings.
    pub fn apply(&self, spec: &mut TrainingCheck) {
        let Self {
            hidden,
            layers,
            batch,
            sequence,
            bucket_mib,
            steps,
            warmup,
            checksum_every,
            timeout,
            min_samples,
            min_scaling,
            max_exposed,
        } = self;
        given(&mut spec.hidden_size, hidden);
        given(&mut spec.layers, layers);
        given(&mut spec.batch_size, batch);
        given(&mut spec.sequence_length, sequence);
        given(&mut spec.bucket_mib, bucket_mib);
        given(&mut spec.steps, steps);
        given(&mut spec.warmup_steps, warmup);
        given(&mut spec.checksum_every, checksum_every);
        given(&mut spec.timeout, timeout);
        spec.min_samples_per_second_per_gpu = min_samples.or(spec.min_samples_per_second_per_gpu);
        spec.min_scaling_efficiency = min_scaling.or(spec.min_scaling_efficiency);
        spec.max_exposed_comm_fraction = max_exposed.or(spec.max_exposed_comm_fraction);
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use gpuval_crds::{Checks, NcclCheck, TrainingCheck};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: crate::checks::Flags,
    }

    #[test]
    fn training_flags_reach_only_the_training_check() {
        let on = || Checks {
            nccl: Some(NcclCheck::default()),
            training: Some(TrainingCheck::default()),
            ..Default::default()
        };
        let cli = Cli::try_parse_from(["agent", "--training-warmup", "2", "--training-steps", "9"])
            .expect("the flags parse");
        let mut checks = on();
        cli.flags.apply(&mut checks).expect("the flags apply");
        let training = checks.training.expect("training");
        assert_eq!((training.warmup_steps, training.steps), (2, 9));
        assert_eq!(
            checks.nccl.expect("nccl").warmup_iterations,
            NcclCheck::default().warmup_iterations,
            "--training-warmup must not set the nccl check's"
        );
        let cli = Cli::try_parse_from(["agent", "--nccl-warmup", "4"]).expect("the flags parse");
        let mut checks = on();
        cli.flags.apply(&mut checks).expect("the flags apply");
        assert_eq!(checks.nccl.expect("nccl").warmup_iterations, 4);
        assert_eq!(
            checks.training.expect("training").warmup_steps,
            TrainingCheck::default().warmup_steps
        );
    }
}
