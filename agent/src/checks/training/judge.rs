//! Turns what the training step measured into the report's [`TrainingResult`]: the figures,
//! the replicas' comparison, the floors of the spec (samples/s per GPU, scaling efficiency,
//! exposed communication) and the rule across GPUs (a GPU whose compute-only step is far
//! slower than its peers').

use gpuval_crds::{
    DEFAULT_MAX_EXPOSED_COMM_FRACTION, DEFAULT_MIN_SCALING_EFFICIENCY, TrainingCheck,
    TrainingFigures, TrainingResult, TrainingShape,
};

use super::outcome::TrainingOutcome;
use super::replicas;
use super::request::TrainingRequest;
use crate::judge::{Code, Reason, Says, median, outliers, round_to, verdict_of};

/// What judging found: the node's result, and the GPUs that fail with it (NVML index, why).
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub result: TrainingResult,
    pub gpus: Vec<(u32, Reason)>,
}

/// Judges a finished (or aborted) run. `tolerance`: the relative rule's share (0.1 = 10%).
pub fn judge(spec: &TrainingCheck, outcome: &TrainingOutcome, tolerance: f64) -> Judged {
    let req = TrainingRequest::from_spec(spec);
    let replicas = replicas::compare(&outcome.gpus, &outcome.comparisons);
    let mut result = TrainingResult {
        gpus: outcome
            .gpus
            .iter()
            .filter_map(|g| i32::try_from(*g).ok())
            .collect(),
        shape: shape(spec, &req),
        steps: i32::try_from(outcome.overlapped.iter().map(Vec::len).min().unwrap_or(0))
            .unwrap_or(i32::MAX),
        figures: figures(&req, outcome),
        nccl_version: outcome.nccl_version.clone(),
        notes: outcome.notes.clone(),
        seconds: round_to(outcome.seconds, 2),
        ..Default::default()
    };
    let mut reasons = Vec::new();
    let mut gpus = Vec::new();
    if let Some(d) = &replicas.divergence {
        for g in &d.gpus {
            let why = Code::TrainingDiverged.says(replicas::reason(*g, d));
            reasons.push(why.clone());
            gpus.push((u32::try_from(*g).unwrap_or(0), why));
        }
    }
    if let Some(f) = &result.figures {
        reasons.extend(
            floors(spec, f)
                .into_iter()
                .map(|m| Code::TrainingSlow.says(m)),
        );
        for (i, value, peers) in slow_gpus(f, tolerance) {
            let gpu = outcome.gpus.get(i).copied().unwrap_or(0);
            let why = Code::TrainingSlow.says(format!(
                "GPU{gpu}: compute-only training step {value:.1} ms is {:.0}% slower than its peers (median {peers:.1} ms)",
                (value / peers - 1.0) * 100.0
            ));
            reasons.push(why.clone());
            gpus.push((gpu, why));
        }
    }
    if let Some(e) = &outcome.error {
        reasons.push(Code::TrainingIncomplete.says(format!("training step stopped early: {e}")));
    } else if result.figures.is_none() {
        reasons.push(Code::TrainingIncomplete.says("training step measured no step"));
    }
    result.verdict = verdict_of(&reasons);
    result.reasons = reasons;
    result.replicas = replicas;
    Judged { result, gpus }
}

fn shape(spec: &TrainingCheck, req: &TrainingRequest) -> TrainingShape {
    TrainingShape {
        hidden_size: spec.hidden_size,
        ffn_multiplier: spec.ffn_multiplier,
        layers: spec.layers,
        batch_size: spec.batch_size,
        sequence_length: spec.sequence_length,
        dtype: spec.dtype,
        parameters: i64::try_from(req.parameters()).unwrap_or(i64::MAX),
        flops_per_step: req.flops_per_step(),
        bucket_mib: spec.bucket_mib,
        buckets: i32::try_from(req.buckets().len()).unwrap_or(i32::MAX),
    }
}

/// Each step's time as the slowest rank's, over the steps every rank finished.
fn slowest(per_rank: &[Vec<f64>]) -> Vec<f64> {
    let n = per_rank.iter().map(Vec::len).min().unwrap_or(0);
    (0..n)
        .map(|i| per_rank.iter().map(|r| r[i]).fold(0.0, f64::max))
        .collect()
}

fn percentile(mut v: Vec<f64>, p: f64) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let last = v.len().checked_sub(1)?;
    let at = ((p * last as f64).ceil() as usize).min(last);
    Some(v[at])
}

fn ms(seconds: f64) -> f64 {
    round_to(seconds * 1e3, 3)
}

/// The figures, when every phase has at least one timed step.
fn figures(req: &TrainingRequest, o: &TrainingOutcome) -> Option<TrainingFigures> {
    let steps = slowest(&o.overlapped);
    let step = median(steps.clone())?;
    let p99 = percentile(steps, 0.99)?;
    let compute = median(slowest(&o.compute_only))?;
    let single = median(o.single.clone())?;
    let batch = req.batch as f64;
    let n = o.gpus.len().max(1) as f64;
    let per_gpu = batch / step;
    let exposed = (step - compute).max(0.0);
    Some(TrainingFigures {
        step_millis: ms(step),
        step_millis_p99: ms(p99),
        compute_only_step_millis: ms(compute),
        single_gpu_step_millis: ms(single),
        samples_per_second_per_gpu: round_to(per_gpu, 2),
        samples_per_second: round_to(per_gpu * n, 2),
        single_gpu_samples_per_second: round_to(batch / single, 2),
        exposed_comm_millis: ms(exposed),
        exposed_comm_fraction: round_to(exposed / step, 4),
        scaling_efficiency: round_to(single / step, 4),
        tflops_per_gpu: round_to(req.flops_per_step() / step / 1e12, 1),
        compute_only_step_millis_per_gpu: o
            .compute_only
            .iter()
            .filter_map(|r| median(r.clone()))
            .map(ms)
            .collect(),
    })
}

