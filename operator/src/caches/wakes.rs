//! One watch of Nodes and one of node results serve the whole operator: the validation
//! controller's ([`crate::wiring`]) fills the stores every controller reads, and wakes the
//! node-state and schedule controllers from the same events. Each store is filled before the
//! wake it causes is sent, so a woken reconcile never reads an object older than its event.
//! (Three watches and three caches of every Node cost the operator a copy of each node per
//! controller.)
//!
//! Wakes are batched, never debounced: the first wake of a batch waits at most a window
//! ([`batched`], [`nodes_changed`]), however many follow it. (kube's `Config::debounce`
//! restarts its wait on each trigger, so a steady stream of events faster than the debounce,
//! such as Node updates in a large cluster, postponed every reconcile indefinitely: issue 55.)

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt, stream};
use gpuval_crds::GpuNodeResult;
use gpuval_crds::result_meta::ReportMeta;
use kube::api::PartialObjectMeta;
use tokio::sync::{mpsc, watch};

/// How long a wake waits at most for the batch it opened: triggers of one validation within
/// this window of the first make one reconcile (see [`batched`]); the schedule controller
/// rereads the nodes at most once per window ([`nodes_changed`]).
pub const BATCH: Duration = Duration::from_millis(200);

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

/// One item each time some Node changed since the last was taken, at most one per `window`:
/// changes that come faster coalesce into one (the schedule controller rereads every node
/// anyway), and a change waits at most `window` after the item before.
pub fn nodes_changed(rx: watch::Receiver<()>, window: Duration) -> impl Stream<Item = ()> {
    stream::unfold((rx, false), move |(mut rx, yielded)| async move {
        if yielded {
            tokio::time::sleep(window).await;
        }
        rx.changed().await.ok().map(|()| ((), (rx, true)))
    })
}

/// `input` in batches: the first item opens a batch that closes `window` later, and each
/// distinct item that came in it is yielded once then, in the order it first came. No item
/// waits longer than `window` however often items come (a debounce would restart its wait).
pub fn batched<T>(
    input: impl Stream<Item = T> + Send + 'static,
    window: Duration,
) -> impl Stream<Item = T> + Send + 'static
where
    T: Eq + Hash + Clone + Send + 'static,
{
    let state = (input.boxed(), VecDeque::new(), false);
    stream::unfold(state, move |(mut input, mut out, mut ended)| async move {
        if out.is_empty() && !ended {
            (out, ended) = next_batch(&mut input, window).await;
        }
        let item = out.pop_front()?;
        Some((item, (input, out, ended)))
    })
}

/// The next batch of `input` (see [`batched`]), and whether `input` ended.
async fn next_batch<T: Eq + Hash + Clone>(
    input: &mut BoxStream<'static, T>,
    window: Duration,
) -> (VecDeque<T>, bool) {
    let Some(first) = input.next().await else {
        return (VecDeque::new(), true);
    };
    let mut seen = HashSet::from([first.clone()]);
    let mut out = VecDeque::from([first]);
    let close = tokio::time::sleep(window);
    tokio::pin!(close);
    loop {
        tokio::select! {
            biased;
            () = &mut close => return (out, false),
            item = input.next() => match item {
                Some(t) => {
                    if seen.insert(t.clone()) {
                        out.push_back(t);
                    }
                }
                None => return (out, true),
            },
        }
    }
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
        let mut schedules = Box::pin(nodes_changed(woken.nodes_changed, Duration::ZERO));
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

    #[tokio::test]
    async fn a_steady_stream_of_wakes_never_postpones_a_batch_beyond_its_window() {
        let window = Duration::from_millis(50);
        // A wake every 5 ms for 2 s: a restarting debounce would yield nothing until the end.
        let input = stream::iter(0..400u32).then(|i| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            i % 3
        });
        let start = tokio::time::Instant::now();
        let mut batches = Box::pin(batched(input, window));
        let mut firsts = Vec::new();
        while let Some(item) = batches.next().await {
            if item == 0 {
                firsts.push(start.elapsed());
            }
        }
        let ended = start.elapsed();
        assert!(
            firsts[0] < ended / 4,
            "the first batch long before the stream ends ({ended:?}): {firsts:?}"
        );
        assert!(firsts.len() >= 5, "a batch per window: {firsts:?}");
    }

    #[tokio::test]
    async fn a_batch_yields_each_item_once_in_the_order_it_came() {
        let input = stream::iter(["b", "a", "b", "c", "a"]);
        let out: Vec<&str> = batched(input, Duration::from_millis(20)).collect().await;
        assert_eq!(out, ["b", "a", "c"]);
    }

    #[tokio::test]
    async fn node_changes_wake_schedules_at_most_once_a_window() {
        let (wakes, woken) = Wakes::new();
        let window = Duration::from_millis(300);
        let mut schedules = Box::pin(nodes_changed(woken.nodes_changed, window));
        wakes.node_touched("gpu-a");
        let start = tokio::time::Instant::now();
        assert_eq!(schedules.next().await, Some(()));
        assert!(start.elapsed() < window, "the first change at once");
        wakes.node_touched("gpu-b");
        wakes.node_touched("gpu-c");
        assert_eq!(schedules.next().await, Some(()));
        assert!(start.elapsed() >= window, "{:?}", start.elapsed());
    }
}
