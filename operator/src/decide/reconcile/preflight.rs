//! The preflight, pure: before any agent starts, can every check a validation asks for run with
//! this installation's settings? A check that cannot (no io directory, an InfiniBand fabric
//! without RDMA devices in the pods) would fail on every node for a reason that is the
//! installation's, not the hardware's; the run is refused instead, with a condition and an event
//! that name the Helm value to set.

use gpuval_crds::GpuValidationSpec;
use gpuval_crds::fabric::FabricSpec;

use crate::settings::config::OperatorConfig;

/// The condition and event reason of a refused run.
pub const REASON: &str = crate::decide::selection::NOT_CONFIGURED;

/// What the installation gives agent pods, as far as the checks care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Installation {
    /// A host directory is mounted for the io check (`agent.io.hostPath`).
    pub io_dir: bool,
    /// Fabric pods request device resources (`agent.fabric.resources`, e.g. `rdma/ib: 1`).
    pub fabric_devices: bool,
    /// Agents run privileged (`agent.privileged`): every device of the node is visible.
    pub privileged: bool,
}

impl Installation {
    /// The installation the operator runs with.
    pub fn of(cfg: &OperatorConfig) -> Self {
        Installation {
            io_dir: cfg.io_host_path.is_some(),
            fabric_devices: !cfg.fabric.resources.is_empty(),
            privileged: cfg.agent_privileged,
        }
    }
}

/// Why `spec` cannot run on `installation`: one message naming every problem and, for each,
/// the Helm value that fixes it (None: every requested check can run).
pub fn check(spec: &GpuValidationSpec, installation: &Installation) -> Option<String> {
    let mut problems = Vec::new();
    if spec.checks.io.is_some() && !installation.io_dir {
        problems.push(
            "checks.io needs a host directory to write in and none is set: set the Helm value \
             agent.io.hostPath (inside agent.io.allowedPaths), or remove checks.io"
                .to_string(),
        );
    }
    if let Some(fabric) = &spec.fabric
        && wants_infiniband(fabric)
        && !installation.fabric_devices
        && !installation.privileged
    {
        problems.push(
            "spec.fabric.env asks NCCL for InfiniBand but agent pods get no RDMA device: set the \
             Helm values agent.fabric.resources (rdma/ib: 1) and agent.fabric.capabilities \
             [IPC_LOCK]"
                .to_string(),
        );
    }
    (!problems.is_empty()).then(|| {
        format!(
            "the installation cannot run this validation: {}",
            problems.join("; ")
        )
    })
}

/// True when the fabric's NCCL environment asks for the InfiniBand transport.
fn wants_infiniband(fabric: &FabricSpec) -> bool {
    let var = |name: &str| {
        fabric
            .env
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.value.trim())
    };
    if var("NCCL_IB_DISABLE") == Some("1") {
        return false;
    }
    var("NCCL_NET").is_some_and(|v| v.eq_ignore_ascii_case("IB")) || var("NCCL_IB_HCA").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> GpuValidationSpec {
        serde_json::from_value(v).expect("spec")
    }

    #[test]
    fn io_without_a_host_directory_is_refused_naming_the_helm_value() {
        let s = spec(json!({"checks": {"memory": {}, "io": {}}}));
        let msg = check(&s, &Installation::default()).expect("refused");
        assert!(msg.contains("agent.io.hostPath"), "{msg}");
        assert!(msg.contains("checks.io"), "{msg}");
        assert!(
            msg.len() <= super::super::MAX_MESSAGE,
            "fits an event whole: {msg}"
        );
        let with_dir = Installation {
            io_dir: true,
            ..Default::default()
        };
        assert_eq!(check(&s, &with_dir), None);
        let no_io = spec(json!({"checks": {"memory": {}}}));
        assert_eq!(check(&no_io, &Installation::default()), None);
    }

    #[test]
    fn an_infiniband_fabric_needs_rdma_devices_or_privilege() {
        let ib = spec(json!({"checks": {}, "fabric": {"tcp": {},
            "env": [{"name": "NCCL_IB_HCA", "value": "mlx5_0"}]}}));
        let msg = check(&ib, &Installation::default()).expect("refused");
        assert!(msg.contains("agent.fabric.resources"), "{msg}");
        for ok in [
            Installation {
                fabric_devices: true,
                ..Default::default()
            },
            Installation {
                privileged: true,
                ..Default::default()
            },
        ] {
            assert_eq!(check(&ib, &ok), None);
        }
        let disabled = spec(json!({"checks": {}, "fabric": {"tcp": {}, "env": [
            {"name": "NCCL_IB_HCA", "value": "mlx5_0"},
            {"name": "NCCL_IB_DISABLE", "value": "1"}]}}));
        assert_eq!(check(&disabled, &Installation::default()), None);
        let socket = spec(json!({"checks": {}, "fabric": {"tcp": {},
            "env": [{"name": "NCCL_NET", "value": "Socket"}]}}));
        assert_eq!(check(&socket, &Installation::default()), None);
    }

    #[test]
    fn every_problem_is_named_in_one_message() {
        let s = spec(json!({"checks": {"io": {}}, "fabric": {"tcp": {},
            "env": [{"name": "NCCL_NET", "value": "ib"}]}}));
        let msg = check(&s, &Installation::default()).expect("refused");
        assert!(
            msg.contains("agent.io.hostPath") && msg.contains("agent.fabric.resources"),
            "{msg}"
        );
    }
}
