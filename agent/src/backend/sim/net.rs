//! The simulated node's fabric between nodes, as its spec string sets it (`net=`, `netfault=`):
//! read here with the rest of the spec; the simulated NCCL group
//! (`crate::fabric::sim`) plays it.

use super::SimModel;

/// A planted fault of a node's fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetFault {
    /// This node's NCCL cannot start: a `Local` error before the collective.
    Local,
    /// Test only: the agent exits with `VANISH_EXIT_CODE` (`crate::fabric::sim`) when assigned its first group.
    Vanish,
    /// This node never reaches its groups' rendezvous (nor hosts one): the host names it
    /// missing, the others wait for a rendezvous that never completes.
    NoJoin,
}

/// This node's simulated fabric, from the `net=`, `netfault=` and `railnet=` keys of the spec
/// string.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SimNet {
    /// `net=<GB/s>`: the node's network bandwidth (None: the model's default).
    pub gbps: Option<f64>,
    /// `netfault=local|vanish`.
    pub fault: Option<NetFault>,
    /// `railnet=<hca>@<GB/s>`: the bandwidth of this node's groups on that rail alone (a bad
    /// NIC or cable), when NCCL is given `NCCL_IB_HCA==<hca>`.
    pub rail: Option<(String, f64)>,
}

impl SimNet {
    /// The bandwidth of a group run with `NCCL_IB_HCA` = `hca` (None: every HCA).
    pub fn gbps_on(&self, hca: Option<&str>, default: f64) -> f64 {
        let all = self.gbps.unwrap_or(default);
        match (&self.rail, hca) {
            (Some((rail, gbps)), Some(hca)) if hca.trim_start_matches('=') == rail => *gbps,
            _ => all,
        }
    }
}

fn bandwidth(key: &str, value: &str) -> Result<f64, String> {
    let v: f64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a bandwidth in GB/s"))?;
    if !(v.is_finite() && v > 0.0 && v <= 100_000.0) {
        return Err(format!("{key}={value}: use a bandwidth above 0, in GB/s"));
    }
    Ok(v)
}

impl SimNet {
    /// Reads one `net` or `netfault` value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "net" => self.gbps = Some(bandwidth(key, value)?),
            "railnet" => {
                let (hca, gbps) = value
                    .split_once('@')
                    .filter(|(hca, _)| !hca.is_empty())
                    .ok_or_else(|| format!("railnet={value}: use <hca>@<GB/s>, e.g. mlx5_1@40"))?;
                self.rail = Some((hca.to_string(), bandwidth(key, gbps)?));
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
        if let Some((hca, gbps)) = &self.rail {
            parts.push(format!(",railnet={hca}@{gbps}"));
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
