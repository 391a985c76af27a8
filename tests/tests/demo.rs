//! `make demo` end to end (`demo --exit`): the quick run's verdicts, the bad node's
//! `GpuValidated` flipping back to True once `quick` proves the repaired node again (a failure
//! stands until a pass of the same validation covers it), a fabric run that passes and one that
//! names the node with a planted slow NIC and says what fell short (in `get -o wide`, `kubectl
//! gpuval status` and both HTML reports, read in a browser), every shipped example's fit, the
//! next steps and where the logs are; then, while it stays up, the plugin as kubectl is used
//! (`-o` a format, `-f` a file, `wait`'s exit codes) and a stuck node saying why; and nothing
//! left behind after Ctrl-C.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use gpuval_crds::GpuValidation;
use kube::Api;

const DEMO: &str = env!("CARGO_BIN_EXE_demo");
/// The line the demo prints once everything is shown and the cluster stays up.
const UP: &str = "The cluster stays up until Ctrl-C.";

/// The path printed after `label` (`  operator: /tmp/…`).
fn path_after(out: &str, label: &str) -> PathBuf {
    let line = out
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{out}"));
    PathBuf::from(line.split_whitespace().next().expect("a path"))
}

/// The demo, running: what it printed so far comes through `lines`.
struct Demo {
    child: Child,
    lines: mpsc::Receiver<String>,
    out: String,
}

impl Demo {
    fn start(reports: &Path) -> Demo {
        let mut child = Command::new(DEMO)
            .env("GPUVAL_DEMO_REPORTS", reports)
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the demo");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Demo {
            child,
            lines,
            out: String::new(),
        }
    }

    /// Reads what it prints until a line contains `want` (panics past `limit`).
    fn until(&mut self, want: &str, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(want);
                    self.out.push_str(&line);
                    self.out.push('\n');
                    if found {
                        return;
                    }
                }
                Err(e) => panic!("{want:?} not printed ({e}):\n{}", self.out),
            }
        }
    }

    /// Ctrl-C, then what it printed to the end.
    fn interrupt(mut self) -> String {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-INT", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "SIGINT to the demo");
        let status = self.child.wait().expect("the demo ends");
        assert!(
            status.success(),
            "the demo after Ctrl-C: {status}\n{}",
            self.out
        );
        self.out.extend(self.lines.iter().map(|l| l + "\n"));
        self.out
    }
}

