//! How `gpuval-agent fabric` was launched outside Kubernetes: by Slurm (`srun`: `SLURM_PROCID`,
//! `SLURM_NTASKS`, `SLURM_NODELIST`, whose first host coordinates) or torchrun-style (`RANK`,
//! `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`). Slurm wins when both are present.

/// The port rank 0 listens on under Slurm when none is given.
pub const DEFAULT_PORT: u16 = 29400;

/// Which launcher set the variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    Slurm,
    Torchrun,
}

/// This process's place in the launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub launcher: Launcher,
    pub rank: usize,
    pub world_size: usize,
    /// Where rank 0 listens: host name or address.
    pub coordinator: String,
    pub port: u16,
}

impl Launch {
    /// `host:port` of rank 0's control port.
    pub fn coordinator_addr(&self) -> String {
        if self.coordinator.contains(':') && !self.coordinator.starts_with('[') {
            format!("[{}]:{}", self.coordinator, self.port)
        } else {
            format!("{}:{}", self.coordinator, self.port)
        }
    }
}

/// A launch that cannot be used: the variable and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "not launched by Slurm or torchrun: set SLURM_PROCID, SLURM_NTASKS and SLURM_NODELIST \
         (srun sets them), or RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
    )]
    NoLauncher,
    #[error("{launcher} launch: {var} is not set")]
    Missing { launcher: &'static str, var: String },
    #[error("{launcher} launch: {var}={value:?} {why}")]
    Malformed {
        launcher: &'static str,
        var: String,
        value: String,
        why: String,
    },
}

/// Detects the launch from the variables `get` gives (`std::env::var` in the binary);
/// `port` is the `--port` flag or `GPUVAL_FABRIC_PORT`, used under Slurm (torchrun names its
/// own port).
pub fn detect(
    get: &dyn Fn(&str) -> Option<String>,
    port: Option<u16>,
) -> Result<Launch, LaunchError> {
    if get("SLURM_PROCID").is_some() {
        slurm(get, port)
    } else if get("RANK").is_some() || get("MASTER_ADDR").is_some() {
        torchrun(get)
    } else {
        Err(LaunchError::NoLauncher)
    }
}

fn var(
    get: &dyn Fn(&str) -> Option<String>,
    launcher: &'static str,
    name: &str,
) -> Result<String, LaunchError> {
    get(name)
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| LaunchError::Missing {
            launcher,
            var: name.into(),
        })
}

fn number<T: std::str::FromStr>(
    get: &dyn Fn(&str) -> Option<String>,
    launcher: &'static str,
    name: &str,
) -> Result<T, LaunchError> {
    let value = var(get, launcher, name)?;
    value.trim().parse().map_err(|_| LaunchError::Malformed {
        launcher,
        var: name.into(),
        value: value.clone(),
        why: "is not a number in range".into(),
    })
}

fn check_rank(
    launcher: &'static str,
    rank_var: &str,
    rank: usize,
    world_size: usize,
) -> Result<(), LaunchError> {
    if world_size == 0 || rank >= world_size {
        return Err(LaunchError::Malformed {
            launcher,
            var: rank_var.into(),
            value: rank.to_string(),
            why: format!("is not a rank of a launch of {world_size} processes"),
        });
    }
    Ok(())
}

fn slurm(get: &dyn Fn(&str) -> Option<String>, port: Option<u16>) -> Result<Launch, LaunchError> {
    const L: &str = "Slurm";
    let rank: usize = number(get, L, "SLURM_PROCID")?;
    let world_size: usize = number(get, L, "SLURM_NTASKS")?;
    check_rank(L, "SLURM_PROCID", rank, world_size)?;
    let (name, list) = match (get("SLURM_NODELIST"), get("SLURM_JOB_NODELIST")) {
        (Some(v), _) => ("SLURM_NODELIST", v),
        (None, Some(v)) => ("SLURM_JOB_NODELIST", v),
        (None, None) => ("SLURM_NODELIST", var(get, L, "SLURM_NODELIST")?),
    };
    let hosts = expand_nodelist(&list).map_err(|why| LaunchError::Malformed {
        launcher: L,
        var: name.into(),
        value: list.clone(),
        why,
    })?;
    let coordinator = hosts
        .into_iter()
        .next()
        .ok_or_else(|| LaunchError::Malformed {
            launcher: L,
            var: name.into(),
            value: list.clone(),
            why: "names no host".into(),
        })?;
    Ok(Launch {
        launcher: Launcher::Slurm,
        rank,
        world_size,
        coordinator,
        port: port.unwrap_or(DEFAULT_PORT),
    })
}

fn torchrun(get: &dyn Fn(&str) -> Option<String>) -> Result<Launch, LaunchError> {
    const L: &str = "torchrun";
    let rank: usize = number(get, L, "RANK")?;
    let world_size: usize = number(get, L, "WORLD_SIZE")?;
    check_rank(L, "RANK", rank, world_size)?;
    let coordinator = var(get, L, "MASTER_ADDR")?.trim().to_string();
    let port: u16 = number(get, L, "MASTER_PORT")?;
    Ok(Launch {
        launcher: Launcher::Torchrun,
        rank,
        world_size,
        coordinator,
        port,
    })
}

