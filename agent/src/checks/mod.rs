//! The checks, one folder each (request from the spec, real and simulated measurement, judge,
//! table section and headline part, CLI flags), and this file: the one place that lists them.
//!
//! Adding a check: a folder here, its spec and result types in the API crate, and one line in
//! each of the exhaustive lists below ([`Planned`], [`Measured`], [`select`], [`gpu_results`] or
//! [`node_results`], [`Flags`], the table and headline lists). Each list destructures the API
//! type with no `..`, so the compiler names every one of them when a field is added.

pub mod compute;
pub mod host;
pub mod io;
pub mod memory;
pub mod nccl;
pub mod p2p;
pub mod remeasure;
pub mod topology;
pub mod training;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use gpuval_crds::facts::{CountSource, Expect};
use gpuval_crds::reason::Overrides;
use gpuval_crds::{
    Checks, GpuReport, GpuValidationSpec, NodeReport, Reason, SeverityOverride, Thresholds, Verdict,
};

use crate::check::{GpuCheck, JudgeGpu, JudgeNode, Measurement, NodeCheck, Stage};
use crate::judge::{AnyResult, CheckResult, Code, Judge, Says};
use crate::run_control::RunControl;

use self::compute::Compute;
use self::host::Host;
use self::io::{Io, IoMeasured};
use self::memory::Memory;
use self::nccl::{Nccl, NcclMeasured};
use self::p2p::{P2p, P2pMeasured};
use self::topology::{Topology, TopologyMeasured};
use self::training::{Training, TrainingMeasured};

/// Every check's name (as in the spec and `--checks`), in the order they run.
pub const NAMES: [&str; 8] = [
    Topology::NAME,
    Memory::NAME,
    Compute::NAME,
    P2p::NAME,
    Host::NAME,
    Nccl::NAME,
    Training::NAME,
    Io::NAME,
];

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub checks: Checks,
    pub thresholds: Thresholds,
    /// Only these NVML indices (all GPUs when None).
    pub gpus: Option<Vec<u32>>,
    /// Kubernetes node name (or hostname) for the report.
    pub node: Option<String>,
    /// How often telemetry is sampled.
    pub sample_every: Duration,
    /// Seed of the peer-to-peer pair order (None: a new order each run).
    pub p2p_seed: Option<u64>,
    /// Where the io check writes (the admin-allowed node volume on Kubernetes, any path on
    /// bare metal). None: an io check reports an Error saying how to set it.
    pub io_dir: Option<PathBuf>,
    /// io engine settings that are not part of the spec.
    pub io_tuning: io::Tuning,
    /// Where the nccl check keeps NCCL's own logs (None: not kept).
    pub nccl_log_dir: Option<PathBuf>,
    /// What the node should look like (`spec.expect`).
    pub expect: Expect,
    /// The GPU count the operator found for this node (`spec.expect.gpuCount`, else the
    /// node's capacity, else its GPU Feature Discovery label), and where it came from.
    pub expected_gpus: Option<(i32, CountSource)>,
    /// On a node whose GPUs come through Dynamic Resource Allocation: the UUIDs of the GPUs
    /// the agent's claim should give it (`GPUVAL_DRA_GPU_UUIDS`); NVML must show exactly these.
    pub dra_gpu_uuids: Option<Vec<String>>,
    /// `spec.severityOverrides`.
    pub overrides: Vec<SeverityOverride>,
    /// A process that is not the agent's on a GPU under test is a Warn, not a Fail (the
    /// administrator allows shared GPUs).
    pub allow_shared_gpus: bool,
    /// Each GPU's baseline from its own past: a figure too far below it is a Warn.
    pub baselines: Option<gpuval_crds::baseline::Baselines>,
    /// The kubelet's PodResources API, where the administrator mounted it: a busy GPU's
    /// finding names the pods that hold it.
    pub pod_resources: Option<crate::pod_resources::PodResources>,
}

impl Plan {
    pub fn new(checks: Checks, thresholds: Thresholds) -> Self {
        Self {
            checks,
            thresholds,
            gpus: None,
            node: None,
            sample_every: Duration::from_millis(500),
            p2p_seed: None,
            io_dir: None,
            io_tuning: io::Tuning::default(),
            nccl_log_dir: None,
            expect: Expect::default(),
            expected_gpus: None,
            dra_gpu_uuids: None,
            overrides: Vec::new(),
            allow_shared_gpus: false,
            baselines: None,
            pod_resources: None,
        }
    }

