//! GPU work in a child process of the agent. NCCL reads its environment once per process, and
//! a process that NCCL leaves wedged (a rank stuck in communicator setup, which no abort can
//! reach from its own thread) can still be ended without harming the agent. The agent
//! re-executes itself with a hidden subcommand; the request goes in as JSON on stdin, progress
//! comes back as lines on stderr, the outcome as one JSON line on stdout.
//!
//! Both sides are here: [`supervise::run`] (the agent) and [`serve::main`] (the child). The
//! nccl check's sweep and the training check each run in one.

pub mod run_dir;
pub mod serve;
pub mod supervise;

use serde::{Deserialize, Serialize};

use crate::backend::BackendError;

/// Prefix of a child's progress lines on stderr.
const PROGRESS: &str = "gpuval-progress ";

/// The child's one line of output; an error crosses the process boundary whole.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reply<T> {
    outcome: Result<T, BackendError>,
}
