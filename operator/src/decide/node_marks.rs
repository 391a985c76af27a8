//! What gpuval puts on a node that failed, and takes back once it passes again (pure).
//!
//! `spec.onFailure` asks a validation to label (`gpuval.io/failed=<validation>`) or taint
//! (`gpuval.io/failed=<validation>:NoSchedule`) the nodes that fail it on hardware evidence;
//! admission runs add the same taint to nodes that do not pass. The node-state controller
//! derives these marks from the hardware news its record shows on every reconcile ([`wanted`];
//! [`crate::decide::failure_record`]), so a write that meets a conflict or an unavailable API server is
//! tried again with backoff until it holds, and a later pass on hardware evidence that covers
//! every standing failure (same checks, no less depth, same GPUs, from the same validation or a
//! schedule's run) removes every one of them: the node returns to service, and its
//! `GpuValidated` message and `gpuval.io/verdict-run` label name the run that proved it.
//!
//! A repeat offender is a node, or a GPU of it, that failed on hardware evidence in two runs or
//! more within the administrator's window ([`repeat_offences`]).

use std::collections::BTreeMap;
use std::time::Duration;

use gpuval_crds::{NodeAction, labels};
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::decide::node_evidence::Evidence;
use crate::settings::config::NodeTaints;

/// What the failure marks of a node should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// Leave them as they are: no verdict, a verdict that is no hardware evidence, or a
    /// hardware failure of a run that asked for no action (admission may have marked it).
    Keep,
    /// Mark the node failed in `run` (the validation's name, in its label form) as `action`
    /// says.
    Mark { action: NodeAction, run: String },
    /// The node passed on hardware evidence after it failed: take every failure mark away.
    Clear,
    /// As [`Wanted::Clear`], for the failure label only (taints are the cluster's).
    ClearLabels,
}

/// The failure marks the hardware news the node's state shows (`latest`; None: none) asks for.
pub fn wanted(latest: Option<&Evidence>) -> Wanted {
    match latest {
        Some(e) if e.is_hardware() && e.passed => Wanted::Clear,
        Some(e) if e.is_hardware() && e.on_failure != NodeAction::None => Wanted::Mark {
            action: e.on_failure,
            run: labels::node_value(&e.validation),
        },
        _ => Wanted::Keep,
    }
}

/// `wanted` as far as gpuval may carry it out when `owner` owns node taints: everything under
/// gpuval; under the cluster's controller, no taint is written or removed (a taint run's mark
/// is left to that controller, which reads `GpuValidated=False`; labels still follow).
pub fn for_taint_owner(wanted: &Wanted, owner: NodeTaints) -> Wanted {
    match wanted {
        Wanted::Mark {
            action: NodeAction::Taint,
            ..
        } if !owner.by_gpuval() => Wanted::Keep,
        Wanted::Clear if !owner.by_gpuval() => Wanted::ClearLabels,
        other => other.clone(),
    }
}

