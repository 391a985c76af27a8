//! A real Kubernetes node for tests: the control plane the other tests start, plus containerd
//! (runc, overlayfs, the Debian CNI bridge plugin) and a kubelet built from the same Kubernetes
//! release, everything in one temporary directory, so that the chart's pods run as containers
//! of the images CI builds (`tests/scripts/build-images.sh`).
//!
//! - **Network**: the node's pods live on a bridge of their own (`gpuval<N>`, a free
//!   `10.237.N.0/24`, pods from `.128`). kube-apiserver serves on the bridge's gateway address,
//!   port 443, and that address is also the first of the Service range, so the `kubernetes`
//!   Service's ClusterIP is the server itself: in-cluster clients (the operator, the agent)
//!   reach it the way they do in any cluster, with their service-account token and CA, and no
//!   kube-proxy is needed (other Services are not proxied). The kubelet and containerd listen
//!   on loopback or on sockets in the directory.
//! - **GPUs**: the node advertises `nvidia.com/gpu` the documented way for extended
//!   resources, a JSON patch of its status capacity; no device plugin hands out devices (the
//!   agents run the simulated backend).
//! - **Teardown**, on drop, also when the test panics: the kubelet stops, every container task
//!   is killed and deleted, what is left in the node's cgroups is killed, containerd stops, every
//!   mount under the directory is detached, the cgroups and the bridge are removed, and host
//!   paths the daemons create outside the directory are removed when they were not there before.
//!   One real node runs at a time on a host (a lock file), since a kubelet also uses fixed paths.
//!
//! [`RealNode::start_or_skip`] skips the test with the reason where the host cannot run
//! containers (not root, packages missing, images not built), except where CI is set
//! (`CI=true`) or `GPUVAL_REQUIRE_REAL_NODE=1`: there it fails, so CI never passes by skipping.

mod certs;
mod containerd;
mod daemon;
mod host;
mod images;
mod kubelet_config;
mod network;
mod probe;
mod teardown;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuval_crds::GPU_RESOURCE;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use kube::runtime::wait::await_condition;
use serde_json::json;

pub use containerd::{Ctr, Task};
pub use host::{HostTools, REQUIRE_ENV, required};
pub use images::{Image, Images, images_dir};
pub use probe::{ProcessFacts, process_facts};

use crate::control_plane::{ControlPlane, InClusterApi, Options};
use daemon::Daemon;
use network::Bridge;
use teardown::{CgroupRoot, HostPaths};

/// Why the real node did not come up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The host cannot run it (skip, unless CI requires it).
    #[error("{0}")]
    Unsupported(String),
    #[error("could not {what}: {detail}")]
    Step { what: String, detail: String },
    #[error("control plane: {0}")]
    ControlPlane(#[from] crate::control_plane::Error),
}

fn step(what: impl Into<String>) -> impl FnOnce(String) -> Error {
    let what = what.into();
    move |detail| Error::Step { what, detail }
}

/// What the node offers.
#[derive(Debug, Clone)]
pub struct RealNodeOptions {
    /// `nvidia.com/gpu` in the node's capacity.
    pub gpus: u32,
}

/// How long the node has to register and turn Ready.
const NODE_READY: Duration = Duration::from_secs(120);
/// The `kubernetes` Service's port, so the API server's.
const API_PORT: u16 = 443;

/// A running real node and its control plane. Dropping it tears everything down.
pub struct RealNode {
    name: String,
    dir: tempfile::TempDir,
    images: Images,
    tools: HostTools,
    ctr: Option<Ctr>,
    kubelet: Option<Daemon>,
    containerd: Option<Daemon>,
    cp: Option<ControlPlane>,
    bridge: Option<Bridge>,
    cgroup: CgroupRoot,
    host_paths: HostPaths,
    _lock: host::HostLock,
}

