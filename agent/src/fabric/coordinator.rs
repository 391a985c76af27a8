//! `gpuval-agent fabric`: the fabric test outside Kubernetes. Every rank of a Slurm or torchrun
//! launch ([`super::launch`]) runs this. Rank 0 listens on the control port; every other rank
//! connects and registers (its node name, and its address as rank 0 sees it). Rank 0 then plans
//! rounds with the same planner as the operator ([`gpuval_fabric::next`]): it sends each rank its
//! groups of the round (the rendezvous of group `g` is its first member's address and port
//! `control port + 1 + 2g`), runs its own, collects every rank's outcomes, and goes on until the
//! planner concludes. Rank 0 prints the table and writes the JSON report; every rank exits 0 when
//! the fabric passed, 1 when it failed, 2 when the test could not run.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricKind, FabricOutcome, FabricSpec};
use gpuval_fabric::{Conclusion, Decision, History, NodeFabric, Round, Settings};
use serde::{Deserialize, Serialize};

use super::greeting::{self, Limits};
use super::group::run_round_blocking;
use super::launch::Launch;
use super::member_key::Auth;
use super::rendezvous::{Control, NetError, connect_until};
use super::{Assignment, NcclGroup};

pub mod report;
pub mod settings;

pub use settings::FabricArgs;

/// Exit codes of every rank.
pub const PASSED: u8 = 0;
pub const FAILED: u8 = 1;
pub const COULD_NOT_RUN: u8 = 2;

/// Slack after a round's timeout for the last outcomes to arrive.
const GRACE: Duration = Duration::from_secs(5);
/// The longest a registration's first line may take once connected.
const REGISTER_LINE: Duration = Duration::from_secs(5);

/// How this rank takes part.
pub struct Options {
    pub launch: Launch,
    pub node: String,
    pub spec: FabricSpec,
    /// How long rank 0 waits for every rank to register (and ranks try to reach it).
    pub register_timeout: Duration,
    pub output: Option<PathBuf>,
    /// The NCCL figures are simulated (tests and demos only).
    pub simulated: bool,
}

/// Messages from rank 0.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum ToRank {
    /// This rank's groups of a round, in id order, each with this rank's place in it.
    Round {
        round: i32,
        timeout_seconds: f64,
        groups: Vec<WireGroup>,
    },
    /// The test is over.
    Done { passed: bool, message: String },
    /// The test cannot run.
    Abort { why: String },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireGroup {
    id: i32,
    kind: FabricKind,
    nodes: Vec<String>,
    rendezvous: String,
    rank: usize,
}

/// Messages to rank 0.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum ToCoordinator {
    Register {
        rank: usize,
        node: String,
    },
    Outcomes {
        round: i32,
        outcomes: Vec<FabricOutcome>,
    },
}

/// A failure that stops the test (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("{0}")]
    Net(#[from] NetError),
    #[error("{0}")]
    Setup(String),
}

/// Runs this rank's part; the exit code.
pub fn run(opts: &Options, nccl: &dyn NcclGroup) -> u8 {
    // Outside Kubernetes a launcher may give every rank the same key file; without one the
    // rendezvous is open (the host logs it).
    let key_file = std::env::var_os(gpuval_crds::agent_env::FABRIC_KEY_FILE);
    let key_file = key_file.as_deref().map(std::path::Path::new);
    let result = match super::member_key::from_env(key_file, false) {
        Err(e) => Err(CoordinatorError::Setup(e.to_string())),
        Ok(auth) if opts.launch.rank == 0 => coordinate(opts, nccl, &auth),
        Ok(auth) => follow(opts, nccl, &auth),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: fabric test could not run: {e}");
            COULD_NOT_RUN
        }
    }
}

/// One registered rank, as rank 0 sees it.
struct Rank {
    node: String,
    ip: IpAddr,
    /// None for rank 0 itself, and for ranks that left.
    ctl: Option<Control>,
}

fn round_timeout(spec: &FabricSpec) -> Duration {
    spec.round_timeout_or_default().as_std()
}

