//! Leader election on a `coordination.k8s.io/v1` Lease, so that several operator replicas can
//! run and exactly one writes.
//!
//! Every replica reads the Lease each retry period ([`crate::decide::leader`]). A follower takes the Lease
//! only once it has seen it unchanged for a whole lease duration (on its own monotonic clock);
//! the leader renews it each retry period. Every write of the Lease carries the
//! `resourceVersion` it read, so two replicas can never both succeed in taking it. The
//! leader's API client goes through a [`fence::Fence`] that it opens, on each successful
//! renewal, until the renew deadline after the renewal *began*: a leader that cannot renew
//! (cut off, paused, starved of CPU) stops writing by itself before any follower may take over.
//! The margin between the two (lease duration minus renew deadline) covers writes in flight.
//! See RELIABILITY.md.

pub mod fence;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;

use crate::decide::leader as decide;
pub use crate::decide::leader::{Decision, Timing};
pub use fence::{Fence, FenceLayer};

/// Who competes for which Lease, and how.
#[derive(Debug, Clone)]
pub struct Election {
    pub lease: String,
    pub namespace: String,
    /// This replica's name in the Lease (its pod name).
    pub identity: String,
    pub timing: Timing,
}

/// Why the elector stopped.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    #[error("lease {lease} is held by {holder} now")]
    Taken { lease: String, holder: String },
    #[error("lease {lease} was not renewed within the renew deadline ({deadline:?}): {why}")]
    NotRenewed {
        lease: String,
        deadline: Duration,
        why: String,
    },
}

/// What one round against the Lease gave.
enum Round {
    /// We hold the Lease: renewed (or taken) by a write that began at this instant.
    Held(Instant),
    /// Another replica holds it.
    Follower(String),
    /// The API could not be read or written this round.
    Failed(String),
}

/// Competes for the Lease until this replica leads and then keeps it, reporting on `leading`
/// (true once it leads) and opening `fence` after each successful renewal. Returns when the
/// lease is lost (the fence is closed by then); it never gives up while following.
pub async fn run(
    client: Client,
    election: Election,
    fence: Fence,
    leading: watch::Sender<bool>,
) -> Lost {
    let api: Api<Lease> = Api::namespaced(client, &election.namespace);
    let timing = election.timing;
    let mut seen: Option<decide::Observed> = None;
    let mut leader = false;
    loop {
        let round = round(&api, &election, &mut seen).await;
        // Why this round failed, where it did.
        let mut failed = None;
        match round {
            Round::Held(began) => {
                fence.open_until_instant(began + timing.renew_deadline);
                if !leader {
                    leader = true;
                    tracing::info!(identity = %election.identity, lease = %election.lease, "took the lease; leading");
                    let _ = leading.send(true);
                }
            }
            Round::Follower(holder) if leader => {
                fence.close();
                let _ = leading.send(false);
                return Lost::Taken {
                    lease: election.lease.clone(),
                    holder,
                };
            }
            Round::Follower(_) => {}
            Round::Failed(why) => {
                tracing::warn!(lease = %election.lease, error = %why, leader, "leader election round failed");
                failed = Some(why);
            }
        }
        if leader && !fence.is_open(Instant::now()) {
            // Not renewed in time: the round failed past the deadline, or it renewed too late
            // (the process was paused or starved) and what it wrote just now may overlap a
            // successor's start; either way it steps down.
            fence.close();
            let _ = leading.send(false);
            return Lost::NotRenewed {
                lease: election.lease.clone(),
                deadline: timing.renew_deadline,
                why: failed.unwrap_or_else(|| "the renewal came after the renew deadline".into()),
            };
        }
        tokio::time::sleep(timing.retry_period).await;
    }
}

