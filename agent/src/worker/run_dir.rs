//! A private directory for one child's logs and library link, removed afterwards. It lives
//! under the agent's temporary directory (`$TMPDIR`, else `/tmp`); where that cannot hold it
//! (a pod's read-only root filesystem) the error says so and how to fix it.

use std::path::{Path, PathBuf};

use crate::backend::BackendError;

/// `$TMPDIR/<prefix>-<pid>-<nanos>`, removed on drop.
pub struct RunDir(PathBuf);

impl RunDir {
    pub fn create(prefix: &str) -> Result<Self, BackendError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let temp = std::env::temp_dir();
        let path = temp.join(format!("{prefix}-{}-{nanos:08x}", std::process::id()));
        if let Err(e) = std::fs::create_dir_all(&path) {
            tracing::warn!(temp = %temp.display(), dir = %path.display(), error = %e, "the temporary directory cannot hold a run directory");
            return Err(BackendError::TempDir {
                temp,
                dir: path,
                source: e.into(),
            });
        }
        Ok(Self(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::debug!(dir = %self.0.display(), error = %e, "removing the run directory failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_directories_are_private_and_removed() {
        let d = RunDir::create("gpuval-test").expect("a run dir");
        let p = d.path().to_path_buf();
        assert!(p.is_dir());
        drop(d);
        assert!(!p.exists());
    }
}
