//! Why the io check could not run or finish: each error names the thing that is wrong and
//! what to do about it. These are not hardware verdicts (the check reports `Error`), except a
//! disk that failed an operation or read back short ([`IoError::is_device_fault`]: a `Fail`).

use std::io;
use std::path::{Path, PathBuf};

use super::sys;

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// No directory was configured for the check.
    #[error(
        "no directory for the io check: pass --io-dir DIR (or set GPUVAL_IO_DIR); on Kubernetes, ask the cluster admin to set the operator's --io-host-path (Helm values agent.io.hostPath inside agent.io.allowedPaths)"
    )]
    NoDirectory,
    #[error(
        "io directory {} does not exist: create it or point the io check at an existing directory",
        dir.display()
    )]
    MissingDir { dir: PathBuf },
    #[error("io directory {} is not a directory", dir.display())]
    NotADirectory { dir: PathBuf },
    #[error(
        "io directory {} is on a read-only filesystem (EROFS): mount it read-write or use another directory",
        dir.display()
    )]
    ReadOnly { dir: PathBuf },
    #[error(
        "io directory {} is not writable by this process ({errno}): give the agent write permission or use another directory",
        dir.display()
    )]
    NotWritable { dir: PathBuf, errno: &'static str },
    #[error(
        "not enough free space in {}: the io check needs {} ({files} files of {}, plus a margin), the filesystem has {} free; lower files or fileSizeMib, or free space",
        dir.display(), human(*need), human(*file_size), human(*have)
    )]
    NoSpace {
        dir: PathBuf,
        need: u64,
        have: u64,
        files: u32,
        file_size: u64,
    },
    #[error(
        "disk full ({errno}) in {} while writing {file} at offset {offset}: something else filled the filesystem during the check, or it holds less than it reported",
        dir.display()
    )]
    DiskFull {
        dir: PathBuf,
        file: String,
        offset: u64,
        errno: &'static str,
    },
    #[error("{file} read back {got} bytes, {want} were written")]
    ShortRead { file: String, got: u64, want: u64 },
    #[error(
        "{op} {}: {errno} ({source}): the disk under the io directory returned an I/O error",
        path.display()
    )]
    Device {
        op: &'static str,
        path: PathBuf,
        errno: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("bad io request: {0}")]
    BadRequest(String),
    #[error("stopped before completion")]
    Stopped,
}

impl IoError {
    /// True when the directory the check was given cannot serve it (missing, not a
    /// directory, read-only, not writable, too small for the files asked for) or the request
    /// itself is bad: the installation's settings, never the node's disk.
    pub fn is_unusable_dir(&self) -> bool {
        matches!(
            self,
            Self::NoDirectory
                | Self::MissingDir { .. }
                | Self::NotADirectory { .. }
                | Self::ReadOnly { .. }
                | Self::NotWritable { .. }
                | Self::NoSpace { .. }
                | Self::BadRequest(_)
        )
    }

    /// True when the disk itself failed: an I/O error from the device (EIO, ENXIO, ENODEV) or
    /// a file that read back shorter than written. The node's hardware, never the settings.
    pub fn is_device_fault(&self) -> bool {
        matches!(self, Self::Device { .. } | Self::ShortRead { .. })
    }

    /// Turns an OS error into the check's error: a read-only or full filesystem and missing
    /// permission get their own variants, an I/O error of the device is the disk's fault
    /// ([`IoError::Device`]), anything else says what was done to which path.
    pub fn classify(e: io::Error, op: &'static str, dir: &Path, path: &Path, offset: u64) -> Self {
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        match sys::errno_name(&e) {
            Some("EROFS") => Self::ReadOnly { dir: dir.into() },
            Some(errno @ ("EACCES" | "EPERM")) => Self::NotWritable {
                dir: dir.into(),
                errno,
            },
            Some(errno @ ("ENOSPC" | "EDQUOT")) => Self::DiskFull {
                dir: dir.into(),
                file,
                offset,
                errno,
            },
            Some(errno @ ("EIO" | "ENXIO" | "ENODEV")) => Self::Device {
                op,
                path: path.into(),
                errno,
                source: e,
            },
            _ => Self::Io {
                op,
                path: path.into(),
                source: e,
            },
        }
    }
}

/// Bytes as `1.5 GiB`, `256 MiB`, `12 KiB`, `100 B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            return if v.fract() == 0.0 {
                format!("{v:.0} {unit}")
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(4 << 30), "4 GiB");
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(256 << 20), "256 MiB");
        assert_eq!(human(100), "100 B");
    }

    #[test]
    fn errnos_get_their_own_words() {
        let d = Path::new("/data");
        let p = Path::new("/data/w/file-0001");
        let e = |n| io::Error::from_raw_os_error(n);
        let t = IoError::classify(e(libc::ENOSPC), "write", d, p, 4096).to_string();
        assert!(
            t.contains("ENOSPC") && t.contains("file-0001") && t.contains("offset 4096"),
            "{t}"
        );
        let t = IoError::classify(e(libc::EROFS), "create", d, p, 0).to_string();
        assert!(t.contains("read-only") && t.contains("EROFS"), "{t}");
        let t = IoError::classify(e(libc::EACCES), "create", d, p, 0).to_string();
        assert!(t.contains("not writable") && t.contains("EACCES"), "{t}");
        let t = IoError::classify(e(libc::EIO), "read", d, p, 0).to_string();
        assert!(t.starts_with("read /data/w/file-0001: EIO"), "{t}");
        assert!(t.contains("the disk"), "{t}");
    }
}
