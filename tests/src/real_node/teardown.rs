//! Taking a real node down on every path (drop, also on a panic): nothing of it may outlive
//! the test, whether the test got as far as uninstalling or not.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::containerd::Ctr;
use super::daemon::Daemon;

/// The node's cgroup (`/gpuval-node-<pid>`), in every mounted hierarchy: the kubelet puts its
/// pods below it, the host probe its container.
pub struct CgroupRoot {
    path: String,
}

impl CgroupRoot {
    pub fn new(path: &str) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn child(&self, name: &str) -> String {
        format!("{}/{name}", self.path)
    }

    /// The directory of this cgroup in each hierarchy.
    fn dirs(&self) -> Vec<PathBuf> {
        cgroup_mounts()
            .into_iter()
            .map(|m| m.join(self.path.trim_start_matches('/')))
            .collect()
    }

    pub fn create(&self) -> Result<(), String> {
        for d in self.dirs() {
            std::fs::create_dir_all(&d).map_err(|e| format!("create {}: {e}", d.display()))?;
        }
        Ok(())
    }

    /// SIGKILL to every process left in the subtree; how many there were.
    fn kill_all(&self) -> usize {
        let mut killed = 0;
        for dir in self.dirs() {
            for cgroup in subtree(&dir) {
                let procs =
                    std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
                for pid in procs
                    .lines()
                    .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
                {
                    // SAFETY: kill(2) on a process of this node's own cgroup.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                    killed += 1;
                }
            }
        }
        killed
    }

    /// Removes the subtree, deepest first, waiting a little for killed processes to leave.
    fn remove(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        for dir in self.dirs() {
            for cgroup in subtree(&dir).into_iter().rev() {
                loop {
                    match std::fs::remove_dir(&cgroup) {
                        Ok(()) => break,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                        Err(e) if Instant::now() > deadline => {
                            return Err(format!("remove cgroup {}: {e}", cgroup.display()));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            }
        }
        Ok(())
    }
}

/// Mount points of the cgroup filesystems (v1 hierarchies or the v2 tree).
fn cgroup_mounts() -> Vec<PathBuf> {
    mounts()
        .into_iter()
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .map(|m| m.point)
        .collect()
}

/// `dir` and the directories below it, parents before children.
fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        out.push(d);
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            }
        }
    }
    out
}

struct Mount {
    point: PathBuf,
    fs_type: String,
}

/// This process's mounts, from /proc/self/mountinfo.
fn mounts() -> Vec<Mount> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines().filter_map(parse_mountinfo_line).collect()
}

/// `id parent maj:min root point options [optional...] - fstype source superoptions`.
fn parse_mountinfo_line(line: &str) -> Option<Mount> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let dash = fields.iter().position(|f| *f == "-")?;
    Some(Mount {
        point: PathBuf::from(unescape(fields.get(4)?)),
        fs_type: fields.get(dash + 1)?.to_string(),
    })
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Detaches every mount below `dir` (the kubelet's root bind mount, pod volumes, container root
/// filesystems, network namespaces), deepest first.
fn unmount_below(dir: &Path) -> Vec<String> {
    let mut points: Vec<PathBuf> = mounts()
        .into_iter()
        .map(|m| m.point)
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    points.dedup();
    let mut problems = Vec::new();
    for p in points {
        let Ok(c) = CString::new(p.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: umount2 with a valid C string; MNT_DETACH never blocks.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                problems.push(format!("unmount {}: {e}", p.display()));
            }
        }
    }
    problems
}

/// containerd's shims for this node (they outlive containerd by design), by their `-address`.
fn kill_shims(socket: &Path) -> usize {
    let want = socket.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for e in entries.flatten() {
        let Some(pid) = e
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|a| String::from_utf8_lossy(a).contains("containerd-shim"));
        let ours = args
            .windows(2)
            .any(|w| w[0] == b"-address" && w[1] == want.as_bytes());
        if is_shim && ours {
            // SAFETY: kill(2) on a shim started by this node's containerd.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            killed += 1;
        }
    }
    killed
}

/// Everything in the order it must stop.
pub struct Teardown<'a> {
    pub kubelet: Option<Daemon>,
    pub ctr: Option<Ctr>,
    pub containerd: Option<Daemon>,
    pub socket: PathBuf,
    pub cgroup: &'a CgroupRoot,
    pub dir: &'a Path,
}

impl Teardown<'_> {
    /// Stops the kubelet, removes every container task, kills what is left in the node's
    /// cgroups and the shims, stops containerd, unmounts, removes the cgroups. Returns what
    /// could not be done.
    pub fn run(mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(mut k) = self.kubelet.take() {
            k.stop(Duration::from_secs(10));
        }
        if let Some(ctr) = &self.ctr {
            for task in ctr.tasks().unwrap_or_default() {
                // A task whose process is gone already is deleted with its container below.
                if let Err(e) = ctr.remove(&task.id)
                    && !e.contains("not found")
                {
                    problems.push(e);
                }
            }
            for id in ctr.containers().unwrap_or_default() {
                let _ = ctr.run(&["containers", "delete", &id]);
            }
        }
        let stray = self.cgroup.kill_all();
        if stray > 0 {
            problems.push(format!(
                "killed {stray} processes left in the node's cgroups"
            ));
        }
        kill_shims(&self.socket);
        if let Some(mut c) = self.containerd.take() {
            c.stop(Duration::from_secs(10));
        }
        problems.extend(unmount_below(self.dir));
        if let Err(e) = self.cgroup.remove() {
            problems.push(e);
        }
        problems
    }
}

/// Host paths a kubelet or containerd creates whatever their configuration says (the
/// device-plugin socket directory, log links, the CNI result cache, shim sockets).
const HOST_PATHS: [&str; 4] = [
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/containerd",
];

/// Which of [`HOST_PATHS`] existed before the node started; the others are removed after it.
pub struct HostPaths {
    existed: Vec<bool>,
}

impl HostPaths {
    pub fn record() -> Self {
        Self {
            existed: HOST_PATHS.iter().map(|p| Path::new(p).exists()).collect(),
        }
    }

    pub fn restore(&self) {
        for (path, existed) in HOST_PATHS.iter().zip(&self.existed) {
            if !existed
                && Path::new(path).exists()
                && let Err(e) = std::fs::remove_dir_all(path)
            {
                eprintln!("real node teardown: remove {path}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_point_and_type() {
        let m = parse_mountinfo_line(
            "36 25 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory",
        )
        .unwrap();
        assert_eq!(m.point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(m.fs_type, "cgroup");
        let spaced = parse_mountinfo_line("40 1 0:5 / /tmp/a\\040b rw - tmpfs tmpfs rw").unwrap();
        assert_eq!(spaced.point, PathBuf::from("/tmp/a b"));
        assert!(parse_mountinfo_line("garbage").is_none());
    }

    #[test]
    fn a_subtree_lists_parents_first() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b/c")).unwrap();
        let s = subtree(d.path());
        let pos = |p: &str| s.iter().position(|x| x.ends_with(p)).unwrap();
        assert!(pos("a") < pos("a/b") && pos("a/b") < pos("a/b/c"));
        assert_eq!(s[0], d.path());
    }
}
