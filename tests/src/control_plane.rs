//! etcd + kube-apiserver (+ controller-manager, scheduler, kwok) as child processes.
//!
//! A component can be stopped and started again on the same ports with the same data
//! ([`ControlPlane::stop`], [`ControlPlane::start_again`]): an API server or etcd restart as
//! an upgrade does it. With [`Options::audit_log`] the API server logs every write it is
//! asked for (see [`crate::audit`]).

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom},
    net::{SocketAddr, TcpListener, TcpStream},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::tools::Tools;

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Tools(String),
    #[error("could not {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{component} exited early ({status}); last log lines:\n{log}")]
    Exited {
        component: &'static str,
        status: String,
        log: String,
    },
    #[error("{component} not ready after {secs}s; last log lines:\n{log}")]
    NotReady {
        component: &'static str,
        secs: u64,
        log: String,
    },
    #[error("kube client: {0}")]
    Kube(String),
}

impl Error {
    /// A component exited because the address it was given was taken by then.
    fn is_port_taken(&self) -> bool {
        matches!(self, Error::Exited { log, .. } if log.contains("address already in use"))
    }
}

/// How many times a start whose ports were taken meanwhile is tried.
pub const START_ATTEMPTS: u32 = 3;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// Which optional components to start beside etcd and kube-apiserver.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// kube-controller-manager (garbage collection through owner references, namespaces, ...).
    pub controller_manager: bool,
    /// kube-scheduler (binds pods that have no nodeName).
    pub scheduler: bool,
    /// kwok managing nodes annotated `kwok.x-k8s.io/node=fake` (fake kubelets): such nodes
    /// become Ready with the status they were created with; pods labelled
    /// `app.kubernetes.io/name=gpuval-agent` are left to [`FakeKubelet`](crate::FakeKubelet),
    /// other pods on fake nodes are marked Running (see `kwok-stages.yaml`).
    pub kwok: bool,
    /// The API server writes an audit log of every write request (`audit.log` in the control
    /// plane's directory; see [`ControlPlane::audit_log`]).
    pub audit_log: bool,
    /// Serve pods on a real node (see [`crate::real_node`]) instead of loopback only.
    pub in_cluster: Option<InClusterApi>,
    /// The API server serves `DeviceTaintRule` (KEP-5055): `resource.k8s.io/v1beta2` with the
    /// `DRADeviceTaintRules` feature gate, both off by default in Kubernetes 1.36.
    pub device_taint_rules: bool,
}

impl Options {
    pub fn all() -> Self {
        Self {
            controller_manager: true,
            scheduler: true,
            kwok: true,
            audit_log: false,
            in_cluster: None,
            device_taint_rules: false,
        }
    }
}

/// How pods on a real node reach the API server the way in-cluster clients do
/// (`KUBERNETES_SERVICE_HOST`, the service-account token and CA in every pod): it serves on
/// `address:port` with a certificate signed by `ca_pem`, and `address` is the first address of
/// `service_cidr`, so the `kubernetes` Service's ClusterIP is the server itself and pods reach
/// it without kube-proxy. The ServiceAccount admission plugin stays on (pods get projected
/// tokens) and kube-controller-manager publishes `ca_pem` as `kube-root-ca.crt`.
#[derive(Debug, Clone)]
pub struct InClusterApi {
    /// An address of this host that pods can reach (the pod bridge's gateway).
    pub address: std::net::Ipv4Addr,
    /// 443: the `kubernetes` Service's port.
    pub port: u16,
    /// Service addresses; its first address must be `address`.
    pub service_cidr: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
    /// How it was started, to start it again the same way.
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
}

/// A running control plane. Dropping it stops every process and removes its directory.
pub struct ControlPlane {
    procs: Vec<Proc>,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    server: String,
    token: String,
    tools: Tools,
    etcd_port: u16,
}

/// The audit policy: every write at the Metadata level (who, what, when, the answer), no reads.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: None\n  verbs: [get, list, watch]\n- level: Metadata\n";

const ADMIN_TOKEN_USER: &str = "gpuval-test-admin";
/// kwok's stages: fake nodes become Ready and keep heartbeating; agent pods are left to the
/// [`FakeKubelet`](crate::FakeKubelet); other pods on fake nodes run at once.
const KWOK_STAGES: &str = include_str!("kwok-stages.yaml");
const READY_TIMEOUT: Duration = Duration::from_secs(90);

