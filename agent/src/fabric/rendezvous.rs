//! The group join. The group's first node (the host) listens on the rendezvous port on every
//! address and accepts; the other members connect (retrying with backoff: the host may still be
//! busy with an earlier group), read the host's [`Challenge`], say hello in one JSON line with
//! a MAC over the challenge and the hello under the validation's key ([`member_key`]), and wait
//! for the host's answer: `go` once every member has joined, or `abort` at the join deadline
//! naming the members that never came. After `go` the connections stay open as the group's
//! control channel ([`Control`]).
//!
//! The host greets each connection on a thread of its own with its own short deadline
//! ([`HELLO_WAIT`]): a stranger that connects and says nothing, or says something wrong, is
//! refused (and logged) without holding up the members.
//!
//! Everything here is blocking with deadlines: no call waits past the deadline it is given.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricError, FabricErrorKind};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::Assignment;
use super::member_key::{self, Auth, HelloId};

/// The longest a control message line may be (a hello, a figure, a 64-byte ping).
const MAX_LINE: usize = 64 * 1024;
/// The longest a host waits for an accepted connection's hello (each connection on its own).
pub const HELLO_WAIT: Duration = Duration::from_secs(5);
/// The most connections a host greets at once: more (a flood) are closed unread.
const MAX_GREETING: usize = 64;
/// Backoff between connection attempts of a member: first and largest.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// A network step that failed: where, and what.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NetError {
    #[error("{what} {addr}: timed out")]
    Timeout { what: String, addr: String },
    #[error("{what} {addr}: {why}")]
    Io {
        what: String,
        addr: String,
        why: String,
    },
    #[error("{what} {addr}: the other side closed the connection")]
    Closed { what: String, addr: String },
    #[error("{what} {addr}: unexpected message: {why}")]
    Protocol {
        what: String,
        addr: String,
        why: String,
    },
}

impl NetError {
    /// An I/O error of `what` with `addr` (a timeout reads as [`NetError::Timeout`]).
    pub fn io(what: &str, addr: &str, e: &std::io::Error) -> Self {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            return NetError::Timeout {
                what: what.into(),
                addr: addr.into(),
            };
        }
        NetError::Io {
            what: what.into(),
            addr: addr.into(),
            why: e.to_string(),
        }
    }
}

/// What remains until `deadline`, or a timeout error naming the step.
pub fn remaining(deadline: Instant, what: &str, addr: &str) -> Result<Duration, NetError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left < Duration::from_millis(1) {
        return Err(NetError::Timeout {
            what: what.into(),
            addr: addr.into(),
        });
    }
    Ok(left)
}

