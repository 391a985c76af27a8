//! `kubectl gpuval` (kubectl finds this binary as a plugin by its name):
//! `status [NAME]` prints each validation's tree of nodes and GPUs with verdicts and first
//! reasons; `report NAME -o html|markdown|json` renders one validation's results;
//! `diff A B` compares two validations' results per node and GPU and flags regressions;
//! `wait NAME` returns once the run has its verdict; `rerun NAME [--node N]` runs it again.
//! Exit codes: 0 fine, 1 the run failed (`status`, `wait`, `report --exit-code`) or `diff`
//! found a regression or a worse verdict, 2 could not run. A closed stdout (`| head`) ends
//! the command quietly.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gpuval_crds::{GpuNodeResult, GpuValidation, labels};
use gpuval_view::{Document, Tolerance};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use kubectl_gpuval::cli::{self, ReportFormat};

#[derive(Parser)]
#[command(
    name = "kubectl-gpuval",
    version,
    about = "See gpuval validations: status, reports, diffs"
)]
struct Cli {
    /// Namespace of the node results (the operator's namespace).
    #[arg(
        long,
        short = 'n',
        global = true,
        env = "GPUVAL_NAMESPACE",
        default_value = "gpuval-system"
    )]
    namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The tree validation -> nodes -> GPUs, with verdicts and first reasons (every validation
    /// when NAME is left out); exits 1 when a validation shown has Failed, 3 when NAME does not
    /// exist.
    Status { name: Option<String> },
    /// One validation's results as one self-contained HTML page, Markdown, JSON or JUnit XML
    /// (HTML by default; Markdown when written to a terminal; a file's extension names its
    /// format).
    Report {
        name: String,
        /// The format: html, markdown, json or junit (JUnit XML, for CI systems).
        #[arg(long, short = 'o', value_name = "FORMAT", value_parser = cli::parse_report_format)]
        output: Option<ReportFormat>,
        /// Write here instead of stdout (.html, .md, .json or .xml for JUnit, or any name with -o).
        #[arg(long, short = 'f', value_name = "FILE")]
        file: Option<PathBuf>,
        /// Exit 1 when the run failed (as `git diff --exit-code` does for differences).
        #[arg(long)]
        exit_code: bool,
    },
    /// Wait until the run of the current spec has its verdict: exit 0 once Passed, 1 once
    /// Failed (at once when it already is), 3 when there is no such validation, 4 after
    /// --timeout (2: it could not watch).
    Wait {
        name: String,
        /// How long to wait: a duration (90s, 5m, 1h30m) or whole seconds.
        #[arg(long, default_value = "30m", value_parser = cli::parse_timeout)]
        timeout: Duration,
    },
    /// Run a validation again: a new validation `NAME-xxxxx` with the same spec (so that
    /// `diff NAME NAME-xxxxx` compares the two), on the named nodes only with --node.
    Rerun {
        name: String,
        /// Only this node (repeat for several).
        #[arg(long = "node", value_name = "NODE")]
        nodes: Vec<String>,
    },
    /// Compare validation B with the earlier validation A, node by node and GPU by GPU.
    Diff {
        before: String,
        after: String,
        /// A figure that fell by more than this many percent is a regression.
        #[arg(long, default_value_t = 5.0)]
        tolerance: f64,
        /// Print the comparison as JSON.
        #[arg(long)]
        json: bool,
        /// List every figure compared, unchanged ones too (by default only what changed).
        #[arg(long)]
        all: bool,
    },
    /// Export a signed certificate: NAME is a certificate ConfigMap, or a validation (its
    /// summary certificate, or with --node that node's).
    Certificate {
        name: String,
        /// The certificate of this node of validation NAME.
        #[arg(long)]
        node: Option<String>,
        /// The certificate as an in-toto attestation (a DSSE envelope, signed with the same
        /// key), for standard verifiers (cosign verify-blob-attestation, securesystemslib).
        #[arg(long)]
        attestation: bool,
        /// Write here instead of stdout.
        #[arg(long, short = 'f', value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Verify an exported certificate or attestation offline against the issuer's public key
    /// (the ConfigMap gpuval-certificate-public-key): exit 0 valid, 1 not valid, naming what is
    /// wrong.
    Verify {
        certificate: PathBuf,
        /// The public key (PEM).
        #[arg(long, value_name = "PEM")]
        key: PathBuf,
    },
    /// A GPU's figures over time, from its certificates.
    History { gpu_uuid: String },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => match cli::error_message(&e) {
            Some(message) => {
                eprintln!("{message}");
                ExitCode::from(cli::exit_for_error(&e))
            }
            None => ExitCode::from(cli::OK),
        },
    }
}

