//! Power and clocks during the burn and the pulse: the samples a thread takes beside the GEMMs
//! (each tagged with what the GPU was doing), and the rules on them. A GPU at its power cap
//! (`SwPowerCap`) is healthy under a burn; one that draws far below its enforced limit, or whose
//! clocks are held down by a hardware or thermal slowdown, is not.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use gpuval_crds::{ComputeCheck, PowerResult, PulseResult, ThrottleShare};

use crate::backend::PowerReading;
use crate::judge::{Code, Reason, Says, median, plural, round_to, to_i64};
use crate::profiles::ModelProfile;

/// Throttle reasons that mean clocks lost to hardware or thermal limits (not the power cap).
pub const SLOWDOWN_REASONS: [&str; 4] = gpuval_crds::depth::SLOWDOWN_THROTTLES;
/// Default of `maxSlowdownFraction`.
pub const DEFAULT_MAX_SLOWDOWN_FRACTION: f64 = 0.05;
/// How often power is sampled while the check runs.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// The most samples kept: past it every other one is dropped and only every second read after
/// is kept, so that a day-long burn keeps an even subsample (its median and shares unchanged)
/// in bounded memory. The pulse's extremes are taken over every read.
pub const MAX_KEPT: usize = 1 << 14;
/// A limit this much below the GPU's default is named (a Warn).
const LOWERED_LIMIT_SHARE: f64 = 0.99;

/// What the GPU is doing when a sample is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Setting up, checking results, between data types: not judged.
    #[default]
    Other,
    Burn,
    PulseLoad,
    PulseIdle,
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Phase::Burn,
            2 => Phase::PulseLoad,
            3 => Phase::PulseIdle,
            _ => Phase::Other,
        }
    }

    fn in_pulse(self) -> bool {
        matches!(self, Phase::PulseLoad | Phase::PulseIdle)
    }
}

/// The phase the GPU is in, set by the burn and read by the sampling thread.
#[derive(Debug, Default)]
pub struct PhaseCell(AtomicU8);

impl PhaseCell {
    pub fn set(&self, p: Phase) {
        self.0.store(p as u8, Ordering::Relaxed);
    }

    pub fn get(&self) -> Phase {
        Phase::from_u8(self.0.load(Ordering::Relaxed))
    }
}

/// One sample: the phase and what NVML read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PowerSample {
    pub phase: Phase,
    pub reading: PowerReading,
}

/// The power side of one GPU's compute check: its limits and the samples taken while it ran.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PowerOutcome {
    /// Enforced and default power limit, W.
    pub limit_w: Option<f64>,
    pub default_limit_w: Option<f64>,
    /// The samples kept (every one, or an even subsample of a long run: see [`MAX_KEPT`]).
    pub samples: Vec<PowerSample>,
    /// Lowest and highest power read during the pulse (the instantaneous reading where there
    /// is one), over every read.
    pub pulse_range: Option<(f64, f64)>,
}

impl PowerOutcome {
    /// Widens the pulse's range by one reading.
    pub fn see_pulse(&mut self, r: &PowerReading) {
        if let Some(w) = r.instant_w.or(r.average_w).filter(|w| w.is_finite()) {
            let (lo, hi) = self.pulse_range.unwrap_or((w, w));
            self.pulse_range = Some((lo.min(w), hi.max(w)));
        }
    }
}

/// Samples `read` every `every` until `done` says the check is over (a message or the sender
/// dropped), tagging each sample with the phase at that moment; nothing is read in `Other`.
/// Keeps at most [`MAX_KEPT`] samples (an even subsample past that).
pub fn watch(
    every: Duration,
    phase: &PhaseCell,
    read: impl Fn() -> Option<PowerReading>,
    done: &Receiver<()>,
) -> PowerOutcome {
    let mut out = PowerOutcome::default();
    let (mut reads, mut stride) = (0u64, 1u64);
    loop {
        let now = phase.get();
        if now != Phase::Other
            && let Some(reading) = read()
        {
            if now.in_pulse() {
                out.see_pulse(&reading);
            }
            if reads.is_multiple_of(stride) {
                out.samples.push(PowerSample {
                    phase: now,
                    reading,
                });
                if out.samples.len() >= MAX_KEPT {
                    halve(&mut out.samples);
                    stride *= 2;
                }
            }
            reads += 1;
        }
        match done.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return out,
        }
    }
}

