//! Every `kubectl` command of README.md, of docs/*.md and of the examples' comments, run as written (through
//! `sh`, from the repository root) against a real control plane with the CRDs installed, in the
//! order a reader meets them. The test stands in for the operator where a command needs its
//! work: it writes the validation's status and a node's result before the commands that read
//! them. `NODE` in a command is a node's name, as the documents say.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuval_crds::{GpuValidation, conditions, result::result_name};
use gpuval_tests::{ControlPlane, crds};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, discovery::ApiResource};
use serde_json::json;

const NS: &str = "gpuval-system";
const NODE: &str = "gpu-node-1";

/// A command and where it was written.
#[derive(Debug, Clone)]
struct Written {
    at: String,
    command: String,
}

/// `kubectl` lines of a document's shell blocks (trailing comments dropped) and the complete
/// commands in its inline code (a verb and at least one argument: `kubectl wait` alone is a
/// name in a sentence, not a command); `file` names the document in the places given.
fn readme_commands(file: &str, text: &str) -> Vec<Written> {
    let mut out = Vec::new();
    let mut in_block = false;
    for (i, line) in text.lines().enumerate() {
        let at = format!("{file}:{}", i + 1);
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            let code = line.split(" #").next().unwrap_or("").trim();
            if code.starts_with("kubectl ") {
                out.push(Written {
                    at,
                    command: code.to_string(),
                });
            }
            continue;
        }
        for (n, span) in line.split('`').enumerate() {
            if n % 2 == 1 && span.starts_with("kubectl ") && span.split_whitespace().count() >= 3 {
                out.push(Written {
                    at: at.clone(),
                    command: span.to_string(),
                });
            }
        }
    }
    out
}

/// README.md, then every `docs/*.md` by name: the order a reader meets them in.
fn documents(root: &Path) -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 6, "docs/ holds only {docs:?}");
    let mut all = vec!["README.md".to_string()];
    all.extend(docs);
    all
}

/// `kubectl` commands in the comments of the example manifests.
fn example_commands(dir: &Path, out: &mut Vec<Written>) {
    for path in gpuval_tests::crds::sorted_entries(dir) {
        if path.is_dir() {
            example_commands(&path, out);
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            let Some(comment) = line.trim_start().strip_prefix('#') else {
                continue;
            };
            if let Some(start) = comment.find("kubectl ") {
                let command = comment[start..].trim_end_matches(['.', ',', ';', ')', '`']);
                out.push(Written {
                    at: format!("{}:{}", path.display(), i + 1),
                    command: command.trim().to_string(),
                });
            }
        }
    }
}

fn shell(cp: &ControlPlane, command: &str) -> Command {
    let bin = cp.tool("kubectl").expect("kubectl");
    let dir = bin.parent().expect("tools dir").to_path_buf();
    let path = std::env::var_os("PATH").unwrap_or_default();
    // `kubectl gpuval` finds the plugin binary on PATH, as it would on a reader's machine.
    let plugin = gpuval_tests::binaries::workspace_binary("kubectl-gpuval", "kubectl-gpuval")
        .expect("kubectl-gpuval");
    let mut dirs = vec![dir, plugin.parent().expect("target dir").to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let mut cmd = Command::new("sh");
    cmd.args(["-c", command])
        .current_dir(crds::repo_root())
        .env("PATH", std::env::join_paths(dirs).expect("PATH"))
        .env("KUBECONFIG", cp.kubeconfig());
    cmd
}

/// Runs a watching command until its output names `want`, then stops it.
fn watch_until(mut cmd: Command, want: &str) -> Result<String, String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = String::new();
    let found = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(want) {
                    break true;
                }
            }
            Err(_) => break false,
        }
    };
    // The watch never ends by itself; this is the child we started.
    let _ = child.kill();
    let status = child.wait().map_err(|e| e.to_string())?;
    if found {
        Ok(seen)
    } else {
        Err(format!("no line with {want:?} ({status}); output:\n{seen}"))
    }
}

async fn setup(client: &Client) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).expect("ns");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    // A node the validation failed and onFailure labelled and tainted.
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE, "labels": {"gpuval.io/failed": "quick"}},
        "spec": {"taints": [{"key": "gpuval.io/failed", "value": "quick", "effect": "NoSchedule"}]},
    }))
    .expect("node");
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("node");
}