impl RealNode {
    /// Starts the node, or says on stderr why this host cannot and returns None; panics instead
    /// where [`required`] (CI) or when a host that can run containers fails to start it.
    pub async fn start_or_skip(opts: RealNodeOptions) -> Option<RealNode> {
        match Self::start(opts).await {
            Ok(node) => Some(node),
            Err(Error::Unsupported(why)) if !required() => {
                eprintln!("SKIPPED: no real node on this host: {why}");
                None
            }
            Err(Error::Unsupported(why)) => panic!(
                "the real-node test must run here ({REQUIRE_ENV}=1 or CI=true) but cannot: {why}"
            ),
            Err(e) => panic!("the real node did not start: {e}"),
        }
    }

    /// Starts the node (see the module's documentation).
    pub async fn start(opts: RealNodeOptions) -> Result<RealNode, Error> {
        let started = Instant::now();
        let tools = host::HostTools::locate().map_err(Error::Unsupported)?;
        let images = Images::load(&images_dir()).map_err(Error::Unsupported)?;
        let lock = host::HostLock::acquire(Duration::from_secs(900))
            .await
            .map_err(step("take the real-node lock"))?;
        let dir = tempfile::Builder::new()
            .prefix("gpuval-node-")
            .tempdir()
            .map_err(|e| step("create the node directory")(e.to_string()))?;
        let archive_bytes = images
            .archives()
            .iter()
            .filter_map(|a| std::fs::metadata(a).ok())
            .map(|m| m.len())
            .sum();
        host::check_space(dir.path(), archive_bytes).map_err(step("find room for the node"))?;
        let name = format!("gpuval-node-{}", std::process::id());
        let mut node = RealNode {
            cgroup: CgroupRoot::new(&format!("/{name}")),
            host_paths: HostPaths::record(),
            name,
            dir,
            images,
            tools,
            ctr: None,
            kubelet: None,
            containerd: None,
            cp: None,
            bridge: None,
            _lock: lock,
        };
        node.start_network_and_control_plane().await?;
        node.start_containerd().await?;
        node.start_kubelet(&opts).await?;
        println!(
            "real node {} up in {:.1}s: kubelet {}, containerd with runc and the CNI bridge {}, \
             pods reach the API server at {}",
            node.name,
            started.elapsed().as_secs_f64(),
            crate::tools::K8S_VERSION,
            node.bridge.as_ref().map_or("?", |b| b.name()),
            node.control_plane().server(),
        );
        Ok(node)
    }

    async fn start_network_and_control_plane(&mut self) -> Result<(), Error> {
        let bridge = Bridge::create(&self.tools.ip).map_err(step("create the pod bridge"))?;
        let gateway = bridge.gateway();
        let service_cidr = bridge.service_cidr();
        self.bridge = Some(bridge);
        let tls = certs::ClusterCerts::generate(gateway).map_err(step("make certificates"))?;
        let cp = ControlPlane::start_with(Options {
            controller_manager: true,
            scheduler: true,
            kwok: false,
            audit_log: false,
            in_cluster: Some(InClusterApi {
                address: gateway,
                port: API_PORT,
                service_cidr,
                cert_pem: tls.serving_cert_pem,
                key_pem: tls.serving_key_pem,
                ca_pem: tls.ca_pem,
            }),
            device_taint_rules: false,
        })
        .await?;
        self.cp = Some(cp);
        Ok(())
    }

    async fn start_containerd(&mut self) -> Result<(), Error> {
        let bridge = self
            .bridge
            .as_ref()
            .ok_or_else(|| step("start containerd")("no bridge".into()))?;
        let layout = containerd::Layout::new(self.dir.path());
        layout
            .write(&self.tools, bridge, &self.images.pause)
            .map_err(step("write the containerd and CNI configuration"))?;
        let mut cmd = std::process::Command::new(&self.tools.containerd);
        cmd.arg("--config").arg(&layout.config);
        let daemon = Daemon::spawn(
            "containerd",
            &mut cmd,
            &self.dir.path().join("containerd.log"),
        )
        .map_err(step("start containerd"))?;
        self.containerd = Some(daemon);
        self.containerd_ref()?
            .wait_for_path(&layout.socket, Duration::from_secs(30))
            .await
            .map_err(Error::Unsupported)?;
        let ctr = Ctr::new(self.tools.ctr.clone(), layout.socket.clone());
        let imported = Instant::now();
        for archive in self.images.archives() {
            ctr.import(archive)
                .map_err(step(format!("import {}", archive.display())))?;
        }
        println!(
            "images imported into containerd in {:.1}s",
            imported.elapsed().as_secs_f64()
        );
        // Can this host run a container at all? If not, that is the host's limit, not a bug.
        let probe_cgroup = self.cgroup.child("probe");
        ctr.run_to_completion(
            &self.images.operator,
            "gpuval-probe",
            &probe_cgroup,
            &layout.probe_runc_root,
            &["/usr/local/bin/gpuval-operator", "--help"],
        )
        .map_err(|e| Error::Unsupported(format!("this host cannot run a container: {e}")))?;
        self.ctr = Some(ctr);
        Ok(())
    }

