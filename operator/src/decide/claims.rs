//! The agent pod of a node whose GPUs come through Dynamic Resource Allocation (pure): a
//! ResourceClaimTemplate per validation generation asks for every device of the operator's
//! device class on the node (`allocationMode: All`, narrowed by `spec.dra.selector`), and the
//! pod takes its claim instead of `nvidia.com/gpu`.

use std::collections::BTreeMap;

use gpuval_crds::facts::CountSource;
use gpuval_crds::{GPU_RESOURCE, GpuValidation, agent_env, labels};
use k8s_openapi::api::core::v1::{EnvVar, Pod, PodResourceClaim, ResourceClaim};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClaim, DeviceRequest, DeviceSelector, DeviceToleration,
    ExactDeviceRequest, ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use crate::decide::reconcile::allocation::{Allocation, DraGpu};
use crate::decide::reconcile::device_taints;

/// The name of the claim in the agent pod (`pod.spec.resourceClaims[].name`).
pub const POD_CLAIM: &str = "gpus";
/// The name of the one request in the claim.
pub const REQUEST: &str = "gpus";

/// The claim template of a validation's generation (at most 253 characters).
pub fn template_name(validation: &str, generation: i64) -> String {
    gpuval_crds::result::shortened(
        format!("gpuval-{validation}-g{generation}-gpus"),
        gpuval_crds::names::DNS1123_SUBDOMAIN_MAX,
    )
}

/// The claim template of `gv`'s current generation, owned by it, in `namespace`: every device
/// of the class on the node the pod lands on, narrowed by `spec.dra.selector`.
pub fn claim_template(
    gv: &GpuValidation,
    allocation: &Allocation,
    namespace: &str,
) -> ResourceClaimTemplate {
    let name = gv.metadata.name.clone().unwrap_or_default();
    let generation = gv.metadata.generation.unwrap_or(0);
    let selectors = gv
        .spec
        .dra
        .as_ref()
        .and_then(|d| d.selector.clone())
        .map(|expression| {
            vec![DeviceSelector {
                cel: Some(CELDeviceSelector { expression }),
            }]
        });
    let mut template_labels = BTreeMap::from([
        (
            labels::MANAGED_BY_KEY.to_string(),
            labels::MANAGED_BY.to_string(),
        ),
        (labels::VALIDATION.to_string(), labels::node_value(&name)),
        (labels::GENERATION.to_string(), generation.to_string()),
    ]);
    template_labels.retain(|_, v| !v.is_empty());
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(template_name(&name, generation)),
            namespace: Some(namespace.to_string()),
            labels: Some(template_labels),
            owner_references: gv.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: ResourceClaimTemplateSpec {
            metadata: None,
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: REQUEST.into(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: allocation.device_class.clone(),
                            allocation_mode: Some("All".into()),
                            selectors,
                            tolerations: Some(vec![DeviceToleration {
                                key: Some(device_taints::TAINT_KEY.into()),
                                operator: Some("Exists".into()),
                                effect: Some(device_taints::EFFECT.into()),
                                toleration_seconds: None,
                                value: None,
                            }]),
                            ..Default::default()
                        }),
                        first_available: None,
                    }]),
                    ..Default::default()
                }),
            },
        },
    }
}

/// Turns the extended-resource agent pod into one that takes the claim of `template`: no
/// `nvidia.com/gpu` request or limit, the claim in the pod and its container. Without a
/// selector the claim gets every published GPU of the node, so their UUIDs (when the driver
/// publishes them all) go to the agent, which proves NVML shows it exactly those.
pub fn use_claim(pod: &mut Pod, template: &str, gpus: &[DraGpu], selector: bool) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.resource_claims = Some(vec![PodResourceClaim {
        name: POD_CLAIM.into(),
        resource_claim_template_name: Some(template.to_string()),
        resource_claim_name: None,
    }]);
    let Some(c) = spec.containers.first_mut() else {
        return;
    };
    let resources = c.resources.get_or_insert_with(Default::default);
    for map in [resources.limits.as_mut(), resources.requests.as_mut()]
        .into_iter()
        .flatten()
    {
        map.remove(GPU_RESOURCE);
    }
    resources.claims = Some(vec![ResourceClaim {
        name: POD_CLAIM.into(),
        request: None,
    }]);
    let uuids: Option<Vec<&str>> = gpus.iter().map(|g| g.uuid.as_deref()).collect();
    if let Some(uuids) = uuids.filter(|u| !selector && !u.is_empty()) {
        c.env.get_or_insert_with(Vec::new).push(EnvVar {
            name: agent_env::DRA_GPU_UUIDS.into(),
            value: Some(uuids.join(",")),
            value_from: None,
        });
    }
}

/// The GPU count a DRA node's agent holds it to: `spec.expect.gpuCount`, else (without a
/// selector, which may claim fewer) the GPUs published in its ResourceSlices.
pub fn expected_gpus(
    spec: &gpuval_crds::GpuValidationSpec,
    gpus: &[DraGpu],
) -> Option<(i32, CountSource)> {
    if let Some(n) = spec.expect.as_ref().and_then(|e| e.gpu_count) {
        return Some((n, CountSource::Spec));
    }
    let selector = spec.dra.as_ref().is_some_and(|d| d.selector.is_some());
    let n = i32::try_from(gpus.len()).ok().filter(|n| *n > 0)?;
    (!selector).then_some((n, CountSource::ResourceSlice))
}

