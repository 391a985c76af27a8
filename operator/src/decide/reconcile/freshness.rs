//! Which node results may decide a node's verdict (pure): a result counts for a run only when
//! it is bound to the run (the validation's uid and generation, which the operator wrote when it
//! created the result for the node's agent pod: [`gpuval_crds::binding`]), is not closed, and
//! is bound to the node's current agent pod. A result that an older generation's agent, or a
//! replaced pod of this generation, wrote late is ignored: it neither changes the verdict nor
//! ends the wait for the current pod's result; nor does a closed one (the node's line became
//! final without it).
//!
//! The writer is the pod the result is bound to (`gpuval.io/pod-uid`, else `gpuval.io/pod`);
//! the current pod is the one of this generation for that node that the operator sees. Where
//! the operator sees no pod of the run for the node (completed pods cleaned up before a
//! restart), the binding alone decides, so a finished node keeps its result.

/// A pod, as far as telling writers apart goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodId<'a> {
    pub name: &'a str,
    /// None when it is not known.
    pub uid: Option<&'a str>,
}

/// The run a result is judged for: its validation's uid and its generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run<'a> {
    pub uid: &'a str,
    pub generation: i64,
}

/// What a result says of its run and its writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    pub generation: i64,
    /// The uid of the validation it is bound to; None when it names none.
    pub validation_uid: Option<&'a str>,
    /// The pod it is bound to; None when it names none.
    pub writer: Option<PodId<'a>>,
    /// It is closed (`gpuval.io/closed`).
    pub closed: bool,
}

/// Whether a result counts, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freshness {
    /// Bound to this run and to the node's current pod (or no pod of the run is seen).
    Current,
    /// Of another generation: the steps ignore it and delete it.
    OtherGeneration { result: i64, run: i64 },
    /// Not bound to this validation (no binding, or another validation's uid).
    NotBound { bound_to: Option<String> },
    /// Closed: the node's line became final without it (kept for the record).
    Closed,
    /// Of this run, but not bound to the node's current pod.
    NotCurrentPod {
        writer: Option<String>,
        current: String,
    },
}

impl Freshness {
    pub fn counts(&self) -> bool {
        matches!(self, Freshness::Current)
    }
}

/// Judges a result's `claim` against the `run` and the node's current pod.
pub fn judge(claim: Claim<'_>, run: Run<'_>, current: Option<PodId<'_>>) -> Freshness {
    if claim.generation != run.generation {
        return Freshness::OtherGeneration {
            result: claim.generation,
            run: run.generation,
        };
    }
    if claim.validation_uid != Some(run.uid) {
        return Freshness::NotBound {
            bound_to: claim.validation_uid.map(str::to_string),
        };
    }
    if claim.closed {
        return Freshness::Closed;
    }
    let Some(current) = current else {
        return Freshness::Current;
    };
    let same = claim.writer.is_some_and(|w| match (w.uid, current.uid) {
        (Some(a), Some(b)) => a == b,
        // Without a uid on both sides, the name tells (pod names are per node and generation).
        _ => w.uid.is_none() && w.name == current.name,
    });
    if same {
        Freshness::Current
    } else {
        Freshness::NotCurrentPod {
            writer: claim.writer.map(|w| w.uid.unwrap_or(w.name).to_string()),
            current: current.uid.unwrap_or(current.name).to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: PodId<'static> = PodId {
        name: "gpuval-v-gpu-0-g2",
        uid: Some("uid-now"),
    };
    const RUN: Run<'static> = Run {
        uid: "v-uid",
        generation: 2,
    };

    fn claim(generation: i64, writer: Option<PodId<'static>>) -> Claim<'static> {
        Claim {
            generation,
            validation_uid: Some("v-uid"),
            writer,
            closed: false,
        }
    }

    #[test]
    fn the_current_pods_result_of_this_run_counts() {
        assert_eq!(
            judge(claim(2, Some(POD)), RUN, Some(POD)),
            Freshness::Current
        );
    }

    #[test]
    fn an_older_generations_result_does_not_count() {
        let f = judge(claim(1, Some(POD)), RUN, Some(POD));
        assert_eq!(f, Freshness::OtherGeneration { result: 1, run: 2 });
        assert!(!f.counts());
    }

    #[test]
    fn a_result_bound_to_another_validation_or_to_none_does_not_count() {
        let mut other = claim(2, Some(POD));
        other.validation_uid = Some("a-recreated-validation");
        let f = judge(other, RUN, Some(POD));
        assert_eq!(
            f,
            Freshness::NotBound {
                bound_to: Some("a-recreated-validation".into())
            }
        );
        assert!(!f.counts());
        let mut unbound = claim(2, Some(POD));
        unbound.validation_uid = None;
        assert!(!judge(unbound, RUN, Some(POD)).counts());
        assert!(
            !judge(unbound, RUN, None).counts(),
            "not even where no pod of the run is seen"
        );
    }

    #[test]
    fn a_closed_result_never_counts() {
        let mut closed = claim(2, Some(POD));
        closed.closed = true;
        assert_eq!(judge(closed, RUN, Some(POD)), Freshness::Closed);
        assert_eq!(judge(closed, RUN, None), Freshness::Closed);
    }

    #[test]
    fn a_replaced_pods_result_does_not_count_even_under_the_same_name() {
        let replaced = PodId {
            name: POD.name,
            uid: Some("uid-before"),
        };
        let f = judge(claim(2, Some(replaced)), RUN, Some(POD));
        assert_eq!(
            f,
            Freshness::NotCurrentPod {
                writer: Some("uid-before".into()),
                current: "uid-now".into()
            }
        );
        assert!(!f.counts());
    }

    #[test]
    fn a_result_that_names_no_writer_does_not_count_while_a_pod_runs() {
        assert!(!judge(claim(2, None), RUN, Some(POD)).counts());
    }

    #[test]
    fn without_uids_the_pod_name_tells() {
        let by_name = PodId {
            name: POD.name,
            uid: None,
        };
        assert!(judge(claim(2, Some(by_name)), RUN, Some(POD)).counts());
        let other = PodId {
            name: "gpuval-v-gpu-0-g1",
            uid: None,
        };
        assert!(!judge(claim(2, Some(other)), RUN, Some(POD)).counts());
    }

    #[test]
    fn with_no_pod_of_the_run_seen_the_binding_decides() {
        assert!(judge(claim(2, Some(POD)), RUN, None).counts());
        assert!(!judge(claim(1, Some(POD)), RUN, None).counts());
    }
}
