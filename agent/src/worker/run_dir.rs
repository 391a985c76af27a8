//! A private directory for one child's logs and library link, removed afterwards.

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
        let path =
            std::env::temp_dir().join(format!("{prefix}-{}-{nanos:08x}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map_err(|e| BackendError::Other(format!("create {}: {e}", path.display())))?;
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
