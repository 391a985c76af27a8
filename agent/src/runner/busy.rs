//! Other work on the GPUs under test, seen without a process list. In a pod the agent has its
//! own PID namespace, and NVML lists only the processes inside it: a neighbour in another pod
//! (or on the host) is never named. What no namespace hides is the device's own figures, so the
//! runner reads them (`Platform::occupancy`) before each check, after the checks and, through
//! the sampler, all through them:
//!
//! - **memory in use that no listed process holds** (the device's used memory less what NVML
//!   lists for the processes it shows, the agent's own and its children's among them), over
//!   [`UNLISTED_SLACK_MIB`] in two readings in a row;
//! - **utilisation while the agent runs nothing on the GPU** (the idle probes between checks):
//!   NVML's utilisation samples of the probe's window averaging [`IDLE_BUSY_PERCENT`] or more,
//!   or a process's SM samples that high, with the power drawn then.
//!
//! Either makes the GPU busy: a [`Code::GpuBusy`] finding naming what was seen and when (action
//! Rerun, never a hardware action), or [`Code::GpuBusyAllowed`] where the administrator allows
//! sharing GPUs. Then [`excuse_sharing`] turns every figure that fell short on a busy GPU (and
//! every node-level figure that GPU took part in) into [`Code::FigureWhileBusy`]: it may
//! reflect the sharing, so it is never reported as a hardware fault, nor as a pass.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use gpuval_crds::{GpuReport, NodeReport, Verdict};

use crate::backend::{GpuInfo, Occupancy, Platform};
use crate::judge::{AnyResult, Code, Says, push_unique, verdict_of};
use crate::pod_resources::PodResources;

/// Memory in use beyond what the listed processes hold that still counts as nobody's: the
/// driver's own bookkeeping and the gap between the device's figure and the processes' sums.
pub const UNLISTED_SLACK_MIB: u64 = 384;
/// Mean utilisation over the later half of an idle probe's samples from which the GPU counts as
/// busy, percent.
pub const IDLE_BUSY_PERCENT: u32 = 10;
/// How long an idle probe collects utilisation samples on a real GPU (NVML samples it every
/// 200 ms on an H200). Only the later half of the samples is judged: the driver's scrub of the
/// memory the agent's last check freed shows as utilisation for a sample or two after the
/// check ended (bench/nvml-tail), while other work holds the GPU through the window.
pub const IDLE_WINDOW: Duration = Duration::from_millis(1500);
/// The start of an idle probe's window whose samples are not counted: a sample taken just after
/// a check ended covers the end of that check's own kernels.
pub const IDLE_SETTLE: Duration = Duration::from_millis(300);

/// What was seen of other work on one GPU over the run.
#[derive(Debug, Clone, Default, PartialEq)]
struct Seen {
    /// The most memory in use that no listed process held, MiB, and when it was seen.
    unlisted_mib: Option<u64>,
    unlisted_when: Vec<String>,
    /// The highest idle utilisation (mean of a window), percent, the power then, and when.
    idle_percent: Option<u32>,
    idle_power_w: Option<f64>,
    idle_when: Vec<String>,
    /// Processes NVML sampled using the SMs while the agent ran nothing: pid, highest percent.
    unnamed: BTreeMap<u32, u32>,
}

impl Seen {
    fn is_busy(&self) -> bool {
        self.unlisted_mib.is_some() || self.idle_percent.is_some() || !self.unnamed.is_empty()
    }
}

fn note_when(list: &mut Vec<String>, when: &str) {
    if !list.iter().any(|w| w == when) {
        list.push(when.to_string());
    }
}

/// Everything seen of other work, by GPU.
#[derive(Debug, Default)]
pub struct BusyLog {
    by_gpu: BTreeMap<u32, Seen>,
    /// Readings in a row with unlisted memory over the slack, by GPU.
    streak: BTreeMap<u32, u32>,
}

impl BusyLog {
    /// One reading of `gpu`'s memory at `when`: unlisted memory over the slack in this reading
    /// and the one before it is other work. A reading without every listed process's memory
    /// says nothing (a process whose memory NVML withholds could be the agent's).
    pub fn observe(&mut self, gpu: u32, when: &str, occ: &Occupancy) {
        let listed_known = occ
            .listed_before
            .iter()
            .chain(&occ.listed_after)
            .all(|p| p.used_memory_bytes.is_some());
        let over = occ
            .unlisted_bytes()
            .filter(|_| listed_known)
            .map(|b| b >> 20)
            .filter(|mib| *mib > UNLISTED_SLACK_MIB);
        let streak = self.streak.entry(gpu).or_default();
        let Some(mib) = over else {
            *streak = 0;
            return;
        };
        *streak += 1;
        if *streak >= 2 {
            let seen = self.by_gpu.entry(gpu).or_default();
            seen.unlisted_mib = seen.unlisted_mib.max(Some(mib));
            note_when(&mut seen.unlisted_when, when);
        }
    }