/// `kubectl gpuval ARGS` against the demo's cluster: exit code, stdout, stderr.
fn plugin(kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
    let out = gpuval_tests::binaries::run_plugin(kubeconfig, args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_walks_the_first_hour_and_leaves_nothing_behind() {
    let reports = tempfile::tempdir().expect("a directory for the reports");
    let mut demo = Demo::start(reports.path());
    demo.until(UP, Duration::from_secs(600));
    let stdout = demo.out.clone();
    for want in [
        "quick   Failed   4       3        1",
        "gpu-node-c is repaired",
        "GpuValidated flipped to True",
        "kubectl gpuval status quick",
        // The fabric: a pass, then the planted slow NIC named, with what fell short, in
        // `get -o wide` and `kubectl gpuval status`.
        "fabric-pass    Passed   3       3        0",
        "fabric-fault   Failed   3       2        1",
        "[\"gpu-node-d\"]",
        "├─ gpu-node-d  Fail",
        "(NCCL bus bandwidth ",
        " GB/s below 350); partners gpu-node-a, gpu-node-b passed elsewhere",
    ] {
        assert!(stdout.contains(want), "{want:?} missing:\n{stdout}");
    }
    let flipped = stdout
        .split("GpuValidated flipped")
        .next()
        .and_then(|before| before.rsplit("gpu-node-c").next())
        .expect("the node's last line before the flip");
    assert!(
        flipped.trim_start().starts_with("True"),
        "gpu-node-c after its proof: {flipped}"
    );
    fabric_pages_in_a_browser(reports.path());

    // While it stays up, against its cluster as a user would.
    let kubeconfig = path_after(&stdout, "export KUBECONFIG=");
    the_plugin_follows_kubectl(&kubeconfig);
    a_stuck_node_says_why(&kubeconfig).await;

    let out = demo.interrupt();
    for want in [
        "Logs (removed when the demo stops)",
        "fabric.yaml        refused there",
        "quick.yaml         runs",
        "stopping (Ctrl-C)",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
    let operator_log = path_after(&out, "operator:");
    let dir = operator_log.parent().expect("the demo's directory");
    assert_eq!(
        kubeconfig.parent(),
        Some(dir),
        "one directory for all it writes"
    );
    assert!(
        !dir.exists(),
        "{} is left behind after Ctrl-C",
        dir.display()
    );
}

/// `-o` takes a format and a file name there is refused with the hint; `-f` honours the file's
/// extension; `wait` tells not found (3), failed (1) and passed (0) apart.
fn the_plugin_follows_kubectl(kubeconfig: &Path) {
    let (code, _, err) = plugin(kubeconfig, &["report", "quick", "-o", "report.html"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("-f"), "the hint names -f: {err}");
    let dir = tempfile::tempdir().expect("tmp");
    let md = dir.path().join("quick.md");
    let (code, _, err) = plugin(
        kubeconfig,
        &["report", "quick", "-f", &md.to_string_lossy()],
    );
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&md).expect("quick.md written");
    assert!(
        text.starts_with('#') && !text.contains("<html"),
        "Markdown: {text}"
    );
    for (run, want) in [("nosuch", 3), ("fabric-fault", 1), ("fabric-pass", 0)] {
        let (code, out, err) = plugin(kubeconfig, &["wait", run, "--timeout", "30s"]);
        assert_eq!(code, want, "wait {run}: {out}{err}");
    }
}

/// dra.yaml asks for H100s the demo's DRA node does not have: its agent pod cannot be
/// scheduled, and `kubectl gpuval status` says so, not only that no report is stored.
async fn a_stuck_node_says_why(kubeconfig: &Path) {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig).expect("the demo's kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("a config");
    let client = kube::Client::try_from(config).expect("a client");
    let example = gpuval_tests::crds::repo_root().join("deploy/examples/dra.yaml");
    let api: Api<GpuValidation> = Api::all(client);
    for doc in gpuval_tests::crds::read_yaml_documents(&example).expect("dra.yaml") {
        api.patch(
            "dra",
            &kube::api::PatchParams::apply("demo-test"),
            &kube::api::Patch::Apply(&doc),
        )
        .await
        .expect("apply dra.yaml");
    }
    gpuval_tests::scenario::wait(
        api,
        "dra",
        120,
        "its node line says it is unschedulable",
        |g: Option<&GpuValidation>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                s.nodes.iter().any(|l| {
                    l.message
                        .as_deref()
                        .is_some_and(|m| m.contains("Unschedulable"))
                })
            })
        },
    )
    .await;
    let (_, out, err) = plugin(kubeconfig, &["status", "dra"]);
    assert!(out.contains("Unschedulable"), "status says why: {out}{err}");
}

/// The demo's two fabric reports, as a browser shows them: the pass says so with its fabric
/// line; the fault names gpu-node-d, what fell short and its floor, and its headline is no pass.
fn fabric_pages_in_a_browser(dir: &std::path::Path) {
    let Some(chrome) = gpuval_tests::browser::chromium() else {
        return;
    };
    let fabric_line = |dom: &str| -> String {
        dom.split("<p id=\"fabric\">")
            .nth(1)
            .and_then(|s| s.split("</p>").next())
            .unwrap_or_else(|| panic!("no fabric line on the page:\n{dom}"))
            .to_string()
    };
    let page = |name: &str| {
        let html = std::fs::read_to_string(dir.join(format!("{name}.html")))
            .unwrap_or_else(|e| panic!("the demo wrote {name}.html: {e}"));
        gpuval_tests::browser::open(&chrome, &html, &format!("demo-{name}"), 1400)
    };
    let pass = page("fabric-pass");
    assert!(pass.contains("b-Pass"), "the pass's badge");
    assert!(
        fabric_line(&pass).contains("Passed"),
        "{}",
        fabric_line(&pass)
    );
    let fault = page("fabric-fault");
    let line = fabric_line(&fault);
    assert!(
        line.contains("Failed") && line.contains("gpu-node-d") && line.contains("below 350"),
        "the fault's fabric line names the node and what fell short: {line}"
    );
    let headline = fault
        .split("<h1")
        .nth(1)
        .and_then(|s| s.split("</h1>").next())
        .expect("a headline");
    assert!(
        !headline.contains("b-Pass"),
        "the fault's headline is no pass: {headline}"
    );
}
