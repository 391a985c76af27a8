//! The simulated nccl and training checks through the whole runner, as the agent runs them:
//! each sweep and each training step in a child process of the agent's binary (its run
//! directory, its library link, NCCL's log file, the supervisor's silence limit). Healthy nodes
//! pass, planted faults show up where they were planted, hangs end through the child's own
//! timeout or the agent's stop, and every run directory is gone afterwards.

use std::fmt::Debug;
use std::ops::Deref;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpuval_agent::backend::Backend;
use gpuval_agent::backend::sim::SimBackend;
use gpuval_agent::runner::{Plan, run};
use gpuval_crds::{Checks, NodeReport, Thresholds, TrainingCheck, Verdict};

/// Held by each run: a run's directories (under this process's temporary directory, named by
/// its pid) are counted when it ends, so no other run of this file may be making some.
static RUN_DIRS: Mutex<()> = Mutex::new(());

fn use_the_agent_binary() {
    gpuval_agent::worker::use_agent_exe(env!("CARGO_BIN_EXE_gpuval-agent").into())
        .expect("one agent binary");
}

/// The run directories this process made that are still there.
fn run_dirs_left() -> Vec<String> {
    let pid = std::process::id();
    let mine = [
        format!("gpuval-nccl-{pid}-"),
        format!("gpuval-training-{pid}-"),
    ];
    std::fs::read_dir(std::env::temp_dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| mine.iter().any(|p| n.starts_with(p)))
                .collect()
        })
        .unwrap_or_default()
}

/// A run of `checks` on the simulated node `spec` describes, stopped when `stop` is set; no
/// run directory of it is left behind.
fn simulated_with(spec: &str, checks: Checks, stop: &AtomicBool) -> NodeReport {
    simulated_seen(spec, checks, stop, &|_| {})
}

/// [`simulated_with`], with every progress line the runner prints given to `seen`.
fn simulated_seen(
    spec: &str,
    checks: Checks,
    stop: &AtomicBool,
    seen: &(dyn Fn(&str) + Sync),
) -> NodeReport {
    use_the_agent_binary();
    let _alone = RUN_DIRS.lock().unwrap_or_else(|p| p.into_inner());
    let backend = Backend::Simulated(SimBackend::new(spec.parse().expect("valid spec")));
    let plan = Plan::new(checks, Thresholds::default());
    let report = run(&backend, &plan, stop, seen);
    assert_eq!(
        run_dirs_left(),
        Vec::<String>::new(),
        "{spec}: run directories left"
    );
    report
}

fn simulated(spec: &str, checks: Checks) -> NodeReport {
    simulated_with(spec, checks, &AtomicBool::new(false))
}

fn assert_any_contains(lines: &[impl Deref<Target = str> + Debug], fragment: &str) {
    assert!(
        lines.iter().any(|l| l.contains(fragment)),
        "none contains {fragment:?}: {lines:#?}"
    );
}

fn assert_any_starts_with(lines: &[impl Deref<Target = str> + Debug], prefix: &str) {
    assert!(
        lines.iter().any(|l| l.starts_with(prefix)),
        "none starts with {prefix:?}: {lines:#?}"
    );
}

/// The training check alone on a simulated node, with a 1 s step timeout.
fn report(spec: &str) -> NodeReport {
    let checks = Checks {
        training: Some(TrainingCheck {
            timeout: "1s".parse().expect("a duration"),
            ..Default::default()
        }),
        ..Default::default()
    };
    simulated(spec, checks)
}

/// The nccl check alone on a simulated node, with a 1 s collective timeout.
fn nccl_report(spec: &str) -> NodeReport {
    let checks = Checks {
        nccl: Some(gpuval_crds::NcclCheck {
            timeout: "1s".parse().expect("a duration"),
            max_bytes: Some(1 << 26),
            ..Default::default()
        }),
        ..Default::default()
    };
    simulated(spec, checks)
}

/// The report of an nccl run, and its nccl result (which every such run has).
fn with_nccl(spec: &str) -> (NodeReport, gpuval_crds::NcclResult) {
    let report = nccl_report(spec);
    let nccl = report.nccl.clone().expect("an nccl result");
    (report, nccl)
}

#[test]
fn nccl_on_a_healthy_node_passes_and_shows_in_the_table_and_headline() {
    let (report, nccl) = with_nccl("gpus=4");
    assert_eq!(report.verdict, Verdict::Pass, "{:?}", report.failures);
    assert_eq!(nccl.verdict, Verdict::Pass, "{:?}", nccl.reasons);
    let table = gpuval_agent::render::table(&report);
    assert!(table.contains("nccl"), "{table}");
    assert!(
        gpuval_agent::render::headline(&report).contains("all-reduce"),
        "{}",
        gpuval_agent::render::headline(&report)
    );
}

#[test]
fn a_planted_wrong_nccl_result_fails_the_gpu_that_holds_it() {
    let report = nccl_report("gpus=4,fail=nccl@2");
    assert_eq!(report.verdict, Verdict::Fail);
    assert_eq!(report.gpus[2].verdict, Verdict::Fail);
    for i in [0, 1, 3] {
        assert_eq!(report.gpus[i].verdict, Verdict::Pass, "GPU{i}");
    }
    let why = gpuval_crds::reason::messages(&report.failures);
    assert!(why.contains("rank 2"), "{why}");
}

