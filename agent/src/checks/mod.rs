//! The checks, one folder each (request from the spec, real and simulated measurement, judge,
//! table section and headline part, CLI flags, and its [`row::Row`]), and [`ROWS`]: the one
//! place that lists them, in the order they run. The runner, the command line, the table and
//! the status headline read the rows; nothing here names a check.
//!
//! Adding a check: a folder here with its row, its spec and result types in the API crate
//! (a section of `spec.checks`, a field of the GPU or node report), one line in [`ROWS`], and
//! its views' entry in `gpuval_view::checks` (tests hold each list to the others).

pub mod compute;
pub mod host;
pub mod io;
pub mod memory;
pub mod nccl;
pub mod p2p;
pub mod planned;
pub mod remeasure;
pub mod row;
pub mod steps;
#[cfg(test)]
mod tests;
pub mod topology;
pub mod training;

use std::path::PathBuf;
use std::time::Duration;

use gpuval_crds::facts::{CountSource, Expect};
use gpuval_crds::reason::Overrides;
use gpuval_crds::{
    Checks, GpuReport, GpuValidationSpec, NodeReport, Reason, SeverityOverride, Thresholds, Verdict,
};

use crate::judge::AnyResult;

pub use planned::Planned;
use row::{Column, Row, Slot};

/// Every check, in the order they run: the one list of them.
pub const ROWS: [&Row; 8] = [
    &topology::row::ROW,
    &memory::row::ROW,
    &compute::row::ROW,
    &p2p::row::ROW,
    &host::row::ROW,
    &nccl::row::ROW,
    &training::row::ROW,
    &io::row::ROW,
];

/// The checks a run knows: [`ROWS`], or in a test, those and one more.
#[derive(Clone, Copy)]
pub struct Rows(pub &'static [&'static Row]);

impl std::fmt::Debug for Rows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl std::ops::Deref for Rows {
    type Target = [&'static Row];
    fn deref(&self) -> &Self::Target {
        self.0
    }
}

impl Rows {
    /// Every check's name (as in the spec and `--checks`), in the order they run.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|r| r.name).collect()
    }

    /// Keeps exactly the checks named (case-insensitive), each with its settings from `checks`
    /// or its defaults; an unknown name is an error that lists the known ones.
    pub fn select(&self, checks: &mut Checks, names: &[String]) -> Result<(), String> {
        let known = self.names();
        if let Some(n) = names
            .iter()
            .find(|n| !known.iter().any(|c| c.eq_ignore_ascii_case(n)))
        {
            return Err(format!("unknown check {n:?}: use {}", known.join(", ")));
        }
        for row in self.0 {
            let on = names.iter().any(|n| n.eq_ignore_ascii_case(row.name));
            row.keep(checks, on);
        }
        Ok(())
    }

    /// Every check's command-line flags, added to `cmd`.
    pub fn flags(&self, cmd: clap::Command) -> clap::Command {
        self.0
            .iter()
            .filter_map(|r| r.flags)
            .fold(cmd, |cmd, f| (f.add)(cmd))
    }

    /// Applies the flags parsed into `given` to the checks that are on (a check whose flags
    /// turn it on, on).
    pub fn apply_flags(&self, given: &clap::ArgMatches, checks: &mut Checks) -> Result<(), String> {
        let mut flags = self.0.iter().filter_map(|r| r.flags);
        flags.try_for_each(|f| (f.apply)(given, checks))
    }

    /// The GPU table's check columns.
    pub fn gpu_columns(&self) -> Vec<Column> {
        self.0.iter().filter_map(|r| r.column).collect()
    }

    /// The table sections below the GPU rows, in order.
    pub fn sections(&self, report: &NodeReport) -> String {
        self.0.iter().map(|r| (r.section)(report)).collect()
    }

    /// The status headline's parts, in order (`memory 4336-4338 GB/s`, `bf16 677-682 TFLOP/s`).
    pub fn headline_parts(&self, report: &NodeReport) -> Vec<String> {
        self.0.iter().flat_map(|r| (r.headline)(report)).collect()
    }
}

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
    /// The checks there are ([`ROWS`]; a test adds one).
    pub rows: Rows,
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
            rows: Rows(&ROWS),
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

