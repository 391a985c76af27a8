//! The topology check: the `nvidia-smi topo -m` matrix with CPU and NUMA affinity derived from
//! NVML readings, NVLink link states, re-read by the runner's sampler during the run so that a
//! link that drops mid-run is caught.

mod judge;
mod matrix;
pub mod row;

crate::check_result!(gpuval_crds::TopologyReport);

pub use matrix::{
    SmiTopology, TopologyParseError, compare, derive, link_changes, parse_nvidia_smi, render,
};

use gpuval_crds::{NodeReport, TopologyCheck};

use crate::backend::TopologySnapshot;
use crate::check::{JudgeNode, Measurement, NodeCheck, OnNode};
use crate::judge::Judge;

/// The topology check as its spec asks for it.
pub struct Topology {
    pub spec: TopologyCheck,
}

impl Topology {
    pub fn from_spec(spec: &TopologyCheck) -> Self {
        Self { spec: spec.clone() }
    }

    /// How often the sampler re-reads the topology (default 30 s).
    pub fn resample_every(&self) -> std::time::Duration {
        self.spec
            .resample_interval
            .map(|d| d.as_std())
            .unwrap_or(std::time::Duration::from_secs(30))
    }
}

/// The readings at the start, and what the re-reads during the run found.
#[derive(Debug, Clone)]
pub struct TopologyMeasured {
    pub snapshot: TopologySnapshot,
    /// Re-reads during the run (besides the first reading).
    pub resamples: i32,
    /// Link state changes the re-reads found (`GPU2 NVLink 4 went down at +93s`).
    pub link_changes: Vec<String>,
}

impl NodeCheck for Topology {
    const NAME: &'static str = "topology";
    type Outcome = TopologyMeasured;

    /// The first reading, taken before any other check loads the GPUs.
    fn measure(&self, on: &OnNode<'_>) -> Measurement<TopologyMeasured> {
        Ok(TopologyMeasured {
            snapshot: on.backend.platform().topology()?,
            resamples: 0,
            link_changes: Vec::new(),
        })
    }

    fn judge(
        &self,
        on: &JudgeNode<'_>,
        measured: Measurement<TopologyMeasured>,
        into: &mut NodeReport,
    ) {
        into.topology = Some(match measured {
            Ok(m) => {
                let mut t = derive(&m.snapshot);
                t.samples = 1 + m.resamples;
                t.link_changes = m.link_changes;
                on.judge.topology(on.gpus, t)
            }
            Err(e) => Judge::errored(&e),
        });
    }
}

/// The table line: `topology: Pass (NVLink active/total per GPU: 18/18 18/18)`.
pub fn section(report: &NodeReport) -> String {
    match &report.topology {
        None => "topology: not checked\n".to_string(),
        Some(t) => {
            let links: Vec<String> = t
                .nvlinks
                .iter()
                .map(|l| format!("{}/{}", l.active, l.total))
                .collect();
            let mut line = format!("topology: {}", t.verdict);
            if !links.is_empty() {
                line.push_str(&format!(
                    " (NVLink active/total per GPU: {})",
                    links.join(" ")
                ));
            }
            line.push('\n');
            line
        }
    }
}