#[test]
fn a_hung_collective_is_aborted_and_reported_as_an_error() {
    let started = std::time::Instant::now();
    let (report, nccl) = with_nccl("gpus=2,fabric=hang");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(nccl.verdict, Verdict::Error, "{:?}", nccl.reasons);
    assert_eq!(report.verdict, Verdict::Error);
    assert!(
        report
            .failures
            .iter()
            .any(|f| f.contains("allReduce 8 B") && f.contains("aborted")),
        "{:?}",
        report.failures
    );
}

#[test]
fn an_shm_fallback_on_an_nvlink_node_fails() {
    let (_, nccl) = with_nccl("gpus=2,fabric=shm");
    assert_eq!(nccl.verdict, Verdict::Fail, "{:?}", nccl.reasons);
    assert_any_contains(&nccl.reasons, "SHM");
}

#[test]
fn nccl_on_one_gpu_is_skipped() {
    let (report, nccl) = with_nccl("gpus=1");
    assert_eq!(nccl.verdict, Verdict::Skipped);
    assert_eq!(report.verdict, Verdict::Pass, "{:?}", report.failures);
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
    let table = gpuval_agent::render::table(&r);
    assert!(table.contains("TRAINING"), "{table}");
    assert!(gpuval_agent::render::headline(&r).contains("training "));
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

/// What the agent learns only from its child: NCCL's library reached through the link in the
/// run directory, and the transport from the log file NCCL's side wrote there.
#[test]
fn the_sweep_runs_in_a_child_through_the_library_link_and_nccl_s_log() {
    let checks = Checks {
        nccl: Some(gpuval_crds::NcclCheck {
            transports: true,
            max_bytes: Some(1 << 20),
            ..Default::default()
        }),
        training: Some(TrainingCheck {
            hidden_size: 256,
            layers: 2,
            steps: 4,
            ..Default::default()
        }),
        ..Default::default()
    };
    let r = simulated("gpus=2,model=H100", checks);
    let nccl = r.nccl.as_ref().expect("an nccl result");
    assert_eq!(nccl.verdict, Verdict::Pass, "{:?}", nccl.reasons);
    assert_eq!(
        nccl.library.as_deref(),
        Some("/simulated/nccl/libnccl.so.2 (2.28.3, simulated), linked as libnccl.so")
    );
    let kinds =
        |s: Option<&gpuval_crds::NcclSweep>| s.and_then(|s| s.transport.clone()).map(|t| t.kinds);
    assert_eq!(
        kinds(nccl.sweep.as_ref()),
        Some(vec!["P2P/CUMEM".to_string()])
    );
    assert_eq!(
        kinds(nccl.p2p_off.as_ref()),
        Some(vec!["SHM".to_string()]),
        "NCCL_P2P_DISABLE reached the child"
    );
    let t = r.training.as_ref().expect("a training result");
    assert_eq!(t.verdict, Verdict::Pass, "{:?}", t.reasons);
    assert_any_contains(&t.notes, "run by the agent's training process");
}

/// A stop reaches a child held in a planted hang as SIGTERM: it answers at once, long before
/// its own timeout.
#[test]
fn a_stop_ends_hung_children_at_once() {
    let checks = Checks {
        nccl: Some(gpuval_crds::NcclCheck {
            timeout: "1h".parse().expect("a duration"),
            ..Default::default()
        }),
        ..Default::default()
    };
    for (spec, checks, words) in [
        ("gpus=2,fabric=hang", checks, "stopped before it finished"),
        (
            "gpus=2,hang=training@1",
            Checks {
                training: Some(TrainingCheck {
                    timeout: "1h".parse().expect("a duration"),
                    ..Default::default()
                }),
                ..Default::default()
            },
            "stopped before completion",
        ),
    ] {
        let stop = AtomicBool::new(false);
        // The child says it started once its signal handlers are in place: the stop is sent
        // then, while it is held in its hang (waited for, never guessed with a sleep).
        let child_started = AtomicBool::new(false);
        let seen = |line: &str| {
            if line.contains("process started") {
                child_started.store(true, Ordering::Relaxed);
            }
        };
        let started = Instant::now();
        let r = std::thread::scope(|s| {
            s.spawn(|| {
                while !child_started.load(Ordering::Relaxed)
                    && started.elapsed() < Duration::from_secs(60)
                {
                    std::thread::park_timeout(Duration::from_millis(20));
                }
                stop.store(true, Ordering::Relaxed);
            });
            simulated_seen(spec, checks, &stop, &seen)
        });
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{spec}: {:?}",
            started.elapsed()
        );
        let reasons: Vec<String> = [
            r.nccl.as_ref().map(|n| &n.reasons),
            r.training.as_ref().map(|t| &t.reasons),
        ]
        .into_iter()
        .flatten()
        .flatten()
        .map(|x| x.message.clone())
        .collect();
        assert_any_contains(&reasons, words);
    }
}
