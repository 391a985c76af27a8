//! What a node carries between runs (pure): its verdict record, the JSON annotation
//! `gpuval.io/verdict-record` the operator alone writes on the Node.
//!
//! A node's state is a record, not the latest reading. The record holds the newest hardware
//! verdict the node's state was judged on ([`Record::judged`]: a line no newer is no news, so a
//! run deleted, pruned, edited or running again changes nothing) and every failure on hardware
//! evidence that stands ([`Failure`]: the run, its validation's UID and schedule, the depth of
//! its checks, the GPUs it failed by UUID, its codes, when). A failure stands through the
//! deletion, pruning or re-run of its run until a later hardware pass covers it ([`covers`]):
//! the same checks at no less depth, on the same GPUs, from a run owned by a schedule (whose
//! author holds the `admit` verb: the chart's `…-admit` policy asks it of whoever writes such a
//! run) or from the same validation.
//!
//! Depth ([`Depth`]) is read from the failing run's spec: every check it ran, and for each the
//! figures that say how hard it looked. A pass covers a check when it ran it with a memory
//! `fraction` and `passes`, a compute `duration` and every one of its `dtypes`, at least as
//! great; every explicit floor (`min…`) no lower and every explicit ceiling (`max…`) no higher
//! than the failing run's (a floor or ceiling the failing run left to its default must be left
//! so); a `relativeTolerancePercent` no greater; and no severity override of a code the node
//! failed with that the failing run did not have.

use std::collections::{BTreeMap, BTreeSet};

use gpuval_crds::{GpuValidation, NodeAction};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decide::node_evidence::Evidence;

/// The Node annotation that holds the record.
pub const ANNOTATION: &str = "gpuval.io/verdict-record";

/// A node's verdict record.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The newest hardware verdict the node's state was judged on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judged: Option<Judged>,
    /// The failures on hardware evidence that stand, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<Failure>,
    /// The last hardware verdict of a run whose author may admit nodes (a schedule's): passed
    /// only where no failure stood after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Judged>,
    /// The final lines without hardware evidence since the verdict it was judged on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet: Option<Quiet>,
}

/// The final lines in a row without hardware evidence (busy, infrastructure, configuration,
/// no evidence) since the node's last hardware verdict: how many, and the newest of them.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Quiet {
    /// How many lines.
    pub lines: u32,
    /// The newest line's run.
    pub run: String,
    /// When it was reached (RFC 3339).
    pub at: String,
    /// Its kind of evidence (`Busy`, `Infrastructure`, ...).
    pub category: String,
    /// What it said (what to fix).
    pub message: String,
    /// How many of the newest lines in a row found a GPU busy with memory or load that no pod
    /// holds (`GpuHeldByNoPod`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unheld: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The code of a GPU busy with memory or load that no pod holds.
const HELD_BY_NO_POD: &str = "GpuHeldByNoPod";

/// A verdict the node's state was judged on: its run and when it was reached (RFC 3339).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Judged {
    pub run: String,
    pub at: String,
    pub passed: bool,
    /// The run's generation (absent in records written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The run's UID (absent in records written before it was kept): with the generation, it
    /// names the verdict whatever time a reading dates it with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl Judged {
    /// True when `e` is the verdict this one is (the same run's UID and generation, and
    /// outcome), however its time reads.
    fn is(&self, e: &Evidence) -> bool {
        self.passed == e.passed && e.is_of(self.uid.as_deref(), self.generation)
    }
}

/// A failure on hardware evidence, as the node records it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// The validation that failed the node.
    pub run: String,
    pub validation_uid: String,
    /// The schedule that made the run, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// What its checks looked at, and how hard.
    pub depth: Depth,
    /// The GPUs it failed, by UUID (empty: the node as a whole).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// Its codes, comma-separated.
    #[serde(default)]
    pub codes: String,
    /// When it was reached (RFC 3339).
    pub at: String,
    /// The failing run's generation (absent in records written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// What its `spec.onFailure` asked.
    #[serde(default)]
    pub on_failure: NodeAction,
}

