//! Agent pods as real OCI containers under runc, for the GPU gate on a lent GPU machine that
//! has no kubelet: [`crate::kubelet::FakeKubelet`] with [`Runtime`] turns the operator's own
//! agent pod into a runc bundle ([`spec`]) and runs it, with the host's GPUs injected from a
//! CDI spec ([`cdi`]) as the NVIDIA container runtime injects them.
//!
//! What the container gets is what the pod spec says and the image holds: the image's root
//! filesystem (read-only where the pod asks), user, environment and entrypoint; the pod's
//! `args`, resolved environment, security context and volumes where it mounts them (an
//! emptyDir is a fresh host directory, or a tmpfs of its size limit when memory-backed; a
//! hostPath is bound; a Secret's keys are files); the GPUs' device nodes (and only those the
//! pod was given) and the driver's files from the CDI spec. Two things stand in for what a
//! cluster gives: the agent reaches the API server through a kubeconfig file mounted into the
//! container (`KUBECONFIG`), since the test control plane's serving certificate is not the
//! cluster CA a projected token volume carries, and the container shares the host's network
//! namespace (the API server listens on the host's loopback). No seccomp filter is loaded.

pub mod cdi;
pub mod spec;

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use k8s_openapi::api::core::v1::{Container, Pod, Volume};

pub use spec::Image;
use spec::{Bundle, DeviceNode, Mount, Source};

/// Where the kubeconfig is mounted in the container.
pub const KUBECONFIG_IN_CONTAINER: &str = "/var/run/gpuval-gate/kubeconfig";

/// How agent pods are run as containers.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// The runc binary.
    pub runc: PathBuf,
    /// runc's state directory (`--root`).
    pub state: PathBuf,
    /// The agent image, unpacked.
    pub image: Image,
    /// The host's GPUs as CDI devices.
    pub cdi: cdi::Spec,
}

/// What the kubelet resolved for one container before it is made.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// The container's resolved environment (the node's additions last).
    pub env: Vec<(String, String)>,
    /// The host directories holding each Secret volume's files, by volume.
    pub secrets: &'a HashMap<String, PathBuf>,
    /// The kubeconfig the agent gets (mounted at [`KUBECONFIG_IN_CONTAINER`]).
    pub kubeconfig: &'a Path,
    /// The CDI devices of the pod's node where the host is split into several nodes (None:
    /// the first devices, as many as the pod asks for).
    pub share: Option<&'a [String]>,
}

/// What [`Runtime::prepare`] made for one container.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub id: String,
    pub bundle: PathBuf,
    /// The CDI devices the container was given (`nvidia.com/gpu=0`).
    pub devices: Vec<String>,
}

impl Runtime {
    /// Writes the bundle of `container` of `pod` under `dir`: its emptyDir directories and
    /// `config.json`, from what the kubelet resolved for it ([`Inputs`]).
    pub fn prepare(
        &self,
        pod: &Pod,
        container: &Container,
        dir: &Path,
        inputs: Inputs<'_>,
    ) -> Result<Prepared, String> {
        let Inputs {
            env,
            secrets,
            kubeconfig,
            share,
        } = inputs;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let id = format!(
            "{}-{}",
            pod.metadata.name.clone().unwrap_or_default(),
            uid.chars().take(8).collect::<String>()
        );
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let mut mounts = volume_mounts(pod, container, dir, secrets)?;
        mounts.push(Mount {
            destination: KUBECONFIG_IN_CONTAINER.into(),
            source: Source::Bind {
                path: kubeconfig.to_path_buf(),
                read_only: true,
            },
        });
        let (devices, edits) = match share {
            Some(names) => self.cdi.edits_for_names(names)?,
            None => self.cdi.edits_for(gpus_asked(container))?,
        };
        mounts.extend(edits.mounts.iter().map(|m| Mount {
            destination: m.container_path.display().to_string(),
            source: Source::Bind {
                path: m.host_path.clone(),
                read_only: m.options.iter().any(|o| o == "ro"),
            },
        }));
        let nodes = edits
            .device_nodes
            .iter()
            .map(|d| device_node(d.host_path.as_deref().unwrap_or(&d.path), &d.path))
            .collect::<Result<Vec<_>, _>>()?;
        let mut env = env;
        env.extend(edits.env.iter().filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        }));
        env.push(("KUBECONFIG".into(), KUBECONFIG_IN_CONTAINER.into()));
        let masked = self.cdi.others_driver_proc(&devices);
        let bundle = Bundle {
            pod,
            container,
            image: &self.image,
            env,
            mounts,
            devices: nodes,
            masked,
            cgroups_path: format!("/gpuval-gate/{id}"),
        };
        let text = serde_json::to_string_pretty(&bundle.config())
            .map_err(|e| format!("encode config.json: {e}"))?;
        std::fs::write(dir.join("config.json"), text)
            .map_err(|e| format!("write {}/config.json: {e}", dir.display()))?;
        Ok(Prepared {
            id,
            bundle: dir.to_path_buf(),
            devices,
        })
    }

    /// `runc run` of a prepared bundle, in the foreground: it exits with the container's
    /// exit code (128 + the signal for a killed one).
    pub fn run_command(&self, p: &Prepared) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.runc);
        cmd.arg("--root")
            .arg(&self.state)
            .arg("run")
            .arg("--bundle")
            .arg(&p.bundle)
            .arg(&p.id)
            .stdin(Stdio::null());
        cmd
    }

    /// `runc kill ID SIGNAL` (every process of the container).
    pub fn kill(&self, id: &str, signal: &str) {
        self.runc_quietly(&["kill", "--all", id, signal]);
    }

    /// `runc delete --force ID`: stops what is left and removes the container's state.
    pub fn delete(&self, id: &str) {
        self.runc_quietly(&["delete", "--force", id]);
    }

    fn runc_quietly(&self, args: &[&str]) {
        let out = std::process::Command::new(&self.runc)
            .arg("--root")
            .arg(&self.state)
            .args(args)
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => tracing::debug!(?args, stderr = %String::from_utf8_lossy(&o.stderr), "runc"),
            Err(e) => tracing::warn!(?args, error = %e, "could not run runc"),
        }
    }
}

