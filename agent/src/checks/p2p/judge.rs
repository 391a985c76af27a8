//! Judging the peer-to-peer pairs: a pair under its threshold is named (`GPU1->GPU3
//! unidirectional 120 GB/s < 320 GB/s (H200 profile)`), and a pair far below the other pairs
//! fails even without a profile.

use gpuval_crds::{BandwidthFloor, P2pCheck, P2pPair, P2pResult, Verdict};

use super::{LinkErrorMoves, P2pOutcome, PairOutcome};
use crate::backend::GpuInfo;
use crate::judge::{
    Code, Judge, Reason, Says, below_peers_named, outliers, plural, push_unique, round_to,
    verdict_of,
};
use crate::link_floors::{Floor, LinkFacts};
use crate::profiles::ModelProfile;

impl Judge<'_> {
    /// Judges every pair: errors, corrupted data, floors (spec, else the model profile where
    /// the profile expects NVLink between peers), latency ceiling, the relative rule among
    /// pairs, and NVLink error counters that moved.
    pub fn p2p(
        &self,
        gpus: &[GpuInfo],
        out: &P2pOutcome,
        spec: &P2pCheck,
        links: &LinkErrorMoves,
        facts: &LinkFacts,
    ) -> P2pResult {
        let profile = self.link_profile(gpus);
        let mut pairs: Vec<P2pPair> = out.pairs.iter().map(pair_result).collect();
        let mut floors: Vec<BandwidthFloor> = Vec::new();
        // Each pair's reasons, kept apart until they join the check's, pair by pair.
        let mut pair_reasons: Vec<Vec<Reason>> = Vec::with_capacity(pairs.len());
        for (pair, measured) in pairs.iter_mut().zip(&out.pairs) {
            let pair_floors = pair_floors(measured, spec, profile, facts);
            for f in &pair_floors {
                if !floors.contains(f) {
                    floors.push(f.clone());
                }
            }
            let reasons = self.pair_reasons(measured, spec, profile, &pair_floors);
            pair.verdict = if measured.error.is_some() {
                Verdict::Error
            } else {
                verdict_of(&reasons)
            };
            let error = measured
                .error
                .as_ref()
                .map(|e| Code::P2pPairError.says(format!("{}: {e}", pair_name(measured))));
            pair_reasons.push(error.into_iter().chain(reasons).collect());
        }
        let tolerance = self.tolerance();
        for (what, value) in [
            ("unidirectional", uni as fn(&P2pPair) -> Option<f64>),
            ("bidirectional", bidi),
        ] {
            let values: Vec<Option<f64>> = pairs.iter().map(value).collect();
            for (i, v, median) in outliers(&values, tolerance) {
                let name = format!("GPU{}->GPU{}", pairs[i].src, pairs[i].dst);
                let why = below_peers_named(&name, what, v, "GB/s", median, "the other pairs");
                pairs[i].verdict = pairs[i].verdict.max(Verdict::Fail);
                push_unique(&mut pair_reasons[i], [Code::P2pSlow.says(why)]);
            }
        }

        let mut result = P2pResult {
            buffer_mib: spec.buffer_mib,
            iterations: spec.iterations,
            seconds: out.seconds,
            nvlink_errors: links.notes.clone(),
            floors,
            ..Default::default()
        };
        let mut verdict = pairs
            .iter()
            .map(|p| p.verdict)
            .fold(Verdict::Pass, Verdict::max);
        let mut reasons: Vec<Reason> = pair_reasons.into_iter().flatten().collect();
        for (lines, level, code) in [
            (&links.failures, Verdict::Fail, Code::NvlinkRecovery),
            (&links.warnings, Verdict::Warn, Code::NvlinkErrors),
        ] {
            if !lines.is_empty() {
                verdict = verdict.max(level);
                reasons.extend(lines.iter().map(|m| code.says(m.clone())));
            }
        }
        if gpus.len() < 2 {
            verdict = Verdict::Skipped;
            reasons.push(Code::NotApplicable.says("fewer than two GPUs: no pairs to test"));
        }
        result.verdict = verdict;
        push_unique(&mut result.reasons, reasons);
        result.pairs = pairs;
        result
    }

    /// The profile whose link floors apply: only with two or more GPUs, and only when every
    /// GPU has the same profile and that profile expects NVLink between peers.
    fn link_profile(&self, gpus: &[GpuInfo]) -> Option<&'static ModelProfile> {
        if gpus.len() < 2 {
            return None;
        }
        let first = self.profile_of(&gpus.first()?.name)?;
        gpus.iter()
            .all(|g| {
                self.profile_of(&g.name)
                    .is_some_and(|p| p.name == first.name)
            })
            .then_some(first)
            .filter(|p| p.require_nvlink)
    }

    fn pair_reasons(
        &self,
        p: &PairOutcome,
        spec: &P2pCheck,
        profile: Option<&ModelProfile>,
        floors: &[BandwidthFloor],
    ) -> Vec<Reason> {
        if p.error.is_some() && p.unidirectional_gbps <= 0.0 {
            return Vec::new();
        }
        let name = pair_name(p);
        let mut reasons = Vec::new();
        if p.mismatches > 0 {
            reasons.push(Code::P2pMismatch.says(format!(
                "{name}: {} word{} arrived corrupted",
                p.mismatches,
                plural(p.mismatches)
            )));
        }
        if !p.peer_access && profile.is_some() {
            reasons.push(Code::P2pNoPeerAccess.says(format!(
                "{name}: peer access is not available (copies go through host memory)"
            )));
        }
        for f in floors {
            let v = if f.what == UNI {
                p.unidirectional_gbps
            } else {
                p.bidirectional_gbps
            };
            if v < f.gbps {
                reasons.push(Code::P2pSlow.says(format!(
                    "{name} {} {v:.0} GB/s < {:.0} GB/s ({})",
                    f.what, f.gbps, f.source
                )));
            }
        }
        if let Some(max) = spec.max_latency_micros
            && p.copy_latency_us > f64::from(max)
        {
            reasons.push(Code::P2pLatencyHigh.says(format!(
                "{name} copy latency {:.1} µs > {max} µs (spec maxLatencyMicros)",
                p.copy_latency_us
            )));
        }
        reasons
    }
}

