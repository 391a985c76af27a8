//! The silent data corruption detector: every replica starts from the same weights and
//! applies the same all-reduced gradients, so their weights must stay bitwise identical. The
//! replicas' checksums are compared at each comparison; the first one where they differ names
//! the GPUs outside the majority (every GPU when there is none, as with two replicas).

use gpuval_crds::{TrainingDivergence, TrainingReplicas};

use super::outcome::Comparison;

/// The replicas' verdict over every comparison, for the GPUs `gpus` (rank order).
pub fn compare(gpus: &[u32], comparisons: &[Comparison]) -> TrainingReplicas {
    let divergence = comparisons.iter().find_map(|c| diverged(gpus, c));
    TrainingReplicas {
        comparisons: i32::try_from(comparisons.len()).unwrap_or(i32::MAX),
        identical: divergence.is_none() && !comparisons.is_empty(),
        divergence,
    }
}

/// The divergence at one comparison, if the checksums differ.
fn diverged(gpus: &[u32], c: &Comparison) -> Option<TrainingDivergence> {
    let first = *c.checksums.first()?;
    if c.checksums.iter().all(|s| *s == first) {
        return None;
    }
    let n = c.checksums.len();
    let majority = c
        .checksums
        .iter()
        .find(|s| c.checksums.iter().filter(|t| t == s).count() * 2 > n);
    let odd = |rank: usize| majority.is_none_or(|m| c.checksums[rank] != *m);
    let named = (0..n)
        .filter(|r| odd(*r))
        .filter_map(|r| gpus.get(r).and_then(|g| i32::try_from(*g).ok()))
        .collect();
    Some(TrainingDivergence {
        step: i32::try_from(c.step).unwrap_or(i32::MAX),
        gpus: named,
        majority: majority.is_some(),
    })
}

/// The reason a diverged GPU fails with.
pub fn reason(gpu: i32, d: &TrainingDivergence) -> String {
    if d.majority {
        format!(
            "GPU{gpu}: weights diverged at step {}: its replica differs from the majority after identical all-reduced updates (silent data corruption)",
            d.step
        )
    } else {
        format!(
            "GPU{gpu}: weights diverged at step {}: the {} replicas disagree and no majority says which is wrong (silent data corruption on one of them)",
            d.step,
            d.gpus.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(step: u32, sums: &[u64]) -> Comparison {
        Comparison {
            step,
            checksums: sums.to_vec(),
        }
    }

    #[test]
    fn identical_replicas_pass_every_comparison() {
        let r = compare(&[0, 1, 2], &[cmp(10, &[7, 7, 7]), cmp(20, &[9, 9, 9])]);
        assert_eq!((r.comparisons, r.identical, r.divergence), (2, true, None));
    }

    #[test]
    fn the_replica_outside_the_majority_is_named_at_the_first_divergence() {
        let r = compare(
            &[0, 3, 5, 6],
            &[
                cmp(10, &[7, 7, 7, 7]),
                cmp(20, &[9, 9, 8, 9]),
                cmp(30, &[4, 4, 2, 1]),
            ],
        );
        let d = r.divergence.clone().expect("a divergence");
        assert_eq!((d.step, d.gpus.clone(), d.majority), (20, vec![5], true));
        assert!(!r.identical);
        assert!(reason(5, &d).starts_with("GPU5: weights diverged at step 20"));
    }

    #[test]
    fn two_replicas_that_disagree_are_both_named() {
        let r = compare(&[0, 1], &[cmp(5, &[1, 2])]);
        let d = r.divergence.expect("a divergence");
        assert_eq!((d.step, d.gpus.clone(), d.majority), (5, vec![0, 1], false));
        assert!(reason(1, &d).contains("no majority"));
    }

    #[test]
    fn no_comparison_is_not_identical() {
        assert!(!compare(&[0, 1], &[]).identical);
    }
}