/// Edits `taints` as `wanted` says; true when they changed. A failure taint already there
/// stays as it is (it names the run that failed the node first); [`Wanted::Clear`] removes
/// every `gpuval.io/failed` taint, whatever its effect (all of them are gpuval's).
pub fn edit_taints(taints: &mut Vec<Taint>, wanted: &Wanted) -> bool {
    match wanted {
        Wanted::Keep
        | Wanted::ClearLabels
        | Wanted::Mark {
            action: NodeAction::None | NodeAction::Label,
            ..
        } => false,
        Wanted::Mark {
            action: NodeAction::Taint,
            run,
        } => {
            if taints.iter().any(|t| t.key == labels::FAILED_NODE) {
                return false;
            }
            taints.push(Taint {
                key: labels::FAILED_NODE.into(),
                value: Some(run.clone()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
            true
        }
        Wanted::Clear => {
            let before = taints.len();
            taints.retain(|t| t.key != labels::FAILED_NODE);
            taints.len() != before
        }
    }
}

/// The change of the node's `gpuval.io/failed` label that `wanted` asks for, given its value
/// now (`current`): `Some(Some(v))` to set it to `v`, `Some(None)` to remove it, None to leave
/// it. A label already there stays (it names the run that failed the node first).
pub fn label_edit(current: Option<&str>, wanted: &Wanted) -> Option<Option<String>> {
    match (wanted, current) {
        (
            Wanted::Mark {
                action: NodeAction::Label,
                run,
            },
            None,
        ) => Some(Some(run.clone())),
        (Wanted::Clear | Wanted::ClearLabels, Some(_)) => Some(None),
        _ => None,
    }
}

/// A node's repeated failures within the window.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Offences {
    /// The runs it failed on hardware evidence within the window, oldest first, with when.
    pub runs: Vec<(String, Timestamp)>,
    /// The GPUs (UUIDs) that failed in two of those runs or more.
    pub gpus: Vec<String>,
    /// The window.
    pub window: Duration,
}

impl Offences {
    /// True when the node, or one of its GPUs, failed twice or more within the window.
    pub fn repeated(&self) -> bool {
        self.runs.len() >= 2
    }

    /// The words the node's condition leads with, e.g. `repeat offender: failed 3 runs within
    /// 168h (a, b, c); GPU GPU-1 failed in 2`.
    pub fn words(&self) -> String {
        let runs: Vec<&str> = self.runs.iter().map(|(r, _)| r.as_str()).collect();
        let hours = self.window.as_secs() / 3600;
        let within = match hours {
            0 => format!("{}s", self.window.as_secs()),
            h => format!("{h}h"),
        };
        let mut words = format!(
            "repeat offender: failed {} runs within {within} ({})",
            runs.len(),
            runs.join(", ")
        );
        if !self.gpus.is_empty() {
            words.push_str(&format!(
                "; GPU {} failed in more than one",
                self.gpus.join(", ")
            ));
        }
        words
    }

    /// How long until the oldest counted failure leaves the window (when the node may stop
    /// being a repeat offender), from `now`.
    pub fn expires_in(&self, now: Timestamp) -> Option<Duration> {
        let (_, oldest) = self.runs.first()?;
        let window = SignedDuration::try_from(self.window).ok()?;
        let leaves = oldest.checked_add(window).ok()?;
        let left = leaves.duration_since(now);
        Duration::try_from(left).ok()
    }
}

/// The hardware failures among `lines` (one per run) within `window` before `now`, oldest
/// first; `gpus_of` gives the GPUs (UUIDs) a run failed, asked only when there are two runs or
/// more. None when `window` is zero (the administrator turned the count off) or fewer than
/// two runs failed.
pub fn repeat_offences(
    lines: &[Evidence],
    window: Duration,
    now: Timestamp,
    mut gpus_of: impl FnMut(&Evidence) -> Vec<String>,
) -> Option<Offences> {
    let span = SignedDuration::try_from(window).ok()?;
    if window.is_zero() {
        return None;
    }
    let since = now.checked_sub(span).ok()?;
    let mut failed: Vec<&Evidence> = lines
        .iter()
        .filter(|e| e.is_hardware() && !e.passed && e.at >= since && e.at <= now)
        .collect();
    if failed.len() < 2 {
        return None;
    }
    failed.sort_by_key(|e| (e.at, e.validation.clone()));
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for e in &failed {
        let mut gpus = gpus_of(e);
        gpus.sort();
        gpus.dedup();
        for g in gpus {
            *seen.entry(g).or_default() += 1;
        }
    }
    Some(Offences {
        runs: failed
            .iter()
            .map(|e| (e.validation.clone(), e.at))
            .collect(),
        gpus: seen
            .into_iter()
            .filter(|(_, n)| *n >= 2)
            .map(|(g, _)| g)
            .collect(),
        window,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::{Action as Remedy, Evidence as Category};

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn evidence(run: &str, at: &str, passed: bool, category: Category) -> Evidence {
        Evidence {
            validation: run.into(),
            at: ts(at),
            passed,
            category,
            reason: if passed { "Passed" } else { "Failed" }.into(),
            message: String::new(),
            action: Remedy::None,
            codes: String::new(),
            on_failure: NodeAction::Taint,
            run_created: None,
            generation: 0,
            uid: None,
        }
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            time_added: None,
        }
    }

    #[test]
    fn only_hardware_evidence_marks_a_node_and_only_a_pass_clears_it() {
        let t0 = "2026-11-28T01:00:00Z";
        let failed = evidence("burn-in", t0, false, Category::Hardware);
        assert_eq!(
            wanted(Some(&failed)),
            Wanted::Mark {
                action: NodeAction::Taint,
                run: "burn-in".into()
            }
        );
        let mut quiet = failed.clone();
        quiet.on_failure = NodeAction::None;
        assert_eq!(wanted(Some(&quiet)), Wanted::Keep, "no action asked");
        assert_eq!(
            wanted(Some(&evidence("p", t0, true, Category::Hardware))),
            Wanted::Clear
        );
        for category in Category::ALL.into_iter().filter(|c| !c.acts_on_node()) {
            for passed in [true, false] {
                let e = evidence("x", t0, passed, category);
                assert_eq!(wanted(Some(&e)), Wanted::Keep, "{category} {passed}");
            }
        }
        assert_eq!(wanted(None), Wanted::Keep);
    }

    #[test]
    fn the_failure_taint_is_added_once_and_a_pass_removes_every_one_of_gpuval_s() {
        let mark = Wanted::Mark {
            action: NodeAction::Taint,
            run: "a".into(),
        };
        let other = taint("nvidia.com/gpu", "present", "NoSchedule");
        let mut taints = vec![other.clone()];
        assert!(edit_taints(&mut taints, &mark));
        assert!(!edit_taints(&mut taints, &mark), "already there");
        let again = Wanted::Mark {
            action: NodeAction::Taint,
            run: "b".into(),
        };
        assert!(!edit_taints(&mut taints, &again), "the first run's stays");
        assert_eq!(taints[1], taint(labels::FAILED_NODE, "a", "NoSchedule"));
        taints.push(taint(labels::FAILED_NODE, "adm", "NoExecute"));
        assert!(!edit_taints(&mut taints, &Wanted::Keep));
        assert!(edit_taints(&mut taints, &Wanted::Clear));
        assert_eq!(taints, vec![other], "only gpuval's failure taints go");
        assert!(!edit_taints(&mut taints, &Wanted::Clear));
        let label = Wanted::Mark {
            action: NodeAction::Label,
            run: "a".into(),
        };
        assert!(
            !edit_taints(&mut taints, &label),
            "a label run taints nothing"
        );
    }

    #[test]
    fn under_the_cluster_s_controller_no_taint_is_written_or_removed() {
        let tainting = Wanted::Mark {
            action: NodeAction::Taint,
            run: "a".into(),
        };
        let label = Wanted::Mark {
            action: NodeAction::Label,
            run: "a".into(),
        };
        assert_eq!(for_taint_owner(&tainting, NodeTaints::Gpuval), tainting);
        assert_eq!(
            for_taint_owner(&tainting, NodeTaints::Cluster),
            Wanted::Keep
        );
        assert_eq!(for_taint_owner(&label, NodeTaints::Cluster), label);
        let cleared = for_taint_owner(&Wanted::Clear, NodeTaints::Cluster);
        let mut taints = vec![taint(labels::FAILED_NODE, "old", "NoSchedule")];
        assert!(!edit_taints(&mut taints, &cleared), "{taints:?}");
        assert_eq!(
            label_edit(Some("old"), &cleared),
            Some(None),
            "labels still go"
        );
    }

    #[test]
    fn the_failure_label_is_set_once_and_removed_by_a_pass() {
        let label = Wanted::Mark {
            action: NodeAction::Label,
            run: "a".into(),
        };
        assert_eq!(label_edit(None, &label), Some(Some("a".into())));
        assert_eq!(label_edit(Some("old"), &label), None);
        assert_eq!(label_edit(Some("old"), &Wanted::Clear), Some(None));
        assert_eq!(label_edit(None, &Wanted::Clear), None);
        assert_eq!(label_edit(Some("old"), &Wanted::Keep), None);
        let taint = Wanted::Mark {
            action: NodeAction::Taint,
            run: "a".into(),
        };
        assert_eq!(label_edit(None, &taint), None);
    }

    #[test]
    fn two_hardware_failures_within_the_window_make_a_repeat_offender() {
        let now = ts("2026-11-28T12:00:00Z");
        let week = Duration::from_secs(7 * 24 * 3600);
        let lines = vec![
            evidence("old", "2026-11-01T00:00:00Z", false, Category::Hardware),
            evidence("mon", "2026-11-23T00:00:00Z", false, Category::Hardware),
            evidence("pass", "2026-11-24T00:00:00Z", true, Category::Hardware),
            evidence("busy", "2026-11-25T00:00:00Z", false, Category::Busy),
            evidence("fri", "2026-11-27T00:00:00Z", false, Category::Hardware),
        ];
        let gpus = |e: &Evidence| match e.validation.as_str() {
            "mon" => vec!["GPU-1".to_string(), "GPU-2".into()],
            "fri" => vec!["GPU-2".to_string(), "GPU-2".into()],
            _ => vec![],
        };
        let o = repeat_offences(&lines, week, now, gpus).expect("a repeat offender");
        assert!(o.repeated());
        assert_eq!(
            o.runs.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
            ["mon", "fri"],
            "outside the window, passes and busy lines do not count"
        );
        assert_eq!(o.gpus, ["GPU-2"]);
        let words = o.words();
        assert!(
            words.contains("failed 2 runs within 168h (mon, fri)") && words.contains("GPU-2"),
            "{words}"
        );
        // It stops being one when "mon" leaves the window: 2026-11-30T00:00Z.
        assert_eq!(o.expires_in(now), Some(Duration::from_secs(36 * 3600)));
        // One failure, or the count turned off, is no repeat offender.
        assert_eq!(repeat_offences(&lines[..3], week, now, gpus), None);
        assert_eq!(repeat_offences(&lines, Duration::ZERO, now, gpus), None);
        // A narrower window leaves one failure in it.
        let day = Duration::from_secs(2 * 24 * 3600);
        assert_eq!(repeat_offences(&lines, day, now, gpus), None);
    }
}
