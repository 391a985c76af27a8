//! What the operator's shell stands on: the context every reconcile reads ([`Ctx`]: the client,
//! the configuration, the stores and the write throttle), the shell's errors and the field
//! manager of everything it writes. The controllers ([`crate::wiring`],
//! [`crate::controllers::node_state`], [`crate::schedule`], [`crate::controllers::admission`]) and the modules that write
//! ([`crate::write::apply`] and the others) all stand on it; it names none of them.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use gpuval_crds::{GpuFabricRound, GpuNodeResult, GpuValidation};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Client;
use kube::api::PartialObjectMeta;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use crate::caches::pod_views::PodViews;
use crate::caches::runs::Runs;
use crate::decide::reconcile::allocation::{self, DraInventory};
use crate::decide::selection;
use crate::services::metrics::Metrics;
use crate::services::throttle::Throttle;
use crate::settings::config::OperatorConfig;

/// The field manager of everything the operator writes.
pub const FIELD_MANAGER: &str = "gpuval-operator";
/// The cause an error carries where another error caused it.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why a reconcile failed. Each variant keeps what caused it (`source()`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("serialising status: {0}")]
    Serde(#[from] serde_json::Error),
    /// The rendezvous key could not be made, or an earlier validation's stood in its place (it
    /// was deleted: the next try makes it).
    #[error("the fabric rendezvous key: {0}")]
    FabricKey(String),
    /// The API server refused the validation's claim template: only a change of
    /// `spec.dra.selector` (or the device class) lifts it.
    #[error("the DRA claim template: {note}")]
    ClaimTemplate {
        note: String,
        #[source]
        source: kube::Error,
    },
    /// A certificate could not be signed or stored: the key, its Secret, the signing.
    #[error("certificates: {what}")]
    Certificate {
        what: String,
        #[source]
        source: Option<Cause>,
    },
}

impl Error {
    /// A certificate error saying `what`, caused by `source`.
    pub fn certificate(what: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Certificate {
            what: what.into(),
            source: Some(source.into()),
        }
    }

    /// True for an error another try may not meet: throttling (429), a conflict (409), a list
    /// whose continue token expired (410), server trouble (5xx), a timeout (408), a lost
    /// connection, a fabric key made again on the next try. A refusal (400, 403, 404, 422), a
    /// claim template the API server refused, a key that cannot sign, a status that does not
    /// serialize is final: the same try meets it again until something changes.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Kube(kube::Error::Api(s)) => {
                matches!(s.code, 408 | 409 | 410 | 429 | 500..=599)
            }
            Error::Kube(
                kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_),
            ) => true,
            Error::FabricKey(_) => true,
            Error::Kube(_) | Error::Serde(_) | Error::ClaimTemplate { .. } => false,
            Error::Certificate { .. } => false,
        }
    }

    /// The `error` label of the reconcile-errors metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "client",
            Error::Serde(_) => "serde",
            Error::FabricKey(_) => "fabric_key",
            Error::ClaimTemplate { .. } => "claim_template",
            Error::Certificate { .. } => "certificate",
        }
    }
}

/// What every reconcile needs.
pub struct Ctx {
    pub client: Client,
    pub cfg: OperatorConfig,
    pub pods: Arc<PodViews>,
    pub results: Store<PartialObjectMeta<GpuNodeResult>>,
    pub nodes: Store<Node>,
    /// The ResourceSlices of the DRA driver (`--dra-driver`), trimmed to their GPUs' names and
    /// UUIDs; empty when `--gpu-allocation extendedResource`.
    pub slices: Store<ResourceSlice>,
    /// True once the slices are known (listed, or given up on: see `wiring::settle_slices`); no
    /// node set is resolved before, so a DRA node is not left out for want of its slices.
    pub slices_settled: Arc<AtomicBool>,
    /// True once the pod, result, Node and round stores are filled (the operator's readiness):
    /// no node set is resolved before, so a run never starts against an empty Node cache.
    pub stores_filled: Arc<AtomicBool>,
    pub rounds: Store<GpuFabricRound>,
    pub validations: Store<GpuValidation>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Each run's record and what changed since its last reconcile, by validation uid.
    pub runs: Arc<Runs>,
    /// The rate limit of API writes (`--api-qps`, `--api-burst`).
    pub throttle: Throttle,
    /// Where each ended run's certificates stand (written, given up, or when to try again).
    pub certificates: crate::services::certificate_retry::Ledger,
}

/// The GPUs of the DRA driver per node, from the slices the operator holds.
pub fn dra_inventory(ctx: &Ctx) -> DraInventory {
    let slices = ctx.slices.state();
    DraInventory::from_slices(&ctx.cfg.allocation.driver, slices.iter().map(|s| &**s))
}

/// Selects `spec`'s nodes, each counted with the GPUs its allocation mode offers.
pub fn select_nodes(
    spec: &gpuval_crds::GpuValidationSpec,
    nodes: &[Node],
    ctx: &Ctx,
) -> selection::Selection {
    let allocation = &ctx.cfg.allocation;
    let inventory = dra_inventory(ctx);
    let gpus_of = |n: &Node| {
        let name = n.metadata.name.as_deref().unwrap_or_default();
        allocation::decide(allocation, name, &inventory).gpus(n)
    };
    selection::select_with(
        spec,
        nodes,
        &gpus_of,
        &allocation::no_gpus_reason(allocation),
    )
}
