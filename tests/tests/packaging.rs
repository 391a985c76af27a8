//! Images and GitOps, as far as tests reach without a Docker engine or an Argo CD / Flux
//! install: the Dockerfile passes hadolint and builds what CI builds, shipping each binary
//! without debug info and with its SBOM; the debug-info split and the SBOMs themselves; the
//! Argo CD health check runs in Lua 5.1 on sample statuses; the Flux and Argo CD examples point
//! at a validation the API server accepts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use gpuval_tests::chart::{self, ChartTools};
use gpuval_tests::{ControlPlane, crds};
use serde_json::{Value, json};

fn read(rel: &str) -> String {
    let path = crds::repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn dockerfile_passes_hadolint_and_builds_what_ci_builds() {
    let tools = ChartTools::install().expect("hadolint (tests/scripts/install-chart-tools.sh)");
    let root = crds::repo_root();
    let out = std::process::Command::new(&tools.hadolint)
        .arg(root.join("Dockerfile"))
        .output()
        .expect("run hadolint");
    assert!(
        out.status.success(),
        "hadolint found problems:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let dockerfile = read("Dockerfile");
    let lines: Vec<&str> = dockerfile.lines().map(str::trim).collect();
    // Two targets, each ending as a non-root numeric user with OCI labels and versions as
    // build arguments.
    let stages: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .copied()
        .collect();
    assert!(
        stages.iter().any(|s| s.ends_with(" AS build")),
        "{stages:?}"
    );
    assert!(
        stages.iter().any(|s| s.ends_with(" AS operator")),
        "{stages:?}"
    );
    let agent = stages
        .iter()
        .find(|s| s.ends_with(" AS agent"))
        .expect("agent target");
    // The base is a build argument (CI substitutes a local stand-in); its default is NVIDIA's
    // CUDA runtime image.
    assert_eq!(*agent, "FROM ${AGENT_BASE} AS agent");
    let base = lines
        .iter()
        .find_map(|l| l.strip_prefix("ARG AGENT_BASE="))
        .expect("ARG AGENT_BASE");
    assert!(
        base.starts_with("nvidia/cuda:") && base.contains("-runtime-"),
        "{base}"
    );
    for arg in [
        "RUST_VERSION",
        "CUDA_VERSION",
        "UBUNTU_VERSION",
        "VERSION",
        "REVISION",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("ARG {arg}"))),
            "build argument {arg}"
        );
    }
    for target in ["operator", "agent"] {
        let start = lines
            .iter()
            .position(|l| l.starts_with("FROM ") && l.ends_with(&format!(" AS {target}")))
            .expect("stage");
        let end = lines[start + 1..]
            .iter()
            .position(|l| l.starts_with("FROM "))
            .map_or(lines.len(), |i| start + 1 + i);
        let stage = &lines[start..end];
        let user = stage
            .iter()
            .rev()
            .find(|l| l.starts_with("USER "))
            .unwrap_or_else(|| panic!("{target}: no USER"));
        let uid: u32 = user[5..]
            .split(':')
            .next()
            .and_then(|u| u.parse().ok())
            .unwrap_or_else(|| panic!("{target}: USER must be numeric: {user}"));
        assert_ne!(uid, 0, "{target} runs as root");
        for label in ["title", "version", "revision", "source", "licenses"] {
            let oci = format!("org.opencontainers.image.{label}=");
            assert!(
                any_line(stage, |l| l.contains(&oci)),
                "{target}: OCI label {label}"
            );
        }
        assert!(
            any_line(stage, |l| l.starts_with(ENTRYPOINT)),
            "{target}: entrypoint"
        );
        // The binary's SBOM ships in the image, at the path the io.gpuval.sbom label names.
        let binary = format!("gpuval-{target}");
        let sbom = format!("/usr/local/share/gpuval/sbom/{binary}.cdx.json");
        let label = format!("io.gpuval.sbom=\"{sbom}\"");
        assert!(
            any_line(stage, |l| l.starts_with(&label)),
            "{target}: the io.gpuval.sbom label names {sbom}"
        );
        assert!(
            stage.contains(&format!("COPY --from=build /out/{binary}.cdx.json {sbom}").as_str()),
            "{target}: the SBOM is copied to {sbom}"
        );
        assert!(
            stage.contains(
                &format!("COPY --from=build /out/{binary} /usr/local/bin/{binary}").as_str()
            ),
            "{target}: the binary from make release"
        );
    }
    // The image build runs `make release sbom` into /out, and `make release` is the cargo
    // command CI runs, then the debug-info split.
    assert!(
        dockerfile.contains("make release sbom DIST=/out"),
        "the build stage runs make release sbom"
    );
    let makefile = read("Makefile");
    let recipe = |target: &str| -> Vec<String> {
        makefile
            .split(&format!("\n{target}:\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("a {target} target in the Makefile"))
            .lines()
            .take_while(|l| l.starts_with('\t'))
            .map(|l| l.trim().to_string())
            .collect()
    };
    let release = recipe("release");
    assert_eq!(
        release[0],
        "$(CARGO) build --release --locked -p gpuval-operator -p gpuval-agent"
    );
    assert!(
        release[1].contains("scripts/split-debug.sh \"$(TARGET_DIR)/release/$$bin\" \"$(DIST)\""),
        "{release:?}"
    );
    assert_eq!(
        recipe("sbom"),
        ["scripts/sbom.sh \"$(DIST)\" $(RELEASE_BINARIES)"]
    );
    assert!(makefile.contains("\nRELEASE_BINARIES := gpuval-operator gpuval-agent\n"));
    // The SBOM tool in the image is the one CI installs.
    let pinned = |text: &str, key: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("{key} not found"))
    };
    assert_eq!(
        pinned(&dockerfile, "ARG CARGO_CYCLONEDX_VERSION="),
        pinned(&makefile, "CARGO_CYCLONEDX_VERSION :=")
    );
    let ci = read(".ci/run");
    for step in [
        "\nmake tools\n",
        "\nmake deny\n",
        "\nmake release sbom\n",
        "\nGPUVAL_REQUIRE_SBOM=1 make test\n",
    ] {
        assert!(ci.contains(step), "CI runs {step:?}");
    }
    assert!(read(".dockerignore").contains("target/"));
}

