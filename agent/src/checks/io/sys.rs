//! The few system calls std does not wrap: statvfs/statfs (free space, read-only flag,
//! filesystem type), posix_fadvise (drop a file's page cache), and opening with O_DIRECT.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// What the filesystem of a directory says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsInfo {
    /// Bytes an unprivileged writer may still use (`f_bavail × f_frsize`).
    pub free_bytes: u64,
    /// False where the filesystem keeps no size (ramfs, some FUSE): free space is unknown.
    pub sized: bool,
    pub read_only: bool,
    /// `ext4`, `xfs`, `tmpfs`, ... from the statfs magic; None when not one we know.
    pub fs_type: Option<&'static str>,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// statvfs + statfs of `dir`.
pub fn fs_info(dir: &Path) -> io::Result<FsInfo> {
    let c = c_path(dir)?;
    let mut vfs = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `vfs` points to writable memory of the right type.
    if unsafe { libc::statvfs(c.as_ptr(), vfs.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the struct (and it was zeroed before anyway).
    let vfs = unsafe { vfs.assume_init() };
    let mut sfs = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: as above, for statfs.
    let fs_type = if unsafe { libc::statfs(c.as_ptr(), sfs.as_mut_ptr()) } == 0 {
        // SAFETY: statfs returned 0 and the struct was zeroed before the call.
        let sfs = unsafe { sfs.assume_init() };
        // f_type's width differs between targets (i64 on x86_64 and aarch64).
        #[allow(clippy::unnecessary_cast)]
        fs_name(sfs.f_type as i64)
    } else {
        None
    };
    // fsblkcnt_t and c_ulong are u64 on 64-bit Linux, narrower on some 32-bit targets.
    #[allow(clippy::useless_conversion)]
    Ok(FsInfo {
        free_bytes: u64::from(vfs.f_bavail).saturating_mul(u64::from(vfs.f_frsize)),
        sized: vfs.f_blocks != 0,
        read_only: vfs.f_flag & libc::ST_RDONLY != 0,
        fs_type,
    })
}

/// Names of the statfs magic numbers a node volume is likely to be on.
fn fs_name(magic: i64) -> Option<&'static str> {
    Some(match magic & 0xffff_ffff {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x8584_58f6 => "ramfs",
        0x2FC1_2FC1 => "zfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0xFE53_4D42 => "smb2",
        0x00C3_6400 => "ceph",
        0x6573_5546 => "fuse",
        0x0BD0_0BD0 => "lustre",
        0x4750_4653 => "gpfs",
        0xF2F5_2010 => "f2fs",
        0x5346_544E => "ntfs",
        _ => return None,
    })
}

/// Opens `path` for the check: create-new for writing or read-only, with O_DIRECT when `direct`.
pub fn open(path: &Path, write: bool, direct: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    if write {
        o.write(true).create_new(true).mode(0o600);
    } else {
        o.read(true);
    }
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

/// Drops the file's pages from the page cache (after fsync), so a buffered read-back reads the
/// device and not memory. Advisory: a filesystem may ignore it.
pub fn drop_cache(file: &File) -> io::Result<()> {
    // SAFETY: the descriptor is open for the lifetime of `file`; the call only takes integers.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// fsync of a directory (so the new entries are durable).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The errno's symbolic name for the ones the check explains.
pub fn errno_name(e: &io::Error) -> Option<&'static str> {
    Some(match e.raw_os_error()? {
        libc::ENOSPC => "ENOSPC",
        libc::EDQUOT => "EDQUOT",
        libc::EROFS => "EROFS",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EINVAL => "EINVAL",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::ENODEV => "ENODEV",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fs_info_of_a_temp_dir() {
        let d = tempfile::tempdir().unwrap();
        let info = fs_info(d.path()).unwrap();
        assert!(info.sized);
        assert!(!info.read_only);
        assert!(info.free_bytes > 0);
        assert!(fs_info(&d.path().join("missing")).is_err());
    }

    #[test]
    fn known_magics_have_names() {
        assert_eq!(fs_name(0xEF53), Some("ext4"));
        assert_eq!(fs_name(0x0102_1994), Some("tmpfs"));
        assert_eq!(fs_name(0x1234), None);
    }
}
