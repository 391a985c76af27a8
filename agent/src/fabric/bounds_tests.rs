//! Who may take the time of a group's listener, over real loopback sockets: floods of silent
//! connections (from one address, and from a hundred), a slow-loris, a member whose first
//! connection is closed unanswered, strangers in the TCP measurement (without the key, with
//! another key, of another group or pair, silent), and a member that stalls mid-measurement.
//! Limits are short where a test waits them out; no test sleeps in place of a condition.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricErrorKind, FabricKind, FabricTcp};

use super::greeting::Limits;
use super::member_key::{Auth, DataId};
use super::rendezvous::{self, Answer, Challenge, Greeting, Group, Link};
use super::tests::{assignments, key};
use super::{Assignment, data_streams, tcp};

/// A connection to `target` from the loopback address `source` (127.0.0.0/8 is all loopback),
/// as a stranger on another host would make it.
fn connect_from(source: Ipv4Addr, target: &str) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime to connect with");
    let target: SocketAddr = target.parse().expect("an address");
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind(SocketAddr::from((source, 0)))
            .expect("bind the source address");
        socket.connect(target).await.expect("connect")
    });
    let stream = stream.into_std().expect("a std stream");
    stream.set_nonblocking(false).expect("blocking");
    stream
}

/// A first connection that proves `a`'s host listens (a stranger's too: it never says hello).
fn listening(a: &Assignment) -> TcpStream {
    let by = Instant::now() + Duration::from_secs(10);
    rendezvous::connect_until(&a.rendezvous, "connect to", by).expect("the host listens")
}

/// Joins every member of `a` but the host on threads of their own while the host joins here;
/// every side's group.
fn join_all(a: &[Assignment], join_by: Instant, limits: &Limits) -> Vec<Group> {
    std::thread::scope(|s| {
        let members: Vec<_> = a[1..]
            .iter()
            .map(|m| s.spawn(move || rendezvous::join_with(m, &key(), join_by, limits)))
            .collect();
        let host = rendezvous::join_with(&a[0], &key(), join_by, limits).expect("the group goes");
        let mut all = vec![host];
        for m in members {
            all.push(m.join().expect("member thread").expect("joined"));
        }
        all
    })
}

/// Runs the join of `a` with `strangers` already waiting on the host's listener (connected
/// before any member): every member joins, and the host is not held up by them.
fn members_join_past(a: &[Assignment], strangers: impl FnOnce() -> Vec<TcpStream>) {
    let join_by = Instant::now() + Duration::from_secs(20);
    std::thread::scope(|s| {
        let host = s.spawn(|| rendezvous::join(&a[0], &key(), join_by));
        let _waiting = strangers();
        let members: Vec<_> = a[1..]
            .iter()
            .map(|m| s.spawn(move || rendezvous::join(m, &key(), join_by)))
            .collect();
        for m in members {
            m.join()
                .expect("member thread")
                .expect("a member is not locked out");
        }
        let host = host.join().expect("host thread").expect("the group goes");
        assert!(
            host.joined.join_seconds < rendezvous::HELLO_WAIT.as_secs_f64(),
            "the strangers held the host up for {} s",
            host.joined.join_seconds
        );
    });
}

#[test]
fn eighty_silent_connections_from_one_address_do_not_lock_the_members_out() {
    let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(30));
    // Before: 64 silent connections filled every greeting slot for 5 s and each member's
    // connection was closed unread, so the members failed at once.
    members_join_past(&a, || {
        let mut silent = vec![listening(&a[0])];
        silent.extend((0..79).map(|_| connect_from(Ipv4Addr::LOCALHOST, &a[0].rendezvous)));
        silent
    });
}

#[test]
fn a_hundred_silent_strangers_on_a_hundred_addresses_do_not_lock_the_members_out() {
    let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(30));
    members_join_past(&a, || {
        let mut silent = vec![listening(&a[0])];
        silent.extend(
            (2..102u8).map(|i| connect_from(Ipv4Addr::new(127, 0, 0, i), &a[0].rendezvous)),
        );
        silent
    });
}