/// Writes `text` to stdout; a reader that went away (`| head`) is an error the caller ends on
/// quietly (see [`cli::error_message`]), never a panic.
fn out(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
}

async fn run(cli: Cli) -> Result<u8> {
    // Offline: no cluster needed.
    if let Command::Verify { certificate, key } = &cli.command {
        return verify(certificate, key);
    }
    let client = Client::try_default()
        .await
        .context("no Kubernetes client: set KUBECONFIG or run inside a cluster")?;
    let ns = cli.namespace.as_str();
    match cli.command {
        Command::Status { name } => {
            let names = match name {
                Some(n) => vec![n],
                None => all_validations(&client).await?,
            };
            let mut code = cli::OK;
            for n in names {
                let doc = load(&client, ns, &n).await?;
                out(&gpuval_view::tree(&doc))?;
                code = code.max(document_exit(&doc));
            }
            Ok(code)
        }
        Command::Report {
            name,
            output,
            file,
            exit_code,
        } => report(&client, ns, &name, output, file, exit_code).await,
        Command::Diff {
            before,
            after,
            tolerance,
            json,
            all,
        } => {
            let a = load(&client, ns, &before).await?;
            let b = load(&client, ns, &after).await?;
            let d = gpuval_view::diff(&a, &b, Tolerance(tolerance / 100.0));
            if json {
                out(&format!("{}\n", serde_json::to_string_pretty(&d)?))?;
            } else {
                out(&d.text(all))?;
            }
            Ok(if d.worse() { cli::FAILED } else { cli::OK })
        }
        Command::Wait { name, timeout } => wait(&client, &name, timeout).await,
        Command::Rerun { name, nodes } => rerun(&client, &name, &nodes).await,
        Command::Certificate {
            name,
            node,
            attestation,
            file,
        } => {
            let text = certificate(&client, ns, &name, node.as_deref(), attestation).await?;
            write_to(file.as_deref(), &text)?;
            Ok(cli::OK)
        }
        Command::History { gpu_uuid } => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
            let selector = kubectl_gpuval::certificates::gpu_selector(&gpu_uuid);
            let list = api
                .list(&ListParams::default().labels(&selector))
                .await
                .with_context(|| {
                    format!(
                        "listing the certificates of {gpu_uuid} in namespace {ns:?} (--namespace)"
                    )
                })?;
            out(&kubectl_gpuval::certificates::history(
                &gpu_uuid,
                &list.items,
            ))?;
            Ok(cli::OK)
        }
        Command::Verify { certificate, key } => verify(&certificate, &key),
    }
}

/// Writes validation `name`'s report in the format asked for (or its file's), to `file` or
/// stdout; with `exit_code`, 1 when the run failed.
async fn report(
    client: &Client,
    ns: &str,
    name: &str,
    output: Option<ReportFormat>,
    file: Option<PathBuf>,
    exit_code: bool,
) -> Result<u8> {
    let format = match &file {
        Some(path) => cli::file_format(path, output),
        None => cli::report_format(output, std::io::IsTerminal::is_terminal(&std::io::stdout())),
    }
    .map_err(anyhow::Error::msg)?;
    let doc = load(client, ns, name).await?;
    let text = match format {
        ReportFormat::Html => gpuval_view::html(&doc),
        ReportFormat::Markdown => gpuval_view::markdown(&doc),
        ReportFormat::Json => gpuval_view::json(&doc),
        ReportFormat::Junit => gpuval_view::junit(&doc),
    };
    write_to(file.as_deref(), &text)?;
    Ok(if exit_code {
        document_exit(&doc)
    } else {
        cli::OK
    })
}

/// Writes `text` to `file`, or to stdout without one.
fn write_to(file: Option<&std::path::Path>, text: &str) -> Result<()> {
    match file {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
        }
        None => out(text),
    }
}

/// Checks the certificate file against the public key file.
fn verify(certificate: &std::path::Path, key: &std::path::Path) -> Result<u8> {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let (text, key) = (read(certificate)?, read(key)?);
    match gpuval_crds::attestation::verify_exported(&text, &key) {
        Ok(said) => {
            out(&format!("{said}\n"))?;
            Ok(cli::OK)
        }
        Err(e) => {
            eprintln!("{} does not verify: {e}", certificate.display());
            Ok(cli::FAILED)
        }
    }
}

