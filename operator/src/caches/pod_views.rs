//! The operator's cache of its agent pods, as the reconcile steps see them ([`PodView`]: name,
//! node, generation, phase, reason, finish time, IP) with the uid of the validation that owns
//! each: about 300 bytes a pod, where a cached `Pod` object costs about 4 KB even trimmed (the
//! struct alone is 2.4 KB, its label and annotation maps half a KB each). Filled from the pod
//! watch's events as they pass to the controller ([`PodViews::apply`]), so a reconcile woken by
//! a pod sees that pod's state.

use std::collections::HashMap;
use std::sync::RwLock;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::decide::pod_reading::pod_view;
use crate::decide::reconcile::PodView;

/// A cached pod: the validation that owns it (uid), its own uid (results name their writer by
/// it) and its view.
#[derive(Debug, Clone, PartialEq)]
struct Held {
    owner: Option<String>,
    uid: Option<String>,
    view: PodView,
}

/// A pod as a result names its writer: name and uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub name: String,
    pub uid: Option<String>,
}

#[derive(Debug, Default)]
struct Views {
    /// By pod name.
    live: HashMap<String, Held>,
    /// Filled during a (re)list, then swapped in.
    relist: Option<HashMap<String, Held>>,
}

/// Every agent pod's view, by name.
#[derive(Debug)]
pub struct PodViews {
    views: RwLock<Views>,
    ready: watch::Sender<bool>,
}

impl Default for PodViews {
    fn default() -> Self {
        Self {
            views: RwLock::default(),
            ready: watch::Sender::new(false),
        }
    }
}

/// The uid of the validation that owns `p`, if one does.
fn owner(p: &Pod) -> Option<String> {
    let kind = <gpuval_crds::GpuValidation as kube::Resource>::kind(&());
    p.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == kind)
        .map(|o| o.uid.clone())
}

/// `p` as held (None for a pod without a name or the labels the operator sets).
fn held(p: &Pod) -> Option<(String, Held)> {
    let name = p.metadata.name.clone()?;
    let view = pod_view(p)?;
    Some((
        name,
        Held {
            owner: owner(p),
            uid: p.metadata.uid.clone(),
            view,
        },
    ))
}

impl PodViews {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Views> {
        self.views.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Views> {
        self.views.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one event of the pod watch (a list starts, an object of it, the list is done;
    /// an object changed or went). Returns the pods a relist found gone (no event tells of
    /// them): their owner's uid, name and node.
    pub fn apply(&self, event: &watcher::Event<Pod>) -> Vec<(String, String, String)> {
        let mut gone = Vec::new();
        let mut v = self.write();
        match event {
            watcher::Event::Init => v.relist = Some(HashMap::new()),
            watcher::Event::InitApply(p) => {
                if let (Some(relist), Some((name, h))) = (v.relist.as_mut(), held(p)) {
                    relist.insert(name, h);
                }
            }
            watcher::Event::InitDone => {
                if let Some(relist) = v.relist.take() {
                    let old = std::mem::replace(&mut v.live, relist);
                    gone = old
                        .into_iter()
                        .filter(|(name, _)| !v.live.contains_key(name))
                        .filter_map(|(name, h)| Some((h.owner?, name, h.view.node)))
                        .collect();
                }
                drop(v);
                self.ready.send_replace(true);
            }
            watcher::Event::Apply(p) => match held(p) {
                Some((name, h)) => {
                    v.live.insert(name, h);
                }
                None => {
                    if let Some(name) = p.metadata.name.as_deref() {
                        v.live.remove(name);
                    }
                }
            },
            watcher::Event::Delete(p) => {
                if let Some(name) = p.metadata.name.as_deref() {
                    v.live.remove(name);
                }
            }
        }
        gone
    }

    /// The view of pod `name` when the validation with `uid` owns it.
    pub fn get(&self, name: &str, uid: &str) -> Option<PodView> {
        self.read()
            .live
            .get(name)
            .filter(|h| h.owner.as_deref() == Some(uid))
            .map(|h| h.view.clone())
    }

    /// Pod `name`'s identity, whoever owns it (the freshness rule compares a result's writer
    /// with the pod now in place on its node).
    pub fn identity(&self, name: &str) -> Option<PodIdentity> {
        self.read().live.get(name).map(|h| PodIdentity {
            name: name.to_string(),
            uid: h.uid.clone(),
        })
    }

    /// Each node's pod of the run of `generation` of the validation with `uid`, by node.
    pub fn current_by_node(&self, uid: &str, generation: i64) -> HashMap<String, PodIdentity> {
        self.read()
            .live
            .iter()
            .filter(|(_, h)| h.owner.as_deref() == Some(uid) && h.view.generation == generation)
            .map(|(name, h)| {
                let id = PodIdentity {
                    name: name.clone(),
                    uid: h.uid.clone(),
                };
                (h.view.node.clone(), id)
            })
            .collect()
    }

    /// The views of every pod the validation with `uid` owns.
    pub fn owned_by(&self, uid: &str) -> Vec<PodView> {
        self.read()
            .live
            .values()
            .filter(|h| h.owner.as_deref() == Some(uid))
            .map(|h| h.view.clone())
            .collect()
    }

    /// Pods held.
    pub fn len(&self) -> usize {
        self.read().live.len()
    }

    /// True when no pod is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once the first list is in.
    pub async fn wait_until_ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives as long as `self`: the wait ends with the first list.
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;

    fn pod(name: &str, owner_uid: &str, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    [(gpuval_crds::labels::GENERATION.to_string(), "1".to_string())].into(),
                ),
                annotations: Some(
                    [(
                        gpuval_crds::labels::NODE.to_string(),
                        format!("node-{name}"),
                    )]
                    .into(),
                ),
                owner_references: Some(vec![OwnerReference {
                    kind: "GpuValidation".into(),
                    uid: owner_uid.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[tokio::test]
    async fn a_list_then_changes_give_each_pods_view_to_its_owner_only() {
        let views = PodViews::default();
        views.apply(&watcher::Event::Init);
        views.apply(&watcher::Event::InitApply(pod("a", "u1", "Running")));
        assert!(views.is_empty(), "a list counts once it is done");
        views.apply(&watcher::Event::InitDone);
        views.wait_until_ready().await;
        views.apply(&watcher::Event::Apply(pod("b", "u1", "Pending")));
        views.apply(&watcher::Event::Apply(pod("c", "u2", "Pending")));
        let a = views.get("a", "u1").unwrap();
        assert_eq!(
            (a.node.as_str(), a.phase),
            ("node-a", crate::decide::reconcile::PodPhase::Running)
        );
        assert_eq!(views.get("a", "u2"), None, "another validation's uid");
        assert_eq!(views.owned_by("u1").len(), 2);
        views.apply(&watcher::Event::Delete(pod("a", "u1", "Running")));
        assert_eq!(views.get("a", "u1"), None);
        // A relist replaces what was held: a pod that went while the watch was away is gone.
        views.apply(&watcher::Event::Init);
        views.apply(&watcher::Event::InitApply(pod("c", "u2", "Succeeded")));
        let gone = views.apply(&watcher::Event::InitDone);
        assert_eq!(
            gone,
            [("u1".to_string(), "b".to_string(), "node-b".to_string())]
        );
        assert_eq!(views.len(), 1);
        assert_eq!(
            views.get("c", "u2").map(|v| v.phase),
            Some(crate::decide::reconcile::PodPhase::Succeeded)
        );
    }
}
