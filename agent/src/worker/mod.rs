//! GPU work in a child process of the agent. NCCL reads its environment once per process, and
//! a process that NCCL leaves wedged (a rank stuck in communicator setup, which no abort can
//! reach from its own thread) can still be ended without harming the agent. The agent
//! re-executes itself with a hidden subcommand; the request goes in as JSON on stdin, progress
//! comes back as lines on stderr, the outcome as one JSON line on stdout.
//!
//! Both sides are here: [`supervise::run`] (the agent) and [`serve::main`] (the child). The
//! nccl check's sweep and the training check each run in one, on real GPUs and on the simulated
//! node alike, each with its private [`run_dir::RunDir`] under the temporary directory.
//! [`agent_exe`] is the executable a child runs: this process's own, unless a process that is
//! not the agent (an integration test) named the agent's binary with [`use_agent_exe`].

pub mod run_dir;
pub mod serve;
pub mod supervise;

use std::path::PathBuf;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::backend::BackendError;

/// The executable every child process runs, where [`use_agent_exe`] set one.
static AGENT_EXE: OnceLock<PathBuf> = OnceLock::new();

/// Starts every child process of this process from `exe`, the agent's binary, instead of this
/// process's own executable: for a process that runs the agent's checks through the library
/// but is not the agent (an integration test, whose executable knows no hidden subcommand).
/// Set once, before the first child starts; a later call with another path is refused with
/// the path in force.
pub fn use_agent_exe(exe: PathBuf) -> Result<(), PathBuf> {
    let set = AGENT_EXE.get_or_init(|| exe.clone());
    if *set == exe {
        Ok(())
    } else {
        Err(set.clone())
    }
}

/// The executable a child process runs: the one [`use_agent_exe`] named, else this process's
/// own.
pub fn agent_exe() -> Result<PathBuf, BackendError> {
    if let Some(exe) = AGENT_EXE.get() {
        return Ok(exe.clone());
    }
    std::env::current_exe()
        .map_err(|e| BackendError::Other(format!("find the agent's own executable: {e}")))
}

/// Prefix of a child's progress lines on stderr.
const PROGRESS: &str = "gpuval-progress ";

/// How long a child may stay silent beyond its check's own timeout before it is killed. The
/// child says something at every stage (started, libraries and kernels ready, communicator
/// setup, each step), and its own watchdog ends a host call stuck for the timeout plus 5 s:
/// a child that says nothing for longer has stopped answering (stopped, wedged in the
/// driver, swapped out), and waiting the old two minutes for it only held the GPUs.
pub const SILENCE_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

/// The silence limit of a child whose work has this timeout: the timeout plus
/// [`SILENCE_GRACE`].
pub fn silence_limit(timeout: std::time::Duration) -> std::time::Duration {
    timeout + SILENCE_GRACE
}

/// The child's one line of output; an error crosses the process boundary whole.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reply<T> {
    outcome: Result<T, BackendError>,
}
