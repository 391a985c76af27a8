//! The TCP pair test (the `iperf` of the fabric test), after the rendezvous of a two-member
//! group: the member opens `streams` data connections to the host's listener and sends for
//! `duration`, then the host sends back for `duration` over the same connections; then 64-byte
//! messages go back and forth on the control channel, led first by the member, then by the
//! host, each side timing its own round trips. Each side reports what it sent and received (Gb/s,
//! bits, from its own side) and its median round trip. Real sockets in every backend.
//!
//! Every data connection proves the validation's key before it carries data
//! ([`data_streams`](super::data_streams)), and every read and write, of the data streams and of
//! the control channel, waits at most [`Limits::stall`] (and never past the round's deadline):
//! a peer that stops reading or sending is dropped then, not at the end of the round.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricError, FabricTcp};
use serde::{Deserialize, Serialize};

use super::Assignment;
use super::greeting::Limits;
use super::member_key::Auth;
use super::rendezvous::{Control, Link, NetError, local, peer, remaining};

/// Bytes per write and read of the data streams.
const CHUNK: usize = 256 * 1024;
/// The most round trips each side times, and the longest it spends on them.
pub const PINGS: usize = 200;
const PING_TIME: Duration = Duration::from_secs(2);
/// The size of a ping, newline included.
pub const PING_BYTES: usize = 64;

/// What one side of a pair measured.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpFigures {
    pub send_gbps: f64,
    pub recv_gbps: f64,
    pub latency_micros: f64,
    pub seconds: f64,
}