/// Sends one byte of a line that never ends, every few milliseconds, until the other side
/// closes the connection: how long it kept it (None: still open after `limit`). The short read
/// between bytes is both the pace and the wait on the close.
fn drip_until_closed(mut s: TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(20)))
        .expect("read timeout");
    let mut buf = [0u8; 512];
    while start.elapsed() < limit {
        if s.write_all(b"{").is_err() {
            return Some(start.elapsed());
        }
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

/// Reads the host's challenge on `s` (a raw connection to a listener of the fabric).
fn read_challenge(s: &TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("a challenge");
    let c: Challenge = serde_json::from_str(&line).expect("a challenge line");
    c.challenge
}

#[test]
fn a_slow_loris_is_cut_at_its_greeting_deadline_and_the_group_goes_on() {
    let limits = Limits {
        greet: Duration::from_millis(400),
        ..Default::default()
    };
    let a = assignments(FabricKind::Tcp, 2, Duration::from_secs(30));
    let join_by = Instant::now() + Duration::from_secs(20);
    std::thread::scope(|s| {
        let host = s.spawn(|| rendezvous::join_with(&a[0], &key(), join_by, &limits));
        let loris = listening(&a[0]);
        read_challenge(&loris);
        let kept = drip_until_closed(loris, Duration::from_secs(10)).expect("cut");
        assert!(
            kept <= limits.greet + Duration::from_secs(1),
            "a slow-loris kept its greeting {kept:?}, its limit is {:?}",
            limits.greet
        );
        let member = rendezvous::join_with(&a[1], &key(), join_by, &limits);
        member.expect("the member joins");
        host.join().expect("host thread").expect("the group goes");
    });
}

#[test]
fn a_member_whose_connection_is_closed_unanswered_joins_again() {
    let a = assignments(FabricKind::Tcp, 2, Duration::from_secs(30));
    let join_by = Instant::now() + Duration::from_secs(20);
    // Something else holds the port first (an earlier round's listener, a cut greeting): it
    // takes the member's connection and closes it without a word.
    let early = TcpListener::bind(&a[0].rendezvous).expect("bind the port first");
    std::thread::scope(|s| {
        let member = s.spawn(|| rendezvous::join(&a[1], &key(), join_by));
        let (first, _) = early.accept().expect("the member's first connection");
        drop(first);
        drop(early);
        let host = s.spawn(|| rendezvous::join(&a[0], &key(), join_by));
        let m = member.join().expect("member thread");
        assert!(matches!(m.expect("joined again").link, Link::Member { .. }));
        host.join().expect("host thread").expect("the group goes");
    });
}

fn tcp_settings(secs: u64) -> FabricTcp {
    serde_json::from_value(serde_json::json!({"streams": 2, "duration": format!("{secs}s")}))
        .expect("TCP settings")
}

/// A stranger's data stream tag on a raw connection to `a`'s host: the host's answer (None: the
/// connection closed without one).
fn stranger_tag(s: &TcpStream, tag: impl FnOnce(&str) -> Option<Greeting>) -> Option<Answer> {
    let challenge = read_challenge(s);
    let mut w = s;
    if let Some(tag) = tag(&challenge) {
        let mut line = serde_json::to_vec(&tag).expect("json");
        line.push(b'\n');
        w.write_all(&line).expect("send the tag");
    }
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).ok()?;
    serde_json::from_str(&answer).ok()
}

fn data(a: &Assignment, node: &str, group: i32, mac: Option<String>) -> Greeting {
    Greeting::Data {
        node: node.into(),
        round: a.round,
        group,
        stream: 0,
        mac,
    }
}

fn mac_of(auth: &Auth, a: &Assignment, node: &str, group: i32, challenge: &str) -> Option<String> {
    let id = DataId {
        node,
        round: a.round,
        group,
        stream: 0,
    };
    auth.data_mac(challenge, id)
}

