//! What the plugin says and how it exits, as kubectl does: an API error reads
//! `Error from server (NotFound): gpuvalidations.gpuval.io "x" not found`, a closed pipe
//! (`| head`) ends the command quietly, and the exit code says how the run went.

use gpuval_crds::spec::NodeName;
use gpuval_crds::{GpuValidation, GpuValidationSpec, Phase};

/// Exit code: the command worked and the run passed (or is not finished, for `status`).
pub const OK: u8 = 0;
/// Exit code: the run failed (`status`, `wait`, `report --exit-code`) or `diff` found
/// something worse.
pub const FAILED: u8 = 1;
/// Exit code: the command could not do its work (a bad flag, no cluster, an API error).
pub const ERROR: u8 = 2;
/// Exit code: the validation (or certificate) named does not exist.
pub const NOT_FOUND: u8 = 3;
/// Exit code: `wait` reached its `--timeout` before the run had its verdict.
pub const TIMED_OUT: u8 = 4;

/// `wait` ran out of time: its own exit code ([`TIMED_OUT`]), so a gate script can tell a slow
/// run from a failed one.
#[derive(Debug, thiserror::Error)]
#[error("timed out waiting for gpuvalidation/{name} to pass or fail ({seconds}s; --timeout)")]
pub struct TimedOut {
    pub name: String,
    pub seconds: u64,
}

/// The exit code of a command that ended in error `e`: [`NOT_FOUND`] when the API server said
/// 404, [`TIMED_OUT`] for `wait`'s timeout, else [`ERROR`].
pub fn exit_for_error(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.downcast_ref::<TimedOut>().is_some() {
            return TIMED_OUT;
        }
        if let Some(kube::Error::Api(status)) = cause.downcast_ref::<kube::Error>()
            && status.code == 404
        {
            return NOT_FOUND;
        }
    }
    ERROR
}

/// What to print for error `e` on stderr, as kubectl words it; None for a closed stdout (the
/// reader went away: nothing to say).
pub fn error_message(e: &anyhow::Error) -> Option<String> {
    for cause in e.chain() {
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::BrokenPipe
        {
            return None;
        }
        if let Some(kube::Error::Api(status)) = cause.downcast_ref::<kube::Error>() {
            let reason = if status.reason.is_empty() {
                status.code.to_string()
            } else {
                status.reason.clone()
            };
            return Some(format!("Error from server ({reason}): {}", status.message));
        }
    }
    Some(format!("error: {e:#}"))
}

/// `--timeout` as kubectl takes it: a duration (`90s`, `5m`, `1h30m`), or whole seconds.
pub fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    if let Ok(secs) = s.trim().parse::<u64>() {
        return Ok(std::time::Duration::from_secs(secs));
    }
    s.parse::<gpuval_crds::duration::Duration>()
        .map(|d| d.as_std())
        .map_err(|e| format!("{e} (a duration like 90s, 5m or 1h30m, or whole seconds)"))
}

/// What `wait` prints once the run settled: `gpuvalidation.gpuval.io/NAME Failed: why`.
pub fn settled_line(gv: &GpuValidation) -> String {
    let name = gv.metadata.name.as_deref().unwrap_or_default();
    let status = gv.status.as_ref();
    let phase = status
        .and_then(|s| s.phase)
        .map_or("Pending", |p| p.as_str());
    match status.and_then(crate::ready_message) {
        Some(m) if phase != "Passed" => format!("gpuvalidation.gpuval.io/{name} {phase}: {m}\n"),
        _ => format!("gpuvalidation.gpuval.io/{name} {phase}\n"),
    }
}