/// Keeps the samples at even positions.
fn halve(samples: &mut Vec<PowerSample>) {
    let mut i = 0;
    samples.retain(|_| {
        i += 1;
        i % 2 == 1
    });
}

/// The power figures of the burn and the rules on them: the median draw against the enforced
/// limit (spec `minPowerFraction`, else the model profile's), a limit set below the GPU's
/// default, and the share of samples slowed by hardware or thermal limits (spec
/// `maxSlowdownFraction`). None when no sample was taken during the burn.
pub fn judge_power(
    gpu: u32,
    out: &PowerOutcome,
    spec: &ComputeCheck,
    profile: Option<&ModelProfile>,
    found: &mut Vec<Reason>,
) -> Option<PowerResult> {
    let burn: Vec<&PowerSample> = out
        .samples
        .iter()
        .filter(|s| s.phase == Phase::Burn)
        .collect();
    if burn.is_empty() {
        return None;
    }
    let watts: Vec<f64> = burn.iter().filter_map(|s| s.reading.average_w).collect();
    let median_w = median(watts.clone()).unwrap_or(0.0);
    let max_w = watts.iter().copied().fold(0.0, f64::max);
    let fraction = out
        .limit_w
        .filter(|l| *l > 0.0 && !watts.is_empty())
        .map(|l| median_w / l);
    let floor = match spec.min_power_fraction {
        Some(f) => Some((f, "spec minPowerFraction".to_string())),
        None => profile.map(|p| (p.power_min_fraction, format!("{} profile", p.name))),
    };
    if let (Some(share), Some((floor, source)), Some(limit)) = (fraction, &floor, out.limit_w)
        && share < *floor
    {
        found.push(Code::PowerBelowTarget.says(format!(
            "GPU{gpu} power: the burn drew a median {median_w:.0} W, {:.0}% of its {limit:.0} W limit, below {:.0}% ({source})",
            100.0 * share,
            100.0 * floor
        )));
    }
    if let (Some(limit), Some(default)) = (out.limit_w, out.default_limit_w)
        && limit < LOWERED_LIMIT_SHARE * default
    {
        found.push(Code::PowerLimitLowered.says(format!(
            "GPU{gpu} power: limit set to {limit:.0} W, below the GPU's default {default:.0} W"
        )));
    }
    let judged: Vec<&PowerSample> = out
        .samples
        .iter()
        .filter(|s| s.phase != Phase::Other)
        .collect();
    let (throttle, slowed) = throttle_shares(&judged);
    let slowdown_fraction = slowed as f64 / judged.len().max(1) as f64;
    found.extend(slowdown_reason(gpu, &judged, slowed, spec));
    Some(PowerResult {
        limit_w: out.limit_w,
        default_limit_w: out.default_limit_w,
        samples: to_i64(burn.len() as u64),
        median_w: round_to(median_w, 1),
        max_w: round_to(max_w, 1),
        fraction: fraction.map(|f| round_to(f, 3)),
        min_fraction: floor.map(|(f, _)| f),
        throttle,
        slowdown_fraction: round_to(slowdown_fraction, 4),
    })
}

/// Each throttle reason's share of the samples, and how many samples had any slowdown reason.
fn throttle_shares(samples: &[&PowerSample]) -> (Vec<ThrottleShare>, usize) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut slowed = 0;
    for s in samples {
        for r in &s.reading.throttle {
            *counts.entry(r.as_str()).or_default() += 1;
        }
        if s.reading
            .throttle
            .iter()
            .any(|r| SLOWDOWN_REASONS.contains(&r.as_str()))
        {
            slowed += 1;
        }
    }
    let n = samples.len().max(1) as f64;
    let shares = counts
        .into_iter()
        .map(|(reason, c)| ThrottleShare {
            reason: reason.to_string(),
            fraction: round_to(c as f64 / n, 4),
        })
        .collect();
    (shares, slowed)
}

