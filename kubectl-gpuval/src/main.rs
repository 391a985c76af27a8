//! `kubectl gpuval` (kubectl finds this binary as a plugin by its name):
//! `status [NAME]` prints each validation's tree of nodes and GPUs with verdicts and first
//! reasons; `report NAME -o html|markdown|json` renders one validation's results;
//! `diff A B` compares two validations' results per node and GPU and flags regressions.
//! Exit codes: 0 fine, 1 `diff` found a regression or a worse verdict, 2 could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use gpuval_crds::{GpuNodeResult, GpuValidation, labels};
use gpuval_view::{Document, Tolerance};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

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
    /// when NAME is left out).
    Status { name: Option<String> },
    /// One validation's results as one self-contained HTML page, Markdown or JSON.
    Report {
        name: String,
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Html)]
        output: Format,
        /// Write here instead of stdout.
        #[arg(long, short = 'f', value_name = "FILE")]
        file: Option<PathBuf>,
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
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Html,
    Markdown,
    Json,
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
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<u8> {
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
            for n in names {
                print!("{}", gpuval_view::tree(&load(&client, ns, &n).await?));
            }
            Ok(0)
        }
        Command::Report { name, output, file } => {
            let doc = load(&client, ns, &name).await?;
            let text = match output {
                Format::Html => gpuval_view::html(&doc),
                Format::Markdown => gpuval_view::markdown(&doc),
                Format::Json => gpuval_view::json(&doc),
            };
            match file {
                Some(path) => std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => print!("{text}"),
            }
            Ok(0)
        }
        Command::Diff {
            before,
            after,
            tolerance,
            json,
        } => {
            let a = load(&client, ns, &before).await?;
            let b = load(&client, ns, &after).await?;
            let d = gpuval_view::diff(&a, &b, Tolerance(tolerance / 100.0));
            if json {
                println!("{}", serde_json::to_string_pretty(&d)?);
            } else {
                print!("{}", d.text());
            }
            Ok(u8::from(d.worse()))
        }
    }
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
