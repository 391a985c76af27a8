//! Processes the agent starts that use the GPUs (the NCCL sweep's children): each is adopted
//! here when it starts, so that the foreign-process watch (`crate::runner::processes`) never
//! takes it for another tenant's work. Its name alone is not enough: NVML cannot name a process
//! that is exiting, or one in another PID namespace, and the 4x H200 smoke saw the sweep's
//! child reported as an unnamed process.

use std::collections::BTreeSet;
use std::sync::Mutex;

static CHILDREN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn children() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    CHILDREN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Notes `pid`, a process this agent started, as its own (kept for the process's life: a pid
/// reused by another tenant after the child exited would be rare within one run, and is then
/// still a process the checks overlapped with only briefly).
pub fn adopt(pid: u32) {
    children().insert(pid);
}

/// True for a process this agent started.
pub fn is_own(pid: u32) -> bool {
    children().contains(&pid)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_adopted_child_is_the_agent_s_own() {
        assert!(!super::is_own(4_000_000_001));
        super::adopt(4_000_000_001);
        assert!(super::is_own(4_000_000_001));
    }
}
