//! The training step runs in a child process of the agent ([`crate::worker`]), as the nccl
//! check's sweep does. A replica stuck in `ncclCommInitRank` (a GPU or peer that never joins)
//! cannot be aborted from its own thread and holds the process: the child's watchdog answers
//! and ends the process when a host NCCL call outlives the step timeout, and the agent kills a
//! child that falls silent. [`run`] is the agent's side, [`child_main`] the child's. The
//! simulated node's step takes the same way ([`run_job`]); its child runs
//! [`super::sim::step_process`] instead of the engine.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use super::engine;
use super::outcome::TrainingOutcome;
use super::request::{Job, TrainingRequest};
use crate::backend::{BackendError, GpuInfo};
use crate::nccl::library::{self, Found};
use crate::nccl::transport;
use crate::run_control::RunControl;
use crate::worker::run_dir::RunDir;
use crate::worker::supervise::{self, Launch};

/// The hidden subcommand that runs one training step's three phases.
pub const SUBCOMMAND: &str = "training-run";
/// The work, as errors name it ("the training process was killed").
const WHAT: &str = "training";
const STOP_GRACE: Duration = Duration::from_secs(15);

/// Runs the step on `gpus` in a child process of the agent ([`crate::worker::agent_exe`]).
pub fn run(
    gpus: &[GpuInfo],
    req: &TrainingRequest,
    ctl: &RunControl<'_>,
) -> Result<TrainingOutcome, BackendError> {
    let exe = crate::worker::agent_exe()?;
    engine::require_memory(gpus, req)?;
    let found = library::locate()?;
    let job = Job {
        req: req.clone(),
        gpus: gpus.to_vec(),
        simulated: None,
    };
    run_job(&exe, &found, &job, ctl)
}

/// [`run`] with the executable to start and the NCCL library it is to load: the simulated
/// node's step (`job.simulated`) takes this same way, with the library the simulator stands
/// for.
pub fn run_job(
    exe: &Path,
    found: &Found,
    job: &Job,
    ctl: &RunControl<'_>,
) -> Result<TrainingOutcome, BackendError> {
    let dir = RunDir::create("gpuval-training")?;
    if found.needs_link {
        library::make_link(found, dir.path())?;
    }
    let log = dir.path().join("nccl-training.log");
    // NCCL's warnings only: the training step reads no transport from its log.
    let mut env = library::child_env(job.gpus.iter().map(|g| g.uuid.as_str()), "WARN", &log);
    if found.needs_link {
        env.push((
            "LD_LIBRARY_PATH".into(),
            library::library_path_with(dir.path()),
        ));
    }
    tracing::info!(library = %found.describe(), ranks = job.gpus.len(), simulated = job.simulated.is_some(), "training check");
    let launch = launch(exe.to_path_buf(), env, &job.req);
    let result = supervise::run(&launch, job, ctl);
    with_nccl_warning(result, &log)
}

/// How the training process is started and watched: killed when it says nothing for its step
/// timeout plus [`crate::worker::SILENCE_GRACE`].
fn launch(exe: std::path::PathBuf, env: Vec<(String, String)>, req: &TrainingRequest) -> Launch {
    Launch {
        exe,
        subcommand: SUBCOMMAND,
        what: WHAT,
        env,
        silence_limit: crate::worker::silence_limit(req.timeout),
        stop_grace: STOP_GRACE,
    }
}

/// The outcome with NCCL's first logged warning added to its error, where it logged one.
fn with_nccl_warning(
    result: Result<TrainingOutcome, BackendError>,
    log: &Path,
) -> Result<TrainingOutcome, BackendError> {
    let Some(w) = std::fs::read_to_string(log)
        .ok()
        .and_then(|t| transport::parse(&t).warnings.into_iter().next())
    else {
        return result;
    };
    match result {
        Err(BackendError::Other(m)) => Err(BackendError::Other(format!("{m} (NCCL: {w})"))),
        Ok(mut o) => {
            if let Some(e) = o.error.as_mut() {
                e.push_str(&format!(" (NCCL: {w})"));
            }
            Ok(o)
        }
        Err(e) => Err(e),
    }
}

/// The child's side: reads the job from stdin, runs it, prints the outcome.
pub fn child_main() -> ExitCode {
    crate::worker::serve::main(WHAT, |job: Job, stop, progress, bail| {
        let ctl = RunControl::new(stop, progress);
        match &job.simulated {
            Some(sim) => super::sim::step_process(sim, &job, &ctl, bail),
            None => engine::run(&job, &ctl, bail),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_s_first_warning_goes_with_the_error() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let log = dir.path().join("nccl.log");
        std::fs::write(
            &log,
            "host:1:2 [1] NCCL WARN Cuda failure 'out of memory'\nhost:1:2 [1] NCCL WARN second\n",
        )
        .expect("write the log");
        let e = with_nccl_warning(Err(BackendError::Other("it failed".into())), &log);
        assert_eq!(
            e.err().map(|e| e.to_string()).as_deref(),
            Some("it failed (NCCL: Cuda failure 'out of memory')")
        );
        let o = TrainingOutcome {
            error: Some("step 3: unhandled cuda error".into()),
            ..Default::default()
        };
        let o = with_nccl_warning(Ok(o), &log).expect("an outcome");
        assert_eq!(
            o.error.as_deref(),
            Some("step 3: unhandled cuda error (NCCL: Cuda failure 'out of memory')")
        );
        let clean = with_nccl_warning(Ok(TrainingOutcome::default()), &log).expect("an outcome");
        assert_eq!(clean.error, None, "no error, nothing added");
        let none = with_nccl_warning(Err(BackendError::Stopped), &dir.path().join("absent"));
        assert!(matches!(none, Err(BackendError::Stopped)));
    }

    #[test]
    fn a_silent_training_process_is_killed_at_its_step_timeout_plus_a_short_grace() {
        let req = TrainingRequest::from_spec(&gpuval_crds::TrainingCheck::default());
        let l = launch("/bin/false".into(), Vec::new(), &req);
        assert_eq!(l.silence_limit, req.timeout + crate::worker::SILENCE_GRACE);
        assert!(l.silence_limit <= req.timeout + Duration::from_secs(30));
    }

    #[test]
    fn the_job_crosses_the_process_boundary_whole() {
        let mut req = TrainingRequest::from_spec(&gpuval_crds::TrainingCheck::default());
        req.corrupt = Some(super::super::request::Corruption { gpu: 1, step: 5 });
        let job = Job {
            req,
            gpus: vec![crate::judge::testing::h200(1)],
            simulated: None,
        };
        let text = serde_json::to_string(&job).expect("json");
        let back: Job = serde_json::from_str(&text).expect("parse");
        assert_eq!(back.req, job.req);
        assert_eq!(back.gpus, job.gpus);
    }
}
