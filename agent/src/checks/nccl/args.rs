//! The check's command-line flags (flattened into `gpuval-agent run`): each overrides the
//! same field of the spec's `checks.nccl`; any of them turns the check on.

use std::path::PathBuf;

use gpuval_crds::{Collective, Duration, NcclCheck, NcclDtype};

/// NCCL check flags.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct NcclArgs {
    /// NCCL: collectives (comma-separated): allReduce, allGather, reduceScatter, broadcast, allToAll.
    #[arg(long = "nccl-collectives", value_delimiter = ',')]
    pub collectives: Option<Vec<Collective>>,
    /// NCCL: smallest size, bytes (suffixes K, M, G: 8, 1M, 4G).
    #[arg(long = "nccl-min-bytes", value_parser = parse_bytes)]
    pub min_bytes: Option<i64>,
    /// NCCL: largest size, bytes (default 4G where GPU memory allows).
    #[arg(long = "nccl-max-bytes", value_parser = parse_bytes)]
    pub max_bytes: Option<i64>,
    /// NCCL: each size is the previous times this.
    #[arg(long = "nccl-step-factor")]
    pub step_factor: Option<i32>,
    /// NCCL: timed iterations per size.
    #[arg(long = "nccl-iterations")]
    pub iterations: Option<i32>,
    /// NCCL: untimed iterations before them.
    #[arg(long = "nccl-warmup")]
    pub warmup: Option<i32>,
    /// NCCL: element type, bf16 or fp32.
    #[arg(long = "nccl-dtype")]
    pub dtype: Option<NcclDtype>,
    /// NCCL: a batch of collectives not done after this is aborted (like 60s).
    #[arg(long = "nccl-timeout")]
    pub timeout: Option<Duration>,
    /// NCCL: also run the sweep with peer-to-peer off (NCCL_P2P_DISABLE=1).
    #[arg(long = "nccl-transports")]
    pub transports: bool,
    /// NCCL: fail below this bus bandwidth at the largest size, GB/s.
    #[arg(long = "nccl-min-busbw")]
    pub min_busbw: Option<i32>,
    /// NCCL: fail above this time per collective at the smallest size, microseconds.
    #[arg(long = "nccl-max-small-latency-us")]
    pub max_small_latency_us: Option<i32>,
    /// NCCL: keep NCCL's own logs (NCCL_DEBUG=INFO) in this directory.
    #[arg(long = "nccl-log-dir", value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
}

impl NcclArgs {
    /// True when any flag that changes the check was given.
    pub fn any(&self) -> bool {
        let NcclArgs {
            collectives,
            min_bytes,
            max_bytes,
            step_factor,
            iterations,
            warmup,
            dtype,
            timeout,
            transports,
            min_busbw,
            max_small_latency_us,
            log_dir: _,
        } = self;
        collectives.is_some()
            || min_bytes.is_some()
            || max_bytes.is_some()
            || step_factor.is_some()
            || iterations.is_some()
            || warmup.is_some()
            || dtype.is_some()
            || timeout.is_some()
            || *transports
            || min_busbw.is_some()
            || max_small_latency_us.is_some()
    }

    /// The spec's section with the flags applied; a flag with no section starts from the
    /// defaults.
    pub fn apply(&self, base: Option<NcclCheck>) -> Option<NcclCheck> {
        if base.is_none() && !self.any() {
            return None;
        }
        let mut c = base.unwrap_or_default();
        if let Some(v) = &self.collectives {
            c.collectives = v.clone();
        }
        c.min_bytes = self.min_bytes.unwrap_or(c.min_bytes);
        c.max_bytes = self.max_bytes.or(c.max_bytes);
        c.step_factor = self.step_factor.unwrap_or(c.step_factor);
        c.iterations = self.iterations.unwrap_or(c.iterations);
        c.warmup_iterations = self.warmup.unwrap_or(c.warmup_iterations);
        c.dtype = self.dtype.unwrap_or(c.dtype);
        c.timeout = self.timeout.unwrap_or(c.timeout);
        c.transports |= self.transports;
        c.min_bus_bandwidth_gbps = self.min_busbw.or(c.min_bus_bandwidth_gbps);
        c.max_small_latency_micros = self.max_small_latency_us.or(c.max_small_latency_micros);
        Some(c)
    }
}

/// `--nccl-log-dir`, as parsed into `given`: where NCCL's own logs are kept.
pub fn log_dir(given: &clap::ArgMatches) -> Option<PathBuf> {
    <NcclArgs as clap::FromArgMatches>::from_arg_matches(given)
        .ok()
        .and_then(|a| a.log_dir)
}

/// `4G` → 4294967296: a count of bytes with an optional binary suffix (K, M, G, T; `KiB` and
/// `KB` read the same).
pub fn parse_bytes(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let n: i64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 8, 256M or 4G"))?;
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches('B')
        .trim_end_matches('I')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{s:?}: unknown unit (use K, M, G or T)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        nccl: NcclArgs,
    }

    #[test]
    fn sizes_read_like_nccl_tests_flags() {
        assert_eq!(parse_bytes("8"), Ok(8));
        assert_eq!(parse_bytes("4G"), Ok(4 << 30));
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("1kb"), Ok(1024));
        assert!(parse_bytes("4X").is_err());
        assert!(parse_bytes("G").is_err());
    }

    #[test]
    fn flags_override_the_spec_and_turn_the_check_on() {
        let cli = Cli::try_parse_from([
            "x",
            "--nccl-collectives",
            "allReduce,allGather",
            "--nccl-max-bytes",
            "1G",
            "--nccl-dtype",
            "fp32",
            "--nccl-timeout",
            "5s",
            "--nccl-transports",
        ])
        .expect("flags parse");
        let c = cli.nccl.apply(None).expect("the check is on");
        assert_eq!(
            c.collectives,
            [Collective::AllReduce, Collective::AllGather]
        );
        assert_eq!(
            (c.max_bytes, c.dtype, c.transports),
            (Some(1 << 30), NcclDtype::Fp32, true)
        );
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert_eq!(c.iterations, 20, "defaults stay");
        let none = Cli::try_parse_from(["x"]).expect("no flags");
        assert_eq!(none.nccl.apply(None), None);
        let base = NcclCheck {
            iterations: 7,
            ..Default::default()
        };
        assert_eq!(none.nccl.apply(Some(base.clone())), Some(base));
    }
}
