//! The training check on the simulated node through the whole runner: a clean run passes, a
//! planted divergence fails exactly the GPU it was planted on, a slow all-reduce shows as
//! exposed communication, a hang is an error.

use gpuval_crds::{Checks, NodeReport, TrainingCheck, Verdict};

use crate::judge::testing::{assert_any_contains, assert_any_starts_with};

fn report(spec: &str) -> NodeReport {
    let checks = Checks {
        training: Some(TrainingCheck {
            timeout: "1s".parse().expect("a duration"),
            ..Default::default()
        }),
        ..Default::default()
    };
    crate::judge::testing::simulated_run(spec, checks)
}

#[test]
fn a_clean_simulated_run_passes_and_says_it_is_simulated() {
    let r = report("gpus=8");
    let t = r.training.as_ref().expect("a training result");
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.failures);
    assert_eq!(t.verdict, Verdict::Pass, "{:?}", t.reasons);
    assert!(r.simulated);
    assert_any_starts_with(&t.notes, "simulated");
    assert!(t.replicas.identical);
    let f = t.figures.as_ref().expect("figures");
    assert!(
        f.scaling_efficiency > 0.9 && f.scaling_efficiency <= 1.0,
        "{f:?}"
    );
    let table = crate::render::table(&r);
    assert!(table.contains("TRAINING"), "{table}");
    assert!(crate::render::headline(&r).contains("training "));
}

#[test]
fn a_planted_divergence_fails_the_gpu_it_was_planted_on() {
    let r = report("gpus=8,fail=training@5");
    let t = r.training.as_ref().expect("a training result");
    assert_eq!(t.verdict, Verdict::Fail);
    let d = t.replicas.divergence.as_ref().expect("a divergence");
    assert_eq!((d.gpus.as_slice(), d.majority), (&[5][..], true));
    assert_eq!(r.gpus[5].verdict, Verdict::Fail);
    assert_any_starts_with(&r.gpus[5].reasons, "GPU5: weights diverged at step 20");
    for (i, g) in r.gpus.iter().enumerate().filter(|(i, _)| *i != 5) {
        assert_eq!(g.verdict, Verdict::Pass, "GPU{i}: {:?}", g.reasons);
    }
}

#[test]
fn a_slow_all_reduce_is_exposed_communication() {
    let r = report("gpus=8,slow=training@3:0.05");
    let t = r.training.as_ref().expect("a training result");
    assert_eq!(t.verdict, Verdict::Fail);
    assert_any_contains(&t.reasons, "did not hide");
}

#[test]
fn a_hang_is_an_error_and_one_gpu_is_skipped() {
    let t = report("gpus=2,fabric=hang")
        .training
        .expect("a training result");
    assert_eq!(t.verdict, Verdict::Error);
    assert_any_contains(&t.reasons, "did not finish");
    let t = report("gpus=1").training.expect("a training result");
    assert_eq!(t.verdict, Verdict::Skipped);
}

#[test]
fn a_replica_that_never_joins_ends_the_run_naming_it_beside_those_left_waiting() {
    let r = report("gpus=4,hang=training@2");
    let t = r.training.as_ref().expect("a training result");
    assert_eq!(t.verdict, Verdict::Error, "{:?}", t.reasons);
    // The words of the real engine's watchdog: the step timeout (1s) and its grace.
    assert_any_contains(
        &t.reasons,
        "ncclCommInitRank did not return within 6s on rank 0 (GPU 0), rank 1 (GPU 1), rank 3 (GPU 3); rank 2 (GPU 2) never joined",
    );
    assert_ne!(
        r.verdict,
        Verdict::Pass,
        "a run that could not train is no pass"
    );
}