/// Waits until `listener` has a connection to accept, or `deadline` (false).
pub fn wait_acceptable(listener: &TcpListener, deadline: Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `pfd` is one valid pollfd that outlives the call, and the count passed is 1.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            return true;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// Accepts one connection before `deadline` (None when none came).
pub fn accept_until(listener: &TcpListener, deadline: Instant) -> Option<(TcpStream, SocketAddr)> {
    while wait_acceptable(listener, deadline) {
        if let Ok((s, peer)) = listener.accept() {
            return Some((s, peer));
        }
    }
    None
}

/// Binds every address (`0.0.0.0:port`, or `[::]:port` for an IPv6 rendezvous) on the port of a
/// `host:port` address (SO_REUSEADDR is set by the standard library on Unix, so a port of an
/// earlier round can be bound again at once).
pub fn listen_on(rendezvous: &str) -> Result<TcpListener, NetError> {
    let port = port_of(rendezvous)?;
    let addr = if rendezvous.starts_with('[') {
        format!("[::]:{port}")
    } else {
        format!("0.0.0.0:{port}")
    };
    TcpListener::bind(&addr).map_err(|e| NetError::io("listen on", &addr, &e))
}

fn port_of(rendezvous: &str) -> Result<u16, NetError> {
    rendezvous
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .ok_or_else(|| NetError::Protocol {
            what: "read the rendezvous address".into(),
            addr: rendezvous.into(),
            why: "expected host:port".into(),
        })
}

/// Connects to `addr`, retrying with backoff until `deadline`.
pub fn connect_until(addr: &str, what: &str, deadline: Instant) -> Result<TcpStream, NetError> {
    let mut backoff = BACKOFF_FIRST;
    let mut last = NetError::Timeout {
        what: what.into(),
        addr: addr.into(),
    };
    loop {
        let left = remaining(deadline, what, addr).map_err(|_| last.clone())?;
        let targets: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| NetError::io(what, addr, &e))?
            .collect();
        for target in &targets {
            match TcpStream::connect_timeout(target, left.min(Duration::from_secs(2))) {
                Ok(s) => return Ok(s),
                Err(e) => last = NetError::io(what, addr, &e),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        // Nothing to wait on: the host may not listen yet, and says nothing until it does.
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One end of a control connection: JSON lines each way, every call with a deadline.
#[derive(Debug)]
pub struct Control {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// The other side, for messages.
    pub peer: String,
}

impl Control {
    pub fn new(stream: TcpStream, peer: String) -> Result<Self, NetError> {
        stream
            .set_nodelay(true)
            .map_err(|e| NetError::io("set TCP_NODELAY on", &peer, &e))?;
        let writer = stream
            .try_clone()
            .map_err(|e| NetError::io("clone the connection to", &peer, &e))?;
        Ok(Self {
            reader: BufReader::new(stream),
            writer,
            peer,
        })
    }

    /// Sends one message (one JSON line).
    pub fn send<T: Serialize>(&mut self, msg: &T, deadline: Instant) -> Result<(), NetError> {
        let mut line = serde_json::to_vec(msg).map_err(|e| NetError::Protocol {
            what: "encode a message for".into(),
            addr: self.peer.clone(),
            why: e.to_string(),
        })?;
        line.push(b'\n');
        self.send_raw(&line, deadline)
    }

    /// Sends bytes as they are (a ping of a fixed size).
    pub fn send_raw(&mut self, bytes: &[u8], deadline: Instant) -> Result<(), NetError> {
        let what = "send to";
        let left = remaining(deadline, what, &self.peer)?;
        self.writer
            .set_write_timeout(Some(left))
            .map_err(|e| NetError::io(what, &self.peer, &e))?;
        self.writer
            .write_all(bytes)
            .map_err(|e| NetError::io(what, &self.peer, &e))
    }

    /// Receives one line (without its newline), waiting at most until `deadline`.
    pub fn recv_line(&mut self, deadline: Instant) -> Result<Vec<u8>, NetError> {
        let what = "receive from";
        let mut line = Vec::new();
        loop {
            let left = remaining(deadline, what, &self.peer)?;
            self.reader
                .get_ref()
                .set_read_timeout(Some(left))
                .map_err(|e| NetError::io(what, &self.peer, &e))?;
            let buf = match self.reader.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(NetError::io(what, &self.peer, &e)),
            };
            if buf.is_empty() {
                return Err(NetError::Closed {
                    what: what.into(),
                    addr: self.peer.clone(),
                });
            }
            let (used, done) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => {
                    line.extend_from_slice(&buf[..i]);
                    (i + 1, true)
                }
                None => {
                    line.extend_from_slice(buf);
                    (buf.len(), false)
                }
            };
            self.reader.consume(used);
            if done {
                return Ok(line);
            }
            if line.len() > MAX_LINE {
                return Err(self.protocol(format!("a line over {MAX_LINE} bytes")));
            }
        }
    }

    /// Receives one message.
    pub fn recv<T: DeserializeOwned>(&mut self, deadline: Instant) -> Result<T, NetError> {
        let line = self.recv_line(deadline)?;
        serde_json::from_slice(&line).map_err(|e| {
            self.protocol(format!(
                "{e} in {:?}",
                String::from_utf8_lossy(&line[..line.len().min(120)])
            ))
        })
    }

    /// A protocol error naming this connection's peer.
    pub fn protocol(&self, why: String) -> NetError {
        NetError::Protocol {
            what: "talk to".into(),
            addr: self.peer.clone(),
            why,
        }
    }

    /// The connection's stream, for the data phase of a measurement (bytes already buffered
    /// stay with the control reader).
    pub fn into_parts(self) -> (BufReader<TcpStream>, TcpStream) {
        (self.reader, self.writer)
    }

    /// A second handle on this connection, to send from another thread while this one reads.
    pub fn sender(&self) -> Result<Sender, NetError> {
        let stream = self
            .writer
            .try_clone()
            .map_err(|e| NetError::io("clone the connection to", &self.peer, &e))?;
        Ok(Sender {
            inner: Control {
                reader: BufReader::new(
                    stream
                        .try_clone()
                        .map_err(|e| NetError::io("clone the connection to", &self.peer, &e))?,
                ),
                writer: stream,
                peer: self.peer.clone(),
            },
        })
    }
}

/// The sending side of a [`Control`], for another thread.
#[derive(Debug)]
pub struct Sender {
    inner: Control,
}

impl Sender {
    /// Sends one message (one JSON line).
    pub fn send<T: Serialize>(&mut self, msg: &T, deadline: Instant) -> Result<(), NetError> {
        self.inner.send(msg, deadline)
    }

    /// Ends reading on the connection: a thread blocked reading it sees its end at once.
    pub fn stop_reading(&self) {
        // Already shut or closed by the peer: nothing left to wake.
        let _ = self.inner.writer.shutdown(std::net::Shutdown::Read);
    }
}

/// The first line a connection to a rendezvous sends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum Greeting {
    /// A member joining the group.
    Hello {
        node: String,
        rank: usize,
        round: i32,
        group: i32,
        /// HMAC-SHA256 (hex), under the validation's key, of the host's challenge and the
        /// fields above ([`member_key`]); absent where the member has no key.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mac: Option<String>,
    },
    /// A data connection of a measurement (TCP streams), numbered from 0.
    Data {
        node: String,
        round: i32,
        group: i32,
        stream: usize,
    },
}

/// The first line the host sends on every connection of its rendezvous: fresh random bytes
/// (hex) the member's MAC must cover, so that a MAC seen once is worthless on the next one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Challenge {
    pub challenge: String,
}

