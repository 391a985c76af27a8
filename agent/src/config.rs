//! What to run, from a file in the API's own shape (a whole `GpuValidation`, its `spec`, or
//! just `checks`), overridden by command-line flags.

use std::path::Path;

use gpuval_crds::{
    Checks, ComputeCheck, Dtype, Duration, MemoryCheck, Profile, Thresholds, TopologyCheck,
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
    // The CRD's own schema decides, field paths in every message (`checks.memory.fraction: ...`).
    let spec = gpuval_crds::validate::parse_settings(spec_value)
        .map_err(|e| format!("not a valid spec: {e}"))?;
    Ok(RunSettings {
        checks: spec.checks,
        thresholds: spec.thresholds.unwrap_or_default(),
    })
}

/// The same bounds the API server enforces (the CRD schema), for files used outside Kubernetes.
pub fn validate(s: &RunSettings) -> Result<(), String> {
    gpuval_crds::validate::check_settings(&s.checks, &s.thresholds).map_err(|e| e.to_string())
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
    fn file_errors_name_the_field_path() {
        for (text, want) in [
            (
                "checks: {memory: {fraction: abc}}",
                "checks.memory.fraction: must be of type number",
            ),
            (
                "spec: {checks: {p2p: {iterations: [1]}}}",
                "checks.p2p.iterations: must be of type integer",
            ),
            (
                "checks: {compute: {duration: 1s}}",
                "checks.compute.duration",
            ),
            (
                "checks: {compute: {duration: 169h}}",
                "checks.compute.duration",
            ),
            ("checks: {io: {files: 10001}}", "checks.io.files"),
            ("checks: {memory: {minGbps: 0}}", "checks.memory.minGbps"),
            (
                "checks: {topology: {minActiveLinks: 65}}",
                "checks.topology.minActiveLinks",
            ),
            (
                "checks: {memory: {}, gpuburn: {}}",
                "checks.gpuburn: unknown field",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(want), "{text:?} gave {err:?}");
        }
        // A long bare-metal burn needs no deadline.
        let s = parse("checks: {compute: {duration: 24h}}").unwrap();
        assert_eq!(s.checks.compute.unwrap().duration.to_string(), "24h");
    }

    #[test]
    fn overrides_are_held_to_the_schema_bounds() {
        for (o, want) in [
            (
                Overrides {
                    checks: Some(vec!["compute".into()]),
                    duration: Some("1s".parse().unwrap()),
                    ..Default::default()
                },
                "checks.compute.duration",
            ),
            (
                Overrides {
                    checks: Some(vec!["memory".into()]),
                    memory_passes: Some(1001),
                    ..Default::default()
                },
                "checks.memory.passes",
            ),
            (
                Overrides {
                    tolerance: Some(91),
                    ..Default::default()
                },
                "thresholds.relativeTolerancePercent",
            ),
        ] {
            let err = o.apply(RunSettings::default()).unwrap_err();
            assert!(err.contains(want), "{err}");
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