/// Rank 0: registration, the rounds, the verdict.
fn coordinate(opts: &Options, nccl: &dyn NcclGroup, auth: &Auth) -> Result<u8, CoordinatorError> {
    let port = opts.launch.port;
    let listener = TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
        CoordinatorError::Setup(format!(
            "rank 0 cannot listen on port {port}: {e} (pick another with --port or MASTER_PORT)"
        ))
    })?;
    let mut ranks = register(&listener, opts)?;
    let candidates: Vec<String> = ranks.iter().map(|r| r.node.clone()).collect();
    let settings = Settings::from_spec(&opts.spec);
    let mut rounds: Vec<Round> = Vec::new();
    let mut outcomes: BTreeMap<String, Vec<FabricOutcome>> = BTreeMap::new();
    let mut gone: BTreeSet<String> = BTreeSet::new();
    let mut expired = false;
    let conclusion = loop {
        let history = History {
            rounds: &rounds,
            outcomes: &outcomes,
            gone: &gone,
            last_round_expired: expired,
        };
        match gpuval_fabric::next(&candidates, &settings, &history) {
            Decision::Plan(round) => {
                rounds.push(round);
                let number = rounds.len() as i32;
                let plan = &rounds[rounds.len() - 1];
                eprintln!(
                    "fabric round {number} ({}): {} group(s)",
                    plan.purpose.as_str(),
                    plan.groups.len()
                );
                expired = run_round(
                    opts,
                    (nccl, auth),
                    &mut ranks,
                    number,
                    plan,
                    &mut outcomes,
                    &mut gone,
                );
            }
            // Every rank still present reported, or the round is marked expired: a wait here
            // means an outcome went missing; the round counts as expired once.
            Decision::Wait { .. } if !expired => expired = true,
            Decision::Wait { awaited } => {
                let why = format!("the planner still awaits {awaited} outcome(s) after the round");
                abort_all(&mut ranks, &why);
                return Err(CoordinatorError::Setup(why));
            }
            Decision::Done(c) => break c,
        }
    };
    finish(opts, &mut ranks, &rounds, &outcomes, &conclusion)
}

/// A rank's registration as rank 0 greets it: the rank, and the address rank 0 was reached at.
type Registered = (Rank, Option<IpAddr>);

/// Reads the registration line of one connection to rank 0's control port (on a thread of its
/// own, by `by`): the rank's slot and registration, or None (logged).
fn registration(
    stream: TcpStream,
    addr: SocketAddr,
    by: Instant,
    world: usize,
) -> Option<(usize, Registered)> {
    let local_ip = stream.local_addr().map(|a| a.ip()).ok();
    let mut ctl = Control::new(stream, addr.to_string()).ok()?;
    match ctl.recv::<ToCoordinator>(by) {
        Ok(ToCoordinator::Register { rank, node }) if rank > 0 && rank < world => {
            let r = Rank {
                node,
                ip: addr.ip(),
                ctl: Some(ctl),
            };
            Some((rank, (r, local_ip)))
        }
        other => {
            tracing::warn!(peer = %addr, ?other, "not a registration of a rank, closed");
            None
        }
    }
}