impl ControlPlane {
    /// etcd + kube-apiserver.
    pub async fn start() -> Result<Self, Error> {
        Self::start_with(Options::default()).await
    }

    /// etcd + kube-apiserver plus the components `opts` asks for.
    ///
    /// Ports are picked free and then handed to the components, so a control plane started at
    /// the same moment (tests run in parallel) can take one in between; a start that failed
    /// only for that reason is tried again with new ports, up to [`START_ATTEMPTS`] times.
    pub async fn start_with(opts: Options) -> Result<Self, Error> {
        let mut attempt = 1;
        loop {
            match Self::start_once(opts.clone()).await {
                Err(e) if attempt < START_ATTEMPTS && e.is_port_taken() => {
                    eprintln!("control plane: a port was taken meanwhile, starting again: {e}");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(opts: Options) -> Result<Self, Error> {
        let started = Instant::now();
        let tools = Tools::locate().map_err(Error::Tools)?;
        let dir = tempfile::Builder::new()
            .prefix("gpuval-cp-")
            .tempdir()
            .map_err(io("create a temp dir"))?;
        let mut cp = Self {
            procs: Vec::new(),
            kubeconfig: dir.path().join("kubeconfig"),
            dir,
            server: String::new(),
            token: random_token(),
            tools,
            etcd_port: 0,
        };

        // etcd
        let etcd_client = free_port()?;
        cp.etcd_port = etcd_client;
        let etcd_peer = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let etcd_data = cp.dir.path().join("etcd");
        cp.spawn(
            "etcd",
            Command::new(cp.tools.path("etcd"))
                .arg(format!("--data-dir={}", etcd_data.display()))
                .arg(format!("--listen-client-urls={etcd_url}"))
                .arg(format!("--advertise-client-urls={etcd_url}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"
                ))
                .arg(format!(
                    "--initial-cluster=default=http://127.0.0.1:{etcd_peer}"
                ))
                .arg("--unsafe-no-fsync=true")
                .arg("--log-level=warn"),
        )?;
        cp.wait_tcp("etcd", etcd_client).await?;

        // kube-apiserver
        let pki = cp.dir.path().join("pki");
        std::fs::create_dir_all(&pki).map_err(io("create the pki dir"))?;
        let key =
            rcgen::KeyPair::generate().map_err(|e| Error::Tools(format!("generate a key: {e}")))?;
        let sa_key = pki.join("sa.key");
        let sa_pub = pki.join("sa.pub");
        std::fs::write(&sa_key, key.serialize_pem()).map_err(io("write sa.key"))?;
        std::fs::write(&sa_pub, key.public_key_pem()).map_err(io("write sa.pub"))?;
        let tokens = pki.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{},{ADMIN_TOKEN_USER},0,\"system:masters\"\n", cp.token),
        )
        .map_err(io("write tokens.csv"))?;
        let serving = Serving::new(opts.in_cluster.as_ref(), &pki)?;
        cp.server = format!("https://{}:{}", serving.address, serving.port);
        // Audit logging and optional APIs.
        let mut extra = Vec::new();
        if opts.audit_log {
            let policy = cp.dir.path().join("audit-policy.yaml");
            std::fs::write(&policy, AUDIT_POLICY).map_err(io("write the audit policy"))?;
            extra.push(format!("--audit-policy-file={}", policy.display()));
            extra.push(format!(
                "--audit-log-path={}",
                cp.dir.path().join("audit.log").display()
            ));
            extra.push("--audit-log-mode=blocking".into());
            // Never rotated (the default moves it aside at 100 MB): one file holds every write.
            extra.push("--audit-log-maxsize=0".into());
        }
        if opts.device_taint_rules {
            extra.push("--feature-gates=DRADeviceTaintRules=true".into());
            extra.push("--runtime-config=resource.k8s.io/v1beta2=true".into());
        }
        cp.spawn(
            "kube-apiserver",
            Command::new(cp.tools.path("kube-apiserver"))
                .args(&extra)
                .arg(format!("--etcd-servers={etcd_url}"))
                .arg(format!("--cert-dir={}", pki.display()))
                .arg(format!("--secure-port={}", serving.port))
                .arg(format!("--bind-address={}", serving.address))
                .arg(format!("--advertise-address={}", serving.address))
                .arg(format!(
                    "--service-cluster-ip-range={}",
                    serving.service_cidr
                ))
                .args(&serving.apiserver_args)
                .arg("--allow-privileged=true")
                .arg("--authorization-mode=RBAC")
                .arg(format!("--token-auth-file={}", tokens.display()))
                .arg(format!("--service-account-issuer={}", cp.server))
                .arg(format!("--service-account-key-file={}", sa_pub.display()))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    sa_key.display()
                ))
                .arg("--v=0"),
        )?;
        cp.write_kubeconfig()?;
        let client = cp.wait_apiserver().await?;

        if opts.controller_manager {
            cp.spawn(
                "kube-controller-manager",
                Command::new(
                    cp.tools
                        .require("kube-controller-manager")
                        .map_err(Error::Tools)?,
                )
                .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
                .arg("--leader-elect=false")
                .arg("--secure-port=0")
                .arg("--controllers=*,-serviceaccount-token")
                .arg(format!(
                    "--service-account-private-key-file={}",
                    sa_key.display()
                ))
                .arg("--concurrent-gc-syncs=5")
                .args(&serving.controller_manager_args)
                .arg("--v=0"),
            )?;
        }
        if opts.scheduler {
            cp.spawn(
                "kube-scheduler",
                Command::new(cp.tools.require("kube-scheduler").map_err(Error::Tools)?)
                    .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
                    .arg(format!(
                        "--authentication-kubeconfig={}",
                        cp.kubeconfig.display()
                    ))
                    .arg(format!(
                        "--authorization-kubeconfig={}",
                        cp.kubeconfig.display()
                    ))
                    .arg("--leader-elect=false")
                    .arg("--secure-port=0")
                    .arg("--v=0"),
            )?;
        }
        if opts.kwok {
            // kwok exits at once ("no stages found") unless it is given stages.
            let stages = cp.dir.path().join("kwok-stages.yaml");
            std::fs::write(&stages, KWOK_STAGES).map_err(io("write the kwok stages"))?;
            let kwok_port = free_port()?;
            cp.spawn(
                "kwok",
                Command::new(cp.tools.require("kwok").map_err(Error::Tools)?)
                    .arg(format!("--config={}", stages.display()))
                    .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
                    .arg("--manage-all-nodes=false")
                    .arg("--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake")
                    .arg("--cidr=10.0.0.0/16")
                    .arg("--node-ip=10.0.0.1")
                    .arg(format!("--server-address=127.0.0.1:{kwok_port}")),
            )?;
            cp.wait_tcp("kwok", kwok_port).await?;
        }
        let version = client
            .apiserver_version()
            .await
            .map_err(|e| Error::Kube(e.to_string()))?;
        println!(
            "control plane up: kube-apiserver {} at {} (etcd, {}{}{}) in {:.1}s",
            version.git_version,
            cp.server,
            if opts.controller_manager {
                "kube-controller-manager, "
            } else {
                ""
            },
            if opts.scheduler {
                "kube-scheduler, "
            } else {
                ""
            },
            if opts.kwok { "kwok" } else { "" },
            started.elapsed().as_secs_f64()
        );
        Ok(cp)
    }

