//! Which pod holds a GPU, from the kubelet's PodResources API (`List` on its Unix socket,
//! gRPC): what the agent adds to a busy GPU's finding where the administrator mounted the
//! socket (Helm `agent.podResources`, off by default: it needs a hostPath, which Pod Security
//! `restricted` refuses). The kubelet lists each container's devices by its device plugin's
//! resource name and id: the NVIDIA device plugin names a GPU by its UUID (`GPU-…`, with `::N`
//! for a time-sliced replica) or, with its index strategy, by its index.

pub mod proto;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;

pub use proto::HeldDevice;

/// Where the kubelet serves the API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The longest a `List` may take (connection included).
const TIMEOUT: Duration = Duration::from_secs(5);
/// The call's path (service `v1.PodResourcesLister`, method `List`).
const LIST: &str = "http://localhost/v1.PodResourcesLister/List";

/// Why the kubelet could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error(
        "cannot connect to the kubelet's PodResources socket {path}: {source} (is \
         /var/lib/kubelet/pod-resources mounted, and may the agent's user open the socket?)"
    )]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the kubelet's PodResources List call failed: {0}")]
    Call(String),
    #[error("the kubelet did not answer PodResources List within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Decode(#[from] proto::DecodeError),
}

fn call(e: impl std::fmt::Display) -> PodResourcesError {
    PodResourcesError::Call(e.to_string())
}

/// The kubelet's PodResources API, and the agent's own pod (left out of the holders).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodResources {
    pub socket: PathBuf,
    /// `namespace/name` of the agent's own pod, where it runs in one.
    pub own_pod: Option<String>,
}

impl PodResources {
    /// Every device every container holds now. Blocking: the call runs on a thread of its own
    /// with its own runtime, so it may be made from any thread, async or not.
    pub fn list(&self) -> Result<Vec<HeldDevice>, PodResourcesError> {
        let socket = self.socket.clone();
        let asked = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(call)?;
            rt.block_on(async {
                tokio::time::timeout(TIMEOUT, list_raw(&socket))
                    .await
                    .map_err(|_| PodResourcesError::Timeout(TIMEOUT))?
            })
        });
        let raw = asked
            .join()
            .map_err(|_| call("the PodResources thread panicked"))??;
        Ok(proto::held_devices(&raw)?)
    }
}

/// The pods (other than `own_pod`, `namespace/name`) that hold the GPU with this UUID and
/// index: `ml/trainer-0 (container main)`.
pub fn holders(held: &[HeldDevice], uuid: &str, index: u32, own_pod: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = held
        .iter()
        .filter(|h| names_gpu(h, uuid, index))
        .filter(|h| own_pod != Some(format!("{}/{}", h.namespace, h.pod).as_str()))
        .map(|h| format!("{}/{} (container {})", h.namespace, h.pod, h.container))
        .collect();
    out.dedup();
    out
}

/// True when the device plugin's id names this GPU: its UUID, one of its time-sliced replicas
/// (`UUID::N`), or (a plugin with the index strategy) its index under a GPU resource.
fn names_gpu(h: &HeldDevice, uuid: &str, index: u32) -> bool {
    let id = h.device_id.as_str();
    let base = id.split("::").next().unwrap_or(id);
    base.eq_ignore_ascii_case(uuid) || (h.resource.ends_with("/gpu") && id == index.to_string())
}

/// The raw `ListPodResourcesResponse` from the kubelet.
async fn list_raw(socket: &Path) -> Result<Vec<u8>, PodResourcesError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| PodResourcesError::Connect {
            path: socket.to_path_buf(),
            source,
        })?;
    let (client, connection) = h2::client::handshake(stream).await.map_err(call)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "PodResources connection ended");
        }
    });
    let mut client = client.ready().await.map_err(call)?;
    let request = http::Request::builder()
        .method("POST")
        .uri(LIST)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(call)?;
    let (answer, mut send) = client.send_request(request, false).map_err(call)?;
    // One gRPC message: not compressed, 0 bytes (ListPodResourcesRequest has no field).
    send.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .map_err(call)?;
    let answer = answer.await.map_err(call)?;
    if answer.status() != http::StatusCode::OK {
        return Err(call(format!("HTTP status {}", answer.status())));
    }
    let status_in_headers = grpc_status(answer.headers());
    let mut body = answer.into_body();
    let mut raw = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(call)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        raw.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.map_err(call)?;
    match trailers
        .as_ref()
        .and_then(grpc_status)
        .or(status_in_headers)
    {
        Some((0, _)) => grpc_message(&raw),
        Some((code, message)) => Err(call(format!("gRPC status {code}: {message}"))),
        None => Err(call("the answer carried no gRPC status")),
    }
}

/// `grpc-status` and `grpc-message`, where the map has them.
fn grpc_status(h: &http::HeaderMap) -> Option<(u32, String)> {
    let code = h.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = h
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("")
        .to_string();
    Some((code, message))
}

/// The one message of a gRPC answer's body (flag byte, 4-byte big-endian length, bytes).
fn grpc_message(body: &[u8]) -> Result<Vec<u8>, PodResourcesError> {
    let [flag, a, b, c, d, rest @ ..] = body else {
        return Err(call("an answer shorter than its gRPC frame header"));
    };
    if *flag != 0 {
        return Err(call("a compressed answer (none was asked for)"));
    }
    let len = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
    rest.get(..len)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| call("an answer shorter than its gRPC message"))
}

#[cfg(test)]
mod tests;
