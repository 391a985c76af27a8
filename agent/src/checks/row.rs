//! One row per check: everything the runner, the command line, the table and the views need of
//! a check, declared once in the check's own folder (`ROW`) and listed once, in run order, in
//! [`super::ROWS`]. Nothing outside the check's folder names the check.
//!
//! A row says where the check's settings and result sit in the API's types ([`Slot`]), how to
//! turn it on or off, its command-line flags, its table column, section and headline, and, for
//! a plan that asks for it, a [`Step`]: what the runner measures and judges, in order.

use gpuval_crds::{Checks, GpuReport, NodeReport, Reason, Verdict};

use super::Plan;
use super::topology::Topology;
use crate::check::{JudgeNode, Stage};
use crate::judge::{AnyResult, CheckResult, Code, Judge, Says};

/// A check as one row.
pub trait Row: Sync {
    /// Its name in `spec.checks`, `--checks`, progress lines and the views.
    fn name(&self) -> &'static str;
    /// Where its result sits in the report.
    fn slot(&self) -> Slot;
    /// Whether `checks` asks for it.
    fn asked(&self, checks: &Checks) -> bool;
    /// Turns it on (with its settings from `checks`, else its defaults) or off.
    fn keep(&self, checks: &mut Checks, on: bool);
    /// What the runner measures and judges, when `plan` asks for it.
    fn plan(&self, plan: &Plan, simulated: bool) -> Option<Box<dyn Step>>;
    /// Its command-line flags, added to `cmd`.
    fn flags(&self, cmd: clap::Command) -> clap::Command {
        cmd
    }
    /// Applies its flags, as parsed into `given`, to its settings in `checks` (when it is on).
    fn apply_flags(&self, _given: &clap::ArgMatches, _checks: &mut Checks) -> Result<(), String> {
        Ok(())
    }
    /// Its rules across the node's GPUs, with its default settings: for reports judged outside
    /// a run.
    fn compare(&self, _judge: &Judge<'_>, _gpus: &mut [GpuReport]) {}
    /// Its column in the GPU table (a per-GPU check).
    fn column(&self) -> Option<Column> {
        None
    }
    /// Its section of the table, below the GPU rows (empty: none).
    fn section(&self, report: &NodeReport) -> String;
    /// Its parts of the status headline (`memory 4336-4338 GB/s`).
    fn headline(&self, report: &NodeReport) -> Vec<String>;
}

/// A GPU table column of a per-GPU check: its header, and its cell (None: the check did not run).
pub type Column = (&'static str, fn(&GpuReport) -> Option<String>);

/// A check's result in a report, whatever its type.
pub trait ResultSlot {
    /// Its verdict and reasons, when present.
    fn found(&self) -> Option<(Verdict, &[Reason])>;
    /// The result, when present.
    fn result_mut(&mut self) -> Option<&mut dyn AnyResult>;
    /// When empty: an Error result saying that `who`'s `check` brought no measurement back.
    fn fill_missing(&mut self, who: &str, check: &str);
}

impl<R: CheckResult> ResultSlot for Option<R> {
    fn found(&self) -> Option<(Verdict, &[Reason])> {
        self.as_ref().map(|r| (r.verdict(), r.reasons()))
    }

    fn result_mut(&mut self) -> Option<&mut dyn AnyResult> {
        self.as_mut().map(|r| r as &mut dyn AnyResult)
    }

    fn fill_missing(&mut self, who: &str, check: &str) {
        if self.is_none() {
            let mut r = R::default();
            let why = Code::MeasurementMissing.says(format!(
                "{who} {check}: the check was asked for but no measurement came back"
            ));
            r.set_outcome(Verdict::Error, vec![why]);
            *self = Some(r);
        }
    }
}

/// Where a check's result sits: in each GPU's report, or once in the node's.
#[derive(Clone, Copy)]
pub enum Slot {
    Gpu(GpuSlot),
    Node(NodeSlot),
}

/// A per-GPU check's result in one GPU's report.
#[derive(Clone, Copy)]
pub struct GpuSlot {
    pub get: fn(&GpuReport) -> &dyn ResultSlot,
    pub get_mut: fn(&mut GpuReport) -> &mut dyn ResultSlot,
}

/// A node-level check's result in the node's report.
#[derive(Clone, Copy)]
pub struct NodeSlot {
    pub get: fn(&NodeReport) -> &dyn ResultSlot,
    pub get_mut: fn(&mut NodeReport) -> &mut dyn ResultSlot,
}

/// The [`Slot`] of a per-GPU check whose result is the GPU report's field `$field`.
#[macro_export]
macro_rules! gpu_slot {
    ($field:ident) => {
        $crate::checks::row::Slot::Gpu($crate::checks::row::GpuSlot {
            get: |g| &g.$field,
            get_mut: |g| &mut g.$field,
        })
    };
}

/// The [`Slot`] of a node-level check whose result is the node report's field `$field`.
#[macro_export]
macro_rules! node_slot {
    ($field:ident) => {
        $crate::checks::row::Slot::Node($crate::checks::row::NodeSlot {
            get: |n| &n.$field,
            get_mut: |n| &mut n.$field,
        })
    };
}

/// A row's `asked` and `keep` for the check whose settings are the section `$field` of
/// `spec.checks`.
#[macro_export]
macro_rules! settings_in {
    ($field:ident) => {
        fn asked(&self, checks: &gpuval_crds::Checks) -> bool {
            checks.$field.is_some()
        }
        fn keep(&self, checks: &mut gpuval_crds::Checks, on: bool) {
            checks.$field = on.then(|| checks.$field.take().unwrap_or_default());
        }
    };
}

impl Slot {
    /// Its results in `report` that are present: one per GPU, or the node's.
    pub fn found<'r>(&self, report: &'r NodeReport) -> Vec<(Verdict, &'r [Reason])> {
        match self {
            Slot::Gpu(s) => report
                .gpus
                .iter()
                .filter_map(|g| (s.get)(g).found())
                .collect(),
            Slot::Node(s) => (s.get)(report).found().into_iter().collect(),
        }
    }

    /// Runs `f` on each of its results in `report` that is present.
    pub fn each_mut(&self, report: &mut NodeReport, f: &mut dyn FnMut(&mut dyn AnyResult)) {
        match self {
            Slot::Gpu(s) => {
                for g in &mut report.gpus {
                    (s.get_mut)(g).result_mut().map(&mut *f);
                }
            }
            Slot::Node(s) => {
                (s.get_mut)(report).result_mut().map(f);
            }
        }
    }

    /// An Error result for each of its results missing from `report` (check `name`).
    pub fn fill_missing(&self, report: &mut NodeReport, name: &str) {
        match self {
            Slot::Gpu(s) => {
                for g in &mut report.gpus {
                    let who = format!("GPU{}", g.index);
                    (s.get_mut)(g).fill_missing(&who, name);
                }
            }
            Slot::Node(s) => (s.get_mut)(report).fill_missing("node", name),
        }
    }
}

/// What judges a measurement into the report, once the measuring pass is over.
pub type Pending<'a> = Box<dyn FnOnce(&JudgeNode<'_>, &mut NodeReport) + Send + 'a>;

