//! The kubelet's configuration file (KubeletConfiguration v1beta1) for the test node.

use std::path::{Path, PathBuf};

pub struct KubeletConfig {
    /// The node's directory: the kubelet's root, pod logs and certificates go below it.
    pub dir: PathBuf,
    /// containerd's socket.
    pub runtime_socket: PathBuf,
    /// The cgroup the node's pods go under (`/gpuval-node-<pid>`), in every hierarchy.
    pub cgroup_root: String,
    /// The kubelet's API (logs, exec) on 127.0.0.1.
    pub port: u16,
    pub healthz_port: u16,
}

impl KubeletConfig {
    pub fn root_dir(&self) -> PathBuf {
        self.dir.join("kubelet")
    }

    fn pod_logs(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }

    /// The configuration. cgroup v1 hosts need `failCgroupV1: false` (the kubelet refuses v1
    /// otherwise since 1.35) and the cgroupfs driver (containerd 1.x cannot tell the kubelet
    /// its driver); eviction thresholds are low and image garbage collection off, so a busy
    /// shared disk does not evict the test's pods or delete its images (nothing could pull them
    /// back); the node reports its status every few seconds so the test's waits are short.
    pub fn render(&self) -> String {
        let path = |p: &Path| p.display().to_string();
        format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
failCgroupV1: false
failSwapOn: false
podLogsDir: {pod_logs}
staticPodPath: ""
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 4s
nodeStatusReportFrequency: 4s
syncFrequency: 5s
serializeImagePulls: false
"#,
            port = self.port,
            healthz = self.healthz_port,
            socket = path(&self.runtime_socket),
            cgroup_root = self.cgroup_root,
            pod_logs = path(&self.pod_logs()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_keeps_to_loopback_and_the_node_directory() {
        let c = KubeletConfig {
            dir: PathBuf::from("/tmp/node-x"),
            runtime_socket: PathBuf::from("/tmp/node-x/containerd.sock"),
            cgroup_root: "/gpuval-node-1".into(),
            port: 41000,
            healthz_port: 41001,
        };
        let text = c.render();
        let yaml: serde_json::Value = serde_saphyr::from_str(&text).expect("YAML");
        assert_eq!(yaml["address"], "127.0.0.1");
        assert_eq!(yaml["readOnlyPort"], 0);
        assert_eq!(yaml["failCgroupV1"], false);
        assert_eq!(yaml["cgroupDriver"], "cgroupfs");
        assert_eq!(yaml["cgroupRoot"], "/gpuval-node-1");
        assert_eq!(yaml["imageGCHighThresholdPercent"], 100);
        assert_eq!(
            yaml["containerRuntimeEndpoint"],
            "unix:///tmp/node-x/containerd.sock"
        );
        assert!(
            yaml["podLogsDir"]
                .as_str()
                .unwrap()
                .starts_with("/tmp/node-x/")
        );
    }
}
