//! Whose failure an error is, from its words: a member's own (its communicator could not start
//! on its side) or one that another member's failure explains (a peer that exited or closed the
//! connection, a timeout waiting for peers, an abort after another rank's error).
//!
//! NCCL reports a peer's death on every surviving rank, often in the words of a system error
//! ("remote process exited or there was a network error"); the agent that saw it cannot always
//! tell. The planner reads each error again here, so an error a peer explains never names the
//! member that reported it, whatever kind the agent gave it.

use gpuval_crds::fabric::{FabricError, FabricErrorKind};

/// Words of this node's own GPU failing: its own whatever else the message says (checked
/// first).
const GPU: &[&str] = &[
    "cuda error",
    "cudaerror",
    "xid",
    "launch timed out",
    "out of memory",
    "wrong element",
    "no gpu",
    "gpu(s) but the round counts",
];

/// Words that say this node's own side could not start (checked after the peer words: a
/// message that quotes a peer's reason is about that peer).
const LOCAL: &[&str] = &[
    "no ip interface",
    "no socket interface",
    "no interface found",
    "no device found",
    "cannot open shared object",
    "library not found",
    "libnccl",
    "cuda driver",
];

/// Words that say a peer's failure stopped this member.
const PEER: &[&str] = &[
    "remote process exited",
    "closed by remote peer",
    "connection reset",
    "connection refused",
    "broken pipe",
    "remote error",
    "ncclremoteerror",
    "timed out",
    "timeout",
    "did not return within",
    "silent",
    "stuck",
    // The agent's watchdog killed a sweep that made no progress: a group that stalls (a peer
    // too slow or hung) stalls every member, and whose watchdog fires first is chance (4x
    // H200: a healthy member's, beside a throttled node).
    "reported nothing for",
    "never joined",
    "never came",
    "waiting for",
    "abort",
    "stopped the collective",
    "could not reach",
    "a member left",
];

/// The kind of failure `message` describes, or `None` when its words do not say.
pub fn kind_of(message: &str) -> Option<FabricErrorKind> {
    let text = message.to_lowercase();
    let says = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if says(GPU) {
        Some(FabricErrorKind::Local)
    } else if says(PEER) {
        Some(FabricErrorKind::Peer)
    } else if says(LOCAL) {
        Some(FabricErrorKind::Local)
    } else {
        None
    }
}

/// The kind the planner takes `e` to be: what its words say, else what the agent said.
pub fn attribute(e: &FabricError) -> FabricErrorKind {
    kind_of(&e.message).unwrap_or(e.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(m: &str) -> FabricError {
        FabricError {
            kind: FabricErrorKind::Local,
            message: m.into(),
        }
    }

    #[test]
    fn a_peer_that_closed_the_connection_is_not_this_nodes_fault() {
        // The words rank 0 of a healthy node reported on real H100s when vm-3 had no interface.
        let e = local(
            "ncclCommInitRank: remote process exited or there was a network error \
             (NCCL: socketProgress: Connection closed by remote peer 10.0.0.4<43122>)",
        );
        assert_eq!(attribute(&e), FabricErrorKind::Peer);
        for m in [
            "rank 0: ncclCommInitRank did not return within 65s",
            "the collective was aborted: Timeout at rank 3",
            "Bootstrap: connection refused by 10.0.0.2:29401",
            "NCCL WARN Net : Connection reset by peer",
            // A message quoting the peer's own reason is about the peer.
            "remote process exited (member n1: NET/Socket : no interface found)",
        ] {
            assert_eq!(kind_of(m), Some(FabricErrorKind::Peer), "{m}");
        }
    }

    #[test]
    fn an_own_side_that_could_not_start_is_local() {
        for m in [
            "ncclCommInitRank: invalid usage (NET/IB : No IP interface found.)",
            "Bootstrap : no socket interface found",
            "libnccl.so.2: cannot open shared object file",
            "CUDA error 999 unknown error on GPU 2",
            "3 wrong element(s) received on this node's GPU rank 1",
            "CUDA error: the launch timed out and was terminated",
        ] {
            assert_eq!(kind_of(m), Some(FabricErrorKind::Local), "{m}");
        }
    }

    #[test]
    fn words_that_say_nothing_keep_the_agents_kind() {
        let e = local("something new");
        assert_eq!(attribute(&e), FabricErrorKind::Local);
        let p = FabricError {
            kind: FabricErrorKind::Peer,
            message: "something new".into(),
        };
        assert_eq!(attribute(&p), FabricErrorKind::Peer);
    }
}