    /// A reading taken while the agent ran nothing on the GPU: its memory as in
    /// [`BusyLog::observe`], and any utilisation in the window is someone else's.
    pub fn observe_idle(&mut self, gpu: u32, when: &str, occ: &Occupancy) {
        self.observe(gpu, when, occ);
        let mean = later_half_mean(&occ.utilization);
        let busy_sm: Vec<(u32, u32)> = occ
            .process_sm
            .iter()
            .copied()
            .filter(|(_, sm)| *sm >= IDLE_BUSY_PERCENT)
            .collect();
        let percent = mean
            .and_then(|m| u32::try_from(m).ok())
            .filter(|m| *m >= IDLE_BUSY_PERCENT);
        if percent.is_none() && busy_sm.is_empty() {
            return;
        }
        let seen = self.by_gpu.entry(gpu).or_default();
        if let Some(p) = percent
            && seen.idle_percent.is_none_or(|had| p >= had)
        {
            seen.idle_percent = Some(p);
            seen.idle_power_w = occ.power_w;
        }
        for (pid, sm) in busy_sm {
            let top = seen.unnamed.entry(pid).or_default();
            *top = (*top).max(sm);
        }
        note_when(&mut seen.idle_when, when);
    }

    /// The GPUs other work was seen on.
    pub fn busy_gpus(&self) -> Vec<u32> {
        self.by_gpu
            .iter()
            .filter(|(_, s)| s.is_busy())
            .map(|(g, _)| *g)
            .collect()
    }

    /// Adds a [`Code::GpuBusy`] finding (or [`Code::GpuBusyAllowed`] where sharing is allowed)
    /// to each GPU other work was seen on, naming what was seen and when, and, where the
    /// kubelet's PodResources API is given, the pods that hold the GPU.
    pub fn judge(
        &self,
        allow_shared: bool,
        pod_resources: Option<&PodResources>,
        gpus: &mut [GpuReport],
    ) {
        let held = pod_resources
            .filter(|_| !self.busy_gpus().is_empty())
            .map(|p| (p, p.list()));
        for g in gpus {
            let Some(seen) = u32::try_from(g.index)
                .ok()
                .and_then(|i| self.by_gpu.get(&i))
                .filter(|s| s.is_busy())
            else {
                continue;
            };
            let (holders, no_pod) = held
                .as_ref()
                .map(|(p, listed)| who_holds(p, listed, g))
                .unwrap_or_default();
            let (code, what_to_do) = if allow_shared {
                (
                    Code::GpuBusyAllowed,
                    "sharing GPUs is allowed, so its figures may reflect the sharing",
                )
            } else if no_pod {
                (
                    Code::GpuHeldByNoPod,
                    "its figures are not judged as hardware: free the GPU and rerun (held in \
                     consecutive runs, it may be stuck after a fault: reset it)",
                )
            } else {
                (
                    Code::GpuBusy,
                    "its figures are not judged as hardware: free the GPU (or find what runs \
                     on it) and rerun",
                )
            };
            let message = format!(
                "GPU{} was busy with other work that the agent cannot see as a process (it \
                 runs in its own PID namespace, or NVML withholds it): {}{holders}; {what_to_do}",
                g.index,
                evidence(seen)
            );
            push_unique(&mut g.reasons, [code.says(message)]);
            g.verdict = g.verdict.max(code.severity().verdict());
        }
    }
}

/// `; the kubelet lists pod ml/trainer-0 (container main) holding it`, or why it cannot say;
/// true when the kubelet's list was read and no other pod holds the GPU.
fn who_holds(
    p: &PodResources,
    listed: &Result<Vec<crate::pod_resources::HeldDevice>, crate::pod_resources::PodResourcesError>,
    g: &GpuReport,
) -> (String, bool) {
    let index = u32::try_from(g.index).unwrap_or(u32::MAX);
    match listed {
        Ok(held) => {
            let pods = crate::pod_resources::holders(held, &g.uuid, index, p.own_pod.as_deref());
            match pods.as_slice() {
                [] => (
                    "; the kubelet lists no other pod holding it (the work runs outside \
                     Kubernetes' device accounting: a host process, a container given the GPU \
                     without asking for it, or a GPU stuck after a fault)"
                        .to_string(),
                    true,
                ),
                [one] => (format!("; the kubelet lists pod {one} holding it"), false),
                many => (
                    format!("; the kubelet lists pods {} holding it", many.join(", ")),
                    false,
                ),
            }
        }
        Err(e) => (format!("; which pod holds it is unknown: {e}"), false),
    }
}