const UNI: &str = "unidirectional";
const BIDI: &str = "bidirectional";

/// The floors a pair is held to, one way and both ways: the spec's, else the model profile's
/// (where it expects NVLink between peers), else what the node's links are (NVLink generation
/// and active links, or PCIe generation and width, as NVML reports them).
fn pair_floors(
    p: &PairOutcome,
    spec: &P2pCheck,
    profile: Option<&ModelProfile>,
    facts: &LinkFacts,
) -> Vec<BandwidthFloor> {
    let from_facts = facts.p2p_floors(p.src, p.dst);
    let pick = |explicit: Option<i32>,
                from_profile: Option<f64>,
                from_facts: Option<&Floor>|
     -> Option<(f64, String)> {
        match (explicit, from_profile.zip(profile)) {
            (Some(v), _) => Some((f64::from(v), "spec".to_string())),
            (None, Some((v, prof))) => Some((v, format!("{} profile", prof.name))),
            (None, None) => from_facts.map(|f| (f.gbps, f.source.clone())),
        }
    };
    let uni = pick(
        spec.min_unidirectional_gbps,
        profile.map(|p| p.p2p_unidirectional_min_gbps),
        from_facts.as_ref().map(|f| &f.0),
    );
    let bidi = pick(
        spec.min_bidirectional_gbps,
        profile.map(|p| p.p2p_bidirectional_min_gbps),
        from_facts.as_ref().map(|f| &f.1),
    );
    [(UNI, uni), (BIDI, bidi)]
        .into_iter()
        .filter_map(|(what, f)| {
            f.map(|(gbps, source)| BandwidthFloor {
                what: what.into(),
                gbps,
                source,
            })
        })
        .collect()
}