/// `program args...`, its stdout; panics with its stderr when it fails.
fn run(program: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(crds::repo_root())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (GNU binutils and cargo are needed)"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The section names of an ELF file (`readelf -S`).
fn sections(file: &Path) -> BTreeSet<String> {
    run("readelf", &["-S".as_ref(), "-W".as_ref(), file.as_os_str()])
        .lines()
        .filter_map(|l| {
            let name = l.split(']').nth(1)?.split_whitespace().next()?;
            Some(name.to_string())
        })
        .collect()
}

/// The bytes of an ELF file's `.debug_*` sections (readelf's Size column, hex).
fn debug_bytes(file: &Path) -> u64 {
    run("readelf", &["-S".as_ref(), "-W".as_ref(), file.as_os_str()])
        .lines()
        .filter_map(|l| {
            let mut f = l.split(']').nth(1)?.split_whitespace();
            let name = f.next()?;
            // Name, Type, Address, Off, Size.
            let size = f.nth(3)?;
            name.starts_with(".debug_")
                .then(|| u64::from_str_radix(size, 16).ok())
                .flatten()
        })
        .sum()
}

/// The GNU build ID of an ELF file, if it has one.
fn build_id(file: &Path) -> Option<String> {
    let out = Command::new("readelf")
        .args(["-n".as_ref(), file.as_os_str()])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
}

#[test]
fn split_debug_ships_the_binary_without_debug_info_and_keeps_it_beside() {
    // This test's own executable: built with line tables, like a release binary.
    let exe = std::env::current_exe().expect("the test executable");
    let name = exe.file_name().expect("a file name").to_owned();
    let dir = tempfile::tempdir().expect("temp dir");
    let script = crds::repo_root().join("scripts/split-debug.sh");
    run(
        "bash",
        &[script.as_os_str(), exe.as_os_str(), dir.path().as_os_str()],
    );
    let stripped = dir.path().join(&name);
    let mut debug_name = name.clone();
    debug_name.push(".debug");
    let debug = dir.path().join(&debug_name);

    let shipped = sections(&stripped);
    for gone in [".debug_info", ".debug_line", ".debug_str"] {
        assert!(!shipped.contains(gone), "{gone} left in {shipped:?}");
    }
    for kept in [".gnu_debuglink", ".symtab", ".text"] {
        assert!(shipped.contains(kept), "{kept} missing from {shipped:?}");
    }
    let kept = sections(&debug);
    for needed in [".debug_info", ".debug_line", ".symtab"] {
        assert!(kept.contains(needed), "{needed} missing from {kept:?}");
    }
    let link = run(
        "readelf",
        &[
            "-p".as_ref(),
            ".gnu_debuglink".as_ref(),
            stripped.as_os_str(),
        ],
    );
    assert!(
        link.contains(debug_name.to_string_lossy().as_ref()),
        "{link}"
    );
    assert_eq!(build_id(&stripped), build_id(&exe), "the build ID stays");
    let size = |p: &Path| std::fs::metadata(p).expect("size").len();
    let debug_info = debug_bytes(&exe);
    assert!(debug_info > 0, "the test binary has debug sections");
    assert!(
        size(&exe) - size(&stripped) >= debug_info * 9 / 10,
        "the shipped binary sheds its {debug_info} bytes of debug sections: {} vs {}",
        size(&stripped),
        size(&exe)
    );

    // The shipped binary still runs, and the .debug file maps its addresses to source lines.
    let listed = run(stripped.to_str().expect("UTF-8 path"), &["--list".as_ref()]);
    assert!(listed.contains("split_debug_ships_the_binary"), "{listed}");
    let symbols = run("nm", &[stripped.as_os_str()]);
    let address = symbols
        .lines()
        .find(|l| l.contains("split_debug_ships_the_binary") && l.contains(" t "))
        .or_else(|| {
            symbols
                .lines()
                .find(|l| l.contains("split_debug_ships_the_binary"))
        })
        .and_then(|l| l.split_whitespace().next())
        .expect("this test's symbol in the shipped binary");
    let line = run(
        "addr2line",
        &[
            "-e".as_ref(),
            debug.as_os_str(),
            format!("0x{address}").as_ref(),
        ],
    );
    assert!(line.contains("tests/tests/packaging.rs:"), "{line}");

    // Splitting what has no debug info left fails instead of writing an empty .debug file.
    let again = Command::new("bash")
        .arg(&script)
        .arg(&stripped)
        .arg(dir.path().join("again"))
        .output()
        .expect("run split-debug.sh");
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("no debug line tables"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

/// `(name, version)` to the checksum Cargo.lock records (none for the workspace's own crates).
fn lockfile() -> BTreeMap<(String, String), Option<String>> {
    let mut out = BTreeMap::new();
    for block in read("Cargo.lock").split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                l.strip_prefix(&format!("{key} = \""))
                    .and_then(|v| v.strip_suffix('"'))
                    .map(str::to_string)
            })
        };
        let (Some(name), Some(version)) = (field("name"), field("version")) else {
            panic!("a Cargo.lock package without a name or version: {block}");
        };
        out.insert((name, version), field("checksum"));
    }
    out
}