/// Where `report` may write what: HTML to a terminal is refused unless asked for by name
/// (Markdown, readable there, is written instead when no format was named).
pub fn report_format(
    asked: Option<ReportFormat>,
    to_terminal: bool,
) -> Result<ReportFormat, String> {
    match (asked, to_terminal) {
        (Some(ReportFormat::Html), true) => Err(
            "refusing to write an HTML page to a terminal: write it to a file (-f report.html), \
             or read it here as Markdown (-o markdown)"
                .into(),
        ),
        (Some(f), _) => Ok(f),
        (None, true) => Ok(ReportFormat::Markdown),
        (None, false) => Ok(ReportFormat::Html),
    }
}

/// `report -o`: a format, as kubectl's `-o` is. A file name there is refused with the flag that
/// takes it (`-f`).
pub fn parse_report_format(s: &str) -> Result<ReportFormat, String> {
    match s.to_ascii_lowercase().as_str() {
        "html" => Ok(ReportFormat::Html),
        "markdown" | "md" => Ok(ReportFormat::Markdown),
        "json" => Ok(ReportFormat::Json),
        "junit" => Ok(ReportFormat::Junit),
        _ if s.contains('.') || s.contains('/') => Err(format!(
            "-o takes a format (html, markdown, json or junit), not a file: write the report to a file with -f {s}"
        )),
        _ => Err("-o takes html, markdown, json or junit".into()),
    }
}

/// The format a report file is written in: its extension's (`.html`/`.htm`, `.md`/`.markdown`,
/// `.json`, `.xml` for JUnit), which `-o` may name too but not contradict; with another
/// extension, or none, `-o` must say.
pub fn file_format(
    path: &std::path::Path,
    asked: Option<ReportFormat>,
) -> Result<ReportFormat, String> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let by_name = match ext.as_deref() {
        Some("html" | "htm") => Some(ReportFormat::Html),
        Some("md" | "markdown") => Some(ReportFormat::Markdown),
        Some("json") => Some(ReportFormat::Json),
        Some("xml") => Some(ReportFormat::Junit),
        _ => None,
    };
    match (by_name, asked) {
        (Some(f), None) => Ok(f),
        (Some(f), Some(a)) if f == a => Ok(f),
        (Some(f), Some(a)) => Err(format!(
            "{} names {} but -o asks for {}: drop -o, or give the file the format's extension",
            path.display(),
            f.name(),
            a.name()
        )),
        (None, Some(a)) => Ok(a),
        (None, None) => Err(format!(
            "cannot tell the format from {}: end it in .html, .md, .json or .xml (JUnit), or name the format with -o",
            path.display()
        )),
    }
}

/// The formats `report` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportFormat {
    Html,
    Markdown,
    Json,
    /// JUnit XML, for CI systems.
    Junit,
}

impl ReportFormat {
    /// As `-o` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Html => "html",
            Self::Markdown => "markdown",
            Self::Json => "json",
            Self::Junit => "junit",
        }
    }
}

/// The exit code of a run in `phase`: [`FAILED`] once it failed, else [`OK`].
pub fn exit_for(phase: Option<Phase>) -> u8 {
    if phase == Some(Phase::Failed) {
        FAILED
    } else {
        OK
    }
}

/// The verdict `wait` returns on, once the status describes the current spec: Some(exit code)
/// when the run is Passed ([`OK`]) or Failed ([`FAILED`]); None while it goes on.
pub fn settled(gv: &GpuValidation) -> Option<u8> {
    let status = gv.status.as_ref()?;
    if status.observed_generation != gv.metadata.generation {
        return None;
    }
    match status.phase? {
        Phase::Passed => Some(OK),
        Phase::Failed => Some(FAILED),
        Phase::Pending | Phase::Running => None,
    }
}

