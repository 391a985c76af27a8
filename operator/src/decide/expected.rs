//! The GPU count an agent holds its node to, pure: `spec.expect.gpuCount`, else the node's
//! `nvidia.com/gpu` capacity (what the device plugin registered, which stays put when a GPU
//! turns unhealthy; allocatable does not), else GPU Feature Discovery's `nvidia.com/gpu.count`
//! label. It reaches the agent in its environment; the agent fails the node at once when NVML
//! shows another count.

use gpuval_crds::facts::{CountSource, GFD_COUNT_LABEL};
use gpuval_crds::{GPU_RESOURCE, GpuValidationSpec, agent_env};
use k8s_openapi::api::core::v1::{EnvVar, Node, Pod};

/// The count and where it came from; None when neither the spec nor the node says.
pub fn expected_gpus(spec: &GpuValidationSpec, node: Option<&Node>) -> Option<(i32, CountSource)> {
    if let Some(n) = spec.expect.as_ref().and_then(|e| e.gpu_count) {
        return Some((n, CountSource::Spec));
    }
    let node = node?;
    let capacity = node
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(GPU_RESOURCE))
        .and_then(|q| q.0.parse::<i32>().ok())
        .filter(|n| *n > 0);
    if let Some(n) = capacity {
        return Some((n, CountSource::Capacity));
    }
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(GFD_COUNT_LABEL))
        .and_then(|v| v.parse::<i32>().ok())
        .filter(|n| *n > 0)
        .map(|n| (n, CountSource::Label))
}

/// Adds the expectation to the agent container's environment.
pub fn add_to_pod(pod: &mut Pod, expected: Option<(i32, CountSource)>) {
    let Some((n, from)) = expected else {
        return;
    };
    let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) else {
        return;
    };
    let env = c.env.get_or_insert_with(Vec::new);
    for (name, value) in [
        (agent_env::EXPECTED_GPUS, n.to_string()),
        (agent_env::EXPECTED_GPUS_FROM, from.as_str().to_string()),
    ] {
        env.push(EnvVar {
            name: name.into(),
            value: Some(value),
            value_from: None,
        });
    }
}

/// Hands the agent its GPUs' baselines (`GPUVAL_BASELINES`, from
/// [`crate::decide::certificates::baselines_env`]), where there are any.
pub fn add_baselines(pod: &mut Pod, baselines: Option<String>) {
    let Some(value) = baselines else {
        return;
    };
    let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) else {
        return;
    };
    c.env.get_or_insert_with(Vec::new).push(EnvVar {
        name: agent_env::BASELINES.into(),
        value: Some(value),
        value_from: None,
    });
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{Container, NodeStatus, PodSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn node(capacity: Option<&str>, label: Option<&str>) -> Node {
        let mut n = Node {
            status: Some(NodeStatus {
                capacity: capacity
                    .map(|c| BTreeMap::from([(GPU_RESOURCE.to_string(), Quantity(c.into()))])),
                ..Default::default()
            }),
            ..Default::default()
        };
        n.metadata.labels =
            label.map(|l| BTreeMap::from([(GFD_COUNT_LABEL.to_string(), l.to_string())]));
        n
    }

    fn spec(count: Option<i32>) -> GpuValidationSpec {
        let mut s: GpuValidationSpec =
            serde_json::from_value(serde_json::json!({"checks": {"memory": {}}})).unwrap();
        s.expect = count.map(|n| gpuval_crds::facts::Expect {
            gpu_count: Some(n),
            ..Default::default()
        });
        s
    }

    #[test]
    fn the_spec_then_the_capacity_then_the_label() {
        let both = node(Some("8"), Some("7"));
        assert_eq!(
            expected_gpus(&spec(Some(4)), Some(&both)),
            Some((4, CountSource::Spec))
        );
        assert_eq!(
            expected_gpus(&spec(None), Some(&both)),
            Some((8, CountSource::Capacity))
        );
        let label_only = node(None, Some("7"));
        assert_eq!(
            expected_gpus(&spec(None), Some(&label_only)),
            Some((7, CountSource::Label))
        );
        assert_eq!(
            expected_gpus(&spec(None), Some(&node(Some("0"), Some("x")))),
            None
        );
        assert_eq!(expected_gpus(&spec(None), None), None);
        assert_eq!(
            expected_gpus(&spec(Some(2)), None),
            Some((2, CountSource::Spec))
        );
    }

    #[test]
    fn the_expectation_reaches_the_agent_container() {
        let mut pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container::default()],
                ..Default::default()
            }),
            ..Default::default()
        };
        add_to_pod(&mut pod, Some((8, CountSource::Label)));
        let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
        let pairs: Vec<(String, Option<String>)> =
            env.into_iter().map(|e| (e.name, e.value)).collect();
        assert_eq!(
            pairs,
            vec![
                ("GPUVAL_EXPECTED_GPUS".into(), Some("8".into())),
                ("GPUVAL_EXPECTED_GPUS_FROM".into(), Some("Label".into())),
            ]
        );
    }
}