/// A pair's report entry, not yet judged.
fn pair_result(p: &PairOutcome) -> P2pPair {
    P2pPair {
        src: i32::try_from(p.src).unwrap_or(i32::MAX),
        dst: i32::try_from(p.dst).unwrap_or(i32::MAX),
        verdict: Verdict::Pass,
        peer_access: p.peer_access,
        unidirectional_gbps: round_to(p.unidirectional_gbps, 2),
        bidirectional_gbps: round_to(p.bidirectional_gbps, 2),
        copy_latency_micros: round_to(p.copy_latency_us, 2),
        load_latency_nanos: p.load_latency_ns.map(|v| round_to(v, 2)),
        staged_unidirectional_gbps: p.staged_unidirectional_gbps.map(|v| round_to(v, 2)),
        staged_bidirectional_gbps: p.staged_bidirectional_gbps.map(|v| round_to(v, 2)),
        mismatches: i64::try_from(p.mismatches).unwrap_or(i64::MAX),
        error: p.error.clone(),
    }
}

fn pair_name(p: &PairOutcome) -> String {
    format!("GPU{}->GPU{}", p.src, p.dst)
}

fn uni(p: &P2pPair) -> Option<f64> {
    has_rates(p).then_some(p.unidirectional_gbps)
}

fn bidi(p: &P2pPair) -> Option<f64> {
    has_rates(p).then_some(p.bidirectional_gbps)
}