/// Accepts every other rank's registration before the registration deadline, each connection
/// read on a thread of its own within [`REGISTER_LINE`] and the listener's bounds
/// ([`greeting`](super::greeting)), so silent connections hold up no rank.
fn register(listener: &TcpListener, opts: &Options) -> Result<Vec<Rank>, CoordinatorError> {
    let world = opts.launch.world_size;
    let deadline = Instant::now() + opts.register_timeout;
    let limits = Limits {
        greet: REGISTER_LINE,
        ..Limits::for_members(world)
    };
    let greet = Arc::new(move |s: TcpStream, addr: SocketAddr, by: Instant| {
        registration(s, addr, by, world)
    });
    let slots = greeting::gather(listener, (1, world), deadline, &limits, greet)
        .map_err(CoordinatorError::Setup)?;
    let own_ip = slots.iter().flatten().find_map(|(_, local)| *local);
    let mut slots: Vec<Option<Rank>> = slots.into_iter().map(|s| s.map(|(r, _)| r)).collect();
    let own_ip = own_ip
        .or_else(|| opts.launch.coordinator.parse().ok())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]));
    slots[0] = Some(Rank {
        node: opts.node.clone(),
        ip: own_ip,
        ctl: None,
    });
    let missing: Vec<String> = (1..world)
        .filter(|r| slots[*r].is_none())
        .map(|r| r.to_string())
        .collect();
    let mut ranks: Vec<Rank> = slots.into_iter().flatten().collect();
    if !missing.is_empty() {
        let why = format!(
            "rank(s) {} did not register with rank 0 on port {} within {:?}",
            missing.join(", "),
            opts.launch.port,
            opts.register_timeout
        );
        abort_all(&mut ranks, &why);
        return Err(CoordinatorError::Setup(why));
    }
    let mut names = BTreeSet::new();
    if let Some(dup) = ranks.iter().find(|r| !names.insert(r.node.clone())) {
        let why = format!(
            "node name {:?} is used by two ranks: give each rank its own with --node-name",
            dup.node
        );
        abort_all(&mut ranks, &why);
        return Err(CoordinatorError::Setup(why));
    }
    Ok(ranks)
}

fn abort_all(ranks: &mut [Rank], why: &str) {
    let deadline = Instant::now() + REGISTER_LINE;
    for r in ranks.iter_mut() {
        if let Some(ctl) = r.ctl.as_mut() {
            let _ = ctl.send(&ToRank::Abort { why: why.into() }, deadline);
        }
    }
}