/// The depth of a run's checks (see the module's documentation).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Depth {
    /// Each check the run ran (`spec.checks`' keys), with its settings.
    pub checks: BTreeMap<String, Value>,
    /// `spec.thresholds.relativeTolerancePercent` (its default where unset).
    pub relative_tolerance_percent: i32,
    /// `spec.severityOverrides`: severity by code.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: BTreeMap<String, String>,
}

impl Depth {
    /// The depth of run `gv`.
    pub fn of(gv: &GpuValidation) -> Depth {
        let checks = match serde_json::to_value(&gv.spec.checks) {
            Ok(Value::Object(m)) => m.into_iter().filter(|(_, v)| !v.is_null()).collect(),
            _ => BTreeMap::new(),
        };
        let overrides = gv
            .spec
            .severity_overrides
            .iter()
            .map(|o| {
                let severity = serde_json::to_value(o.severity)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default();
                (o.code.as_str().to_string(), severity)
            })
            .collect();
        Depth {
            checks,
            relative_tolerance_percent: gv
                .spec
                .thresholds
                .clone()
                .unwrap_or_default()
                .relative_tolerance_percent,
            overrides,
        }
    }
}

/// A hardware pass, as [`covers`] weighs it against a failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass<'a> {
    pub validation_uid: &'a str,
    /// The run is owned by a schedule (its author holds `admit`).
    pub by_schedule: bool,
    pub depth: &'a Depth,
    /// The GPUs its report covered, by UUID.
    pub gpus: &'a BTreeSet<String>,
    pub at: Timestamp,
}

/// Ok when `pass` clears `failure`, else why not (in words).
pub fn covers(pass: &Pass<'_>, failure: &Failure) -> Result<(), String> {
    let same_run = pass.validation_uid == failure.validation_uid;
    if !same_run && !pass.by_schedule {
        return Err(
            "a run neither of the same validation nor of a schedule (whose author may admit nodes)"
                .into(),
        );
    }
    if failure.at().is_none_or(|at| pass.at <= at) {
        return Err("not later than the failure".into());
    }
    if let Some(gpu) = failure.gpus.iter().find(|g| !pass.gpus.contains(*g)) {
        return Err(format!("it did not cover GPU {gpu}"));
    }
    deeper(pass.depth, &failure.depth, &failure.codes)
}

/// Ok when `pass` looked at least as hard as `failed` (a failure with `codes`), else why not.
fn deeper(pass: &Depth, failed: &Depth, codes: &str) -> Result<(), String> {
    for (check, settings) in &failed.checks {
        let Some(ours) = pass.checks.get(check) else {
            return Err(format!("it did not run the {check} check"));
        };
        no_shallower(check, ours, settings)?;
    }
    if pass.relative_tolerance_percent > failed.relative_tolerance_percent {
        return Err(format!(
            "its relativeTolerancePercent {} is above {}",
            pass.relative_tolerance_percent, failed.relative_tolerance_percent
        ));
    }
    let failed_codes: BTreeSet<&str> = codes.split(',').map(str::trim).collect();
    for (code, severity) in &pass.overrides {
        if failed_codes.contains(code.as_str()) && failed.overrides.get(code) != Some(severity) {
            return Err(format!("it overrides the severity of {code} to {severity}"));
        }
    }
    Ok(())
}