    /// The plan of a validation's spec: its checks, thresholds, expectations and overrides.
    pub fn from_spec(spec: &GpuValidationSpec) -> Self {
        let mut plan = Self::new(
            spec.checks.clone(),
            spec.thresholds.clone().unwrap_or_default(),
        );
        plan.expect = spec.expect_or_default();
        plan.overrides = spec.severity_overrides.clone();
        plan
    }

    /// The GPU count to hold the node to, and where it came from: what the operator found,
    /// else `spec.expect.gpuCount`.
    pub fn gpu_count(&self) -> Option<(i32, CountSource)> {
        self.expected_gpus
            .or_else(|| self.expect.gpu_count.map(|n| (n, CountSource::Spec)))
    }
}

/// The checks a plan asks for, each built from its spec section.
pub struct Planned {
    topology: Option<Topology>,
    memory: Option<Memory>,
    compute: Option<Compute>,
    p2p: Option<P2p>,
    host: Option<Host>,
    nccl: Option<Nccl>,
    training: Option<Training>,
    io: Option<Io>,
}

/// What the checks measured, before judging.
#[derive(Default)]
pub struct Measured {
    pub topology: Option<Measurement<TopologyMeasured>>,
    memory: HashMap<u32, Measurement<memory::MemoryOutcome>>,
    compute: HashMap<u32, Measurement<compute::ComputeOutcome>>,
    p2p: Option<Measurement<P2pMeasured>>,
    host: Option<Measurement<host::PerGpu>>,
    nccl: Option<Measurement<NcclMeasured>>,
    training: Option<Measurement<TrainingMeasured>>,
    /// Err: the io thread panicked.
    io: Option<Result<IoMeasured, ()>>,
}

impl Planned {
    /// `simulated`: whether the GPU figures come from the simulated backend (io says so).
    pub fn new(plan: &Plan, simulated: bool) -> Self {
        let Checks {
            topology,
            memory,
            compute,
            p2p,
            host_transfer,
            io,
            nccl,
            training,
        } = &plan.checks;
        let beside_compute = compute.is_some() && io.as_ref().is_some_and(|c| c.during_compute);
        Self {
            topology: topology.as_ref().map(Topology::from_spec),
            memory: memory.as_ref().map(Memory::from_spec),
            compute: compute.as_ref().map(Compute::from_spec),
            p2p: p2p.as_ref().map(|s| P2p::from_spec(s, plan.p2p_seed)),
            host: host_transfer.as_ref().map(Host::from_spec),
            nccl: nccl
                .as_ref()
                .map(|s| Nccl::from_spec(s, plan.nccl_log_dir.clone())),
            training: training.as_ref().map(Training::from_spec),
            io: io.as_ref().map(|s| {
                let (dir, tuning) = (plan.io_dir.clone(), plan.io_tuning.clone());
                Io::new(s, dir, tuning, beside_compute, simulated)
            }),
        }
    }

    /// The first topology reading, taken before any check loads the GPUs (the runner's
    /// sampler re-reads it every [`Planned::resample_every`]).
    pub fn first_topology(&self, stage: &Stage<'_>) -> Option<Measurement<TopologyMeasured>> {
        let t = self.topology.as_ref()?;
        let ctl = RunControl::new(stage.stop, &|_, _| {});
        Some(t.measure(&stage.node_under(&ctl)))
    }

    /// How often the topology is re-read during the run.
    pub fn resample_every(&self) -> Duration {
        self.topology
            .as_ref()
            .map_or(Duration::from_secs(30), Topology::resample_every)
    }