/// The host's answer to a hello.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum Answer {
    /// Every member joined.
    Go,
    /// The join deadline passed: these members never came.
    Abort { missing: Vec<String> },
    /// The hello was not for this group (another round or group, or a wrong rank), or did not
    /// prove the validation's key.
    Reject { why: String },
}

/// A joined group: the control channel(s), and how long joining took.
#[derive(Debug)]
pub struct Group {
    pub joined: super::Joined,
    pub link: Link,
}

/// The control channel of a joined group.
#[derive(Debug)]
pub enum Link {
    /// This node hosts: its listener (kept for data connections) and one control connection
    /// per other member, in rank order (rank 1 first).
    Host {
        listener: TcpListener,
        members: Vec<Control>,
    },
    /// This node is a member: its connection to the host.
    Member { host: Control },
}

/// Why a join failed, and the host's list of absentees (empty on members).
#[derive(Debug, Clone, PartialEq)]
pub struct JoinFailure {
    pub error: FabricError,
    pub missing: Vec<String>,
    pub join_seconds: f64,
}

fn fabric_error(kind: FabricErrorKind, message: String) -> FabricError {
    let message = gpuval_crds::text::shorten(&message, 300);
    FabricError { kind, message }
}

/// A member's error (kept to the API's 300 characters).
pub fn local(message: String) -> FabricError {
    fabric_error(FabricErrorKind::Local, message)
}
/// An error that may be another member's fault.
pub fn peer(message: String) -> FabricError {
    fabric_error(FabricErrorKind::Peer, message)
}

/// Joins `a`'s group: hosts it (rank 0) or connects to its host, until `join_deadline`
/// (members wait for the host's answer until `a.deadline`). Members prove they hold `auth`'s
/// key; the host admits only those who do.
pub fn join(a: &Assignment, auth: &Auth, join_deadline: Instant) -> Result<Group, JoinFailure> {
    let start = Instant::now();
    let fail = |error: FabricError, missing: Vec<String>| JoinFailure {
        error,
        missing,
        join_seconds: start.elapsed().as_secs_f64(),
    };
    if a.rank >= a.nodes.len() {
        let why = format!("rank {} is outside the group of {}", a.rank, a.nodes.len());
        return Err(fail(local(why), Vec::new()));
    }
    let link = if a.rank == 0 {
        host(a, auth, join_deadline).map_err(|(e, missing)| fail(e, missing))?
    } else {
        member(a, auth, join_deadline).map_err(|e| fail(e, Vec::new()))?
    };
    Ok(Group {
        joined: super::Joined {
            join_seconds: start.elapsed().as_secs_f64(),
        },
        link,
    })
}