/// A Fail when more than the allowed share of samples (and more than one: one noisy sample never
/// fails a GPU) had clocks slowed by hardware or thermal limits.
fn slowdown_reason(
    gpu: u32,
    samples: &[&PowerSample],
    slowed: usize,
    spec: &ComputeCheck,
) -> Option<Reason> {
    let allowed = spec
        .max_slowdown_fraction
        .unwrap_or(DEFAULT_MAX_SLOWDOWN_FRACTION);
    let share = slowed as f64 / samples.len().max(1) as f64;
    if slowed < 2 || share <= allowed {
        return None;
    }
    let mut seen: Vec<&str> = Vec::new();
    for s in samples {
        for r in &s.reading.throttle {
            if SLOWDOWN_REASONS.contains(&r.as_str()) && !seen.contains(&r.as_str()) {
                seen.push(r);
            }
        }
    }
    seen.sort_by_key(|r| SLOWDOWN_REASONS.iter().position(|k| k == r));
    Some(Code::BurnClocksSlowed.says(format!(
        "GPU{gpu}: clocks slowed by {} in {slowed} of {} sample{} of the burn ({:.0}%, more than {:.0}%)",
        seen.join(", "),
        samples.len(),
        plural(samples.len()),
        100.0 * share,
        100.0 * allowed
    )))
}

/// What the pulse measured on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PulseOutcome {
    pub period_seconds: f64,
    pub seconds: f64,
    pub cycles: u64,
    /// Result slots compared with the first after each load phase, elements beyond tolerance,
    /// and the largest relative error (the CPU reference check at the end counts too).
    pub comparisons: u64,
    pub mismatches: u64,
    pub max_rel_error: f64,
}

/// The pulse's figures (the power swing from the readings taken during it) and its rule: the
/// GPU must still compute correctly.
pub fn judge_pulse(
    gpu: u32,
    pulse: &PulseOutcome,
    power: &PowerOutcome,
    found: &mut Vec<Reason>,
) -> PulseResult {
    let (min_w, max_w) = (
        power.pulse_range.map(|r| r.0),
        power.pulse_range.map(|r| r.1),
    );
    if pulse.mismatches > 0 {
        found.push(Code::PulseMismatch.says(format!(
            "GPU{gpu} pulse: {} mismatched element{} in {} result comparisons after {} load-and-idle cycle{} (max relative error {:.2e})",
            pulse.mismatches,
            plural(pulse.mismatches),
            pulse.comparisons,
            pulse.cycles,
            plural(pulse.cycles),
            pulse.max_rel_error
        )));
    }
    PulseResult {
        period_seconds: pulse.period_seconds,
        seconds: round_to(pulse.seconds, 2),
        cycles: to_i64(pulse.cycles),
        min_w: min_w.map(|w| round_to(w, 1)),
        max_w: max_w.map(|w| round_to(w, 1)),
        swing_w: min_w.zip(max_w).map(|(lo, hi)| round_to(hi - lo, 1)),
        comparisons: to_i64(pulse.comparisons),
        mismatches: to_i64(pulse.mismatches),
    }
}

/// The start of the first pulse cycle at or after `since_epoch`: cycles of every GPU start on
/// the same multiples of the period from one epoch, so that the GPUs of a node swing together.
pub fn next_cycle_start(since_epoch: Duration, period: Duration) -> Duration {
    if period.is_zero() {
        return since_epoch;
    }
    let p = period.as_nanos();
    let cycles = since_epoch.as_nanos().div_ceil(p);
    let nanos = u64::try_from(cycles.saturating_mul(p)).unwrap_or(u64::MAX);
    Duration::from_nanos(nanos)
}
