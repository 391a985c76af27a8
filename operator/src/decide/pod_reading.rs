//! A pod as the reconcile steps see it ([`PodView`]): its run, its node, its phase and why it
//! failed or is stuck, in words, parsed once from the Pod (pure).

use gpuval_crds::labels;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, Pod, PodStatus};
use kube::api::ResourceExt;

use crate::decide::reconcile::{PodPhase, PodView};

/// Container waiting reasons that waiting will not cure: the pod counts as Failed.
const HOPELESS_WAITING: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// A pod as the steps see it: its run (labels), its node (annotation), its phase, and why it
/// failed or is stuck, in words. None for a pod without the labels the operator sets.
pub fn pod_view(p: &Pod) -> Option<PodView> {
    let labels = p.metadata.labels.as_ref()?;
    let generation = labels.get(labels::GENERATION)?.parse().ok()?;
    let node = p
        .annotations()
        .get(labels::NODE)
        .or_else(|| labels.get(labels::NODE))
        .cloned()?;
    let status = p.status.as_ref();
    let container = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first());
    let state = container.and_then(|c| c.state.as_ref());
    let (phase, reason) = phase_and_reason(status, state);
    Some(PodView {
        name: p.name_any(),
        node,
        generation,
        phase,
        reason,
        deleting: p.metadata.deletion_timestamp.is_some(),
        finished_at: state
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
            .map(|t| t.0),
        ip: status.and_then(|s| s.pod_ip.clone()),
        image_id: container
            .map(|c| c.image_id.clone())
            .filter(|i| !i.is_empty()),
        created: p.metadata.creation_timestamp.as_ref().map(|t| t.0),
    })
}

/// The pod's phase (a missing one is Pending; a container that cannot start makes it Failed)
/// and the most telling reason: the pod's own (evicted, ...) over the container's exit; for a
/// pending pod with neither, why it is not scheduled.
fn phase_and_reason(
    status: Option<&PodStatus>,
    state: Option<&ContainerState>,
) -> (PodPhase, Option<String>) {
    let mut phase = status
        .and_then(|s| s.phase.as_deref())
        .map_or(PodPhase::Pending, PodPhase::parse);
    let mut reason = state
        .and_then(|s| s.terminated.as_ref())
        .map(terminated_reason);
    if let Some(r) = status.and_then(|s| s.reason.as_deref()) {
        let msg = status.and_then(|s| s.message.as_deref()).unwrap_or("");
        reason = Some(format!("{r}: {msg}"));
    }
    if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
        let r = w.reason.as_deref().unwrap_or("");
        if HOPELESS_WAITING.contains(&r) {
            phase = PodPhase::Failed;
            reason = Some(format!("{r}: {}", w.message.as_deref().unwrap_or("")));
        }
    }
    if phase == PodPhase::Pending && reason.is_none() {
        reason = unscheduled_reason(status);
    }
    (phase, reason)
}

/// `OOMKilled (exit code 137): message`.
fn terminated_reason(t: &ContainerStateTerminated) -> String {
    format!(
        "{} (exit code {}){}",
        t.reason.as_deref().unwrap_or("terminated"),
        t.exit_code,
        t.message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    )
}

/// Why the scheduler has not placed the pod (its PodScheduled=False condition), if it says.
fn unscheduled_reason(status: Option<&PodStatus>) -> Option<String> {
    let c = status
        .and_then(|s| s.conditions.as_ref())?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    Some(format!(
        "{}: {}",
        c.reason.as_deref().unwrap_or("Unschedulable"),
        c.message.as_deref().unwrap_or("")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerStateWaiting, ContainerStatus, PodCondition};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    use std::collections::BTreeMap;
    fn agent_pod(status: PodStatus) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("gpuval-v-gpu-0-g2".into()),
                labels: Some(BTreeMap::from([
                    (labels::GENERATION.to_string(), "2".to_string()),
                    (labels::NODE.to_string(), "gpu-0-short".to_string()),
                ])),
                annotations: Some(BTreeMap::from([(
                    labels::NODE.to_string(),
                    "gpu-0".to_string(),
                )])),
                ..Default::default()
            },
            spec: None,
            status: Some(status),
        }
    }

    fn with_container(phase: &str, state: ContainerState) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "agent".into(),
                state: Some(state),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn a_running_pod_keeps_its_run_and_the_node_from_the_annotation() {
        let v = pod_view(&agent_pod(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(
            (v.node.as_str(), v.generation, v.phase, v.reason),
            ("gpu-0", 2, PodPhase::Running, None)
        );
        assert!(!v.deleting);
    }

    #[test]
    fn a_pod_without_a_phase_is_pending_and_an_odd_phase_unknown() {
        let v = pod_view(&agent_pod(PodStatus::default())).unwrap();
        assert_eq!(v.phase, PodPhase::Pending);
        let v = pod_view(&agent_pod(PodStatus {
            phase: Some("Unknown".into()),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(v.phase, PodPhase::Unknown);
    }

    #[test]
    fn a_killed_agent_says_how_and_when() {
        let finished = Timestamp::from_second(1_790_000_000).unwrap();
        let state = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some("OOMKilled".into()),
                finished_at: Some(Time(finished)),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = pod_view(&agent_pod(with_container("Failed", state))).unwrap();
        assert_eq!(v.phase, PodPhase::Failed);
        assert_eq!(v.reason.as_deref(), Some("OOMKilled (exit code 137)"));
        assert_eq!(v.finished_at, Some(finished));
    }

    #[test]
    fn an_evicted_pod_gives_the_eviction_over_the_exit() {
        let state = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 143,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut status = with_container("Failed", state);
        status.reason = Some("Evicted".into());
        status.message = Some("low on memory".into());
        let v = pod_view(&agent_pod(status)).unwrap();
        assert_eq!(v.reason.as_deref(), Some("Evicted: low on memory"));
    }

    #[test]
    fn an_image_that_cannot_be_pulled_fails_the_pod() {
        let state = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImagePullBackOff".into()),
                message: Some("no such image".into()),
            }),
            ..Default::default()
        };
        let v = pod_view(&agent_pod(with_container("Pending", state))).unwrap();
        assert_eq!(v.phase, PodPhase::Failed);
        assert_eq!(v.reason.as_deref(), Some("ImagePullBackOff: no such image"));

        let creating = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                message: None,
            }),
            ..Default::default()
        };
        let v = pod_view(&agent_pod(with_container("Pending", creating))).unwrap();
        assert_eq!(
            (v.phase, v.reason),
            (PodPhase::Pending, None),
            "it may still start"
        );
    }

    #[test]
    fn an_unscheduled_pod_says_why() {
        let v = pod_view(&agent_pod(PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/3 nodes are available".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(
            v.reason.as_deref(),
            Some("Unschedulable: 0/3 nodes are available")
        );
    }

    #[test]
    fn a_pod_without_the_run_labels_is_not_an_agent_pod() {
        let mut p = agent_pod(PodStatus::default());
        p.metadata.labels = None;
        assert_eq!(pod_view(&p), None);
    }
}