    fn containerd_ref(&mut self) -> Result<&mut Daemon, Error> {
        self.containerd
            .as_mut()
            .ok_or_else(|| step("use containerd")("not started".into()))
    }

    async fn start_kubelet(&mut self, opts: &RealNodeOptions) -> Result<(), Error> {
        let cp = self
            .cp
            .as_ref()
            .ok_or_else(|| step("start the kubelet")("no control plane".into()))?;
        let bridge = self
            .bridge
            .as_ref()
            .ok_or_else(|| step("start the kubelet")("no bridge".into()))?;
        self.cgroup
            .create()
            .map_err(step("create the node's cgroups"))?;
        let config = kubelet_config::KubeletConfig {
            dir: self.dir.path().to_path_buf(),
            runtime_socket: containerd::Layout::new(self.dir.path()).socket,
            cgroup_root: self.cgroup.path().to_string(),
            port: free_port().map_err(step("pick the kubelet's port"))?,
            healthz_port: free_port().map_err(step("pick the kubelet's healthz port"))?,
        };
        let file = self.dir.path().join("kubelet.yaml");
        std::fs::write(&file, config.render())
            .map_err(|e| step("write the kubelet configuration")(e.to_string()))?;
        let mut cmd = std::process::Command::new(&self.tools.kubelet);
        cmd.arg(format!("--config={}", file.display()))
            .arg(format!("--kubeconfig={}", cp.kubeconfig().display()))
            .arg(format!("--root-dir={}", config.root_dir().display()))
            .arg(format!(
                "--cert-dir={}",
                self.dir.path().join("kubelet-pki").display()
            ))
            .arg(format!("--hostname-override={}", self.name))
            .arg(format!("--node-ip={}", bridge.gateway()))
            .arg("--v=1");
        let daemon = Daemon::spawn("kubelet", &mut cmd, &self.dir.path().join("kubelet.log"))
            .map_err(step("start the kubelet"))?;
        self.kubelet = Some(daemon);
        let client = self.client().await?;
        self.wait_node(&client, "registered and Ready", |n| {
            crate::nodes::is_node_ready(n)
        })
        .await?;
        self.advertise_gpus(&client, opts.gpus).await
    }

