//! containerd for the node: its configuration (everything under the node's directory, runc,
//! overlayfs, the CNI bridge), and `ctr`, its own client, for importing images and looking at
//! (or killing) the containers the kubelet runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::host::HostTools;
use super::images::Image;
use super::network::Bridge;

/// The kubelet's containerd namespace.
pub const K8S_NAMESPACE: &str = "k8s.io";

/// Where containerd keeps everything, under the node's directory.
pub struct Layout {
    pub config: PathBuf,
    pub socket: PathBuf,
    root: PathBuf,
    state: PathBuf,
    runc_root: PathBuf,
    /// runc's state for the container that probes the host (not the kubelet's).
    pub probe_runc_root: PathBuf,
    cni_conf: PathBuf,
    cni_ipam: PathBuf,
}

impl Layout {
    pub fn new(dir: &Path) -> Self {
        let c = dir.join("containerd");
        Self {
            config: c.join("config.toml"),
            socket: dir.join("containerd.sock"),
            root: c.join("root"),
            state: c.join("state"),
            runc_root: c.join("runc"),
            probe_runc_root: c.join("runc-probe"),
            cni_conf: dir.join("cni/net.d"),
            cni_ipam: dir.join("cni/ipam"),
        }
    }

    /// Writes containerd's configuration and the CNI network.
    pub fn write(&self, tools: &HostTools, bridge: &Bridge, pause: &Image) -> Result<(), String> {
        for d in [&self.cni_conf, &self.cni_ipam, &self.root] {
            std::fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
        }
        let write = |path: &Path, text: String| {
            std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))
        };
        write(
            &self.config,
            self.config_toml(&tools.runc, &tools.cni_bin, &pause.reference),
        )?;
        write(
            &self.cni_conf.join("10-gpuval.conflist"),
            self.cni_conflist(bridge),
        )
    }

    /// containerd 1.6+ (config version 2). `restrict_oom_score_adj`: the host may lack
    /// CAP_SYS_RESOURCE; network namespaces are mounted under the state directory, so teardown
    /// finds them; the sandbox image is the locally built one (nothing is pulled).
    fn config_toml(&self, runc: &Path, cni_bin: &Path, sandbox_image: &str) -> String {
        let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
        format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[{cri}]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  Root = "{runc_root}"
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{cni_conf}"
"#,
            root = self.root.display(),
            state = self.state.display(),
            socket = self.socket.display(),
            runc = runc.display(),
            runc_root = self.runc_root.display(),
            cni_bin = cni_bin.display(),
            cni_conf = self.cni_conf.display(),
        )
    }

    /// One bridge network: the node's bridge as the pods' gateway, addresses from `.128`, no
    /// masquerading (pods only talk to this host), IPAM state under the node's directory.
    fn cni_conflist(&self, bridge: &Bridge) -> String {
        let (first, last) = bridge.pod_range();
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "gpuval-node",
            "plugins": [{
                "type": "bridge",
                "bridge": bridge.name(),
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{
                        "subnet": bridge.subnet(),
                        "rangeStart": first.to_string(),
                        "rangeEnd": last.to_string(),
                        "gateway": bridge.gateway().to_string(),
                    }]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": self.cni_ipam.display().to_string(),
                },
            }],
        })
        .to_string()
    }
}

/// A container task as `ctr tasks ls` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub id: String,
    pub pid: u32,
    /// RUNNING, STOPPED, ...
    pub status: String,
}

/// `ctr` against the node's containerd, in the kubelet's namespace.
#[derive(Debug, Clone)]
pub struct Ctr {
    bin: PathBuf,
    socket: PathBuf,
}

/// How long one ctr command may take (an image import is the slowest).
const CTR_TIMEOUT: Duration = Duration::from_secs(300);

impl Ctr {
    pub fn new(bin: PathBuf, socket: PathBuf) -> Self {
        Self { bin, socket }
    }

