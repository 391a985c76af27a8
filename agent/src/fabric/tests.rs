//! The group join, the TCP pair test and the simulated NCCL group, over real loopback sockets:
//! each member on a thread of its own, as separate agents would be.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricError, FabricErrorKind, FabricKind, FabricOutcome, FabricSpec};

use super::group::run_group;
use super::member_key::{Auth, HelloId};
use super::rendezvous::{self, Link};
use super::sim::{NetFault, SimNccl};
use super::{Assignment, NcclGroup};
use crate::backend::sim::SimSpec;

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("its address").port()
}

pub(super) fn assignments(kind: FabricKind, n: usize, deadline: Duration) -> Vec<Assignment> {
    let port = free_port();
    let nodes: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
    let deadline = Instant::now() + deadline;
    (0..n)
        .map(|rank| Assignment {
            round: 1,
            group: 0,
            kind,
            nodes: nodes.clone(),
            rank,
            rendezvous: format!("127.0.0.1:{port}"),
            gpus: Vec::new(),
            deadline,
            rail: None,
        })
        .collect()
}

/// The validation's key, as every member of these tests holds it.
pub(super) fn key() -> Auth {
    Auth::from_bytes(&[42; super::member_key::KEY_BYTES])
}

fn spec(tcp_secs: u64) -> FabricSpec {
    // As a validation would carry it, the API's defaults filled in.
    let value = serde_json::json!({
        "nccl": { "minBusBandwidthGbps": 350 },
        "tcp": { "streams": 2, "duration": format!("{tcp_secs}s") },
    });
    serde_json::from_value(value).expect("a valid fabric spec")
}

