//! The `gpuval.io/v1alpha1` API: [`GpuValidation`] (what to validate, and the verdict) and
//! [`GpuNodeResult`] (one node's full report), shared by the operator and the agent.
//!
//! This crate does no I/O: it holds the types, their schema rules (enforced by the API server
//! through the generated CRDs, [`schema`]; the CEL rules written once in [`rules`] and
//! [`duration::DurationRange`]), a validator that checks settings files against that same
//! generated schema ([`validate`]), and small pure helpers (durations, conditions, labels,
//! Kubernetes name syntax in [`names`]).

// kube-derive printcolumn(...) repeats `type_ = "integer"` etc.; that is data, not a mistake.
#![allow(clippy::duplicated_attributes)]

pub mod attestation;
pub mod baseline;
pub mod binding;
pub mod certificate;
pub mod conditions;
pub mod cron;
pub mod depth;
pub mod dra;
pub mod duration;
pub mod evidence;
pub mod fabric;
pub mod fabric_ports;
pub mod fabric_shard;
pub mod facts;
pub mod kinds;
pub mod names;
pub mod nccl;
pub mod nccl_env;
pub mod pem;
pub mod reason;
pub mod report;
pub mod result;
pub mod result_meta;
pub mod rules;
pub mod schedule;
pub mod schema;
pub mod schema_inline;
pub mod seal;
pub mod selector;
pub mod spec;
pub mod spelling;
pub mod status;
pub mod text;
pub mod training;
pub mod validate;
pub mod xid;

pub use depth::*;
pub use duration::{Duration, DurationError};
pub use evidence::{Evidence, FinalLine, ResultSeen, Trust, final_line};
pub use fabric::{FabricRoundSpec, GpuFabricRound};
pub use nccl::*;
pub use reason::{Action, Code, Reason, Severity, SeverityOverride};
pub use report::*;
pub use result::{GpuNodeResult, GpuNodeResultSpec};
pub use schedule::{GpuValidationSchedule, GpuValidationScheduleSpec, GpuValidationScheduleStatus};
pub use spec::*;
pub use status::*;
pub use training::*;

/// The API group of every gpuval kind.
pub const GROUP: &str = "gpuval.io";
/// The API version of every gpuval kind.
pub const VERSION: &str = "v1alpha1";