    /// `ctr ARGS...`, its stdout; Err with its stderr when it fails or takes too long.
    pub fn run(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--address")
            .arg(&self.socket)
            .args(["--namespace", K8S_NAMESPACE])
            .args(args)
            .stdin(Stdio::null());
        let what = format!("ctr {}", args.join(" "));
        run_with_timeout(&mut cmd, CTR_TIMEOUT).map_err(|e| format!("{what}: {e}"))
    }

    /// Imports an OCI archive (the image keeps the name it was saved with).
    pub fn import(&self, archive: &Path) -> Result<(), String> {
        let path = archive.to_string_lossy();
        self.run(&["images", "import", &path]).map(drop)
    }

    /// Every task (a container's process), from `ctr tasks ls`.
    pub fn tasks(&self) -> Result<Vec<Task>, String> {
        Ok(parse_tasks(&self.run(&["tasks", "ls"])?))
    }

    /// The ids of every container containerd has (running or not).
    pub fn containers(&self) -> Result<Vec<String>, String> {
        Ok(self
            .run(&["containers", "ls", "-q"])?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Sends `signal` (e.g. SIGKILL) to a container's process, as an operator of the node
    /// might: the kubelet sees the container die.
    pub fn kill(&self, id: &str, signal: &str) -> Result<(), String> {
        self.run(&["tasks", "kill", "--signal", signal, id])
            .map(drop)
    }

    /// Removes a task (killing it) and its container.
    pub fn remove(&self, id: &str) -> Result<(), String> {
        let task = self.run(&["tasks", "delete", "--force", id]);
        let container = self.run(&["containers", "delete", id]);
        task.and(container).map(drop)
    }

    /// Runs `args` in a container of `image` to completion and removes it.
    pub fn run_to_completion(
        &self,
        image: &Image,
        id: &str,
        cgroup: &str,
        runc_root: &Path,
        args: &[&str],
    ) -> Result<String, String> {
        let runc_root = runc_root.to_string_lossy();
        let mut all = vec![
            "run",
            "--rm",
            "--cgroup",
            cgroup,
            "--runc-root",
            &runc_root,
            &image.reference,
            id,
        ];
        all.extend_from_slice(args);
        self.run(&all)
    }
}

fn parse_tasks(text: &str) -> Vec<Task> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some(Task {
                id: f.next()?.to_string(),
                pid: f.next()?.parse().ok()?,
                status: f.next()?.to_string(),
            })
        })
        .collect()
}

/// Runs `cmd` to completion, killing it after `timeout`; its stdout, or Err with the status and
/// stderr.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Result<String, String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start: {e}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {}s", timeout.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("wait: {e}")),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("read output: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_read_from_ctr_tasks_ls() {
        let text = "TASK                                                                PID      STATUS    \n\
                    9464af8c0214fcb11ee9ae576fc970cff0164aa6f7c0d25a721cf0fe4fba9347    15250    RUNNING\n\
                    f7e39b6ba505    0    STOPPED\n";
        let tasks = parse_tasks(text);
        assert_eq!(tasks.len(), 2);
        assert_eq!(tasks[0].pid, 15250);
        assert_eq!(tasks[0].status, "RUNNING");
        assert_eq!(tasks[1].id, "f7e39b6ba505");
    }

    #[test]
    fn everything_containerd_writes_is_under_the_node_directory() {
        let layout = Layout::new(Path::new("/tmp/node-x"));
        let toml = layout.config_toml(
            Path::new("/usr/sbin/runc"),
            Path::new("/usr/lib/cni"),
            "localhost/gpuval-pause:ci",
        );
        for line in toml.lines().filter(|l| l.contains("= \"/")) {
            assert!(
                line.contains("\"/tmp/node-x/") || line.contains("/usr/"),
                "{line}"
            );
        }
        for key in [
            "restrict_oom_score_adj = true",
            "netns_mounts_under_state_dir = true",
            "sandbox_image = \"localhost/gpuval-pause:ci\"",
            "SystemdCgroup = false",
        ] {
            assert!(toml.contains(key), "{key}");
        }
    }
}
