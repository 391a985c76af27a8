//! `gpuval-agent fabric` as it runs outside Kubernetes: N agent processes on this host, launched
//! torchrun-style or as Slurm would, on 127.0.0.1 with the simulated backend (its NCCL figures
//! are simulated; the rendezvous, the control channel and the TCP pairs are real sockets).

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// The longest a whole launch may take before its processes are killed.
const LAUNCH_LIMIT: Duration = Duration::from_secs(150);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[derive(Clone, Copy)]
enum Launcher {
    Torchrun,
    Slurm,
}

struct Launch {
    ranks: usize,
    launcher: Launcher,
    /// The `--simulate` spec of each rank.
    simulate: Vec<String>,
    flags: Vec<String>,
}

struct Ran {
    codes: Vec<Option<i32>>,
    report: Option<Value>,
    logs: String,
}

/// Starts every rank in a new temporary directory, waits for all of them (killing any still
/// running after [`LAUNCH_LIMIT`]), and reads rank 0's report and every rank's log.
fn launch(l: &Launch) -> Ran {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    let port = free_port();
    let report = dir.join("report.json");
    let (tx, rx) = mpsc::channel();
    let mut pids = Vec::new();
    for rank in 0..l.ranks {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuval-agent"));
        cmd.arg("fabric")
            .args(["--simulate", &l.simulate[rank]])
            .args(["--node-name", &format!("node-{rank}")])
            .args(["--register-timeout", "30s", "--round-timeout", "20s"])
            .args(&l.flags)
            .args(["--output", &report.display().to_string()]);
        for v in [
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "SLURM_NODELIST",
            "SLURM_JOB_NODELIST",
        ] {
            cmd.env_remove(v);
        }
        for v in [
            "RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "GPUVAL_FABRIC_PORT",
        ] {
            cmd.env_remove(v);
        }
        match l.launcher {
            Launcher::Torchrun => cmd
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", l.ranks.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string()),
            Launcher::Slurm => cmd
                .env("SLURM_PROCID", rank.to_string())
                .env("SLURM_NTASKS", l.ranks.to_string())
                .env("SLURM_NODELIST", "127.0.0.1")
                .env("GPUVAL_FABRIC_PORT", port.to_string()),
        };
        let log = std::fs::File::create(dir.join(format!("rank{rank}.log"))).expect("log file");
        let err = log.try_clone().expect("log file");
        let mut child = cmd
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start gpuval-agent fabric");
        pids.push(child.id());
        let tx = tx.clone();
        std::thread::spawn(move || {
            let code = child.wait().ok().and_then(|s| s.code());
            let _ = tx.send((rank, code));
        });
    }
    drop(tx);
    let mut codes = vec![None; l.ranks];
    let deadline = std::time::Instant::now() + LAUNCH_LIMIT;
    for _ in 0..l.ranks {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok((rank, code)) => codes[rank] = code,
            Err(_) => {
                for pid in &pids {
                    // SAFETY: kill(2) on the ids of processes this test started; a finished one
                    // was reaped by its waiter and the call fails harmlessly.
                    unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
                }
                break;
            }
        }
    }
    let logs = (0..l.ranks)
        .map(|r| {
            let text =
                std::fs::read_to_string(dir.join(format!("rank{r}.log"))).unwrap_or_default();
            format!("--- rank {r}\n{text}")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let report = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    Ran {
        codes,
        report,
        logs,
    }
}

fn verdicts(report: &Value) -> Vec<(String, String)> {
    report["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .map(|n| {
                    (
                        n["node"].as_str().unwrap_or("?").to_string(),
                        n["verdict"].as_str().unwrap_or("?").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `ranks` simulated ranks whose network runs at 400 GB/s, but rank `odd`, simulated with `spec`.
fn all_but_one(ranks: usize, odd: usize, spec: &str) -> Vec<String> {
    let mut simulate = vec!["net=400".to_string(); ranks];
    simulate[odd] = spec.into();
    simulate
}

/// A torchrun-style launch of NCCL groups with a floor of 350 GB/s, one `--simulate` per rank.
fn torchrun_nccl(simulate: Vec<String>) -> Ran {
    let flags = vec!["--nccl-min-bus-gbps".into(), "350".into()];
    launch(&Launch {
        ranks: simulate.len(),
        launcher: Launcher::Torchrun,
        simulate,
        flags,
    })
}

#[test]
fn a_slow_node_among_four_is_named_and_every_rank_exits_1() {
    let ran = torchrun_nccl(all_but_one(4, 2, "net=100"));
    assert_eq!(ran.codes, vec![Some(1); 4], "{}", ran.logs);
    let report = ran.report.expect("rank 0 wrote the report");
    assert_eq!(report["passed"], Value::Bool(false));
    assert_eq!(report["simulated"], Value::Bool(true));
    let failed: Vec<String> = verdicts(&report)
        .into_iter()
        .filter(|(_, v)| v != "Passed")
        .map(|(n, v)| format!("{n}:{v}"))
        .collect();
    assert_eq!(failed, vec!["node-2:Failed".to_string()], "{report:#}");
    assert!(
        ran.logs.contains("node-2") && ran.logs.contains("below 350"),
        "the table names the node and why: {}",
        ran.logs
    );
}

#[test]
fn a_healthy_slurm_launch_passes_nccl_and_real_tcp_and_every_rank_exits_0() {
    let ran = launch(&Launch {
        ranks: 4,
        launcher: Launcher::Slurm,
        simulate: vec!["model=H100".into(); 4],
        flags: [
            "--nccl-min-bus-gbps",
            "350",
            "--tcp-streams",
            "2",
            "--tcp-duration",
            "1s",
        ]
        .map(String::from)
        .to_vec(),
    });
    assert_eq!(ran.codes, vec![Some(0); 4], "{}", ran.logs);
    let report = ran.report.expect("rank 0 wrote the report");
    assert_eq!(report["passed"], Value::Bool(true), "{report:#}");
    assert!(
        verdicts(&report).iter().all(|(_, v)| v == "Passed"),
        "{report:#}"
    );
    assert_eq!(
        report["rounds"].as_array().map(Vec::len),
        Some(1),
        "{report:#}"
    );
    let tcp_min = report["tcpMinGbps"].as_f64().expect("TCP measured");
    assert!(tcp_min > 0.0, "{report:#}");
    let bus = report["busGbps"].as_f64().expect("NCCL measured");
    assert!(bus >= 350.0, "{report:#}");
}

#[test]
fn an_agent_lost_mid_round_is_that_nodes_error_and_the_others_go_on() {
    let ran = torchrun_nccl(all_but_one(3, 1, "netfault=vanish"));
    assert_eq!(ran.codes, vec![Some(1), Some(86), Some(1)], "{}", ran.logs);
    let report = ran.report.expect("rank 0 wrote the report");
    let v = verdicts(&report);
    assert_eq!(
        v,
        vec![
            ("node-0".into(), "Passed".into()),
            ("node-1".into(), "Error".into()),
            ("node-2".into(), "Passed".into())
        ],
        "{report:#}"
    );
}
