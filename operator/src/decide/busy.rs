//! Which pods keep a node's GPUs busy for `idleOnly` (pure): a pod that is not a gpuval agent
//! and holds GPUs, through the device plugin's `nvidia.com/gpu` or through a Dynamic Resource
//! Allocation claim that the GPU driver's devices were allocated to. The shell lists the pods
//! and, where DRA may be in use, the ResourceClaims.

use std::collections::BTreeSet;

use gpuval_crds::{GPU_RESOURCE, labels};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;

/// `(namespace, name)` of a ResourceClaim.
pub type ClaimKey = (String, String);

/// The claims among `claims` that hold devices of `driver` (their allocation names it).
pub fn gpu_claims(claims: &[ResourceClaim], driver: &str) -> BTreeSet<ClaimKey> {
    claims
        .iter()
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .is_some_and(|d| d.results.iter().flatten().any(|r| r.driver == driver))
        })
        .map(|c| (c.namespace().unwrap_or_default(), c.name_any()))
        .collect()
}

/// The names of the claims pod `p` uses: named in its spec, or made from a template (the name
/// the pod's status records).
fn claim_names(p: &Pod) -> Vec<String> {
    let Some(spec) = p.spec.as_ref() else {
        return Vec::new();
    };
    let generated = p
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    spec.resource_claims
        .iter()
        .flatten()
        .filter_map(|c| match &c.resource_claim_name {
            Some(name) => Some(name.clone()),
            None => generated?
                .iter()
                .find(|g| g.name == c.name)?
                .resource_claim_name
                .clone(),
        })
        .collect()
}

/// The `nvidia.com/gpu` pod `p` asks for, over its containers.
fn extended_gpus(p: &Pod) -> i64 {
    p.spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter_map(|c| c.resources.as_ref())
        .filter_map(|r| r.limits.as_ref().or(r.requests.as_ref()))
        .filter_map(|l| l.get(GPU_RESOURCE))
        .filter_map(|q| q.0.parse::<i64>().ok())
        .sum()
}

/// Why pod `p` makes its node busy, with the node: it holds GPUs and is not an agent (None: it
/// does not). `gpu_claims` are the claims holding the GPU driver's devices.
pub fn holds_gpus(p: &Pod, gpu_claims: &BTreeSet<ClaimKey>) -> Option<(String, String)> {
    let agent =
        p.labels().get(labels::MANAGED_BY_KEY).map(String::as_str) == Some(labels::MANAGED_BY);
    let node = p.spec.as_ref()?.node_name.clone()?;
    if agent {
        return None;
    }
    let ns = p.namespace().unwrap_or_default();
    let who = format!("{ns}/{}", p.name_any());
    let gpus = extended_gpus(p);
    if gpus > 0 {
        return Some((node, format!("busy: pod {who} holds {gpus} {GPU_RESOURCE}")));
    }
    let claim = claim_names(p)
        .into_iter()
        .find(|c| gpu_claims.contains(&(ns.clone(), c.clone())))?;
    Some((
        node,
        format!("busy: pod {who} holds GPUs through ResourceClaim {ns}/{claim}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("a pod")
    }

    fn claim(ns: &str, name: &str, driver: Option<&str>) -> ResourceClaim {
        let status = match driver {
            Some(d) => json!({"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": d, "pool": "node-a", "device": "gpu-0"}]}}}),
            None => json!({}),
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": []}},
            "status": status,
        }))
        .expect("a claim")
    }

    #[test]
    fn only_claims_allocated_the_gpu_driver_s_devices_count() {
        let claims = [
            claim("ml", "gpus", Some("gpu.nvidia.com")),
            claim("ml", "nic", Some("rdma.example.com")),
            claim("ml", "pending", None),
        ];
        let held = gpu_claims(&claims, "gpu.nvidia.com");
        assert_eq!(held, BTreeSet::from([("ml".into(), "gpus".into())]));
    }

    #[test]
    fn a_pod_holding_gpus_through_a_claim_makes_its_node_busy() {
        let held = BTreeSet::from([("ml".to_string(), "train-gpus-x7".to_string())]);
        // A claim made from the pod's template: its name is in the pod's status.
        let from_template = pod(json!({
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"nodeName": "node-a", "containers": [],
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "train-gpus-x7"}]},
        }));
        let (node, why) = holds_gpus(&from_template, &held).expect("busy");
        assert_eq!(node, "node-a");
        assert_eq!(
            why,
            "busy: pod ml/train holds GPUs through ResourceClaim ml/train-gpus-x7"
        );
        // A claim named in the spec, in another namespace than the held one: not busy.
        let other_ns = pod(json!({
            "metadata": {"name": "train", "namespace": "other"},
            "spec": {"nodeName": "node-a", "containers": [],
                "resourceClaims": [{"name": "gpus", "resourceClaimName": "train-gpus-x7"}]},
        }));
        assert_eq!(holds_gpus(&other_ns, &held), None);
        // An agent holding its claim is not a tenant.
        let mut agent = from_template.clone();
        agent.metadata.labels = Some(
            [(
                labels::MANAGED_BY_KEY.to_string(),
                labels::MANAGED_BY.to_string(),
            )]
            .into(),
        );
        assert_eq!(holds_gpus(&agent, &held), None);
    }

    #[test]
    fn the_extended_resource_still_counts_and_an_unscheduled_pod_does_not() {
        let gpu = pod(json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"nodeName": "node-b", "containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
        }));
        let (node, why) = holds_gpus(&gpu, &BTreeSet::new()).expect("busy");
        assert_eq!(
            (node.as_str(), why.as_str()),
            ("node-b", "busy: pod ml/p holds 4 nvidia.com/gpu")
        );
        let pending = pod(json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
        }));
        assert_eq!(holds_gpus(&pending, &BTreeSet::new()), None);
    }
}
