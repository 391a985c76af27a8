//! The OCI runtime configuration (`config.json`) of one agent container, from its pod (pure):
//! the pod's security context (user, capabilities, `no_new_privs`, read-only root), its
//! environment, its volumes where the pod spec mounts them, and the GPUs' device nodes and
//! driver mounts from the CDI spec. What a container runtime adds on its own is added as
//! containerd does: `/proc`, a `/dev` tmpfs with the standard nodes (runc's defaults), a
//! 64 MiB `/dev/shm` unless a volume is mounted there, `/sys` read-only, the usual masked
//! and read-only `/proc` paths, and its own PID, IPC, UTS, mount and cgroup namespaces.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod, SecurityContext};
use serde_json::{Value, json};

/// The image's own settings (an OCI image config's `Env`, `Entrypoint` and `User`).
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub rootfs: PathBuf,
    pub env: Vec<String>,
    pub entrypoint: Vec<String>,
    pub uid: u32,
    pub gid: u32,
}

/// Where a volume's contents come from inside the container.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A host directory or file, bound (an emptyDir's directory, a hostPath, a
    /// materialized projected or secret volume, a CDI mount).
    Bind { path: PathBuf, read_only: bool },
    /// A memory-backed emptyDir: a tmpfs of this many bytes (None: the runtime's default).
    Tmpfs { bytes: Option<u64> },
}

/// One mount of the container.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub destination: String,
    pub source: Source,
}

/// A device node the container gets (from the CDI spec, with the host's numbers).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceNode {
    pub path: String,
    pub major: u64,
    pub minor: u64,
}

/// Everything the configuration is made of.
#[derive(Debug, Clone)]
pub struct Bundle<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub image: &'a Image,
    /// The container's environment as the kubelet resolves it, after the image's.
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub devices: Vec<DeviceNode>,
    /// Paths masked besides the runtime's own (other GPUs' driver folders).
    pub masked: Vec<String>,
    pub cgroups_path: String,
}

/// Every capability a privileged container gets; containerd's default set otherwise.
const DEFAULT_CAPS: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The size of `/dev/shm` when no volume is mounted there (containerd's and Docker's).
pub const DEFAULT_SHM_BYTES: u64 = 64 << 20;