fn host(
    a: &Assignment,
    auth: &Auth,
    join_deadline: Instant,
) -> Result<Link, (FabricError, Vec<String>)> {
    let hosting = |e: String| {
        let why = format!(
            "host the rendezvous of round {} group {}: {e}",
            a.round, a.group
        );
        (local(why), Vec::new())
    };
    let listener = listen_on(&a.rendezvous).map_err(|e| hosting(e.to_string()))?;
    if let Auth::Open { why } = auth {
        tracing::warn!(
            round = a.round,
            group = a.group,
            %why,
            "rendezvous: members are not authenticated (no key): anyone who reaches the port may join"
        );
    }
    let joined = gather(&listener, a, auth, join_deadline).map_err(hosting)?;
    let missing: Vec<String> = joined
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, c)| c.is_none())
        .map(|(i, _)| a.nodes[i].clone())
        .collect();
    let answer = if missing.is_empty() {
        Answer::Go
    } else {
        Answer::Abort {
            missing: missing.clone(),
        }
    };
    let mut members = Vec::new();
    for mut ctl in joined.into_iter().skip(1).flatten() {
        // A member that left after its hello finds out on its own; the answer goes to the rest.
        let _ = ctl.send(&answer, a.deadline);
        members.push(ctl);
    }
    if !missing.is_empty() {
        let why = format!(
            "{} of {} members never joined the rendezvous on {}: {}",
            missing.len(),
            a.nodes.len() - 1,
            a.rendezvous,
            missing.join(", ")
        );
        return Err((peer(why), missing));
    }
    Ok(Link::Host { listener, members })
}

/// What wakes the host's accept loop.
enum Event {
    /// A connection waits to be accepted.
    Acceptable,
    /// A greeting thread has a member for the loop.
    Woken,
    /// The join deadline passed.
    Deadline,
}

/// Waits until `listener` has a connection, `waker` has bytes, or `deadline`.
fn wait_event(listener: &TcpListener, waker: &UnixStream, deadline: Instant) -> Event {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Event::Deadline;
        }
        let mut fds = [listener.as_raw_fd(), waker.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `fds` is an array of two valid pollfds that outlives the call, and the count
        // passed is its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n > 0 {
            return if fds[1].revents != 0 {
                Event::Woken
            } else {
                Event::Acceptable
            };
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Event::Deadline;
        }
    }
}

/// Accepts connections until every member has joined or `join_deadline`. Each connection is
/// greeted on a thread of its own ([`greet`]), which hands a member that proved itself to this
/// loop and wakes it; a connection that says nothing holds up only its own thread, which gives
/// up at its own deadline. The joined members' connections by rank (rank 0, the host, None).
fn gather(
    listener: &TcpListener,
    a: &Assignment,
    auth: &Auth,
    join_deadline: Instant,
) -> Result<Vec<Option<Control>>, String> {
    let (tx, rx) = mpsc::channel::<(usize, Control)>();
    let (mut wake_rx, wake_tx) =
        UnixStream::pair().map_err(|e| format!("make the greeting threads' waker: {e}"))?;
    wake_rx
        .set_nonblocking(true)
        .and_then(|()| wake_tx.set_nonblocking(true))
        .map_err(|e| format!("make the greeting threads' waker non-blocking: {e}"))?;
    let assignment = Arc::new(a.clone());
    let greeting = Arc::new(AtomicUsize::new(0));
    let mut joined: Vec<Option<Control>> = (0..a.nodes.len()).map(|_| None).collect();
    loop {
        for (rank, ctl) in rx.try_iter() {
            // A member that connected again replaces its earlier connection.
            joined[rank] = Some(ctl);
        }
        if joined.iter().skip(1).all(Option::is_some) {
            break;
        }
        match wait_event(listener, &wake_rx, join_deadline) {
            Event::Deadline => break,
            Event::Woken => {
                // Only the wake-up matters, not its bytes.
                let _ = wake_rx.read(&mut [0u8; 64]);
            }
            Event::Acceptable => {
                let Ok((stream, addr)) = listener.accept() else {
                    continue;
                };
                if greeting.load(Ordering::SeqCst) >= MAX_GREETING {
                    tracing::warn!(peer = %addr, "rendezvous: too many connections at once, closed unread");
                    continue;
                }
                let Ok(waker) = wake_tx.try_clone() else {
                    continue;
                };
                let (a, auth, tx) = (assignment.clone(), auth.clone(), tx.clone());
                let count = greeting.clone();
                count.fetch_add(1, Ordering::SeqCst);
                let spawned = std::thread::Builder::new()
                    .name("rendezvous-hello".into())
                    .spawn(move || {
                        if let Some(member) = greet(stream, addr, &a, &auth) {
                            // The loop may be over (deadline): the connection then closes.
                            if tx.send(member).is_ok() {
                                let _ = (&waker).write(&[1]);
                            }
                        }
                        count.fetch_sub(1, Ordering::SeqCst);
                    });
                if let Err(e) = spawned {
                    greeting.fetch_sub(1, Ordering::SeqCst);
                    tracing::warn!(peer = %addr, error = %e, "rendezvous: no thread to greet a connection, closed");
                }
            }
        }
    }
    for (rank, ctl) in rx.try_iter() {
        joined[rank] = Some(ctl);
    }
    Ok(joined)
}

