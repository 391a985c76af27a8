//! Binaries of this workspace that tests run as processes (the operator as its Deployment would
//! run it), built on first use so they are never stale.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// `target/debug/<bin>` of package `package` (under `$CARGO_TARGET_DIR` when set), built with
/// `cargo build -p <package> --bin <bin>` once per test process (a no-op when up to date).
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf, String> {
    static BUILT: Mutex<Option<HashMap<String, Result<PathBuf, String>>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let map = built.get_or_insert_with(HashMap::new);
    map.entry(format!("{package}/{bin}"))
        .or_insert_with(|| build(package, bin))
        .clone()
}

/// `kubectl-gpuval ARGS` against the cluster of `kubeconfig`, run to its end (the plugin built
/// on first use); panics when it cannot be built or started.
pub fn run_plugin(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    let bin = workspace_binary("kubectl-gpuval", "kubectl-gpuval")
        .unwrap_or_else(|e| panic!("the kubectl-gpuval binary: {e}"));
    std::process::Command::new(bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("run kubectl-gpuval: {e}"))
}

/// The operator binary (`GPUVAL_OPERATOR_BIN` names a binary to use as it is instead).
pub fn operator_binary() -> Result<PathBuf, String> {
    given_or_built("GPUVAL_OPERATOR_BIN", "gpuval-operator", "gpuval-operator")
}

/// The agent binary (`GPUVAL_AGENT_BIN` names a binary to use as it is instead).
pub fn agent_binary() -> Result<PathBuf, String> {
    given_or_built("GPUVAL_AGENT_BIN", "gpuval-agent", "gpuval-agent")
}

/// The binary named by the environment variable `var` when set (it must exist), else
/// [`workspace_binary`].
fn given_or_built(var: &str, package: &str, bin: &str) -> Result<PathBuf, String> {
    match std::env::var_os(var) {
        Some(given) => {
            let given = PathBuf::from(given);
            if given.is_file() {
                Ok(given)
            } else {
                Err(format!("{var}={} is not a file", given.display()))
            }
        }
        None => workspace_binary(package, bin),
    }
}

fn build(package: &str, bin: &str) -> Result<PathBuf, String> {
    let root = crate::crds::repo_root();
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    };
    let path = target.join("debug").join(bin);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(&cargo);
    cmd.args(["build", "-p", package, "--bin", bin])
        .current_dir(&root);
    // A test process has its own package's CARGO_* variables; passing them on would make some
    // build scripts (ring's) see a change and rebuild, in this build and in the next `cargo test`.
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || matches!(
                k.as_ref(),
                "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            )
        {
            cmd.env_remove(&key);
        }
    }
    let status = cmd
        .status()
        .map_err(|e| format!("run cargo build -p {package}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "cargo build -p {package} --bin {bin} failed ({status})"
        ));
    }
    existing_file(path, |p| {
        format!(
            "cargo build -p {package} succeeded but {} is missing",
            p.display()
        )
    })
}

/// `path` where it is a file; else the error `missing` words for it.
pub fn existing_file(
    path: PathBuf,
    missing: impl FnOnce(&Path) -> String,
) -> Result<PathBuf, String> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(missing(&path))
    }
}
