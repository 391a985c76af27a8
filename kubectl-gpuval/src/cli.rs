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
/// Exit code: the command could not do its work (no cluster, no such validation, a timeout).
pub const ERROR: u8 = 2;

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
