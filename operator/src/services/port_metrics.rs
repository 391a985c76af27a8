//! The InfiniBand/RoCE ports of each node's latest fabric test, as metrics: whether each port
//! is up, its rate, and its error counters as last read. They come from the `gpuval.io/
//! fabric-ports` annotation of the node's newest result, which the operator's metadata watch
//! already carries, so no result is read for them. A node keeps only its newest report, and a
//! node that leaves the cluster loses its series (as the fleet's figures do).
//!
//! Series: per port, `fabric_port_up` and `fabric_port_rate_gbps`, and one
//! `fabric_port_errors` per counter the driver provides (about 12): a node of 8 HCAs, about
//! 110 series.

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpuval_crds::fabric_ports::PortReading;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// Each family (without the `gpuval_` prefix) and its help.
pub const PORT_FAMILIES: [(&str, &str); 3] = [
    (
        "fabric_port_up",
        "InfiniBand/RoCE port ACTIVE and LinkUp in the node's latest fabric test (1) or not (0)",
    ),
    (
        "fabric_port_rate_gbps",
        "InfiniBand/RoCE port data rate, Gb/s, as sysfs gives it",
    ),
    (
        "fabric_port_errors",
        "InfiniBand/RoCE port error counter as last read, by counter (sysfs name)",
    ),
];

/// One node's ports as held.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldPorts {
    /// When its result was created (unix seconds): a newer result replaces it.
    pub created: i64,
    pub simulated: bool,
    pub ports: Vec<PortReading>,
}

/// The ports of each node's newest report.
#[derive(Debug, Default)]
pub struct FabricPorts(Mutex<BTreeMap<String, HeldPorts>>);

impl FabricPorts {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, HeldPorts>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `held` for `node` unless a report of a later result is held, or `held` is
    /// simulated and a real one is held.
    pub fn update(&self, node: &str, held: HeldPorts) {
        let mut map = self.lock();
        if map
            .get(node)
            .is_none_or(|h| h.created <= held.created && (h.simulated || !held.simulated))
        {
            map.insert(node.to_string(), held);
        }
    }

    /// Drops the nodes `exists` says are gone from the cluster.
    pub fn retain_nodes(&self, exists: impl Fn(&str) -> bool) {
        self.lock().retain(|node, _| exists(node));
    }
}

fn write_port(
    family: &mut prometheus_client::encoding::MetricEncoder<'_>,
    name: &str,
    node: &str,
    simulated: bool,
    p: &PortReading,
) -> Result<(), std::fmt::Error> {
    let port = p.port.to_string();
    let base = [
        ("node", node),
        ("device", p.device.as_str()),
        ("port", port.as_str()),
        ("link_layer", p.link_layer.as_str()),
        ("simulated", if simulated { "true" } else { "false" }),
    ];
    match name {
        "fabric_port_up" => {
            let up = if p.is_up() { 1.0 } else { 0.0 };
            ConstGauge::new(up).encode(family.encode_family(&base)?)
        }
        "fabric_port_rate_gbps" => match p.rate_gbps {
            Some(r) => ConstGauge::new(r).encode(family.encode_family(&base)?),
            None => Ok(()),
        },
        _ => {
            for (counter, v) in &p.counters {
                let labels = (base, [("counter", counter.as_str())]);
                ConstGauge::new(*v as f64).encode(family.encode_family(&labels)?)?;
            }
            Ok(())
        }
    }
}

impl Collector for FabricPorts {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let nodes = self.lock();
        if nodes.values().all(|h| h.ports.is_empty()) {
            return Ok(());
        }
        for (name, help) in PORT_FAMILIES {
            let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (node, h) in nodes.iter() {
                for p in &h.ports {
                    write_port(&mut family, name, node, h.simulated, p)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(device: &str, state: &str, symbol_errors: u64) -> PortReading {
        PortReading {
            device: device.into(),
            port: 1,
            state: state.into(),
            phys_state: "LinkUp".into(),
            rate_gbps: Some(400.0),
            link_layer: "InfiniBand".into(),
            counters: [("symbol_error".to_string(), symbol_errors)].into(),
        }
    }

    fn scrape(ports: FabricPorts) -> String {
        let mut registry = prometheus_client::registry::Registry::with_prefix("gpuval");
        registry.register_collector(Box::new(ports));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn each_port_exports_up_rate_and_counters_with_node_device_and_port() {
        let ports = FabricPorts::default();
        let held = |created, state: &str, errors| HeldPorts {
            created,
            simulated: false,
            ports: vec![reading("mlx5_0", state, errors)],
        };
        ports.update("gpu-a", held(10, "ACTIVE", 3));
        ports.update("gpu-b", held(10, "DOWN", 0));
        // An older result of gpu-a does not replace the newer one.
        ports.update("gpu-a", held(5, "DOWN", 99));
        let text = scrape(ports);
        let labels = |node| {
            format!(
                r#"node="{node}",device="mlx5_0",port="1",link_layer="InfiniBand",simulated="false""#
            )
        };
        assert!(
            text.contains(&format!("gpuval_fabric_port_up{{{}}} 1", labels("gpu-a"))),
            "{text}"
        );
        assert!(
            text.contains(&format!("gpuval_fabric_port_up{{{}}} 0", labels("gpu-b"))),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "gpuval_fabric_port_rate_gbps{{{}}} 400",
                labels("gpu-a")
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "gpuval_fabric_port_errors{{{},counter=\"symbol_error\"}} 3",
                labels("gpu-a")
            )),
            "{text}"
        );
    }

    #[test]
    fn no_ports_no_families_and_gone_nodes_lose_their_series() {
        let ports = FabricPorts::default();
        assert!(!scrape(FabricPorts::default()).contains("fabric_port"));
        ports.update(
            "gpu-a",
            HeldPorts {
                created: 1,
                simulated: false,
                ports: vec![reading("mlx5_0", "ACTIVE", 0)],
            },
        );
        ports.retain_nodes(|n| n != "gpu-a");
        assert!(!scrape(ports).contains("fabric_port"));
    }
}