/// Ok when a check's settings `ours` are no shallower than `theirs` (at `path`).
fn no_shallower(path: &str, ours: &Value, theirs: &Value) -> Result<(), String> {
    let (Some(ours), Some(theirs)) = (ours.as_object(), theirs.as_object()) else {
        return Ok(());
    };
    let keys: BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    for key in keys {
        let (o, t) = (ours.get(key), theirs.get(key));
        let at = format!("{path}.{key}");
        let bound = key.starts_with("min") || key.starts_with("max");
        match key.as_str() {
            "fraction" | "passes" | "duration" => at_least(&at, o, t, true)?,
            "dtypes" => {
                let set = |v: Option<&Value>| -> BTreeSet<String> {
                    v.and_then(Value::as_array)
                        .map(|a| a.iter().map(Value::to_string).collect())
                        .unwrap_or_default()
                };
                if !set(o).is_superset(&set(t)) {
                    return Err(format!("its {at} lacks some of {}", set(t).len()));
                }
            }
            _ if bound => at_least(&at, o, t, key.starts_with("min"))?,
            _ => {}
        }
    }
    Ok(())
}

/// Ok when figure `ours` is at least (`up`) or at most (not `up`) `theirs`; both absent is
/// equal, one absent is not (a default is not comparable with a set figure).
fn at_least(
    at: &str,
    ours: Option<&Value>,
    theirs: Option<&Value>,
    up: bool,
) -> Result<(), String> {
    let figure = |v: &Value| -> Option<f64> {
        v.as_f64().or_else(|| {
            v.as_str()
                .and_then(|s| s.parse::<gpuval_crds::Duration>().ok())
                .map(|d| d.as_secs_f64())
        })
    };
    match (ours, theirs) {
        (None, None) => Ok(()),
        (Some(o), Some(t)) if o.is_object() && t.is_object() => no_shallower(at, o, t),
        (Some(o), Some(t)) => match (figure(o), figure(t)) {
            (Some(a), Some(b)) if (up && a >= b) || (!up && a <= b) => Ok(()),
            _ => Err(format!("its {at} {o} is shallower than {t}")),
        },
        _ => Err(format!(
            "its {at} differs from the failing run's (set against default)"
        )),
    }
}

impl Failure {
    /// When it was reached.
    pub fn at(&self) -> Option<Timestamp> {
        self.at.parse().ok()
    }
}

impl Record {
    /// The record a node's annotation holds (an empty one where it has none).
    pub fn parse(annotation: Option<&str>) -> Result<Record, serde_json::Error> {
        match annotation {
            Some(s) => serde_json::from_str(s),
            None => Ok(Record::default()),
        }
    }

    /// True when hardware verdict `e` is news to this record: a later generation of the
    /// validation it was judged on (whatever the times say: a result's time has whole seconds,
    /// a run's end more, and a quick re-run can end within the same second), or newer than the
    /// verdict it was judged on (within the same second, another validation's); without a
    /// judged verdict, newer
    /// than `carried` (the `GpuValidated` condition's heartbeat), when the node carries one.
    pub fn is_news(&self, e: &Evidence, carried: Option<Timestamp>) -> bool {
        match &self.judged {
            // The same verdict read again, dated otherwise (a line whose result was replaced
            // by the next generation's is dated by the run's end).
            Some(j) if j.is(e) => false,
            Some(j) => match j.at.parse::<Timestamp>() {
                Ok(at) => {
                    let later_generation =
                        e.validation == j.run && j.generation.is_some_and(|g| e.generation > g);
                    e.at > at || later_generation || (e.at == at && e.validation != j.run)
                }
                Err(_) => true,
            },
            None => carried.is_none_or(|c| e.at >= c),
        }
    }

    /// True when hardware verdict `e` is in this record: judged on it or on a newer verdict (or,
    /// never judged, older than `carried`), or holding it as a standing failure. Until then the
    /// run that reached it is kept (a deletion would lose a failure no node recorded).
    pub fn took_in(&self, e: &Evidence, carried: Option<Timestamp>) -> bool {
        let holds = |f: &Failure| e.uid.as_deref() == Some(f.validation_uid.as_str());
        !self.is_news(e, carried) || self.failures.iter().any(holds)
    }