/// Runs every assignment's group on its own thread; the outcomes in rank order.
fn run_all(assigned: Vec<(Assignment, SimNccl)>, spec: &FabricSpec) -> Vec<FabricOutcome> {
    std::thread::scope(|s| {
        let handles: Vec<_> = assigned
            .iter()
            .map(|(a, n)| s.spawn(move || run_group(a, spec, n as &dyn NcclGroup, &key())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a member's thread"))
            .collect()
    })
}

fn healthy() -> SimNccl {
    SimNccl {
        net_gbps: 400.0,
        fault: None,
        net: Default::default(),
    }
}

#[test]
fn every_member_joins_and_the_host_says_go() {
    let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(20));
    let join_by = Instant::now() + Duration::from_secs(10);
    let groups: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = a
            .iter()
            .map(|a| s.spawn(move || rendezvous::join(a, &key(), join_by)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for (rank, g) in groups.iter().enumerate() {
        let g = g.as_ref().expect("joined");
        assert!(g.joined.join_seconds >= 0.0 && g.joined.join_seconds < 10.0);
        match (&g.link, rank) {
            (Link::Host { members, .. }, 0) => assert_eq!(members.len(), 2),
            (Link::Member { .. }, r) => assert!(r > 0),
            (l, r) => panic!("rank {r} got {l:?}"),
        }
    }
}

#[test]
fn a_member_that_never_joins_is_named_by_the_host_within_the_join_deadline() {
    let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(20));
    let started = Instant::now();
    let join_by = started + Duration::from_millis(1500);
    // n2 never comes.
    let (host, member) = std::thread::scope(|s| {
        let h = s.spawn(|| rendezvous::join(&a[0], &key(), join_by));
        let m = s.spawn(|| rendezvous::join(&a[1], &key(), join_by));
        (h.join().expect("host"), m.join().expect("member"))
    });
    let host = host.expect_err("the host cannot go");
    assert_eq!(host.missing, vec!["n2".to_string()]);
    assert_eq!(host.error.kind, FabricErrorKind::NeverJoined);
    let member = member.expect_err("the member is told to give up");
    assert_eq!(member.error.kind, FabricErrorKind::NeverJoined);
    assert!(
        member.error.message.contains("n2 never joined"),
        "{member:?}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "answered before the join deadline"
    );
    assert!(took < Duration::from_secs(8), "took {took:?}");
}

#[test]
fn a_member_whose_host_never_listens_fails_as_never_joined_by_its_join_deadline() {
    let a = assignments(FabricKind::Tcp, 2, Duration::from_secs(20));
    let started = Instant::now();
    let e = rendezvous::join(&a[1], &key(), started + Duration::from_millis(800))
        .expect_err("nobody listens");
    assert_eq!(e.error.kind, FabricErrorKind::NeverJoined);
    assert!(e.error.message.contains(&a[1].rendezvous), "{:?}", e.error);
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[test]
fn a_hello_for_another_round_is_refused() {
    let a = assignments(FabricKind::Tcp, 2, Duration::from_secs(10));
    let mut stale = a[1].clone();
    stale.round = 0;
    let join_by = Instant::now() + Duration::from_millis(1500);
    let (host, member) = std::thread::scope(|s| {
        let h = s.spawn(|| rendezvous::join(&a[0], &key(), join_by));
        let m = s.spawn(|| rendezvous::join(&stale, &key(), join_by));
        (h.join().expect("host"), m.join().expect("member"))
    });
    let m = member.expect_err("refused");
    assert!(m.error.message.contains("refused"), "{:?}", m.error);
    assert_eq!(host.expect_err("n1 never joined").missing, vec!["n1"]);
}

/// A connection to `a`'s rendezvous as a stranger (or a replaying eavesdropper) would make:
/// connected, greeted, and the host's challenge read.
fn greeted(a: &Assignment) -> (rendezvous::Control, String) {
    let by = Instant::now() + Duration::from_secs(10);
    let s = rendezvous::connect_until(&a.rendezvous, "connect to", by).expect("the host listens");
    let mut ctl = rendezvous::Control::new(s, a.rendezvous.clone()).expect("a connection");
    let rendezvous::Challenge { challenge } = ctl.recv(by).expect("the host's challenge");
    (ctl, challenge)
}

fn hello(a: &Assignment, mac: Option<String>) -> rendezvous::Greeting {
    rendezvous::Greeting::Hello {
        node: a.nodes[a.rank].clone(),
        rank: a.rank,
        round: a.round,
        group: a.group,
        mac,
    }
}

fn id(a: &Assignment) -> HelloId<'_> {
    HelloId {
        node: &a.nodes[a.rank],
        rank: a.rank,
        round: a.round,
        group: a.group,
    }
}

#[test]
fn a_member_with_the_key_joins_and_one_without_it_or_with_another_is_refused() {
    for (member_auth, why) in [
        (Auth::from_bytes(&[7; 32]), "MAC is wrong"),
        (Auth::open("a stranger"), "no MAC"),
    ] {
        let a = assignments(FabricKind::Tcp, 2, Duration::from_secs(10));
        let join_by = Instant::now() + Duration::from_millis(1500);
        let (host, member) = std::thread::scope(|s| {
            let h = s.spawn(|| rendezvous::join(&a[0], &key(), join_by));
            let m = s.spawn(|| rendezvous::join(&a[1], &member_auth, join_by));
            (h.join().expect("host"), m.join().expect("member"))
        });
        let m = member.expect_err("refused");
        assert!(
            m.error.message.contains("refused") && m.error.message.contains(why),
            "{why}: {:?}",
            m.error
        );
        assert_eq!(
            host.expect_err("n1 never proved itself").missing,
            vec!["n1"]
        );
    }
}

#[test]
fn a_mac_replayed_from_another_challenge_is_refused() {
    let a = assignments(FabricKind::Tcp, 2, Duration::from_secs(10));
    let join_by = Instant::now() + Duration::from_secs(8);
    std::thread::scope(|s| {
        let host = s.spawn(|| rendezvous::join(&a[0], &key(), join_by));
        // An eavesdropper saw n1's MAC for one challenge and offers it on its own connection.
        let (_seen, first) = greeted(&a[1]);
        let seen_mac = key().mac(&first, id(&a[1]));
        let (mut replay, second) = greeted(&a[1]);
        assert_ne!(first, second, "every connection gets a fresh challenge");
        replay.send(&hello(&a[1], seen_mac), join_by).expect("sent");
        match replay
            .recv::<rendezvous::Answer>(join_by)
            .expect("an answer")
        {
            rendezvous::Answer::Reject { why } => assert!(why.contains("MAC is wrong"), "{why}"),
            other => panic!("a replayed MAC was answered {other:?}"),
        }
        // The real n1 still joins.
        let member = rendezvous::join(&a[1], &key(), join_by).expect("n1 joins");
        assert!(matches!(member.link, Link::Member { .. }));
        host.join().expect("host").expect("the group goes");
    });
}

#[test]
fn a_silent_stranger_does_not_hold_up_the_group() {
    let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(30));
    let join_by = Instant::now() + Duration::from_secs(20);
    std::thread::scope(|s| {
        let host = s.spawn(|| rendezvous::join(&a[0], &key(), join_by));
        // Greeted first, it never says hello: the host must not wait out its hello deadline
        // before it reads the members.
        let (_stranger, _) = greeted(&a[1]);
        let members: Vec<_> = a[1..]
            .iter()
            .map(|m| s.spawn(move || rendezvous::join(m, &key(), join_by)))
            .collect();
        let host = host.join().expect("host").expect("the group goes");
        assert!(
            host.joined.join_seconds < rendezvous::HELLO_WAIT.as_secs_f64(),
            "the host waited {} s: the stranger held it up",
            host.joined.join_seconds
        );
        for m in members {
            m.join().expect("member").expect("joined");
        }
    });
}

#[test]
fn tcp_pair_measures_both_directions_and_the_round_trip_on_loopback() {
    let a = assignments(FabricKind::Tcp, 2, Duration::from_secs(30));
    let spec = spec(1);
    let out = run_all(a.into_iter().map(|a| (a, healthy())).collect(), &spec);
    for o in &out {
        assert_eq!(o.error, None, "{o:?}");
        assert!(!o.simulated, "TCP figures are real");
        let (s, r, l) = (
            o.send_gbps.expect("send"),
            o.recv_gbps.expect("recv"),
            o.latency_micros.expect("latency"),
        );
        assert!(s > 0.0 && r > 0.0 && l > 0.0, "{o:?}");
        assert!(o.seconds >= 2.0, "two directions of 1 s each: {o:?}");
    }
    // What one side sent, the other received: the same bytes over nearly the same time.
    let ratio = out[0].send_gbps.unwrap_or(0.0) / out[1].recv_gbps.unwrap_or(f64::NAN);
    assert!(
        (0.5..2.0).contains(&ratio),
        "host send vs member recv: {ratio}"
    );
}

#[test]
fn tcp_host_whose_partner_never_comes_reports_it_missing_before_the_deadline() {
    let a = assignments(FabricKind::Tcp, 2, Duration::from_secs(3));
    let deadline = a[0].deadline;
    let o = run_group(&a[0], &spec(1), &healthy(), &key());
    assert!(Instant::now() <= deadline + Duration::from_millis(200));
    assert_eq!(o.missing, vec!["n1".to_string()]);
    assert_eq!(o.error.map(|e| e.kind), Some(FabricErrorKind::NeverJoined));
    assert_eq!(o.send_gbps, None);
}

#[test]
fn simulated_nccl_reports_the_group_minimum_so_a_slow_node_drags_the_group() {
    let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(20));
    let nets = [400.0, 400.0, 100.0];
    let out = run_all(
        a.into_iter()
            .zip(nets)
            .map(|(a, net_gbps)| {
                (
                    a,
                    SimNccl {
                        net_gbps,
                        fault: None,
                        net: Default::default(),
                    },
                )
            })
            .collect(),
        &spec(1),
    );
    for o in &out {
        assert_eq!(o.error, None, "{o:?}");
        assert!(o.simulated);
        let bus = o.bus_gbps.expect("bus bandwidth");
        assert!((bus - 100.0 * super::sim::EFFICIENCY).abs() < 1e-9, "{bus}");
    }
    let a = assignments(FabricKind::Nccl, 2, Duration::from_secs(20));
    let out = run_all(a.into_iter().map(|a| (a, healthy())).collect(), &spec(1));
    assert!(
        out.iter()
            .all(|o| o.bus_gbps == Some(400.0 * super::sim::EFFICIENCY))
    );
}