    /// Adds `gpus` × `nvidia.com/gpu` to the node's status capacity with the JSON patch of the
    /// status subresource that Kubernetes documents for extended resources ("Advertise Extended
    /// Resources for a Node"); the kubelet copies it to allocatable on its next status update,
    /// which this waits for.
    async fn advertise_gpus(&self, client: &Client, gpus: u32) -> Result<(), Error> {
        let patch = json!([{
            "op": "add",
            "path": format!("/status/capacity/{}", GPU_RESOURCE.replace('/', "~1")),
            "value": gpus.to_string(),
        }]);
        let mut kubectl = self.control_plane().kubectl()?;
        kubectl
            .args([
                "patch",
                "node",
                &self.name,
                "--subresource=status",
                "--type=json",
            ])
            .arg(format!("--patch={patch}"));
        crate::chart::output(&mut kubectl)
            .map_err(step(format!("patch {}'s capacity", self.name)))?;
        let want = gpus.to_string();
        self.wait_node(client, "allocatable nvidia.com/gpu", move |n| {
            n.status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(GPU_RESOURCE))
                .is_some_and(|q| q.0 == want)
        })
        .await
    }

    async fn wait_node(
        &self,
        client: &Client,
        what: &str,
        cond: impl Fn(&Node) -> bool,
    ) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(client.clone());
        let done = await_condition(nodes, &self.name, move |n: Option<&Node>| {
            n.is_some_and(&cond)
        });
        match tokio::time::timeout(NODE_READY, done).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(step(format!("watch node {}", self.name))(e.to_string())),
            Err(_) => Err(step(format!("see node {} {what}", self.name))(format!(
                "not within {}s; kubelet log:\n{}",
                NODE_READY.as_secs(),
                self.kubelet
                    .as_ref()
                    .map(Daemon::log_tail)
                    .unwrap_or_default()
            ))),
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The control plane (kubeconfig, kubectl, helm's tools).
    pub fn control_plane(&self) -> &ControlPlane {
        self.cp
            .as_ref()
            .expect("a started node has its control plane")
    }

    /// An admin client.
    pub async fn client(&self) -> Result<Client, Error> {
        Ok(self.control_plane().client().await?)
    }

    /// The images the node has (imported from the CI build).
    pub fn images(&self) -> &Images {
        &self.images
    }

    /// Runs `args` to completion in a fresh container of `image`, straight through containerd
    /// (not a pod), and removes it; its output.
    pub fn run_image(&self, image: &Image, id: &str, args: &[&str]) -> Result<String, String> {
        let layout = containerd::Layout::new(self.dir.path());
        self.ctr().run_to_completion(
            image,
            id,
            &self.cgroup.child(id),
            &layout.probe_runc_root,
            args,
        )
    }

    /// containerd's own client, on this node's socket and the kubelet's namespace.
    pub fn ctr(&self) -> &Ctr {
        self.ctr.as_ref().expect("a started node has containerd")
    }

    /// A directory for the test (removed with the node).
    pub fn scratch_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join("scratch").join(name)
    }

    /// The node's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of the kubelet's and containerd's logs and of every container's log
    /// (for failure messages).
    pub fn logs(&self) -> String {
        let mut out: Vec<String> = [("kubelet", &self.kubelet), ("containerd", &self.containerd)]
            .iter()
            .map(|(name, d)| {
                format!(
                    "---- {name} log (last lines) ----\n{}",
                    d.as_ref().map(Daemon::log_tail).unwrap_or_default()
                )
            })
            .collect();
        out.push(self.container_logs(""));
        out.join("\n")
    }

    /// The last lines of the logs of the containers whose pod name contains `pod` (all with
    /// ""), read from the kubelet's pod log directory (`kubectl logs` would need the API server
    /// to reach the kubelet, which listens on loopback only).
    pub fn container_logs(&self, pod: &str) -> String {
        let mut files: Vec<PathBuf> = Vec::new();
        let mut todo = vec![self.dir.path().join("pod-logs")];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    todo.push(p);
                } else if p.extension().is_some_and(|x| x == "log")
                    && p.to_string_lossy().contains(pod)
                {
                    files.push(p);
                }
            }
        }
        files.sort();
        files
            .iter()
            .map(|f| {
                format!(
                    "---- {} (last lines) ----\n{}",
                    f.strip_prefix(self.dir.path()).unwrap_or(f).display(),
                    crate::control_plane::tail(f, 20)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        let report = teardown::Teardown {
            kubelet: self.kubelet.take(),
            ctr: self.ctr.take(),
            containerd: self.containerd.take(),
            socket: containerd::Layout::new(self.dir.path()).socket,
            cgroup: &self.cgroup,
            dir: self.dir.path(),
        }
        .run();
        // The control plane after the node (the kubelet talks to it until it stops).
        self.cp.take();
        if let Some(bridge) = self.bridge.take()
            && let Err(e) = bridge.delete()
        {
            eprintln!("real node teardown: {e}");
        }
        self.host_paths.restore();
        for problem in report {
            eprintln!("real node teardown: {problem}");
        }
    }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}
