//! What to run, from a file in the API's own shape (a whole `GpuValidation`, its `spec`, or
//! just `checks`), overridden by command-line flags.

use std::path::Path;

use gpuval_crds::facts::Expect;
use gpuval_crds::{
    Checks, ComputeCheck, MemoryCheck, Profile, SeverityOverride, Thresholds, TopologyCheck,
};

use crate::checks;

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
    /// `expect` (GPU count, bus ids, modes).
    pub expect: Expect,
    /// `severityOverrides`.
    pub severity_overrides: Vec<SeverityOverride>,
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
            expect: Expect::default(),
            severity_overrides: Vec::new(),
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
    let value = yaml_value(text)?;
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
        expect: spec.expect_or_default(),
        severity_overrides: spec.severity_overrides,
        checks: spec.checks,
        thresholds: spec.thresholds.unwrap_or_default(),
    })
}

/// YAML (JSON is YAML) to a JSON value for the schema check. Duplicate keys are refused, alias
/// expansion is bounded, and booleans are read as kubectl reads a manifest (`yes` and `on` are
/// `true`), so a file means the same here as under `kubectl apply`. A mistake is one line that
/// ends with its position (`... at line 1, column 35`).
fn yaml_value(text: &str) -> Result<serde_json::Value, String> {
    serde_saphyr::from_str(text).map_err(|e: serde_saphyr::Error| {
        let message = e.render_with_options(serde_saphyr::render_options! {
            formatter: &serde_saphyr::UserMessageFormatter,
            snippets: serde_saphyr::SnippetMode::Off,
        });
        format!("not YAML or JSON: {message}")
    })
}

/// The same bounds the API server enforces (the CRD schema), for files used outside Kubernetes.
pub fn validate(s: &RunSettings) -> Result<(), String> {
    gpuval_crds::validate::check_settings(&s.checks, &s.thresholds).map_err(|e| e.to_string())
}

/// Command-line settings over the file's (or the defaults): which checks, each check's own
/// flags (declared in its folder), and the thresholds. Flattened into `gpuval-agent run`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Overrides {
    /// Run exactly these checks (comma-separated): topology, memory, compute, p2p,
    /// hostTransfer, nccl, training, io.
    #[arg(long, value_delimiter = ',')]
    pub checks: Option<Vec<String>>,
    #[command(flatten)]
    pub flags: checks::Flags,
    /// Model expectations: Auto, H100, H200, A100, None.
    #[arg(long, value_parser = parse_profile)]
    pub profile: Option<Profile>,
    /// Relative rule: a GPU more than this many percent below its peers fails.
    #[arg(long)]
    pub tolerance: Option<i32>,
    /// GPUs the host should show; another count fails the run before the checks.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=1024))]
    pub expect_gpus: Option<i32>,
}

/// A profile name as the API spells it, case-insensitive.
fn parse_profile(s: &str) -> Result<Profile, String> {
    [
        Profile::Auto,
        Profile::H100,
        Profile::H200,
        Profile::A100,
        Profile::None,
    ]
    .into_iter()
    .find(|p| format!("{p:?}").eq_ignore_ascii_case(s))
    .ok_or_else(|| format!("{s:?} is not a profile: use Auto, H100, H200, A100 or None"))
}

impl Overrides {
    pub fn apply(self, mut s: RunSettings) -> Result<RunSettings, String> {
        let Self {
            checks: names,
            flags,
            profile,
            tolerance,
            expect_gpus,
        } = self;
        if let Some(names) = &names {
            checks::select(&mut s.checks, names)?;
        }
        flags.apply(&mut s.checks)?;
        if let Some(p) = profile {
            s.thresholds.profile = p;
        }
        if let Some(t) = tolerance {
            s.thresholds.relative_tolerance_percent = t;
        }
        if expect_gpus.is_some() {
            s.expect.gpu_count = expect_gpus;
        }
        validate(&s)?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use gpuval_crds::Dtype;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        overrides: Overrides,
    }