/// When a planned check is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// In its row's turn.
    InTurn,
    /// On a thread beside the measuring of the check named (the io check beside the compute
    /// burn); in its row's turn when that check was not measured.
    Beside(&'static str),
    /// Read before any check loads the GPUs, again by the runner's sampler, and judged last
    /// with what the sampler saw (the topology).
    Sampled,
}

/// A check as a plan asks for it: what the runner measures and judges.
pub trait Step: Send + Sync {
    /// Its row's name.
    fn name(&self) -> &'static str;
    /// When it is measured.
    fn when(&self) -> When {
        When::InTurn
    }
    /// Whether it loads the GPUs (the runner looks for other work on them before it starts).
    fn loads_gpus(&self) -> bool {
        true
    }
    /// Whether it starts after a stop request (it sees the stop itself and says what it did).
    fn starts_after_stop(&self) -> bool {
        false
    }
    /// Reads what it needs before any check loads the GPUs (the host check's PCIe counters).
    fn prepare(&mut self, _stage: &Stage<'_>) {}
    /// Measures, and returns what judges the measurement.
    fn measure(&self, stage: &Stage<'_>) -> Pending<'_>;
    /// What judges a measurement that never came back (its thread panicked): nothing, by
    /// default (the runner's check for missing results then says so).
    fn lost(&self) -> Pending<'_> {
        Box::new(|_, _| {})
    }
    /// Measures again, once, what fell short on performance alone, and judges it like the first
    /// time (see [`super::remeasure`]); true when it measured again.
    fn remeasure(&self, _stage: &Stage<'_>, _on: &JudgeNode<'_>, _report: &mut NodeReport) -> bool {
        false
    }
    /// The topology check, for the runner's sampler ([`When::Sampled`]).
    fn sampled_topology(&self) -> Option<&Topology> {
        None
    }
}

/// The flags of type `F` as parsed into `given`: what a row's `apply_flags` reads.
pub fn parsed<F: clap::FromArgMatches>(given: &clap::ArgMatches) -> Result<F, String> {
    F::from_arg_matches(given).map_err(|e| e.to_string())
}

/// A row's `flags` and `apply_flags` for the check whose flags are `$flags` (with an
/// `apply(&self, &mut Settings)`) and whose settings are the section `$field` of `spec.checks`.
#[macro_export]
macro_rules! flags_of {
    ($flags:ty, $field:ident) => {
        fn flags(&self, cmd: clap::Command) -> clap::Command {
            <$flags as clap::Args>::augment_args(cmd)
        }
        fn apply_flags(
            &self,
            given: &clap::ArgMatches,
            checks: &mut gpuval_crds::Checks,
        ) -> Result<(), String> {
            let flags: $flags = $crate::checks::row::parsed(given)?;
            if let Some(s) = checks.$field.as_mut() {
                flags.apply(s);
            }
            Ok(())
        }
    };
}
