//! Reads NCCL's own log (`NCCL_DEBUG=INFO`, written to `NCCL_DEBUG_FILE`) for what it says
//! about the communicator: the NCCL version, the collective channel count, and the transport
//! of every channel connection between two ranks.
//!
//! The lines used look like (`host:pid:tid [dev] NCCL INFO ` then):
//! - `NCCL version 2.28.3+cuda13.0`
//! - `24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer`
//! - `Channel 03/0 : 0[0] -> 1[1] via P2P/CUMEM/read` (also `P2P/IPC`, `P2P/direct pointer`,
//!   `SHM/direct/direct`, and `[send] via NET/IB/0/GDRDMA` for the network)
//! - `NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>`: the verbs
//!   devices NCCL opened and each one's link layer (`IB` or `RoCE`; a rail or plane number may
//!   sit between the port and the `/`), which the channel lines do not tell apart

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The broad class of a transport, for judging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TransportClass {
    /// Peer-to-peer over NVLink or PCIe (CUMEM, IPC, direct pointer).
    P2p,
    /// Through host shared memory.
    Shm,
    /// Through a network plugin (IB, sockets, ...) or CollNet.
    Net,
    Other,
}

/// One channel connection from one rank to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    pub channel: u32,
    pub from: u32,
    pub to: u32,
    /// The transport's short name (`P2P/CUMEM`, `SHM`, `NET/IB`).
    pub via: String,
    pub class: TransportClass,
}

/// What the log says.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransportSummary {
    pub version: Option<String>,
    /// Collective channels (the largest count any rank logged; else the highest channel
    /// number seen plus one).
    pub channels: Option<u32>,
    pub connections: Vec<Connection>,
    /// NCCL warnings (`NCCL WARN`), the first few.
    pub warnings: Vec<String>,
    /// The verbs devices NCCL's IB transport opened, as `(device:port, link layer)` with the
    /// link layer `IB` or `RoCE` (from its `NET/IB : Using` line).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ib_devices: Vec<(String, String)>,
}

const MAX_WARNINGS: usize = 8;

impl TransportSummary {
    /// Every distinct short transport name, in order of first appearance.
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = Vec::new();
        for c in &self.connections {
            if !kinds.contains(&c.via) {
                kinds.push(c.via.clone());
            }
        }
        kinds
    }

    /// Connection counts per `(from, to, via)`.
    pub fn links(&self) -> BTreeMap<(u32, u32, String), u32> {
        let mut links = BTreeMap::new();
        for c in &self.connections {
            *links.entry((c.from, c.to, c.via.clone())).or_insert(0) += 1;
        }
        links
    }
}

/// Parses a whole log.
pub fn parse(log: &str) -> TransportSummary {
    let mut s = TransportSummary::default();
    let mut highest_channel: Option<u32> = None;
    for line in log.lines() {
        if let Some(w) = line.split_once("NCCL WARN ").map(|(_, w)| w.trim()) {
            if s.warnings.len() < MAX_WARNINGS {
                s.warnings.push(w.to_string());
            }
            continue;
        }
        let Some((_, msg)) = line.split_once("NCCL INFO ") else {
            continue;
        };
        let msg = msg.trim();
        if let Some(v) = msg.strip_prefix("NCCL version ") {
            if s.version.is_none() {
                s.version = v.split_whitespace().next().map(version_number);
            }
        } else if let Some(n) = coll_channels(msg) {
            s.channels = Some(s.channels.map_or(n, |c| c.max(n)));
        } else if let Some(devices) = msg.strip_prefix("NET/IB : Using") {
            for d in ib_devices(devices) {
                if !s.ib_devices.contains(&d) {
                    s.ib_devices.push(d);
                }
            }
        } else if let Some(c) = connection(msg) {
            highest_channel = Some(highest_channel.map_or(c.channel, |h| h.max(c.channel)));
            s.connections.push(c);
        }
    }
    if s.channels.is_none() {
        s.channels = highest_channel.map(|h| h + 1);
    }
    s
}

/// ` [0]mlx5_0:1/IB [1]mlx5_1:1:0/RoCE [RO]; OOB ...` → `[("mlx5_0:1", "IB"), ("mlx5_1:1", "RoCE")]`.
fn ib_devices(list: &str) -> Vec<(String, String)> {
    let list = list.split_once(';').map_or(list, |(devices, _)| devices);
    list.split_whitespace()
        .filter_map(|token| {
            let (_, rest) = token.strip_prefix('[')?.split_once(']')?;
            let (name, layer) = rest.rsplit_once('/')?;
            let mut parts = name.split(':');
            let device = parts.next().filter(|d| !d.is_empty())?;
            let port = parts.next()?;
            Some((format!("{device}:{port}"), layer.to_string()))
        })
        .collect()
}

/// `2.28.3+cuda13.0` → `2.28.3`.
fn version_number(v: &str) -> String {
    v.split('+').next().unwrap_or(v).to_string()
}

