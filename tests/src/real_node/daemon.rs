//! A node daemon (containerd, the kubelet) as a child process in a process group of its own,
//! logging to a file; it dies with the test process (parent-death signal) and is stopped as a
//! group: SIGTERM, then SIGKILL after a grace period.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::control_plane::spawn_logged;

pub struct Daemon {
    name: &'static str,
    child: Child,
    log: PathBuf,
    stopped: bool,
}

impl Daemon {
    /// Starts `cmd` with stdout and stderr to `log`.
    pub fn spawn(name: &'static str, cmd: &mut Command, log: &Path) -> Result<Self, String> {
        cmd.process_group(0);
        let child = spawn_logged(cmd, log).map_err(|e| format!("{name}: {e}"))?;
        Ok(Self {
            name,
            child,
            log: log.to_path_buf(),
            stopped: false,
        })
    }

    /// Err with the exit status and the log's last lines when it has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} exited ({status}); last log lines:\n{}",
                self.name,
                self.log_tail()
            )),
            Err(e) => Err(format!("wait for {}: {e}", self.name)),
        }
    }

    /// Waits until `path` exists (a socket the daemon creates), failing early if it exits.
    pub async fn wait_for_path(&mut self, path: &Path, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while !path.exists() {
            self.check_alive()?;
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not create {} within {}s; last log lines:\n{}",
                    self.name,
                    path.display(),
                    timeout.as_secs(),
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    pub fn log_tail(&self) -> String {
        crate::control_plane::tail(&self.log, 30)
    }

    /// SIGTERM to the process group, SIGKILL after `grace`; waits for the daemon.
    pub fn stop(&mut self, grace: Duration) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let group = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on the process group this daemon leads (process_group(0) above).
        unsafe {
            libc::kill(-group, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as above; whatever is left of the group goes.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}
