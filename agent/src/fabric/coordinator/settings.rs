//! The fabric settings of `gpuval-agent fabric`: `--settings FILE` (a `fabric:` section in the
//! API's shape, held to the CRD's bounds) overridden by flags.

use std::path::{Path, PathBuf};

use gpuval_crds::Duration;
use gpuval_crds::fabric::{FabricNccl, FabricSpec, FabricTcp};
use gpuval_crds::nccl::Collective;

/// The flags of `gpuval-agent fabric` (the backend flags are the binary's own).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct FabricArgs {
    /// Settings file (YAML or JSON) with a `fabric:` section as in a GpuValidation's spec
    /// (`spec.fabric` of a whole GpuValidation also works); flags override it.
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// NCCL groups, with this lowest acceptable bus bandwidth (GB/s).
    #[arg(long, value_name = "GBPS")]
    pub nccl_min_bus_gbps: Option<i32>,
    /// NCCL message size in bytes (default 1 GiB).
    #[arg(long, value_name = "BYTES")]
    pub nccl_bytes: Option<i64>,
    /// TCP pairs with the default settings (any --tcp-* flag also turns them on).
    #[arg(long)]
    pub tcp: bool,
    /// TCP: parallel streams each way (default 4).
    #[arg(long, value_name = "N")]
    pub tcp_streams: Option<i32>,
    /// TCP: how long each direction is measured, e.g. `5s` (default 5s).
    #[arg(long, value_name = "DURATION")]
    pub tcp_duration: Option<Duration>,
    /// TCP: lowest acceptable throughput each way, Gb/s.
    #[arg(long, value_name = "GBPS")]
    pub tcp_min_gbps: Option<f64>,
    /// TCP: highest acceptable median round trip of a 64-byte message, microseconds.
    #[arg(long, value_name = "MICROS")]
    pub tcp_max_latency_us: Option<i32>,
    /// One screening round only: a failing group fails the fabric without naming a node.
    #[arg(long)]
    pub no_localize: bool,
    /// The longest one round may take, e.g. `2m` (default 5m).
    #[arg(long, value_name = "DURATION")]
    pub round_timeout: Option<Duration>,
    /// Rank 0's control port under Slurm (torchrun launches use MASTER_PORT).
    #[arg(long, env = "GPUVAL_FABRIC_PORT", value_name = "PORT")]
    pub port: Option<u16>,
    /// This rank's node name in the report (default: the host name).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// How long rank 0 waits for every rank to register, e.g. `30s` (default 2m).
    #[arg(long, value_name = "DURATION")]
    pub register_timeout: Option<Duration>,
    /// Write the JSON report here (rank 0).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

impl FabricArgs {
    /// The settings in force, held to the CRD's bounds.
    pub fn spec(&self) -> Result<FabricSpec, String> {
        let base = match &self.settings {
            Some(p) => load(p)?,
            None => FabricSpec::default(),
        };
        let spec = self.apply(base)?;
        check(&spec)?;
        Ok(spec)
    }

    /// How long rank 0 waits for every rank to register.
    pub fn register_timeout(&self) -> std::time::Duration {
        self.register_timeout
            .map_or(std::time::Duration::from_secs(120), |d| d.as_std())
    }

    fn apply(&self, mut spec: FabricSpec) -> Result<FabricSpec, String> {
        if let Some(min) = self.nccl_min_bus_gbps {
            let n = spec.nccl.get_or_insert_with(|| default_nccl(min));
            n.min_bus_bandwidth_gbps = min;
        }
        if let Some(bytes) = self.nccl_bytes {
            let n = spec.nccl.as_mut().ok_or(
                "--nccl-bytes needs NCCL groups: give --nccl-min-bus-gbps (or nccl in --settings)",
            )?;
            n.bytes = bytes;
        }
        let tcp_flags = self.tcp
            || self.tcp_streams.is_some()
            || self.tcp_duration.is_some()
            || self.tcp_min_gbps.is_some()
            || self.tcp_max_latency_us.is_some();
        if tcp_flags {
            let t = spec.tcp.get_or_insert_with(default_tcp);
            if let Some(s) = self.tcp_streams {
                t.streams = s;
            }
            if let Some(d) = self.tcp_duration {
                t.duration = d;
            }
            if self.tcp_min_gbps.is_some() {
                t.min_gbps = self.tcp_min_gbps;
            }
            if self.tcp_max_latency_us.is_some() {
                t.max_latency_micros = self.tcp_max_latency_us;
            }
        }
        if self.no_localize {
            spec.localize = Some(false);
        }
        if self.round_timeout.is_some() {
            spec.round_timeout = self.round_timeout;
        }
        if spec.nccl.is_none() && spec.tcp.is_none() {
            return Err(
                "nothing to measure: give --nccl-min-bus-gbps GBPS (NCCL groups), \
                        --tcp (TCP pairs), or both, or a --settings file with a fabric section"
                    .into(),
            );
        }
        Ok(spec)
    }
}