/// `20480 MiB in use that no listed process holds (before compute, during the checks); 100%
/// utilisation at 690 W while the agent ran nothing on it (before compute)`.
fn evidence(seen: &Seen) -> String {
    let mut parts = Vec::new();
    if let Some(mib) = seen.unlisted_mib {
        parts.push(format!(
            "{mib} MiB in use that no listed process holds ({})",
            seen.unlisted_when.join(", ")
        ));
    }
    if let Some(p) = seen.idle_percent {
        let power = seen
            .idle_power_w
            .map(|w| format!(" at {w:.0} W"))
            .unwrap_or_default();
        parts.push(format!(
            "{p}% utilisation{power} while the agent ran nothing on it ({})",
            seen.idle_when.join(", ")
        ));
    }
    if !seen.unnamed.is_empty() {
        let pids: Vec<String> = seen
            .unnamed
            .iter()
            .map(|(pid, sm)| format!("pid {pid} at {sm}% of the SMs"))
            .collect();
        parts.push(format!("NVML sampled {}", pids.join(", ")));
    }
    parts.join("; ")
}

/// The mean of the later half of an idle probe's utilisation samples (in the order taken), when
/// there are two samples at least: the first may carry the tail of the agent's own last check
/// (its kernels' end, the driver scrubbing the memory it freed), which decays within a sample or
/// two, while other work keeps the GPU busy to the window's end.
fn later_half_mean(samples: &[u32]) -> Option<u64> {
    if samples.len() < 2 {
        return None;
    }
    let later = &samples[samples.len() / 2..];
    Some(later.iter().map(|u| u64::from(*u)).sum::<u64>() / later.len() as u64)
}

/// Reads every GPU twice, [`IDLE_WINDOW`] apart on a real GPU (`window`), while the agent runs
/// nothing on them, into `log` as seen at `when`; the utilisation samples counted are those
/// taken after the window's first [`IDLE_SETTLE`]. A GPU NVML cannot read adds nothing.
pub fn probe_idle(
    platform: &dyn Platform,
    gpus: &[GpuInfo],
    when: &str,
    window: Duration,
    log: &Mutex<BusyLog>,
) {
    let since = SystemTime::now() + IDLE_SETTLE.min(window);
    let first: Vec<_> = gpus
        .iter()
        .map(|g| (g.index, platform.occupancy(g.index, since)))
        .collect();
    if !window.is_zero() {
        // The window NVML's utilisation samples are taken in: a measurement period, not a
        // wait for something to happen.
        std::thread::sleep(window);
    }
    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
    for (gpu, occ) in first {
        if let Ok(occ) = occ {
            log.observe(gpu, when, &occ);
        }
        if let Ok(occ) = platform.occupancy(gpu, since) {
            log.observe_idle(gpu, when, &occ);
        }
    }
}

/// True when `gpu` carries a finding that it was busy (its own reasons or its checks').
fn was_busy(gpu: &GpuReport) -> bool {
    gpu.reasons.iter().any(|r| r.code.is_busy())
        || crate::checks::gpu_results(gpu)
            .iter()
            .any(|(_, reasons)| reasons.iter().any(|r| r.code.is_busy()))
}

