//! The client against a fake kubelet: an HTTP/2 server on a Unix socket in a temp dir that
//! answers `List` as the kubelet does (a gRPC message, then `grpc-status` in the trailers).

use super::proto::encode;
use super::*;

/// Serves one connection on `socket`: answers every request with `status` (and `message`, a
/// gRPC message, when the status is 0). Returns when the client hangs up.
async fn fake_kubelet(listener: tokio::net::UnixListener, message: Vec<u8>, status: u32) {
    let Ok((stream, _)) = listener.accept().await else {
        return;
    };
    let Ok(mut conn) = h2::server::handshake(stream).await else {
        return;
    };
    while let Some(Ok((request, mut respond))) = conn.accept().await {
        assert_eq!(request.uri().path(), "/v1.PodResourcesLister/List");
        assert_eq!(request.headers()["content-type"], "application/grpc");
        let response = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .body(())
            .expect("a response");
        let Ok(mut send) = respond.send_response(response, false) else {
            return;
        };
        if status == 0 {
            let mut frame = vec![0u8];
            frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
            frame.extend_from_slice(&message);
            let _ = send.send_data(Bytes::from(frame), false);
        }
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", status.to_string().parse().expect("header"));
        trailers.insert("grpc-message", "nope".parse().expect("header"));
        let _ = send.send_trailers(trailers);
    }
}

/// `List` through the client against a fake kubelet answering `message` with `status`.
fn listed(message: Vec<u8>, status: u32) -> Result<Vec<HeldDevice>, PodResourcesError> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let socket = dir.path().join("kubelet.sock");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let listener = {
        let _guard = rt.enter();
        tokio::net::UnixListener::bind(&socket).expect("bind the socket")
    };
    rt.spawn(fake_kubelet(listener, message, status));
    PodResources {
        socket,
        own_pod: None,
    }
    .list()
}

#[test]
fn the_kubelet_names_the_pods_that_hold_each_gpu() {
    let message = encode::response(&[
        encode::pod(
            "ml",
            "trainer-0",
            "main",
            &[("nvidia.com/gpu", &["GPU-aaa"])],
        ),
        encode::pod(
            "ml",
            "notebook",
            "nb",
            &[("nvidia.com/gpu", &["GPU-BBB::3"])],
        ),
        encode::pod(
            "gpuval",
            "agent-n1",
            "agent",
            &[("nvidia.com/gpu", &["GPU-aaa", "GPU-bbb"])],
        ),
        encode::pod("legacy", "indexed", "c", &[("nvidia.com/gpu", &["2"])]),
    ]);
    let held = listed(message, 0).expect("the kubelet answers");
    assert_eq!(held.len(), 5);
    let own = Some("gpuval/agent-n1");
    assert_eq!(
        holders(&held, "GPU-aaa", 0, own),
        ["ml/trainer-0 (container main)"]
    );
    assert_eq!(
        holders(&held, "GPU-bbb", 1, own),
        ["ml/notebook (container nb)"]
    );
    assert_eq!(
        holders(&held, "GPU-ccc", 2, own),
        ["legacy/indexed (container c)"]
    );
    assert!(holders(&held, "GPU-ddd", 3, own).is_empty());
    assert_eq!(
        holders(&held, "GPU-aaa", 0, None).len(),
        2,
        "without an own pod, all"
    );
}

#[test]
fn a_grpc_error_and_a_missing_socket_say_what_is_wrong() {
    let e = listed(Vec::new(), 7).expect_err("PERMISSION_DENIED");
    assert_eq!(
        e.to_string(),
        "the kubelet's PodResources List call failed: gRPC status 7: nope"
    );
    let e = PodResources {
        socket: "/nonexistent/kubelet.sock".into(),
        own_pod: None,
    }
    .list()
    .expect_err("no socket");
    assert!(
        e.to_string().starts_with(
            "cannot connect to the kubelet's PodResources socket /nonexistent/kubelet.sock"
        ),
        "{e}"
    );
}

#[test]
fn a_grpc_frame_is_read_whole_or_refused() {
    assert_eq!(grpc_message(&[0, 0, 0, 0, 2, 8, 1]).expect("whole"), [8, 1]);
    assert!(grpc_message(&[0, 0, 0, 0, 3, 8, 1]).is_err());
    assert!(grpc_message(&[1, 0, 0, 0, 0]).is_err());
    assert!(grpc_message(&[0, 0]).is_err());
}
