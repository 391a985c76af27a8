//! Events about a validation, a schedule or a node: best effort (one that cannot be published
//! is logged).

use gpuval_crds::GpuValidation;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Resource;
use kube::api::ResourceExt;
use kube::runtime::events::{Event, EventType};

use crate::context::Ctx;
use crate::decide::reconcile::{PlannedEvent, Related};

/// The reference an event's `related` names: the recorder keeps events about different nodes
/// or runs apart by it (see [`Related`]).
pub fn related_reference(related: &Related) -> ObjectReference {
    let (api_version, kind, name) = match related {
        Related::Node(n) => (Node::api_version(&()), Node::kind(&()), n),
        Related::Run(n) => (GpuValidation::api_version(&()), GpuValidation::kind(&()), n),
    };
    ObjectReference {
        api_version: Some(api_version.into_owned()),
        kind: Some(kind.into_owned()),
        name: Some(name.clone()),
        ..Default::default()
    }
}

/// Publishes `events` about `obj` (a validation or a schedule), logging the ones that could
/// not be published.
pub async fn publish<K>(obj: &K, ctx: &Ctx, events: &[PlannedEvent])
where
    K: Resource<DynamicType = ()>,
{
    let reference = obj.object_ref(&());
    for e in events {
        let ev = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.into(),
            note: Some(e.note.clone()),
            action: "Reconcile".into(),
            secondary: e.related.as_ref().map(related_reference),
        };
        if let Err(err) = ctx.recorder.publish(&ev, &reference).await {
            tracing::warn!(kind = %K::kind(&()), name = %obj.name_any(), reason = e.reason, error = %err, "could not publish an event");
        }
    }
}