/// The certificate text `name` means: a certificate ConfigMap of that name, else validation
/// `name`'s (of `node` when given).
async fn certificate(
    client: &Client,
    ns: &str,
    name: &str,
    node: Option<&str>,
    attestation: bool,
) -> Result<String> {
    use kubectl_gpuval::certificates as c;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    if node.is_none()
        && let Some(cm) = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading ConfigMap {name:?} in namespace {ns:?}"))?
    {
        return Ok(c::text(&cm, attestation)
            .map_err(anyhow::Error::msg)?
            .to_string());
    }
    let selector = format!(
        "{},{}={}",
        c::KIND_LABEL,
        labels::VALIDATION,
        labels::node_value(name)
    );
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .with_context(|| {
            format!("listing the certificates of {name:?} in namespace {ns:?} (--namespace)")
        })?;
    let cm = c::pick(&list.items, name, node).map_err(anyhow::Error::msg)?;
    if let Some(note) = c::other_parts(cm) {
        eprintln!("{note}");
    }
    Ok(c::text(cm, attestation)
        .map_err(anyhow::Error::msg)?
        .to_string())
}

/// The exit code of the run a document shows ([`cli::FAILED`] once it failed).
fn document_exit(doc: &Document) -> u8 {
    let failed = doc.validation.as_ref().is_some_and(|v| v.phase == "Failed");
    if failed { cli::FAILED } else { cli::OK }
}

/// Watches validation `name` until its current spec's run is Passed (0) or Failed (1); one that
/// does not exist is told at once, as `kubectl wait` says it, with its own code (3).
async fn wait(client: &Client, name: &str, timeout: Duration) -> Result<u8> {
    let api: Api<GpuValidation> = Api::all(client.clone());
    if api
        .get_opt(name)
        .await
        .with_context(|| format!("reading GpuValidation {name:?}"))?
        .is_none()
    {
        eprintln!("Error from server (NotFound): gpuvalidations.gpuval.io \"{name}\" not found");
        return Ok(cli::NOT_FOUND);
    }
    let settled = |g: Option<&GpuValidation>| g.and_then(cli::settled).is_some();
    let watch = kube::runtime::wait::await_condition(api.clone(), name, settled);
    let gv = match tokio::time::timeout(timeout, watch).await {
        Ok(Ok(Some(gv))) => gv,
        Ok(Ok(None)) => {
            // Gone while waiting (or never there): say so as kubectl would.
            api.get(name)
                .await
                .with_context(|| format!("reading GpuValidation {name:?}"))?
        }
        Ok(Err(e)) => return Err(e).with_context(|| format!("watching GpuValidation {name:?}")),
        Err(_) => {
            return Err(cli::TimedOut {
                name: name.to_string(),
                seconds: timeout.as_secs(),
            }
            .into());
        }
    };
    let code = cli::settled(&gv).unwrap_or(cli::ERROR);
    out(&cli::settled_line(&gv))?;
    Ok(code)
}

/// Creates a new validation with `name`'s spec (on `nodes` only, where any are named).
async fn rerun(client: &Client, name: &str, nodes: &[String]) -> Result<u8> {
    let api: Api<GpuValidation> = Api::all(client.clone());
    let gv = api
        .get(name)
        .await
        .with_context(|| format!("reading GpuValidation {name:?}"))?;
    let created = api
        .create(&PostParams::default(), &cli::rerun_of(&gv, nodes))
        .await
        .with_context(|| format!("creating a rerun of {name:?}"))?;
    out(&format!(
        "gpuvalidation.gpuval.io/{} created (a rerun of {name}; `kubectl gpuval wait {0}`, then `kubectl gpuval diff {name} {0}`)\n",
        created.name_any()
    ))?;
    Ok(cli::OK)
}

async fn all_validations(client: &Client) -> Result<Vec<String>> {
    let api: Api<GpuValidation> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .context("listing GpuValidations (are the gpuval CRDs installed?)")?;
    Ok(list.items.iter().map(|v| v.name_any()).collect())
}

/// The validation `name` and its results, as a document.
async fn load(client: &Client, ns: &str, name: &str) -> Result<Document> {
    let gv = Api::<GpuValidation>::all(client.clone())
        .get(name)
        .await
        .with_context(|| format!("reading GpuValidation {name:?}"))?;
    let results = Api::<GpuNodeResult>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("{}={name}", labels::VALIDATION)))
        .await
        .with_context(|| {
            format!("listing the GpuNodeResults of {name:?} in namespace {ns:?} (--namespace)")
        })?;
    Ok(kubectl_gpuval::document(&gv, &results.items))
}