/// What the operator and the node's agent would have written for `quick` by now.
async fn write_results(client: &Client) {
    let name = result_name("quick", NODE);
    let ar = ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("gpuval.io", "v1alpha1", "GpuNodeResult"),
        "gpunoderesults",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ar);
    let result = json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuNodeResult",
        "metadata": {"name": name, "labels": {
            "gpuval.io/validation": "quick", "gpuval.io/node": NODE, "gpuval.io/verdict": "Fail",
            "gpuval.io/action": "ResetGpu",
        }},
        "spec": {"validation": "quick", "generation": 1, "nodeName": NODE},
    });
    api.patch(
        &name,
        &PatchParams::apply("readme-test"),
        &Patch::Apply(&result),
    )
    .await
    .expect("result");
    let validations: Api<GpuValidation> = Api::all(client.clone());
    let mut status = gpuval_crds::GpuValidationStatus {
        observed_generation: Some(1),
        phase: Some(gpuval_crds::Phase::Passed),
        ..Default::default()
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    conditions::set_condition(
        &mut status.conditions,
        conditions::READY,
        true,
        "Passed",
        "1/1 nodes passed",
        Some(1),
        &now,
    );
    validations
        .patch_status(
            "quick",
            &PatchParams::apply("readme-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation", "status": status,
            })),
        )
        .await
        .expect("status");
    write_certificate(client).await;
}

/// The GPU whose history docs/certificate.md shows.
const GPU: &str = "GPU-8f2c1e5a-5b7d-4c1e-9a3f-2d6b7e9c0a14";

