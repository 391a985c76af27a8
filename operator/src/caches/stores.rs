//! What the operator keeps of each watched object in its stores: what it reads, and nothing
//! else (a large cluster's nodes and slices carry much the operator never looks at).

use gpuval_crds::GpuNodeResult;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{PartialObjectMeta, ResourceExt};

/// Keeps of a ResourceSlice what the allocation decision reads: its driver, node, pool and
/// each device's name, node and `uuid`/`type` attributes (capacities, counters, taints and
/// other attributes can be large and are never read).
pub fn trim_slice(s: &mut ResourceSlice) {
    trim_meta(s);
    s.metadata.annotations = None;
    s.metadata.labels = None;
    s.spec.shared_counters = None;
    s.spec.node_selector = None;
    for d in s.spec.devices.iter_mut().flatten() {
        let kept = d.attributes.take().map(|mut a| {
            a.retain(|k, _| {
                let name = k.rsplit('/').next().unwrap_or(k);
                name == "uuid" || name == "type"
            });
            a
        });
        *d = k8s_openapi::api::resource::v1::Device {
            name: std::mem::take(&mut d.name),
            node_name: d.node_name.take(),
            attributes: kept,
            ..Default::default()
        };
    }
}

/// Drops managed fields, which the operator never reads.
pub fn trim_meta<K: ResourceExt>(k: &mut K) {
    k.managed_fields_mut().clear();
}

/// Drops a result's managed fields but the mark that a writer stored its status (the report):
/// the entries of the status subresource, without their field sets (see
/// [`crate::read::observe::has_report`]).
pub fn trim_result(r: &mut PartialObjectMeta<GpuNodeResult>) {
    let fields = r.managed_fields_mut();
    fields.retain(|f| f.subresource.as_deref() == Some("status"));
    for f in fields.iter_mut() {
        f.fields_v1 = None;
    }
}

/// Drops what a node carries that selection, admission, the expected GPU count and node state
/// never read: everything but its name, version, times, labels, its verdict record annotation, taints, whether it is cordoned,
/// its allocatable resources, its GPU capacity and its `GpuValidated` and `GpuAdmitted`
/// conditions (annotations,
/// addresses, other capacity, other conditions, images, volumes, ...). This is the operator's
/// one cache of Nodes ([`crate::caches::wakes`]).
pub fn trim_node(n: &mut Node) {
    trim_meta(n);
    let m = &mut n.metadata;
    // The node's verdict record is the one annotation read (crate::decide::failure_record).
    m.annotations = m
        .annotations
        .take()
        .map(|mut a| {
            a.retain(|k, _| k == crate::decide::failure_record::ANNOTATION);
            a
        })
        .filter(|a| !a.is_empty());
    m.owner_references = None;
    m.finalizers = None;
    if let Some(spec) = n.spec.as_mut() {
        *spec = k8s_openapi::api::core::v1::NodeSpec {
            taints: spec.taints.take(),
            unschedulable: spec.unschedulable,
            ..Default::default()
        };
    }
    if let Some(s) = n.status.as_mut() {
        let mut capacity = s.capacity.take().unwrap_or_default();
        capacity.retain(|k, _| k == gpuval_crds::GPU_RESOURCE);
        let mut conditions = s.conditions.take().unwrap_or_default();
        // Every condition node state writes: a mark read back without one of them differs
        // from the mark wanted, and the node would be written again on every wake.
        let ours = crate::decide::node_state::OUR_CONDITIONS;
        conditions.retain(|c| ours.contains(&c.type_.as_str()));
        *s = k8s_openapi::api::core::v1::NodeStatus {
            allocatable: s.allocatable.take(),
            capacity: (!capacity.is_empty()).then_some(capacity),
            conditions: (!conditions.is_empty()).then_some(conditions),
            ..Default::default()
        };
    }
}
