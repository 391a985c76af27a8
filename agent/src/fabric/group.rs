//! One group of a round, end to end: the rendezvous, then the kind's measurement, into this
//! member's [`FabricOutcome`].
//!
//! [`run_group`] is blocking (sockets with deadlines, and the [`NcclGroup`] trait is blocking):
//! call it on a thread of its own, or through [`run_round`], which runs a node's groups of one
//! round in `id` order on a blocking thread of the async runtime. Neither panics nor blocks past
//! the assignments' deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricErrorKind, FabricKind, FabricOutcome, FabricSpec};

use super::member_key::Auth;
use super::rendezvous::{self, JoinFailure, local};
use super::sim::VANISH_EXIT_CODE;
use super::{Assignment, NcclGroup, group_env, tcp};

/// The longest a host waits for its members, and members try to reach it.
pub const MAX_JOIN: Duration = Duration::from_secs(60);

/// When joining must be over: at most [`MAX_JOIN`] from now, leaving the measurement the time
/// it needs before the deadline (half the time left when it cannot have all it needs).
pub fn join_deadline(a: &Assignment, spec: &FabricSpec, now: Instant) -> Instant {
    let left = a.deadline.saturating_duration_since(now);
    let budget = match (a.kind, &spec.tcp) {
        (FabricKind::Tcp, Some(t)) => tcp::budget(t),
        _ => left / 2,
    };
    let by_budget = if budget < left {
        now + (left - budget)
    } else {
        now + left / 2
    };
    by_budget.min(now + MAX_JOIN)
}

/// Runs one group from this member's side (blocking); members prove `auth`'s key at the
/// rendezvous. When `nccl` carries the simulator's `netfault=vanish`, the process exits here
/// with [`VANISH_EXIT_CODE`] (test only).
pub fn run_group(
    a: &Assignment,
    spec: &FabricSpec,
    nccl: &dyn NcclGroup,
    auth: &Auth,
) -> FabricOutcome {
    if nccl.planted_vanish() {
        tracing::error!(
            round = a.round,
            group = a.group,
            "simulated netfault=vanish: the agent exits now (test-only fault)"
        );
        eprintln!("simulated netfault=vanish: exiting on the first fabric group (test only)");
        std::process::exit(VANISH_EXIT_CODE);
    }
    let mut outcome = FabricOutcome {
        round: a.round,
        group: a.group,
        simulated: a.kind == FabricKind::Nccl && nccl.simulated(),
        ..Default::default()
    };
    let start = Instant::now();
    if nccl.planted_nojoin() {
        // As a node that cannot reach the host: it tries until the join deadline.
        let by = join_deadline(a, spec, start);
        std::thread::sleep(by.saturating_duration_since(Instant::now()));
        outcome.error = Some(rendezvous::error_of(
            FabricErrorKind::NeverJoined,
            format!(
                "simulated: could not reach the rendezvous at {} (netfault=nojoin)",
                a.rendezvous
            ),
        ));
        outcome.join_seconds = start.elapsed().as_secs_f64();
        return outcome;
    }
    let mut joined = match rendezvous::join(a, auth, join_deadline(a, spec, start)) {
        Ok(g) => g,
        Err(JoinFailure {
            error,
            missing,
            join_seconds,
        }) => {
            outcome.error = Some(error);
            outcome.missing = missing;
            outcome.join_seconds = join_seconds;
            return outcome;
        }
    };
    outcome.join_seconds = joined.joined.join_seconds;
    let measured = Instant::now();
    match (a.kind, &spec.nccl, &spec.tcp) {
        (FabricKind::Nccl, Some(settings), _) => {
            match nccl.run(a, settings, &group_env(spec, a), &mut joined.link) {
                Ok(f) => {
                    outcome.bus_gbps = Some(f.bus_gbps);
                    outcome.seconds = f.seconds;
                }
                Err(e) => outcome.error = Some(e),
            }
        }
        (FabricKind::Tcp, _, Some(settings)) => match tcp::run(a, settings, &mut joined.link, auth)
        {
            Ok(f) => {
                outcome.send_gbps = Some(f.send_gbps);
                outcome.recv_gbps = Some(f.recv_gbps);
                outcome.latency_micros = Some(f.latency_micros);
                outcome.seconds = f.seconds;
            }
            Err(e) => outcome.error = Some(e),
        },
        (kind, _, _) => {
            outcome.error = Some(local(format!(
                "assigned a {} group, but the fabric settings have no {} section",
                kind.as_str(),
                kind.as_str().to_lowercase()
            )));
        }
    }
    if outcome.seconds == 0.0 {
        outcome.seconds = measured.elapsed().as_secs_f64();
    }
    outcome
}

/// Runs this node's groups of one round in `id` order (blocking).
pub fn run_round_blocking(
    mut assignments: Vec<Assignment>,
    spec: &FabricSpec,
    nccl: &dyn NcclGroup,
    auth: &Auth,
) -> Vec<FabricOutcome> {
    assignments.sort_by_key(|a| (a.round, a.group));
    assignments
        .iter()
        .map(|a| run_group(a, spec, nccl, auth))
        .collect()
}

/// [`run_round_blocking`] on a blocking thread of the async runtime. Should that thread be lost
/// (it cannot panic by design), every group reads as a `Local` error.
pub async fn run_round(
    assignments: Vec<Assignment>,
    spec: FabricSpec,
    nccl: Arc<dyn NcclGroup>,
    auth: Auth,
) -> Vec<FabricOutcome> {
    let ids: Vec<(i32, i32)> = assignments.iter().map(|a| (a.round, a.group)).collect();
    let task = tokio::task::spawn_blocking(move || {
        run_round_blocking(assignments, &spec, nccl.as_ref(), &auth)
    });
    match task.await {
        Ok(outcomes) => outcomes,
        Err(e) => ids
            .into_iter()
            .map(|(round, group)| FabricOutcome {
                round,
                group,
                error: Some(local(format!("the fabric group's thread was lost: {e}"))),
                ..Default::default()
            })
            .collect(),
    }
}
