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

/// A check as one row: a constant in the check's folder (`ROW`).
pub struct Row {
    /// Its name in `spec.checks`, `--checks`, progress lines and the views.
    pub name: &'static str,
    /// Where its settings sit in `spec.checks` ([`settings_in!`](crate::settings_in)).
    pub settings: Settings,
    /// Where its result sits in the report ([`gpu_slot!`](crate::gpu_slot),
    /// [`node_slot!`](crate::node_slot)).
    pub slot: Slot,
    /// What the runner measures and judges, when the plan asks for it (`simulated`: whether
    /// the GPU figures come from the simulated backend).
    pub plan: fn(plan: &Plan, simulated: bool) -> Option<Box<dyn Step>>,
    /// Its command-line flags ([`flags_of!`](crate::flags_of)).
    pub flags: Option<FlagSet>,
    /// Its rules across the node's GPUs with its default settings, for reports judged outside
    /// a run (a per-GPU check with a relative rule).
    pub compare: Option<fn(&Judge<'_>, &mut [GpuReport])>,
    /// Its column in the GPU table (a per-GPU check).
    pub column: Option<Column>,
    /// Its section of the table, below the GPU rows (empty: none).
    pub section: fn(&NodeReport) -> String,
    /// Its parts of the status headline (`memory 4336-4338 GB/s`).
    pub headline: fn(&NodeReport) -> Vec<String>,
}

/// Where a check's settings sit in `spec.checks`.
#[derive(Clone, Copy)]
pub struct Settings {
    /// Whether `checks` asks for it.
    pub asked: fn(&Checks) -> bool,
    /// Turns it on (with its settings from `checks`, else its defaults) or off.
    pub keep: fn(&mut Checks, bool),
}

/// A check's command-line flags.
#[derive(Clone, Copy)]
pub struct FlagSet {
    /// Adds them to a command.
    pub add: fn(clap::Command) -> clap::Command,
    /// Applies them, as parsed, to its settings in `spec.checks` (when it is on).
    pub apply: fn(&clap::ArgMatches, &mut Checks) -> Result<(), String>,
}

impl Row {
    /// Whether `checks` asks for it.
    pub fn asked(&self, checks: &Checks) -> bool {
        (self.settings.asked)(checks)
    }

    /// Turns it on (with its settings from `checks`, else its defaults) or off.
    pub fn keep(&self, checks: &mut Checks, on: bool) {
        (self.settings.keep)(checks, on)
    }
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
    /// Whether the node's GPUs take part in its figures (p2p, NCCL, training, topology), so
    /// that a busy GPU may excuse them; false for a check of the host alone (io).
    pub gpus_take_part: bool,
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

/// The [`Slot`] of a node-level check whose result is the node report's field `$field`; with
/// `host_only`, a check the GPUs take no part in (a busy GPU never excuses its figures).
#[macro_export]
macro_rules! node_slot {
    ($field:ident) => {
        $crate::checks::row::Slot::Node($crate::checks::row::NodeSlot {
            get: |n| &n.$field,
            get_mut: |n| &mut n.$field,
            gpus_take_part: true,
        })
    };
    ($field:ident, host_only) => {
        $crate::checks::row::Slot::Node($crate::checks::row::NodeSlot {
            get: |n| &n.$field,
            get_mut: |n| &mut n.$field,
            gpus_take_part: false,
        })
    };
}

/// A row's [`Settings`] for the check whose settings are the section `$field` of
/// `spec.checks`.
#[macro_export]
macro_rules! settings_in {
    ($field:ident) => {
        $crate::checks::row::Settings {
            asked: |checks| checks.$field.is_some(),
            keep: |checks, on| checks.$field = on.then(|| checks.$field.take().unwrap_or_default()),
        }
    };
}

impl Slot {
    /// Runs `f` on each of its results in `report` that is present.
    pub fn each_mut(&self, report: &mut NodeReport, f: &mut dyn FnMut(&mut dyn AnyResult)) {
        match self {
            Slot::Gpu(s) => {
                for g in &mut report.gpus {
                    if let Some(c) = (s.get_mut)(g).result_mut() {
                        f(c);
                    }
                }
            }
            Slot::Node(s) => {
                if let Some(c) = (s.get_mut)(report).result_mut() {
                    f(c);
                }
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

/// The flags of type `F` as parsed into `given`: what a row's [`FlagSet::apply`] reads.
pub fn parsed<F: clap::FromArgMatches>(given: &clap::ArgMatches) -> Result<F, String> {
    F::from_arg_matches(given).map_err(|e| e.to_string())
}

/// A row's [`FlagSet`] for the check whose flags are `$flags` (with an
/// `apply(&self, &mut Settings)`) and whose settings are the section `$field` of `spec.checks`.
#[macro_export]
macro_rules! flags_of {
    ($flags:ty, $field:ident) => {
        Some($crate::checks::row::FlagSet {
            add: <$flags as clap::Args>::augment_args,
            apply: |given, checks| {
                let flags: $flags = $crate::checks::row::parsed(given)?;
                if let Some(s) = checks.$field.as_mut() {
                    flags.apply(s);
                }
                Ok(())
            },
        })
    };
}
