//! In a pod: the agent stays after its node checks passed and takes part in the fabric test.
//! It watches this run's `GpuFabricRound` objects, runs the groups of each round that name its
//! node (in `id` order), and writes what it measured into its own result's
//! [`FABRIC_OUTCOMES`](gpuval_crds::labels::FABRIC_OUTCOMES) annotation, all rounds so far, so
//! the operator (and a restarted operator) reads the whole history from one place. It leaves at
//! the `end` round, at the run's deadline, or on a signal.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gpuval_crds::fabric::{FabricOutcome, FabricRoundSpec, FabricSpec, GpuFabricRound};
use gpuval_crds::{GpuNodeResult, labels};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};

use super::member_key::{Auth, KeyError};
use super::{Assignment, NcclGroup};

/// Why the agent left the fabric test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Left {
    /// The operator planned the end.
    Ended,
    /// The run's deadline passed first.
    Deadline,
    /// The round watch ended for good (the API server kept refusing it).
    WatchFailed(String),
}

/// Who this agent is in the run.
pub struct Member<'a> {
    pub client: Client,
    pub namespace: &'a str,
    pub validation: &'a str,
    pub generation: i64,
    pub node: &'a str,
    /// The result object's name.
    pub result: String,
    /// The agent's field manager (the fabric annotation is applied under `<it>-fabric`).
    pub field_manager: String,
}

/// This node's assignments in `round`, each bounded by the round's timeout and `deadline`.
pub fn assignments(
    round: &FabricRoundSpec,
    node: &str,
    now: Timestamp,
    deadline: Instant,
) -> Vec<Assignment> {
    let started = round.started.0;
    let budget = Duration::from_secs(u64::try_from(round.timeout_seconds).unwrap_or(0));
    let spent: Duration = now
        .duration_since(started)
        .try_into()
        .unwrap_or(Duration::ZERO);
    let ends = Instant::now() + budget.saturating_sub(spent);
    let mut groups: Vec<_> = round
        .groups
        .iter()
        .filter_map(|g| Some((g, g.nodes.iter().position(|n| n == node)?)))
        .collect();
    groups.sort_by_key(|(g, _)| g.id);
    groups
        .into_iter()
        .map(|(g, rank)| Assignment {
            round: round.round,
            group: g.id,
            kind: g.kind,
            nodes: g.nodes.clone(),
            rank,
            rendezvous: g.rendezvous.clone(),
            gpus: g
                .gpus
                .iter()
                .map(|n| u32::try_from(*n).unwrap_or(0))
                .collect(),
            deadline: ends.min(deadline),
            rail: g.rail.clone(),
        })
        .collect()
}

/// The label selector of this run's rounds.
pub fn selector(validation: &str, generation: i64) -> String {
    format!(
        "{}={},{}={}",
        labels::VALIDATION,
        labels::node_value(validation),
        labels::GENERATION,
        generation
    )
}

/// Takes part until the end round, the `deadline`, or the watch failing for good. Groups are
/// joined with `auth`'s key; without a usable key (its error), each group assigned to this
/// node ends at once with that error (a `Local` one: this node's), so the operator reads why.
pub async fn take_part(
    m: &Member<'_>,
    spec: &FabricSpec,
    (nccl, auth): (std::sync::Arc<dyn NcclGroup>, Result<Auth, KeyError>),
    deadline: Instant,
) -> Left {
    let api: Api<GpuFabricRound> = Api::namespaced(m.client.clone(), m.namespace);
    let cfg = watcher::Config::default().labels(&selector(m.validation, m.generation));
    let mut stream = watcher(api, cfg)
        .default_backoff()
        .applied_objects()
        .boxed();
    let ports_before = read_ports_logged();
    let mut parts = Parts::default();
    let mut done = 0;
    let mut outcomes: Vec<FabricOutcome> = Vec::new();
    loop {
        let next = tokio::time::timeout_at(deadline.into(), stream.next()).await;
        let round = match next {
            Err(_) => return Left::Deadline,
            Ok(None) => return Left::WatchFailed("the round watch ended".into()),
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "fabric round watch error; the watcher retries");
                continue;
            }
            Ok(Some(Ok(r))) => r.spec,
        };
        if round.validation != m.validation || round.generation != m.generation {
            continue;
        }
        parts.add(round);
        // Rounds are taken in order, once all their parts are here; one that arrives early
        // waits for those before it.
        while let Some(r) = parts.round(done + 1) {
            done += 1;
            if r.end {
                tracing::info!(round = r.round, "the fabric test is over");
                write_ports(m, spec, &ports_before, true, deadline).await;
                return Left::Ended;
            }
            let mine = assignments(&r, m.node, Timestamp::now(), deadline);
            if mine.is_empty() {
                continue;
            }
            tracing::info!(round = r.round, purpose = %r.purpose, groups = mine.len(), "fabric round");
            let got = match &auth {
                Ok(auth) => {
                    super::group::run_round(mine, spec.clone(), nccl.clone(), auth.clone()).await
                }
                Err(e) => without_key(&mine, e),
            };
            outcomes.extend(got);
            // The ports first: the operator concludes on outcomes, and finds the ports as they
            // were after this node's last round.
            write_ports(m, spec, &ports_before, false, deadline).await;
            if let Err(e) = write_outcomes(m, &outcomes, deadline).await {
                tracing::error!(error = %e, round = r.round, "could not write the fabric outcomes; the operator will time this node out");
            }
        }
    }
}

