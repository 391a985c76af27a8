//! One verdict about a node ([`Evidence`]: a validation's final line for it, with what it rests
//! on), read by the node-state controller, the failure marks, the device taints and admission
//! (pure).

use gpuval_crds::Action as Remedy;
use gpuval_crds::{Evidence as Category, FinalLine, NodeAction};
use k8s_openapi::jiff::Timestamp;

/// One verdict about a node: a validation's final line for it ([`gpuval_crds::final_line`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Evidence {
    pub validation: String,
    /// The validation's UID (None where the reading does not know it): with the generation,
    /// which verdict this is, whatever time the reading dates it with.
    pub uid: Option<String>,
    pub at: Timestamp,
    pub passed: bool,
    /// What the verdict rests on: only [`Category::Hardware`] changes the node's labels and
    /// sets `GpuValidated` True or False.
    pub category: Category,
    /// The verdict in the API's words (`Passed`, `Failed`, `Error`, `DeadlineExceeded`).
    pub reason: String,
    /// The first failures, or what to fix, or empty.
    pub message: String,
    /// What to do about the node (None: nothing).
    pub action: Remedy,
    /// The codes of its first failures (or warnings), comma-separated.
    pub codes: String,
    /// What the validation's `spec.onFailure` asks for a node that fails it.
    pub on_failure: NodeAction,
    /// When the validation was created: of two verdicts reached within the same second (the
    /// API's times have whole seconds), the later run's is the newer.
    pub run_created: Option<Timestamp>,
    /// The run's generation: of two verdicts of one validation reached within the same second,
    /// a later generation's is news.
    pub generation: i64,
}

impl Evidence {
    /// True when this line is the verdict of run `uid`'s generation `generation` (false where
    /// either is unknown): the same verdict, however a reading dates it.
    pub fn is_of(&self, uid: Option<&str>, generation: Option<i64>) -> bool {
        matches!((uid, generation), (Some(u), Some(g)) if self.uid.as_deref() == Some(u) && self.generation == g)
    }

    /// The evidence of a final line (None while it has no time: a line without a result in
    /// a run that has not ended).
    pub fn of_line(line: &FinalLine) -> Option<Evidence> {
        Some(Evidence {
            on_failure: NodeAction::None,
            run_created: None,
            generation: 0,
            uid: None,
            validation: line.validation.clone(),
            at: line.at?,
            passed: line.passed(),
            category: line.evidence,
            reason: line.verdict.as_str().into(),
            message: line.message.clone(),
            action: line.action,
            codes: line.codes.clone(),
        })
    }

    /// True for a verdict on hardware evidence (a pass or a hardware failure): the only kind
    /// that changes what a node carries.
    pub fn is_hardware(&self) -> bool {
        self.category.acts_on_node()
    }
}