/// The time a pair test needs after its rendezvous, at most (both directions and the pings,
/// with slack for connecting).
pub fn budget(settings: &FabricTcp) -> Duration {
    settings.duration.as_std() * 2 + PING_TIME * 2 + Duration::from_secs(5)
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Phase {
    /// The receiver of a direction got this many bytes (all the sender's streams ended).
    Received { bytes: u64 },
    /// The side that leads the round trips is done.
    PingsDone,
}

/// When each step of the measurement must be over: one read or write within `stall`, all by
/// `end` (the round's deadline).
#[derive(Debug, Clone, Copy)]
struct Steps {
    end: Instant,
    stall: Duration,
}

impl Steps {
    /// The deadline of a read or write that starts now.
    fn next(&self) -> Instant {
        (Instant::now() + self.stall).min(self.end)
    }
}

/// Runs the pair test on a joined group, its data streams proving `auth`'s key, within the
/// default [`Limits`]. Errors of the other side (it left, it timed out, it stalled) are `Peer`;
/// failures of this side's own sockets are `Local`.
pub fn run(
    a: &Assignment,
    settings: &FabricTcp,
    link: &mut Link,
    auth: &Auth,
) -> Result<TcpFigures, FabricError> {
    run_with(a, settings, link, auth, &Limits::default())
}

/// [`run`] within `limits`.
pub fn run_with(
    a: &Assignment,
    settings: &FabricTcp,
    link: &mut Link,
    auth: &Auth,
    limits: &Limits,
) -> Result<TcpFigures, FabricError> {
    let start = Instant::now();
    let steps = Steps {
        end: a.deadline,
        stall: limits.stall,
    };
    let streams = usize::try_from(settings.streams.clamp(1, 64)).unwrap_or(1);
    let duration = settings.duration.as_std();
    let other = if a.rank == 0 {
        &a.nodes.get(1)
    } else {
        &a.nodes.first()
    };
    let other = other.map_or("the other member", String::as_str);
    let blame = |e: NetError| match e {
        NetError::Io { ref what, .. } if what.starts_with("listen") => {
            local(format!("TCP test: {e}"))
        }
        e => peer(format!("TCP test with {other}: {e}")),
    };
    let (send, recv, latency) = match link {
        Link::Host { listener, members } => {
            let ctl = members
                .first_mut()
                .ok_or_else(|| local("TCP test: the pair has no second member".into()))?;
            let accepted = super::data_streams::accept(listener, a, auth, streams, limits);
            let mut data = accepted.map_err(blame)?;
            let recv = receive(&mut data, ctl, steps).map_err(blame)?;
            let send = send(&mut data, ctl, duration, steps).map_err(blame)?;
            let mine = echo(ctl, steps).and_then(|()| lead_pings(ctl, steps));
            (send, recv, mine.map_err(blame)?)
        }
        Link::Member { host } => {
            let opened = super::data_streams::open(a, auth, streams, limits);
            let mut data = opened.map_err(blame)?;
            let send = send(&mut data, host, duration, steps).map_err(blame)?;
            let recv = receive(&mut data, host, steps).map_err(blame)?;
            let mine = lead_pings(host, steps).and_then(|l| echo(host, steps).map(|()| l));
            (send, recv, mine.map_err(blame)?)
        }
    };
    Ok(TcpFigures {
        send_gbps: send,
        recv_gbps: recv,
        latency_micros: latency,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn gbps(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 * 8.0 / elapsed.as_secs_f64().max(1e-9) / 1e9
}

/// Sends on every stream for `duration`, ends each stream's direction, and waits for the
/// receiver to say how much arrived: the rate is what arrived over the time until it did.
fn send(
    data: &mut [TcpStream],
    ctl: &mut Control,
    duration: Duration,
    steps: Steps,
) -> Result<f64, NetError> {
    let start = Instant::now();
    let stop = (start + duration).min(steps.end);
    let peer = ctl.peer.clone();
    std::thread::scope(|scope| {
        let workers: Vec<_> = data
            .iter_mut()
            .map(|s| scope.spawn(|| send_stream(s, stop, steps, &peer)))
            .collect();
        for w in workers {
            w.join().unwrap_or_else(|_| {
                Err(NetError::Io {
                    what: "send on a data stream to".into(),
                    addr: peer.clone(),
                    why: "the sending thread panicked".into(),
                })
            })?;
        }
        Ok::<(), NetError>(())
    })?;
    match ctl.recv::<Phase>(steps.next())? {
        Phase::Received { bytes } => Ok(gbps(bytes, start.elapsed())),
        other => Err(ctl.protocol(format!("expected the bytes received, got {other:?}"))),
    }
}

fn send_stream(s: &mut TcpStream, stop: Instant, steps: Steps, peer: &str) -> Result<(), NetError> {
    let what = "send on a data stream to";
    let chunk = vec![0x5au8; CHUNK];
    while Instant::now() < stop {
        let left = remaining(steps.next(), what, peer)?;
        s.set_write_timeout(Some(left))
            .map_err(|e| NetError::io(what, peer, &e))?;
        s.write_all(&chunk)
            .map_err(|e| NetError::io(what, peer, &e))?;
    }
    s.shutdown(Shutdown::Write)
        .map_err(|e| NetError::io(what, peer, &e))
}

/// Reads every stream to its end, tells the sender how much arrived, and gives the rate from
/// the first byte to the last stream's end.
fn receive(data: &mut [TcpStream], ctl: &mut Control, steps: Steps) -> Result<f64, NetError> {
    let peer = ctl.peer.clone();
    let results: Vec<Result<Received, NetError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = data
            .iter_mut()
            .map(|s| scope.spawn(|| receive_stream(s, steps, &peer)))
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join().unwrap_or_else(|_| {
                    Err(NetError::Io {
                        what: "receive on a data stream from".into(),
                        addr: peer.clone(),
                        why: "the receiving thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut total = 0;
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for r in results {
        let (bytes, f, l) = r?;
        total += bytes;
        first = match (first, f) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        last = Some(last.map_or(l, |x: Instant| x.max(l)));
    }
    ctl.send(&Phase::Received { bytes: total }, steps.next())?;
    let elapsed = match (first, last) {
        (Some(f), Some(l)) => l.saturating_duration_since(f),
        _ => Duration::ZERO,
    };
    if total == 0 {
        return Ok(0.0);
    }
    Ok(gbps(total, elapsed))
}

/// What one stream delivered: bytes, when the first arrived, when it ended.
type Received = (u64, Option<Instant>, Instant);

fn receive_stream(s: &mut TcpStream, steps: Steps, peer: &str) -> Result<Received, NetError> {
    let what = "receive on a data stream from";
    let mut buf = vec![0u8; CHUNK];
    let mut bytes = 0u64;
    let mut first = None;
    loop {
        let left = remaining(steps.next(), what, peer)?;
        s.set_read_timeout(Some(left))
            .map_err(|e| NetError::io(what, peer, &e))?;
        match s.read(&mut buf) {
            Ok(0) => return Ok((bytes, first, Instant::now())),
            Ok(n) => {
                first.get_or_insert_with(Instant::now);
                bytes += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(NetError::io(what, peer, &e)),
        }
    }
}

/// A ping: a JSON-free line of exactly [`PING_BYTES`] bytes.
fn ping_line(n: usize) -> Vec<u8> {
    let mut line = format!("ping {n:08}").into_bytes();
    line.resize(PING_BYTES - 1, b'.');
    line.push(b'\n');
    line
}

/// Times round trips of 64-byte messages (at most [`PINGS`], for at most two seconds), then
/// tells the other side it is done; gives the median in microseconds.
fn lead_pings(ctl: &mut Control, steps: Steps) -> Result<f64, NetError> {
    let stop = (Instant::now() + PING_TIME).min(steps.end);
    let mut rtts = Vec::with_capacity(PINGS);
    for n in 0..PINGS {
        if Instant::now() >= stop && !rtts.is_empty() {
            break;
        }
        let line = ping_line(n);
        let t = Instant::now();
        ctl.send_raw(&line, steps.next())?;
        let back = ctl.recv_line(steps.next())?;
        rtts.push(t.elapsed());
        if back.len() + 1 != PING_BYTES || !back.starts_with(b"ping ") {
            return Err(ctl.protocol("a ping came back changed".into()));
        }
    }
    ctl.send(&Phase::PingsDone, steps.next())?;
    rtts.sort_unstable();
    Ok(rtts[rtts.len() / 2].as_secs_f64() * 1e6)
}

/// Sends every ping back until the leader says it is done.
fn echo(ctl: &mut Control, steps: Steps) -> Result<(), NetError> {
    loop {
        let mut line = ctl.recv_line(steps.next())?;
        if line.starts_with(b"ping ") {
            line.push(b'\n');
            ctl.send_raw(&line, steps.next())?;
            continue;
        }
        return match serde_json::from_slice::<Phase>(&line) {
            Ok(Phase::PingsDone) => Ok(()),
            _ => Err(ctl.protocol(format!(
                "expected a ping or its end, got {:?}",
                String::from_utf8_lossy(&line[..line.len().min(80)])
            ))),
        };
    }
}