fn default_nccl(min: i32) -> FabricNccl {
    FabricNccl {
        collective: Collective::AllReduce,
        bytes: 1 << 30,
        iterations: 20,
        min_bus_bandwidth_gbps: min,
        expect_transport: None,
        rails: Vec::new(),
    }
}

fn default_tcp() -> FabricTcp {
    FabricTcp {
        streams: 4,
        duration: Duration::from_secs(5),
        min_gbps: None,
        max_latency_micros: None,
    }
}

/// Reads the `fabric:` section of a settings file (or of a GpuValidation's `spec`).
fn load(path: &Path) -> Result<FabricSpec, String> {
    let p = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {p}: {e}"))?;
    let value: serde_json::Value =
        serde_saphyr::from_str(&text).map_err(|e| format!("{p}: not YAML or JSON: {e}"))?;
    let fabric = value
        .get("spec")
        .unwrap_or(&value)
        .get("fabric")
        .cloned()
        .ok_or_else(|| format!("{p}: no fabric section (expected `fabric:` at the top)"))?;
    let spec = gpuval_crds::validate::parse_settings(within_spec(fabric))
        .map_err(|e| format!("{p}: {e}"))?;
    spec.fabric
        .ok_or_else(|| format!("{p}: the fabric section is empty"))
}

/// A spec holding `fabric` for the schema check, which validates whole specs: with one check
/// (never run by this command) for the rule that a spec checks something.
fn within_spec(fabric: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "checks": { "topology": {} }, "fabric": fabric })
}

/// Holds settings (after the flags) to the bounds the API server enforces.
fn check(spec: &FabricSpec) -> Result<(), String> {
    let value = serde_json::to_value(spec).map_err(|e| e.to_string())?;
    gpuval_crds::validate::parse_settings(within_spec(value))
        .map(drop)
        .map_err(|e| format!("fabric settings: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> FabricArgs {
        FabricArgs::default()
    }

    #[test]
    fn flags_make_the_spec() {
        let a = FabricArgs {
            nccl_min_bus_gbps: Some(350),
            tcp_min_gbps: Some(10.0),
            no_localize: true,
            ..args()
        };
        let s = a.spec().expect("valid");
        assert_eq!(s.nccl.map(|n| n.min_bus_bandwidth_gbps), Some(350));
        let t = s.tcp.expect("tcp on");
        assert_eq!((t.streams, t.min_gbps), (4, Some(10.0)));
        assert_eq!(s.localize, Some(false));
    }

    #[test]
    fn nothing_to_measure_and_out_of_bounds_flags_are_refused() {
        let e = args().spec().expect_err("nothing to measure");
        assert!(e.contains("nothing to measure"), "{e}");
        let a = FabricArgs {
            tcp_streams: Some(500),
            ..args()
        };
        let e = a.spec().expect_err("500 streams");
        assert!(e.contains("streams"), "{e}");
        let a = FabricArgs {
            tcp: true,
            round_timeout: Some(Duration::from_secs(1)),
            ..args()
        };
        let e = a.spec().expect_err("1s round timeout");
        assert!(e.contains("roundTimeout"), "{e}");
    }

    #[test]
    fn a_settings_file_is_read_and_held_to_the_bounds() {
        let dir = tempfile::tempdir().expect("temp dir");
        let good = dir.path().join("good.yaml");
        let text = "fabric:\n  nccl:\n    minBusBandwidthGbps: 300\n  tcp:\n    streams: 2\n";
        std::fs::write(&good, text).expect("write");
        let a = FabricArgs {
            settings: Some(good),
            nccl_min_bus_gbps: Some(350),
            ..args()
        };
        let s = a.spec().expect("valid");
        assert_eq!(s.nccl.map(|n| n.min_bus_bandwidth_gbps), Some(350));
        assert_eq!(s.tcp.map(|t| t.streams), Some(2));
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "fabric:\n  nccl:\n    minBusBandwidthGbps: 0\n").expect("write");
        let a = FabricArgs {
            settings: Some(bad),
            ..args()
        };
        let e = a.spec().expect_err("a floor of 0");
        assert!(e.contains("minBusBandwidthGbps"), "{e}");
    }
}
