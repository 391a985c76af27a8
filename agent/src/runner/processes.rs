//! Who else runs on the GPUs under test: NVML's compute and graphics processes on each GPU,
//! read before the checks, sampled during them (with the telemetry) and read after them. A
//! process that is not the agent's fails that GPU, naming its pid, name and memory (its
//! figures may have been shared with it), unless the administrator allows sharing GPUs, when
//! it is a Warn.
//!
//! The agent's own processes are those with its pid (its own view, and the pids NVML gave it
//! when the backend opened the GPUs: in a container NVML reports the host's pids), and those
//! NVML names as its executable (the NCCL sweep's child processes are the same executable).
//! A process NVML cannot name and whose pid is not the agent's may still be an agent child seen
//! from another PID namespace: it is a Warn (`ProcessUnidentified`), never a Fail.

use std::collections::{BTreeMap, BTreeSet};

use gpuval_crds::{ForeignProcess, GpuReport, Verdict};

use crate::backend::{GpuInfo, GpuProcess, Platform};
use crate::judge::{Code, Says, push_unique};

/// When a process was seen, in the order of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Before,
    During,
    After,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::During => "during",
            Phase::After => "after",
        }
    }
}

/// The agent as NVML lists it: its pid and its executable's file name.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    pub pids: BTreeSet<u32>,
    pub exe: Option<String>,
}

impl Owner {
    /// This process, with the pids the backend learned NVML gives it.
    pub fn this_process(platform: &dyn Platform) -> Self {
        let exe = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        let mut pids: BTreeSet<u32> = platform.own_pids().into_iter().collect();
        pids.insert(std::process::id());
        Self { pids, exe }
    }

    /// True for the agent's own processes.
    pub fn owns(&self, p: &GpuProcess) -> bool {
        if self.pids.contains(&p.pid) || crate::backend::children::is_own(p.pid) {
            return true;
        }
        let file_name = |n: &str| n.rsplit('/').next().unwrap_or(n).trim().to_string();
        match (&self.exe, &p.name) {
            (Some(exe), Some(name)) => file_name(name) == *exe,
            _ => false,
        }
    }
}

/// One foreign process as seen over the run.
#[derive(Debug, Clone, Default, PartialEq)]
struct Sighting {
    name: Option<String>,
    max_bytes: Option<u64>,
    phases: BTreeSet<Phase>,
}

/// Every foreign process seen, by GPU and pid.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sightings {
    by_gpu: BTreeMap<u32, BTreeMap<u32, Sighting>>,
}

impl Sightings {
    /// Records what one reading of `gpu` listed.
    pub fn record(&mut self, owner: &Owner, gpu: u32, phase: Phase, listed: &[GpuProcess]) {
        for p in listed.iter().filter(|p| !owner.owns(p)) {
            let s = self
                .by_gpu
                .entry(gpu)
                .or_default()
                .entry(p.pid)
                .or_default();
            if s.name.is_none() {
                s.name.clone_from(&p.name);
            }
            s.max_bytes = s.max_bytes.max(p.used_memory_bytes);
            s.phases.insert(phase);
        }
    }

    /// Reads every GPU once (a GPU NVML cannot list is skipped: that is no evidence).
    pub fn read(&mut self, platform: &dyn Platform, gpus: &[GpuInfo], owner: &Owner, phase: Phase) {
        for g in gpus {
            if let Ok(listed) = platform.processes(g.index) {
                self.record(owner, g.index, phase, &listed);
            }
        }
    }

    /// Adds another set of sightings (the sampler's) to these.
    pub fn merge(&mut self, other: Sightings) {
        for (gpu, procs) in other.by_gpu {
            let mine = self.by_gpu.entry(gpu).or_default();
            for (pid, s) in procs {
                let m = mine.entry(pid).or_default();
                if m.name.is_none() {
                    m.name = s.name;
                }
                m.max_bytes = m.max_bytes.max(s.max_bytes);
                m.phases.extend(s.phases);
            }
        }
    }

    /// Writes each GPU's foreign processes into its report and fails it (a Warn where sharing
    /// is allowed).
    pub fn judge(&self, allow_shared: bool, gpus: &mut [GpuReport]) {
        for g in gpus {
            let Some(procs) = u32::try_from(g.index)
                .ok()
                .and_then(|i| self.by_gpu.get(&i))
            else {
                continue;
            };
            let mut reasons = Vec::new();
            for (pid, s) in procs {
                let found = foreign(*pid, s);
                let (code, level) = match (s.name.is_some(), allow_shared) {
                    (_, true) => (Code::ForeignProcessAllowed, Verdict::Warn),
                    (false, false) => (Code::ProcessUnidentified, Verdict::Warn),
                    (true, false) => (Code::ForeignProcess, Verdict::Fail),
                };
                reasons.push(code.says(message(g.index, &found, code)));
                g.foreign_processes.push(found);
                g.verdict = g.verdict.max(level);
            }
            push_unique(&mut g.reasons, reasons);
        }
    }
}

fn foreign(pid: u32, s: &Sighting) -> ForeignProcess {
    ForeignProcess {
        pid: i64::from(pid),
        name: s.name.clone().unwrap_or_else(|| "unknown".into()),
        used_memory_mib: s
            .max_bytes
            .map(|b| i64::try_from(b >> 20).unwrap_or(i64::MAX)),
        seen: s.phases.iter().map(|p| p.as_str().to_string()).collect(),
    }
}