/// Labels and annotations the operator and agent put on the objects they make.
pub mod labels {
    /// The validation a pod or result belongs to.
    pub const VALIDATION: &str = "gpuval.io/validation";
    /// The node a pod or result is about.
    pub const NODE: &str = "gpuval.io/node";
    /// The generation of the validation spec that a pod or result was made for.
    pub const GENERATION: &str = "gpuval.io/generation";
    /// `app.kubernetes.io/managed-by` value on everything the operator creates.
    pub const MANAGED_BY: &str = "gpuval-operator";
    /// The label or taint key set on a node that failed, when `onFailure.action` asks for it.
    pub const FAILED_NODE: &str = "gpuval.io/failed";
    /// A node result's verdict (`Pass`, `Warn`, `Fail`, `Error`), so that it can be selected on.
    pub const VERDICT: &str = "gpuval.io/verdict";
    /// Annotation on a node result: its failures in plain words, joined with `"; "`.
    pub const SUMMARY: &str = "gpuval.io/summary";
    /// Annotation on a node result: what its agent measured in the fabric test's rounds, a JSON
    /// array of [`FabricOutcome`](crate::fabric::FabricOutcome).
    pub const FABRIC_OUTCOMES: &str = "gpuval.io/fabric";
    /// Annotation on a node result: its InfiniBand/RoCE ports as last read during the fabric
    /// test and what is wrong with them, a JSON
    /// [`PortsReport`](crate::fabric_ports::PortsReport) (absent on a node without RDMA ports).
    pub const FABRIC_PORTS: &str = "gpuval.io/fabric-ports";
    /// Annotation on a node result: the name of the agent pod that wrote it.
    pub const POD: &str = "gpuval.io/pod";
    /// Annotation on a node result: the uid of the agent pod that wrote it. The operator counts
    /// a result only when it names the node's current pod (a stale writer's result is ignored).
    pub const POD_UID: &str = "gpuval.io/pod-uid";
    /// Annotation on a node result: the uid of the validation it belongs to. With the pod,
    /// generation and node it is the result's binding ([`crate::binding`]), which the operator
    /// writes when it creates the result and no agent may change.
    pub const VALIDATION_UID: &str = "gpuval.io/validation-uid";
    /// Annotation on a node result: the run's line for its node became final without it (the
    /// node's verdict, e.g. `DeadlineExceeded`). A closed result is kept for the record; no
    /// agent may write it any more and no reader counts it ([`crate::binding::closed`]).
    pub const CLOSED: &str = "gpuval.io/closed";
    /// Annotation on a node result, written by the operator alone (no agent may set it, see
    /// [`crate::binding`]): when the operator read the stored report (the status) and found it
    /// bound to the result and agreeing with its labels ([`crate::binding::check_report`]), in
    /// RFC 3339. Only a result so checked counts, and its line is dated by this time, never by
    /// anything a writer sets about itself (`managedFields`, labels).
    pub const REPORT_CHECKED: &str = "gpuval.io/report-checked";
    /// Label on a fabric round: its round number.
    pub const ROUND: &str = "gpuval.io/round";
    /// The standard `app.kubernetes.io/managed-by` label key (its value is [`MANAGED_BY`]).
    pub const MANAGED_BY_KEY: &str = "app.kubernetes.io/managed-by";
    /// The standard `app.kubernetes.io/name` label key; agent pods carry [`AGENT_APP`].
    pub const APP_NAME_KEY: &str = "app.kubernetes.io/name";
    /// `app.kubernetes.io/name` value of agent pods.
    pub const AGENT_APP: &str = "gpuval-agent";
    /// The default admission taint: a node carrying it waits for a pass.
    pub const UNVALIDATED: &str = "gpuval.io/unvalidated";
    /// The GpuValidationSchedule a validation was made by.
    pub const SCHEDULE: &str = "gpuval.io/schedule";
    /// Annotation on a scheduled validation: its scheduled time (RFC 3339); absent on admission runs.
    pub const SCHEDULED_AT: &str = "gpuval.io/scheduled-at";
    /// The node label with the node's last verdict (`Pass`, `Fail`).
    pub const NODE_VERDICT: &str = VERDICT;
    /// The node label with when that verdict was reached (UTC, `20261123T073000Z`: label-safe).
    pub const VALIDATED_AT: &str = "gpuval.io/validated-at";
    /// The node label naming the validation whose final line gave the node its verdict (the
    /// run that proved it, or the one it failed): the validation's name, or its short form.
    pub const VERDICT_RUN: &str = "gpuval.io/verdict-run";
    /// The node label `true` on a repeat offender: the node, or one of its GPUs, failed on
    /// hardware evidence in two runs or more within the administrator's window
    /// (`--repeat-failure-window`); the `GpuValidated` message names the runs and the GPUs.
    pub const REPEAT_OFFENDER: &str = "gpuval.io/repeat-offender";
    /// The type of the node condition the operator sets from a node's latest hardware
    /// evidence (True: passed; False: failed).
    pub const NODE_CONDITION: &str = "GpuValidated";
    /// The type of the node condition that admits a node (the one a Node Readiness Controller
    /// rule reads): `True` only once a run whose author may admit nodes (a schedule's: its
    /// author holds the `admit` verb) passed it on hardware evidence and no failure stands;
    /// otherwise as `GpuValidated` (`False` on a standing failure), or `Unknown` (reason
    /// `NotAdmitted`) for a node that only other runs passed.
    pub const ADMITTED_CONDITION: &str = "GpuAdmitted";
    /// The node label with the last hardware verdict (`Pass`, `Fail`) of a run whose author may
    /// admit nodes (a schedule's): an `untestedNodes` gate takes a node without it for untested.
    pub const ADMISSION: &str = "gpuval.io/admission";
    /// Annotation on a node result: the UID of the Node object its agent ran on, so that a node
    /// deleted and created again under its name (a new UID) inherits no verdict.
    pub const NODE_UID: &str = "gpuval.io/node-uid";