/// Expands Slurm's compressed host list (`gpu[01-04,07],login1` → gpu01 … gpu04, gpu07,
/// login1; several bracket groups in one name multiply out).
pub fn expand_nodelist(list: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for item in split_top(list)? {
        if item.is_empty() {
            continue;
        }
        hosts.extend(expand_item(&item)?);
    }
    Ok(hosts)
}

/// Splits on commas outside brackets.
fn split_top(list: &str) -> Result<Vec<String>, String> {
    let mut items = vec![String::new()];
    let mut depth = 0;
    for c in list.trim().chars() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("has nested brackets".into()),
            ']' if depth == 1 => depth = 0,
            ']' => return Err("has a ']' without its '['".into()),
            ',' if depth == 0 => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        if let Some(last) = items.last_mut() {
            last.push(c);
        }
    }
    if depth != 0 {
        return Err("has a '[' without its ']'".into());
    }
    Ok(items.into_iter().map(|s| s.trim().to_string()).collect())
}

fn expand_item(item: &str) -> Result<Vec<String>, String> {
    let Some(open) = item.find('[') else {
        return Ok(vec![item.to_string()]);
    };
    let close = item[open..]
        .find(']')
        .map(|i| open + i)
        .ok_or_else(|| format!("{item:?} has a '[' without its ']'"))?;
    let prefix = &item[..open];
    let rest = expand_item(&item[close + 1..])?;
    let mut out = Vec::new();
    for n in expand_ranges(&item[open + 1..close])? {
        for r in &rest {
            out.push(format!("{prefix}{n}{r}"));
        }
    }
    Ok(out)
}

/// `01-04,07` → 01, 02, 03, 04, 07 (zero padding kept).
fn expand_ranges(ranges: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in ranges.split(',') {
        let part = part.trim();
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let bad = || format!("{part:?} is not a number or a range like 01-04");
        if lo.is_empty() || !lo.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let a: u64 = lo.parse().map_err(|_| bad())?;
        let b: u64 = hi.parse().map_err(|_| bad())?;
        if b < a || b - a > 100_000 {
            return Err(format!("{part:?} is not an increasing range"));
        }
        let width = lo.len();
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn nodelists_expand_like_slurm() {
        let cases: [(&str, &[&str]); 4] = [
            (
                "gpu[01-04,07],login1",
                &["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"],
            ),
            ("r[1-2]-n[8-9]", &["r1-n8", "r1-n9", "r2-n8", "r2-n9"]),
            (
                "node[098-101]",
                &["node098", "node099", "node100", "node101"],
            ),
            ("solo", &["solo"]),
        ];
        for (list, hosts) in cases {
            let want: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
            assert_eq!(expand_nodelist(list).ok(), Some(want), "{list}");
        }
        for bad in ["gpu[01-04", "gpu[04-01]", "gpu[a-b]"] {
            assert!(expand_nodelist(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn slurm_is_detected_and_its_first_host_coordinates() {
        let get = env(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "5"),
            ("SLURM_NODELIST", "gpu[01-04,07],login1"),
            ("RANK", "9"),
        ]);
        let l = detect(&get, None).expect("a Slurm launch");
        assert_eq!(l.launcher, Launcher::Slurm);
        assert_eq!((l.rank, l.world_size), (2, 5));
        assert_eq!(l.coordinator_addr(), "gpu01:29400");
        let l = detect(&get, Some(31000)).expect("a Slurm launch");
        assert_eq!(l.port, 31000);
    }

    #[test]
    fn torchrun_is_detected() {
        let get = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.5"),
            ("MASTER_PORT", "29500"),
        ]);
        let l = detect(&get, Some(1)).expect("a torchrun launch");
        assert_eq!(l.launcher, Launcher::Torchrun);
        assert_eq!((l.rank, l.world_size, l.port), (0, 4, 29500));
        assert_eq!(l.coordinator_addr(), "10.0.0.5:29500");
    }

    #[test]
    fn errors_name_the_variable() {
        let e = detect(&env(&[]), None).expect_err("no launcher");
        assert_eq!(e, LaunchError::NoLauncher);
        let cases: [(&[(&str, &str)], &str); 4] = [
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2")],
                "MASTER_ADDR is not set",
            ),
            (
                &[
                    ("RANK", "x"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "a"),
                    ("MASTER_PORT", "1"),
                ],
                "RANK=\"x\"",
            ),
            (
                &[
                    ("SLURM_PROCID", "3"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_NODELIST", "a"),
                ],
                "SLURM_PROCID",
            ),
            (
                &[
                    ("SLURM_PROCID", "0"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_NODELIST", "gpu[1-"),
                ],
                "SLURM_NODELIST",
            ),
        ];
        for (vars, names) in cases {
            let e = detect(&env(vars), None).expect_err(names);
            assert!(e.to_string().contains(names), "{vars:?}: {e}");
        }
    }
}
