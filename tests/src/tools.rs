//! Where the Go-built control-plane binaries live (outside the repository).

use std::path::{Path, PathBuf};

/// Kubernetes version the build script pins; keep in sync with build-control-plane.sh.
pub const K8S_VERSION: &str = "1.36.3";

/// The cache directory the build script writes to: `$GPUVAL_TOOLS_DIR`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/gpuval/tools-k8s<version>`; binaries are in `bin/`.
pub fn tools_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("GPUVAL_TOOLS_DIR") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    cache.join("gpuval").join(format!("tools-k8s{K8S_VERSION}"))
}

/// Paths of the control-plane binaries.
#[derive(Debug, Clone)]
pub struct Tools {
    pub bin: PathBuf,
}

impl Tools {
    /// Finds the binaries, or says how to build them.
    pub fn locate() -> Result<Self, String> {
        let bin = tools_dir().join("bin");
        let needed = ["etcd", "kube-apiserver"];
        let missing: Vec<_> = needed.iter().filter(|b| !bin.join(b).is_file()).collect();
        if missing.is_empty() {
            Ok(Self { bin })
        } else {
            Err(format!(
                "control-plane binaries {missing:?} not found in {}: run tests/scripts/build-control-plane.sh \
                 (or `make test`, which runs it) to build them with Go",
                bin.display()
            ))
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    pub fn require(&self, name: &str) -> Result<PathBuf, String> {
        crate::binaries::existing_file(self.path(name), |p| {
            format!(
                "{name} not found at {}: run tests/scripts/build-control-plane.sh",
                p.display()
            )
        })
    }

    pub fn dir(&self) -> &Path {
        &self.bin
    }
}