#[cfg(test)]
mod tests {
    use gpuval_crds::dra::DraSpec;

    use super::*;
    use crate::settings::config::OperatorConfig;

    fn gv(selector: Option<&str>) -> GpuValidation {
        let mut spec = crate::decide::selection::tests::spec();
        spec.dra = selector.map(|s| DraSpec {
            selector: Some(s.into()),
        });
        let mut g = GpuValidation::new("acceptance", spec);
        g.metadata.generation = Some(3);
        g.metadata.uid = Some("uid-1".into());
        g
    }

    fn gpu(n: u8, uuid: Option<&str>) -> DraGpu {
        DraGpu {
            pool: "gpu-a".into(),
            device: format!("gpu-{n}"),
            uuid: uuid.map(str::to_string),
        }
    }

    fn env_of(p: &Pod, name: &str) -> Option<String> {
        p.spec.as_ref().unwrap().containers[0]
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    }

    #[test]
    fn the_template_claims_all_devices_of_the_class_with_the_selector() {
        let a = Allocation::default();
        let t = claim_template(&gv(Some("device.attributes['x'].y == 1")), &a, "ns");
        assert_eq!(
            t.metadata.name.as_deref(),
            Some("gpuval-acceptance-g3-gpus")
        );
        assert_eq!(t.metadata.namespace.as_deref(), Some("ns"));
        let owner = &t.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.name, "acceptance");
        let req = &t.spec.spec.devices.unwrap().requests.unwrap()[0];
        let exact = req.exactly.as_ref().unwrap();
        assert_eq!(exact.device_class_name, "gpu.nvidia.com");
        assert_eq!(exact.allocation_mode.as_deref(), Some("All"));
        // A GPU gpuval tainted is validated again (and untainted when it passes).
        let tol = &exact.tolerations.as_ref().unwrap()[0];
        assert_eq!(tol.key.as_deref(), Some(device_taints::TAINT_KEY));
        assert_eq!(
            exact.selectors.as_ref().unwrap()[0]
                .cel
                .as_ref()
                .unwrap()
                .expression,
            "device.attributes['x'].y == 1"
        );
        let plain = claim_template(&gv(None), &a, "ns");
        let req = &plain.spec.spec.devices.unwrap().requests.unwrap()[0];
        assert!(req.exactly.as_ref().unwrap().selectors.is_none());
    }

    #[test]
    fn the_pod_takes_the_claim_instead_of_the_extended_resource() {
        let cfg = OperatorConfig::default();
        let mut p = crate::decide::pod::agent_pod(&gv(None), "gpu-a", 2, &cfg);
        let gpus = [gpu(0, Some("GPU-0")), gpu(1, Some("GPU-1"))];
        use_claim(&mut p, "gpuval-acceptance-g3-gpus", &gpus, false);
        let spec = p.spec.as_ref().unwrap();
        let claim = &spec.resource_claims.as_ref().unwrap()[0];
        assert_eq!(
            (
                claim.name.as_str(),
                claim.resource_claim_template_name.as_deref()
            ),
            ("gpus", Some("gpuval-acceptance-g3-gpus"))
        );
        let r = spec.containers[0].resources.as_ref().unwrap();
        assert!(!r.limits.as_ref().unwrap().contains_key(GPU_RESOURCE));
        assert!(!r.requests.as_ref().unwrap().contains_key(GPU_RESOURCE));
        assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "1");
        assert_eq!(r.claims.as_ref().unwrap()[0].name, "gpus");
        assert_eq!(
            env_of(&p, agent_env::DRA_GPU_UUIDS).as_deref(),
            Some("GPU-0,GPU-1")
        );
        // Still pinned to its node.
        let na = spec.affinity.as_ref().unwrap().node_affinity.as_ref();
        assert!(na.is_some());
    }

    #[test]
    fn uuids_go_to_the_agent_only_when_the_claim_takes_every_published_gpu() {
        let cfg = OperatorConfig::default();
        let gpus = [gpu(0, Some("GPU-0")), gpu(1, None)];
        let mut p = crate::decide::pod::agent_pod(&gv(None), "gpu-a", 2, &cfg);
        use_claim(&mut p, "t", &gpus, false);
        assert_eq!(env_of(&p, agent_env::DRA_GPU_UUIDS), None, "a uuid missing");
        let mut p = crate::decide::pod::agent_pod(&gv(Some("true")), "gpu-a", 2, &cfg);
        use_claim(&mut p, "t", &gpus[..1], true);
        assert_eq!(env_of(&p, agent_env::DRA_GPU_UUIDS), None, "a selector");
    }

    #[test]
    fn the_expected_count_of_a_dra_node_is_its_published_gpus_unless_narrowed() {
        let gpus = [gpu(0, None), gpu(1, None)];
        assert_eq!(
            expected_gpus(&gv(None).spec, &gpus),
            Some((2, CountSource::ResourceSlice))
        );
        assert_eq!(expected_gpus(&gv(Some("true")).spec, &gpus), None);
        let mut g = gv(Some("true"));
        g.spec.expect = Some(serde_json::from_value(serde_json::json!({"gpuCount": 1})).unwrap());
        assert_eq!(expected_gpus(&g.spec, &gpus), Some((1, CountSource::Spec)));
    }
}
