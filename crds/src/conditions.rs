//! kstatus condition helpers (pure: the caller passes the clock).
//!
//! `Ready`, `Reconciling` and `Stalled` each carry `observedGeneration`, and
//! `lastTransitionTime` moves only when a condition's status flips, so that writing the same
//! status twice changes nothing (no self-triggered reconcile storms).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";

/// The status value of a condition as the API writes it.
pub fn status_str(value: bool) -> &'static str {
    if value { "True" } else { "False" }
}

/// Sets (or adds) condition `type_`, keeping `lastTransitionTime` unless the status flips.
/// Returns true when anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let status = status_str(value);
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let flipped = c.status != status;
            let changed = flipped
                || c.reason != reason
                || c.message != message
                || c.observed_generation != generation;
            if flipped {
                c.last_transition_time = now.clone();
            }
            c.status = status.to_string();
            c.reason = reason.to_string();
            c.message = message.to_string();
            c.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message: message.to_string(),
                observed_generation: generation,
                last_transition_time: now.clone(),
            });
            true
        }
    }
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when condition `type_` is present with status True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_flip() {
        let mut c = Vec::new();
        assert!(set_condition(
            &mut c,
            READY,
            false,
            "Running",
            "2/3 nodes done",
            Some(1),
            &t(100)
        ));
        assert!(set_condition(
            &mut c,
            READY,
            false,
            "Running",
            "3/3 nodes done",
            Some(1),
            &t(200)
        ));
        assert_eq!(
            c[0].last_transition_time,
            t(100),
            "message change is not a transition"
        );
        assert!(set_condition(
            &mut c,
            READY,
            true,
            "Passed",
            "all passed",
            Some(1),
            &t(300)
        ));
        assert_eq!(c[0].last_transition_time, t(300));
        assert!(is_true(&c, READY));
    }

    #[test]
    fn writing_the_same_condition_twice_changes_nothing() {
        let mut c = Vec::new();
        let write = |c: &mut Vec<Condition>, at: i64| {
            set_condition(
                c,
                STALLED,
                true,
                "NodesFailed",
                "gpu-1 failed",
                Some(2),
                &t(at),
            )
        };
        write(&mut c, 1);
        let before = c.clone();
        assert!(!write(&mut c, 9));
        assert_eq!(c, before);
    }

    #[test]
    fn generation_change_is_a_change() {
        let mut c = Vec::new();
        set_condition(&mut c, RECONCILING, true, "Running", "", Some(1), &t(1));
        assert!(set_condition(
            &mut c,
            RECONCILING,
            true,
            "Running",
            "",
            Some(2),
            &t(1)
        ));
        assert_eq!(find(&c, RECONCILING).unwrap().observed_generation, Some(2));
    }
}