    /// The recommended action (`None`, `Rerun`, `ResetGpu`, `RebootNode`, `ReplaceHardware`):
    /// on every node result, and on a node when it is not `None`, so that
    /// `-l gpuval.io/action=ReplaceHardware` finds them.
    pub const ACTION: &str = "gpuval.io/action";
    /// Annotation on a node result: the codes of its failures (or warnings), comma-separated,
    /// worst first.
    pub const CODES: &str = "gpuval.io/codes";
    /// Label on a node result written by the simulated backend (`true`): such a result is never
    /// evidence about a real node (no node labels, condition, taint change or fleet figures).
    pub const SIMULATED: &str = "gpuval.io/simulated";
    /// Annotation on a node result: the node's versions (`driver=570.86.15,vbios=...,cuda=12.8`).
    pub const VERSIONS: &str = "gpuval.io/versions";

    /// The longest label value Kubernetes accepts.
    pub const MAX_VALUE_LEN: usize = 63;

    /// The value of the [`NODE`] label for a node: the node name itself when it fits in a label
    /// value (63 characters), otherwise a stable short form: the name's first 46 characters,
    /// `-`, and 16 hex digits of a hash of the whole name (the full name stays in the object's
    /// spec). Node names are DNS subdomains, so the short form is a valid label value too.
    pub fn node_value(node: &str) -> String {
        if node.len() <= MAX_VALUE_LEN {
            return node.to_string();
        }
        const HASH_HEX: usize = 16;
        let keep = MAX_VALUE_LEN - HASH_HEX - 1;
        // Node names are ASCII; `get` guards a non-ASCII input instead of panicking.
        let prefix = node.get(..keep).unwrap_or("node");
        let prefix = prefix.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        format!("{prefix}-{:016x}", crate::result::fnv1a(node.as_bytes()))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn short_node_names_are_kept() {
            assert_eq!(node_value("gpu-0"), "gpu-0");
            let exactly = "n".repeat(MAX_VALUE_LEN);
            assert_eq!(node_value(&exactly), exactly);
        }

        #[test]
        fn long_node_names_get_a_stable_hashed_form() {
            let a = format!("{}.compute.internal", "ip-10-0-0-1.".repeat(8));
            let b = format!("{}.compute.internal", "ip-10-0-0-2.".repeat(8));
            let va = node_value(&a);
            assert!(va.len() <= MAX_VALUE_LEN, "{va}");
            assert_eq!(va, node_value(&a), "stable");
            assert_ne!(va, node_value(&b), "distinct names stay distinct");
            assert!(va.starts_with("ip-10-0-0-1.ip-10"));
            assert!(
                va.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                    && va.ends_with(|c: char| c.is_ascii_alphanumeric()),
                "{va} is a valid label value"
            );
        }
    }
}

