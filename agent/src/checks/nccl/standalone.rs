//! The hidden `nccl-sweep` subcommand: without flags it is the sweep process the check starts
//! ([`child_main`]); with `--standalone` it runs the whole check on this host's GPUs and
//! prints its section (bench scripts and debugging, before the check is part of `run`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use gpuval_crds::{NcclCheck, NcclResult, Profile, TopologyReport, Verdict};

use super::args::NcclArgs;
use super::judge::{JudgeContext, errored, judge, skipped};
use super::request::NcclRequest;
use super::{child_main, render};
use crate::backend::cuda::CudaBackend;
use crate::backend::{Backend, BackendError, RunControl};

/// Flags of the hidden subcommand.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SweepArgs {
    /// Run the whole check on this host's GPUs and print it, instead of serving one sweep to
    /// the agent over stdin and stdout.
    #[arg(long)]
    pub standalone: bool,
    #[command(flatten)]
    pub nccl: NcclArgs,
    /// Only these GPUs (NVML indices, comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub gpus: Option<Vec<u32>>,
    /// Write the check's result as JSON here.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs the subcommand.
pub fn command(a: SweepArgs) -> ExitCode {
    if !a.standalone {
        return child_main();
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            tracing::warn!(signal = sig, error = %e, "could not install a signal handler");
        }
    }
    let spec = a.nccl.apply(Some(NcclCheck::default())).unwrap_or_default();
    let result = match standalone(&a, &spec, &stop) {
        Ok(r) => r,
        Err(e) => errored(&spec, &e),
    };
    print!("{}", render::section(&result));
    if let Some(line) = render::headline(&result) {
        eprintln!("headline: {line}");
    }
    if let Some(path) = &a.output {
        let written = serde_json::to_string_pretty(&result)
            .map_err(|e| e.to_string())
            .and_then(|j| std::fs::write(path, j).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!("error: write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    match result.verdict {
        Verdict::Pass | Verdict::Warn | Verdict::Skipped => ExitCode::SUCCESS,
        Verdict::Fail => ExitCode::from(1),
        Verdict::Error => ExitCode::from(2),
    }
}

fn standalone(
    a: &SweepArgs,
    spec: &NcclCheck,
    stop: &AtomicBool,
) -> Result<NcclResult, BackendError> {
    let backend = CudaBackend::new()?;
    let gpus: Vec<_> = backend
        .inventory()?
        .gpus
        .into_iter()
        .filter(|g| a.gpus.as_ref().is_none_or(|sel| sel.contains(&g.index)))
        .collect();
    if gpus.len() < 2 {
        return Ok(skipped(
            spec,
            &format!("{} GPU(s): collectives need at least two", gpus.len()),
        ));
    }
    let mut req = NcclRequest::from_spec(spec, &gpus);
    req.log_dir = a.nccl.log_dir.clone();
    let nvlink = backend
        .topology()
        .ok()
        .is_some_and(|snap| nvlink_between_all(&crate::topology::derive(&snap)));
    let profile = gpus
        .first()
        .and_then(|g| crate::profiles::profile_for(Profile::Auto, &g.name))
        .map(|p| p.name);
    let progress = |done: f64, note: &str| eprintln!("[nccl] {:>3.0}% {note}", done * 100.0);
    let ctl = RunControl::new(stop, &progress);
    let outcome = super::run(&req, &ctl)?;
    Ok(judge(
        &JudgeContext {
            spec,
            nvlink,
            profile,
        },
        &outcome,
    ))
}

/// True when every pair of GPUs in the topology is connected by NVLink (`NV#`).
pub fn nvlink_between_all(t: &TopologyReport) -> bool {
    let n = t.matrix.len();
    n > 1
        && (0..n).all(|i| {
            (0..n).all(|j| i == j || t.matrix[i].get(j).is_some_and(|c| c.starts_with("NV")))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvlink_everywhere_or_not() {
        let m = |cells: &[&[&str]]| TopologyReport {
            matrix: cells
                .iter()
                .map(|r| r.iter().map(|c| c.to_string()).collect())
                .collect(),
            ..Default::default()
        };
        assert!(nvlink_between_all(&m(&[&["X", "NV18"], &["NV18", "X"]])));
        assert!(!nvlink_between_all(&m(&[&["X", "SYS"], &["SYS", "X"]])));
        assert!(!nvlink_between_all(&m(&[&["X"]])));
    }
}
