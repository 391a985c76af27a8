//! A fake Dynamic Resource Allocation driver for kwok nodes, and what a DRA kubelet plugin
//! tells a container about its claim.
//!
//! [`publish_class`] creates the DeviceClass `gpu.nvidia.com` (every device of the driver of
//! that name, as NVIDIA's driver's class selects), [`publish_gpus`] one ResourceSlice per node
//! listing its GPUs the way NVIDIA's driver does (device `gpu-<i>`, attributes `type: gpu` and
//! `uuid`). The real kube-scheduler then allocates claims from them.
//!
//! [`allocated_uuids`] is the fake kubelet's side: the UUIDs of the devices a pod's claims were
//! allocated (from each claim's status and the devices' `uuid` attributes), which a real
//! driver's kubelet plugin would hand the container as its GPUs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device, DeviceAttribute, DeviceClass, DeviceClassSpec, DeviceSelector,
    ResourceClaim, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use kube::Client;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};

/// The driver and device class NVIDIA's DRA driver uses.
pub const DRIVER: &str = "gpu.nvidia.com";

/// The UUID the simulated backend gives GPU `index` (`GPU-sim-<index>`).
pub fn sim_uuid(index: usize) -> String {
    format!("GPU-sim-{index}")
}

/// Creates the DeviceClass [`DRIVER`], selecting every device of that driver.
pub async fn publish_class(client: &Client) -> Result<DeviceClass, kube::Error> {
    let class = DeviceClass {
        metadata: ObjectMeta {
            name: Some(DRIVER.into()),
            ..Default::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!("device.driver == '{DRIVER}'"),
                }),
            }]),
            ..Default::default()
        },
    };
    Api::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
}

/// A GPU device as NVIDIA's driver publishes it: `gpu-<index>`, `type: gpu`, `uuid`.
fn gpu_device(index: usize, uuid: &str) -> Device {
    let text = |v: &str| DeviceAttribute {
        string: Some(v.into()),
        ..Default::default()
    };
    Device {
        name: format!("gpu-{index}"),
        attributes: Some(BTreeMap::from([
            ("type".to_string(), text("gpu")),
            ("uuid".to_string(), text(uuid)),
            ("productName".to_string(), text("NVIDIA H200")),
        ])),
        ..Default::default()
    }
}

/// Publishes `uuids` as the GPUs of `node` (one slice, pool `node`, generation 1).
pub async fn publish_gpus(
    client: &Client,
    node: &str,
    uuids: &[String],
) -> Result<ResourceSlice, kube::Error> {
    let slice = ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("{node}-{DRIVER}")),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(
                uuids
                    .iter()
                    .enumerate()
                    .map(|(i, u)| gpu_device(i, u))
                    .collect(),
            ),
            ..Default::default()
        },
    };
    Api::all(client.clone())
        .create(&PostParams::default(), &slice)
        .await
}

/// The UUIDs of the devices `pod`'s claims were allocated, in allocation order; None when the
/// pod has no claim. Err names what is missing (a claim not made or not allocated yet, a
/// device in no slice).
pub async fn allocated_uuids(client: &Client, pod: &Pod) -> Result<Option<Vec<String>>, String> {
    let claims = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.clone())
        .unwrap_or_default();
    if claims.is_empty() {
        return Ok(None);
    }
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let live = pods
        .get(&name)
        .await
        .map_err(|e| format!("pod {name}: {e}"))?;
    let statuses = live
        .status
        .and_then(|s| s.resource_claim_statuses)
        .unwrap_or_default();
    let claim_api: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list ResourceSlices: {e}"))?
        .items;
    let mut uuids = Vec::new();
    for c in claims {
        let claim_name = c
            .resource_claim_name
            .clone()
            .or_else(|| {
                statuses
                    .iter()
                    .find(|s| s.name == c.name)
                    .and_then(|s| s.resource_claim_name.clone())
            })
            .ok_or_else(|| format!("pod {name}: no ResourceClaim made for {}", c.name))?;
        let claim = claim_api
            .get(&claim_name)
            .await
            .map_err(|e| format!("ResourceClaim {claim_name}: {e}"))?;
        let results = claim
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .ok_or_else(|| format!("ResourceClaim {claim_name} is not allocated"))?;
        for r in results {
            let uuid = slices
                .iter()
                .filter(|s| s.spec.driver == r.driver && s.spec.pool.name == r.pool)
                .flat_map(|s| s.spec.devices.iter().flatten())
                .find(|d| d.name == r.device)
                .and_then(|d| d.attributes.as_ref()?.get("uuid")?.string.clone())
                .ok_or_else(|| {
                    format!(
                        "device {}/{}/{} has no uuid in any slice",
                        r.driver, r.pool, r.device
                    )
                })?;
            uuids.push(uuid);
        }
    }
    Ok(Some(uuids))
}

/// `spec` (a simulated-backend spec string) with `gpus=<n>`: the simulated node shows the
/// container as many GPUs as its claim was allocated.
pub fn with_sim_gpus(spec: &str, n: usize) -> String {
    let mut parts: Vec<String> = spec
        .split(',')
        .filter(|p| !p.trim().is_empty() && !p.trim().starts_with("gpus="))
        .map(str::to_string)
        .collect();
    parts.insert(0, format!("gpus={n}"));
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sim_spec_gets_the_claims_gpu_count() {
        assert_eq!(
            with_sim_gpus("gpus=8,model=H200,timescale=0.002", 2),
            "gpus=2,model=H200,timescale=0.002"
        );
        assert_eq!(with_sim_gpus("model=H200", 1), "gpus=1,model=H200");
    }
}