    /// The API server's audit log, when [`Options::audit_log`] asked for one.
    pub fn audit_log(&self) -> Option<PathBuf> {
        let path = self.dir.path().join("audit.log");
        path.exists().then_some(path)
    }

    /// Writes an admin kubeconfig for another address of the API server (a proxy in front of
    /// it) to `path`.
    pub fn write_kubeconfig_for(&self, server: &str, path: &Path) -> Result<(), Error> {
        std::fs::write(path, crate::auth::token_kubeconfig(server, &self.token))
            .map_err(io(format!("write {}", path.display())))
    }

    /// Stops component `name` (SIGTERM, SIGKILL after 10 s) and waits for it to exit; its
    /// ports and data stay for [`start_again`](Self::start_again).
    pub fn stop(&mut self, name: &str) -> Result<(), Error> {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.name == name)
            .ok_or_else(|| Error::Tools(format!("no component {name}")))?;
        stop_child(&mut p.child, Duration::from_secs(10));
        Ok(())
    }

    /// Starts component `name` again as it was started first (same ports, same data
    /// directory), appending to its log, and waits until it serves (etcd: its client port;
    /// kube-apiserver: /readyz).
    pub async fn start_again(&mut self, name: &'static str) -> Result<(), Error> {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.name == name)
            .ok_or_else(|| Error::Tools(format!("no component {name}")))?;
        if matches!(p.child.try_wait(), Ok(None)) {
            return Err(Error::Tools(format!("{name} is still running")));
        }
        let out = std::fs::OpenOptions::new()
            .append(true)
            .open(&p.log)
            .map_err(io(format!("open {}", p.log.display())))?;
        let err = out.try_clone().map_err(io("clone a log handle"))?;
        let mut cmd = Command::new(&p.program);
        cmd.args(&p.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .current_dir(self.dir.path());
        die_with_parent(&mut cmd);
        p.child = cmd.spawn().map_err(io(format!("start {name} again")))?;
        match name {
            "etcd" => self.wait_tcp("etcd", self.etcd_port).await,
            "kube-apiserver" => self.wait_apiserver().await.map(|_| ()),
            _ => Ok(()),
        }
    }

    /// A new client with admin rights.
    pub async fn client(&self) -> Result<Client, Error> {
        let kc = Kubeconfig::read_from(&self.kubeconfig).map_err(|e| Error::Kube(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Kube(e.to_string()))?;
        Client::try_from(config).map_err(|e| Error::Kube(e.to_string()))
    }

    /// The admin kubeconfig file (for kubectl, helm, the operator process).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>` (or the [`InClusterApi`] address and port).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The control plane's temporary directory (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A kubectl command already pointed at this control plane.
    pub fn kubectl(&self) -> Result<Command, Error> {
        let mut cmd = Command::new(self.tools.require("kubectl").map_err(Error::Tools)?);
        cmd.env("KUBECONFIG", &self.kubeconfig);
        Ok(cmd)
    }

    /// Path of a Go-built tool (helm, kubectl, ...).
    pub fn tool(&self, name: &str) -> Result<PathBuf, Error> {
        self.tools.require(name).map_err(Error::Tools)
    }

    fn write_kubeconfig(&self) -> Result<(), Error> {
        let kc = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: gpuval-test\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\n\
             users:\n- name: admin\n  user:\n    token: {}\ncontexts:\n- name: gpuval-test\n  context:\n    cluster: gpuval-test\n    user: admin\n\
             current-context: gpuval-test\n",
            self.server, self.token
        );
        std::fs::write(&self.kubeconfig, kc).map_err(io("write the kubeconfig"))
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) -> Result<(), Error> {
        let log = self.dir.path().join(format!("{name}.log"));
        let out = File::create(&log).map_err(io(format!("create {}", log.display())))?;
        let err = out.try_clone().map_err(io("clone a log handle"))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .current_dir(self.dir.path());
        die_with_parent(cmd);
        let child = cmd.spawn().map_err(io(format!("start {name}")))?;
        self.procs.push(Proc {
            name,
            child,
            log,
            program: cmd.get_program().to_os_string(),
            args: cmd.get_args().map(|a| a.to_os_string()).collect(),
        });
        Ok(())
    }

    fn check_alive(&mut self, name: &'static str) -> Result<(), Error> {
        if let Some(p) = self.procs.iter_mut().find(|p| p.name == name)
            && let Ok(Some(status)) = p.child.try_wait()
        {
            return Err(Error::Exited {
                component: name,
                status: status.to_string(),
                log: tail(&p.log, 30),
            });
        }
        Ok(())
    }

    fn log_tail(&self, name: &str) -> String {
        self.procs
            .iter()
            .find(|p| p.name == name)
            .map(|p| tail(&p.log, 30))
            .unwrap_or_default()
    }

    async fn wait_tcp(&mut self, name: &'static str, port: u16) -> Result<(), Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        loop {
            self.check_alive(name)?;
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady {
                    component: name,
                    secs: READY_TIMEOUT.as_secs(),
                    log: self.log_tail(name),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls `/readyz` until it answers ok (the API server checks etcd and its post-start hooks).
    async fn wait_apiserver(&mut self) -> Result<Client, Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive("kube-apiserver")?;
            if let Ok(client) = self.client().await {
                let req = http::Request::get("/readyz").body(Vec::new());
                if let Ok(req) = req
                    && let Ok(text) = client.request_text(req).await
                    && text.trim() == "ok"
                {
                    return Ok(client);
                }
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady {
                    component: "kube-apiserver",
                    secs: READY_TIMEOUT.as_secs(),
                    log: self.log_tail("kube-apiserver"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Read the logs before shutdown noise lands in them.
            for p in &self.procs {
                eprintln!(
                    "---- {} log (last lines) ----\n{}",
                    p.name,
                    tail(&p.log, 25)
                );
            }
        }
        // Stop in reverse order of start (clients first, etcd last), each fully before the next.
        for p in self.procs.iter_mut().rev() {
            stop_child(&mut p.child, Duration::from_secs(5));
        }
    }
}

/// Starts `cmd` with no input and its output going to `log` (created afresh); it dies with the
/// test process ([`die_with_parent`]).
pub(crate) fn spawn_logged(cmd: &mut Command, log: &Path) -> Result<Child, String> {
    let out = File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("clone a log handle: {e}"))?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    die_with_parent(cmd);
    cmd.spawn()
        .map_err(|e| format!("start {}: {e}", Path::new(cmd.get_program()).display()))
}

/// Makes the kernel kill the child if the spawning thread dies, so nothing outlives a test
/// process that is killed outright.
pub(crate) fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// SIGTERM, then SIGKILL after `grace`; waits for the exit. A child that exited already (and
/// was waited for) is left alone, so no reused pid is signalled.
fn stop_child(child: &mut Child, grace: Duration) {
    if !matches!(child.try_wait(), Ok(None)) {
        return;
    }
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: plain kill(2) on our own child, not yet reaped (try_wait said it runs).
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + grace;
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Where and how kube-apiserver serves: a free loopback port with its own self-signed
/// certificate and no service-account tokens in pods (nothing runs pods but the fake kubelet),
/// or what [`InClusterApi`] says.
struct Serving {
    address: std::net::Ipv4Addr,
    port: u16,
    service_cidr: String,
    apiserver_args: Vec<String>,
    controller_manager_args: Vec<String>,
}

impl Serving {
    fn new(in_cluster: Option<&InClusterApi>, pki: &Path) -> Result<Self, Error> {
        let Some(api) = in_cluster else {
            return Ok(Self {
                address: std::net::Ipv4Addr::LOCALHOST,
                port: free_port()?,
                service_cidr: "10.0.0.0/24".into(),
                apiserver_args: vec!["--disable-admission-plugins=ServiceAccount".into()],
                controller_manager_args: Vec::new(),
            });
        };
        let file = |name: &str, pem: &str| -> Result<PathBuf, Error> {
            let path = pki.join(name);
            std::fs::write(&path, pem).map_err(io(format!("write {}", path.display())))?;
            Ok(path)
        };
        let cert = file("serving.crt", &api.cert_pem)?;
        let key = file("serving.key", &api.key_pem)?;
        let ca = file("cluster-ca.crt", &api.ca_pem)?;
        Ok(Self {
            address: api.address,
            port: api.port,
            service_cidr: api.service_cidr.clone(),
            apiserver_args: vec![
                format!("--tls-cert-file={}", cert.display()),
                format!("--tls-private-key-file={}", key.display()),
            ],
            controller_manager_args: vec![format!("--root-ca-file={}", ca.display())],
        })
    }
}

fn free_port() -> Result<u16, Error> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io("find a free port"))?;
    l.local_addr().map(|a| a.port()).map_err(io("read a port"))
}

fn random_token() -> String {
    // Unique per control plane; the API server only listens on loopback.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("gpuval-{:x}-{:x}", nanos, std::process::id())
}

/// The last `n` lines of a log file.
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    let lines: Vec<_> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_taken_address_makes_a_start_worth_repeating() {
        let exited = |log: &str| Error::Exited {
            component: "etcd",
            status: "exit status: 1".into(),
            log: log.into(),
        };
        assert!(exited("listen tcp 127.0.0.1:38199: bind: address already in use").is_port_taken());
        assert!(!exited("flag provided but not defined: -bogus").is_port_taken());
        let not_ready = Error::NotReady {
            component: "kube-apiserver",
            secs: 60,
            log: "address already in use".into(),
        };
        assert!(!not_ready.is_port_taken());
    }
}
