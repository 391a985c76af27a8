//! Turns the telemetry samples and error counters of one GPU's run into a
//! [`TelemetrySummary`].

use std::collections::{BTreeMap, BTreeSet};

use gpuval_crds::xid::XidSeen;
use gpuval_crds::{Stat, TelemetrySummary};

use crate::backend::{ErrorCounters, TelemetrySample};

/// Summarises one GPU's run: min/mean/max per sampled field (None where no sample has it),
/// every throttle reason seen (sorted), ECC counter deltas (None where either reading is
/// unknown) and the Xid codes seen, each also with its meaning from NVIDIA's catalogue.
pub fn summarize(
    samples: &[TelemetrySample],
    before: Option<ErrorCounters>,
    after: Option<ErrorCounters>,
    xids: &[u64],
) -> TelemetrySummary {
    let reasons: BTreeSet<&str> = samples
        .iter()
        .flat_map(|s| s.throttle_reasons.iter().map(String::as_str))
        .collect();
    TelemetrySummary {
        samples: to_i64(samples.len() as u64),
        sm_clock_mhz: stat(samples.iter().filter_map(|s| s.sm_clock_mhz)),
        memory_clock_mhz: stat(samples.iter().filter_map(|s| s.memory_clock_mhz)),
        temperature_c: stat(samples.iter().filter_map(|s| s.temperature_c)),
        power_w: stat(samples.iter().filter_map(|s| s.power_w)),
        throttle_reasons: reasons.into_iter().map(str::to_owned).collect(),
        ecc_corrected_delta: delta(before, after, |c| c.ecc_corrected),
        ecc_uncorrected_delta: delta(before, after, |c| c.ecc_uncorrected),
        xid_events: xids.iter().map(|&x| to_i64(x)).collect(),
        xids: xids_seen(xids),
    }
}

/// Each distinct Xid (in order of the code) with how often it came and its catalogue entry.
fn xids_seen(xids: &[u64]) -> Vec<XidSeen> {
    let mut counts: BTreeMap<i64, i64> = BTreeMap::new();
    for x in xids {
        *counts.entry(to_i64(*x)).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(xid, count)| XidSeen::new(xid, count))
        .collect()
}

/// Min, mean and max of the values; None when there are none. Non-finite values are ignored.
pub fn stat(values: impl Iterator<Item = f64>) -> Option<Stat> {
    let mut n = 0u64;
    let (mut min, mut max, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    for v in values.filter(|v| v.is_finite()) {
        n += 1;
        min = min.min(v);
        max = max.max(v);
        sum += v;
    }
    (n > 0).then(|| Stat {
        min,
        mean: sum / n as f64,
        max,
    })
}

fn delta(
    before: Option<ErrorCounters>,
    after: Option<ErrorCounters>,
    field: impl Fn(&ErrorCounters) -> Option<u64>,
) -> Option<i64> {
    let b = field(&before?)?;
    let a = field(&after?)?;
    Some(to_i64(a.saturating_sub(b)))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sm: Option<f64>, temp: f64, reasons: &[&str]) -> TelemetrySample {
        TelemetrySample {
            sm_clock_mhz: sm,
            memory_clock_mhz: None,
            temperature_c: Some(temp),
            power_w: Some(temp * 10.0),
            throttle_reasons: reasons.iter().map(|r| r.to_string()).collect(),
        }
    }

    fn counters(c: u64, u: Option<u64>) -> ErrorCounters {
        ErrorCounters {
            ecc_corrected: Some(c),
            ecc_uncorrected: u,
        }
    }

    #[test]
    fn stats_over_samples_that_have_the_field() {
        let s = [
            sample(Some(1800.0), 40.0, &["SwPowerCap"]),
            sample(None, 50.0, &[]),
            sample(Some(1700.0), 60.0, &["HwSlowdown", "SwPowerCap"]),
        ];
        let t = summarize(&s, None, None, &[]);
        assert_eq!(t.samples, 3);
        assert_eq!(
            t.sm_clock_mhz,
            Some(Stat {
                min: 1700.0,
                mean: 1750.0,
                max: 1800.0
            })
        );
        assert_eq!(
            t.temperature_c,
            Some(Stat {
                min: 40.0,
                mean: 50.0,
                max: 60.0
            })
        );
        assert_eq!(t.memory_clock_mhz, None);
        assert_eq!(t.throttle_reasons, vec!["HwSlowdown", "SwPowerCap"]);
    }

    #[test]
    fn no_samples_gives_no_stats() {
        let t = summarize(&[], None, None, &[]);
        assert_eq!(t.samples, 0);
        assert!(t.sm_clock_mhz.is_none() && t.power_w.is_none());
        assert!(t.throttle_reasons.is_empty());
    }

    #[test]
    fn ecc_deltas_saturate_and_need_both_sides() {
        let t = summarize(
            &[],
            Some(counters(5, Some(1))),
            Some(counters(9, Some(3))),
            &[79],
        );
        assert_eq!(t.ecc_corrected_delta, Some(4));
        assert_eq!(t.ecc_uncorrected_delta, Some(2));
        assert_eq!(t.xid_events, vec![79]);

        let t = summarize(
            &[],
            Some(counters(9, None)),
            Some(counters(5, Some(3))),
            &[],
        );
        assert_eq!(t.ecc_corrected_delta, Some(0));
        assert_eq!(t.ecc_uncorrected_delta, None);

        let t = summarize(&[], None, Some(counters(5, Some(3))), &[]);
        assert_eq!(t.ecc_corrected_delta, None);
    }

    #[test]
    fn every_xid_is_mapped_to_its_meaning_once_with_a_count() {
        let t = summarize(&[], None, None, &[79, 13, 79, 999]);
        assert_eq!(t.xid_events, vec![79, 13, 79, 999]);
        let seen: Vec<(i64, i64, bool, Option<&str>)> = t
            .xids
            .iter()
            .map(|x| (x.xid, x.count, x.fatal, x.name.as_deref()))
            .collect();
        assert_eq!(
            seen,
            vec![
                (13, 1, false, Some("ROBUST_CHANNEL_GR_EXCEPTION")),
                (
                    79,
                    2,
                    true,
                    Some("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
                ),
                (999, 1, false, None),
            ]
        );
    }
}
