//! The kubelet's PodResources API as the fake kubelet serves it: gRPC `List` on a Unix socket
//! (HTTP/2, one length-prefixed protobuf message, then `grpc-status` in the trailers), naming
//! which pod holds which device as a node's device plugins allocated them. The agent reads it
//! through the same socket it reads on a real node; the test says who holds what.
//!
//! ```text
//! ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
//! PodResources            { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
//! ContainerResources      { string name = 1; repeated ContainerDevices devices = 2; }
//! ContainerDevices        { string resource_name = 1; repeated string device_ids = 2; }
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

/// The gRPC method the agent calls.
pub const LIST: &str = "/v1.PodResourcesLister/List";
/// gRPC's UNIMPLEMENTED, for any other method.
const UNIMPLEMENTED: u32 = 12;

/// Devices one container of a pod holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The device plugin's resource (`nvidia.com/gpu`).
    pub resource: String,
    /// Its device ids (GPU UUIDs for NVIDIA's plugin).
    pub device_ids: Vec<String>,
}

impl Held {
    /// Container `main` of pod `namespace/pod` holding the GPUs `uuids` (`nvidia.com/gpu`).
    pub fn gpus(namespace: &str, pod: &str, uuids: &[String]) -> Held {
        Held {
            namespace: namespace.into(),
            pod: pod.into(),
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            device_ids: uuids.to_vec(),
        }
    }
}

/// A PodResources server on one socket; stops when dropped.
pub struct PodResourcesServer {
    socket: PathBuf,
    held: Arc<Mutex<Vec<Held>>>,
    task: JoinHandle<()>,
}

impl PodResourcesServer {
    /// Listens on `socket` (must be called inside a tokio runtime), answering that nothing is
    /// held until [`PodResourcesServer::set`].
    pub fn start(socket: &Path) -> std::io::Result<PodResourcesServer> {
        let listener = UnixListener::bind(socket)?;
        let held = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(serve(listener, held.clone()));
        Ok(PodResourcesServer {
            socket: socket.to_path_buf(),
            held,
            task,
        })
    }

    /// What every later `List` answers.
    pub fn set(&self, held: Vec<Held>) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = held;
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for PodResourcesServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: UnixListener, held: Arc<Mutex<Vec<Held>>>) {
    while let Ok((stream, _)) = listener.accept().await {
        let held = held.clone();
        tokio::spawn(async move {
            let Ok(mut conn) = h2::server::handshake(stream).await else {
                return;
            };
            while let Some(Ok((request, respond))) = conn.accept().await {
                let answer = (request.uri().path() == LIST).then(|| {
                    let now = held.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    response(&now)
                });
                answer_one(respond, answer);
            }
        });
    }
}

/// Answers one call: the message and status 0, or UNIMPLEMENTED without one.
fn answer_one(mut respond: h2::server::SendResponse<Bytes>, message: Option<Vec<u8>>) {
    let Ok(head) = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
    else {
        return;
    };
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let status = match &message {
        Some(m) => {
            let mut frame = vec![0u8];
            frame.extend_from_slice(&u32::try_from(m.len()).unwrap_or(u32::MAX).to_be_bytes());
            frame.extend_from_slice(m);
            let _ = send.send_data(Bytes::from(frame), false);
            0
        }
        None => UNIMPLEMENTED,
    };
    let mut trailers = http::HeaderMap::new();
    if let Ok(v) = status.to_string().parse() {
        trailers.insert("grpc-status", v);
    }
    let _ = send.send_trailers(trailers);
}

/// The `ListPodResourcesResponse` naming `held`.
pub fn response(held: &[Held]) -> Vec<u8> {
    let mut out = Vec::new();
    for h in held {
        let mut device = Vec::new();
        field(1, h.resource.as_bytes(), &mut device);
        for id in &h.device_ids {
            field(2, id.as_bytes(), &mut device);
        }
        let mut container = Vec::new();
        field(1, h.container.as_bytes(), &mut container);
        field(2, &device, &mut container);
        let mut pod = Vec::new();
        field(1, h.pod.as_bytes(), &mut pod);
        field(2, h.namespace.as_bytes(), &mut pod);
        field(3, &container, &mut pod);
        field(1, &pod, &mut out);
    }
    out
}

/// A length-delimited field (wire type 2).
fn field(number: u64, body: &[u8], out: &mut Vec<u8>) {
    varint(number << 3 | 2, out);
    varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_the_kubelet_s_wire_format() {
        let held = [Held::gpus("ml", "p", &["G".to_string()])];
        // pod_resources { name "p" namespace "ml" containers { name "main"
        //   devices { resource_name "nvidia.com/gpu" device_ids "G" } } }
        let device = [&[0x0a, 14][..], b"nvidia.com/gpu", &[0x12, 1], b"G"].concat();
        let container = [
            &[0x0a, 4][..],
            b"main",
            &[0x12, device.len() as u8],
            &device,
        ]
        .concat();
        let pod = [
            &[0x0a, 1][..],
            b"p",
            &[0x12, 2],
            b"ml",
            &[0x1a, container.len() as u8],
            &container,
        ]
        .concat();
        let want = [&[0x0a, pod.len() as u8][..], &pod].concat();
        assert_eq!(response(&held), want);
        assert!(response(&[]).is_empty());
    }
}