fn has_rates(p: &P2pPair) -> bool {
    p.error.is_none() && p.unidirectional_gbps > 0.0
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use gpuval_crds::{Checks, Profile, Thresholds};

    use super::*;
    use crate::backend::sim::{SimBackend, SimSpec};
    use crate::backend::{Backend, LinkErrors};
    use crate::runner::{self, Plan};
    use gpuval_crds::{HostTransferCheck, Verdict};

    /// The p2p judgement with default settings and no link-error moves.
    fn with_defaults(j: Judge<'_>, gpus: &[GpuInfo], out: &P2pOutcome) -> P2pResult {
        j.p2p(
            gpus,
            out,
            &P2pCheck::default(),
            &LinkErrorMoves::default(),
            &LinkFacts::default(),
        )
    }

    fn gpu(index: u32) -> GpuInfo {
        crate::judge::testing::h200(index)
    }

    fn pair(src: u32, dst: u32, uni: f64) -> PairOutcome {
        PairOutcome {
            src,
            dst,
            peer_access: true,
            unidirectional_gbps: uni,
            bidirectional_gbps: 2.0 * uni,
            copy_latency_us: 8.0,
            load_latency_ns: Some(850.0),
            ..Default::default()
        }
    }

    fn all_pairs(n: u32, uni: impl Fn(u32, u32) -> f64) -> P2pOutcome {
        P2pOutcome {
            pairs: (0..n)
                .flat_map(|a| (0..n).filter(move |b| *b != a).map(move |b| (a, b)))
                .map(|(a, b)| pair(a, b, uni(a, b)))
                .collect(),
            seconds: 1.0,
        }
    }

    fn judge(checks: &Checks, profile: Profile) -> Judge<'_> {
        Judge {
            checks,
            thresholds: Thresholds {
                profile,
                ..Default::default()
            },
            overrides: Default::default(),
        }
    }

    #[test]
    fn healthy_pairs_pass() {
        let checks = Checks::default();
        let gpus: Vec<_> = (0..4).map(gpu).collect();
        let r = with_defaults(
            judge(&checks, Profile::Auto),
            &gpus,
            &all_pairs(4, |_, _| 392.0),
        );
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        assert_eq!(r.pairs.len(), 12);
        assert!(r.pairs.iter().all(|p| p.verdict == Verdict::Pass));
    }

    /// Asserts that one of `reasons` says exactly `want`.
    fn assert_names(reasons: &[gpuval_crds::Reason], want: &str) {
        assert!(reasons.iter().any(|x| x == want), "{want}: {reasons:#?}");
    }

    #[test]
    fn a_pair_under_the_profile_floor_is_named() {
        let checks = Checks::default();
        let gpus: Vec<_> = (0..4).map(gpu).collect();
        // Every pair touching GPU3 is slow, so the relative rule alone would not single it out.
        let out = all_pairs(4, |a, b| if a == 3 || b == 3 { 120.0 } else { 392.0 });
        let r = with_defaults(judge(&checks, Profile::Auto), &gpus, &out);
        assert_eq!(r.verdict, Verdict::Fail);
        assert_names(
            &r.reasons,
            "GPU1->GPU3 unidirectional 120 GB/s < 320 GB/s (H200 profile)",
        );
        let bad = r
            .pairs
            .iter()
            .filter(|p| p.verdict == Verdict::Fail)
            .count();
        assert_eq!(bad, 6);
    }

    #[test]
    fn spec_floor_applies_without_a_profile() {
        let checks = Checks::default();
        let gpus: Vec<_> = (0..2).map(gpu).collect();
        let spec = P2pCheck {
            min_unidirectional_gbps: Some(400),
            max_latency_micros: Some(5),
            ..Default::default()
        };
        let r = judge(&checks, Profile::None).p2p(
            &gpus,
            &all_pairs(2, |_, _| 392.0),
            &spec,
            &LinkErrorMoves::default(),
            &LinkFacts::default(),
        );
        assert_eq!(r.verdict, Verdict::Fail);
        assert_names(
            &r.reasons,
            "GPU0->GPU1 unidirectional 392 GB/s < 400 GB/s (spec)",
        );
        assert_names(
            &r.reasons,
            "GPU1->GPU0 copy latency 8.0 µs > 5 µs (spec maxLatencyMicros)",
        );
    }

    #[test]
    fn one_pair_far_below_the_others_fails_the_relative_rule() {
        let checks = Checks::default();
        let gpus: Vec<_> = (0..4).map(gpu).collect();
        let out = all_pairs(4, |a, b| if (a, b) == (2, 0) { 250.0 } else { 392.0 });
        let r = with_defaults(judge(&checks, Profile::None), &gpus, &out);
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            vec![
                "GPU2->GPU0 unidirectional: 250 GB/s is 36% below the other pairs (median 392)",
                "GPU2->GPU0 bidirectional: 500 GB/s is 36% below the other pairs (median 784)",
            ]
        );
    }

    #[test]
    fn corruption_and_errors_are_reported_per_pair() {
        let checks = Checks::default();
        let gpus: Vec<_> = (0..2).map(gpu).collect();
        let mut out = all_pairs(2, |_, _| 392.0);
        out.pairs[0].mismatches = 7;
        out.pairs[1].error = Some("copy to GPU0: CUDA_ERROR_LAUNCH_FAILED".into());
        out.pairs[1].unidirectional_gbps = 0.0;
        let r = with_defaults(judge(&checks, Profile::None), &gpus, &out);
        assert_eq!(
            r.verdict,
            Verdict::Fail,
            "the corruption leads over the error"
        );
        assert_eq!(r.pairs[0].verdict, Verdict::Fail);
        assert_eq!(r.pairs[1].verdict, Verdict::Error);
        assert_names(&r.reasons, "GPU0->GPU1: 7 words arrived corrupted");
        assert_names(
            &r.reasons,
            "GPU1->GPU0: copy to GPU0: CUDA_ERROR_LAUNCH_FAILED",
        );
    }

    #[test]
    fn nvlink_counters_are_summed_noise_is_noted_and_recovery_fails() {
        let before = [LinkErrors {
            link: 4,
            crc_data: 10,
            ..Default::default()
        }];
        let quiet = [
            LinkErrors {
                link: 4,
                crc_data: 51,
                ..Default::default()
            },
            LinkErrors {
                link: 5,
                crc_data: 12,
                ..Default::default()
            },
        ];
        let mut moves = LinkErrorMoves::default();
        moves.add(0, &before, &quiet);
        assert_eq!(
            moves.notes,
            ["GPU0: CRC data +53 (at most +41 on link 4) over 2 links"]
        );
        assert!(moves.warnings.is_empty() && moves.failures.is_empty());

        let checks = Checks::default();
        let gpus: Vec<_> = (0..2).map(gpu).collect();
        let healthy = all_pairs(2, |_, _| 392.0);
        let j = judge(&checks, Profile::Auto);
        let with_moves = |m: &LinkErrorMoves| {
            j.p2p(
                &gpus,
                &healthy,
                &P2pCheck::default(),
                m,
                &LinkFacts::default(),
            )
        };
        let r = with_moves(&moves);
        assert_eq!(r.verdict, Verdict::Pass);
        assert_eq!(r.nvlink_errors, moves.notes);

        let noisy = [LinkErrors {
            link: 4,
            replay: 900,
            crc_data: 200,
            ..Default::default()
        }];
        let retrained = [LinkErrors {
            link: 7,
            recovery: 1,
            ..Default::default()
        }];
        let mut bad = LinkErrorMoves::default();
        bad.add(1, &[], &noisy);
        assert_eq!(
            bad.warnings,
            ["GPU1 NVLink 4: 1100 replay/CRC errors during the check (> 1000)"]
        );
        assert_eq!(with_moves(&bad).verdict, Verdict::Warn);
        bad.add(2, &[], &retrained);
        assert_eq!(
            bad.failures,
            ["GPU2 NVLink 7: 1 recovery event during the check (the link retrained)"]
        );
        assert_eq!(with_moves(&bad).verdict, Verdict::Fail);
    }

    /// The whole path through the orchestrator on the simulator: a slow GPU's pairs are named
    /// in the node's failures, host transfers land in every GPU's report.
    #[test]
    fn simulated_run_names_the_slow_pairs() {
        let spec: SimSpec = "gpus=4,slow=p2p@2:0.3+host@1:0.4".parse().unwrap();
        let backend = SimBackend::new(spec);
        let checks = Checks {
            p2p: Some(P2pCheck::default()),
            host_transfer: Some(HostTransferCheck::default()),
            ..Default::default()
        };
        let mut plan = Plan::new(checks, Thresholds::default());
        plan.p2p_seed = Some(1);
        let stop = AtomicBool::new(false);
        let report = runner::run(&Backend::Simulated(backend), &plan, &stop, &|_| {});
        assert_eq!(report.verdict, Verdict::Fail);
        let p2p = report.p2p.as_ref().unwrap();
        assert_eq!(p2p.pairs.len(), 12);
        let failed: Vec<(i32, i32)> = p2p
            .pairs
            .iter()
            .filter(|p| p.verdict == Verdict::Fail)
            .map(|p| (p.src, p.dst))
            .collect();
        assert_eq!(failed.len(), 6, "{failed:?}");
        assert!(failed.iter().all(|(a, b)| *a == 2 || *b == 2));
        assert!(
            report.failures.iter().any(|f| f.contains("GPU2")
                && f.contains(" unidirectional 11")
                && f.ends_with("GB/s < 320 GB/s (H200 profile)")),
            "{:#?}",
            report.failures
        );
        let host = report.gpus[1].host_transfer.as_ref().unwrap();
        assert_eq!(host.verdict, Verdict::Fail, "{:?}", host.reasons);
        assert!(
            host.reasons[0].starts_with("GPU1 host→device pinned 22."),
            "{:?}",
            host.reasons
        );
        assert_eq!(
            report.gpus[0].host_transfer.as_ref().unwrap().verdict,
            Verdict::Pass
        );
    }

    #[test]
    fn one_gpu_skips_p2p() {
        let checks = Checks {
            p2p: Some(P2pCheck::default()),
            ..Default::default()
        };
        let report = crate::judge::testing::simulated_run("gpus=1", checks);
        let p2p = report.p2p.unwrap();
        assert_eq!(p2p.verdict, Verdict::Skipped);
        assert_eq!(report.verdict, Verdict::Pass);
    }
}
