//! Greeting the connections of a group's listener, bounded. Each accepted connection is greeted
//! on a thread of its own (the caller's `greet`: a challenge, and the answer that proves the
//! validation's key), by a deadline of its own ([`Limits::greet`]). At most
//! [`Limits::per_source`] connections of one address and [`Limits::per_group`] in all are
//! greeted at once; a connection past a bound cuts the oldest greeting in progress (of its own
//! address, else of all) instead of being turned away. A member answers its challenge within a
//! round trip, so silent or slow strangers are always the older ones and are cut first: a flood
//! of them never keeps a member out, and one address can only ever crowd out itself.
//!
//! The bookkeeping ([`Greetings`]) is pure, time a parameter; [`gather`] is the shell around it.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// The longest a host waits for an accepted connection's hello (each connection on its own).
pub const HELLO_WAIT: Duration = Duration::from_secs(5);

/// How long each step with a peer may take, and how many connections a listener greets at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest an accepted connection may take to prove itself (a hello, a data stream's
    /// tag): a silent or slow peer is cut then.
    pub greet: Duration,
    /// The longest one read or write of the TCP measurement may wait for the other side.
    pub stall: Duration,
    /// Connections of one source address greeted at once.
    pub per_source: usize,
    /// Connections greeted at once on one group's listener.
    pub per_group: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            greet: HELLO_WAIT,
            stall: Duration::from_secs(10),
            per_source: 8,
            per_group: 64,
        }
    }
}

impl Limits {
    /// The default limits for a listener that `members` connect to: the bounds grow with a
    /// large group (at least `members` per address, for members that share one, and twice the
    /// members in all), so that its own members arriving together never cut each other.
    pub fn for_members(members: usize) -> Self {
        let d = Self::default();
        Self {
            per_source: d.per_source.max(members),
            per_group: d.per_group.max(members.saturating_mul(2)),
            ..d
        }
    }

    /// When a greeting that starts `now` must be over (never past `deadline`).
    pub fn greet_by(&self, now: Instant, deadline: Instant) -> Instant {
        (now + self.greet).min(deadline)
    }

    /// When one read or write that starts `now` must be over (never past `deadline`).
    pub fn step_by(&self, now: Instant, deadline: Instant) -> Instant {
        (now + self.stall).min(deadline)
    }
}

/// The greetings in progress, oldest first.
#[derive(Debug, Default)]
pub struct Greetings {
    next: u64,
    open: VecDeque<(u64, IpAddr)>,
}

impl Greetings {
    /// A connection from `source` is to be greeted: its id, and the ids of the greetings to cut
    /// first to stay within `limits`.
    pub fn admit(&mut self, source: IpAddr, limits: &Limits) -> (u64, Vec<u64>) {
        let mut cut = Vec::new();
        let of_source = self.open.iter().filter(|(_, s)| *s == source).count();
        if of_source >= limits.per_source.max(1) {
            if let Some(i) = self.open.iter().position(|(_, s)| *s == source) {
                cut.extend(self.open.remove(i).map(|(id, _)| id));
            }
        } else if self.open.len() >= limits.per_group.max(1) {
            cut.extend(self.open.pop_front().map(|(id, _)| id));
        }
        let id = self.next;
        self.next += 1;
        self.open.push_back((id, source));
        (id, cut)
    }

    /// Greeting `id` is over (done, refused, or cut).
    pub fn done(&mut self, id: u64) {
        self.open.retain(|(i, _)| *i != id);
    }

    /// Greetings in progress.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// True when none is in progress.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// A connection's greeting, on its thread: the stream, its peer, and the instant it must be over
/// by; the slot it fills (an index below the gather's `slots`) and what fills it, or None.
pub type Greet<T> = dyn Fn(TcpStream, SocketAddr, Instant) -> Option<(usize, T)> + Send + Sync;

/// What a greeting thread tells the accept loop.
type Finished<T> = (u64, Option<(usize, T)>);

/// Accepts connections on `listener` until slots `first..slots` are all filled or `deadline`,
/// greeting each on a thread of its own by `greet` within `limits`. A slot filled again (a
/// member that connected again) takes the later one. The slots, filled or not.
pub fn gather<T: Send + 'static>(
    listener: &TcpListener,
    (first, slots): (usize, usize),
    deadline: Instant,
    limits: &Limits,
    greet: Arc<Greet<T>>,
) -> Result<Vec<Option<T>>, String> {
    let (tx, rx) = mpsc::channel::<Finished<T>>();
    let (mut wake_rx, wake_tx) =
        UnixStream::pair().map_err(|e| format!("make the greeting threads' waker: {e}"))?;
    wake_rx
        .set_nonblocking(true)
        .and_then(|()| wake_tx.set_nonblocking(true))
        .map_err(|e| format!("make the greeting threads' waker non-blocking: {e}"))?;
    let mut filled: Vec<Option<T>> = (0..slots).map(|_| None).collect();
    let mut greetings = Greetings::default();
    let mut streams: Vec<(u64, TcpStream)> = Vec::new();
    let full = |f: &[Option<T>]| f.iter().skip(first).all(Option::is_some);
    loop {
        for (id, got) in rx.try_iter() {
            greetings.done(id);
            streams.retain(|(i, _)| *i != id);
            if let Some((slot, value)) = got.filter(|(slot, _)| *slot < slots) {
                if filled[slot].is_some() {
                    tracing::info!(
                        slot,
                        "fabric listener: a slot filled again; the later connection counts"
                    );
                }
                filled[slot] = Some(value);
            }
        }
        if full(&filled) {
            break;
        }
        match wait_event(listener, &wake_rx, deadline) {
            Event::Deadline => break,
            Event::Woken => {
                // Only the wake-up matters, not its bytes.
                let _ = wake_rx.read(&mut [0u8; 64]);
            }
            Event::Acceptable => {
                let Ok((stream, peer)) = listener.accept() else {
                    continue;
                };
                let (id, cut) = greetings.admit(peer.ip(), limits);
                for gone in cut {
                    cut_greeting(&mut streams, gone, &peer);
                }
                match start(stream, peer, id, deadline, limits, (&greet, &tx, &wake_tx)) {
                    Some(kept) => streams.push((id, kept)),
                    None => greetings.done(id),
                }
            }
        }
    }
    // Greetings still in progress end now, not at their own deadlines.
    for (_, s) in streams {
        let _ = s.shutdown(Shutdown::Both);
    }
    Ok(filled)
}

