//! InfiniBand and RoCE port health, from the kernel's sysfs ABI
//! (`Documentation/ABI/stable/sysfs-class-infiniband`): for each `<dev>/ports/<n>/`, the
//! port's `state` (`4: ACTIVE`), `phys_state` (`5: LinkUp`), `rate` (`400 Gb/sec (4X NDR)`),
//! `link_layer` (`InfiniBand` or `Ethernet`, the latter RoCE) and its error counters under
//! `counters/`. Read before the fabric rounds and after them: a port not ACTIVE or not LinkUp,
//! or under the expected rate, fails; a link that went down during the rounds fails; other
//! error counters rising warn, with the device and port named.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use gpuval_crds::fabric_ports::{
    PortFinding, PortReading, PortSeverity as Severity, PortsReport,
};

/// Where the kernel lists RDMA devices: the host's, as the operator mounts `/sys/class`
/// read-only into fabric agent pods, else this container's own view.
pub const SYSFS_ROOTS: &[&str] = &["/host/sys/class/infiniband", "/sys/class/infiniband"];

/// Where to read the ports instead (a tree laid out as the ABI lays it out): for tests and for
/// hosts that mount the host's sysfs elsewhere.
pub const SYSFS_ROOT_ENV: &str = "GPUVAL_INFINIBAND_SYSFS";

/// [`SYSFS_ROOT_ENV`] where it is set, else the first of [`SYSFS_ROOTS`] that exists (the last
/// one when none does).
pub fn sysfs_root() -> PathBuf {
    if let Some(dir) = std::env::var_os(SYSFS_ROOT_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let found = SYSFS_ROOTS.iter().find(|r| Path::new(r).exists());
    PathBuf::from(
        found
            .or(SYSFS_ROOTS.last())
            .copied()
            .unwrap_or("/sys/class/infiniband"),
    )
}

/// Counters whose rise during the rounds fails the port: the link went down.
pub const FATAL_COUNTERS: &[&str] = &["link_downed"];
/// Counters whose rise during the rounds warns: errors on the wire or in the port.
pub const ERROR_COUNTERS: &[&str] = &[
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
];

/// Why the ports could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PortsError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Every port of every RDMA device under `root` (none when `root` does not exist: a node
/// without RDMA devices, or the directory not mounted).
pub fn read_ports(root: &Path) -> Result<Vec<PortReading>, PortsError> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for dev in sorted_entries(root)? {
        let ports = dev.join("ports");
        if !ports.is_dir() {
            continue;
        }
        let device = file_name(&dev);
        for port_dir in sorted_entries(&ports)? {
            let Ok(port) = file_name(&port_dir).parse::<u32>() else {
                continue;
            };
            out.push(read_port(&device, port, &port_dir)?);
        }
    }
    Ok(out)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, PortsError> {
    let read = std::fs::read_dir(dir).map_err(|source| PortsError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut v: Vec<PathBuf> = read.filter_map(|e| e.ok().map(|e| e.path())).collect();
    v.sort();
    Ok(v)
}

fn read_text(path: &Path) -> Result<String, PortsError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| PortsError::Read {
            path: path.to_path_buf(),
            source,
        })
}

fn read_port(device: &str, port: u32, dir: &Path) -> Result<PortReading, PortsError> {
    let state = named_value(&read_text(&dir.join("state"))?);
    let phys_state = named_value(&read_text(&dir.join("phys_state"))?);
    let rate_gbps = read_text(&dir.join("rate")).ok().and_then(|r| rate(&r));
    let link_layer = read_text(&dir.join("link_layer")).unwrap_or_else(|_| "InfiniBand".into());
    let mut counters = BTreeMap::new();
    for name in FATAL_COUNTERS.iter().chain(ERROR_COUNTERS) {
        // A counter a driver does not provide is absent, or unreadable.
        if let Ok(text) = read_text(&dir.join("counters").join(name))
            && let Ok(v) = text.parse::<u64>()
        {
            counters.insert((*name).to_string(), v);
        }
    }
    Ok(PortReading {
        device: device.into(),
        port,
        state,
        phys_state,
        rate_gbps,
        link_layer,
        counters,
    })
}