    /// Measures the checks in their order: memory; compute (with io on a thread beside it when
    /// asked); peer-to-peer; host transfers; then io alone when it did not run beside the burn.
    /// A check after a stop request is not started (memory sees the stop itself). The host
    /// transfer check's PCIe counters are read first, so that its window covers the GPU checks
    /// before it. `before` is called with each GPU check's name before it starts, while the
    /// agent runs nothing on the GPUs (the runner looks for other work then).
    pub fn measure(&self, stage: &Stage<'_>, into: &mut Measured, before: &dyn Fn(&str)) {
        let Self {
            topology: _,
            memory,
            compute,
            p2p,
            host,
            nccl,
            training,
            io,
        } = self;
        let pcie_baseline = host
            .as_ref()
            .map(|_| Host::read_baseline(stage.backend, stage.gpus));
        if let Some(m) = memory {
            before(Memory::NAME);
            into.memory = stage.on_every_gpu(m);
        }
        let beside = io.as_ref().filter(|i| i.context.during_compute);
        std::thread::scope(|s| {
            let compute = compute.as_ref().filter(|_| !stage.stopped());
            if compute.is_some() {
                before(Compute::NAME);
            }
            let io_thread = beside
                .filter(|_| !stage.stopped())
                .map(|i| s.spawn(|| i.measure(stage.stop, stage.sink)));
            if let Some(c) = compute {
                into.compute = stage.on_every_gpu(c);
            }
            // Wait for io beside the burn here, so it never overlaps a later check.
            into.io = io_thread.map(|h| h.join().map_err(|_| ()));
        });
        if let Some(p) = p2p.as_ref().filter(|_| !stage.stopped()) {
            before(P2p::NAME);
            into.p2p = Some(stage.on_node(p));
        }
        if let Some(h) = host.as_ref().filter(|_| !stage.stopped()) {
            before(Host::NAME);
            let h = h.with_baseline(pcie_baseline.unwrap_or_default());
            into.host = Some(stage.on_node(&h));
        }
        if let Some(n) = nccl.as_ref().filter(|_| !stage.stopped()) {
            before(Nccl::NAME);
            into.nccl = Some(stage.on_node(n));
        }
        if let Some(t) = training.as_ref().filter(|_| !stage.stopped()) {
            before(Training::NAME);
            into.training = Some(stage.on_node(t));
        }
        if let Some(i) = io.as_ref().filter(|_| into.io.is_none()) {
            into.io = Some(Ok(i.measure(stage.stop, stage.sink)));
        }
    }

    /// Judges what was measured into `report`, whose `gpus` (one per GPU of `on.gpus`, in order)
    /// already exist: each check's results, then the rules across GPUs.
    pub fn judge(&self, on: &JudgeNode<'_>, m: Measured, report: &mut NodeReport) {
        let Measured {
            topology: topology_measured,
            mut memory,
            mut compute,
            p2p,
            host,
            nccl,
            training,
            io,
        } = m;
        for (g, r) in on.gpus.iter().zip(report.gpus.iter_mut()) {
            judge_gpu(&self.memory, &on.gpu(g), memory.remove(&g.index), r);
            judge_gpu(&self.compute, &on.gpu(g), compute.remove(&g.index), r);
        }
        judge_node(&self.host, on, host, report);
        if let Some(c) = &self.memory {
            c.compare(on.judge, &mut report.gpus);
        }
        if let Some(c) = &self.compute {
            c.compare(on.judge, &mut report.gpus);
        }
        judge_node(&self.topology, on, topology_measured, report);
        judge_node(&self.p2p, on, p2p, report);
        judge_node(&self.nccl, on, nccl, report);
        judge_node(&self.training, on, training, report);
        if let (Some(check), Some(measured)) = (&self.io, io) {
            report.io = Some(match measured {
                Ok(m) => check.judge(m),
                Err(()) => Io::panicked(),
            });
        }
    }

    /// Judges the topology measured at the start (with what the sampler's re-reads found).
    pub fn judge_topology(
        &self,
        on: &JudgeNode<'_>,
        measured: Option<Measurement<TopologyMeasured>>,
        report: &mut NodeReport,
    ) {
        judge_node(&self.topology, on, measured, report);
    }

    /// A check that was asked for and produced no result for a GPU (or for the node) gets an
    /// Error result saying so: a measurement that is missing is never a pass.
    pub fn require_results(&self, report: &mut NodeReport) {
        let Self {
            topology,
            memory,
            compute,
            p2p,
            host,
            nccl,
            training,
            io,
        } = self;
        for g in &mut report.gpus {
            let who = format!("GPU{}", g.index);
            required(memory.is_some(), &mut g.memory, &who, Memory::NAME);
            required(compute.is_some(), &mut g.compute, &who, Compute::NAME);
            required(host.is_some(), &mut g.host_transfer, &who, Host::NAME);
        }
        let r = report;
        required(topology.is_some(), &mut r.topology, "node", Topology::NAME);
        required(p2p.is_some(), &mut r.p2p, "node", P2p::NAME);
        required(nccl.is_some(), &mut r.nccl, "node", Nccl::NAME);
        required(training.is_some(), &mut r.training, "node", Training::NAME);
        required(io.is_some(), &mut r.io, "node", Io::NAME);
    }

