//! The child's side: read the request from stdin, run the work, print the outcome.

use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{PROGRESS, Reply};
use crate::backend::BackendError;

/// How the work reports progress: share done (0..=1) and a note.
pub type Progress<'a> = &'a (dyn Fn(f64, &str) + Sync);

/// What the work does when a thread is stuck inside a host call that cannot be aborted from
/// its own thread (NCCL blocks the host while it connects to a peer): report what is known and
/// end the process, which frees the GPUs. Called at most once; it does not return.
pub type Bail<'a, T> = &'a (dyn Fn(Result<T, BackendError>) + Sync);

/// Runs `work` on the request read from stdin, with a stop flag that SIGTERM and SIGINT set,
/// and prints its outcome as one JSON line. `what` names the work in errors (`training`).
pub fn main<Req, Out>(
    what: &str,
    work: impl FnOnce(Req, &AtomicBool, Progress<'_>, Bail<'_, Out>) -> Result<Out, BackendError>,
) -> ExitCode
where
    Req: DeserializeOwned,
    Out: Serialize,
{
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            tracing::warn!(signal = sig, error = %e, "could not install a signal handler");
        }
    }
    let mut input = String::new();
    let outcome = std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| BackendError::Other(format!("read the {what} request: {e}")))
        .and_then(|_| {
            serde_json::from_str::<Req>(&input)
                .map_err(|e| BackendError::Other(format!("bad {what} request: {e}")))
        })
        .and_then(|req| {
            let progress = |done: f64, note: &str| eprintln!("{PROGRESS}{done:.4} {note}");
            // The first word, before any library loads: the supervisor's silence limit counts
            // from here.
            progress(0.0, &format!("{what} process started"));
            let bail = |outcome: Result<Out, BackendError>| {
                print_reply(what, &Reply { outcome });
                std::process::exit(0);
            };
            work(req, &stop, &progress, &bail)
        });
    if print_reply(what, &Reply { outcome }) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

/// Prints the reply line; false when it could not be encoded.
fn print_reply<T: Serialize>(what: &str, reply: &Reply<T>) -> bool {
    match serde_json::to_string(reply) {
        Ok(line) => {
            println!("{line}");
            true
        }
        Err(e) => {
            eprintln!("error: encode the {what} outcome: {e}");
            false
        }
    }
}
