//! The group join. The group's first node (the host) listens on the rendezvous port on every
//! address and accepts; the other members connect (retrying with backoff: the host may still be
//! busy with an earlier group), read the host's [`Challenge`], say hello in one JSON line with
//! a MAC over the challenge and the hello under the validation's key ([`member_key`]), and wait
//! for the host's answer: `go` once every member has joined, or `abort` at the join deadline
//! naming the members that never came. After `go` the connections stay open as the group's
//! control channel ([`Control`]).
//!
//! The host greets each connection on a thread of its own with its own short deadline
//! ([`HELLO_WAIT`]), at most 8 at once per source address and 64 per group (more in a larger
//! group, [`Limits::for_members`]), cutting the oldest greeting past a bound ([`greeting`](super::greeting)): a stranger that connects and
//! says nothing, or says something wrong, is refused (and logged) without holding up the
//! members, and a flood of them never keeps a member out. A member whose connection is closed
//! before the host's answer (cut, or refused by a busy host) connects again, with backoff and
//! jitter, until the join deadline.
//!
//! Everything here is blocking with deadlines: no call waits past the deadline it is given.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricError, FabricErrorKind};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::Assignment;
use super::greeting::{self, Limits};
use super::member_key::{self, Auth, HelloId};
use crate::api_retry::{Backoff, seed_of};

/// The longest a control message line may be (a hello, a figure, a 64-byte ping).
const MAX_LINE: usize = 64 * 1024;
pub use super::greeting::HELLO_WAIT;
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

/// The pauses of one member between tries to reach `addr`: doubling from 50 ms to 500 ms,
/// jittered per process and address so that members do not knock in step.
pub fn member_backoff(addr: &str) -> Backoff {
    let seed = seed_of(addr) ^ u64::from(std::process::id());
    Backoff::new(BACKOFF_FIRST, BACKOFF_MAX, seed)
}

/// Connects to `addr`, retrying with backoff until `deadline`.
pub fn connect_until(addr: &str, what: &str, deadline: Instant) -> Result<TcpStream, NetError> {
    let mut backoff = member_backoff(addr);
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
        std::thread::sleep(backoff.pause().min(left));
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
        /// HMAC-SHA256 (hex), under the validation's key, of the host's challenge on this
        /// connection and the fields above ([`member_key::DataId`]); absent without a key.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mac: Option<String>,
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
    /// The hello did not prove the validation's key, or named a wrong rank (for good).
    Reject { why: String },
    /// The hello (or data stream) is for another round or group than the listener's: the
    /// member is ahead of this host and tries again until its join deadline.
    OtherRound { why: String },
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
/// An error of `kind` (kept to the API's 300 characters).
pub fn error_of(kind: FabricErrorKind, message: String) -> FabricError {
    fabric_error(kind, message)
}

/// Joins `a`'s group: hosts it (rank 0) or connects to its host, until `join_deadline`
/// (members wait for the host's answer until `a.deadline`). Members prove they hold `auth`'s
/// key; the host admits only those who do. The default [`Limits`] for the group's size.
pub fn join(a: &Assignment, auth: &Auth, join_deadline: Instant) -> Result<Group, JoinFailure> {
    join_with(a, auth, join_deadline, &Limits::for_members(a.nodes.len()))
}

/// [`join`] within `limits`.
pub fn join_with(
    a: &Assignment,
    auth: &Auth,
    join_deadline: Instant,
    limits: &Limits,
) -> Result<Group, JoinFailure> {
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
        host(a, auth, join_deadline, limits).map_err(|(e, missing)| fail(e, missing))?
    } else {
        member(a, auth, join_deadline, limits).map_err(|e| fail(e, Vec::new()))?
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
    limits: &Limits,
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
    let greet = {
        let (a, auth) = (a.clone(), auth.clone());
        Arc::new(move |stream, peer, by| greet(stream, peer, by, &a, &auth))
    };
    let joined = greeting::gather(&listener, (1, a.nodes.len()), join_deadline, limits, greet)
        .map_err(hosting)?;
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
        return Err((error_of(FabricErrorKind::NeverJoined, why), missing));
    }
    Ok(Link::Host { listener, members })
}

