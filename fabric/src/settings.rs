//! The settings the planner judges with, from `spec.fabric`.

use gpuval_crds::fabric::{FabricKind, FabricSpec};

/// What is measured, and the floors groups are held to.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// NCCL groups, with the lowest acceptable bus bandwidth (GB/s).
    pub nccl_min_bus_gbps: Option<f64>,
    /// TCP pairs.
    pub tcp: bool,
    /// Lowest acceptable TCP throughput each way (Gb/s).
    pub tcp_min_gbps: Option<f64>,
    /// Highest acceptable TCP round trip (microseconds).
    pub tcp_max_latency_micros: Option<f64>,
    pub localize: bool,
    pub max_rounds: u32,
}

impl Settings {
    pub fn from_spec(spec: &FabricSpec) -> Self {
        let FabricSpec {
            nccl,
            tcp,
            localize: _,
            round_timeout: _,
            max_rounds: _,
            env: _,
            min_port_rate_gbps: _,
        } = spec;
        Self {
            nccl_min_bus_gbps: nccl.as_ref().map(|n| f64::from(n.min_bus_bandwidth_gbps)),
            tcp: tcp.is_some(),
            tcp_min_gbps: tcp.as_ref().and_then(|t| t.min_gbps),
            tcp_max_latency_micros: tcp
                .as_ref()
                .and_then(|t| t.max_latency_micros)
                .map(f64::from),
            localize: spec.localize(),
            max_rounds: spec.max_rounds_or_default(),
        }
    }

    /// The kinds measured, NCCL first.
    pub fn kinds(&self) -> Vec<FabricKind> {
        let mut kinds = Vec::new();
        if self.nccl_min_bus_gbps.is_some() {
            kinds.push(FabricKind::Nccl);
        }
        if self.tcp {
            kinds.push(FabricKind::Tcp);
        }
        kinds
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::fabric::{FabricNccl, FabricTcp};
    use gpuval_crds::{Collective, Duration};

    #[test]
    fn settings_follow_the_spec() {
        let spec = FabricSpec {
            nccl: Some(FabricNccl {
                collective: Collective::AllReduce,
                bytes: 1 << 30,
                iterations: 20,
                min_bus_bandwidth_gbps: 350,
                expect_transport: None,
                rails: Vec::new(),
            }),
            tcp: Some(FabricTcp {
                streams: 4,
                duration: Duration::from_secs(5),
                min_gbps: Some(10.0),
                max_latency_micros: Some(200),
            }),
            localize: Some(false),
            max_rounds: Some(3),
            ..Default::default()
        };
        let s = Settings::from_spec(&spec);
        assert_eq!(s.nccl_min_bus_gbps, Some(350.0));
        assert_eq!(s.tcp_min_gbps, Some(10.0));
        assert_eq!(s.tcp_max_latency_micros, Some(200.0));
        assert!(!s.localize);
        assert_eq!(s.max_rounds, 3);
        assert_eq!(s.kinds(), vec![FabricKind::Nccl, FabricKind::Tcp]);
        let tcp_only = Settings::from_spec(&FabricSpec { nccl: None, ..spec });
        assert_eq!(tcp_only.kinds(), vec![FabricKind::Tcp]);
    }
}
