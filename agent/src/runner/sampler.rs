//! The sampler thread: NVML telemetry and Xid events for every GPU the whole run, and the
//! topology re-read every so often so that a link that drops mid-run is caught.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use super::busy::BusyLog;
use super::processes::{Owner, Phase, Sightings};
use crate::backend::{GpuInfo, Platform, TelemetrySample, TopologySnapshot};
use crate::checks::topology;

/// Everything the sampler gathered.
#[derive(Default)]
pub struct Sampled {
    pub samples: HashMap<u32, Vec<TelemetrySample>>,
    pub xids: HashMap<u32, Vec<u64>>,
    /// Topology re-reads (besides the first reading).
    pub topology_samples: i32,
    pub link_changes: Vec<String>,
    /// Processes that were not the agent's, seen on a GPU during the checks.
    pub processes: Sightings,
}

/// What the sampler reads and how often.
pub struct Sampler<'a> {
    pub platform: &'a dyn Platform,
    pub gpus: &'a [GpuInfo],
    /// Telemetry every this long.
    pub every: Duration,
    /// Topology every this long, when there is a first reading to compare with.
    pub resample_every: Duration,
    pub first_topology: Option<&'a TopologySnapshot>,
    /// Whose processes on the GPUs are the agent's.
    pub owner: &'a Owner,
    /// Where the device-wide readings go (memory no listed process holds).
    pub busy: &'a Mutex<BusyLog>,
}

impl Sampler<'_> {
    /// Samples until `stop` is set; `started` dates the link changes (`+93s`).
    pub fn run(&self, out: &Mutex<Sampled>, stop: &AtomicBool, started: Instant) {
        let mut last_topo = Instant::now();
        let mut prev_snap = self.first_topology.cloned();
        while !stop.load(Ordering::Relaxed) {
            let tick = Instant::now();
            let samples: Vec<_> = self
                .gpus
                .iter()
                .filter_map(|g| self.platform.sample(g.index).ok().map(|s| (g.index, s)))
                .collect();
            let xids = self.platform.poll_xid(Duration::ZERO);
            let mut processes = Sightings::default();
            processes.read(self.platform, self.gpus, self.owner, Phase::During);
            let occupancy: Vec<_> = self
                .gpus
                .iter()
                .filter_map(|g| {
                    let occ = self.platform.occupancy(g.index, SystemTime::now());
                    occ.ok().map(|o| (g.index, o))
                })
                .collect();
            {
                let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
                for (gpu, occ) in &occupancy {
                    busy.observe(*gpu, "during the checks", occ);
                }
            }
            let mut changes = Vec::new();
            let mut resampled = false;
            if let Some(prev) = prev_snap.as_ref()
                && last_topo.elapsed() >= self.resample_every
            {
                last_topo = Instant::now();
                if let Ok(now) = self.platform.topology() {
                    changes = topology::link_changes(prev, &now, started.elapsed().as_secs_f64());
                    prev_snap = Some(now);
                    resampled = true;
                }
            }
            {
                let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                for (gpu, s) in samples {
                    o.samples.entry(gpu).or_default().push(s);
                }
                for x in xids {
                    o.xids.entry(x.gpu).or_default().push(x.xid);
                }
                o.link_changes.extend(changes);
                o.processes.merge(processes);
                if resampled {
                    o.topology_samples += 1;
                }
            }
            // Sleep in short steps so the end of the run is not delayed.
            while tick.elapsed() < self.every && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20).min(self.every));
            }
        }
    }
}
