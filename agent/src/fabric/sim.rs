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
//!
//! Like the real group's sweep, each member's NCCL gets a run directory under the temporary
//! directory with the simulated library's `libnccl.so` link ([`crate::nccl::sim`]), so a
//! temporary directory that cannot hold one fails the simulated fabric as it does the real
//! one (this node's NCCL could not start). The exchange itself stays in the agent's process:
//! it runs over the rendezvous connections the agent holds, where the real NCCL bootstraps
//! its own from the child.

use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricError, FabricNccl};
use serde::{Deserialize, Serialize};

use super::rendezvous::{Control, Link, NetError, local, peer};
use super::{Assignment, NcclFigures, NcclGroup};
use crate::backend::sim::SimModel;
pub use crate::backend::sim::net::{NetFault, SimNet, default_net_gbps};
use crate::nccl::library;
use crate::worker::run_dir::RunDir;

/// Bus bandwidth of an all-reduce as a fraction of the slowest member's network bandwidth.
pub const EFFICIENCY: f64 = 0.95;
/// The exit code of an agent that vanishes on purpose (`netfault=vanish`).
pub const VANISH_EXIT_CODE: i32 = 86;

/// The simulated NCCL group of one node.
#[derive(Debug, Clone)]
pub struct SimNccl {
    pub net_gbps: f64,
    pub fault: Option<NetFault>,
    /// The node's fabric as its spec string set it (its rail, if one is bad).
    pub net: SimNet,
}

impl SimNccl {
    pub fn new(model: SimModel, net: SimNet) -> Self {
        Self {
            net_gbps: net.gbps.unwrap_or_else(|| default_net_gbps(model)),
            fault: net.fault,
            net,
        }
    }

    /// This node's bandwidth for a group run with `env` (its `NCCL_IB_HCA`, a rail).
    fn gbps_with(&self, env: &[(String, String)]) -> f64 {
        let hca = env
            .iter()
            .find(|(name, _)| name == "NCCL_IB_HCA")
            .map(|(_, v)| v.as_str());
        self.net.gbps_on(hca, self.net_gbps)
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

impl NcclGroup for SimNccl {
    fn run(
        &self,
        a: &Assignment,
        _settings: &FabricNccl,
        env: &[(String, String)],
        link: &mut Link,
    ) -> Result<NcclFigures, FabricError> {
        let start = Instant::now();
        // Held to the end of the round, as the real group's sweep process holds its own.
        let setup = self.setup();
        let failed = setup.as_ref().err().map(String::as_str);
        let bus = match link {
            Link::Host { members, .. } => self.host(a, members, self.gbps_with(env), failed),
            Link::Member { host } => self.member(a, host, self.gbps_with(env), failed),
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
    /// This node's NCCL as the real group's sweep process gets it: a run directory under the
    /// temporary directory with the simulated library's `libnccl.so` link (removed when
    /// dropped); else why NCCL could not start here (`netfault=local`, or no run directory).
    fn setup(&self) -> Result<RunDir, String> {
        if self.fault == Some(NetFault::Local) {
            return Err(LOCAL_FAULT.into());
        }
        let dir = RunDir::create("gpuval-fabric-nccl").map_err(|e| e.to_string())?;
        library::make_link(&crate::nccl::sim::library(), dir.path()).map_err(|e| e.to_string())?;
        Ok(dir)
    }

    fn host(
        &self,
        a: &Assignment,
        members: &mut [Control],
        gbps: f64,
        failed: Option<&str>,
    ) -> Result<f64, FabricError> {
        let mut min = gbps;
        let mut broken: Option<FabricError> = failed.map(|why| local(why.to_string()));
        for (i, ctl) in members.iter_mut().enumerate() {
            let node = a.nodes.get(i + 1).map_or("?", String::as_str);
            match ctl.recv::<SimMsg>(a.deadline) {
                Ok(SimMsg::Net { gbps }) => min = min.min(gbps),
                Ok(SimMsg::Failed { why }) => {
                    broken.get_or_insert_with(|| {
                        peer(format!("{PEER_EXITED} (simulated: member {node}: {why})"))
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

    fn member(
        &self,
        a: &Assignment,
        host: &mut Control,
        gbps: f64,
        failed: Option<&str>,
    ) -> Result<f64, FabricError> {
        let host_name = a.nodes.first().map_or("?", String::as_str);
        let talk = |e: NetError| peer(format!("simulated NCCL with host {host_name}: {e}"));
        if let Some(why) = failed {
            let why = why.to_string();
            // The host learns at once and aborts the others; this node's failure stands anyway.
            let _ = host.send(&SimMsg::Failed { why: why.clone() }, a.deadline);
            return Err(local(why));
        }
        host.send(&SimMsg::Net { gbps }, a.deadline).map_err(talk)?;
        match host.recv::<SimMsg>(a.deadline).map_err(talk)? {
            SimMsg::Bus { gbps } => Ok(gbps),
            SimMsg::Abort { why } => Err(peer(format!(
                "{PEER_EXITED} (simulated: host {host_name} stopped the collective: {why})"
            ))),
            other => Err(talk(
                host.protocol(format!("expected the bus bandwidth, got {other:?}")),
            )),
        }
    }
}