    /// Measures again, once, each check whose results fell short on performance alone (the
    /// memory, compute, host transfer and peer-to-peer figures), on `stage` (the same GPUs),
    /// and judges it like the first time; a result that fell short on performance alone takes
    /// the second measurement's, with a note that says so ([`remeasure`]). The overrides apply
    /// first: a figure whose code the spec lowered below Fail is not measured again. Returns the
    /// names of the checks measured again.
    pub fn remeasure(
        &self,
        stage: &Stage<'_>,
        on: &JudgeNode<'_>,
        report: &mut NodeReport,
    ) -> Vec<&'static str> {
        let overrides = &on.judge.overrides;
        apply_overrides(report, overrides);
        let mut again = Vec::new();
        if self.remeasure_gpu_check(&self.memory, |g| &mut g.memory, stage, on, report) {
            again.push(Memory::NAME);
        }
        if self.remeasure_gpu_check(&self.compute, |g| &mut g.compute, stage, on, report) {
            again.push(Compute::NAME);
        }
        if let Some(h) = self.host.as_ref().filter(|_| !stage.stopped())
            && remeasure::any_gpu_short(&mut report.gpus, |g| &mut g.host_transfer)
        {
            let mut scratch = scratch_report(report, |g| g.host_transfer = None);
            h.judge(on, stage.on_node(h), &mut scratch);
            apply_overrides(&mut scratch, overrides);
            remeasure::replace_gpu_results(
                &mut report.gpus,
                &mut scratch.gpus,
                |g| &mut g.host_transfer,
                Host::NAME,
            );
            again.push(Host::NAME);
        }
        if let Some(p) = self.p2p.as_ref().filter(|_| !stage.stopped())
            && report
                .p2p
                .as_ref()
                .is_some_and(remeasure::short_on_performance_only)
        {
            let mut scratch = scratch_report(report, |_| {});
            p.judge(on, stage.on_node(p), &mut scratch);
            apply_overrides(&mut scratch, overrides);
            remeasure::replace_node_result(&mut report.p2p, scratch.p2p, P2p::NAME);
            again.push(P2p::NAME);
        }
        again
    }

    /// [`Planned::remeasure`] of one per-GPU check; true when it measured again.
    fn remeasure_gpu_check<C: GpuCheck, R: CheckResult>(
        &self,
        check: &Option<C>,
        slot: remeasure::Slot<R>,
        stage: &Stage<'_>,
        on: &JudgeNode<'_>,
        report: &mut NodeReport,
    ) -> bool {
        let Some(c) = check.as_ref().filter(|_| !stage.stopped()) else {
            return false;
        };
        if !remeasure::any_gpu_short(&mut report.gpus, slot) {
            return false;
        }
        let mut measured = stage.on_every_gpu(c);
        let mut scratch = scratch_report(report, |g| *slot(g) = None);
        for (g, r) in on.gpus.iter().zip(scratch.gpus.iter_mut()) {
            judge_gpu(check, &on.gpu(g), measured.remove(&g.index), r);
        }
        c.compare(on.judge, &mut scratch.gpus);
        apply_overrides(&mut scratch, &on.judge.overrides);
        remeasure::replace_gpu_results(&mut report.gpus, &mut scratch.gpus, slot, C::NAME);
        true
    }

    /// The io check alone, for a node whose GPUs could not be inventoried.
    pub fn io_only(&self, stage: &Stage<'_>) -> Option<gpuval_crds::IoResult> {
        let i = self.io.as_ref()?;
        Some(i.judge(i.measure(stage.stop, stage.sink)))
    }
}

/// `slot` gets an Error result saying that no measurement came back, when the check was asked
/// for (`asked`) and the slot is empty.
fn required<R: CheckResult>(asked: bool, slot: &mut Option<R>, who: &str, check: &str) {
    if asked && slot.is_none() {
        let mut r = R::default();
        let why = Code::MeasurementMissing.says(format!(
            "{who} {check}: the check was asked for but no measurement came back"
        ));
        r.set_outcome(Verdict::Error, vec![why]);
        *slot = Some(r);
    }
}