/// Where group `id` meets: its first member's address and a port of its own.
fn rendezvous(ip: IpAddr, control_port: u16, id: usize) -> String {
    let port = gpuval_crds::fabric::group_port(control_port.saturating_add(1), id);
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

/// The groups of a round for one node, with its rank in each.
fn groups_of(node: &str, plan: &Round, ranks: &[Rank], port: u16) -> Vec<WireGroup> {
    let ip_of = |n: &str| ranks.iter().find(|r| r.node == n).map(|r| r.ip);
    plan.groups
        .iter()
        .enumerate()
        .filter_map(|(id, g)| {
            let rank = g.nodes.iter().position(|n| n == node)?;
            let host_ip = ip_of(&g.nodes[0])?;
            Some(WireGroup {
                id: id as i32,
                kind: g.kind,
                nodes: g.nodes.clone(),
                rendezvous: rendezvous(host_ip, port, id),
                rank,
            })
        })
        .collect()
}

fn assignments(round: i32, groups: Vec<WireGroup>, deadline: Instant) -> Vec<Assignment> {
    groups
        .into_iter()
        .map(|g| Assignment {
            round,
            group: g.id,
            kind: g.kind,
            nodes: g.nodes,
            rank: g.rank,
            rendezvous: g.rendezvous,
            gpus: Vec::new(),
            deadline,
            rail: None,
        })
        .collect()
}

/// Sends the round to every rank, runs rank 0's groups, collects the outcomes. True when some
/// rank still present did not report in time.
fn run_round(
    opts: &Options,
    (nccl, auth): (&dyn NcclGroup, &Auth),
    ranks: &mut [Rank],
    number: i32,
    plan: &Round,
    outcomes: &mut BTreeMap<String, Vec<FabricOutcome>>,
    gone: &mut BTreeSet<String>,
) -> bool {
    let timeout = round_timeout(&opts.spec);
    let deadline = Instant::now() + timeout;
    let port = opts.launch.port;
    let per_rank: Vec<Vec<WireGroup>> = ranks
        .iter()
        .map(|r| groups_of(&r.node, plan, ranks, port))
        .collect();
    let mut per_rank = per_rank.into_iter();
    // Rank 0 is this process: its groups are run here.
    let own = per_rank.next().unwrap_or_default();
    for (r, groups) in ranks.iter_mut().skip(1).zip(per_rank) {
        let Some(ctl) = r.ctl.as_mut() else {
            continue;
        };
        let msg = ToRank::Round {
            round: number,
            timeout_seconds: timeout.as_secs_f64(),
            groups,
        };
        if let Err(e) = ctl.send(&msg, deadline) {
            tracing::warn!(node = %r.node, error = %e, "rank left: round not delivered");
            r.ctl = None;
            gone.insert(r.node.clone());
        }
    }
    let own_assignments = assignments(number, own, deadline);
    let mine = std::thread::scope(|s| {
        let worker = s.spawn(|| run_round_blocking(own_assignments, &opts.spec, nccl, auth));
        collect(ranks, number, deadline + GRACE, outcomes, gone);
        worker.join().unwrap_or_default()
    });
    outcomes.entry(opts.node.clone()).or_default().extend(mine);
    ranks
        .iter()
        .skip(1)
        .any(|r| r.ctl.is_some() && !reported(outcomes, &r.node, number))
}

fn reported(outcomes: &BTreeMap<String, Vec<FabricOutcome>>, node: &str, round: i32) -> bool {
    outcomes
        .get(node)
        .is_some_and(|v| v.iter().any(|o| o.round == round))
}

/// Reads each rank's outcomes of round `number` until `deadline`; a rank whose connection
/// breaks is gone.
fn collect(
    ranks: &mut [Rank],
    number: i32,
    deadline: Instant,
    outcomes: &mut BTreeMap<String, Vec<FabricOutcome>>,
    gone: &mut BTreeSet<String>,
) {
    for r in ranks.iter_mut() {
        let Some(ctl) = r.ctl.as_mut() else { continue };
        loop {
            match ctl.recv::<ToCoordinator>(deadline) {
                Ok(ToCoordinator::Outcomes { round, outcomes: o }) if round == number => {
                    outcomes.entry(r.node.clone()).or_default().extend(o);
                    break;
                }
                Ok(other) => tracing::warn!(node = %r.node, ?other, "stale message skipped"),
                Err(NetError::Timeout { .. }) => {
                    tracing::warn!(node = %r.node, round = number, "no outcomes in time");
                    break;
                }
                Err(e) => {
                    tracing::warn!(node = %r.node, error = %e, "rank left during the round");
                    r.ctl = None;
                    gone.insert(r.node.clone());
                    break;
                }
            }
        }
    }
}

/// Tells every rank the verdict, prints the table, writes the report.
fn finish(
    opts: &Options,
    ranks: &mut [Rank],
    rounds: &[Round],
    outcomes: &BTreeMap<String, Vec<FabricOutcome>>,
    c: &Conclusion,
) -> Result<u8, CoordinatorError> {
    let deadline = Instant::now() + REGISTER_LINE;
    for r in ranks.iter_mut() {
        if let Some(ctl) = r.ctl.as_mut() {
            let done = ToRank::Done {
                passed: c.passed,
                message: c.message.clone(),
            };
            if let Err(e) = ctl.send(&done, deadline) {
                tracing::warn!(node = %r.node, error = %e, "the verdict did not reach this rank");
            }
        }
    }
    let nodes: Vec<(String, String)> = ranks
        .iter()
        .map(|r| (r.node.clone(), r.ip.to_string()))
        .collect();
    let rep = report::Report::new(opts, &nodes, rounds, outcomes, c);
    print!("{}", report::table(&rep));
    if let Some(path) = &opts.output {
        let json = serde_json::to_string_pretty(&rep)
            .map_err(|e| CoordinatorError::Setup(format!("serialise the report: {e}")))?;
        std::fs::write(path, json).map_err(|e| {
            CoordinatorError::Setup(format!("write the report to {}: {e}", path.display()))
        })?;
        eprintln!("report written to {}", path.display());
    }
    Ok(if c.passed { PASSED } else { FAILED })
}

/// Every other rank: register, then run the rounds rank 0 sends until it says the test is over.
fn follow(opts: &Options, nccl: &dyn NcclGroup, auth: &Auth) -> Result<u8, CoordinatorError> {
    let addr = opts.launch.coordinator_addr();
    let stream = connect_until(
        &addr,
        "register with rank 0 at",
        Instant::now() + opts.register_timeout,
    )?;
    let mut ctl = Control::new(stream, addr)?;
    let register = ToCoordinator::Register {
        rank: opts.launch.rank,
        node: opts.node.clone(),
    };
    ctl.send(&register, Instant::now() + REGISTER_LINE)?;
    // Between rounds rank 0 waits for the slowest rank of a round, at most its timeout.
    let quiet = opts.register_timeout + round_timeout(&opts.spec) * 2 + GRACE * 2;
    loop {
        match ctl.recv::<ToRank>(Instant::now() + quiet)? {
            ToRank::Round {
                round,
                timeout_seconds,
                groups,
            } => {
                let timeout = Duration::try_from_secs_f64(timeout_seconds)
                    .unwrap_or_else(|_| round_timeout(&opts.spec));
                let deadline = Instant::now() + timeout;
                let outcomes = run_round_blocking(
                    assignments(round, groups, deadline),
                    &opts.spec,
                    nccl,
                    auth,
                );
                let msg = ToCoordinator::Outcomes { round, outcomes };
                ctl.send(&msg, deadline + GRACE)?;
            }
            ToRank::Done { passed, message } => {
                eprintln!(
                    "fabric test {}: {message}",
                    if passed { "passed" } else { "failed" }
                );
                return Ok(if passed { PASSED } else { FAILED });
            }
            ToRank::Abort { why } => return Err(CoordinatorError::Setup(format!("rank 0: {why}"))),
        }
    }
}

/// A node's verdict in words: (verdict, reason).
pub fn verdict_words(v: &NodeFabric) -> (&'static str, Option<String>) {
    match v {
        NodeFabric::Passed => ("Passed", None),
        NodeFabric::Failed(w) => ("Failed", Some(w.clone())),
        NodeFabric::Error(w) => ("Error", Some(w.clone())),
        NodeFabric::Suspect(w) => ("Suspect", Some(w.clone())),
        NodeFabric::Untested => ("Untested", None),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::TcpStream;

    use super::*;
    use crate::fabric::launch::Launcher;

    fn options(port: u16, world: usize) -> Options {
        Options {
            launch: Launch {
                launcher: Launcher::Torchrun,
                rank: 0,
                world_size: world,
                coordinator: "127.0.0.1".into(),
                port,
            },
            node: "node-0".into(),
            spec: FabricSpec::default(),
            register_timeout: Duration::from_secs(20),
            output: None,
            simulated: true,
        }
    }

    #[test]
    fn silent_connections_to_rank_0_hold_up_no_rank_s_registration() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = listener.local_addr().expect("address");
        // Before: each was read in turn for up to 5 s, so 70 of them kept the ranks out past
        // the registration deadline.
        let _silent: Vec<TcpStream> = (0..70)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        let start = Instant::now();
        let ranks = std::thread::scope(|s| {
            for rank in 1..3usize {
                s.spawn(move || {
                    let mut c = TcpStream::connect(addr).expect("connect");
                    let hello = ToCoordinator::Register {
                        rank,
                        node: format!("node-{rank}"),
                    };
                    let mut line = serde_json::to_vec(&hello).expect("json");
                    line.push(b'\n');
                    c.write_all(&line).expect("register");
                    // Held open until rank 0 is done with the registrations.
                    let mut buf = [0u8; 1];
                    let _ = std::io::Read::read(&mut c, &mut buf);
                });
            }
            let ranks = register(&listener, &options(addr.port(), 3)).expect("registered");
            // Dropped here, the connections close, and the ranks' threads end.
            ranks.into_iter().map(|r| r.node).collect::<Vec<String>>()
        });
        assert_eq!(ranks, ["node-0", "node-1", "node-2"]);
        assert!(
            start.elapsed() < REGISTER_LINE,
            "the silent connections held registration up for {:?}",
            start.elapsed()
        );
    }
}