#[test]
fn a_member_whose_nccl_cannot_start_fails_local_and_the_others_peer() {
    let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(20));
    let nets = [None, Some(NetFault::Local), None];
    let out = run_all(
        a.into_iter()
            .zip(nets)
            .map(|(a, fault)| {
                (
                    a,
                    SimNccl {
                        net_gbps: 400.0,
                        fault,
                        net: Default::default(),
                    },
                )
            })
            .collect(),
        &spec(1),
    );
    let kinds: Vec<_> = out
        .iter()
        .map(|o| o.error.as_ref().map(|e| e.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            Some(FabricErrorKind::Peer),
            Some(FabricErrorKind::Local),
            Some(FabricErrorKind::Peer)
        ]
    );
    assert!(
        out.iter()
            .all(|o| o.bus_gbps.is_none() && o.missing.is_empty())
    );
    assert!(
        out[2]
            .error
            .as_ref()
            .is_some_and(|e| e.message.contains("n1")),
        "{out:?}"
    );
}

#[test]
fn the_spec_string_takes_net_and_netfault() {
    let s: SimSpec = "model=H100,net=100,netfault=local".parse().expect("valid");
    assert_eq!(s.net.gbps, Some(100.0));
    assert_eq!(s.net.fault, Some(NetFault::Local));
    let again: SimSpec = s.to_string().parse().expect("its own rendering parses");
    assert_eq!(again, s);
    let n = SimNccl::new(s.model, SimSpec::default().net);
    assert_eq!(n.net_gbps, 400.0);
    assert!(!n.planted_vanish());
    let n: SimSpec = "netfault=nojoin".parse().expect("valid");
    assert_eq!(n.net.fault, Some(NetFault::NoJoin));
    assert!(n.to_string().contains("netfault=nojoin"), "{n}");
    let v: SimSpec = "netfault=vanish".parse().expect("valid");
    assert!(SimNccl::new(v.model, v.net).planted_vanish());
    for bad in ["net=0", "net=fast", "netfault=sometimes"] {
        assert!(bad.parse::<SimSpec>().is_err(), "{bad} accepted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_runs_each_nodes_groups_in_id_order() {
    // Two nodes, an NCCL group then a TCP pair on ports of their own; the assignments are given
    // out of order and each node's outcomes come back in id order.
    let nccl = assignments(FabricKind::Nccl, 2, Duration::from_secs(30));
    let mut tcp = assignments(FabricKind::Tcp, 2, Duration::from_secs(30));
    for a in &mut tcp {
        a.group = 1;
    }
    let spec = spec(1);
    let rounds = (0..2).map(|rank| {
        let mine = vec![tcp[rank].clone(), nccl[rank].clone()];
        let nccl: std::sync::Arc<dyn NcclGroup> = std::sync::Arc::new(healthy());
        super::group::run_round(mine, spec.clone(), nccl, key())
    });
    let all: Vec<Vec<FabricOutcome>> = futures_join(rounds.collect()).await;
    for outcomes in &all {
        let groups: Vec<i32> = outcomes.iter().map(|o| o.group).collect();
        assert_eq!(groups, vec![0, 1]);
        assert!(outcomes.iter().all(|o| o.error.is_none()), "{outcomes:?}");
        assert!(outcomes[0].bus_gbps.is_some() && outcomes[1].send_gbps.is_some());
    }
}

/// Awaits every future, each on a task of its own.
async fn futures_join<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("a round's task"));
    }
    out
}

