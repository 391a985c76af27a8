//! The simulated NCCL group (tests and demos only: its figures are not real). Its exchange is
//! real, over the rendezvous control channel: each member sends its node's simulated fabric
//! bandwidth to the host, the host answers with the group's minimum times [`EFFICIENCY`], and
//! every member reports that as its bus bandwidth, so one slow node drags its whole group.
//!
//! A node's simulated fabric comes from the simulator's spec string: `net=<GB/s>` (default by
//! model, [`default_net_gbps`]) and `netfault=local` (its NCCL cannot start; the others then
//! fail in NCCL's words for a peer that exited), `netfault=nojoin` (it never reaches a
//! rendezvous) or `netfault=vanish` (test-only: the agent process exits when it is assigned its
//! first fabric group, to test an agent lost mid-round).

use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricError, FabricNccl};
use serde::{Deserialize, Serialize};

use super::rendezvous::{Control, Link, NetError, local, peer};
use super::{Assignment, NcclFigures, NcclGroup};
use crate::backend::sim::SimModel;

/// Bus bandwidth of an all-reduce as a fraction of the slowest member's network bandwidth.
pub const EFFICIENCY: f64 = 0.95;
/// The exit code of an agent that vanishes on purpose (`netfault=vanish`).
pub const VANISH_EXIT_CODE: i32 = 86;

/// A planted fault of a node's fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetFault {
    /// This node's NCCL cannot start: a `Local` error before the collective.
    Local,
    /// Test only: the agent exits with [`VANISH_EXIT_CODE`] when assigned its first group.
    Vanish,
    /// This node never reaches its groups' rendezvous (nor hosts one): the host names it
    /// missing, the others wait for a rendezvous that never completes.
    NoJoin,
}

/// This node's simulated fabric, from the `net=` and `netfault=` keys of the spec string.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SimNet {
    /// `net=<GB/s>`: the node's network bandwidth (None: the model's default).
    pub gbps: Option<f64>,
    /// `netfault=local|vanish`.
    pub fault: Option<NetFault>,
}

impl SimNet {
    /// Reads one `net` or `netfault` value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "net" => {
                let v: f64 = value
                    .parse()
                    .map_err(|_| format!("{value:?} is not a bandwidth in GB/s"))?;
                if !(v.is_finite() && v > 0.0 && v <= 100_000.0) {
                    return Err(format!("net={value}: use a bandwidth above 0, in GB/s"));
                }
                self.gbps = Some(v);
            }
            "netfault" => {
                self.fault = Some(match value {
                    "local" => NetFault::Local,
                    "vanish" => NetFault::Vanish,
                    "nojoin" => NetFault::NoJoin,
                    _ => {
                        return Err(format!(
                            "unknown netfault {value:?}: use local, vanish or nojoin"
                        ));
                    }
                });
            }
            _ => return Err(format!("unknown key {key:?}")),
        }
        Ok(())
    }

    /// The `net=...,netfault=...` parts of a spec string (empty when nothing is set).
    pub fn spec_parts(&self) -> String {
        let mut parts = Vec::new();
        if let Some(g) = self.gbps {
            parts.push(format!(",net={g}"));
        }
        match self.fault {
            Some(NetFault::Local) => parts.push(",netfault=local".into()),
            Some(NetFault::Vanish) => parts.push(",netfault=vanish".into()),
            Some(NetFault::NoJoin) => parts.push(",netfault=nojoin".into()),
            None => {}
        }
        parts.concat()
    }
}

/// A healthy node's network bandwidth, GB/s: eight 400 Gb/s NICs on H100 and H200 nodes, eight
/// 200 Gb/s ones on A100 nodes.
pub fn default_net_gbps(model: SimModel) -> f64 {
    match model {
        SimModel::A100 => 200.0,
        SimModel::H100 | SimModel::H200 => 400.0,
    }
}

/// The simulated NCCL group of one node.
#[derive(Debug, Clone)]
pub struct SimNccl {
    pub net_gbps: f64,
    pub fault: Option<NetFault>,
}