/// `24 coll channels, ...` → 24.
fn coll_channels(msg: &str) -> Option<u32> {
    let (n, rest) = msg.split_once(' ')?;
    if rest.starts_with("coll channels") {
        n.parse().ok()
    } else {
        None
    }
}

/// `Channel 03/0 : 0[0] -> 1[1] via P2P/CUMEM/read`.
fn connection(msg: &str) -> Option<Connection> {
    let rest = msg.strip_prefix("Channel ")?;
    let (channel, rest) = rest.split_once(" : ")?;
    let channel: u32 = channel.split('/').next()?.trim().parse().ok()?;
    let (ends, via) = rest.split_once(" via ")?;
    let (from, to) = ends.split_once(" -> ")?;
    let (via, class) = classify(via.trim());
    Some(Connection {
        channel,
        from: rank_of(from)?,
        to: rank_of(to)?,
        via,
        class,
    })
}

/// `1[1]` or `1[18000]` → 1; `[send]` and other bracketed words after the rank are ignored.
fn rank_of(end: &str) -> Option<u32> {
    let end = end.trim();
    let digits: String = end.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The short name and class of a transport string.
fn classify(via: &str) -> (String, TransportClass) {
    let parts: Vec<&str> = via.split('/').map(str::trim).collect();
    let first = parts.first().copied().unwrap_or("");
    let second = parts.get(1).copied().unwrap_or("");
    match first {
        "P2P" => {
            let how = match second {
                "CUMEM" => "CUMEM",
                "IPC" => "IPC",
                s if s.starts_with("direct") => "direct",
                _ => "",
            };
            let name = if how.is_empty() {
                "P2P".to_string()
            } else {
                format!("P2P/{how}")
            };
            (name, TransportClass::P2p)
        }
        "SHM" => ("SHM".to_string(), TransportClass::Shm),
        "NET" => (format!("NET/{second}"), TransportClass::Net),
        "COLLNET" => ("COLLNET".to_string(), TransportClass::Net),
        other => (other.to_string(), TransportClass::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written for these tests in the format NCCL 2.2x logs (prefix, then the message).
    const P2P_LOG: &str = "\
gpu-a:911:911 [0] NCCL INFO Bootstrap: Using eth0:10.1.2.3<0>
gpu-a:911:911 [0] NCCL INFO NCCL version 2.28.3+cuda13.0
gpu-a:911:930 [0] NCCL INFO comm 0x5581 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
gpu-a:911:930 [0] NCCL INFO Channel 00/24 :    0   1
gpu-a:911:930 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-a:911:931 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
gpu-a:911:930 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-a:911:931 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read
gpu-a:911:930 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
gpu-a:911:931 [1] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
";

    #[test]
    fn reads_version_channels_and_p2p_connections() {
        let s = parse(P2P_LOG);
        assert_eq!(s.version.as_deref(), Some("2.28.3"));
        assert_eq!(s.channels, Some(24));
        assert_eq!(
            s.connections.len(),
            4,
            "ring lines without `via` are not connections"
        );
        assert_eq!(s.kinds(), ["P2P/CUMEM"]);
        assert!(s.connections.iter().all(|c| c.class == TransportClass::P2p));
        let links = s.links();
        assert_eq!(links.get(&(0, 1, "P2P/CUMEM".into())), Some(&2));
        assert_eq!(links.get(&(1, 0, "P2P/CUMEM".into())), Some(&2));
    }

    #[test]
    fn classifies_shm_net_and_other_p2p_modes() {
        let log = "\
h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct
h:1:2 [0] NCCL INFO Channel 01/0 : 0[18000] -> 1[2a000] [send] via NET/IB/0/GDRDMA
h:1:2 [1] NCCL INFO Channel 02/1 : 1[1] -> 0[0] via P2P/IPC/read
h:1:2 [1] NCCL INFO Channel 05/0 : 1[1] -> 0[0] via P2P/direct pointer/read
h:1:2 [1] NCCL INFO Channel 06/0 : 1[1] -> 0[0] [receive] via NET/Socket/1
h:1:2 [0] NCCL WARN Cuda failure 'out of memory'
";
        let s = parse(log);
        let vias: Vec<(&str, TransportClass)> = s
            .connections
            .iter()
            .map(|c| (c.via.as_str(), c.class))
            .collect();
        assert_eq!(
            vias,
            [
                ("SHM", TransportClass::Shm),
                ("NET/IB", TransportClass::Net),
                ("P2P/IPC", TransportClass::P2p),
                ("P2P/direct", TransportClass::P2p),
                ("NET/Socket", TransportClass::Net),
            ]
        );
        assert_eq!((s.connections[1].from, s.connections[1].to), (0, 1));
        assert_eq!(
            s.channels,
            Some(7),
            "no channel count line: highest channel + 1"
        );
        assert_eq!(s.version, None);
        assert_eq!(s.warnings, ["Cuda failure 'out of memory'"]);
    }

    #[test]
    fn an_empty_or_foreign_log_gives_nothing() {
        assert_eq!(parse(""), TransportSummary::default());
        let s = parse("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\nrandom text\n");
        assert!(s.connections.is_empty(), "only NCCL INFO lines count");
    }
}
