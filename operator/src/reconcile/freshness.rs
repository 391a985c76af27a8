//! Which node results may decide a node's verdict (pure): a result counts for a run only when
//! it is of the run's generation and was written by the node's current agent pod. A result
//! that an older generation's agent, or a replaced pod of this generation, wrote late is
//! ignored: it neither changes the verdict nor ends the wait for the current pod's result.
//!
//! The writer is the pod the result names (`gpuval.io/pod-uid`, else `gpuval.io/pod`); the
//! current pod is the one of this generation for that node that the operator sees. Where the
//! operator sees no pod of the run for the node (completed pods cleaned up before a restart),
//! the generation alone decides, so a finished node keeps its result.

/// A pod, as far as telling writers apart goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodId<'a> {
    pub name: &'a str,
    /// None when the writer did not say (an agent without `POD_UID`).
    pub uid: Option<&'a str>,
}

/// What a result says of its run and its writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    pub generation: i64,
    /// The pod that wrote it; None when the result names none.
    pub writer: Option<PodId<'a>>,
}

/// Whether a result counts, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freshness {
    /// Written by the node's current pod for this generation (or no pod of the run is seen).
    Current,
    /// Of another generation: the steps ignore it and delete it.
    OtherGeneration { result: i64, run: i64 },
    /// Of this generation, but not written by the node's current pod.
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

/// Judges a result's `claim` against the run's `generation` and the node's current pod.
pub fn judge(claim: Claim<'_>, generation: i64, current: Option<PodId<'_>>) -> Freshness {
    if claim.generation != generation {
        return Freshness::OtherGeneration {
            result: claim.generation,
            run: generation,
        };
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

    fn claim(generation: i64, writer: Option<PodId<'static>>) -> Claim<'static> {
        Claim { generation, writer }
    }

    #[test]
    fn the_current_pods_result_of_this_generation_counts() {
        assert_eq!(judge(claim(2, Some(POD)), 2, Some(POD)), Freshness::Current);
    }

    #[test]
    fn an_older_generations_result_does_not_count() {
        let f = judge(claim(1, Some(POD)), 2, Some(POD));
        assert_eq!(f, Freshness::OtherGeneration { result: 1, run: 2 });
        assert!(!f.counts());
    }

    #[test]
    fn a_replaced_pods_result_does_not_count_even_under_the_same_name() {
        let replaced = PodId {
            name: POD.name,
            uid: Some("uid-before"),
        };
        let f = judge(claim(2, Some(replaced)), 2, Some(POD));
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
        assert!(!judge(claim(2, None), 2, Some(POD)).counts());
    }

    #[test]
    fn without_uids_the_pod_name_tells() {
        let by_name = PodId {
            name: POD.name,
            uid: None,
        };
        assert!(judge(claim(2, Some(by_name)), 2, Some(POD)).counts());
        let other = PodId {
            name: "gpuval-v-gpu-0-g1",
            uid: None,
        };
        assert!(!judge(claim(2, Some(other)), 2, Some(POD)).counts());
    }

    #[test]
    fn with_no_pod_of_the_run_seen_the_generation_decides() {
        assert!(judge(claim(2, Some(POD)), 2, None).counts());
        assert!(!judge(claim(1, Some(POD)), 2, None).counts());
    }
}