/// Turns every figure that fell short on a busy GPU, and every node-level figure a busy GPU
/// took part in, into [`Code::FigureWhileBusy`] (the old code and message kept in its message),
/// so that sharing is never reported as a hardware fault, nor as a pass: the excused figure is
/// an Error of the Busy category. A node-level figure that names GPUs (a p2p pair `GPU1->GPU2`)
/// is excused only when one of them was busy; one that names none (NCCL, training over every
/// GPU) when any was; a check of the host alone (io) never. Each changed result's verdict
/// becomes what its reasons now give (a result in Error or Skipped keeps its verdict).
pub fn excuse_sharing(report: &mut NodeReport, allow_shared: bool) {
    let busy: Vec<i32> = report
        .gpus
        .iter()
        .filter(|g| was_busy(g))
        .map(|g| g.index)
        .collect();
    if busy.is_empty() {
        return;
    }
    let why = |who: &str| {
        if allow_shared {
            format!(
                "sharing GPUs is allowed and {who} busy with other work: this figure may reflect the sharing"
            )
        } else {
            format!("{who} busy with other work, so this figure is not judged as hardware")
        }
    };
    for g in report.gpus.iter_mut().filter(|g| was_busy(g)) {
        let who = format!("GPU{} was", g.index);
        crate::checks::each_gpu_result(g, &mut |r| excuse(r, &why(&who), &|_| true));
    }
    let took_part = |r: &gpuval_crds::Reason| {
        let named = named_gpus(&r.message);
        named.is_empty() || named.iter().any(|g| busy.contains(g))
    };
    let names: Vec<String> = busy.iter().map(|g| format!("GPU{g}")).collect();
    let who = match names.as_slice() {
        [one] => format!("{one} was"),
        many => format!("{} were", many.join(", ")),
    };
    crate::checks::each_node_result_of_gpus(report, &mut |r| excuse(r, &why(&who), &took_part));
}

