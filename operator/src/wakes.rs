//! One watch of Nodes and one of node results serve the whole operator: the validation
//! controller's ([`crate::controller`]) fills the stores every controller reads, and wakes the
//! node-state and schedule controllers from the same events. Each store is filled before the
//! wake it causes is sent, so a woken reconcile never reads an object older than its event.
//! (Three watches and three caches of every Node cost the operator a copy of each node per
//! controller.)

#[cfg(test)]
use futures::StreamExt;
use futures::{Stream, stream};
use gpuval_crds::GpuNodeResult;
use gpuval_crds::result_meta::ReportMeta;
use kube::api::PartialObjectMeta;
use tokio::sync::{mpsc, watch};

/// What the node-state controller is woken for: a node changed (it keeps only the changes to
/// its own marks), or a result of a node changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeWake {
    Node(String),
    Result(String),
}

/// The sending side, held by the validation controller's watches.
#[derive(Clone)]
pub struct Wakes {
    node_state: mpsc::UnboundedSender<NodeWake>,
    nodes_changed: watch::Sender<()>,
}

/// The receiving sides, one per woken controller.
pub struct Woken {
    pub node_state: mpsc::UnboundedReceiver<NodeWake>,
    pub nodes_changed: watch::Receiver<()>,
}

impl Wakes {
    pub fn new() -> (Self, Woken) {
        let (node_state, node_state_rx) = mpsc::unbounded_channel();
        let (nodes_changed, nodes_changed_rx) = watch::channel(());
        (
            Self {
                node_state,
                nodes_changed,
            },
            Woken {
                node_state: node_state_rx,
                nodes_changed: nodes_changed_rx,
            },
        )
    }

    /// Node `name` was added, changed or removed (its store already says so).
    pub fn node_touched(&self, name: &str) {
        // A controller that has stopped has nothing left to wake.
        let _ = self.node_state.send(NodeWake::Node(name.to_string()));
        self.nodes_changed.send_replace(());
    }

    /// Result `r` was added, changed or removed (its store already says so).
    pub fn result_touched(&self, r: &PartialObjectMeta<GpuNodeResult>) {
        // A result with a report (its agent's labels) about a node wakes that node.
        let m = &r.metadata;
        let reported = ReportMeta::read(m.labels.as_ref(), m.annotations.as_ref()).is_some();
        if let (true, Some(node)) = (reported, gpuval_crds::binding::node_of(m)) {
            let _ = self.node_state.send(NodeWake::Result(node.to_string()));
        }
    }
}

/// The node-state controller's wakes as a stream.
pub fn node_wakes(rx: mpsc::UnboundedReceiver<NodeWake>) -> impl Stream<Item = NodeWake> {
    stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|w| (w, rx)) })
}

/// One item each time some Node changed since the last was taken: changes that come faster
/// than the reader coalesce into one (the schedule controller rereads every node anyway).
pub fn nodes_changed(rx: watch::Receiver<()>) -> impl Stream<Item = ()> {
    stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok().map(|()| ((), rx))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn node_changes_reach_both_controllers_and_coalesce_for_schedules() {
        let (wakes, woken) = Wakes::new();
        wakes.node_touched("gpu-a");
        wakes.node_touched("gpu-b");
        let mut node_state = Box::pin(node_wakes(woken.node_state));
        assert_eq!(
            node_state.next().await,
            Some(NodeWake::Node("gpu-a".into()))
        );
        assert_eq!(
            node_state.next().await,
            Some(NodeWake::Node("gpu-b".into()))
        );
        let mut schedules = Box::pin(nodes_changed(woken.nodes_changed));
        assert_eq!(schedules.next().await, Some(()), "two changes, one wake");
        wakes.node_touched("gpu-c");
        assert_eq!(schedules.next().await, Some(()));
        drop(wakes);
        assert_eq!(
            schedules.next().await,
            None,
            "the sender gone ends the stream"
        );
    }
}
