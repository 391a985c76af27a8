//! Finding NCCL before anything calls it: cudarc loads `libnccl.so` (and a few other names)
//! but never the runtime soname `libnccl.so.2`, and panics when none loads. A runtime-only
//! install (Debian's `libnccl2`, the `nvidia-nccl-cu13` wheel) has only `libnccl.so.2`; for
//! that case the check gives its sweep process a directory with a `libnccl.so` link to it on
//! `LD_LIBRARY_PATH` (the loader reads that variable only at process start).

use std::ffi::{CStr, CString, c_int, c_void};
use std::path::{Path, PathBuf};

use crate::backend::BackendError;

/// The oldest NCCL the check runs with (per-communicator errors, finalize, bf16).
const MIN_VERSION: (u32, u32) = (2, 18);
/// The name cudarc loads, and the runtime soname.
pub const DEV_NAME: &str = "libnccl.so";
pub const RUNTIME_NAME: &str = "libnccl.so.2";

/// The NCCL library this host has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The file the loader picked (`/usr/lib/x86_64-linux-gnu/libnccl.so.2`).
    pub path: Option<PathBuf>,
    /// `2.28.3`.
    pub version: Option<String>,
    /// Only `libnccl.so.2` loads: the sweep process needs a `libnccl.so` link.
    pub needs_link: bool,
}

impl Found {
    /// `/usr/lib/x86_64-linux-gnu/libnccl.so.2 (2.28.3)`, with `, linked as libnccl.so` where
    /// the child process reached it through a link in its run directory.
    pub fn describe(&self) -> String {
        let path = self
            .path
            .as_ref()
            .map_or_else(|| RUNTIME_NAME.to_string(), |p| p.display().to_string());
        let named = match &self.version {
            Some(v) => format!("{path} ({v})"),
            None => path,
        };
        if self.needs_link {
            format!("{named}, linked as {DEV_NAME}")
        } else {
            named
        }
    }
}

fn missing(hint: String) -> BackendError {
    BackendError::MissingLibrary {
        library: format!("NCCL ({RUNTIME_NAME})"),
        hint,
    }
}

/// The one-line fix when NCCL is not installed at all.
pub fn install_hint() -> String {
    "install NCCL's runtime (Debian/Ubuntu: `apt-get install libnccl2` from NVIDIA's CUDA repository; or `pip install nvidia-nccl-cu13` and put its nvidia/nccl/lib on LD_LIBRARY_PATH)".into()
}

/// The fix when only the runtime soname is there.
pub fn link_hint(path: &Path) -> String {
    format!(
        "found {} but not the name {DEV_NAME} that the agent loads: run `mkdir -p /opt/nccl-link && ln -sf {} /opt/nccl-link/{DEV_NAME}` and start the agent with LD_LIBRARY_PATH=/opt/nccl-link:$LD_LIBRARY_PATH (or install libnccl-dev)",
        path.display(),
        path.display()
    )
}

/// Loads `name` with the system loader (never unloaded: NCCL's destructors must not outlive
/// its code) and reads its path and version.
fn probe(name: &str) -> Option<Found> {
    let cname = CString::new(name).ok()?;
    // SAFETY: dlopen with a valid C string; the handle is intentionally kept.
    let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: looks a symbol up in the handle just opened.
    let sym = unsafe { libc::dlsym(handle, c"ncclGetVersion".as_ptr()) };
    if sym.is_null() {
        return Some(Found {
            path: None,
            version: None,
            needs_link: false,
        });
    }
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: sym is an address inside the loaded library; info is a valid out-parameter.
    let path = (unsafe { libc::dladdr(sym as *const c_void, &mut info) } != 0
        && !info.dli_fname.is_null())
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    .then(|| {
        PathBuf::from(
            unsafe { CStr::from_ptr(info.dli_fname) }
                .to_string_lossy()
                .into_owned(),
        )
    });
    // SAFETY: ncclGetVersion(int*) is NCCL's documented signature.
    let get: unsafe extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(sym) };
    let mut code: c_int = 0;
    // SAFETY: writes one int.
    let ok = unsafe { get(&mut code) } == 0;
    let version = ok.then(|| super::engine::comm::format_version(code));
    Some(Found {
        path,
        version,
        needs_link: false,
    })
}

/// Finds NCCL: under the name cudarc loads, or else under its runtime soname only.
pub fn locate() -> Result<Found, BackendError> {
    if let Some(f) = probe(DEV_NAME) {
        return Ok(f);
    }
    match probe(RUNTIME_NAME) {
        Some(f) => Ok(Found {
            needs_link: true,
            ..f
        }),
        None => Err(missing(install_hint())),
    }
}

/// Makes `dir/libnccl.so` point at the found library; the directory goes first on the sweep
/// process's LD_LIBRARY_PATH.
pub fn make_link(found: &Found, dir: &Path) -> Result<(), BackendError> {
    let Some(target) = &found.path else {
        return Err(missing(format!(
            "{RUNTIME_NAME} loads but its file could not be found; link it as {DEV_NAME} on LD_LIBRARY_PATH"
        )));
    };
    let link = dir.join(DEV_NAME);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(target, &link)
        .map_err(|e| missing(format!("{} (linking it failed: {e})", link_hint(target))))
}

