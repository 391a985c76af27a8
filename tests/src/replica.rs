//! Operator replicas as processes of the real binary with `--leader-elect`, each under its own
//! service account (so the API server's audit log tells their writes apart), that a test can
//! kill (SIGKILL), stop (SIGTERM), pause (SIGSTOP) and resume (SIGCONT).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::ControlPlane;
use crate::control_plane::spawn_logged;

/// The leader-election timing replicas run with in tests (the binary's defaults, 15/10/2 s).
#[derive(Debug, Clone, Copy)]
pub struct LeaseTiming {
    pub duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What every replica of a test shares.
#[derive(Debug, Clone)]
pub struct ReplicaSettings {
    pub namespace: String,
    pub lease: String,
    /// `GPUVAL_SIMULATE` for the agents.
    pub simulate: String,
    pub timing: LeaseTiming,
}

/// One operator process.
pub struct Replica {
    pub name: String,
    child: Child,
    log: PathBuf,
    paused: bool,
}

impl Replica {
    /// The user the API server sees for replica `name`.
    pub fn user(namespace: &str, name: &str) -> String {
        format!("system:serviceaccount:{namespace}:{name}")
    }

    /// Creates service account `name` (cluster-admin) and starts the operator binary under its
    /// token, as pod `name`, with leader election.
    pub async fn start(
        cp: &ControlPlane,
        admin: &Client,
        name: &str,
        settings: &ReplicaSettings,
    ) -> Result<Replica, String> {
        let kubeconfig = identity(cp, admin, &settings.namespace, name).await?;
        let binary = crate::binaries::operator_binary()?;
        let log = cp.dir().join(format!("{name}.log"));
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("find a free port: {e}"))?;
        let t = settings.timing;
        let mut cmd = Command::new(&binary);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", name)
            .env("RUST_LOG", "info,kube=warn")
            .args(["--namespace", &settings.namespace])
            .args(["--agent-image", "gpuval-agent:test"])
            .args(["--agent-toleration", "kwok.x-k8s.io/node=fake:NoSchedule"])
            .arg(format!("--agent-env=GPUVAL_SIMULATE={}", settings.simulate))
            .arg(format!("--metrics-addr={metrics}"))
            .args(["--leader-elect", "--lease-name", &settings.lease])
            .arg(format!("--lease-duration={}", t.duration.as_secs()))
            .arg(format!(
                "--lease-renew-deadline={}",
                t.renew_deadline.as_secs()
            ))
            .arg(format!("--lease-retry-period={}", t.retry_period.as_secs()))
            .args(["--log-format", "text"]);
        // The replica dies with the test process.
        let child = spawn_logged(&mut cmd, &log)?;
        Ok(Replica {
            name: name.to_string(),
            child,
            log,
            paused: false,
        })
    }

    fn signal(&self, sig: libc::c_int) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child; it is reaped only in kill()/exited()/drop,
            // after which no signal is sent (the callers check).
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// SIGKILL (a crash: no lease hand-back, no cleanup) and waits for it.
    pub fn kill(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// SIGTERM (what the kubelet sends a pod being stopped); [`exited`](Self::exited) tells
    /// when it has ended.
    pub fn terminate(&mut self) {
        if self.exited().is_none() {
            self.signal(libc::SIGTERM);
        }
    }

    /// SIGSTOP: the process keeps its sockets but runs nothing (a long GC pause, a frozen VM).
    pub fn pause(&mut self) {
        if self.exited().is_none() {
            self.signal(libc::SIGSTOP);
            self.paused = true;
        }
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&mut self) {
        if self.exited().is_none() {
            self.signal(libc::SIGCONT);
            self.paused = false;
        }
    }

    /// The exit status once the process has ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// What it logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if self.paused {
            self.resume();
        }
        self.kill();
    }
}

/// Service account `name` bound to cluster-admin, and a kubeconfig with its token (the API
/// server's audit log names its requests `system:serviceaccount:NAMESPACE:NAME`).
pub async fn identity(
    cp: &ControlPlane,
    admin: &Client,
    namespace: &str,
    name: &str,
) -> Result<PathBuf, String> {
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace}}))
            .map_err(|e| e.to_string())?;
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await
        .map_err(|e| format!("create service account {name}: {e}"))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-admin")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }))
    .map_err(|e| e.to_string())?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .map_err(|e| format!("bind {name} to cluster-admin: {e}"))?;
    let token = crate::auth::request_token(admin, namespace, name, None)
        .await
        .map_err(|e| format!("token for {name}: {e}"))?;
    let path = cp.dir().join(format!("{name}.kubeconfig"));
    std::fs::write(&path, crate::auth::token_kubeconfig(cp.server(), &token))
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    Ok(path)
}
