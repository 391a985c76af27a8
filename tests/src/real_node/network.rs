//! The node's pod network: a Linux bridge of its own with a free `10.237.N.0/24`. Its gateway
//! (`.1`) is this host's address on the bridge, where kube-apiserver serves; the same address
//! opens the Service range `10.237.N.0/25`, so it is the `kubernetes` Service's ClusterIP. The
//! CNI bridge plugin attaches pods to it with addresses from `.128` (never a Service address).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The second octet of every node network (third octets are tried from the process id on).
const SECOND_OCTET: u8 = 237;

pub struct Bridge {
    name: String,
    octet: u8,
    ip: PathBuf,
    deleted: bool,
}

impl Bridge {
    /// Creates a bridge `gpuval<N>` with `10.237.N.1/24` for the first N whose name and subnet
    /// this host does not use yet.
    pub fn create(ip: &Path) -> Result<Self, String> {
        let routes = run(ip, &["-4", "-o", "route", "show"])?;
        let addrs = run(ip, &["-4", "-o", "addr", "show"])?;
        let links = run(ip, &["-o", "link", "show"])?;
        let start = (std::process::id() % 250) as u8;
        let octet = (0..250u16)
            .map(|i| ((u16::from(start) + i) % 250) as u8 + 1)
            .find(|n| {
                let net = format!("10.{SECOND_OCTET}.{n}.");
                !routes.contains(&net)
                    && !addrs.contains(&net)
                    && !links.contains(&format!(" {}:", bridge_name(*n)))
            })
            .ok_or("no free 10.237.N.0/24 for the pod bridge")?;
        let bridge = Self {
            name: bridge_name(octet),
            octet,
            ip: ip.to_path_buf(),
            deleted: false,
        };
        let cidr = format!("{}/24", bridge.gateway());
        run(ip, &["link", "add", &bridge.name, "type", "bridge"])?;
        // From here on, drop removes it.
        run(ip, &["addr", "add", &cidr, "dev", &bridge.name])?;
        run(ip, &["link", "set", &bridge.name, "up"])?;
        Ok(bridge)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `10.237.N.1`: this host on the bridge, the API server, the `kubernetes` ClusterIP.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, SECOND_OCTET, self.octet, 1)
    }

    /// `10.237.N.0/24`.
    pub fn subnet(&self) -> String {
        format!("10.{SECOND_OCTET}.{}.0/24", self.octet)
    }

    /// `10.237.N.0/25`: Services, the gateway first.
    pub fn service_cidr(&self) -> String {
        format!("10.{SECOND_OCTET}.{}.0/25", self.octet)
    }

    /// The pods' addresses, `.128` to `.254`.
    pub fn pod_range(&self) -> (Ipv4Addr, Ipv4Addr) {
        (
            Ipv4Addr::new(10, SECOND_OCTET, self.octet, 128),
            Ipv4Addr::new(10, SECOND_OCTET, self.octet, 254),
        )
    }

    /// Removes the bridge (veths still attached go with their pods' network namespaces).
    pub fn delete(mut self) -> Result<(), String> {
        self.deleted = true;
        run(&self.ip, &["link", "del", &self.name]).map(drop)
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if !self.deleted {
            let _ = run(&self.ip, &["link", "del", &self.name]);
        }
    }
}

fn bridge_name(octet: u8) -> String {
    format!("gpuval{octet}")
}

fn run(ip: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(ip)
        .args(args)
        .output()
        .map_err(|e| format!("run ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_is_the_first_service_address_and_pods_never_get_one() {
        let b = Bridge {
            name: bridge_name(7),
            octet: 7,
            ip: PathBuf::from("/nonexistent"),
            deleted: true,
        };
        assert_eq!(b.gateway(), Ipv4Addr::new(10, 237, 7, 1));
        assert_eq!(b.service_cidr(), "10.237.7.0/25");
        assert_eq!(b.subnet(), "10.237.7.0/24");
        let (first, last) = b.pod_range();
        assert!(first.octets()[3] > 127 && last.octets()[3] < 255);
        assert!(b.name().len() <= 15, "Linux interface names: {}", b.name());
    }
}
