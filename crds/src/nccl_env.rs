//! Which `NCCL_*` variables a validation may set (`spec.fabric.env`): the administrator's
//! allowlist, [`DEFAULT_ALLOWED`] (tuning and interface selection) plus the names the Helm
//! values add, never one that loads code, writes or reads files, or overrides what the agent
//! sets itself ([`forbidden`]). The chart's admission policy refuses the rest, naming them; the
//! agent drops a forbidden name it is given anyway, and its own settings always win.

use crate::fabric::NcclEnv;

/// The `NCCL_*` names a validation may set on a default installation: interface and device
/// selection, and tuning that changes how, not whether, collectives run.
pub const DEFAULT_ALLOWED: [&str; 31] = [
    // interface and device selection
    "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_FAMILY",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_DISABLE",
    "NCCL_NET",
    "NCCL_CROSS_NIC",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_P2P_LEVEL",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_NVLS_ENABLE",
    "NCCL_COLLNET_ENABLE",
    // tuning
    "NCCL_IB_TC",
    "NCCL_IB_SL",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_IB_PCI_RELAXED_ORDERING",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_BUFFSIZE",
    "NCCL_NTHREADS",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_NSOCKS_PERTHREAD",
];

/// The NCCL variables the agent sets itself (its checks read NCCL's log and rely on
/// connecting every channel at setup): a validation's value for one of them is never applied.
pub const AGENT_OWN: [&str; 4] = [
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_RUNTIME_CONNECT",
];

/// Why `name` may never be set by a validation, whatever the allowlist says (None: it may be
/// allowed): it loads a library, names a file, or is one of the agent's own settings.
pub fn forbidden(name: &str) -> Option<&'static str> {
    if AGENT_OWN.contains(&name) || name.starts_with("NCCL_DEBUG") {
        Some("the agent sets it itself")
    } else if name.ends_with("_PLUGIN") || name.contains("PLUGIN") {
        Some("it loads a library")
    } else if name.contains("FILE") || name.ends_with("_PATH") || name.ends_with("_DIR") {
        Some("it names a file")
    } else {
        None
    }
}

/// The names in `env` a validation may not set: forbidden ones, and those neither in
/// [`DEFAULT_ALLOWED`] nor in `extra` (the administrator's additions), each once, in order.
pub fn refused<'a>(env: &'a [NcclEnv], extra: &[String]) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for e in env {
        let name = e.name.as_str();
        let allowed = DEFAULT_ALLOWED.contains(&name) || extra.iter().any(|x| x == name);
        if (forbidden(name).is_some() || !allowed) && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(names: &[&str]) -> Vec<NcclEnv> {
        names
            .iter()
            .map(|n| NcclEnv {
                name: (*n).into(),
                value: "x".into(),
            })
            .collect()
    }

    #[test]
    fn the_default_allowlist_has_only_tuning_and_selection() {
        for name in DEFAULT_ALLOWED {
            assert_eq!(forbidden(name), None, "{name}");
            assert!(name.starts_with("NCCL_"), "{name}");
        }
        for name in [
            "NCCL_NET_PLUGIN",
            "NCCL_TUNER_PLUGIN",
            "NCCL_PROFILER_PLUGIN",
            "NCCL_DEBUG_FILE",
            "NCCL_DEBUG",
            "NCCL_RUNTIME_CONNECT",
            "NCCL_TOPO_DUMP_FILE",
            "NCCL_GRAPH_DUMP_FILE",
        ] {
            assert!(forbidden(name).is_some(), "{name}");
        }
    }

    #[test]
    fn refused_names_are_named_and_the_administrator_may_add_others() {
        let e = env(&[
            "NCCL_SOCKET_IFNAME",
            "NCCL_NET_PLUGIN",
            "NCCL_LL128_BUFFSIZE",
            "NCCL_NET_PLUGIN",
        ]);
        assert_eq!(
            refused(&e, &[]),
            vec!["NCCL_NET_PLUGIN", "NCCL_LL128_BUFFSIZE"]
        );
        let extra = vec![
            "NCCL_LL128_BUFFSIZE".to_string(),
            "NCCL_NET_PLUGIN".to_string(),
        ];
        assert_eq!(
            refused(&e, &extra),
            vec!["NCCL_NET_PLUGIN"],
            "a forbidden name stays refused even when listed"
        );
    }
}