    /// The overrides `gpuval-agent run` makes of these flags.
    fn flags(args: &[&str]) -> Overrides {
        Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
            .expect("valid flags")
            .overrides
    }

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
    fn expectations_and_overrides_come_from_the_file_and_the_count_from_a_flag() {
        let text = "checks: {memory: {}}\nexpect: {gpuCount: 8, migMode: Any}\nseverityOverrides: [{code: RowsRemapped, severity: Fail}]\n";
        let s = parse(text).unwrap();
        assert_eq!(s.expect.gpu_count, Some(8));
        assert_eq!(s.expect.mig_mode, gpuval_crds::facts::ModeExpectation::Any);
        assert_eq!(s.expect.ecc_mode, gpuval_crds::facts::ModeExpectation::On);
        assert_eq!(
            s.severity_overrides[0].code,
            gpuval_crds::Code::RowsRemapped
        );
        let s = flags(&["--expect-gpus", "4"]).apply(s).unwrap();
        assert_eq!(s.expect.gpu_count, Some(4));
        assert!(Cli::try_parse_from(["run", "--expect-gpus", "0"]).is_err());
        let e = parse("checks: {memory: {}}\nseverityOverrides: [{code: Nope, severity: Fail}]\n")
            .unwrap_err();
        assert!(
            e.contains("severityOverrides[0].code: unsupported value \"Nope\""),
            "{e}"
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
        let o = flags(&[
            "--checks",
            "io,memory",
            "--io-file-size-mib",
            "256",
            "--io-files",
            "8",
            "--io-concurrency",
            "2",
            "--io-buffered",
            "--io-min-write-mbps",
            "900",
        ]);
        let s = o.apply(RunSettings::default()).unwrap();
        let io = s.checks.io.unwrap();
        assert_eq!(
            (io.file_size_mib, io.files, io.concurrency, io.direct_io),
            (256, 8, 2, false)
        );
        assert_eq!((io.min_write_mbps, io.min_read_mbps), (Some(900), None));
        assert!(s.checks.compute.is_none());
        let bad = flags(&["--checks", "io", "--io-concurrency", "0"]);
        let err = bad.apply(RunSettings::default()).unwrap_err();
        assert!(err.contains("checks.io.concurrency"), "{err}");
    }

    /// The error `parse` gives for `text`, which must contain `want`.
    fn refused(text: &str, want: &str) -> String {
        let err = parse(text).unwrap_err();
        assert!(err.contains(want), "{text:?} gave {err:?}");
        err
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
            (
                "checks: {memory: {fraction: 0.5}, memory: {}}",
                "not YAML or JSON: duplicate mapping key `memory` is not allowed here at line 1, column 35",
            ),
            (
                "checks:\n  memory:\n    fraction: 0.5\n   passes: 2\n",
                "at line 4, column 4",
            ),
        ] {
            let err = refused(text, want);
            assert!(!err.contains('\n'), "one line: {err:?}");
        }
    }

    #[test]
    fn booleans_read_as_a_manifest_does() {
        for (word, direct) in [("no", false), ("off", false), ("yes", true), ("True", true)] {
            let s = parse(&format!("checks: {{io: {{directIo: {word}}}}}")).unwrap();
            assert_eq!(s.checks.io.unwrap().direct_io, direct, "{word}");
        }
    }

    #[test]
    fn alias_bombs_are_refused() {
        // Each level repeats the one below ten times: 10^8 nodes if expanded.
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..=8 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        text.push_str("checks: {memory: {}}\n");
        let err = parse(&text).unwrap_err();
        assert!(
            err.starts_with("not YAML or JSON: ") && err.contains("too large or too complex"),
            "{err}"
        );
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
            refused(text, want);
        }
        // A long bare-metal burn needs no deadline.
        let s = parse("checks: {compute: {duration: 24h}}").unwrap();
        assert_eq!(s.checks.compute.unwrap().duration.to_string(), "24h");
    }

    #[test]
    fn overrides_are_held_to_the_schema_bounds() {
        for (o, want) in [
            (
                flags(&["--checks", "compute", "--duration", "1s"]),
                "checks.compute.duration",
            ),
            (
                flags(&["--checks", "memory", "--memory-passes", "1001"]),
                "checks.memory.passes",
            ),
            (
                flags(&["--tolerance", "91"]),
                "thresholds.relativeTolerancePercent",
            ),
        ] {
            let err = o.apply(RunSettings::default()).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn overrides_select_checks_and_settings() {
        let o = flags(&[
            "--checks",
            "memory,compute",
            "--duration",
            "60s",
            "--dtypes",
            "bf16,tf32",
            "--memory-fraction",
            "0.5",
        ]);
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
        let bad = flags(&["--checks", "gpuburn"]);
        assert!(
            bad.apply(RunSettings::default())
                .unwrap_err()
                .contains("unknown check")
        );
    }
}
