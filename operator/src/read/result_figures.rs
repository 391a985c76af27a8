//! Brings each node's latest result figures to the metrics ([`crate::services::metrics::Fleet`]).
//!
//! The operator watches results as metadata only, so that thousands of reports never sit in
//! its memory. When a result's verdict label appears, the newest result of that node is read
//! once in full (a GET of about 10 to 25 KB), its figures kept (a few hundred bytes a GPU) and
//! the report dropped. Offers are coalesced per node (a node's older results are never read, so
//! a restart reads one result a node, not every result ever kept) and at most
//! [`CONCURRENCY`] reads run at once. A result whose status is not written yet is read again
//! when its next metadata change arrives.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use gpuval_crds::{GpuNodeResult, labels};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PartialObjectMeta, ResourceExt};
use kube::runtime::reflector::Store;
use tokio::sync::Notify;

use crate::services::metrics::{Fleet, NodeLatest};

/// Result reads in flight at once.
pub const CONCURRENCY: usize = 4;
/// How often nodes that left the cluster are dropped from the metrics.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// Pause before a failed read is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// A result to read: its name, uid and creation time (unix seconds).
#[derive(Clone, Debug, PartialEq)]
struct Candidate {
    name: String,
    uid: String,
    created: i64,
}

/// Coalesces result offers per node and reads them in the background.
pub struct FigureFetcher {
    fleet: Arc<Fleet>,
    ports: Arc<crate::services::port_metrics::FabricPorts>,
    pending: Mutex<BTreeMap<String, Candidate>>,
    wake: Notify,
}

impl FigureFetcher {
    pub fn new(fleet: Arc<Fleet>, ports: Arc<crate::services::port_metrics::FabricPorts>) -> Self {
        Self {
            fleet,
            ports,
            pending: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Candidate>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes a result seen by the metadata watch: read later if it has a verdict, is not
    /// closed (a late report: [`gpuval_crds::binding::closed`]) and is the newest result of its
    /// node not yet held.
    pub fn offer(&self, r: &PartialObjectMeta<GpuNodeResult>) {
        if gpuval_crds::binding::closed(&r.metadata).is_some() {
            return;
        }
        let Some(view) = crate::read::observe::result_view(r) else {
            return;
        };
        let uid = r.metadata.uid.clone().unwrap_or_default();
        let created = r
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second());
        // The ports ride on the metadata itself: no read needed.
        if let Some(ports) = view.ports.clone() {
            self.ports.update(
                &view.node,
                crate::services::port_metrics::HeldPorts {
                    created,
                    simulated: view.facts.simulated,
                    ports: ports.ports,
                },
            );
        }
        if self.fleet.has_newer_or_same(&view.node, &uid, created) {
            return;
        }
        let mut pending = self.pending();
        if pending.get(&view.node).is_some_and(|c| c.created > created) {
            return;
        }
        pending.insert(
            view.node,
            Candidate {
                name: r.name_any(),
                uid,
                created,
            },
        );
        drop(pending);
        self.wake.notify_one();
    }

    /// Reads offered results until the process ends; drops nodes that left the cluster.
    pub async fn run(self: Arc<Self>, api: Api<GpuNodeResult>, nodes: Store<Node>) {
        let mut prune = tokio::time::interval(PRUNE_EVERY);
        loop {
            tokio::select! {
                () = self.wake.notified() => {}
                _ = prune.tick() => {
                    // An empty store is one not filled yet (a cluster without nodes has nothing
                    // to export either): nothing is dropped on its word.
                    let live: std::collections::HashSet<String> =
                        nodes.state().iter().map(|n| n.name_any()).collect();
                    if !live.is_empty() {
                        self.fleet.retain_nodes(|n| live.contains(n));
                        self.ports.retain_nodes(|n| live.contains(n));
                    }
                    continue;
                }
            }
            let batch = std::mem::take(&mut *self.pending());
            let failed = self.read_batch(&api, batch).await;
            if !failed.is_empty() {
                tokio::time::sleep(RETRY_AFTER).await;
                let mut pending = self.pending();
                for (node, c) in failed {
                    pending.entry(node).or_insert(c);
                }
                drop(pending);
                self.wake.notify_one();
            }
        }
    }
}

impl FigureFetcher {
    /// Reads `batch`, [`CONCURRENCY`] at a time, into the fleet; what failed to read.
    async fn read_batch(
        &self,
        api: &Api<GpuNodeResult>,
        batch: BTreeMap<String, Candidate>,
    ) -> Vec<(String, Candidate)> {
        let outcomes: Vec<_> = futures::stream::iter(batch)
            .map(|(node, c)| async move {
                let outcome = read(api, &node, &c).await;
                (node, c, outcome)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut failed = Vec::new();
        for (node, c, outcome) in outcomes {
            match outcome {
                Ok(Some(latest)) => self.fleet.update(&node, latest),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(node = %node, result = %c.name, error = %e, "reading a result for metrics; trying again");
                    failed.push((node, c));
                }
            }
        }
        failed
    }
}

/// The figures of result `c`; None when it is gone or its report is not written yet.
async fn read(
    api: &Api<GpuNodeResult>,
    node: &str,
    c: &Candidate,
) -> Result<Option<NodeLatest>, kube::Error> {
    let Some(r) = api.get_opt(&c.name).await? else {
        return Ok(None);
    };
    if r.metadata.uid.as_deref() != Some(c.uid.as_str()) {
        return Ok(None);
    }
    let validation = r
        .labels()
        .get(labels::VALIDATION)
        .cloned()
        .unwrap_or_else(|| r.spec.validation.clone());
    Ok(r.status.as_ref().map(|report| {
        tracing::debug!(node, result = %c.name, "result figures read for metrics");
        NodeLatest::from_report(&validation, &c.uid, c.created, report)
    }))
}