/// The `nvidia.com/gpu` the container's limits ask for (0 when none).
fn gpus_asked(container: &Container) -> usize {
    container
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(gpuval_crds::GPU_RESOURCE))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0)
}

/// The device node at `host` as the container's `path`, with the host node's numbers.
fn device_node(host: &Path, path: &Path) -> Result<DeviceNode, String> {
    let meta =
        std::fs::metadata(host).map_err(|e| format!("CDI device {}: {e}", host.display()))?;
    let dev = meta.rdev();
    Ok(DeviceNode {
        path: path.display().to_string(),
        major: ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff),
        minor: ((dev >> 12) & 0xffff_ff00) | (dev & 0xff),
    })
}

/// The container's volume mounts, each from its volume: an emptyDir (a fresh directory under
/// `dir`, writable by any user as a kubelet makes it, or a tmpfs of its size limit when
/// memory-backed), a hostPath, a Secret (its files, prepared by the caller). Projected volumes
/// (the service-account token) are left out: the agent gets the mounted kubeconfig instead.
fn volume_mounts(
    pod: &Pod,
    container: &Container,
    dir: &Path,
    secrets: &HashMap<String, PathBuf>,
) -> Result<Vec<Mount>, String> {
    let volumes: Vec<&Volume> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .collect();
    let mut out = Vec::new();
    for vm in container.volume_mounts.iter().flatten() {
        let v = volumes
            .iter()
            .find(|v| v.name == vm.name)
            .ok_or_else(|| format!("volume {} is mounted but not declared", vm.name))?;
        let read_only = vm.read_only == Some(true);
        let source = if let Some(e) = &v.empty_dir {
            if e.medium.as_deref() == Some("Memory") {
                let bytes = e
                    .size_limit
                    .as_ref()
                    .and_then(|q| spec::quantity_bytes(&q.0));
                Source::Tmpfs { bytes }
            } else {
                let path = dir.join("volumes").join(&v.name);
                std::fs::create_dir_all(&path)
                    .and_then(|()| {
                        std::fs::set_permissions(&path, PermissionsExt::from_mode(0o777))
                    })
                    .map_err(|e| format!("emptyDir {}: {e}", path.display()))?;
                Source::Bind { path, read_only }
            }
        } else if let Some(h) = &v.host_path {
            Source::Bind {
                path: PathBuf::from(&h.path),
                read_only,
            }
        } else if let Some(path) = secrets.get(&v.name) {
            Source::Bind {
                path: path.clone(),
                read_only: true,
            }
        } else if v.projected.is_some() {
            continue;
        } else {
            return Err(format!(
                "volume {}: this runtime mounts emptyDir, hostPath and Secret volumes only",
                v.name
            ));
        };
        out.push(Mount {
            destination: vm.mount_path.clone(),
            source,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