/// The certificate of `quick` on NODE and the public key, as the operator would have written
/// them when the run ended (signed with a fixed test key).
async fn write_certificate(client: &Client) {
    use gpuval_operator::decide::certificates;
    let gv = Api::<GpuValidation>::all(client.clone())
        .get("quick")
        .await
        .expect("quick");
    let generation = gv.metadata.generation.unwrap_or(1);
    // Bound to the run as the operator binds it (only such a result is certified).
    let binding = gpuval_crds::binding::Binding {
        validation_uid: gv.metadata.uid.clone().unwrap_or_default(),
        generation,
        node: NODE.into(),
        pod: gpuval_crds::result::agent_pod_name("quick", NODE, generation),
        pod_uid: "the-agent-pod-uid".into(),
    };
    let mut result = binding.result("quick", NS);
    result.status = Some(gpuval_crds::NodeReport {
        node: Some(NODE.into()),
        finished_at: "2026-01-01T00:00:00Z".into(),
        gpus: vec![gpuval_crds::GpuReport {
            uuid: GPU.into(),
            memory: Some(gpuval_crds::MemoryResult {
                gbps: 3012.5,
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    let mut pkcs8 = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    pkcs8.extend([2u8; 32]);
    let status = gv.status.clone().unwrap_or_default();
    let image = certificates::AgentImage {
        configured: "gpuval-agent:test".into(),
        ..Default::default()
    };
    let issued = certificates::sign_run(&gv, &status, &[result], &image, &pkcs8).expect("sign");
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), NS);
    for i in &issued {
        let cm = certificates::config_map(&gv, NS, i).expect("certificate map");
        maps.create(&PostParams::default(), &cm)
            .await
            .expect("certificate");
    }
    let public = gpuval_crds::seal::public_key_of(&pkcs8).expect("public key");
    maps.create(
        &PostParams::default(),
        &certificates::public_key_map(NS, &public),
    )
    .await
    .expect("public key");
}

#[tokio::test]
async fn every_kubectl_command_of_the_readme_and_the_examples_works_as_written() {
    let root = crds::repo_root();
    let mut commands = Vec::new();
    for file in documents(&root) {
        let text =
            std::fs::read_to_string(root.join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        commands.extend(readme_commands(&file, &text));
    }
    example_commands(&root.join("deploy/examples"), &mut commands);
    assert!(commands.len() >= 14, "found only {commands:?}");

    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    crds::install_crds(&client).await.expect("CRDs");
    setup(&client).await;

    let mut failures = Vec::new();
    let mut results_written = false;
    // The docs write to /tmp as a reader would; here, to a folder of this run's own, so that
    // the suite leaves no file of a fixed name behind.
    let scratch = tempfile::tempdir().expect("a scratch dir");
    let scratch_prefix = format!("{}/", scratch.path().display());
    for Written { at, command } in &commands {
        let command = command
            .replace("NODE", NODE)
            .replace("/tmp/", &scratch_prefix);
        if !results_written && validation_exists(&client, "quick").await {
            write_results(&client).await;
            results_written = true;
        }
        let mut cmd = shell(&cp, &command);
        let outcome = if command.contains(" -w") {
            watch_until(cmd, "quick").map(|_| String::new())
        } else {
            gpuval_tests::chart::output(&mut cmd)
        };
        match outcome {
            Ok(out) => {
                if let Err(why) = check_output(&command, &out) {
                    failures.push(format!("{at}: `{command}`: {why}\n{out}"));
                }
            }
            Err(e) => failures.push(format!("{at}: `{command}` failed: {e}")),
        }
    }
    assert!(results_written, "no command applied the quick example");
    assert!(
        failures.is_empty(),
        "{} of {} commands failed:\n{}",
        failures.len(),
        commands.len(),
        failures.join("\n")
    );
}

async fn validation_exists(client: &Client, name: &str) -> bool {
    let api: Api<GpuValidation> = Api::all(client.clone());
    matches!(api.get_opt(name).await, Ok(Some(_)))
}

/// What a reader is told each command shows.
fn check_output(command: &str, out: &str) -> Result<(), String> {
    let want: &[&str] = match command {
        c if c.starts_with("kubectl get gpuval quick -o wide") => &["quick", "REASON", "Passed"],
        "kubectl get gpuval" => &["PHASE", "NODES", "PASSED", "FAILED"],
        c if c.starts_with("kubectl describe gpuval quick") => &["Name:", "quick", "Ready"],
        c if c.contains("get gpunoderesults -l") => &[NODE],
        c if c.contains("get gpunoderesult ") => &["kind: GpuNodeResult", NODE],
        "kubectl gpuval status quick" => &["quick  Passed"],
        c if c.starts_with("kubectl gpuval verify") => &["valid: node"],
        c if c.starts_with("kubectl gpuval history") => &["1 certificate(s)", "3012.5"],
        _ => &[],
    };
    match want.iter().find(|w| !out.contains(**w)) {
        None => Ok(()),
        Some(missing) => Err(format!("output lacks {missing:?}")),
    }
}

#[test]
fn commands_are_found_in_blocks_and_inline_code() {
    let text = "Run `kubectl get gpuvalidations` or `kubectl wait` later.\n```sh\nkubectl get gpuval   # a comment\nhelm list\n```\n";
    let found: Vec<String> = readme_commands("README.md", text)
        .into_iter()
        .map(|w| w.command)
        .collect();
    assert_eq!(found, ["kubectl get gpuvalidations", "kubectl get gpuval"]);
}

/// The chart's install notes for `values` (None: the chart's defaults), rendered by
/// `helm template` from a copy of the chart in which NOTES.txt is a named template that a
/// ConfigMap quotes (helm renders NOTES.txt only on a real install).
fn rendered_notes(values: Option<&Path>) -> String {
    let dir = tempfile::tempdir().expect("tmp");
    let chart = dir.path().join("gpuval");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(gpuval_tests::chart::chart_dir())
        .arg(&chart)
        .status()
        .expect("cp");
    assert!(copied.success());
    let notes = std::fs::read_to_string(chart.join("templates/NOTES.txt")).expect("NOTES.txt");
    std::fs::write(
        chart.join("templates/_notes_probe.tpl"),
        format!("{{{{- define \"probe.notes\" -}}}}\n{notes}\n{{{{- end -}}}}\n"),
    )
    .expect("probe template");
    std::fs::write(
        chart.join("templates/notes-probe.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-probe\ndata:\n  notes: {{ include \"probe.notes\" . | quote }}\n",
    )
    .expect("probe");
    let mut cmd = gpuval_tests::chart::helm().expect("helm");
    cmd.args(["template", "gpuval"])
        .arg(&chart)
        .args(["-n", NS, &gpuval_tests::chart::kube_version_arg()])
        .args(["--show-only", "templates/notes-probe.yaml"]);
    if let Some(v) = values {
        cmd.arg("--values").arg(v);
    }
    let out = gpuval_tests::chart::output(&mut cmd).expect("helm template");
    let doc: serde_json::Value = serde_saphyr::from_str(&out).expect("the ConfigMap");
    doc["data"]["notes"].as_str().expect("notes").to_string()
}

#[test]
fn the_install_notes_say_how_to_build_and_push_images_nothing_publishes() {
    let defaults = rendered_notes(None);
    for want in [
        "make images",
        "skopeo copy oci-archive:",
        "--set agent.image.repository=REGISTRY/gpuval-agent",
        "kubectl gpuval wait quick",
    ] {
        assert!(defaults.contains(want), "{want:?} missing:\n{defaults}");
    }
    let dir = tempfile::tempdir().expect("tmp");
    let own = dir.path().join("values.yaml");
    std::fs::write(
        &own,
        "operator:\n  image:\n    repository: registry.example/gpuval-operator\nagent:\n  image:\n    repository: registry.example/gpuval-agent\n",
    )
    .expect("values");
    let with_images = rendered_notes(Some(&own));
    assert!(
        !with_images.contains("make images"),
        "no image advice once the values name other images:\n{with_images}"
    );
}