/// The environment contract between the operator (which builds agent pods) and the agent
/// (`gpuval-agent k8s`, which reads it).
pub mod agent_env {
    /// The GpuValidation's name.
    pub const VALIDATION: &str = "GPUVAL_VALIDATION";
    /// The validation's `metadata.generation` the pod was made for.
    pub const GENERATION: &str = "GPUVAL_GENERATION";
    /// The validation's `metadata.uid` (owner reference of the result).
    pub const VALIDATION_UID: &str = "GPUVAL_VALIDATION_UID";
    /// Downward API `spec.nodeName`.
    pub const NODE_NAME: &str = "NODE_NAME";
    /// Downward API `metadata.namespace`: where the result is written.
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    /// Downward API `metadata.name`.
    pub const POD_NAME: &str = "POD_NAME";
    /// Downward API `metadata.uid`: written on the result, so the operator knows its writer.
    pub const POD_UID: &str = "POD_UID";
    /// Optional: a writable directory (the pod's emptyDir) where the agent keeps its result
    /// until it is stored.
    pub const STATE_DIR: &str = "GPUVAL_STATE_DIR";
    /// Optional: `cuda` (default) or `simulated`.
    pub const BACKEND: &str = "GPUVAL_BACKEND";
    /// Optional: a simulated-backend spec string (implies `simulated`; tests and demos only).
    pub const SIMULATE: &str = "GPUVAL_SIMULATE";
    /// Optional: the directory the io check writes in (the operator's `--io-host-path`, mounted).
    pub const IO_DIR: &str = "GPUVAL_IO_DIR";
    /// `true`: a process that is not the agent's on a GPU under test is a Warn, not a Fail
    /// (the administrator allows shared GPUs).
    pub const ALLOW_SHARED_GPUS: &str = "GPUVAL_ALLOW_SHARED_GPUS";
    /// Optional: the kubelet's PodResources socket, where the administrator mounted it (Helm
    /// `agent.podResources`): a busy GPU's finding names the pods that hold it.
    pub const POD_RESOURCES_SOCKET: &str = "GPUVAL_POD_RESOURCES_SOCKET";
    /// Optional: the longest random delay, in milliseconds, before the agent writes its result
    /// (the operator's `--agent-result-jitter-seconds`).
    pub const RESULT_JITTER_MS: &str = "GPUVAL_RESULT_JITTER_MS";
    /// Optional: each GPU's baseline from its own earlier runs and the tolerance, JSON
    /// ([`Baselines`](crate::baseline::Baselines)), as the operator computed it from the
    /// node's certificates.
    pub const BASELINES: &str = "GPUVAL_BASELINES";
    /// Optional: the GPUs the node should show (`spec.expect.gpuCount`, else the node's
    /// `nvidia.com/gpu` capacity, else its `nvidia.com/gpu.count` label), as the operator found.
    pub const EXPECTED_GPUS: &str = "GPUVAL_EXPECTED_GPUS";
    /// Optional: where [`EXPECTED_GPUS`] came from (`Spec`, `Capacity`, `Label`).
    pub const EXPECTED_GPUS_FROM: &str = "GPUVAL_EXPECTED_GPUS_FROM";
    /// Optional: on a node whose GPUs come through Dynamic Resource Allocation, the UUIDs of
    /// the GPUs the agent's claim asks for (comma-separated, from the driver's ResourceSlices):
    /// the agent fails the node when NVML shows it other GPUs.
    pub const DRA_GPU_UUIDS: &str = "GPUVAL_DRA_GPU_UUIDS";
    /// The file of the validation's fabric rendezvous key (its Secret, mounted read-only), set
    /// on the agent pods of a validation that runs the fabric. A fabric agent in a pod without
    /// it refuses the fabric; outside Kubernetes it is optional (a launcher's shared key).
    pub const FABRIC_KEY_FILE: &str = "GPUVAL_FABRIC_KEY_FILE";
}

/// The extended resource that GPU nodes advertise (NVIDIA device plugin).
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// All CRDs of this API, in the order they should be installed.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    vec![
        schema::gpu_validation_crd(),
        schema::gpu_node_result_crd(),
        schema::gpu_validation_schedule_crd(),
        schema::gpu_fabric_round_crd(),
    ]
}

/// The CRDs as one multi-document YAML stream (what `crdgen` writes to `deploy/crds/`).
pub fn crds_yaml() -> Result<String, serde_saphyr::SerializeError> {
    let mut out = String::from(
        "# Generated by `cargo run -p gpuval-crds --bin crdgen`; do not edit by hand.\n",
    );
    // Long one-line strings (descriptions, CEL rules) stay on one line, as written in the
    // types: a rule reads whole and greps; multi-line doc comments become literal blocks.
    let options = serde_saphyr::ser_options! { folded_wrap_chars: usize::MAX };
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string_with_options(
            &crd,
            options.clone(),
        )?);
    }
    Ok(out)
}

/// Where the generated CRD YAML is committed, relative to the repository root: the plain
/// manifests and the Helm chart's `crds/` directory. `crdgen --write` writes every copy and a
/// test fails when any of them differs from [`crds_yaml`].
pub const CRD_COPIES: [&str; 2] = [
    "deploy/crds/gpuval.io.yaml",
    "charts/gpuval/crds/gpuval.io.yaml",
];
