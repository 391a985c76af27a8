//! What the pure scale benchmarks (`scale_pure`, `scale_fabric`) share: their errors, flags,
//! node names, start time and figures. They are not tests and start no API server.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error("building the validation: {0}")]
    Spec(#[from] serde_json::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Run(String),
}

/// The flags: `--nodes 1000,2000` (the sizes to run) and `--out FILE` (the rows as JSON).
pub struct Args {
    pub sizes: Vec<usize>,
    pub out: Option<PathBuf>,
}

impl Args {
    /// The process's flags; `sizes` where `--nodes` is not given.
    pub fn from_env(sizes: &[usize]) -> Result<Self, Error> {
        let mut a = Args {
            sizes: sizes.to_vec(),
            out: None,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let v = it
                .next()
                .ok_or_else(|| Error::Usage(format!("{flag} needs a value")))?;
            match flag.as_str() {
                "--nodes" => {
                    a.sizes = v
                        .split(',')
                        .map(|s| s.trim().parse::<usize>())
                        .collect::<Result<_, _>>()
                        .map_err(|e| Error::Usage(format!("--nodes: {e}")))?;
                }
                "--out" => a.out = Some(PathBuf::from(v)),
                other => return Err(Error::Usage(format!("unknown flag {other}"))),
            }
        }
        Ok(a)
    }

    /// Writes `rows` as pretty JSON to `--out`, when it was given.
    pub fn write(&self, rows: &impl serde::Serialize) -> Result<(), Error> {
        let Some(path) = &self.out else {
            return Ok(());
        };
        let body = serde_json::to_string_pretty(rows)?;
        std::fs::write(path, body).map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })
    }
}

/// A column of the printed table: the key of the figure in a row's JSON, the header, and what
/// follows the figure (` ms`, ` B` or nothing).
pub type Column = (&'static str, &'static str, &'static str);

/// Prints the markdown table's header and separator.
pub fn print_header(columns: &[Column]) {
    let headers: Vec<&str> = columns.iter().map(|(_, header, _)| *header).collect();
    println!("| {} |", headers.join(" | "));
    println!("|{}", " --- |".repeat(columns.len()));
}

/// Prints `row` (one size's figures) as a line of the table.
pub fn print_row(columns: &[Column], row: &serde_json::Value) {
    let cells: Vec<String> = columns
        .iter()
        .map(|(key, _, unit)| format!("{}{unit}", row[*key]))
        .collect();
    println!("| {} |", cells.join(" | "));
}

/// Node `i`'s name.
pub fn node_name(i: usize) -> String {
    format!("gpu-node-{i:05}")
}

/// The moment the benchmarked run starts (a fixed one, so that runs compare).
pub fn start() -> Result<Timestamp, Error> {
    Timestamp::from_second(1_790_000_000).map_err(|e| Error::Run(e.to_string()))
}

/// Milliseconds to the microsecond.
pub fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1000.0
}

/// Runs `run`; when it fails, prints `name: error` and exits 1.
pub fn main(name: &str, run: impl FnOnce() -> Result<(), Error>) {
    if let Err(e) = run() {
        eprintln!("{name}: {e}");
        std::process::exit(1);
    }
}