#[test]
fn strangers_in_the_tcp_measurement_are_refused_and_the_pair_still_measures() {
    let limits = Limits {
        greet: Duration::from_secs(1),
        ..Default::default()
    };
    let a = assignments(FabricKind::Tcp, 2, Duration::from_secs(30));
    let mut groups = join_all(&a, Instant::now() + Duration::from_secs(10), &limits);
    // They wait on the host's listener before the member's streams: each is greeted first.
    let strangers: Vec<TcpStream> = (0..5).map(|_| listening(&a[0])).collect();
    let other_key = Auth::from_bytes(&[7; 32]);
    let settings = tcp_settings(1);
    std::thread::scope(|s| {
        let (host_group, member_group) = groups.split_at_mut(1);
        let host_link = &mut host_group[0].link;
        let host = s.spawn(|| tcp::run_with(&a[0], &settings, host_link, &key(), &limits));
        // Each stranger has its answer (or its end) before the member opens its streams.
        let n1 = a[1].nodes[1].clone();
        let answers: Vec<Option<Answer>> = vec![
            stranger_tag(&strangers[0], |_| Some(data(&a[1], &n1, a[1].group, None))),
            stranger_tag(&strangers[1], |c| {
                let mac = mac_of(&other_key, &a[1], &n1, a[1].group, c);
                Some(data(&a[1], &n1, a[1].group, mac))
            }),
            stranger_tag(&strangers[2], |c| {
                let mac = mac_of(&key(), &a[1], &n1, a[1].group + 1, c);
                Some(data(&a[1], &n1, a[1].group + 1, mac))
            }),
            stranger_tag(&strangers[3], |c| {
                let mac = mac_of(&key(), &a[1], "n7", a[1].group, c);
                Some(data(&a[1], "n7", a[1].group, mac))
            }),
            stranger_tag(&strangers[4], |_| None),
        ];
        let member_link = &mut member_group[0].link;
        let member = s.spawn(|| tcp::run_with(&a[1], &settings, member_link, &key(), &limits));
        let why = |i: usize| match &answers[i] {
            Some(Answer::Reject { why }) | Some(Answer::OtherRound { why }) => why.clone(),
            other => panic!("stranger {i} was answered {other:?}"),
        };
        assert!(why(0).contains("no MAC"), "{}", why(0));
        assert!(why(1).contains("MAC is wrong"), "{}", why(1));
        assert!(
            matches!(answers[2], Some(Answer::OtherRound { .. })) && why(2).contains("group 1"),
            "{:?}",
            answers[2]
        );
        assert!(why(3).contains("not the member of this pair"), "{}", why(3));
        assert_eq!(answers[4], None, "a silent one is closed at its deadline");
        for (side, r) in [("host", host), ("member", member)] {
            let f = r.join().expect("thread").expect("the pair measures");
            assert!(f.send_gbps > 0.0 && f.recv_gbps > 0.0, "{side}: {f:?}");
        }
    });
}

#[test]
fn a_member_that_stops_mid_measurement_is_dropped_at_the_stall_limit_not_the_round_deadline() {
    let limits = Limits {
        stall: Duration::from_millis(500),
        ..Default::default()
    };
    // The round would last a minute more.
    let a = assignments(FabricKind::Tcp, 2, Duration::from_secs(60));
    let mut groups = join_all(&a, Instant::now() + Duration::from_secs(10), &limits);
    let settings = tcp_settings(1);
    let start = Instant::now();
    std::thread::scope(|s| {
        let host =
            s.spawn(|| tcp::run_with(&a[0], &settings, &mut groups[0].link, &key(), &limits));
        // The member opens its streams, proves the key, then sends and reads nothing.
        let quiet = data_streams::open(&a[1], &key(), 2, &limits).expect("streams open");
        let e = host
            .join()
            .expect("host thread")
            .expect_err("a stalled member");
        assert_eq!(e.kind, FabricErrorKind::Peer, "{e:?}");
        assert!(e.message.contains("timed out"), "{}", e.message);
        drop(quiet);
    });
    let took = start.elapsed();
    assert!(
        took < limits.stall + Duration::from_secs(3),
        "dropped after {took:?}, the stall limit is {:?}",
        limits.stall
    );
}
