//! The Helm chart in tests: rendering it with the Go-built helm, the linters its tests use, and
//! running the operator the way the chart's Deployment would (its container's environment, its
//! service account's token) as a local process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::control_plane::spawn_logged;
use crate::tools::{K8S_VERSION, Tools};

/// `charts/gpuval`.
pub fn chart_dir() -> PathBuf {
    crate::crds::repo_root().join("charts/gpuval")
}

/// A helm command with its caches in `target/helm-home` (nothing of the user's is read or
/// written) and capabilities of the Kubernetes version the tests run (a Go-built helm would
/// otherwise assume an old default).
pub fn helm() -> Result<Command, String> {
    let tools = Tools::locate()?;
    let mut cmd = Command::new(tools.require("helm")?);
    // Under the build's own target folder, so that the tests leave nothing in /tmp.
    let home = crate::crds::repo_root().join("target").join("helm-home");
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    Ok(cmd)
}

/// `--kube-version` for `helm template` and `helm lint`.
pub fn kube_version_arg() -> String {
    format!("--kube-version={K8S_VERSION}")
}

/// Output of a finished command: Ok(stdout) on success, Err(exit status, stderr, stdout)
/// otherwise.
pub fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("run {:?}: {e}", cmd.get_program()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            stdout
        ))
    }
}

/// `helm install <release> charts/gpuval -n <namespace> --create-namespace -f <values>` into the
/// cluster of `kubeconfig`; the NOTES it prints.
pub fn install(
    release: &str,
    namespace: &str,
    values: &Path,
    kubeconfig: &Path,
) -> Result<String, String> {
    let mut cmd = helm()?;
    cmd.args(["install", release])
        .arg(chart_dir())
        .args(["--namespace", namespace, "--create-namespace", "--values"])
        .arg(values)
        .arg("--kubeconfig")
        .arg(kubeconfig);
    output(&mut cmd)
}

/// `helm uninstall <release> -n <namespace> --wait` (and `extra` flags) in the cluster of
/// `kubeconfig`.
pub fn uninstall(
    release: &str,
    namespace: &str,
    kubeconfig: &Path,
    extra: &[&str],
) -> Result<String, String> {
    let mut cmd = helm()?;
    cmd.args(["uninstall", release, "--namespace", namespace, "--wait"])
        .args(extra)
        .arg("--kubeconfig")
        .arg(kubeconfig);
    output(&mut cmd)
}

/// `helm template <release> charts/gpuval -n <namespace> -f <values>...`, the manifests as text.
pub fn render(release: &str, namespace: &str, values: &[&Path]) -> Result<String, String> {
    let mut cmd = helm()?;
    cmd.args(["template", release]).arg(chart_dir()).args([
        "--namespace",
        namespace,
        &kube_version_arg(),
    ]);
    for v in values {
        cmd.arg("--values").arg(v);
    }
    output(&mut cmd)
}

/// The documents of a multi-document YAML text, as JSON values (empty documents dropped).
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("parse YAML: {e}"))?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

/// The paths of the PyPI-installed linters (see `tests/scripts/install-chart-tools.sh`, which
/// this runs: it installs what is missing and fails when it cannot).
#[derive(Debug, Clone)]
pub struct ChartTools {
    pub hadolint: PathBuf,
    pub lupa_pythonpath: PathBuf,
    /// securesystemslib (DSSE) and junitparser, the standard readers of gpuval's evidence.
    pub evidence_pythonpath: PathBuf,
}

impl ChartTools {
    pub fn install() -> Result<Self, String> {
        let script = crate::crds::repo_root().join("tests/scripts/install-chart-tools.sh");
        let out = output(Command::new("bash").arg(&script))
            .map_err(|e| format!("{} failed: {e}", script.display()))?;
        let get = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .map(PathBuf::from)
                .ok_or_else(|| format!("{} printed no {key}: {out}", script.display()))
        };
        Ok(Self {
            hadolint: get("HADOLINT")?,
            lupa_pythonpath: get("LUPA_PYTHONPATH")?,
            evidence_pythonpath: get("EVIDENCE_PYTHONPATH")?,
        })
    }
}

/// Runs the Argo CD health check `deploy/examples/gitops/argocd/health.lua` on `objects` with
/// Lua 5.1 (lupa; see `tests/scripts/argocd-health.py`); one `{status, message}` per object.
pub fn argocd_health(tools: &ChartTools, objects: &[Value]) -> Result<Vec<Value>, String> {
    use std::io::Write;
    let root = crate::crds::repo_root();
    let mut child = Command::new("python3")
        .arg(root.join("tests/scripts/argocd-health.py"))
        .arg(root.join("deploy/examples/gitops/argocd/health.lua"))
        .env("PYTHONPATH", &tools.lupa_pythonpath)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("run python3: {e}"))?;
    let input = serde_json::to_string(objects).map_err(|e| e.to_string())?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(input.as_bytes())
        .map_err(|e| format!("write to the Lua runner: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("wait for the Lua runner: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the Lua runner failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("the Lua runner's answer: {e}"))
}

/// The first container of a rendered Deployment, and its environment resolved the way a
/// kubelet would for the fields the chart uses (`metadata.namespace`, `metadata.name`).
pub fn deployment_env(
    deployment: &Value,
    namespace: &str,
    pod_name: &str,
) -> Result<Vec<(String, String)>, String> {
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"]
        .as_array()
        .ok_or("the Deployment's container has no env")?;
    let mut out = Vec::new();
    for var in env {
        let name = var["name"].as_str().ok_or("env entry without a name")?;
        let value = if let Some(v) = var.get("value") {
            v.as_str()
                .ok_or_else(|| format!("env {name}: value is not a string: {v}"))?
                .to_string()
        } else {
            match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.namespace") => namespace.to_string(),
                Some("metadata.name") => pod_name.to_string(),
                other => return Err(format!("env {name}: unsupported source {other:?}")),
            }
        };
        out.push((name.to_string(), value));
    }
    Ok(out)
}

/// The operator binary running as a local process in place of the chart's Deployment pod.
/// Dropping it kills the process.
pub struct OperatorProcess {
    child: Child,
    log: PathBuf,
}

impl OperatorProcess {
    /// Starts `binary` with the container's arguments and exactly `env` (plus PATH and
    /// `KUBECONFIG=kubeconfig`), output going to `log`.
    pub fn start(
        binary: &Path,
        args: &[String],
        env: &[(String, String)],
        kubeconfig: &Path,
        log: PathBuf,
    ) -> Result<Self, String> {
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("KUBECONFIG", kubeconfig);
        // The operator dies with the test process.
        let child = spawn_logged(&mut cmd, &log)?;
        Ok(Self { child, log })
    }

    /// Still running? Err with the exit status and the log when it stopped.
    pub fn check_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "the operator exited ({status}); its log:\n{}",
                self.logs()
            )),
            Err(e) => Err(format!("wait for the operator: {e}")),
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
