//! The agent's side: start the child, relay its progress, stop it on request, kill it when it
//! falls silent, and read its outcome.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{PROGRESS, Reply};
use crate::backend::BackendError;
use crate::run_control::RunControl;

/// How often the agent looks at the child between lines.
const TICK: Duration = Duration::from_millis(100);
/// Lines of the child's other output kept for an error message.
const TAIL: usize = 12;

/// How the agent starts and watches one child.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The agent's own executable (or a stand-in in tests).
    pub exe: PathBuf,
    /// The hidden subcommand the child runs (`nccl-sweep`).
    pub subcommand: &'static str,
    /// The work as errors name it (`NCCL sweep`: "the NCCL sweep process was killed").
    pub what: &'static str,
    /// Variables set for the child on top of the agent's environment.
    pub env: Vec<(String, String)>,
    /// The child is killed when it says nothing for this long (a hang its own watchdog could
    /// not end).
    pub silence_limit: Duration,
    /// After a stop request (SIGTERM to the child), how long before it is killed.
    pub stop_grace: Duration,
}

/// What the supervisor saw.
enum Line {
    Progress(f64, String),
    Other(String),
    StderrClosed,
    Stdout(String),
}

/// Runs `req` in a child process and returns its outcome.
pub fn run<Req, Out>(launch: &Launch, req: &Req, ctl: &RunControl<'_>) -> Result<Out, BackendError>
where
    Req: Serialize,
    Out: DeserializeOwned,
{
    let what = launch.what;
    let input = serde_json::to_string(req)
        .map_err(|e| BackendError::Other(format!("encode the {what} request: {e}")))?;
    let mut child = Command::new(&launch.exe)
        .arg(launch.subcommand)
        .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            BackendError::Other(format!(
                "start the {what} process {}: {e}",
                launch.exe.display()
            ))
        })?;
    crate::backend::children::adopt(child.id());
    if let Some(mut stdin) = child.stdin.take()
        && let Err(e) = stdin.write_all(input.as_bytes())
    {
        // A child that exits without reading its request answers (or not) on its own.
        tracing::debug!(what, error = %e, "the child process did not take its request");
    }
    let (tx, rx) = mpsc::channel();
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let watched = std::thread::scope(|s| {
        let out_tx = tx.clone();
        s.spawn(move || read_stdout(stdout, &out_tx, what));
        s.spawn(move || read_stderr(stderr, &tx));
        supervise(&mut child, &rx, launch, ctl)
    });
    let status = child
        .wait()
        .map_err(|e| BackendError::Other(format!("wait for the {what} process: {e}")))?;
    let Watched {
        stdout,
        tail,
        killed,
    } = watched;
    if let Some(kill) = killed {
        let message = format!(
            "the {what} process was killed: {}{}",
            kill.why,
            tail_text(&tail)
        );
        return Err(match kill.silent {
            true => BackendError::Silent(message),
            false => BackendError::Other(message),
        });
    }
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    match serde_json::from_str::<Reply<Out>>(last) {
        Ok(reply) => reply.outcome,
        Err(_) => Err(BackendError::Other(format!(
            "the {what} process ended ({status}) without a result{}",
            tail_text(&tail)
        ))),
    }
}

fn tail_text(tail: &VecDeque<String>) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!(
            "; its last output: {}",
            tail.iter().cloned().collect::<Vec<_>>().join(" | ")
        )
    }
}

fn read_stdout(pipe: Option<std::process::ChildStdout>, tx: &mpsc::Sender<Line>, what: &str) {
    let mut text = String::new();
    if let Some(mut p) = pipe
        && let Err(e) = p.read_to_string(&mut text)
    {
        tracing::warn!(what, error = %e, "reading the child process's output failed");
    }
    let _ = tx.send(Line::Stdout(text));
}

fn read_stderr(pipe: Option<std::process::ChildStderr>, tx: &mpsc::Sender<Line>) {
    if let Some(p) = pipe {
        for line in BufReader::new(p).lines().map_while(Result::ok) {
            let _ = tx.send(match parse_progress(&line) {
                Some((done, note)) => Line::Progress(done, note),
                None => Line::Other(line),
            });
        }
    }
    let _ = tx.send(Line::StderrClosed);
}

/// `gpuval-progress 0.4200 allReduce 1 MiB ...` → (0.42, note).
fn parse_progress(line: &str) -> Option<(f64, String)> {
    let rest = line.strip_prefix(PROGRESS)?;
    let (done, note) = rest.split_once(' ').unwrap_or((rest, ""));
    Some((done.parse().ok()?, note.to_string()))
}

/// Why the child was killed: in words, and whether for its silence.
struct Kill {
    why: String,
    silent: bool,
}

struct Watched {
    stdout: String,
    tail: VecDeque<String>,
    killed: Option<Kill>,
}