/// The rules across GPUs of every per-GPU check (the relative rule), with default settings:
/// for reports judged outside a run.
pub fn compare_gpus(judge: &crate::judge::Judge<'_>, gpus: &mut [GpuReport]) {
    for compare in ROWS.iter().filter_map(|r| r.compare) {
        compare(judge, gpus);
    }
}

/// A check result's verdict and reasons, as the GPU and node verdicts collect them.
pub type Found<'a> = (Verdict, &'a [Reason]);

/// The results of the per-GPU checks in one GPU's report.
pub fn gpu_results(g: &GpuReport) -> Vec<Found<'_>> {
    ROWS.iter()
        .filter_map(|r| match r.slot {
            Slot::Gpu(s) => (s.get)(g).found(),
            Slot::Node(_) => None,
        })
        .collect()
}

/// The results of the node-level checks in a node report, in the order the node verdict lists
/// them.
pub fn node_results(report: &NodeReport) -> Vec<Found<'_>> {
    ROWS.iter()
        .filter_map(|r| match r.slot {
            Slot::Node(s) => (s.get)(report).found(),
            Slot::Gpu(_) => None,
        })
        .collect()
}

/// Runs `f` on each per-GPU check result of `g` that is present.
pub fn each_gpu_result(g: &mut GpuReport, f: &mut dyn FnMut(&mut dyn AnyResult)) {
    for r in ROWS {
        if let Slot::Gpu(s) = r.slot
            && let Some(c) = (s.get_mut)(g).result_mut()
        {
            f(c);
        }
    }
}

/// Runs `f` on each node-level check result of `report` that is present.
pub fn each_node_result(report: &mut NodeReport, f: &mut dyn FnMut(&mut dyn AnyResult)) {
    for r in ROWS {
        if let Slot::Node(s) = r.slot
            && let Some(c) = (s.get_mut)(report).result_mut()
        {
            f(c);
        }
    }
}

/// Runs `f` on each node-level check result of `report` that is present and that the node's
/// GPUs take part in (not a check of the host alone, such as io).
pub fn each_node_result_of_gpus(report: &mut NodeReport, f: &mut dyn FnMut(&mut dyn AnyResult)) {
    for r in ROWS {
        if let Slot::Node(s) = r.slot
            && s.gpus_take_part
            && let Some(c) = (s.get_mut)(report).result_mut()
        {
            f(c);
        }
    }
}

/// Applies the spec's severity overrides to every check result in the report.
pub fn apply_overrides(report: &mut NodeReport, o: &Overrides) {
    for r in ROWS {
        r.slot.each_mut(report, &mut |c| c.overridden(o));
    }
}

/// Keeps exactly the checks named (case-insensitive), each with its settings from `checks` or
/// its defaults; an unknown name is an error that lists the known ones.
pub fn select(checks: &mut Checks, names: &[String]) -> Result<(), String> {
    Rows(&ROWS).select(checks, names)
}

/// Every check's command-line flags, flattened into `gpuval-agent run`: each row adds its own.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// What was parsed (None: no command line, as in a test).
    given: Option<clap::ArgMatches>,
}

impl Flags {
    /// Applies the flags that were given to the checks that are on.
    pub fn apply(&self, checks: &mut Checks) -> Result<(), String> {
        match &self.given {
            Some(given) => Rows(&ROWS).apply_flags(given, checks),
            None => Ok(()),
        }
    }

    /// The flags as parsed, for a setting a flag gives outside `spec.checks`.
    pub fn given(&self) -> Option<&clap::ArgMatches> {
        self.given.as_ref()
    }
}

impl clap::FromArgMatches for Flags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self {
            given: Some(m.clone()),
        })
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.given = Some(m.clone());
        Ok(())
    }
}

impl clap::Args for Flags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        Rows(&ROWS).flags(cmd)
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Rows(&ROWS).flags(cmd)
    }
}

/// The GPU table's check columns: header and cell of each per-GPU check.
pub fn gpu_columns() -> Vec<Column> {
    Rows(&ROWS).gpu_columns()
}

/// The table sections below the GPU rows, in order.
pub fn sections(report: &NodeReport) -> String {
    Rows(&ROWS).sections(report)
}

/// The status headline's parts, in order (`memory 4336-4338 GB/s`, `bf16 677-682 TFLOP/s`, ...).
pub fn headline_parts(report: &NodeReport) -> Vec<String> {
    Rows(&ROWS).headline_parts(report)
}
