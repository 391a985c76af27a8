//! What a training run reports when a replica is stuck inside a host NCCL call: on real GPUs
//! the engine's watchdog ends the process with these words; the simulated node's
//! `hang=training@G` reports the same.

/// The communicator's setup, the call a replica that never joins leaves the others inside.
pub const INIT_CALL: &str = "ncclCommInitRank";

/// One replica: its rank and its GPU's NVML index.
pub type RankGpu = (u32, u32);

/// `ncclCommInitRank did not return within 15s on rank 0 (GPU 0), rank 2 (GPU 2); rank 1
/// (GPU 1) never joined (...); the training process ended to free the GPUs`: the call, the
/// replicas inside it and, for the communicator's setup, those that never came, which are the
/// ones to look at.
pub fn message(call: &str, seconds: f64, inside: &[RankGpu], absent: &[RankGpu]) -> String {
    let names = |list: &[RankGpu]| {
        list.iter()
            .map(|(r, g)| format!("rank {r} (GPU {g})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut msg = format!(
        "{call} did not return within {seconds:.0}s on {}",
        names(inside)
    );
    if call == INIT_CALL && !absent.is_empty() {
        msg.push_str(&format!(
            "; {} never joined (its GPU or its replica's setup is the one to look at)",
            names(absent)
        ));
    }
    msg.push_str("; the training process ended to free the GPUs");
    msg
}