/// The crates `cargo tree` says `package` links on this host: its normal dependencies, all the
/// way down (dev- and build-only dependencies left out), without the package itself.
fn linked_crates(package: &str) -> BTreeSet<(String, String)> {
    let host = run("rustc", &["-vV".as_ref()])
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host");
    let tree = run(
        "cargo",
        &[
            "tree".as_ref(),
            "--locked".as_ref(),
            "-p".as_ref(),
            package.as_ref(),
            "-e".as_ref(),
            "normal".as_ref(),
            "--target".as_ref(),
            host.as_ref(),
            "--prefix".as_ref(),
            "none".as_ref(),
            "--format".as_ref(),
            "{p}".as_ref(),
        ],
    );
    tree.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?;
            let version = words.next()?.strip_prefix('v')?;
            Some((name.to_string(), version.to_string()))
        })
        .filter(|(name, _)| name != package)
        .collect()
}

#[test]
fn sboms_list_every_crate_each_binary_links_with_the_lockfile_checksums() {
    let tool = Command::new("cargo")
        .args(["cyclonedx", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !tool {
        assert_ne!(
            std::env::var("GPUVAL_REQUIRE_SBOM").as_deref(),
            Ok("1"),
            "GPUVAL_REQUIRE_SBOM=1, but cargo-cyclonedx is not installed (make tools)"
        );
        eprintln!("skipped: cargo-cyclonedx is not installed (make tools installs it; CI does)");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let script = crds::repo_root().join("scripts/sbom.sh");
    run(
        "bash",
        &[
            script.as_os_str(),
            dir.path().as_os_str(),
            "gpuval-operator".as_ref(),
            "gpuval-agent".as_ref(),
        ],
    );
    let lock = lockfile();
    let cases = [
        (
            "gpuval-agent",
            [
                "gpuval-crds",
                "cudarc",
                "nvml-wrapper",
                "kube-client",
                "serde-saphyr",
            ],
            ["prometheus-client", "axum", "rcgen", "tempfile"],
        ),
        (
            "gpuval-operator",
            [
                "gpuval-crds",
                "kube-runtime",
                "gpuval-fabric",
                "axum",
                "prometheus-client",
            ],
            ["cudarc", "nvml-wrapper", "rcgen", "tempfile"],
        ),
    ];
    for (binary, has, lacks) in cases {
        let path = dir.path().join(format!("{binary}.cdx.json"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let bom: Value = serde_json::from_str(&text).expect("SBOM JSON");
        assert_eq!(bom["bomFormat"], "CycloneDX");
        assert_eq!(bom["specVersion"], "1.5");
        assert_eq!(bom["metadata"]["component"]["name"], binary);
        assert_eq!(bom["metadata"]["component"]["type"], "application");
        let mut listed = BTreeSet::new();
        for c in bom["components"].as_array().expect("components") {
            let (Some(name), Some(version)) = (c["name"].as_str(), c["version"].as_str()) else {
                panic!("{binary}: a component without a name or version: {c}");
            };
            let key = (name.to_string(), version.to_string());
            let checksum = lock
                .get(&key)
                .unwrap_or_else(|| panic!("{binary}: {name} {version} is not in Cargo.lock"));
            assert!(
                c["purl"]
                    .as_str()
                    .is_some_and(|p| p.starts_with(&format!("pkg:cargo/{name}@{version}"))),
                "{binary}: {c}"
            );
            if let Some(sum) = checksum {
                assert!(
                    c["hashes"].as_array().is_some_and(|h| h
                        .iter()
                        .any(|h| h["alg"] == "SHA-256" && h["content"] == sum.as_str())),
                    "{binary}: {name} {version} without the lockfile's checksum: {c}"
                );
            }
            listed.insert(key);
        }
        let linked = linked_crates(binary);
        let missing: Vec<_> = linked.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "{binary}: linked but not in the SBOM: {missing:?}"
        );
        let names: BTreeSet<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
        for name in has {
            assert!(names.contains(name), "{binary}: {name} missing");
        }
        for name in lacks.iter().chain(&["serde_yaml"]) {
            assert!(!names.contains(name), "{binary}: {name} listed");
        }
    }
}

#[test]
fn chart_and_image_versions_follow_the_workspace() {
    let cargo = read("Cargo.toml");
    let version = cargo
        .split("[workspace.package]")
        .nth(1)
        .and_then(|s| s.lines().find(|l| l.starts_with("version")))
        .and_then(|l| l.split('"').nth(1))
        .expect("workspace version");
    let chart_yaml = chart::documents(&read("charts/gpuval/Chart.yaml")).unwrap();
    assert_eq!(
        chart_yaml[0]["appVersion"], version,
        "Chart.yaml appVersion"
    );
    assert!(
        read("Dockerfile").contains(&format!("ARG VERSION={version}")),
        "the Dockerfile's default VERSION is {version}"
    );
    // The chart's default images are tagged with the appVersion.
    let rendered = chart::render("gpuval", "gpuval-system", &[]).unwrap();
    assert!(
        rendered.contains(&format!("gpuval-operator:{version}")),
        "{rendered}"
    );
    assert!(rendered.contains(&format!("gpuval-agent:{version}")));
}

/// A GpuValidation at `generation` with the given status.
fn validation(generation: i64, status: Value) -> Value {
    json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidation",
        "metadata": {"name": "v", "generation": generation},
        "spec": {"checks": {"memory": {}}},
        "status": status,
    })
}

fn cond(kind: &str, status: &str, reason: &str, message: &str, generation: i64) -> Value {
    json!({"type": kind, "status": status, "reason": reason, "message": message,
           "observedGeneration": generation, "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

#[test]
fn argocd_health_check_maps_every_state_of_a_validation() {
    let tools = ChartTools::install().expect("lupa (tests/scripts/install-chart-tools.sh)");
    let mut no_status = validation(1, Value::Null);
    no_status.as_object_mut().unwrap().remove("status");
    let mut deleting = validation(1, json!({"observedGeneration": 1, "phase": "Running"}));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let running = |g| {
        json!({"observedGeneration": g, "phase": "Running", "conditions": [
            cond("Ready", "False", "Running", "1 of 2 node(s) done", g),
            cond("Reconciling", "True", "Running", "1 of 2 node(s) done", g),
            cond("Stalled", "False", "Running", "", g),
        ]})
    };
    let passed = json!({"observedGeneration": 2, "phase": "Passed", "conditions": [
        cond("Ready", "True", "Passed", "2 of 2 node(s) passed", 2),
        cond("Reconciling", "False", "Passed", "2 of 2 node(s) passed", 2),
        cond("Stalled", "False", "Passed", "", 2),
    ]});
    let failed = json!({"observedGeneration": 1, "phase": "Failed", "conditions": [
        cond("Ready", "False", "NodesFailed", "1 of 2 node(s) failed; gpu-b Failed: GPU5 memory", 1),
        cond("Reconciling", "False", "NodesFailed", "done", 1),
        cond("Stalled", "True", "NodesFailed", "1 of 2 node(s) failed; gpu-b Failed: GPU5 memory", 1),
    ]});
    // Passed at generation 2, but the spec is now at 3: the old verdict must not count.
    let stale = validation(3, passed.clone());
    // Status written for generation 2 with conditions left from generation 1.
    let mixed = validation(
        2,
        json!({"observedGeneration": 2, "phase": "Pending", "conditions": [
            cond("Ready", "True", "Passed", "old run", 1),
        ]}),
    );
    let cases = [
        (
            "no status",
            no_status,
            "Progressing",
            "Waiting for the gpuval operator",
        ),
        ("deleting", deleting, "Progressing", "being deleted"),
        (
            "pending",
            validation(1, json!({"observedGeneration": 1, "phase": "Pending"})),
            "Progressing",
            "Pending",
        ),
        (
            "running",
            validation(1, running(1)),
            "Progressing",
            "1 of 2 node(s) done",
        ),
        (
            "passed",
            validation(2, passed),
            "Healthy",
            "2 of 2 node(s) passed",
        ),
        (
            "failed",
            validation(1, failed),
            "Degraded",
            "gpu-b Failed: GPU5 memory",
        ),
        ("spec edited", stale, "Progressing", "observe generation 3"),
        ("old conditions", mixed, "Progressing", "Pending"),
    ];
    let objects: Vec<Value> = cases.iter().map(|c| c.1.clone()).collect();
    let answers = chart::argocd_health(&tools, &objects).expect("run health.lua");
    assert_eq!(answers.len(), cases.len());
    for ((name, _, status, message), answer) in cases.iter().zip(&answers) {
        assert_eq!(answer["status"], *status, "{name}: {answer}");
        assert!(
            answer["message"]
                .as_str()
                .is_some_and(|m| m.contains(message)),
            "{name}: {answer}"
        );
    }

    // argocd-cm.yaml carries exactly health.lua.
    let cm = chart::documents(&read("deploy/examples/gitops/argocd/argocd-cm.yaml")).unwrap();
    let embedded = cm[0]["data"]["resource.customizations.health.gpuval.io_GpuValidation"]
        .as_str()
        .expect("the health key in argocd-cm.yaml");
    assert_eq!(embedded, read("deploy/examples/gitops/argocd/health.lua"));
}

/// `kubectl kustomize <repo>/<path>`: the manifests a GitOps tool would apply from that path.
fn kustomize(cp: &ControlPlane, path: &str) -> Vec<Value> {
    let dir = crds::repo_root().join(path.trim_start_matches("./"));
    let stdout = chart::output(cp.kubectl().expect("kubectl").arg("kustomize").arg(&dir))
        .unwrap_or_else(|e| panic!("kubectl kustomize: {e}"));
    chart::documents(&stdout).expect("kustomize output")
}

/// How the images' entrypoint lines start.
const ENTRYPOINT: &str = "ENTRYPOINT [\"/usr/local/bin/gpuval-";

/// True when a line of a Dockerfile stage satisfies `f`.
fn any_line(stage: &[&str], f: impl Fn(&str) -> bool) -> bool {
    stage.iter().any(|l| f(l))
}

fn dry_run(cp: &ControlPlane, docs: &[Value], name: &str) {
    let file = cp.dir().join(name);
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string(d).expect("JSON"))
        .collect();
    std::fs::write(&file, text.join("\n---\n")).expect("write the manifests");
    let mut apply = cp.kubectl().expect("kubectl");
    apply.args(["apply", "--dry-run=server", "-f"]).arg(&file);
    chart::output(&mut apply).unwrap_or_else(|e| panic!("{name}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_examples_gate_on_a_validation_the_api_server_accepts() {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    crds::install_crds(&client).await.expect("CRDs");

    // Flux: the acceptance Kustomization health-checks GpuValidations that its path applies,
    // and the workloads depend on it.
    let flux = chart::documents(&read("deploy/examples/gitops/flux/gpu-acceptance.yaml")).unwrap();
    let kustomizations: Vec<&Value> = flux
        .iter()
        .filter(|d| d["kind"] == "Kustomization")
        .collect();
    let gate = kustomizations
        .iter()
        .find(|k| k["spec"]["healthChecks"].is_array())
        .expect("a Kustomization with health checks");
    let gate_name = gate["metadata"]["name"].as_str().unwrap();
    let applied = kustomize(&cp, gate["spec"]["path"].as_str().unwrap());
    dry_run(&cp, &applied, "flux-acceptance.yaml");
    let checks = gate["spec"]["healthChecks"].as_array().unwrap();
    assert!(!checks.is_empty());
    for hc in checks {
        assert_eq!(hc["apiVersion"], "gpuval.io/v1alpha1");
        assert_eq!(hc["kind"], "GpuValidation");
        assert!(
            hc.get("namespace").is_none(),
            "GpuValidation is cluster-scoped"
        );
        assert!(
            applied
                .iter()
                .any(|d| d["kind"] == "GpuValidation" && d["metadata"]["name"] == hc["name"]),
            "health check {} names nothing the path applies",
            hc["name"]
        );
    }
    // Longer than the validation's deadline, or Flux gives up on a run still going.
    let deadline = applied
        .iter()
        .find(|d| d["kind"] == "GpuValidation")
        .and_then(|d| d["spec"]["deadline"].as_str())
        .and_then(|d| d.parse::<gpuval_crds::Duration>().ok())
        .expect("the gate sets a deadline");
    let timeout: gpuval_crds::Duration = gate["spec"]["timeout"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("the gate sets a timeout");
    assert!(
        timeout.as_std() > deadline.as_std(),
        "{timeout:?} vs {deadline:?}"
    );
    assert!(
        kustomizations.iter().any(|k| k["spec"]["dependsOn"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["name"] == gate_name))),
        "nothing waits on {gate_name}"
    );

    // Argo CD: the Application's path applies validations the API server accepts.
    let app = chart::documents(&read("deploy/examples/gitops/argocd/application.yaml")).unwrap();
    let path = app[0]["spec"]["source"]["path"]
        .as_str()
        .expect("source path");
    let docs = kustomize(&cp, path);
    assert!(docs.iter().any(|d| d["kind"] == "GpuValidation"));
    dry_run(&cp, &docs, "argocd-acceptance.yaml");
    assert!(Path::new(&crds::repo_root().join(path)).is_dir());
}
