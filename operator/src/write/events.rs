//! Events about a validation, a schedule or a node: best effort (one that cannot be published
//! is logged).

use kube::Resource;
use kube::api::ResourceExt;
use kube::runtime::events::{Event, EventType};

use crate::context::Ctx;
use crate::reconcile::PlannedEvent;

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
            secondary: None,
        };
        if let Err(err) = ctx.recorder.publish(&ev, &reference).await {
            tracing::warn!(kind = %K::kind(&()), name = %obj.name_any(), reason = e.reason, error = %err, "could not publish an event");
        }
    }
}
