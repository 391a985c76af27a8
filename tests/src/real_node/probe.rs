//! What a container's process runs as, read from the host's `/proc` (the node is this host):
//! its user and group, its effective capabilities, whether it may gain privileges, and whether
//! its root filesystem is read-only.

use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessFacts {
    /// Real, effective, saved and filesystem user ids.
    pub uids: [u32; 4],
    pub gids: [u32; 4],
    /// Effective capability set.
    pub cap_eff: u64,
    /// `no_new_privs` (allowPrivilegeEscalation: false).
    pub no_new_privs: bool,
    /// The mount at `/` (as the process sees it) is read-only.
    pub root_read_only: bool,
}

/// Reads `/proc/<pid>/status` and `/proc/<pid>/mountinfo`.
pub fn process_facts(pid: u32) -> Result<ProcessFacts, String> {
    let proc = Path::new("/proc").join(pid.to_string());
    let read = |name: &str| {
        std::fs::read_to_string(proc.join(name))
            .map_err(|e| format!("read /proc/{pid}/{name}: {e}"))
    };
    parse(&read("status")?, &read("mountinfo")?).map_err(|e| format!("/proc/{pid}: {e}"))
}

fn parse(status: &str, mountinfo: &str) -> Result<ProcessFacts, String> {
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
            .ok_or_else(|| format!("no {key} line"))
    };
    let ids = |key: &str| -> Result<[u32; 4], String> {
        let v: Vec<u32> = field(key)?
            .split_whitespace()
            .map(|n| n.parse().map_err(|_| format!("{key} {n}")))
            .collect::<Result<_, _>>()?;
        v.try_into().map_err(|_| format!("{key} needs four ids"))
    };
    let cap_eff = u64::from_str_radix(field("CapEff:")?, 16).map_err(|e| format!("CapEff: {e}"))?;
    // mountinfo: id parent major:minor root mount-point options ...
    let root_options = mountinfo
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .rfind(|f| f.len() > 5 && f[4] == "/")
        .map(|f| f[5].to_string())
        .ok_or("no mount at /")?;
    Ok(ProcessFacts {
        uids: ids("Uid:")?,
        gids: ids("Gid:")?,
        cap_eff,
        no_new_privs: field("NoNewPrivs:")? == "1",
        root_read_only: root_options.split(',').any(|o| o == "ro"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_down_process_reads_as_such() {
        let status = "Name:\tgpuval-operator\nUid:\t65532\t65532\t65532\t65532\nGid:\t65532\t65532\t65532\t65532\n\
                      CapEff:\t0000000000000000\nNoNewPrivs:\t1\n";
        let mountinfo = "1046 1020 0:120 / / ro,relatime - overlay overlay rw,lowerdir=x\n\
                         1047 1046 0:123 / /proc rw,nosuid - proc proc rw\n";
        let f = parse(status, mountinfo).unwrap();
        assert_eq!(f.uids, [65532; 4]);
        assert_eq!(f.cap_eff, 0);
        assert!(f.no_new_privs && f.root_read_only);
        let rw = parse(
            &status.replace("CapEff:\t0000000000000000", "CapEff:\t00000000a80425fb"),
            &mountinfo.replace(" / / ro,", " / / rw,"),
        )
        .unwrap();
        assert_ne!(rw.cap_eff, 0);
        assert!(!rw.root_read_only);
    }

    #[test]
    fn this_process_can_be_read() {
        let f = process_facts(std::process::id()).unwrap();
        // SAFETY: getuid has no preconditions.
        assert_eq!(f.uids[0], unsafe { libc::getuid() });
    }
}
