//! What to run, from a file in the API's own shape (a whole `GpuValidation`, its `spec`, or
//! just `checks`), overridden by command-line flags.

use std::path::Path;

use gpuval_crds::{
    Checks, ComputeCheck, Dtype, Duration, GpuValidationSpec, MemoryCheck, Profile, Thresholds,
    TopologyCheck,
};

/// A bad configuration file or flag, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Parse { path: String, why: String },
    #[error("{0}")]
    Invalid(String),
}

/// The settings a run takes.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSettings {
    pub checks: Checks,
    pub thresholds: Thresholds,
}

impl Default for RunSettings {
    /// Topology, memory (0.95 of free) and a 5-minute bf16 burn: the API's defaults.
    fn default() -> Self {
        Self {
            checks: Checks {
                topology: Some(TopologyCheck::default()),
                memory: Some(MemoryCheck::default()),
                compute: Some(ComputeCheck::default()),
                ..Default::default()
            },
            thresholds: Thresholds::default(),
        }
    }
}

/// Reads YAML or JSON: a GpuValidation (`spec:`), a spec (`checks:`), or a bare `checks` object.
pub fn load(path: &Path) -> Result<RunSettings, ConfigError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: p.clone(),
        source,
    })?;
    parse(&text).map_err(|why| ConfigError::Parse { path: p, why })
}

pub fn parse(text: &str) -> Result<RunSettings, String> {
    let value: serde_json::Value =
        serde_yaml::from_str(text).map_err(|e| format!("not YAML or JSON: {e}"))?;
    let spec_value = if let Some(spec) = value.get("spec") {
        spec.clone()
    } else if value.get("checks").is_some() {
        value
    } else {
        serde_json::json!({ "checks": value })
    };
    let spec: GpuValidationSpec =
        serde_json::from_value(spec_value).map_err(|e| format!("not a valid spec: {e}"))?;
    let settings = RunSettings {
        checks: spec.checks,
        thresholds: spec.thresholds.unwrap_or_default(),
    };
    validate(&settings)?;
    Ok(settings)
}

/// The same bounds the API server enforces (the CRD schema), for files used outside Kubernetes.
pub fn validate(s: &RunSettings) -> Result<(), String> {
    let c = &s.checks;
    if c.topology.is_none()
        && c.memory.is_none()
        && c.compute.is_none()
        && c.p2p.is_none()
        && c.host_transfer.is_none()
        && c.io.is_none()
    {
        return Err(
            "checks: enable at least one of topology, memory, compute, p2p, hostTransfer, io"
                .into(),
        );
    }
    if let Some(m) = &c.memory {
        if !(m.fraction > 0.0 && m.fraction <= 1.0) {
            return Err(format!(
                "checks.memory.fraction must be greater than 0 and at most 1 (got {})",
                m.fraction
            ));
        }
        if m.passes < 1 {
            return Err("checks.memory.passes must be at least 1".into());
        }
    }
    if let Some(k) = &c.compute {
        if k.duration.as_std() < std::time::Duration::from_secs(1) {
            return Err(format!(
                "checks.compute.duration must be at least 1s (got {})",
                k.duration
            ));
        }
        if k.dtypes.is_empty() {
            return Err(
                "checks.compute.dtypes must name at least one of bf16, fp16, tf32, fp32".into(),
            );
        }
        if k.matrix_size < 256 || k.matrix_size % 256 != 0 {
            return Err(format!(
                "checks.compute.matrixSize must be a multiple of 256, at least 256 (got {})",
                k.matrix_size
            ));
        }
    }
    if let Some(p) = &c.p2p {
        if !(1..=16384).contains(&p.buffer_mib) {
            return Err(format!(
                "checks.p2p.bufferMib must be between 1 and 16384 (got {})",
                p.buffer_mib
            ));
        }
        if !(1..=10000).contains(&p.iterations) {
            return Err(format!(
                "checks.p2p.iterations must be between 1 and 10000 (got {})",
                p.iterations
            ));
        }
    }
    if let Some(h) = &c.host_transfer {
        if !(1..=65536).contains(&h.buffer_mib) {
            return Err(format!(
                "checks.hostTransfer.bufferMib must be between 1 and 65536 (got {})",
                h.buffer_mib
            ));
        }
        if !h.pinned && !h.pageable {
            return Err("checks.hostTransfer needs pinned or pageable (or both) to be true".into());
        }
    }
    if let Some(io) = &c.io {
        if !(1..=1_048_576).contains(&io.file_size_mib) {
            return Err(format!(
                "checks.io.fileSizeMib must be between 1 and 1048576 (got {})",
                io.file_size_mib
            ));
        }
        if !(1..=10_000).contains(&io.files) {
            return Err(format!(
                "checks.io.files must be between 1 and 10000 (got {})",
                io.files
            ));
        }
        if !(1..=256).contains(&io.concurrency) {
            return Err(format!(
                "checks.io.concurrency must be between 1 and 256 (got {})",
                io.concurrency
            ));
        }
    }
    if !(1..=90).contains(&s.thresholds.relative_tolerance_percent) {
        return Err("thresholds.relativeTolerancePercent must be between 1 and 90".into());
    }
    Ok(())
}