/// `4: ACTIVE` → `ACTIVE` (a value without a number stays as it is).
fn named_value(text: &str) -> String {
    text.split_once(':')
        .map_or(text, |(_, name)| name)
        .trim()
        .to_string()
}

/// `400 Gb/sec (4X NDR)` → 400.
fn rate(text: &str) -> Option<f64> {
    let (number, rest) = text.split_once(' ')?;
    rest.starts_with("Gb/sec").then_some(())?;
    number.parse().ok()
}

/// What the ports say: each port not up, under `min_rate_gbps`, or gone, from `after`; each
/// counter that rose from `before` to `after`.
pub fn judge(
    before: &[PortReading],
    after: &[PortReading],
    min_rate_gbps: Option<f64>,
) -> Vec<PortFinding> {
    let mut out = Vec::new();
    let find = |p: &PortReading, severity, message: String| PortFinding {
        severity,
        device: p.device.clone(),
        port: p.port,
        message: format!("{} ({}): {message}", p.name(), p.link_layer),
    };
    for p in after {
        if p.state != "ACTIVE" && p.state != "ACTIVE_DEFER" {
            out.push(find(
                p,
                Severity::Fail,
                format!("state {} (not ACTIVE)", p.state),
            ));
        }
        if p.phys_state != "LinkUp" {
            out.push(find(
                p,
                Severity::Fail,
                format!("physical state {} (not LinkUp)", p.phys_state),
            ));
        }
        if let (Some(min), Some(r)) = (min_rate_gbps, p.rate_gbps)
            && r < min
        {
            out.push(find(
                p,
                Severity::Fail,
                format!("rate {r} Gb/s below the expected {min}"),
            ));
        }
        let Some(b) = before
            .iter()
            .find(|b| b.device == p.device && b.port == p.port)
        else {
            continue;
        };
        for (name, v) in &p.counters {
            let was = b.counters.get(name).copied().unwrap_or(0);
            if *v > was {
                let severity = if FATAL_COUNTERS.contains(&name.as_str()) {
                    Severity::Fail
                } else {
                    Severity::Warn
                };
                out.push(find(
                    p,
                    severity,
                    format!("{name} rose by {} during the fabric rounds", v - was),
                ));
            }
        }
    }
    for b in before {
        if !after
            .iter()
            .any(|p| p.device == b.device && p.port == b.port)
        {
            out.push(find(
                b,
                Severity::Fail,
                "gone after the fabric rounds".into(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes one port as the kernel lays it out under `root`.
    fn port(root: &Path, dev: &str, n: u32, state: &str, phys: &str, rate: &str, layer: &str) {
        let dir = root.join(dev).join("ports").join(n.to_string());
        std::fs::create_dir_all(dir.join("counters")).unwrap();
        std::fs::write(dir.join("state"), format!("{state}\n")).unwrap();
        std::fs::write(dir.join("phys_state"), format!("{phys}\n")).unwrap();
        std::fs::write(dir.join("rate"), format!("{rate}\n")).unwrap();
        std::fs::write(dir.join("link_layer"), format!("{layer}\n")).unwrap();
        for c in FATAL_COUNTERS.iter().chain(ERROR_COUNTERS) {
            std::fs::write(dir.join("counters").join(c), "0\n").unwrap();
        }
        std::fs::write(root.join(dev).join("node_type"), "1: CA\n").unwrap();
    }

    fn counter(root: &Path, dev: &str, n: u32, name: &str, v: u64) {
        let p = root
            .join(dev)
            .join("ports")
            .join(n.to_string())
            .join("counters")
            .join(name);
        std::fs::write(p, format!("{v}\n")).unwrap();
    }

    fn healthy(root: &Path) {
        port(
            root,
            "mlx5_0",
            1,
            "4: ACTIVE",
            "5: LinkUp",
            "400 Gb/sec (4X NDR)",
            "InfiniBand",
        );
        port(
            root,
            "mlx5_1",
            1,
            "4: ACTIVE",
            "5: LinkUp",
            "200 Gb/sec (4X HDR)",
            "Ethernet",
        );
    }

    #[test]
    fn ports_read_as_the_abi_lays_them_out() {
        let tmp = tempfile::tempdir().unwrap();
        healthy(tmp.path());
        let ports = read_ports(tmp.path()).unwrap();
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].name(), "mlx5_0/1");
        assert_eq!(ports[0].state, "ACTIVE");
        assert_eq!(ports[0].phys_state, "LinkUp");
        assert_eq!(ports[0].rate_gbps, Some(400.0));
        assert_eq!(ports[1].link_layer, "Ethernet");
        assert_eq!(ports[1].counters["symbol_error"], 0);
        assert!(judge(&ports, &ports, Some(200.0)).is_empty());
        // No RDMA devices: nothing to judge.
        assert!(read_ports(&tmp.path().join("absent")).unwrap().is_empty());
    }

    #[test]
    fn a_port_down_slow_or_gone_fails_with_device_and_port() {
        let tmp = tempfile::tempdir().unwrap();
        healthy(tmp.path());
        let before = read_ports(tmp.path()).unwrap();
        port(
            tmp.path(),
            "mlx5_0",
            1,
            "1: DOWN",
            "3: Disabled",
            "10 Gb/sec (4X SDR)",
            "InfiniBand",
        );
        std::fs::remove_dir_all(tmp.path().join("mlx5_1")).unwrap();
        let after = read_ports(tmp.path()).unwrap();
        let f = judge(&before, &after, Some(400.0));
        let fails: Vec<&str> = f
            .iter()
            .filter(|f| f.severity == Severity::Fail)
            .map(|f| f.message.as_str())
            .collect();
        assert_eq!(fails.len(), 4, "{fails:?}");
        assert!(
            fails[0].starts_with("mlx5_0/1 (InfiniBand): state DOWN"),
            "{fails:?}"
        );
        assert!(fails[1].contains("physical state Disabled"), "{fails:?}");
        assert!(
            fails[2].contains("rate 10 Gb/s below the expected 400"),
            "{fails:?}"
        );
        assert!(
            fails[3].starts_with("mlx5_1/1 (Ethernet): gone"),
            "{fails:?}"
        );
    }

    #[test]
    fn errors_rising_during_the_rounds_warn_and_a_link_down_fails() {
        let tmp = tempfile::tempdir().unwrap();
        healthy(tmp.path());
        counter(tmp.path(), "mlx5_0", 1, "symbol_error", 7);
        let before = read_ports(tmp.path()).unwrap();
        counter(tmp.path(), "mlx5_0", 1, "symbol_error", 19);
        counter(tmp.path(), "mlx5_1", 1, "link_downed", 1);
        counter(tmp.path(), "mlx5_1", 1, "port_xmit_discards", 3);
        let after = read_ports(tmp.path()).unwrap();
        let f = judge(&before, &after, None);
        assert_eq!(f.len(), 3, "{f:?}");
        assert_eq!(f[0].severity, Severity::Warn);
        assert_eq!((f[0].device.as_str(), f[0].port), ("mlx5_0", 1));
        assert!(f[0].message.contains("symbol_error rose by 12"), "{f:?}");
        let down = f
            .iter()
            .find(|f| f.message.contains("link_downed"))
            .unwrap();
        assert_eq!(down.severity, Severity::Fail);
        assert_eq!(down.device, "mlx5_1");
        // A counter already high before the rounds is history, not this run's fault.
        assert!(judge(&before, &before, None).is_empty());
    }
}
