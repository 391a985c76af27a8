//! The agent's NCCL engine, a library of the NCCL check, the training check and the fabric: a
//! sweep of collectives over this node's GPUs as ranks of one communicator (alone, or as a slot
//! of a larger world across nodes), run in a child process of the agent.
//!
//! - [`request`]: what to run ([`NcclRequest`], built from the check's spec or by the fabric);
//! - [`run`]: each sweep in a child process ([`crate::worker`]), which runs [`engine::run`]
//!   behind the hidden subcommand [`child::SUBCOMMAND`] ([`child::child_main`]); the
//!   simulated node's sweep takes the same way ([`run_with`]) and its child runs [`sim`]
//!   instead of the engine;
//! - [`engine`]: the ranks, the communicator ([`engine::comm`]: every failed NCCL call with the
//!   side its result and NCCL's words put it on), the verification kernels, hangs aborted;
//! - [`outcome`]: what a sweep measured and how it ended; [`bandwidth`]: bus and algorithm
//!   bandwidth as nccl-tests defines them; [`verify`]: every result checked on the GPU;
//!   [`transport`]: the transport NCCL chose, from its own log; [`library`]: finding
//!   `libnccl.so`.

pub mod bandwidth;
pub mod child;
pub mod engine;
pub mod library;
pub mod outcome;
pub mod request;
pub mod sim;
pub mod transport;
pub mod verify;

use std::path::Path;
use std::time::{Duration, Instant};

pub use outcome::NcclOutcome;
pub use request::NcclRequest;

use self::outcome::SweepOutcome;
use crate::backend::BackendError;
use crate::run_control::RunControl;
use crate::worker::run_dir::RunDir;
use crate::worker::silence_limit;
use crate::worker::supervise::{self, Launch};

const STOP_GRACE: Duration = Duration::from_secs(15);

/// How long a sweep process may say nothing before it is killed: the collective timeout plus
/// the request's setup allowance (the fabric's), else plus [`crate::worker::SILENCE_GRACE`].
fn sweep_silence_limit(req: &NcclRequest) -> Duration {
    match req.setup_allowance {
        Some(a) => req.sweep.timeout() + a,
        None => silence_limit(req.sweep.timeout()),
    }
}

/// Runs the check on real GPUs: the sweep with NCCL's default transports, then (when asked)
/// the same with peer-to-peer off, each in a child process of the agent
/// ([`crate::worker::agent_exe`]).
pub fn run(req: &NcclRequest, ctl: &RunControl<'_>) -> Result<NcclOutcome, BackendError> {
    let exe = crate::worker::agent_exe()?;
    let found = library::locate()?;
    run_with(&exe, &found, req, ctl)
}

