//! InfiniBand and RoCE ports as the fabric test reports them: each agent's readings of its
//! node's ports (the kernel's `/sys/class/infiniband/<dev>/ports/<n>/`) and what is wrong with
//! them, in its result's [`FABRIC_PORTS`](crate::labels::FABRIC_PORTS) annotation; the
//! validation's summary of every node's ports in `status.fabric.ports`. The agent reads and
//! judges; the operator names a node whose port failed and lists the ports in the status.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most ports the validation status lists by name in each of `failing` and `warnings`.
pub const MAX_LISTED_PORTS: usize = 20;

/// One port as sysfs showed it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PortReading {
    /// The RDMA device (`mlx5_0`).
    pub device: String,
    pub port: u32,
    /// `ACTIVE`, `DOWN`, `INIT`, `ARMED` (the name after sysfs's number).
    pub state: String,
    /// `LinkUp`, `Polling`, `Disabled`, ...
    pub phys_state: String,
    /// The data rate, Gb/s (None: unreadable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_gbps: Option<f64>,
    /// `InfiniBand`, or `Ethernet` for RoCE.
    pub link_layer: String,
    /// The error counters the driver provides, by their sysfs names.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub counters: std::collections::BTreeMap<String, u64>,
}

impl PortReading {
    /// `mlx5_0/1`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.device, self.port)
    }

    /// ACTIVE (or ACTIVE_DEFER) and LinkUp.
    pub fn is_up(&self) -> bool {
        (self.state == "ACTIVE" || self.state == "ACTIVE_DEFER") && self.phys_state == "LinkUp"
    }

    /// RoCE (`Ethernet` link layer) rather than InfiniBand.
    pub fn is_roce(&self) -> bool {
        self.link_layer == "Ethernet"
    }
}

/// How bad a port finding is.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortSeverity {
    /// Errors on the wire or in the port rose during the rounds.
    Warn,
    /// Not up, under the expected rate, gone, or its link went down during the rounds.
    Fail,
}

/// One thing wrong with a port.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortFinding {
    pub severity: PortSeverity,
    pub device: String,
    pub port: u32,
    /// `mlx5_0/1 (InfiniBand): state DOWN (not ACTIVE)`.
    pub message: String,
}

/// What an agent writes in its result's [`FABRIC_PORTS`](crate::labels::FABRIC_PORTS)
/// annotation: its node's ports as last read, and the findings since the fabric test began.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PortsReport {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortReading>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<PortFinding>,
}

impl PortsReport {
    /// The findings that fail the node.
    pub fn failures(&self) -> impl Iterator<Item = &PortFinding> {
        self.findings
            .iter()
            .filter(|f| f.severity == PortSeverity::Fail)
    }
}

/// Parses the ports annotation.
pub fn parse_ports(annotation: &str) -> Result<PortsReport, String> {
    serde_json::from_str(annotation).map_err(|e| format!("unreadable fabric ports: {e}"))
}

/// `status.fabric.ports`: every fabric node's InfiniBand/RoCE ports in one line.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FabricPortsStatus {
    /// Nodes that reported RDMA ports.
    pub nodes: i32,
    /// Ports read on them.
    pub ports: i32,
    /// Of them, ports whose link layer is InfiniBand.
    pub infiniband: i32,
    /// Of them, RoCE ports (link layer Ethernet).
    pub roce: i32,
    /// The lowest rate of a port that is up, Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rate_gbps: Option<f64>,
    /// Ports that failed, `node: finding` (at most 20 listed; `failingCount` counts them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<String>,
    #[serde(default)]
    pub failing_count: i32,
    /// Ports whose error counters rose during the rounds, `node: finding` (at most 20 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub warning_count: i32,
}