/// Command-line overrides; each Some replaces the file's (or default's) value.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Exactly these checks (others removed); unknown names are an error.
    pub checks: Option<Vec<String>>,
    pub memory_fraction: Option<f64>,
    pub memory_passes: Option<i32>,
    pub duration: Option<Duration>,
    pub dtypes: Option<Vec<Dtype>>,
    pub matrix_size: Option<i32>,
    pub no_transcendentals: bool,
    pub p2p_buffer_mib: Option<i32>,
    pub p2p_iterations: Option<i32>,
    pub host_staged: bool,
    pub host_buffer_mib: Option<i32>,
    pub profile: Option<Profile>,
    pub tolerance: Option<i32>,
    pub io_file_size_mib: Option<i32>,
    pub io_files: Option<i32>,
    pub io_concurrency: Option<i32>,
    /// Buffered I/O instead of O_DIRECT.
    pub io_buffered: bool,
    pub io_during_compute: bool,
    pub io_min_write_mbps: Option<i32>,
    pub io_min_read_mbps: Option<i32>,
}

pub const CHECK_NAMES: [&str; 6] = ["topology", "memory", "compute", "p2p", "hostTransfer", "io"];

impl Overrides {
    pub fn apply(self, mut s: RunSettings) -> Result<RunSettings, String> {
        if let Some(names) = &self.checks {
            for n in names {
                if !CHECK_NAMES.iter().any(|c| c.eq_ignore_ascii_case(n)) {
                    return Err(format!(
                        "unknown check {n:?}: use {}",
                        CHECK_NAMES.join(", ")
                    ));
                }
            }
            let want = |name: &str| names.iter().any(|n| n.eq_ignore_ascii_case(name));
            let c = &mut s.checks;
            c.topology = if want("topology") {
                Some(c.topology.take().unwrap_or_default())
            } else {
                None
            };
            c.memory = if want("memory") {
                Some(c.memory.take().unwrap_or_default())
            } else {
                None
            };
            c.compute = if want("compute") {
                Some(c.compute.take().unwrap_or_default())
            } else {
                None
            };
            c.p2p = if want("p2p") {
                Some(c.p2p.take().unwrap_or_default())
            } else {
                None
            };
            c.host_transfer = if want("hostTransfer") {
                Some(c.host_transfer.take().unwrap_or_default())
            } else {
                None
            };
            c.io = if want("io") {
                Some(c.io.take().unwrap_or_default())
            } else {
                None
            };
        }
        if let Some(m) = s.checks.memory.as_mut() {
            if let Some(f) = self.memory_fraction {
                m.fraction = f;
            }
            if let Some(p) = self.memory_passes {
                m.passes = p;
            }
        }
        if let Some(k) = s.checks.compute.as_mut() {
            if let Some(d) = self.duration {
                k.duration = d;
            }
            if let Some(d) = self.dtypes {
                k.dtypes = d;
            }
            if let Some(n) = self.matrix_size {
                k.matrix_size = n;
            }
            if self.no_transcendentals {
                k.transcendentals = false;
            }
        }
        if let Some(p) = s.checks.p2p.as_mut() {
            if let Some(n) = self.p2p_buffer_mib {
                p.buffer_mib = n;
            }
            if let Some(n) = self.p2p_iterations {
                p.iterations = n;
            }
            if self.host_staged {
                p.host_staged = true;
            }
        }
        if let Some(h) = s.checks.host_transfer.as_mut()
            && let Some(n) = self.host_buffer_mib
        {
            h.buffer_mib = n;
        }
        if let Some(io) = s.checks.io.as_mut() {
            if let Some(v) = self.io_file_size_mib {
                io.file_size_mib = v;
            }
            if let Some(v) = self.io_files {
                io.files = v;
            }
            if let Some(v) = self.io_concurrency {
                io.concurrency = v;
            }
            if self.io_buffered {
                io.direct_io = false;
            }
            if self.io_during_compute {
                io.during_compute = true;
            }
            if let Some(v) = self.io_min_write_mbps {
                io.min_write_mbps = Some(v);
            }
            if let Some(v) = self.io_min_read_mbps {
                io.min_read_mbps = Some(v);
            }
        }
        if let Some(p) = self.profile {
            s.thresholds.profile = p;
        }
        if let Some(t) = self.tolerance {
            s.thresholds.relative_tolerance_percent = t;
        }
        validate(&s)?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_whole_validation_a_spec_or_bare_checks() {
        let whole = "apiVersion: gpuval.io/v1alpha1\nkind: GpuValidation\nmetadata: {name: q}\nspec:\n  checks:\n    memory: {fraction: 0.5}\n";
        let spec =
            "checks:\n  memory: {fraction: 0.5}\nthresholds: {relativeTolerancePercent: 20}\n";
        let bare = "{\"memory\": {\"fraction\": 0.5}}";
        for text in [whole, spec, bare] {
            let s = parse(text).unwrap();
            assert_eq!(s.checks.memory.as_ref().unwrap().fraction, 0.5, "{text}");
            assert!(s.checks.compute.is_none());
        }
        assert_eq!(
            parse(spec).unwrap().thresholds.relative_tolerance_percent,
            20
        );
    }

    #[test]
    fn the_example_manifests_load() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
        for f in ["quick.yaml", "standard.yaml", "burn-in-24h.yaml"] {
            load(&dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        }
    }

    #[test]
    fn io_flags_set_the_io_check() {
        let o = Overrides {
            checks: Some(vec!["io".into(), "memory".into()]),
            io_file_size_mib: Some(256),
            io_files: Some(8),
            io_concurrency: Some(2),
            io_buffered: true,
            io_min_write_mbps: Some(900),
            ..Default::default()
        };
        let s = o.apply(RunSettings::default()).unwrap();
        let io = s.checks.io.unwrap();
        assert_eq!(
            (io.file_size_mib, io.files, io.concurrency, io.direct_io),
            (256, 8, 2, false)
        );
        assert_eq!((io.min_write_mbps, io.min_read_mbps), (Some(900), None));
        assert!(s.checks.compute.is_none());
        let bad = Overrides {
            checks: Some(vec!["io".into()]),
            io_concurrency: Some(0),
            ..Default::default()
        };
        let err = bad.apply(RunSettings::default()).unwrap_err();
        assert!(err.contains("checks.io.concurrency"), "{err}");
    }

    #[test]
    fn bad_files_name_the_problem() {
        for (text, want) in [
            ("checks: {memory: {fraction: 1.5}}", "fraction"),
            ("checks: {}", "at least one"),
            ("checks: {compute: {dtypes: [fp8]}}", "fp8"),
            ("checks: {compute: {duration: -5m}}", "negative"),
            ("checks: {compute: {matrixSize: 1000}}", "multiple of 256"),
            (": : :", "not YAML"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(want), "{text:?} gave {err:?}");
        }
    }

    #[test]
    fn overrides_select_checks_and_settings() {
        let o = Overrides {
            checks: Some(vec!["memory".into(), "compute".into()]),
            duration: Some("60s".parse().unwrap()),
            dtypes: Some(vec![Dtype::Bf16, Dtype::Tf32]),
            memory_fraction: Some(0.5),
            ..Default::default()
        };
        let s = o.apply(RunSettings::default()).unwrap();
        assert!(s.checks.topology.is_none());
        assert_eq!(
            s.checks
                .compute
                .as_ref()
                .unwrap()
                .duration
                .as_std()
                .as_secs(),
            60
        );
        assert_eq!(
            s.checks.compute.as_ref().unwrap().dtypes,
            vec![Dtype::Bf16, Dtype::Tf32]
        );
        assert_eq!(s.checks.memory.as_ref().unwrap().fraction, 0.5);
        let bad = Overrides {
            checks: Some(vec!["gpuburn".into()]),
            ..Default::default()
        };
        assert!(
            bad.apply(RunSettings::default())
                .unwrap_err()
                .contains("unknown check")
        );
    }
}