/// A copy of `report` to judge a second measurement into: its GPUs (each changed by `clear`)
/// and nothing else.
fn scratch_report(report: &NodeReport, clear: impl Fn(&mut GpuReport)) -> NodeReport {
    let mut gpus = report.gpus.clone();
    gpus.iter_mut().for_each(clear);
    NodeReport {
        gpus,
        ..Default::default()
    }
}

fn judge_gpu<C: GpuCheck>(
    check: &Option<C>,
    on: &JudgeGpu<'_>,
    measured: Option<Measurement<C::Outcome>>,
    into: &mut GpuReport,
) {
    if let (Some(c), Some(m)) = (check, measured) {
        c.judge(on, m, into);
    }
}

fn judge_node<C: NodeCheck>(
    check: &Option<C>,
    on: &JudgeNode<'_>,
    measured: Option<Measurement<C::Outcome>>,
    into: &mut NodeReport,
) {
    if let (Some(c), Some(m)) = (check, measured) {
        c.judge(on, m, into);
    }
}

/// The rules across GPUs of every per-GPU check (the relative rule), with default settings:
/// for reports judged outside a run.
pub fn compare_gpus(judge: &Judge<'_>, gpus: &mut [GpuReport]) {
    Memory::from_spec(&Default::default()).compare(judge, gpus);
    Compute::from_spec(&Default::default()).compare(judge, gpus);
}

/// A check result's verdict and reasons, as the GPU and node verdicts collect them.
pub type Found<'a> = (Verdict, &'a [Reason]);

fn found<R: CheckResult>(r: &Option<R>) -> Option<Found<'_>> {
    r.as_ref().map(|r| (r.verdict(), r.reasons()))
}

/// Runs `$body` with `$r` bound to each per-GPU check result of `$g` (a `&GpuReport` or a
/// `&mut GpuReport`): the one list of them.
macro_rules! for_each_gpu_result {
    (@each [$($slot:ident),+], $r:ident, $body:expr) => {
        $({
            let $r = $slot;
            $body;
        })+
    };
    ($g:expr, |$r:ident| $body:expr) => {{
        let GpuReport {
            memory,
            compute,
            host_transfer,
            index: _,
            uuid: _,
            name: _,
            pci_bus_id: _,
            memory_total_mib: _,
            verdict: _,
            reasons: _,
            health: _,
            telemetry: _,
            foreign_processes: _,
        } = $g;
        for_each_gpu_result!(@each [memory, compute, host_transfer], $r, $body);
    }};
}

/// Runs `$body` with `$r` bound to each node-level check result of `$n` (a `&NodeReport` or a
/// `&mut NodeReport`), in the order the node verdict lists them: the one list of them.
macro_rules! for_each_node_result {
    ($n:expr, |$r:ident| $body:expr) => {{
        let NodeReport {
            topology,
            p2p,
            nccl,
            io,
            training,
            gpus: _,
            simulated: _,
            backend: _,
            agent_version: _,
            node: _,
            started_at: _,
            finished_at: _,
            verdict: _,
            failures: _,
            warnings: _,
            action: _,
            system: _,
            facts: _,
        } = $n;
        for_each_gpu_result!(@each [topology, p2p, nccl, training, io], $r, $body);
    }};
}

/// The results of the per-GPU checks in one GPU's report.
pub fn gpu_results(g: &GpuReport) -> Vec<Found<'_>> {
    let mut out = Vec::new();
    for_each_gpu_result!(g, |r| out.extend(found(r)));
    out
}

/// The results of the node-level checks in a node report.
pub fn node_results(r: &NodeReport) -> Vec<Found<'_>> {
    let mut out = Vec::new();
    for_each_node_result!(r, |c| out.extend(found(c)));
    out
}

/// Runs `f` on each per-GPU check result of `g` that is present.
pub fn each_gpu_result(g: &mut GpuReport, f: &mut dyn FnMut(&mut dyn AnyResult)) {
    for_each_gpu_result!(g, |c| if let Some(c) = c {
        f(c)
    });
}