    /// Counts the lines of `lines` without hardware evidence that are newer than both the
    /// verdict this record was judged on and the newest line counted before (each line once,
    /// oldest first); true when it counted any.
    pub fn note_quiet(&mut self, lines: &[Evidence]) -> bool {
        let parse = |at: &str| at.parse::<Timestamp>().ok();
        let judged = self.judged.as_ref().and_then(|j| parse(&j.at));
        let counted = self.quiet.as_ref().and_then(|q| parse(&q.at));
        let floor = judged.max(counted);
        let mut new: Vec<&Evidence> = lines
            .iter()
            .filter(|e| !e.is_hardware() && floor.is_none_or(|f| e.at > f))
            .collect();
        new.sort_by_key(|e| (e.at, e.run_created));
        let Some(last) = new.last() else {
            return false;
        };
        let before = self.quiet.as_ref().map_or(0, |q| q.lines);
        let added = u32::try_from(new.len()).unwrap_or(u32::MAX);
        let unheld = new
            .iter()
            .fold(self.quiet.as_ref().map_or(0, |q| q.unheld), |n, e| match e
                .codes
                .split(',')
                .any(|c| c.trim() == HELD_BY_NO_POD)
            {
                true => n.saturating_add(1),
                false => 0,
            });
        self.quiet = Some(Quiet {
            lines: before.saturating_add(added),
            run: last.validation.clone(),
            at: last.at.to_string(),
            category: last.category.as_str().to_string(),
            message: last.message.clone(),
            unheld,
        });
        true
    }

    /// Records hardware verdict `e` of a run whose author may admit nodes: `passed` where it
    /// passed and no failure stands.
    pub fn admit(&mut self, e: &Evidence, passed: bool) {
        self.admission = Some(Judged {
            run: e.validation.clone(),
            at: e.at.to_string(),
            passed,
            generation: Some(e.generation),
            uid: e.uid.clone(),
        });
    }

    /// Records that the node's state was judged on `e` (hardware news ends a quiet streak).
    pub fn judge(&mut self, e: &Evidence) {
        self.quiet = None;
        self.judged = Some(Judged {
            run: e.validation.clone(),
            at: e.at.to_string(),
            passed: e.passed,
            generation: Some(e.generation),
            uid: e.uid.clone(),
        });
    }

    /// Records `failure`, in place of an earlier one of the same validation; the same failure
    /// (same validation, and the same time or generation) judged again stays as first recorded
    /// (its depth is the one of the spec it ran with, which may have been edited since).
    pub fn fail(&mut self, failure: Failure) {
        let same = |f: &Failure| {
            f.validation_uid == failure.validation_uid
                && (f.at == failure.at
                    || (f.generation.is_some() && f.generation == failure.generation))
        };
        if self.failures.iter().any(same) {
            return;
        }
        self.failures
            .retain(|f| f.validation_uid != failure.validation_uid);
        self.failures.push(failure);
    }

    /// The newer of this record and `other`: by the verdict each was judged on (a record
    /// judged on nothing is the older), then by the last line without hardware evidence each
    /// counted (a record that counted none is the older; on a tie, this one).
    pub fn newer(self, other: Record) -> Record {
        let at = |r: &Record| {
            let parse = |at: &str| at.parse::<Timestamp>().ok();
            (
                r.judged.as_ref().and_then(|j| parse(&j.at)),
                r.quiet.as_ref().and_then(|q| parse(&q.at)),
            )
        };
        if at(&other) > at(&self) { other } else { self }
    }

    /// Takes away the failures `pass` covers; those it cleared, and why each other stands.
    pub fn pass(&mut self, pass: &Pass<'_>) -> (Vec<Failure>, Vec<(String, String)>) {
        let mut cleared = Vec::new();
        let mut stand = Vec::new();
        let mut kept = Vec::new();
        for f in std::mem::take(&mut self.failures) {
            match covers(pass, &f) {
                Ok(()) => cleared.push(f),
                Err(why) => {
                    stand.push((f.run.clone(), why));
                    kept.push(f);
                }
            }
        }
        self.failures = kept;
        (cleared, stand)
    }

    /// The annotation's value.
    pub fn annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
#[path = "failure_record_tests.rs"]
mod tests;