/// The outcomes of groups this node cannot join for want of a key: each names the key's error.
fn without_key(mine: &[Assignment], e: &KeyError) -> Vec<FabricOutcome> {
    tracing::error!(error = %e, groups = mine.len(), "fabric groups not joined: no rendezvous key");
    mine.iter()
        .map(|a| FabricOutcome {
            round: a.round,
            group: a.group,
            error: Some(super::rendezvous::local(e.to_string())),
            ..Default::default()
        })
        .collect()
}

/// The parts of rounds seen so far (a round too large for one object comes in several).
#[derive(Debug, Default)]
pub struct Parts {
    by_round: BTreeMap<(i32, bool), BTreeMap<i32, FabricRoundSpec>>,
}

impl Parts {
    pub fn add(&mut self, part: FabricRoundSpec) {
        self.by_round
            .entry((part.round, part.end))
            .or_default()
            .insert(part.shard, part);
    }

    /// Round `number` whole (its end marker first, which has one part), once every part of
    /// it is here.
    pub fn round(&self, number: i32) -> Option<FabricRoundSpec> {
        [true, false].into_iter().find_map(|end| {
            let parts: Vec<&FabricRoundSpec> =
                self.by_round.get(&(number, end))?.values().collect();
            gpuval_crds::fabric_shard::merge(&parts).ok()
        })
    }
}

/// This node's RDMA ports now (none when they cannot be read, which is logged).
fn read_ports_logged() -> Vec<super::ports::PortReading> {
    super::ports::read_ports(&super::ports::sysfs_root()).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "could not read the InfiniBand/RoCE ports");
        Vec::new()
    })
}

/// Reads the ports again and writes them, with what is wrong since the fabric test began, on
/// this node's result ([`labels::FABRIC_PORTS`]); nothing on a node without RDMA ports.
/// Findings are logged once, at the `end` of the test.
async fn write_ports(
    m: &Member<'_>,
    spec: &FabricSpec,
    before: &[super::ports::PortReading],
    end: bool,
    deadline: Instant,
) {
    let after = read_ports_logged();
    if before.is_empty() && after.is_empty() {
        return;
    }
    let findings = super::ports::judge(before, &after, spec.min_port_rate_gbps);
    if end {
        for f in &findings {
            tracing::warn!(device = %f.device, port = f.port, severity = ?f.severity, "{}", f.message);
        }
    }
    let report = super::ports::PortsReport {
        ports: after,
        findings,
    };
    let Ok(text) = serde_json::to_string(&report) else {
        return;
    };
    if let Err(e) = write_annotation(m, labels::FABRIC_PORTS, text, deadline).await {
        tracing::error!(error = %e, "could not write the InfiniBand/RoCE ports");
    }
}

/// Applies the outcomes annotation on this node's result.
async fn write_outcomes(
    m: &Member<'_>,
    outcomes: &[FabricOutcome],
    deadline: Instant,
) -> Result<(), kube::Error> {
    let text = serde_json::to_string(outcomes).map_err(kube::Error::SerdeError)?;
    write_annotation(m, labels::FABRIC_OUTCOMES, text, deadline).await
}