#[test]
fn a_member_that_never_joins_is_named_missing_by_the_host_and_nobody_else_blames_themselves() {
    let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(4));
    let faults = [None, None, Some(NetFault::NoJoin)];
    let out = run_all(
        a.into_iter()
            .zip(faults)
            .map(|(a, fault)| {
                (
                    a,
                    SimNccl {
                        net_gbps: 400.0,
                        fault,
                        net: Default::default(),
                    },
                )
            })
            .collect(),
        &spec(1),
    );
    assert_eq!(out[0].missing, vec!["n2".to_string()], "{out:?}");
    for o in &out {
        let e = o.error.as_ref().expect("nobody measured");
        assert_eq!(e.kind, FabricErrorKind::NeverJoined, "{o:?}");
    }
    assert!(
        out[2]
            .error
            .as_ref()
            .is_some_and(|e| e.message.contains("nojoin"))
    );
}

#[test]
fn a_peer_that_could_not_start_reads_as_a_peer_exit_on_the_others() {
    let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(20));
    let faults = [None, None, Some(NetFault::Local)];
    let out = run_all(
        a.into_iter()
            .zip(faults)
            .map(|(a, fault)| {
                (
                    a,
                    SimNccl {
                        net_gbps: 400.0,
                        fault,
                        net: Default::default(),
                    },
                )
            })
            .collect(),
        &spec(1),
    );
    for o in &out[..2] {
        let e = o.error.as_ref().expect("aborted");
        assert!(e.message.contains("remote process exited"), "{e:?}");
        assert_eq!(e.kind, FabricErrorKind::Peer);
    }
}