/// Sends a fresh challenge on `ctl` and reads the greeting that answers it, both by
/// `deadline`: the challenge and the greeting, or None (the reason logged) when either fails.
pub fn challenged(
    ctl: &mut Control,
    addr: SocketAddr,
    deadline: Instant,
) -> Option<(String, Greeting)> {
    let challenge = match member_key::challenge() {
        Ok(c) => c,
        Err(why) => {
            tracing::warn!(peer = %addr, %why, "fabric listener: no challenge, closed");
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
        tracing::warn!(peer = %addr, error = %e, "fabric listener: challenge not sent, closed");
        return None;
    }
    match ctl.recv::<Greeting>(deadline) {
        Ok(g) => Some((challenge, g)),
        Err(e) => {
            tracing::warn!(peer = %addr, error = %e, "fabric listener: no greeting in time, closed");
            None
        }
    }
}

/// One connection of the rendezvous, on a thread of its own: a fresh challenge, the hello (by
/// `deadline`, the greeting's), its MAC and its place in the group. The member's rank and
/// connection when all hold; otherwise None, the reason logged (and, for a refused hello, sent
/// back).
fn greet(
    stream: TcpStream,
    addr: SocketAddr,
    deadline: Instant,
    a: &Assignment,
    auth: &Auth,
) -> Option<(usize, Control)> {
    let mut ctl = Control::new(stream, addr.to_string()).ok()?;
    let (challenge, greeting) = challenged(&mut ctl, addr, deadline)?;
    let Greeting::Hello {
        node,
        rank,
        round,
        group,
        mac,
    } = greeting
    else {
        tracing::warn!(peer = %addr, ?greeting, "rendezvous: not a hello, closed");
        let why = format!(
            "this is the rendezvous of round {} group {}, not its measurement",
            a.round, a.group
        );
        let _ = ctl.send(&Answer::OtherRound { why }, deadline);
        return None;
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
        .map(|why| Answer::Reject { why })
        .or_else(|| check_hello(a, &node, rank, round, group));
    if let Some(answer) = refused {
        tracing::warn!(peer = %addr, %node, rank, ?answer, "rendezvous: hello refused");
        let _ = ctl.send(&answer, deadline);
        return None;
    }
    Some((rank, ctl))
}

/// Why a hello that proved the key is not for this group: another round or group (the member is
/// ahead of this host, and tries again), or not that rank of it.
fn check_hello(a: &Assignment, node: &str, rank: usize, round: i32, group: i32) -> Option<Answer> {
    if round != a.round || group != a.group {
        return Some(Answer::OtherRound {
            why: format!(
                "this rendezvous is round {} group {}, not round {round} group {group}",
                a.round, a.group
            ),
        });
    }
    if rank == 0 || a.nodes.get(rank).map(String::as_str) != Some(node) {
        let why = format!("{node} is not rank {rank} of this group");
        return Some(Answer::Reject { why });
    }
    None
}

/// How one try of a member to join ended.
enum Try {
    /// The host said `go`.
    Joined(Control),
    /// The host answered otherwise.
    Final(FabricError),
    /// The host could not be reached by the join deadline.
    Unreachable(FabricError),
    /// The connection ended before the host's answer, or the host is in another round or
    /// group: worth another try while the join deadline has not passed.
    Again(FabricError),
}

/// A member's join: tried again, with backoff and jitter, until the join deadline each time the
/// connection ends before the host's answer (a greeting cut by a flood of strangers, a host
/// still in an earlier round).
fn member(
    a: &Assignment,
    auth: &Auth,
    join_deadline: Instant,
    limits: &Limits,
) -> Result<Link, FabricError> {
    let mut backoff = member_backoff(&a.rendezvous);
    let mut tries = 1u32;
    let mut again: Option<FabricError> = None;
    loop {
        let error = match member_try(a, auth, join_deadline, limits) {
            Try::Joined(host) => return Ok(Link::Member { host }),
            // The host that stopped listening at the join deadline says less than what it
            // answered before.
            Try::Unreachable(e) => return Err(again.unwrap_or(e)),
            Try::Final(e) => return Err(e),
            Try::Again(e) => e,
        };
        let left = join_deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(error);
        }
        let pause = backoff.pause().min(left);
        let retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
        tracing::warn!(round = a.round, group = a.group, host = %a.nodes[0], tries, retry_in_ms, error = %error.message, "rendezvous: no answer from the host on this connection; joining again");
        // A pause between tries: the host says nothing that could be waited on instead.
        std::thread::sleep(pause);
        tries += 1;
        again = Some(error);
    }
}

fn member_try(a: &Assignment, auth: &Auth, join_deadline: Instant, limits: &Limits) -> Try {
    let host_name = &a.nodes[0];
    let stream = match connect_until(&a.rendezvous, "connect to the rendezvous", join_deadline) {
        Ok(s) => s,
        Err(e) => {
            return Try::Unreachable(error_of(
                FabricErrorKind::NeverJoined,
                format!("host {host_name}: {e}"),
            ));
        }
    };
    let mut ctl = match Control::new(stream, a.rendezvous.clone()) {
        Ok(c) => c,
        Err(e) => return Try::Final(local(format!("rendezvous with {host_name}: {e}"))),
    };
    let talk = |e: NetError| peer(format!("rendezvous with host {host_name}: {e}"));
    // A host greets at once; one that does not (busy greeting a flood, or not at this group
    // yet) is tried again.
    let greet_by = limits.greet_by(Instant::now(), a.deadline);
    let challenge = match ctl.recv::<Challenge>(greet_by) {
        Ok(c) => c.challenge,
        Err(e) => return Try::Again(talk(e)),
    };
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
    if let Err(e) = ctl.send(&hello, greet_by) {
        return Try::Again(talk(e));
    }
    match ctl.recv::<Answer>(a.deadline) {
        Ok(Answer::Go) => Try::Joined(ctl),
        Ok(Answer::Abort { missing }) => Try::Final(error_of(
            FabricErrorKind::NeverJoined,
            format!(
                "host {host_name} gave up the rendezvous: {} never joined",
                missing.join(", ")
            ),
        )),
        Ok(Answer::Reject { why }) => Try::Final(error_of(
            FabricErrorKind::Refused,
            format!("host {host_name} refused this member: {why}"),
        )),
        Ok(Answer::OtherRound { why }) => Try::Again(error_of(
            FabricErrorKind::Refused,
            format!("host {host_name} refused this member: {why}"),
        )),
        Err(e) => Try::Again(talk(e)),
    }
}