/// Applies one annotation on this node's result (each under its own field manager, so one
/// does not remove the other), tried again after transient errors for minutes, until the run's
/// `deadline` at the latest ([`crate::api_retry::retry_for_minutes`]).
async fn write_annotation(
    m: &Member<'_>,
    key: &str,
    text: String,
    deadline: Instant,
) -> Result<(), kube::Error> {
    let api: Api<GpuNodeResult> = Api::namespaced(m.client.clone(), m.namespace);
    let body = serde_json::json!({
        "apiVersion": GpuNodeResult::api_version(&()),
        "kind": GpuNodeResult::kind(&()),
        "metadata": {
            "name": m.result,
            "annotations": { key: text },
        },
    });
    let manager = if key == labels::FABRIC_OUTCOMES {
        format!("{}-fabric", m.field_manager)
    } else {
        format!("{}-fabric-ports", m.field_manager)
    };
    let pp = PatchParams::apply(&manager);
    let patch = Patch::Apply(&body);
    let what = if key == labels::FABRIC_OUTCOMES {
        "apply the fabric outcomes"
    } else {
        "apply the fabric ports"
    };
    let seed = crate::api_retry::seed_of(&m.result);
    crate::api_retry::retry_for_minutes(what, deadline, seed, || api.patch(&m.result, &pp, &patch))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::fabric::{FabricGroup, FabricKind};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn round() -> FabricRoundSpec {
        FabricRoundSpec {
            validation: "v".into(),
            generation: 3,
            round: 2,
            purpose: "pairs".into(),
            started: Time(Timestamp::from_second(1_790_000_000).unwrap()),
            timeout_seconds: 300,
            end: false,
            shard: 0,
            shards: 1,
            groups: vec![
                FabricGroup {
                    id: 1,
                    kind: FabricKind::Tcp,
                    nodes: vec!["a".into(), "c".into()],
                    rendezvous: "10.0.0.1:29402".into(),
                    gpus: vec![8, 8],
                    first: 0,
                    size: 0,
                    rail: None,
                },
                FabricGroup {
                    id: 0,
                    kind: FabricKind::Nccl,
                    nodes: vec!["b".into(), "c".into()],
                    rendezvous: "10.0.0.2:29400".into(),
                    gpus: vec![8, 8],
                    first: 0,
                    size: 0,
                    rail: None,
                },
            ],
        }
    }

    #[test]
    fn a_node_gets_its_groups_in_id_order_with_its_rank() {
        let deadline = Instant::now() + Duration::from_secs(3600);
        let now = Timestamp::from_second(1_790_000_010).unwrap();
        let a = assignments(&round(), "c", now, deadline);
        assert_eq!(a.len(), 2);
        assert_eq!((a[0].group, a[0].kind, a[0].rank), (0, FabricKind::Nccl, 1));
        assert_eq!((a[1].group, a[1].kind, a[1].rank), (1, FabricKind::Tcp, 1));
        assert_eq!(a[1].rendezvous, "10.0.0.1:29402");
        let left = a[0].deadline - Instant::now();
        assert!(
            left <= Duration::from_secs(290) && left > Duration::from_secs(280),
            "{left:?}"
        );
        assert!(assignments(&round(), "z", now, deadline).is_empty());
    }

    #[test]
    fn a_pod_without_a_key_ends_each_of_its_groups_as_its_own_error_naming_the_key() {
        let deadline = Instant::now() + Duration::from_secs(3600);
        let now = Timestamp::from_second(1_790_000_010).unwrap();
        let mine = assignments(&round(), "c", now, deadline);
        let out = without_key(&mine, &KeyError::NotGiven);
        assert_eq!(
            out.iter().map(|o| (o.round, o.group)).collect::<Vec<_>>(),
            vec![(2, 0), (2, 1)]
        );
        for o in &out {
            let e = o.error.as_ref().expect("an error");
            assert_eq!(e.kind, gpuval_crds::fabric::FabricErrorKind::Local, "{e:?}");
            assert!(e.message.contains("GPUVAL_FABRIC_KEY_FILE"), "{e:?}");
        }
    }

    #[test]
    fn the_run_deadline_caps_a_round() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let now = Timestamp::from_second(1_790_000_000).unwrap();
        let a = assignments(&round(), "a", now, deadline);
        assert_eq!(a[0].deadline, deadline);
    }

    #[test]
    fn a_round_in_parts_is_taken_once_every_part_is_here() {
        let whole = round();
        let parts = gpuval_crds::fabric_shard::shard(&whole, 150);
        assert!(parts.len() >= 2, "{parts:?}");
        let mut seen = Parts::default();
        for p in parts.iter().skip(1) {
            seen.add(p.clone());
        }
        assert_eq!(seen.round(2), None, "a part is missing");
        seen.add(parts[0].clone());
        let got = seen.round(2).expect("whole");
        assert_eq!(got.groups, whole.groups);
        let a = assignments(
            &got,
            "c",
            Timestamp::from_second(1_790_000_010).unwrap(),
            Instant::now() + Duration::from_secs(60),
        );
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn rounds_are_selected_by_validation_and_generation() {
        assert_eq!(
            selector("v", 3),
            "gpuval.io/validation=v,gpuval.io/generation=3"
        );
    }
}
