//! The sweep runs in a child process of the agent ([`crate::worker`]): NCCL reads its
//! environment (`NCCL_DEBUG_FILE`, `NCCL_P2P_DISABLE`) once per process, and a process that
//! NCCL leaves wedged can still be ended without harming the agent. This is the child's side,
//! behind the hidden subcommand [`SUBCOMMAND`]: NCCL's engine, or the simulated node's sweep
//! where the request carries one ([`super::sim::sweep_process`]).

use std::process::ExitCode;

use super::engine;
use super::request::SweepRequest;

/// The hidden subcommand that runs one sweep.
pub const SUBCOMMAND: &str = "nccl-sweep";
/// The work, as errors name it ("the NCCL sweep process was killed").
pub const WHAT: &str = "NCCL sweep";

/// The child's side: reads the request from stdin, runs the sweep, prints the outcome.
pub fn child_main() -> ExitCode {
    crate::worker::serve::main(WHAT, |req: SweepRequest, stop, progress, bail| {
        match &req.simulated {
            Some(sim) => {
                let ctl = crate::run_control::RunControl::new(stop, progress);
                super::sim::sweep_process(sim, &req, &ctl)
            }
            None => engine::run(&req, stop, progress, bail),
        }
    })
}
