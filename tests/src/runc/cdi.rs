//! The Container Device Interface spec a GPU host's runtime uses to put GPUs into a container:
//! the devices by name, each with its own edits (its device node), and the edits every GPU
//! container gets (the control and UVM device nodes, the driver's libraries). The GPU gate
//! writes one from the host's driver files (`bench/cdi-from-host.sh`), as `nvidia-ctk cdi
//! generate` does on a node with the NVIDIA container toolkit; [`super`] applies it to the
//! agent pod's OCI bundle for the GPUs the pod was given.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// A CDI spec (`cdiVersion`, `kind`, `devices`, `containerEdits`): the parts a GPU container
/// needs.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub kind: String,
    pub devices: Vec<Device>,
    #[serde(default)]
    pub container_edits: Edits,
}

/// One device the spec names (`nvidia.com/gpu=0`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    /// `gpuval.io/driver-proc`: the GPU's folder under `/proc/driver/nvidia/gpus`, which a
    /// container not given this GPU sees masked (as the NVIDIA container runtime masks it).
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub container_edits: Edits,
}

/// The annotation naming a GPU's driver folder under `/proc`.
pub const DRIVER_PROC: &str = "gpuval.io/driver-proc";

/// What a device adds to a container.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Edits {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
}

/// A device node (`/dev/nvidia0`); its type and numbers are read from the host's node.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: PathBuf,
    #[serde(default)]
    pub host_path: Option<PathBuf>,
}

/// A bind mount of a host path into the container.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: PathBuf,
    pub container_path: PathBuf,
    #[serde(default)]
    pub options: Vec<String>,
}

impl Spec {
    pub fn read(path: &Path) -> Result<Spec, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("read the CDI spec {}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| format!("the CDI spec {} is not valid: {e}", path.display()))
    }

    /// The edits for a container given `count` GPUs: the first `count` devices in the spec's
    /// order (a device plugin's allocation on a host whose GPUs are all free), then the
    /// spec-wide edits. Fewer devices than asked for is an error, as an allocation would be.
    pub fn edits_for(&self, count: usize) -> Result<(Vec<String>, Edits), String> {
        if self.devices.len() < count {
            return Err(format!(
                "the pod asks for {count} GPU(s); the CDI spec ({}) has {}",
                self.kind,
                self.devices.len()
            ));
        }
        let mut out = Edits::default();
        let mut names = Vec::new();
        for d in self.devices.iter().take(count) {
            names.push(format!("{}={}", self.kind, d.name));
            out.extend(&d.container_edits);
        }
        out.extend(&self.container_edits);
        Ok((names, out))
    }
}

impl Spec {
    /// The edits for a container given the devices named `names` (`0`, `1`: a node's share of
    /// the host's GPUs), then the spec-wide edits; a name the spec lacks is an error.
    pub fn edits_for_names(&self, names: &[String]) -> Result<(Vec<String>, Edits), String> {
        let mut out = Edits::default();
        let mut given = Vec::new();
        for name in names {
            let d = self
                .devices
                .iter()
                .find(|d| &d.name == name)
                .ok_or_else(|| format!("the CDI spec ({}) has no device {name}", self.kind))?;
            given.push(format!("{}={}", self.kind, d.name));
            out.extend(&d.container_edits);
        }
        out.extend(&self.container_edits);
        Ok((given, out))
    }
}

impl Spec {
    /// The driver folders of the devices not in `given` (`nvidia.com/gpu=0` names): a
    /// container masks them.
    pub fn others_driver_proc(&self, given: &[String]) -> Vec<String> {
        self.devices
            .iter()
            .filter(|d| !given.contains(&format!("{}={}", self.kind, d.name)))
            .filter_map(|d| d.annotations.get(DRIVER_PROC).cloned())
            .collect()
    }
}

impl Edits {
    fn extend(&mut self, other: &Edits) {
        self.env.extend(other.env.iter().cloned());
        self.device_nodes.extend(other.device_nodes.iter().cloned());
        self.mounts.extend(other.mounts.iter().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        serde_json::from_value(serde_json::json!({
            "cdiVersion": "0.6.0",
            "kind": "nvidia.com/gpu",
            "devices": [
                {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
                {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}
            ],
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
                "mounts": [{"hostPath": "/usr/local/nvidia", "containerPath": "/usr/local/nvidia",
                            "options": ["ro", "nosuid", "nodev", "bind"]}]
            }
        }))
        .expect("a CDI spec")
    }

    #[test]
    fn a_pod_gets_its_gpus_nodes_and_the_shared_edits_only() {
        let (names, edits) = spec().edits_for(1).expect("edits");
        assert_eq!(names, ["nvidia.com/gpu=0"]);
        let nodes: Vec<&Path> = edits
            .device_nodes
            .iter()
            .map(|d| d.path.as_path())
            .collect();
        assert_eq!(
            nodes,
            [
                Path::new("/dev/nvidia0"),
                Path::new("/dev/nvidiactl"),
                Path::new("/dev/nvidia-uvm")
            ],
            "GPU 1's node is not given"
        );
        assert_eq!(edits.mounts.len(), 1);
    }

    #[test]
    fn a_node_s_share_is_its_named_devices_only() {
        let (names, edits) = spec().edits_for_names(&["1".into()]).expect("edits");
        assert_eq!(names, ["nvidia.com/gpu=1"]);
        assert_eq!(edits.device_nodes[0].path, Path::new("/dev/nvidia1"));
        assert!(
            !edits
                .device_nodes
                .iter()
                .any(|d| d.path == Path::new("/dev/nvidia0")),
            "GPU 0 is another node's"
        );
        let e = spec()
            .edits_for_names(&["7".into()])
            .expect_err("no device 7");
        assert!(e.contains("no device 7"), "{e}");
    }

    #[test]
    fn more_gpus_than_the_spec_has_is_refused() {
        let e = spec().edits_for(3).expect_err("only two devices");
        assert!(e.contains("asks for 3") && e.contains("has 2"), "{e}");
    }
}
