//! What a host needs for a real node, and the lock that keeps to one real node per host.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::tools::Tools;

/// Set to 1 to fail, not skip, where the host cannot run the real node (CI sets `CI=true`,
/// which does the same).
pub const REQUIRE_ENV: &str = "GPUVAL_REQUIRE_REAL_NODE";

/// True when a test that cannot have its real node must fail instead of skipping.
pub fn required() -> bool {
    required_by(
        std::env::var("CI").ok().as_deref(),
        std::env::var(REQUIRE_ENV).ok().as_deref(),
    )
}

fn required_by(ci: Option<&str>, require: Option<&str>) -> bool {
    matches!(ci.map(str::trim), Some(v) if v.eq_ignore_ascii_case("true") || v == "1")
        || require.map(str::trim) == Some("1")
}

/// Where the CNI plugins may be (Debian's containernetworking-plugins, then the upstream path).
const CNI_DIRS: [&str; 2] = ["/usr/lib/cni", "/opt/cni/bin"];
const CNI_PLUGINS: [&str; 3] = ["bridge", "host-local", "loopback"];
const APT_HINT: &str = "apt-get install containerd runc containernetworking-plugins";

/// The host programs a real node runs.
#[derive(Debug, Clone)]
pub struct HostTools {
    pub containerd: PathBuf,
    pub ctr: PathBuf,
    pub runc: PathBuf,
    pub cni_bin: PathBuf,
    pub ip: PathBuf,
    pub kubelet: PathBuf,
}

impl HostTools {
    /// Finds them, or says what is missing and how to get it.
    pub fn locate() -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("it needs root (containerd, the kubelet and the pod bridge do)".into());
        }
        let on_path = |name: &str, hint: &str| {
            find_on_path(name).ok_or_else(|| format!("{name} is not installed ({hint})"))
        };
        let containerd = on_path("containerd", APT_HINT)?;
        on_path("containerd-shim-runc-v2", APT_HINT)?;
        let ctr = on_path("ctr", APT_HINT)?;
        let runc = on_path("runc", APT_HINT)?;
        let ip = on_path("ip", "apt-get install iproute2")?;
        let cni_bin = CNI_DIRS
            .iter()
            .map(PathBuf::from)
            .find(|d| CNI_PLUGINS.iter().all(|p| d.join(p).is_file()))
            .ok_or_else(|| {
                format!("the CNI plugins {CNI_PLUGINS:?} are not in {CNI_DIRS:?} ({APT_HINT})")
            })?;
        if !Path::new("/sys/fs/cgroup").is_dir() {
            return Err("no cgroup filesystem at /sys/fs/cgroup".into());
        }
        let tools = Tools::locate()?;
        let kubelet = tools.require("kubelet")?;
        Ok(Self {
            containerd,
            ctr,
            runc,
            cni_bin,
            ip,
            kubelet,
        })
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The lock file: one real node per host (the kubelet's device-plugin socket and a few other
/// paths are fixed).
const LOCK_FILE: &str = "/run/gpuval-real-node.lock";

/// Held while a real node runs; released when dropped (the file lock goes with the file).
pub struct HostLock {
    _file: std::fs::File,
}

impl HostLock {
    /// Takes the lock, waiting up to `timeout` for another test's node to go.
    pub async fn acquire(timeout: Duration) -> Result<Self, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_FILE)
            .map_err(|e| format!("open {LOCK_FILE}: {e}"))?;
        let deadline = Instant::now() + timeout;
        let mut said = false;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Self { _file: file });
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "another real node held {LOCK_FILE} for {}s",
                    timeout.as_secs()
                ));
            }
            if !said {
                eprintln!("waiting for another test's real node to go ({LOCK_FILE})");
                said = true;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Bytes free to an unprivileged writer on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> Result<u64, String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| format!("{} has a NUL byte", dir.display()))?;
    let mut vfs = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a valid NUL-terminated path and `vfs` points to writable memory of the
    // struct's size; statvfs writes nothing else.
    if unsafe { libc::statvfs(c.as_ptr(), vfs.as_mut_ptr()) } != 0 {
        return Err(format!(
            "statvfs {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: statvfs returned 0, so it filled the struct (zeroed before anyway).
    let vfs = unsafe { vfs.assume_init() };
    // fsblkcnt_t and c_ulong are u64 here but narrower on other targets.
    #[allow(clippy::useless_conversion)]
    let free = u64::from(vfs.f_bavail).saturating_mul(u64::from(vfs.f_frsize));
    Ok(free)
}

/// What importing and unpacking `archive_bytes` of image archives needs on containerd's disk:
/// the content store keeps the archives and the overlay snapshots hold the layers unpacked
/// (compressed layers grow about twice), plus a margin for the pods' writes and the logs.
pub fn space_needed(archive_bytes: u64) -> u64 {
    archive_bytes.saturating_mul(4).saturating_add(512 << 20)
}

/// Err naming the filesystem, what is free and what is needed, when `dir` has too little room.
pub fn check_space(dir: &Path, archive_bytes: u64) -> Result<(), String> {
    let free = free_bytes(dir)?;
    let needed = space_needed(archive_bytes);
    if free >= needed {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    Err(format!(
        "{:.1} GiB free under {} but the node's containerd needs about {:.1} GiB (the images \
         stored and unpacked): free disk space there (old target/ trees, /tmp/gpuval-* left by \
         killed runs), or point TMPDIR at a larger filesystem",
        gib(free),
        dir.display(),
        gib(needed)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_little_room_names_the_place_and_the_need() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        check_space(dir.path(), 0).expect("half a GiB is free in a test's temp dir");
        let err = check_space(dir.path(), u64::MAX / 8).unwrap_err();
        assert!(
            err.contains(&dir.path().display().to_string()) && err.contains("TMPDIR"),
            "{err}"
        );
        assert!(free_bytes(&dir.path().join("none")).is_err());
    }

    #[test]
    fn ci_or_the_variable_turn_a_skip_into_a_failure() {
        assert!(!required_by(None, None));
        assert!(required_by(Some("true"), None));
        assert!(required_by(Some("TRUE"), None));
        assert!(required_by(Some("1"), None));
        assert!(!required_by(Some("false"), None));
        assert!(!required_by(Some(""), None));
        assert!(required_by(None, Some("1")));
        assert!(!required_by(None, Some("0")));
    }
}