/// Cuts greeting `id` (its thread sees its connection end at once).
fn cut_greeting(streams: &mut Vec<(u64, TcpStream)>, id: u64, newcomer: &SocketAddr) {
    if let Some(i) = streams.iter().position(|(i, _)| *i == id) {
        let (_, s) = streams.swap_remove(i);
        let cut = s.peer_addr().map(|p| p.to_string()).unwrap_or_default();
        tracing::warn!(peer = %cut, newcomer = %newcomer, "fabric listener: too many connections greeted at once; the oldest greeting is cut");
        // Already closed by the peer: nothing left to cut.
        let _ = s.shutdown(Shutdown::Both);
    }
}

/// Starts greeting `stream` on a thread of its own; a second handle on it (to cut it), or None
/// when it cannot be greeted (closed).
fn start<T: Send + 'static>(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    deadline: Instant,
    limits: &Limits,
    (greet, tx, wake): (&Arc<Greet<T>>, &mpsc::Sender<Finished<T>>, &UnixStream),
) -> Option<TcpStream> {
    let kept = stream.try_clone().ok()?;
    let waker = wake.try_clone().ok()?;
    let (greet, tx) = (greet.clone(), tx.clone());
    let by = limits.greet_by(Instant::now(), deadline);
    let spawned = std::thread::Builder::new()
        .name("fabric-greeting".into())
        .spawn(move || {
            let got = greet(stream, peer, by);
            // The loop may be over (deadline): the connection then closes.
            if tx.send((id, got)).is_ok() {
                let _ = (&waker).write(&[1]);
            }
        });
    match spawned {
        Ok(_) => Some(kept),
        Err(e) => {
            tracing::warn!(peer = %peer, error = %e, "fabric listener: no thread to greet a connection, closed");
            None
        }
    }
}

/// What wakes the accept loop.
enum Event {
    /// A connection waits to be accepted.
    Acceptable,
    /// A greeting thread is done.
    Woken,
    /// The deadline passed.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn limits(per_source: usize, per_group: usize) -> Limits {
        Limits {
            per_source,
            per_group,
            ..Default::default()
        }
    }

    #[test]
    fn one_address_past_its_bound_cuts_only_its_own_oldest() {
        let l = limits(2, 64);
        let mut g = Greetings::default();
        let (a0, cut) = g.admit(ip(1), &l);
        assert!(cut.is_empty());
        let (member, _) = g.admit(ip(2), &l);
        let (a1, _) = g.admit(ip(1), &l);
        let (_, cut) = g.admit(ip(1), &l);
        assert_eq!(cut, [a0], "the flooder's oldest goes");
        let (_, cut) = g.admit(ip(1), &l);
        assert_eq!(cut, [a1]);
        assert_eq!(g.len(), 3, "two of the flooder's and the member's");
        g.done(member);
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn many_addresses_past_the_group_bound_cut_the_oldest_of_all() {
        let l = limits(8, 4);
        let mut g = Greetings::default();
        let ids: Vec<u64> = (1..=4).map(|i| g.admit(ip(i), &l).0).collect();
        let (_, cut) = g.admit(ip(9), &l);
        assert_eq!(cut, [ids[0]]);
        g.done(ids[2]);
        let (_, cut) = g.admit(ip(10), &l);
        assert!(cut.is_empty(), "room again: {cut:?}");
        assert_eq!(g.len(), 4);
    }

    #[test]
    fn a_newcomer_is_always_greeted_however_many_wait() {
        let l = limits(8, 64);
        let mut g = Greetings::default();
        for i in 0..1000u32 {
            let (id, _) = g.admit(ip((i % 200) as u8), &l);
            assert!(g.open.iter().any(|(o, _)| *o == id), "newcomer {i} greeted");
            assert!(g.len() <= 64, "bounded: {}", g.len());
        }
    }

    #[test]
    fn a_large_group_s_own_members_arriving_together_cut_nobody() {
        let small = Limits::for_members(3);
        assert_eq!((small.per_source, small.per_group), (8, 64));
        let large = Limits::for_members(1000);
        assert_eq!((large.per_source, large.per_group), (1000, 2000));
        let mut g = Greetings::default();
        for i in 0..999u32 {
            let (_, cut) = g.admit(ip((i % 2) as u8), &large);
            assert!(cut.is_empty(), "member {i} cut another");
        }
    }

    #[test]
    fn each_step_ends_by_its_own_limit_or_the_deadline() {
        let l = Limits::default();
        let now = Instant::now();
        let far = now + Duration::from_secs(3600);
        assert_eq!(l.greet_by(now, far), now + l.greet);
        assert_eq!(l.step_by(now, far), now + l.stall);
        let near = now + Duration::from_millis(10);
        assert_eq!(l.greet_by(now, near), near);
        assert_eq!(l.step_by(now, near), near);
    }
}