/// One connection of the rendezvous, on a thread of its own: a fresh challenge, the hello (by
/// [`HELLO_WAIT`]), its MAC and its place in the group. The member's rank and connection when
/// all hold; otherwise None, the reason logged (and, for a refused hello, sent back).
fn greet(
    stream: TcpStream,
    addr: SocketAddr,
    a: &Assignment,
    auth: &Auth,
) -> Option<(usize, Control)> {
    let deadline = (Instant::now() + HELLO_WAIT).min(a.deadline);
    let mut ctl = Control::new(stream, addr.to_string()).ok()?;
    let challenge = match member_key::challenge() {
        Ok(c) => c,
        Err(why) => {
            tracing::warn!(peer = %addr, %why, "rendezvous: no challenge, closed");
            return None;
        }
    };
    let sent = ctl.send(
        &Challenge {
            challenge: challenge.clone(),
        },
        deadline,
    );
    if let Err(e) = sent {
        tracing::warn!(peer = %addr, error = %e, "rendezvous: challenge not sent, closed");
        return None;
    }
    let (node, rank, round, group, mac) = match ctl.recv::<Greeting>(deadline) {
        Ok(Greeting::Hello {
            node,
            rank,
            round,
            group,
            mac,
        }) => (node, rank, round, group, mac),
        Ok(other) => {
            tracing::warn!(peer = %addr, ?other, "rendezvous: not a hello, closed");
            return None;
        }
        Err(e) => {
            tracing::warn!(peer = %addr, error = %e, "rendezvous: no hello, closed");
            return None;
        }
    };
    let id = HelloId {
        node: &node,
        rank,
        round,
        group,
    };
    // The key first: a stranger learns nothing about the group.
    let refused = auth
        .verify(&challenge, id, mac.as_deref())
        .err()
        .or_else(|| check_hello(a, &node, rank, round, group));
    if let Some(why) = refused {
        tracing::warn!(peer = %addr, %node, rank, %why, "rendezvous: hello refused");
        let _ = ctl.send(&Answer::Reject { why }, deadline);
        return None;
    }
    Some((rank, ctl))
}

fn check_hello(a: &Assignment, node: &str, rank: usize, round: i32, group: i32) -> Option<String> {
    if round != a.round || group != a.group {
        return Some(format!(
            "this rendezvous is round {} group {}, not round {round} group {group}",
            a.round, a.group
        ));
    }
    if rank == 0 || a.nodes.get(rank).map(String::as_str) != Some(node) {
        return Some(format!("{node} is not rank {rank} of this group"));
    }
    None
}

fn member(a: &Assignment, auth: &Auth, join_deadline: Instant) -> Result<Link, FabricError> {
    let host_name = &a.nodes[0];
    let stream = connect_until(&a.rendezvous, "connect to the rendezvous", join_deadline)
        .map_err(|e| peer(format!("host {host_name}: {e}")))?;
    let mut ctl = Control::new(stream, a.rendezvous.clone())
        .map_err(|e| local(format!("rendezvous with {host_name}: {e}")))?;
    let talk = |e: NetError| peer(format!("rendezvous with host {host_name}: {e}"));
    let Challenge { challenge } = ctl.recv(a.deadline).map_err(talk)?;
    let node = &a.nodes[a.rank];
    let id = HelloId {
        node,
        rank: a.rank,
        round: a.round,
        group: a.group,
    };
    let hello = Greeting::Hello {
        node: node.clone(),
        rank: a.rank,
        round: a.round,
        group: a.group,
        mac: auth.mac(&challenge, id),
    };
    ctl.send(&hello, a.deadline).map_err(talk)?;
    match ctl.recv::<Answer>(a.deadline).map_err(talk)? {
        Answer::Go => Ok(Link::Member { host: ctl }),
        Answer::Abort { missing } => Err(peer(format!(
            "host {host_name} gave up the rendezvous: {} never joined",
            missing.join(", ")
        ))),
        Answer::Reject { why } => Err(peer(format!("host {host_name} refused this member: {why}"))),
    }
}
