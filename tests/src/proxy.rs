//! A TCP proxy in front of the API server that a test can cut and restore: a partition between
//! some clients (the agents) and the API server while everything else still reaches it.
//!
//! Bytes pass through untouched (TLS included). [`Proxy::cut`] drops every open connection and
//! closes each new one at once, as a network that refuses the way; [`Proxy::restore`] lets
//! connections through again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

#[derive(Default)]
struct State {
    cut: AtomicBool,
    open: Mutex<Vec<AbortHandle>>,
    refused: AtomicUsize,
    passed: AtomicUsize,
}

impl State {
    fn open(&self) -> std::sync::MutexGuard<'_, Vec<AbortHandle>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running proxy; dropping it stops it and every connection through it.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let accept = tokio::spawn(accept_loop(listener, upstream, state.clone()));
        Ok(Proxy {
            addr,
            state,
            accept,
        })
    }

    /// `https://127.0.0.1:<port>`, the server address for a kubeconfig.
    pub fn server(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Drops every open connection and refuses new ones until [`restore`](Self::restore).
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        for conn in self.state.open().drain(..) {
            conn.abort();
        }
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// Connections refused while cut.
    pub fn refused(&self) -> usize {
        self.state.refused.load(Ordering::SeqCst)
    }

    /// Connections let through.
    pub fn passed(&self) -> usize {
        self.state.passed.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for conn in self.state.open().drain(..) {
            conn.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, state: Arc<State>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if state.cut.load(Ordering::SeqCst) {
            state.refused.fetch_add(1, Ordering::SeqCst);
            drop(client);
            continue;
        }
        state.passed.fetch_add(1, Ordering::SeqCst);
        let conn = tokio::spawn(pipe(client, upstream));
        let mut open = state.open();
        open.retain(|c| !c.is_finished());
        open.push(conn.abort_handle());
    }
}

/// Copies both ways until either side closes (or the task is aborted by a cut).
async fn pipe(mut client: TcpStream, upstream: SocketAddr) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr) -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"ping").await?;
        let mut buf = vec![0u8; 4];
        s.read_exact(&mut buf).await?;
        Ok(buf)
    }

    #[tokio::test]
    async fn bytes_pass_until_cut_and_again_after_restore() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let addr = proxy.addr;
        assert_eq!(round_trip(addr).await.unwrap(), b"ping");

        let mut open = TcpStream::connect(addr).await.unwrap();
        open.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        open.read_exact(&mut one).await.unwrap();
        proxy.cut();
        let mut rest = [0u8; 1];
        let after_cut = open.read(&mut rest).await;
        assert!(
            matches!(after_cut, Ok(0) | Err(_)),
            "an open connection is dropped by the cut"
        );
        assert!(
            round_trip(addr).await.is_err(),
            "new connections are refused"
        );
        assert!(proxy.refused() >= 1);

        proxy.restore();
        assert_eq!(round_trip(addr).await.unwrap(), b"ping");
        assert!(proxy.passed() >= 3);
    }
}