/// Joins every member of `a` and runs `work(rank, stop)` through [`super::watch::together`].
fn run_watched(
    a: Vec<Assignment>,
    work: impl Fn(usize, &std::sync::atomic::AtomicBool) -> Result<(), FabricError> + Sync,
) -> Vec<Result<(), FabricError>> {
    let join_by = Instant::now() + Duration::from_secs(10);
    std::thread::scope(|s| {
        let hs: Vec<_> = a
            .iter()
            .map(|a| {
                let work = &work;
                s.spawn(move || {
                    let mut g = super::rendezvous::join(a, &key(), join_by).expect("joined");
                    super::watch::together(a, &mut g.link, |stop| work(a.rank, stop))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("member")).collect()
    })
}

/// A member's part that runs until it is stopped (or `limit`): Ok when never stopped.
fn until_stopped(stop: &std::sync::atomic::AtomicBool, limit: Instant) -> Result<(), FabricError> {
    while Instant::now() < limit {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(super::rendezvous::peer("stopped".into()));
        }
        std::thread::yield_now();
    }
    Ok(())
}

#[test]
fn the_group_stops_at_its_first_failure_instead_of_waiting_out_the_timeout() {
    let a = assignments(FabricKind::Nccl, 4, Duration::from_secs(60));
    let started = Instant::now();
    let limit = started + Duration::from_secs(30);
    let out = run_watched(a, |rank, stop| {
        if rank == 3 {
            Err(super::rendezvous::local(
                "ncclCommInitRank: invalid usage (NET/Socket : no socket interface found)".into(),
            ))
        } else {
            until_stopped(stop, limit)
        }
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stopped together in {:?}",
        started.elapsed()
    );
    let e3 = out[3].as_ref().expect_err("its own failure");
    assert_eq!(e3.kind, FabricErrorKind::Local);
    for o in &out[..3] {
        let e = o.as_ref().expect_err("stopped");
        assert_eq!(e.kind, FabricErrorKind::Aborted, "{e:?}");
        assert!(!e.kind.is_own());
        assert!(e.message.contains("member n3"), "{e:?}");
    }
}

#[test]
fn a_group_that_ends_well_is_not_held_by_its_watch() {
    let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(60));
    let started = Instant::now();
    let out = run_watched(a, |_, _| Ok(()));
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_group_on_a_rail_runs_with_that_hca_alone_and_only_that_rail_is_slow() {
    let mut bad = super::sim::SimNet::default();
    bad.set("railnet", "mlx5_1@40").expect("a railnet value");
    let node = |net: &super::sim::SimNet| SimNccl {
        net_gbps: 400.0,
        fault: None,
        net: net.clone(),
    };
    let bus_on = |rail: Option<&str>| {
        let a = assignments(FabricKind::Nccl, 3, Duration::from_secs(20));
        let nets = [
            super::sim::SimNet::default(),
            super::sim::SimNet::default(),
            bad.clone(),
        ];
        let out = run_all(
            a.into_iter()
                .zip(&nets)
                .map(|(mut a, net)| {
                    a.rail = rail.map(str::to_string);
                    (a, node(net))
                })
                .collect(),
            &spec(1),
        );
        out.iter().map(|o| o.bus_gbps).collect::<Vec<_>>()
    };
    let slow = Some(40.0 * super::sim::EFFICIENCY);
    let fast = Some(400.0 * super::sim::EFFICIENCY);
    assert_eq!(bus_on(Some("mlx5_1")), [slow; 3]);
    assert_eq!(bus_on(Some("mlx5_0")), [fast; 3]);
    assert_eq!(bus_on(None), [fast; 3]);
    // The rail replaces any NCCL_IB_HCA the spec sets, and asks for the exact name.
    let mut s = spec(1);
    s.env.push(gpuval_crds::fabric::NcclEnv {
        name: "NCCL_IB_HCA".into(),
        value: "mlx5".into(),
    });
    let mut a = assignments(FabricKind::Nccl, 1, Duration::from_secs(1)).remove(0);
    a.rail = Some("mlx5_1:1".into());
    let env = super::group_env(&s, &a);
    let hca: Vec<&str> = env
        .iter()
        .filter(|(n, _)| n == "NCCL_IB_HCA")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(hca, ["=mlx5_1:1"]);
    assert!(bad.set("railnet", "mlx5_1").is_err());
    assert_eq!(bad.spec_parts(), ",railnet=mlx5_1@40");
}