/// Relays progress until both pipes close; stops the child on a stop request (SIGTERM, then
/// kill after the grace) and kills it when it falls silent for too long.
fn supervise(
    child: &mut Child,
    rx: &mpsc::Receiver<Line>,
    launch: &Launch,
    ctl: &RunControl<'_>,
) -> Watched {
    let what = launch.what;
    let mut w = Watched {
        stdout: String::new(),
        tail: VecDeque::new(),
        killed: None,
    };
    let (mut stdout_done, mut stderr_done) = (false, false);
    let mut heard = Instant::now();
    let mut term_sent: Option<Instant> = None;
    while !(stdout_done && stderr_done) {
        match rx.recv_timeout(TICK) {
            Ok(Line::Progress(done, note)) => {
                heard = Instant::now();
                ctl.progress(done, &note);
            }
            Ok(Line::Other(line)) => {
                heard = Instant::now();
                tracing::debug!(what, child = %line, "child process");
                if w.tail.len() == TAIL {
                    w.tail.pop_front();
                }
                w.tail.push_back(line);
            }
            Ok(Line::StderrClosed) => stderr_done = true,
            Ok(Line::Stdout(text)) => {
                w.stdout = text;
                stdout_done = true;
            }
            Err(_) => {}
        }
        if w.killed.is_some() {
            continue;
        }
        if ctl.stopped() && term_sent.is_none() {
            term_sent = Some(Instant::now());
            terminate(child, what);
        }
        if term_sent.is_some_and(|t| t.elapsed() >= launch.stop_grace) {
            w.killed = Some(Kill {
                why: "it did not stop after SIGTERM".into(),
                silent: false,
            });
        } else if heard.elapsed() >= launch.silence_limit {
            w.killed = Some(Kill {
                why: format!(
                    "it reported nothing for {:.0}s",
                    launch.silence_limit.as_secs_f64()
                ),
                silent: true,
            });
        }
        if w.killed.is_some()
            && let Err(e) = child.kill()
        {
            tracing::warn!(what, error = %e, "killing the child process failed");
        }
    }
    w
}

/// Asks the child to stop (it aborts its communicators and answers).
fn terminate(child: &Child, what: &str) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: sends a signal to our own child process, which has not been reaped yet.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        tracing::warn!(what, pid, "sending SIGTERM to the child process failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::AtomicBool;

    #[derive(Debug, Serialize)]
    struct Ask {
        ranks: u32,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Answer {
        version: String,
    }

    /// A stand-in for the agent: a shell script that ignores its arguments.
    fn script(dir: &std::path::Path, body: &str) -> PathBuf {
        let path = dir.join("fake-agent");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write the script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    fn launch(exe: PathBuf, silence: Duration) -> Launch {
        Launch {
            exe,
            subcommand: "some-work",
            what: "test work",
            env: vec![("GPUVAL_TEST_VAR".into(), "seen".into())],
            silence_limit: silence,
            stop_grace: Duration::from_secs(2),
        }
    }

    fn reply(outcome: Result<Answer, BackendError>) -> String {
        serde_json::to_string(&Reply { outcome }).expect("json")
    }

    fn go(
        exe: PathBuf,
        silence: Duration,
        stop: &AtomicBool,
    ) -> (Result<Answer, BackendError>, Vec<String>) {
        let notes = std::sync::Mutex::new(Vec::new());
        let progress = |_: f64, n: &str| notes.lock().expect("notes").push(n.to_string());
        let ctl = RunControl::new(stop, &progress);
        let r = run(&launch(exe, silence), &Ask { ranks: 2 }, &ctl);
        (r, notes.into_inner().expect("notes"))
    }

    #[test]
    fn the_outcome_and_progress_come_back() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let answer = reply(Ok(Answer {
            version: "2.28.3".into(),
        }));
        // The script checks its subcommand, environment and request, reports progress, then
        // answers.
        let body = format!(
            "[ \"$1\" = some-work ] || exit 5\nread req\ncase \"$req\" in *'\"ranks\":2'*) ;; *) exit 3;; esac\n[ \"$GPUVAL_TEST_VAR\" = seen ] || exit 4\necho '{PROGRESS}0.5000 allReduce 8 B' >&2\necho 'some log line' >&2\necho '{answer}'"
        );
        let (r, notes) = go(
            script(dir.path(), &body),
            Duration::from_secs(30),
            &AtomicBool::new(false),
        );
        assert_eq!(r.map(|a| a.version).ok().as_deref(), Some("2.28.3"));
        assert_eq!(notes, ["allReduce 8 B"]);
    }

    #[test]
    fn errors_cross_the_process_boundary_with_their_kind() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let err = BackendError::MissingLibrary {
            library: "NCCL (libnccl.so.2)".into(),
            hint: "install it".into(),
        };
        let (r, _) = go(
            script(dir.path(), &format!("echo '{}'", reply(Err(err)))),
            Duration::from_secs(30),
            &AtomicBool::new(false),
        );
        assert!(
            matches!(r, Err(BackendError::MissingLibrary { .. })),
            "{r:?}"
        );
        let (r, _) = go(
            script(dir.path(), "echo 'CUDA went away' >&2; exit 1"),
            Duration::from_secs(30),
            &AtomicBool::new(false),
        );
        let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("the test work process ended")
                && msg.contains("without a result")
                && msg.contains("CUDA went away"),
            "{msg}"
        );
    }

    #[test]
    fn a_silent_child_is_killed() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let started = Instant::now();
        let (r, _) = go(
            script(dir.path(), "exec sleep 600"),
            Duration::from_millis(300),
            &AtomicBool::new(false),
        );
        let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("the test work process was killed: it reported nothing for"),
            "{msg}"
        );
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn a_stop_reaches_the_child_as_sigterm() {
        let dir = tempfile::tempdir().expect("a temp dir");
        // The stop is asked for once the child says it is ready (its trap is set).
        let answer = dir.path().join("answer.json");
        std::fs::write(&answer, reply(Err(BackendError::Stopped))).expect("write the answer");
        let body = format!(
            "trap 'cat {}; exit 0' TERM\necho '{PROGRESS}0.0000 ready' >&2\nwhile true; do sleep 0.05; done",
            answer.display()
        );
        let stop = AtomicBool::new(false);
        let progress = |_: f64, _: &str| stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let ctl = RunControl::new(&stop, &progress);
        let r: Result<Answer, _> = run(
            &launch(script(dir.path(), &body), Duration::from_secs(30)),
            &Ask { ranks: 2 },
            &ctl,
        );
        assert!(matches!(r, Err(BackendError::Stopped)), "{r:?}");
    }
}