impl SimNccl {
    pub fn new(model: SimModel, net: SimNet) -> Self {
        Self {
            net_gbps: net.gbps.unwrap_or_else(|| default_net_gbps(model)),
            fault: net.fault,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum SimMsg {
    /// A member's network bandwidth, GB/s.
    Net { gbps: f64 },
    /// A member's NCCL could not start.
    Failed { why: String },
    /// The host's answer: the group's bus bandwidth.
    Bus { gbps: f64 },
    /// The host's answer: the collective cannot run (a member failed, or the host did).
    Abort { why: String },
}

const LOCAL_FAULT: &str = "simulated: NCCL could not start on this node (netfault=local)";

/// What NCCL says on every surviving rank when a peer's process went away (seen on H100s).
const PEER_EXITED: &str = "ncclCommInitRank: remote process exited or there was a network error";

/// An error whose kind comes from its words, as the real engine's do (NCCL reports a peer's
/// exit as a system error: only the words tell it is not this node's).
fn as_nccl_says(message: String) -> FabricError {
    match gpuval_fabric::attribute::kind_of(&message) {
        Some(gpuval_crds::fabric::FabricErrorKind::Local) => local(message),
        _ => peer(message),
    }
}

impl NcclGroup for SimNccl {
    fn run(
        &self,
        a: &Assignment,
        _settings: &FabricNccl,
        _env: &[(String, String)],
        link: &mut Link,
    ) -> Result<NcclFigures, FabricError> {
        let start = Instant::now();
        let bus = match link {
            Link::Host { members, .. } => self.host(a, members),
            Link::Member { host } => self.member(a, host),
        }?;
        Ok(NcclFigures {
            bus_gbps: bus,
            seconds: start
                .elapsed()
                .as_secs_f64()
                .max(Duration::from_micros(1).as_secs_f64()),
        })
    }

    fn simulated(&self) -> bool {
        true
    }

    fn planted_vanish(&self) -> bool {
        self.fault == Some(NetFault::Vanish)
    }

    fn planted_nojoin(&self) -> bool {
        self.fault == Some(NetFault::NoJoin)
    }
}

impl SimNccl {
    fn host(&self, a: &Assignment, members: &mut [Control]) -> Result<f64, FabricError> {
        let mut min = self.net_gbps;
        let mut broken: Option<FabricError> = None;
        if self.fault == Some(NetFault::Local) {
            broken = Some(local(LOCAL_FAULT.into()));
        }
        for (i, ctl) in members.iter_mut().enumerate() {
            let node = a.nodes.get(i + 1).map_or("?", String::as_str);
            match ctl.recv::<SimMsg>(a.deadline) {
                Ok(SimMsg::Net { gbps }) => min = min.min(gbps),
                Ok(SimMsg::Failed { why }) => {
                    broken.get_or_insert_with(|| {
                        as_nccl_says(format!("{PEER_EXITED} (simulated: member {node}: {why})"))
                    });
                }
                Ok(other) => {
                    let e = ctl.protocol(format!("expected a bandwidth, got {other:?}"));
                    broken.get_or_insert_with(|| peer(format!("member {node}: {e}")));
                }
                Err(e) => {
                    broken.get_or_insert_with(|| peer(format!("member {node}: {e}")));
                }
            }
        }
        let answer = match &broken {
            Some(e) => SimMsg::Abort {
                why: e.message.clone(),
            },
            None => SimMsg::Bus {
                gbps: min * EFFICIENCY,
            },
        };
        for ctl in members.iter_mut() {
            // A member that cannot be told finds out by its own deadline.
            let _ = ctl.send(&answer, a.deadline);
        }
        match (broken, answer) {
            (Some(e), _) => Err(e),
            (None, SimMsg::Bus { gbps }) => Ok(gbps),
            (None, _) => Err(local("simulated NCCL: no answer computed".into())),
        }
    }

    fn member(&self, a: &Assignment, host: &mut Control) -> Result<f64, FabricError> {
        let host_name = a.nodes.first().map_or("?", String::as_str);
        let talk = |e: NetError| peer(format!("simulated NCCL with host {host_name}: {e}"));
        if self.fault == Some(NetFault::Local) {
            let why = LOCAL_FAULT.to_string();
            // The host learns at once and aborts the others; this node's failure stands anyway.
            let _ = host.send(&SimMsg::Failed { why: why.clone() }, a.deadline);
            return Err(local(why));
        }
        host.send(
            &SimMsg::Net {
                gbps: self.net_gbps,
            },
            a.deadline,
        )
        .map_err(talk)?;
        match host.recv::<SimMsg>(a.deadline).map_err(talk)? {
            SimMsg::Bus { gbps } => Ok(gbps),
            SimMsg::Abort { why } => Err(as_nccl_says(format!(
                "{PEER_EXITED} (simulated: host {host_name} stopped the collective: {why})"
            ))),
            other => Err(talk(
                host.protocol(format!("expected the bus bandwidth, got {other:?}")),
            )),
        }
    }
}