/// `GPU2: process 4242 (python3, 10240 MiB) ran on the GPU during the checks (seen before,
/// during): stop it and rerun, ...`.
fn message(gpu: i32, p: &ForeignProcess, code: Code) -> String {
    let memory = p
        .used_memory_mib
        .map(|m| format!(", {m} MiB"))
        .unwrap_or_default();
    let what_to_do = match code {
        Code::ForeignProcessAllowed => {
            "sharing GPUs is allowed, so the figures may be lower than the GPU can reach"
        }
        Code::ProcessUnidentified => {
            "NVML cannot name it from here (another PID namespace?): if it is not the agent's, \
             stop it and rerun"
        }
        _ => {
            "its work shared the GPU with the checks: stop it and rerun, or allow shared GPUs \
             (--allow-shared-gpus, Helm agent.allowSharedGpus)"
        }
    };
    format!(
        "GPU{gpu}: process {} ({}{memory}) is not the agent's (seen {}): {what_to_do}",
        p.pid,
        p.name,
        p.seen.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            pids: BTreeSet::from([100, 31_337]),
            exe: Some("gpuval-agent".into()),
        }
    }

    fn proc(pid: u32, name: &str, mib: u64) -> GpuProcess {
        GpuProcess {
            pid,
            name: Some(name.into()),
            used_memory_bytes: Some(mib << 20),
            graphics: false,
        }
    }

    #[test]
    fn a_child_the_agent_started_is_its_own_though_nvml_cannot_name_it() {
        let o = owner();
        let unnamed = GpuProcess {
            pid: 4_100_000_007,
            name: None,
            used_memory_bytes: Some(898 << 20),
            graphics: false,
        };
        assert!(!o.owns(&unnamed), "an unnamed stranger is not the agent's");
        crate::backend::children::adopt(unnamed.pid);
        assert!(o.owns(&unnamed));
    }

    #[test]
    fn the_agent_and_its_children_are_its_own() {
        let o = owner();
        assert!(o.owns(&proc(100, "whatever", 1)));
        // The host pid NVML gave the agent when the backend opened the GPUs.
        assert!(o.owns(&proc(31_337, "", 1)));
        assert!(o.owns(&proc(7001, "/usr/local/bin/gpuval-agent", 1)));
        assert!(o.owns(&proc(7002, "gpuval-agent", 1)));
        assert!(!o.owns(&proc(4242, "python3", 1)));
        assert!(!o.owns(&proc(4243, "/opt/gpuval-agent-old", 1)));
        let unnamed = GpuProcess {
            name: None,
            ..proc(4244, "", 1)
        };
        assert!(!o.owns(&unnamed));
    }

    #[test]
    fn a_foreign_process_fails_its_gpu_naming_pid_name_memory_and_when() {
        let o = owner();
        let mut s = Sightings::default();
        s.record(
            &o,
            2,
            Phase::Before,
            &[proc(100, "gpuval-agent", 512), proc(4242, "python3", 1024)],
        );
        let mut during = Sightings::default();
        during.record(&o, 2, Phase::During, &[proc(4242, "python3", 10240)]);
        s.merge(during);
        let mut gpus = vec![
            GpuReport {
                index: 1,
                verdict: Verdict::Pass,
                ..Default::default()
            },
            GpuReport {
                index: 2,
                verdict: Verdict::Pass,
                ..Default::default()
            },
        ];
        s.judge(false, &mut gpus);
        assert_eq!(gpus[0].verdict, Verdict::Pass);
        assert!(gpus[0].foreign_processes.is_empty());
        assert_eq!(gpus[1].verdict, Verdict::Fail);
        let f = &gpus[1].foreign_processes;
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].pid, f[0].name.as_str()), (4242, "python3"));
        assert_eq!(f[0].used_memory_mib, Some(10240));
        assert_eq!(f[0].seen, ["before", "during"]);
        assert_eq!(gpus[1].reasons[0].code, Code::ForeignProcess);
        assert!(
            gpus[1].reasons[0].message.starts_with(
                "GPU2: process 4242 (python3, 10240 MiB) is not the agent's (seen before, during)"
            ),
            "{}",
            gpus[1].reasons[0].message
        );
    }

    #[test]
    fn a_process_nvml_cannot_name_is_a_warn_not_a_fail() {
        let mut s = Sightings::default();
        let unnamed = GpuProcess {
            name: None,
            ..proc(5555, "", 300)
        };
        s.record(&owner(), 0, Phase::During, &[unnamed]);
        let mut gpus = vec![GpuReport {
            index: 0,
            verdict: Verdict::Pass,
            ..Default::default()
        }];
        s.judge(false, &mut gpus);
        assert_eq!(gpus[0].verdict, Verdict::Warn);
        assert_eq!(gpus[0].reasons[0].code, Code::ProcessUnidentified);
        assert_eq!(gpus[0].foreign_processes[0].name, "unknown");
    }

    #[test]
    fn where_sharing_is_allowed_a_foreign_process_is_a_warn() {
        let mut s = Sightings::default();
        s.record(&owner(), 0, Phase::After, &[proc(9, "Xorg", 20)]);
        let mut gpus = vec![GpuReport {
            index: 0,
            verdict: Verdict::Pass,
            ..Default::default()
        }];
        s.judge(true, &mut gpus);
        assert_eq!(gpus[0].verdict, Verdict::Warn);
        assert_eq!(gpus[0].reasons[0].code, Code::ForeignProcessAllowed);
    }
}