/// Runs `f` on each node-level check result of `r` that is present.
pub fn each_node_result(r: &mut NodeReport, f: &mut dyn FnMut(&mut dyn AnyResult)) {
    for_each_node_result!(r, |c| if let Some(c) = c {
        f(c)
    });
}

/// Applies the spec's severity overrides to every check result in the report.
pub fn apply_overrides(r: &mut NodeReport, o: &Overrides) {
    for g in &mut r.gpus {
        for_each_gpu_result!(g, |c| if let Some(c) = c {
            c.apply_overrides(o)
        });
    }
    for_each_node_result!(r, |c| if let Some(c) = c {
        c.apply_overrides(o)
    });
}

/// Keeps exactly the checks named (case-insensitive), each with its settings from `checks` or
/// its defaults; an unknown name is an error that lists the known ones.
pub fn select(checks: &mut Checks, names: &[String]) -> Result<(), String> {
    if let Some(n) = names
        .iter()
        .find(|n| !NAMES.iter().any(|c| c.eq_ignore_ascii_case(n)))
    {
        return Err(format!("unknown check {n:?}: use {}", NAMES.join(", ")));
    }
    fn keep<T: Default>(slot: &mut Option<T>, name: &str, names: &[String]) {
        *slot = names
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
            .then(|| slot.take().unwrap_or_default());
    }
    let Checks {
        topology,
        memory,
        compute,
        p2p,
        host_transfer,
        io,
        nccl,
        training,
    } = checks;
    keep(topology, Topology::NAME, names);
    keep(memory, Memory::NAME, names);
    keep(compute, Compute::NAME, names);
    keep(p2p, P2p::NAME, names);
    keep(host_transfer, Host::NAME, names);
    keep(nccl, Nccl::NAME, names);
    keep(training, Training::NAME, names);
    keep(io, Io::NAME, names);
    Ok(())
}

/// Every check's command-line flags, flattened into `gpuval-agent run`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Flags {
    #[command(flatten)]
    pub memory: memory::Flags,
    #[command(flatten)]
    pub compute: compute::Flags,
    #[command(flatten)]
    pub p2p: p2p::Flags,
    #[command(flatten)]
    pub host: host::Flags,
    #[command(flatten)]
    pub nccl: nccl::args::NcclArgs,
    #[command(flatten)]
    pub io: io::Flags,
    #[command(flatten)]
    pub training: training::Flags,
}

impl Flags {
    /// Applies the flags that were given to the checks that are on.
    pub fn apply(&self, checks: &mut Checks) {
        let Checks {
            topology: _,
            memory,
            compute,
            p2p,
            host_transfer,
            io,
            nccl,
            training,
        } = checks;
        *nccl = self.nccl.apply(nccl.take());
        if let Some(s) = memory {
            self.memory.apply(s);
        }
        if let Some(s) = compute {
            self.compute.apply(s);
        }
        if let Some(s) = p2p {
            self.p2p.apply(s);
        }
        if let Some(s) = host_transfer {
            self.host.apply(s);
        }
        if let Some(s) = io {
            self.io.apply(s);
        }
        if let Some(s) = training {
            self.training.apply(s);
        }
    }
}

/// A GPU table column of a per-GPU check: its header, and its cell (None: the check did not run).
pub type Column = (&'static str, fn(&GpuReport) -> Option<String>);

/// The GPU table's check columns: header and cell of each per-GPU check.
pub fn gpu_columns() -> [Column; 2] {
    [
        ("MEMORY", |g| g.memory.as_ref().map(memory::cell)),
        ("COMPUTE TFLOP/s", |g| g.compute.as_ref().map(compute::cell)),
    ]
}

/// The table sections below the GPU rows, in order.
pub fn sections(report: &NodeReport) -> String {
    [
        topology::section(report),
        memory::section(report),
        compute::section(report),
        host::section(report),
        p2p::section(report),
        nccl::section(report),
        training::section(report),
        io::section(report),
    ]
    .concat()
}

/// The status headline's parts, in order (`memory 4336-4338 GB/s`, `bf16 677-682 TFLOP/s`, ...).
pub fn headline_parts(report: &NodeReport) -> Vec<String> {
    [
        memory::headline(report),
        compute::headline(report),
        p2p::headline(report),
        host::headline(report),
        nccl::headline(report),
        training::headline(report),
        io::headline(report),
    ]
    .concat()
}
