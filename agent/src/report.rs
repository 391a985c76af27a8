//! The node report's frame: who made it and when, and the report of a run that could not start.

use gpuval_crds::{NodeReport, Reason, Verdict};

use crate::backend::BackendKind;

/// A report for a run starting now on this backend and node; the checks fill in the rest.
pub fn started(kind: BackendKind, node: Option<String>) -> NodeReport {
    NodeReport {
        simulated: kind == BackendKind::Simulated,
        backend: kind.as_str().to_string(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        node,
        started_at: now_rfc3339(),
        ..Default::default()
    }
}

/// `report` finished as an Error with `reason` first (the run could not go on), keeping the
/// bad reasons of any check that did run.
pub fn could_not_run(mut report: NodeReport, reason: Reason) -> NodeReport {
    report.verdict = Verdict::Error;
    let io = report
        .io
        .as_ref()
        .filter(|r| r.verdict.is_bad())
        .map(|r| r.reasons.clone())
        .unwrap_or_default();
    report.action = gpuval_crds::reason::action_of(std::iter::once(&reason));
    report.failures = std::iter::once(reason).chain(io).collect();
    report.finished_at = now_rfc3339();
    report
}

/// Current time as RFC 3339 (UTC, seconds).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// Formats seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(secs: u64) -> String {
    i64::try_from(secs)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .map(|t| t.to_string())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
    }

    #[test]
    fn a_run_that_could_not_start_is_an_error_with_its_reason_first() {
        let r = could_not_run(
            started(BackendKind::Simulated, Some("n1".into())),
            Reason::new(
                gpuval_crds::Code::InventoryFailed,
                "inventory: no NVIDIA GPU visible",
            ),
        );
        assert_eq!(r.verdict, Verdict::Error);
        assert!(r.simulated && r.backend == "simulated");
        assert_eq!(r.failures, ["inventory: no NVIDIA GPU visible"]);
        assert_eq!(r.action, gpuval_crds::Action::Rerun);
        assert!(!r.finished_at.is_empty());
    }
}