/// The environment every NCCL child process of the agent starts with: its GPUs in rank order
/// (by UUID, so rank r is CUDA device r), NCCL's log at `debug` into `log`, and every channel
/// connected while the communicator is set up (unless NCCL_RUNTIME_CONNECT is set), so that a
/// collective's enqueue never blocks the host on a missing peer: a hang is then in setup,
/// which the child's watchdog bounds, or on the GPU, where a deadline aborts it.
pub fn child_env<'a>(
    uuids: impl IntoIterator<Item = &'a str>,
    debug: &str,
    log: &Path,
) -> Vec<(String, String)> {
    let uuids: Vec<&str> = uuids.into_iter().collect();
    let mut env = vec![
        ("CUDA_VISIBLE_DEVICES".to_string(), uuids.join(",")),
        ("NCCL_DEBUG".to_string(), debug.to_string()),
        ("NCCL_DEBUG_FILE".to_string(), log.display().to_string()),
    ];
    if std::env::var_os("NCCL_RUNTIME_CONNECT").is_none() {
        env.push(("NCCL_RUNTIME_CONNECT".into(), "0".into()));
    }
    env
}

/// LD_LIBRARY_PATH with `dir` first.
pub fn library_path_with(dir: &Path) -> String {
    match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    }
}

/// In the sweep process: the CUDA driver loads.
pub fn require_driver() -> Result<(), BackendError> {
    BackendError::library_present(
        // SAFETY: only probes dlopen for libcuda.
        unsafe { cudarc::driver::sys::is_culib_present() },
        "the CUDA driver (libcuda.so.1)",
        "install the NVIDIA driver, or run where the driver's libraries are mounted (NVIDIA container toolkit)",
    )
}

/// In the sweep process: cudarc can load NCCL (so no call of it panics).
pub fn require_loadable() -> Result<(), BackendError> {
    // SAFETY: only probes dlopen for the library names cudarc uses.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Ok(());
    }
    Err(match probe(RUNTIME_NAME).and_then(|f| f.path) {
        Some(path) => missing(link_hint(&path)),
        None => missing(install_hint()),
    })
}

/// In the sweep process: NCCL is new enough for every call the sweep makes.
pub fn require_version(version: Option<&str>) -> Result<(), BackendError> {
    let Some(v) = version else {
        return Err(missing("ncclGetVersion failed; reinstall NCCL".into()));
    };
    let mut parts = v.split('.').filter_map(|p| p.parse::<u32>().ok());
    let have = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if have >= MIN_VERSION {
        Ok(())
    } else {
        Err(missing(format!(
            "NCCL {v} is too old: {}.{} or later is needed",
            MIN_VERSION.0, MIN_VERSION.1
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_sees_its_gpus_in_rank_order_and_connects_while_setting_up() {
        let env = child_env(["GPU-c", "GPU-a"], "WARN", Path::new("/run/d/t.log"));
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("GPU-c,GPU-a"));
        assert_eq!(get("NCCL_DEBUG"), Some("WARN"));
        assert_eq!(get("NCCL_DEBUG_FILE"), Some("/run/d/t.log"));
        if std::env::var_os("NCCL_RUNTIME_CONNECT").is_none() {
            assert_eq!(get("NCCL_RUNTIME_CONNECT"), Some("0"));
        }
    }

    #[test]
    fn hints_say_exactly_what_to_do() {
        let h = link_hint(Path::new("/usr/lib/x86_64-linux-gnu/libnccl.so.2"));
        assert!(
            h.contains("ln -sf /usr/lib/x86_64-linux-gnu/libnccl.so.2 /opt/nccl-link/libnccl.so"),
            "{h}"
        );
        assert!(h.contains("LD_LIBRARY_PATH=/opt/nccl-link:"), "{h}");
        let e = missing(install_hint()).to_string();
        assert!(
            e.starts_with("NCCL (libnccl.so.2) is not available: install NCCL's runtime"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn old_or_unknown_versions_are_refused() {
        assert!(require_version(Some("2.28.3")).is_ok());
        assert!(require_version(Some("2.18.1")).is_ok());
        assert!(require_version(Some("3.0.0")).is_ok());
        let e = require_version(Some("2.12.12")).map_err(|e| e.to_string());
        assert!(e.is_err_and(|e| e.contains("NCCL 2.12.12 is too old: 2.18 or later")));
        assert!(require_version(None).is_err());
    }

    #[test]
    fn a_link_points_at_the_runtime_library() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let target = dir.path().join("libnccl.so.2");
        std::fs::write(&target, b"").expect("a stand-in library");
        let found = Found {
            path: Some(target.clone()),
            version: Some("2.28.3".into()),
            needs_link: true,
        };
        make_link(&found, dir.path()).expect("linked");
        make_link(&found, dir.path()).expect("linking again replaces the link");
        assert_eq!(
            std::fs::read_link(dir.path().join("libnccl.so")).ok(),
            Some(target)
        );
        assert_eq!(
            found.describe(),
            format!(
                "{}/libnccl.so.2 (2.28.3), linked as libnccl.so",
                dir.path().display()
            )
        );
        let no_path = Found {
            path: None,
            ..found
        };
        assert!(make_link(&no_path, dir.path()).is_err());
    }

    #[test]
    fn a_host_without_nccl_gets_an_error_not_a_panic() {
        // On this build machine NCCL may or may not be installed; either way no panic.
        match locate() {
            Ok(f) => assert!(f.path.is_some() || f.version.is_none()),
            Err(e) => assert!(e.to_string().contains("libnccl.so.2")),
        }
    }
}
