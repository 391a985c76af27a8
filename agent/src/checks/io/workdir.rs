//! The check's own subdirectory of the directory it was given. Everything the check writes
//! lives in it, and it is removed with its contents on every path: explicitly at the end of a
//! run (so a failure to remove is reported), and by `Drop` on an early return or a panic.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// A fresh, uniquely named directory, removed when dropped.
#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
    removed: bool,
}

impl WorkDir {
    /// Creates `parent/gpuval-io-<pid>-<nanos>` (mode 0700). Never reuses an existing one.
    pub fn create(parent: &Path) -> io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!("gpuval-io-{}-{nanos:x}", std::process::id());
        let path = parent.join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map(|()| Self {
                path,
                removed: false,
            })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory and everything in it.
    pub fn remove(mut self) -> io::Result<()> {
        self.removed = true;
        remove(&self.path)
    }
}

fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.removed
            && let Err(e) = remove(&self.path)
        {
            tracing::error!(dir = %self.path.display(), error = %e, "could not remove the io check's files");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_explicitly_and_on_drop() {
        let parent = tempfile::tempdir().unwrap();
        let w = WorkDir::create(parent.path()).unwrap();
        std::fs::write(w.path().join("f"), b"x").unwrap();
        w.remove().unwrap();
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);

        let w = WorkDir::create(parent.path()).unwrap();
        std::fs::create_dir(w.path().join("sub")).unwrap();
        std::fs::write(w.path().join("sub/g"), b"y").unwrap();
        drop(w);
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    #[test]
    fn two_in_a_row_get_distinct_names() {
        let parent = tempfile::tempdir().unwrap();
        let a = WorkDir::create(parent.path()).unwrap();
        let b = WorkDir::create(parent.path()).unwrap();
        assert_ne!(a.path(), b.path());
    }
}