impl Bundle<'_> {
    fn security(&self) -> SecurityContext {
        self.container.security_context.clone().unwrap_or_default()
    }

    /// The user the process runs as: the container's, else the pod's, else the image's.
    fn user(&self) -> (u32, u32) {
        let pod = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.clone())
            .unwrap_or_default();
        let sc = self.security();
        let pick = |c: Option<i64>, p: Option<i64>, image: u32| {
            c.or(p).and_then(|v| u32::try_from(v).ok()).unwrap_or(image)
        };
        (
            pick(sc.run_as_user, pod.run_as_user, self.image.uid),
            pick(sc.run_as_group, pod.run_as_group, self.image.gid),
        )
    }

    /// The capability sets: none where the container drops ALL (then its `add` list),
    /// containerd's defaults less the drops plus the adds otherwise.
    fn capabilities(&self) -> Vec<String> {
        let sc = self.security();
        let caps = sc.capabilities.unwrap_or_default();
        let norm = |c: &String| {
            let c = c.to_ascii_uppercase();
            if c.starts_with("CAP_") {
                c
            } else {
                format!("CAP_{c}")
            }
        };
        let drop: Vec<String> = caps.drop.iter().flatten().map(norm).collect();
        let mut out: Vec<String> = if sc.privileged == Some(true) {
            DEFAULT_CAPS.iter().map(|c| c.to_string()).collect()
        } else if drop.iter().any(|d| d == "CAP_ALL") {
            Vec::new()
        } else {
            DEFAULT_CAPS
                .iter()
                .map(|c| c.to_string())
                .filter(|c| !drop.contains(c))
                .collect()
        };
        out.extend(caps.add.iter().flatten().map(norm));
        out.dedup();
        out
    }

    fn process(&self) -> Value {
        let (uid, gid) = self.user();
        let sc = self.security();
        let caps = self.capabilities();
        let mut env: Vec<String> = self.image.env.clone();
        env.extend(self.env.iter().map(|(k, v)| format!("{k}={v}")));
        if let Some(name) = &self.pod.metadata.name {
            env.push(format!("HOSTNAME={name}"));
        }
        let args: Vec<String> = self
            .container
            .command
            .clone()
            .unwrap_or_else(|| self.image.entrypoint.clone())
            .into_iter()
            .chain(self.container.args.iter().flatten().cloned())
            .collect();
        json!({
            "terminal": false,
            "user": {"uid": uid, "gid": gid},
            "args": args,
            "env": env,
            "cwd": "/",
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps, "inheritable": [], "ambient": []
            },
            "noNewPrivileges": sc.allow_privilege_escalation != Some(true) && sc.privileged != Some(true),
        })
    }

    /// The runtime's own mounts, then the volumes (a volume at `/dev/shm` replaces the
    /// runtime's 64 MiB one).
    fn mounts(&self) -> Vec<Value> {
        let shm_volume = self.mounts.iter().any(|m| m.destination == "/dev/shm");
        let mut out = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
            json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                   "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
            json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                   "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
                   "options": ["nosuid", "noexec", "nodev", "ro"]}),
            json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                   "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}),
        ];
        if !shm_volume {
            out.push(tmpfs("/dev/shm", Some(DEFAULT_SHM_BYTES)));
        }
        out.extend(self.mounts.iter().map(|m| match &m.source {
            Source::Tmpfs { bytes } => tmpfs(&m.destination, *bytes),
            Source::Bind { path, read_only } => {
                let mut options = vec!["rbind", "rprivate", "nosuid", "nodev"];
                options.push(if *read_only { "ro" } else { "rw" });
                json!({"destination": m.destination, "type": "bind",
                       "source": path.display().to_string(), "options": options})
            }
        }));
        out
    }

    fn linux(&self) -> Value {
        let mut allow = vec![json!({"allow": false, "access": "rwm"})];
        allow.extend(self.devices.iter().map(|d| {
            json!({"allow": true, "type": "c", "major": d.major, "minor": d.minor, "access": "rwm"})
        }));
        let devices: Vec<Value> = self
            .devices
            .iter()
            .map(|d| {
                json!({"path": d.path, "type": "c", "major": d.major, "minor": d.minor,
                       "fileMode": 0o666, "uid": 0, "gid": 0})
            })
            .collect();
        let mut masked: Vec<String> = [
            "/proc/acpi",
            "/proc/asound",
            "/proc/kcore",
            "/proc/keys",
            "/proc/latency_stats",
            "/proc/timer_list",
            "/proc/timer_stats",
            "/proc/sched_debug",
            "/proc/scsi",
            "/sys/firmware",
        ]
        .iter()
        .map(|p| p.to_string())
        .collect();
        masked.extend(self.masked.iter().cloned());
        json!({
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"}],
            "cgroupsPath": self.cgroups_path,
            "resources": {"devices": allow},
            "devices": devices,
            "maskedPaths": masked,
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        })
    }

    /// The whole `config.json`.
    pub fn config(&self) -> Value {
        let read_only = self.security().read_only_root_filesystem == Some(true);
        json!({
            "ociVersion": "1.0.2",
            "process": self.process(),
            "root": {"path": self.image.rootfs.display().to_string(), "readonly": read_only},
            "hostname": self.pod.metadata.name.clone().unwrap_or_default(),
            "mounts": self.mounts(),
            "linux": self.linux(),
        })
    }
}

fn tmpfs(destination: &str, bytes: Option<u64>) -> Value {
    let mut options = vec![
        "nosuid".to_string(),
        "nodev".into(),
        "noexec".into(),
        "mode=1777".into(),
    ];
    if let Some(b) = bytes {
        options.push(format!("size={b}"));
    }
    json!({"destination": destination, "type": "tmpfs", "source": "tmpfs", "options": options})
}

/// Bytes in a Kubernetes quantity (`4Gi`, `16Mi`, `500M`, `1024`); None when it is not one.
pub fn quantity_bytes(q: &str) -> Option<u64> {
    const SUFFIXES: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let q = q.trim();
    let (digits, unit) = SUFFIXES
        .iter()
        .find_map(|(s, m)| q.strip_suffix(s).map(|d| (d, *m)))
        .unwrap_or((q, 1));
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_bytes() {
        assert_eq!(quantity_bytes("4Gi"), Some(4 << 30));
        assert_eq!(quantity_bytes("16Mi"), Some(16 << 20));
        assert_eq!(quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(quantity_bytes("1024"), Some(1024));
        assert_eq!(quantity_bytes("lots"), None);
    }
}