/// Reads the Lease (creating it, held by us, when there is none) and renews or takes it when
/// [`decide::decide`] says so.
async fn round(api: &Api<Lease>, e: &Election, seen: &mut Option<decide::Observed>) -> Round {
    let began = Instant::now();
    let lease = match api.get_opt(&e.lease).await {
        Ok(Some(l)) => l,
        Ok(None) => {
            return match create(api, e).await {
                Ok(true) => Round::Held(began),
                Ok(false) => Round::Follower("another replica".into()),
                Err(why) => Round::Failed(why),
            };
        }
        Err(err) => return Round::Failed(format!("read lease {}: {err}", e.lease)),
    };
    let record = decide::Record::of(lease.spec.as_ref());
    let observed = decide::observe(seen.take(), record, began);
    let decision = decide::decide(&e.identity, &observed, began, &e.timing);
    *seen = Some(observed.clone());
    let version = lease.metadata.resource_version.unwrap_or_default();
    let outcome = match &decision {
        Decision::Wait { holder, .. } => return Round::Follower(holder.clone()),
        Decision::Renew => write(api, e, &version, renewal(e)).await,
        Decision::Acquire => {
            let transitions = observed.record.transitions + 1;
            write(api, e, &version, acquisition(e, transitions)).await
        }
    };
    match outcome {
        Ok(()) => Round::Held(began),
        // Someone else wrote the Lease since we read it: read again next round.
        Err(Write::Conflict) => Round::Follower(
            observed
                .record
                .holder
                .filter(|h| h != &e.identity)
                .unwrap_or_else(|| "another replica".into()),
        ),
        Err(Write::Failed(why)) => Round::Failed(why),
    }
}

/// The spec fields of a renewal.
fn renewal(e: &Election) -> serde_json::Value {
    json!({
        "holderIdentity": e.identity,
        "renewTime": MicroTime(Timestamp::now()),
        "leaseDurationSeconds": lease_seconds(&e.timing),
    })
}

/// The spec fields of taking the Lease over.
fn acquisition(e: &Election, transitions: i32) -> serde_json::Value {
    let now = MicroTime(Timestamp::now());
    json!({
        "holderIdentity": e.identity,
        "acquireTime": now,
        "renewTime": now,
        "leaseDurationSeconds": lease_seconds(&e.timing),
        "leaseTransitions": transitions,
    })
}

fn lease_seconds(t: &Timing) -> i32 {
    i32::try_from(t.lease_duration.as_secs()).unwrap_or(i32::MAX)
}

enum Write {
    Conflict,
    Failed(String),
}

/// Merge-patches the Lease's spec, on the condition that it is still at `version` (the API
/// server answers 409 otherwise).
async fn write(
    api: &Api<Lease>,
    e: &Election,
    version: &str,
    spec: serde_json::Value,
) -> Result<(), Write> {
    let body = json!({"metadata": {"resourceVersion": version}, "spec": spec});
    match api
        .patch(&e.lease, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Write::Conflict),
        Err(err) => Err(Write::Failed(format!("write lease {}: {err}", e.lease))),
    }
}

/// Creates the Lease held by us; false when another replica created it first.
async fn create(api: &Api<Lease>, e: &Election) -> Result<bool, String> {
    let now = MicroTime(Timestamp::now());
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(e.lease.clone()),
            namespace: Some(e.namespace.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(e.identity.clone()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_duration_seconds: Some(lease_seconds(&e.timing)),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    };
    match api.create(&PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(err) => Err(format!("create lease {}: {err}", e.lease)),
    }
}

/// Hands the Lease back (after the controller has stopped and the fence is closed), so that a
/// follower takes over at once instead of after a lease duration. Best effort.
pub async fn release(client: Client, e: &Election) {
    let api: Api<Lease> = Api::namespaced(client, &e.namespace);
    let Ok(Some(lease)) = api.get_opt(&e.lease).await else {
        return;
    };
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref());
    if holder != Some(e.identity.as_str()) {
        return;
    }
    let version = lease.metadata.resource_version.unwrap_or_default();
    let spec = json!({"holderIdentity": null, "renewTime": null, "acquireTime": null});
    match write(&api, e, &version, spec).await {
        Ok(()) => tracing::info!(lease = %e.lease, "lease released"),
        Err(Write::Conflict) => {}
        Err(Write::Failed(why)) => {
            tracing::warn!(lease = %e.lease, error = %why, "could not release the lease")
        }
    }
}