/// The spec's floors (and the defaults where it sets none) the figures miss.
fn floors(spec: &TrainingCheck, f: &TrainingFigures) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(min) = spec.min_samples_per_second_per_gpu
        && f.samples_per_second_per_gpu < min
    {
        out.push(format!(
            "training: {:.2} samples/s per GPU is below the floor {min} (minSamplesPerSecondPerGpu)",
            f.samples_per_second_per_gpu
        ));
    }
    let min_eff = spec
        .min_scaling_efficiency
        .unwrap_or(DEFAULT_MIN_SCALING_EFFICIENCY);
    if f.scaling_efficiency < min_eff {
        out.push(format!(
            "training: scaling efficiency {:.2} is below {min_eff} ({:.1} ms a step against {:.1} ms on one GPU alone)",
            f.scaling_efficiency, f.step_millis, f.single_gpu_step_millis
        ));
    }
    let max_exposed = spec
        .max_exposed_comm_fraction
        .unwrap_or(DEFAULT_MAX_EXPOSED_COMM_FRACTION);
    if f.exposed_comm_fraction > max_exposed {
        out.push(format!(
            "training: {:.1} ms of each {:.1} ms step is communication the backward pass did not hide ({:.0}%, above {:.0}%)",
            f.exposed_comm_millis,
            f.step_millis,
            f.exposed_comm_fraction * 100.0,
            max_exposed * 100.0
        ));
    }
    out
}

/// Ranks whose compute-only step is slower than their peers' by more than the tolerance:
/// (rank, its step ms, the peers' median ms).
fn slow_gpus(f: &TrainingFigures, tolerance: f64) -> Vec<(usize, f64, f64)> {
    let rates: Vec<Option<f64>> = f
        .compute_only_step_millis_per_gpu
        .iter()
        .map(|ms| (*ms > 0.0).then(|| 1.0 / ms))
        .collect();
    outliers(&rates, tolerance)
        .into_iter()
        .map(|(i, rate, peers)| (i, 1.0 / rate, 1.0 / peers))
        .collect()
}

#[cfg(test)]
mod tests {
    use gpuval_crds::Verdict;

    use super::*;
    use crate::checks::training::outcome::Comparison;

    fn outcome(step_ms: f64, compute_ms: f64, single_ms: f64) -> TrainingOutcome {
        let s = |ms: f64| vec![ms / 1e3; 5];
        TrainingOutcome {
            gpus: vec![0, 1, 2],
            single: s(single_ms),
            compute_only: vec![s(compute_ms); 3],
            overlapped: vec![s(step_ms), s(step_ms), s(step_ms * 0.9)],
            comparisons: vec![Comparison {
                step: 8,
                checksums: vec![1, 1, 1],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_healthy_run_passes_with_its_figures() {
        let j = judge(&TrainingCheck::default(), &outcome(80.0, 76.0, 75.0), 0.1);
        let f = j.result.figures.clone().expect("figures");
        assert_eq!(j.result.verdict, Verdict::Pass, "{:?}", j.result.reasons);
        assert_eq!((f.step_millis, f.exposed_comm_millis), (80.0, 4.0));
        assert_eq!(f.samples_per_second_per_gpu, 100.0);
        assert_eq!(f.samples_per_second, 300.0);
        assert_eq!(f.scaling_efficiency, 0.9375);
        assert!(j.result.replicas.identical);
        assert!(j.gpus.is_empty());
    }

    #[test]
    fn exposed_communication_and_poor_scaling_fail_the_node() {
        let j = judge(&TrainingCheck::default(), &outcome(120.0, 76.0, 75.0), 0.1);
        assert_eq!(j.result.verdict, Verdict::Fail);
        let text = gpuval_crds::reason::messages(&j.result.reasons);
        assert!(
            text.contains("scaling efficiency 0.62 is below 0.85"),
            "{text}"
        );
        assert!(text.contains("44.0 ms of each 120.0 ms step"), "{text}");
        let spec = TrainingCheck {
            min_samples_per_second_per_gpu: Some(150.0),
            ..Default::default()
        };
        let j = judge(&spec, &outcome(80.0, 76.0, 75.0), 0.1);
        assert!(j.result.reasons[0].contains("100.00 samples/s per GPU is below the floor 150"));
    }

    #[test]
    fn a_diverged_replica_fails_its_gpu() {
        let mut o = outcome(80.0, 76.0, 75.0);
        o.comparisons.push(Comparison {
            step: 16,
            checksums: vec![4, 9, 4],
        });
        let j = judge(&TrainingCheck::default(), &o, 0.1);
        assert_eq!(j.result.verdict, Verdict::Fail);
        assert_eq!(j.gpus.len(), 1);
        assert_eq!(j.gpus[0].0, 1);
        assert!(j.gpus[0].1.starts_with("GPU1: weights diverged at step 16"));
    }

    #[test]
    fn a_slow_gpu_is_named_and_an_abort_is_an_error() {
        let mut o = outcome(80.0, 76.0, 75.0);
        o.compute_only[2] = vec![0.1; 5];
        let j = judge(&TrainingCheck::default(), &o, 0.1);
        assert_eq!(j.gpus.len(), 1);
        assert!(
            j.gpus[0]
                .1
                .starts_with("GPU2: compute-only training step 100.0 ms")
        );
        o.error = Some("rank 1: step 3 did not finish within 120s".into());
        o.overlapped = vec![vec![]; 3];
        let j = judge(&TrainingCheck::default(), &o, 0.1);
        assert_eq!(j.result.verdict, Verdict::Error);
        assert!(j.result.figures.is_none());
    }
}