/// [`run`] with the executable to start and the NCCL library it is to load: the simulated
/// node's sweep (`req.sweep.simulated`) takes this same way, with the library the simulator
/// stands for.
pub fn run_with(
    exe: &Path,
    found: &library::Found,
    req: &NcclRequest,
    ctl: &RunControl<'_>,
) -> Result<NcclOutcome, BackendError> {
    let started = Instant::now();
    let dir = RunDir::create("gpuval-nccl")?;
    if found.needs_link {
        library::make_link(found, dir.path())?;
    }
    tracing::info!(library = %found.describe(), ranks = req.gpus.len(), "NCCL check");
    let sweep = |label: &str, extra: &[(&str, &str)]| -> Result<SweepOutcome, BackendError> {
        let log = dir.path().join(format!("nccl-{label}.log"));
        let launch = Launch {
            exe: exe.to_path_buf(),
            subcommand: child::SUBCOMMAND,
            what: child::WHAT,
            env: sweep_env(req, found, dir.path(), &log, extra),
            silence_limit: sweep_silence_limit(req),
            stop_grace: STOP_GRACE,
        };
        let result: Result<SweepOutcome, _> = supervise::run(&launch, &req.sweep, ctl);
        let summary = std::fs::read_to_string(&log)
            .ok()
            .map(|text| transport::parse(&text));
        keep_log(req.log_dir.as_deref(), &log);
        match result {
            Ok(mut o) => {
                o.transport = summary;
                Ok(o)
            }
            Err(e) => Err(with_nccl_warning(e, summary.as_ref())),
        }
    };
    let main = sweep("default", &[]);
    let p2p_off =
        (req.transports && !ctl.stopped()).then(|| sweep("p2p-off", &[("NCCL_P2P_DISABLE", "1")]));
    Ok(NcclOutcome {
        gpus: req.gpus.iter().map(|g| g.index).collect(),
        library: Some(found.describe()),
        sweep: main,
        p2p_off,
        notes: req.notes.clone(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The sweep process's environment: its GPUs in rank order, NCCL's log to a file of this run,
/// the library link when one was made, and `extra`.
fn sweep_env(
    req: &NcclRequest,
    found: &library::Found,
    dir: &Path,
    log: &Path,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut env = library::child_env(req.gpus.iter().map(|g| g.uuid.as_str()), "INFO", log);
    if std::env::var_os("NCCL_DEBUG_SUBSYS").is_none() {
        env.push(("NCCL_DEBUG_SUBSYS".into(), "INIT,ENV".into()));
    }
    if found.needs_link {
        env.push(("LD_LIBRARY_PATH".into(), library::library_path_with(dir)));
    }
    env.extend(validation_env(&req.env));
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// The validation's NCCL variables that may be applied: a forbidden one (it loads code, names
/// a file or is the agent's own setting: the admission policy refuses those) is dropped with a
/// warning, so the agent's settings always win.
fn validation_env(env: &[(String, String)]) -> Vec<(String, String)> {
    env.iter()
        .filter(|(k, _)| match gpuval_crds::nccl_env::forbidden(k) {
            Some(why) => {
                tracing::warn!(name = %k, why, "NCCL variable from the validation not applied");
                false
            }
            None => true,
        })
        .cloned()
        .collect()
}

/// An error with NCCL's first logged warning added, where it logged one.
fn with_nccl_warning(
    e: BackendError,
    summary: Option<&transport::TransportSummary>,
) -> BackendError {
    match (e, summary.and_then(|s| s.warnings.first())) {
        (BackendError::Other(m), Some(w)) => BackendError::Other(format!("{m} (NCCL: {w})")),
        (BackendError::CollectiveSetup { message, side }, Some(w)) => {
            BackendError::CollectiveSetup {
                message: format!("{message} (NCCL: {w})"),
                side,
            }
        }
        (BackendError::Silent(m), Some(w)) => BackendError::Silent(format!("{m} (NCCL: {w})")),
        (BackendError::Hung(m), Some(w)) => BackendError::Hung(format!("{m} (NCCL: {w})")),
        (e, _) => e,
    }
}

fn keep_log(dir: Option<&Path>, log: &Path) {
    let (Some(dir), Some(name)) = (dir, log.file_name()) else {
        return;
    };
    if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::copy(log, dir.join(name))) {
        tracing::warn!(dir = %dir.display(), error = %e, "keeping the NCCL log failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::request::RankGpu;
    use gpuval_crds::NcclCheck;

    #[test]
    fn a_silent_sweep_is_killed_at_its_collective_timeout_plus_a_short_grace() {
        let spec = NcclCheck::default();
        let mut req = NcclRequest::from_spec(&spec, &[]);
        let timeout = req.sweep.timeout();
        assert_eq!(
            sweep_silence_limit(&req),
            timeout + crate::worker::SILENCE_GRACE
        );
        assert!(sweep_silence_limit(&req) <= timeout + Duration::from_secs(30));
        // The fabric's rounds give their own allowance.
        req.setup_allowance = Some(Duration::from_secs(30));
        assert_eq!(sweep_silence_limit(&req), timeout + Duration::from_secs(30));
    }

    #[test]
    fn the_agent_s_own_nccl_settings_win_over_the_validation_s() {
        let env = |k: &str| (k.to_string(), "x".to_string());
        let given = vec![
            env("NCCL_SOCKET_IFNAME"),
            env("NCCL_DEBUG"),
            env("NCCL_DEBUG_FILE"),
            env("NCCL_NET_PLUGIN"),
            env("NCCL_RUNTIME_CONNECT"),
        ];
        assert_eq!(validation_env(&given), vec![env("NCCL_SOCKET_IFNAME")]);
    }

    #[test]
    fn the_sweep_process_sees_its_gpus_and_nccl_logging() {
        let mut req = NcclRequest::from_spec(&NcclCheck::default(), &[]);
        req.gpus = vec![
            RankGpu {
                index: 3,
                uuid: "GPU-c".into(),
            },
            RankGpu {
                index: 1,
                uuid: "GPU-a".into(),
            },
        ];
        let found = library::Found {
            path: Some("/x/libnccl.so.2".into()),
            version: None,
            needs_link: true,
        };
        let env = sweep_env(
            &req,
            &found,
            Path::new("/run/d"),
            Path::new("/run/d/nccl-p2p-off.log"),
            &[("NCCL_P2P_DISABLE", "1")],
        );
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            get("CUDA_VISIBLE_DEVICES"),
            Some("GPU-c,GPU-a"),
            "rank order"
        );
        assert_eq!(get("NCCL_DEBUG"), Some("INFO"));
        assert_eq!(get("NCCL_DEBUG_FILE"), Some("/run/d/nccl-p2p-off.log"));
        assert_eq!(get("NCCL_P2P_DISABLE"), Some("1"));
        assert!(get("LD_LIBRARY_PATH").is_some_and(|p| p.starts_with("/run/d")));
    }
}