/// The status line of the ports of `reports` (node, its report); None when no node has any.
pub fn summarize<'a>(
    reports: impl IntoIterator<Item = (&'a str, &'a PortsReport)>,
) -> Option<FabricPortsStatus> {
    let mut s = FabricPortsStatus::default();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    for (node, r) in reports {
        if r.ports.is_empty() && r.findings.is_empty() {
            continue;
        }
        s.nodes += 1;
        s.ports += count(r.ports.len());
        s.roce += count(r.ports.iter().filter(|p| p.is_roce()).count());
        s.infiniband += count(r.ports.iter().filter(|p| !p.is_roce()).count());
        for rate in r
            .ports
            .iter()
            .filter(|p| p.is_up())
            .filter_map(|p| p.rate_gbps)
        {
            s.min_rate_gbps = Some(s.min_rate_gbps.map_or(rate, |m: f64| m.min(rate)));
        }
        for f in &r.findings {
            let (list, n) = match f.severity {
                PortSeverity::Fail => (&mut s.failing, &mut s.failing_count),
                PortSeverity::Warn => (&mut s.warnings, &mut s.warning_count),
            };
            *n += 1;
            if list.len() < MAX_LISTED_PORTS {
                list.push(crate::text::shorten(&format!("{node}: {}", f.message), 200));
            }
        }
    }
    (s.nodes > 0).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str, state: &str, rate: f64, layer: &str) -> PortReading {
        PortReading {
            device: device.into(),
            port: 1,
            state: state.into(),
            phys_state: if state == "ACTIVE" {
                "LinkUp"
            } else {
                "Disabled"
            }
            .into(),
            rate_gbps: Some(rate),
            link_layer: layer.into(),
            counters: Default::default(),
        }
    }

    fn finding(severity: PortSeverity, message: &str) -> PortFinding {
        PortFinding {
            severity,
            device: "mlx5_1".into(),
            port: 1,
            message: message.into(),
        }
    }

    #[test]
    fn the_status_counts_ports_by_link_layer_and_names_failing_ones_with_their_node() {
        let a = PortsReport {
            ports: vec![
                port("mlx5_0", "ACTIVE", 400.0, "InfiniBand"),
                port("mlx5_1", "DOWN", 400.0, "InfiniBand"),
            ],
            findings: vec![finding(
                PortSeverity::Fail,
                "mlx5_1/1 (InfiniBand): state DOWN",
            )],
        };
        let b = PortsReport {
            ports: vec![port("mlx5_0", "ACTIVE", 200.0, "Ethernet")],
            findings: vec![finding(
                PortSeverity::Warn,
                "mlx5_0/1 (Ethernet): symbol_error rose by 3",
            )],
        };
        let none = PortsReport::default();
        let s = summarize([("gpu-a", &a), ("gpu-b", &b), ("gpu-c", &none)]).unwrap();
        assert_eq!((s.nodes, s.ports, s.infiniband, s.roce), (2, 3, 2, 1));
        // The DOWN port's rate is not the fabric's lowest: only ports that are up count.
        assert_eq!(s.min_rate_gbps, Some(200.0));
        assert_eq!(s.failing, ["gpu-a: mlx5_1/1 (InfiniBand): state DOWN"]);
        assert_eq!(s.failing_count, 1);
        assert_eq!(
            s.warnings,
            ["gpu-b: mlx5_0/1 (Ethernet): symbol_error rose by 3"]
        );
        assert_eq!(a.failures().count(), 1);
        assert!(summarize([("gpu-c", &none)]).is_none());
    }

    #[test]
    fn the_listed_ports_are_bounded_and_the_count_is_whole() {
        let many = PortsReport {
            ports: Vec::new(),
            findings: (0..50)
                .map(|i| finding(PortSeverity::Fail, &format!("port {i} down")))
                .collect(),
        };
        let s = summarize([("gpu-a", &many)]).unwrap();
        assert_eq!(s.failing.len(), MAX_LISTED_PORTS);
        assert_eq!(s.failing_count, 50);
    }

    #[test]
    fn the_annotation_round_trips_and_a_bad_one_says_so() {
        let r = PortsReport {
            ports: vec![port("mlx5_0", "ACTIVE", 400.0, "InfiniBand")],
            findings: Vec::new(),
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(parse_ports(&text).unwrap(), r);
        assert!(parse_ports("[1,").unwrap_err().contains("fabric ports"));
    }
}
