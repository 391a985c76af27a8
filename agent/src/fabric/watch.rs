//! An NCCL group whose members stop together. While each member runs its part of the
//! collective, it watches the group's control channel: the first member whose part fails tells
//! the host, the host tells the others, and each stops its part at once (its sweep process is
//! ended) instead of waiting out NCCL's own timeout. The group's outcome is then known within
//! moments of its first fatal error, and so is the round's.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use gpuval_crds::fabric::{FabricError, FabricErrorKind};
use serde::{Deserialize, Serialize};

use super::Assignment;
use super::rendezvous::{Control, Link, Sender, error_of};

/// What a member tells the group when its part ends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
enum News {
    /// Its part ended well.
    Done,
    /// Its part failed: the others stop.
    Failed { node: String },
}

/// Runs `work` (this member's part; it stops soon after the flag it is given is set) while
/// watching the group's control channel in `link`. Fails with an `Aborted` error naming the member
/// that failed first when `work` failed after another member's failure stopped it.
pub fn together<T>(
    a: &Assignment,
    link: &mut Link,
    work: impl FnOnce(&AtomicBool) -> Result<T, FabricError>,
) -> Result<T, FabricError> {
    let stop = AtomicBool::new(false);
    let me = a.nodes.get(a.rank).cloned().unwrap_or_default();
    let is_host = matches!(link, Link::Host { .. });
    let controls: Vec<&mut Control> = match link {
        Link::Host { members, .. } => members.iter_mut().collect(),
        Link::Member { host } => vec![host],
    };
    let senders: Result<Vec<Sender>, _> = controls.iter().map(|c| c.sender()).collect();
    let senders = match senders {
        Ok(s) => Mutex::new(s),
        Err(e) => {
            tracing::warn!(error = %e, "fabric group: cannot watch the group; running unwatched");
            return work(&stop);
        }
    };
    let heard: Mutex<Option<String>> = Mutex::new(None);
    let result = std::thread::scope(|s| {
        for (i, ctl) in controls.into_iter().enumerate() {
            let (stop, heard, senders) = (&stop, &heard, &senders);
            s.spawn(move || {
                // An error here is the end of the channel: this side finished and stopped
                // reading, or the peer is gone (its own report says why).
                let Ok(News::Failed { node }) = ctl.recv::<News>(a.deadline) else {
                    return;
                };
                tracing::info!(failed = %node, "fabric group: a member failed; stopping");
                if let Ok(mut h) = heard.lock() {
                    h.get_or_insert(node.clone());
                }
                stop.store(true, Ordering::SeqCst);
                if is_host && let Ok(mut all) = senders.lock() {
                    for (j, other) in all.iter_mut().enumerate() {
                        if j != i {
                            let _ = other.send(&News::Failed { node: node.clone() }, a.deadline);
                        }
                    }
                }
            });
        }
        let result = work(&stop);
        // What was heard before this member's own part ended: news that arrives after it (the
        // host's own stop, answering this member's failure) must not recast its own error.
        let heard_before = heard.lock().ok().and_then(|h| h.clone());
        let news = match &result {
            Ok(_) => News::Done,
            Err(_) => News::Failed { node: me.clone() },
        };
        if let Ok(mut all) = senders.lock() {
            for other in all.iter_mut() {
                // A peer that cannot be told finds out from NCCL or its deadline.
                let _ = other.send(&news, a.deadline);
                other.stop_reading();
            }
        }
        (result, heard_before)
    });
    let (result, first) = result;
    match (result, first) {
        (Err(_), Some(node)) if node != me => Err(error_of(
            FabricErrorKind::Aborted,
            format!("aborted: member {node} of the group failed first, and this member stopped"),
        )),
        (r, _) => r,
    }
}
