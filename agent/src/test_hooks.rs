//! Planted faults: environment hooks that make a check fail on purpose, so that tests and the
//! GPU gate's benches can prove a fault is caught (`GPUVAL_TRAINING_TEST_CORRUPT` flips a weight
//! bit, `GPUVAL_TRAINING_TEST_HANG_INIT` keeps a replica out of the communicator's setup,
//! `GPUVAL_NCCL_TEST_SKIP_RANK` keeps a rank out of every collective).
//!
//! They exist only in agents built with the cargo feature `test-hooks`, which `make release`
//! and the images leave off: there a set hook is ignored with a warning. Where a hook did
//! plant a fault, every failure it caused says so first and recommends no action: it is not
//! evidence about the hardware.

use gpuval_crds::{Action, Reason, Severity};

/// True when this agent was built with the planted-fault hooks.
pub const ENABLED: bool = cfg!(feature = "test-hooks");

/// How a reason caused by a planted fault begins.
pub const PLANTED: &str = "PLANTED FAULT";

/// The value of hook `name` from the environment, when hooks are built in and it is set.
pub fn value(name: &str) -> Option<String> {
    value_from(name, |k| std::env::var(k).ok(), ENABLED)
}

/// [`value`] with the environment and the build's choice given: None when the hook is unset or
/// blank, or set in a build without hooks (then with a warning, once per read).
pub fn value_from(
    name: &str,
    get: impl Fn(&str) -> Option<String>,
    enabled: bool,
) -> Option<String> {
    let v = get(name).filter(|v| !v.trim().is_empty())?;
    if !enabled {
        tracing::warn!(
            env = name,
            "planted-fault hook ignored: this agent is built without the test-hooks feature"
        );
        return None;
    }
    Some(v)
}

/// Marks `reasons` (failures and errors only) as caused by hook `hook` (`NAME=VALUE`): each
/// message begins with [`PLANTED`] and the hook, and recommends no action.
pub fn mark_planted<'a>(reasons: impl IntoIterator<Item = &'a mut Reason>, hook: &str) {
    for r in reasons {
        // Error sorts below Fail (a hardware fault leads), so the two are named.
        if !matches!(r.severity, Severity::Fail | Severity::Error) {
            continue;
        }
        if !r.message.starts_with(PLANTED) {
            r.message = format!(
                "{PLANTED} by {hook} (a test, not the hardware; no action): {}",
                r.message
            );
        }
        r.action = Action::None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::Code;

    #[test]
    fn hooks_are_ignored_in_a_build_without_them() {
        let set = |_: &str| Some("1:5".to_string());
        assert_eq!(value_from("H", set, true).as_deref(), Some("1:5"));
        assert_eq!(value_from("H", set, false), None, "release build");
        assert_eq!(value_from("H", |_| Some("  ".into()), true), None);
        assert_eq!(value_from("H", |_| None, true), None);
        // Only the feature turns them on.
        const { assert!(ENABLED == cfg!(feature = "test-hooks")) };
    }

    #[test]
    fn the_release_build_and_the_images_leave_the_hooks_out() {
        let makefile = include_str!("../../Makefile");
        let release = makefile
            .lines()
            .skip_while(|l| !l.starts_with("release:"))
            .nth(1)
            .unwrap_or_default();
        assert!(
            release.contains("cargo") || release.contains("CARGO"),
            "{release}"
        );
        assert!(!release.contains("test-hooks") && !release.contains("--all-features"));
        let dockerfile = include_str!("../../Dockerfile");
        assert!(!dockerfile.contains("test-hooks") && !dockerfile.contains("--all-features"));
        assert!(!agent_default_features().contains("test-hooks"));
    }

    /// The agent crate's `default` features line, if any.
    fn agent_default_features() -> &'static str {
        include_str!("../Cargo.toml")
            .lines()
            .find(|l| l.trim_start().starts_with("default"))
            .unwrap_or_default()
    }

    #[test]
    fn a_planted_failure_says_so_and_recommends_no_action() {
        let mut reasons = vec![
            Reason::new(Code::TrainingDiverged, "GPU1: weights diverged at step 5"),
            Reason::new(Code::ClockThrottled, "GPU0: thermal slowdown"),
            Reason::new(
                Code::CheckCouldNotRun,
                "ncclCommInitRank did not return within 15s on rank 0 (GPU 0)",
            ),
        ];
        assert_eq!(reasons[0].action, Action::ReplaceHardware);
        mark_planted(&mut reasons, "GPUVAL_TRAINING_TEST_CORRUPT=1:5");
        mark_planted(&mut reasons, "GPUVAL_TRAINING_TEST_CORRUPT=1:5");
        assert_eq!(
            reasons[0].message,
            "PLANTED FAULT by GPUVAL_TRAINING_TEST_CORRUPT=1:5 (a test, not the hardware; no action): GPU1: weights diverged at step 5"
        );
        assert_eq!(reasons[0].action, Action::None);
        assert_eq!(
            reasons[1].message, "GPU0: thermal slowdown",
            "a warning is left"
        );
        assert!(
            reasons[2].message.starts_with(PLANTED),
            "an error the hook caused says so too: {}",
            reasons[2].message
        );
    }
}