/// The validation `rerun` creates from `gv`: the same spec as a new object named
/// `<name>-<suffix>` by the API server (so the two runs can be diffed), on `nodes` only where
/// any are named.
pub fn rerun_of(gv: &GpuValidation, nodes: &[String]) -> GpuValidation {
    let name = gv.metadata.name.clone().unwrap_or_default();
    let mut spec: GpuValidationSpec = gv.spec.clone();
    if !nodes.is_empty() {
        spec.node_names = nodes.iter().map(|n| NodeName(n.clone())).collect();
    }
    let mut new = GpuValidation::new("", spec);
    new.metadata.name = None;
    new.metadata.generate_name = Some(format!("{name}-"));
    new.metadata.labels = Some([(RERUN_OF.to_string(), name)].into());
    new
}

/// The label a rerun carries: the name of the validation it repeats.
pub const RERUN_OF: &str = "gpuval.io/rerun-of";

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::GpuValidationStatus;
    use kube::core::response::Status;

    fn gv(generation: i64, observed: i64, phase: Option<Phase>) -> GpuValidation {
        let spec: GpuValidationSpec =
            serde_json::from_value(serde_json::json!({"checks": {"memory": {}}})).expect("spec");
        let mut g = GpuValidation::new("quick", spec);
        g.metadata.generation = Some(generation);
        g.status = Some(GpuValidationStatus {
            observed_generation: Some(observed),
            phase,
            ..Default::default()
        });
        g
    }

    #[test]
    fn api_errors_read_as_kubectl_writes_them_and_a_closed_pipe_is_quiet() {
        let status = Status::failure("gpuvalidations.gpuval.io \"nosuch\" not found", "NotFound")
            .with_code(404);
        let e = anyhow::Error::new(kube::Error::Api(Box::new(status)))
            .context("reading GpuValidation \"nosuch\"");
        assert_eq!(
            error_message(&e).as_deref(),
            Some("Error from server (NotFound): gpuvalidations.gpuval.io \"nosuch\" not found")
        );
        let pipe = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing to stdout");
        assert_eq!(error_message(&pipe), None);
        let other = anyhow::anyhow!("no Kubernetes client");
        assert_eq!(
            error_message(&other).as_deref(),
            Some("error: no Kubernetes client")
        );
    }

    #[test]
    fn wait_settles_only_on_a_verdict_of_the_current_spec() {
        assert_eq!(settled(&gv(2, 2, Some(Phase::Passed))), Some(OK));
        assert_eq!(settled(&gv(2, 2, Some(Phase::Failed))), Some(FAILED));
        assert_eq!(settled(&gv(2, 2, Some(Phase::Running))), None);
        assert_eq!(
            settled(&gv(3, 2, Some(Phase::Failed))),
            None,
            "an edited spec's old verdict does not count"
        );
        assert_eq!(exit_for(Some(Phase::Failed)), FAILED);
        assert_eq!(exit_for(Some(Phase::Running)), OK);
    }

    #[test]
    fn timeouts_are_durations_as_kubectl_takes_them_or_whole_seconds() {
        use std::time::Duration;
        assert_eq!(parse_timeout("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_timeout("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_timeout("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_timeout("1800"), Ok(Duration::from_secs(1800)));
        let e = parse_timeout("5 minutes").expect_err("not a duration");
        assert!(
            e.ends_with("(a duration like 90s, 5m or 1h30m, or whole seconds)"),
            "{e}"
        );
    }

    #[test]
    fn html_never_goes_to_a_terminal_unless_a_file_takes_it() {
        use ReportFormat::*;
        assert_eq!(report_format(None, true), Ok(Markdown));
        assert_eq!(report_format(None, false), Ok(Html));
        assert_eq!(report_format(Some(Json), true), Ok(Json));
        assert_eq!(report_format(Some(Html), false), Ok(Html));
        let e = report_format(Some(Html), true).expect_err("refused");
        assert!(e.contains("-f report.html"), "{e}");
    }

    #[test]
    fn o_takes_a_format_and_a_files_extension_is_honoured_or_refused() {
        use ReportFormat::*;
        use std::path::Path;
        assert_eq!(parse_report_format("html"), Ok(Html));
        assert_eq!(parse_report_format("Markdown"), Ok(Markdown));
        assert_eq!(parse_report_format("md"), Ok(Markdown));
        let e = parse_report_format("report.html").expect_err("a file");
        assert!(e.contains("-f report.html"), "{e}");
        assert!(parse_report_format("yaml").is_err());
        assert_eq!(file_format(Path::new("quick.md"), None), Ok(Markdown));
        assert_eq!(file_format(Path::new("/tmp/q.HTML"), None), Ok(Html));
        assert_eq!(file_format(Path::new("q.json"), Some(Json)), Ok(Json));
        assert_eq!(file_format(Path::new("q"), Some(Markdown)), Ok(Markdown));
        assert_eq!(parse_report_format("junit"), Ok(Junit));
        assert_eq!(file_format(Path::new("results.xml"), None), Ok(Junit));
        let e = file_format(Path::new("q.md"), Some(Html)).expect_err("contradiction");
        assert!(e.contains("names markdown but -o asks for html"), "{e}");
        let e = file_format(Path::new("q.txt"), None).expect_err("unknown");
        assert!(e.contains(".html, .md, .json or .xml"), "{e}");
    }

    #[test]
    fn not_found_and_timed_out_have_exit_codes_of_their_own() {
        let status = Status::failure("not found", "NotFound").with_code(404);
        let gone = anyhow::Error::new(kube::Error::Api(Box::new(status))).context("reading");
        assert_eq!(exit_for_error(&gone), NOT_FOUND);
        let slow = anyhow::Error::new(TimedOut {
            name: "quick".into(),
            seconds: 5,
        });
        assert_eq!(exit_for_error(&slow), TIMED_OUT);
        let refused = Status::failure("forbidden", "Forbidden").with_code(403);
        let refused = anyhow::Error::new(kube::Error::Api(Box::new(refused)));
        assert_eq!(exit_for_error(&refused), ERROR);
        let codes = [OK, FAILED, ERROR, NOT_FOUND, TIMED_OUT];
        let distinct: std::collections::BTreeSet<u8> = codes.into_iter().collect();
        assert_eq!(distinct.len(), codes.len());
    }

    #[test]
    fn a_settled_run_that_did_not_pass_says_why_in_its_line() {
        let mut failed = gv(1, 1, Some(Phase::Failed));
        failed.metadata.name = Some("fabric".into());
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default());
        if let Some(s) = failed.status.as_mut() {
            gpuval_crds::conditions::set_condition(
                &mut s.conditions,
                gpuval_crds::conditions::READY,
                false,
                "NotConfigured",
                "spec.fabric needs agent.fabric in the chart",
                Some(1),
                &now,
            );
        }
        assert_eq!(
            settled_line(&failed),
            "gpuvalidation.gpuval.io/fabric Failed: spec.fabric needs agent.fabric in the chart\n"
        );
        let mut passed = gv(1, 1, Some(Phase::Passed));
        passed.metadata.name = Some("quick".into());
        assert_eq!(
            settled_line(&passed),
            "gpuvalidation.gpuval.io/quick Passed\n"
        );
    }

    #[test]
    fn a_rerun_repeats_the_spec_under_a_new_name_on_the_named_nodes() {
        let mut old = gv(1, 1, Some(Phase::Failed));
        old.metadata.name = Some("quick".into());
        let all = rerun_of(&old, &[]);
        assert_eq!(all.metadata.generate_name.as_deref(), Some("quick-"));
        assert_eq!(all.metadata.name, None);
        assert_eq!(all.spec, old.spec);
        assert!(all.status.is_none());
        let one = rerun_of(&old, &["gpu-b".to_string()]);
        assert_eq!(one.spec.node_names, vec![NodeName("gpu-b".into())]);
        assert_eq!(
            one.metadata
                .labels
                .unwrap_or_default()
                .get(RERUN_OF)
                .map(String::as_str),
            Some("quick")
        );
    }
}