/// The GPUs a message names (`GPU1->GPU3 unidirectional ...` names 1 and 3), each once.
pub(crate) fn named_gpus(message: &str) -> Vec<i32> {
    let mut named = Vec::new();
    for (at, _) in message.match_indices("GPU") {
        let digits: String = message[at + 3..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let Ok(i) = digits.parse::<i32>()
            && !named.contains(&i)
        {
            named.push(i);
        }
    }
    named
}

/// [`excuse_sharing`] of one result's reasons: those `concerned` takes.
fn excuse(result: &mut dyn AnyResult, why: &str, concerned: &dyn Fn(&gpuval_crds::Reason) -> bool) {
    let mut changed = false;
    for r in result.reasons_mut().iter_mut() {
        if r.code.sharing_can_lower()
            && r.severity > gpuval_crds::reason::Severity::Warn
            && concerned(r)
        {
            *r = Code::FigureWhileBusy.says(format!("{why} ({}): {}", r.code, r.message));
            changed = true;
        }
    }
    if changed && !matches!(result.verdict(), Verdict::Skipped | Verdict::Error) {
        let v = verdict_of(result.reasons_mut());
        result.set_verdict(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_names_its_gpus_each_once() {
        assert_eq!(named_gpus("GPU1->GPU12 unidirectional 3 GB/s"), vec![1, 12]);
        assert_eq!(named_gpus("GPU3 memory: GPU3 again"), vec![3]);
        assert!(named_gpus("nccl allReduce over 8 GPUs: 120 GB/s").is_empty());
    }
    use crate::backend::GpuProcess;

    fn listed(pid: u32, mib: Option<u64>) -> GpuProcess {
        GpuProcess {
            pid,
            name: Some("gpuval-agent".into()),
            used_memory_bytes: mib.map(|m| m << 20),
            graphics: false,
        }
    }

    fn occ(used_mib: u64, own_mib: Option<u64>, util: &[u32]) -> Occupancy {
        Occupancy {
            used_bytes: Some(used_mib << 20),
            listed_before: vec![listed(10, own_mib)],
            listed_after: vec![listed(10, own_mib)],
            utilization: util.to_vec(),
            process_sm: Vec::new(),
            power_w: Some(250.0),
            sm_clock_mhz: None,
        }
    }

    #[test]
    fn unlisted_memory_counts_after_two_readings_in_a_row() {
        let mut log = BusyLog::default();
        log.observe(0, "during the checks", &occ(3000, Some(1000), &[]));
        assert!(log.busy_gpus().is_empty(), "one reading is not enough");
        log.observe(0, "during the checks", &occ(1100, Some(1000), &[]));
        log.observe(0, "during the checks", &occ(3000, Some(1000), &[]));
        assert!(log.busy_gpus().is_empty(), "the streak was broken");
        log.observe(0, "during the checks", &occ(3000, Some(1000), &[]));
        assert_eq!(log.busy_gpus(), vec![0]);
        let mut gpus = vec![GpuReport {
            index: 0,
            verdict: Verdict::Pass,
            ..Default::default()
        }];
        log.judge(false, None, &mut gpus);
        assert_eq!(gpus[0].verdict, Verdict::Error);
        assert!(
            gpus[0].reasons[0]
                .message
                .contains("2000 MiB in use that no listed process holds (during the checks)"),
            "{}",
            gpus[0].reasons[0].message
        );
    }

    #[test]
    fn within_the_slack_or_with_a_process_whose_memory_nvml_withholds_nothing_counts() {
        let mut log = BusyLog::default();
        for _ in 0..3 {
            log.observe(0, "x", &occ(1000 + UNLISTED_SLACK_MIB, Some(1000), &[]));
            log.observe(1, "x", &occ(30_000, None, &[]));
        }
        assert!(log.busy_gpus().is_empty());
    }

    #[test]
    fn a_process_ending_between_the_readings_is_not_someone_elses() {
        // The agent's child held 4 GiB in the first list and was gone by the second: the
        // device figure in between may still count it.
        let o = Occupancy {
            used_bytes: Some(4200 << 20),
            listed_before: vec![listed(10, Some(100)), listed(11, Some(4096))],
            listed_after: vec![listed(10, Some(100))],
            ..Default::default()
        };
        assert_eq!(o.unlisted_bytes(), Some(4 << 20));
    }

    #[test]
    fn load_while_the_agent_is_idle_is_other_work() {
        let mut log = BusyLog::default();
        log.observe_idle(2, "before compute", &occ(0, Some(0), &[0, 4, 2]));
        assert!(log.busy_gpus().is_empty(), "noise under 10%");
        log.observe_idle(2, "before compute", &occ(0, Some(0), &[95]));
        assert!(
            log.busy_gpus().is_empty(),
            "one sample may be the agent's own last kernels"
        );
        log.observe_idle(2, "before compute", &occ(0, Some(0), &[90, 100, 100]));
        log.observe_idle(2, "after the checks", &occ(0, Some(0), &[100, 100, 100]));
        assert_eq!(log.busy_gpus(), vec![2]);
        let mut gpus = vec![GpuReport {
            index: 2,
            ..Default::default()
        }];
        log.judge(true, None, &mut gpus);
        let r = &gpus[0].reasons[0];
        assert_eq!(r.code, Code::GpuBusyAllowed);
        assert!(
            r.message.contains(
                "100% utilisation at 250 W while the agent ran nothing on it (before compute, after the checks)"
            ),
            "{}",
            r.message
        );
        assert_eq!(gpus[0].verdict, Verdict::Warn);
    }

    #[test]
    fn the_pods_the_kubelet_lists_on_a_busy_gpu_are_named_and_the_agents_own_is_not() {
        let p = PodResources {
            socket: "/unused".into(),
            own_pod: Some("gpuval/agent-n1".into()),
        };
        let held = |ns: &str, pod: &str, id: &str| crate::pod_resources::HeldDevice {
            namespace: ns.into(),
            pod: pod.into(),
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            device_id: id.into(),
        };
        let g = GpuReport {
            index: 1,
            uuid: "GPU-bbb".into(),
            ..Default::default()
        };
        let listed = Ok(vec![
            held("gpuval", "agent-n1", "GPU-bbb"),
            held("ml", "trainer-0", "GPU-bbb::2"),
        ]);
        assert_eq!(
            who_holds(&p, &listed, &g),
            (
                "; the kubelet lists pod ml/trainer-0 (container main) holding it".to_string(),
                false
            )
        );
        let none = Ok(vec![held("gpuval", "agent-n1", "GPU-bbb")]);
        let (words, no_pod) = who_holds(&p, &none, &g);
        assert!(words.starts_with("; the kubelet lists no other pod"));
        assert!(no_pod, "held by no pod: its own finding");
        let failed = Err(crate::pod_resources::PodResourcesError::Call("boom".into()));
        assert_eq!(
            who_holds(&p, &failed, &g),
            (
                "; which pod holds it is unknown: the kubelet's PodResources List call failed: boom"
                    .to_string(),
                false
            )
        );
    }

    #[test]
    fn a_process_nvml_samples_on_the_sms_while_the_agent_is_idle_is_named_by_pid() {
        let mut log = BusyLog::default();
        let mut o = occ(0, Some(0), &[]);
        o.process_sm = vec![(777_001, 85), (777_002, 3)];
        log.observe_idle(0, "after the checks", &o);
        let mut gpus = vec![GpuReport::default()];
        log.judge(false, None, &mut gpus);
        let m = &gpus[0].reasons[0].message;
        assert!(
            m.contains("NVML sampled pid 777001 at 85% of the SMs"),
            "{m}"
        );
        assert!(!m.contains("777002"), "{m}");
    }
}
