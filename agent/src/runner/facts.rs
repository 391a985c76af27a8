//! The node's facts, judged right after the GPUs are inventoried and before any check runs:
//! the GPU count (and bus ids) against what the node should have, each GPU's persistence, ECC
//! and MIG modes against `spec.expect`, and the versions the node runs. A wrong count or a
//! missing bus id fails the node at once; the runner then skips the long checks.

use std::collections::BTreeMap;

use gpuval_crds::facts::{CountSource, Expect, NodeFacts, Versions, canonical_bus_id};
use gpuval_crds::{GpuHealth, SystemInfo};

use crate::backend::{GpuInfo, HiddenGpu};
use crate::checks::Plan;
use crate::judge::{Code, Reason, Says, plural, verdict_of};

crate::check_result!(gpuval_crds::facts::NodeFacts);

/// What the facts say: the node's part, each GPU's mode reasons (by NVML index), and whether
/// the node fails before the checks.
pub struct Judged {
    pub facts: NodeFacts,
    pub gpu_reasons: Vec<(u32, Reason)>,
    pub fail_fast: bool,
}

/// What restricts the GPUs CUDA sees: `CUDA_VISIBLE_DEVICES`'s value, where it is set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CudaDevices {
    pub visible: Option<String>,
}

impl CudaDevices {
    /// From this process's environment.
    pub fn from_env() -> Self {
        Self {
            visible: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        }
    }
}

/// Each GPU NVML lists and CUDA does not see, named with why: a Warn where
/// `CUDA_VISIBLE_DEVICES` leaves it out on purpose, a Fail where nothing restricts CUDA.
fn hidden_gpus(
    hidden: &[HiddenGpu],
    cuda: &CudaDevices,
) -> (Vec<gpuval_crds::facts::HiddenGpu>, Vec<Reason>) {
    let mut listed = Vec::new();
    let mut reasons = Vec::new();
    for h in hidden {
        let (why, code) = match &cuda.visible {
            Some(v) => (
                format!("CUDA_VISIBLE_DEVICES={v} leaves it out"),
                Code::GpuExcludedFromCuda,
            ),
            None => (
                "CUDA cannot see it although CUDA_VISIBLE_DEVICES is not set (driver or device fault?)"
                    .to_string(),
                Code::GpuInvisibleToCuda,
            ),
        };
        reasons.push(code.says(format!(
            "GPU{} ({}, {}) is listed by NVML but not visible to CUDA: {why}; it was not tested",
            h.index, h.uuid, h.pci_bus_id
        )));
        listed.push(gpuval_crds::facts::HiddenGpu {
            index: i32::try_from(h.index).unwrap_or(i32::MAX),
            uuid: h.uuid.clone(),
            pci_bus_id: h.pci_bus_id.clone(),
            reason: why,
        });
    }
    (listed, reasons)
}

/// Judges the inventoried GPUs (all of them, before `--gpus` picks any), the GPUs CUDA does not
/// see, and the system facts.
pub fn judge(
    plan: &Plan,
    gpus: &[GpuInfo],
    hidden: &[HiddenGpu],
    cuda: &CudaDevices,
    system: &SystemInfo,
) -> Judged {
    let seen: Vec<String> = gpus
        .iter()
        .map(|g| canonical_bus_id(&g.pci_bus_id))
        .collect();
    let mut reasons = Vec::new();
    let count = plan.gpu_count();
    let missing = missing_bus_ids(&plan.expect, &seen);
    if let Some((want, from)) = count
        && usize::try_from(want).ok() != Some(gpus.len())
    {
        reasons.push(count_reason(want, from, &seen, &missing));
    } else if !missing.is_empty() {
        reasons.push(bus_id_reason(&plan.expect, &seen, &missing));
    }
    if let Some(claimed) = &plan.dra_gpu_uuids {
        reasons.extend(dra_reason(claimed, gpus));
    }
    let fail_fast = !reasons.is_empty();
    let (hidden_gpus, hidden_reasons) = hidden_gpus(hidden, cuda);
    reasons.extend(hidden_reasons);
    let versions = versions(system, gpus);
    if let Some(mixed) = versions.vbios.as_deref().filter(|v| v.contains('+')) {
        reasons.push(Code::VbiosMixed.says(format!(
            "the node's GPUs run different VBIOS versions: {}",
            mixed.replace('+', ", ")
        )));
    }
    let facts = NodeFacts {
        verdict: verdict_of(&reasons),
        reasons,
        expected_gpus: count.map(|(n, _)| n),
        expected_from: count.map(|(_, f)| f),
        gpus_seen: i32::try_from(gpus.len()).unwrap_or(i32::MAX),
        bus_ids_seen: seen,
        missing_bus_ids: missing,
        versions,
        hidden_gpus,
    };
    let gpu_reasons = gpus
        .iter()
        .flat_map(|g| {
            mode_reasons(&plan.expect, g)
                .into_iter()
                .map(|r| (g.index, r))
        })
        .collect();
    Judged {
        facts,
        gpu_reasons,
        fail_fast,
    }
}

/// The bus ids of `spec.expect.pciBusIds` with no GPU (canonical form, in the spec's order).
fn missing_bus_ids(expect: &Expect, seen: &[String]) -> Vec<String> {
    expect
        .pci_bus_ids
        .iter()
        .map(|b| canonical_bus_id(b))
        .filter(|b| !seen.contains(b))
        .collect()
}

/// `7 GPUs visible, 8 expected (the node's nvidia.com/gpu capacity): NVML sees 0000:18:00.0,
/// ...; no GPU at 0000:5d:00.0 (spec.expect.pciBusIds); the checks were not run`. The words
/// before the first `:` name the fault, as the validation's reason counts group them.
fn count_reason(want: i32, from: CountSource, seen: &[String], missing: &[String]) -> Reason {
    let n = seen.len();
    let mut m = format!(
        "{n} GPU{} visible, {want} expected ({}): NVML sees {}",
        plural(n as u64),
        from.words(),
        if seen.is_empty() {
            "none".to_string()
        } else {
            seen.join(", ")
        }
    );
    if !missing.is_empty() {
        m.push_str(&format!(
            "; no GPU at {} (spec.expect.pciBusIds)",
            missing.join(", ")
        ));
    }
    m.push_str("; the checks were not run");
    if from == CountSource::Spec {
        m.push_str(" (a finding of the spec's expectation, not a measured fault: fix spec.expect.gpuCount, or look at the node)");
        return Code::GpuCountUnexpected.says(m);
    }
    Code::GpuCountMismatch.says(m)
}

/// `the GPUs NVML shows (GPU-a, GPU-c) are not the ones the DRA claim was given (GPU-a,
/// GPU-b)`, when they differ (in any order); None when they are the same.
fn dra_reason(claimed: &[String], gpus: &[GpuInfo]) -> Option<Reason> {
    let mut want: Vec<&str> = claimed.iter().map(String::as_str).collect();
    let mut seen: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    want.sort_unstable();
    seen.sort_unstable();
    (want != seen).then(|| {
        let list = |l: &[&str]| {
            if l.is_empty() {
                "none".to_string()
            } else {
                l.join(", ")
            }
        };
        Code::DraAllocationMismatch.says(format!(
            "the GPUs NVML shows the agent are not those its DRA claim was given: NVML shows {}; the claim has {}; the checks were not run",
            list(&seen),
            list(&want)
        ))
    })
}

fn bus_id_reason(expect: &Expect, seen: &[String], missing: &[String]) -> Reason {
    let listed: Vec<String> = expect
        .pci_bus_ids
        .iter()
        .map(|b| canonical_bus_id(b))
        .collect();
    let extra: Vec<&str> = seen
        .iter()
        .filter(|b| !listed.contains(b))
        .map(String::as_str)
        .collect();
    let mut m = format!(
        "a GPU of spec.expect.pciBusIds is missing: no GPU at {}",
        missing.join(", ")
    );
    if !extra.is_empty() {
        m.push_str(&format!("; NVML sees GPUs at {} instead", extra.join(", ")));
    }
    m.push_str("; the checks were not run");
    Code::GpuBusIdMismatch.says(m)
}

/// A GPU's persistence, ECC and MIG modes against the expectation (a mode NVML does not
/// report is not judged).
fn mode_reasons(expect: &Expect, g: &GpuInfo) -> Vec<Reason> {
    let GpuHealth {
        persistence_mode,
        ecc_enabled,
        mig_mode,
        ..
    } = &g.health;
    [
        (
            *persistence_mode,
            expect.persistence_mode,
            "persistence mode",
            "persistenceMode",
            Code::PersistenceModeUnexpected,
        ),
        (
            *ecc_enabled,
            expect.ecc_mode,
            "ECC",
            "eccMode",
            Code::EccModeUnexpected,
        ),
        (
            *mig_mode,
            expect.mig_mode,
            "MIG mode",
            "migMode",
            Code::MigModeUnexpected,
        ),
    ]
    .into_iter()
    .filter_map(|(on, want, what, field, code)| {
        let on = on?;
        (!want.accepts(on)).then(|| {
            code.says(format!(
                "GPU{}: {what} is {}, expected {want} (spec.expect.{field})",
                g.index,
                if on { "on" } else { "off" }
            ))
        })
    })
    .collect()
}

/// The node's versions: the driver's, the CUDA version the driver supports, NCCL's, and the
/// GPUs' VBIOS (the most common first, joined with `+` when they differ).
fn versions(system: &SystemInfo, gpus: &[GpuInfo]) -> Versions {
    let mut vbios: BTreeMap<&str, usize> = BTreeMap::new();
    for v in gpus
        .iter()
        .filter_map(|g| g.health.vbios_version.as_deref())
    {
        *vbios.entry(v).or_default() += 1;
    }
    let mut by_count: Vec<(&str, usize)> = vbios.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    Versions {
        driver: system.driver_version.clone(),
        vbios: (!by_count.is_empty()).then(|| {
            by_count
                .iter()
                .map(|(v, _)| *v)
                .collect::<Vec<_>>()
                .join("+")
        }),
        cuda: system.cuda_driver_version.clone(),
        nccl: system.nccl_version.clone(),
    }
}

#[cfg(test)]
mod tests {
    /// The facts of GPUs CUDA all sees.
    fn judge_seen(plan: &Plan, gpus: &[GpuInfo], system: &SystemInfo) -> Judged {
        judge(plan, gpus, &[], &CudaDevices::default(), system)
    }

    use gpuval_crds::facts::ModeExpectation;
    use gpuval_crds::{Checks, Severity, Thresholds, Verdict};

    use super::*;
    use crate::judge::testing::h200;

    fn plan(set: impl FnOnce(&mut Plan)) -> Plan {
        let mut p = Plan::new(Checks::default(), Thresholds::default());
        set(&mut p);
        p
    }

    fn with_health(index: u32, set: impl FnOnce(&mut GpuHealth)) -> GpuInfo {
        let mut g = h200(index);
        set(&mut g.health);
        g
    }

    #[test]
    fn gpus_other_than_the_dra_claims_fail_fast_naming_both_lists() {
        let gpus: Vec<GpuInfo> = (0..2).map(h200).collect();
        let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        // The same GPUs in another order: nothing to say.
        let same = plan(|p| p.dra_gpu_uuids = Some(uuids.iter().rev().cloned().collect()));
        let j = judge_seen(&same, &gpus, &SystemInfo::default());
        assert!(!j.fail_fast, "{:?}", j.facts.reasons);
        let other = plan(|p| p.dra_gpu_uuids = Some(vec![uuids[0].clone(), "GPU-claimed".into()]));
        let j = judge_seen(&other, &gpus, &SystemInfo::default());
        assert!(j.fail_fast);
        assert_eq!(j.facts.verdict, Verdict::Fail);
        let r = &j.facts.reasons[0];
        assert_eq!(r.code, Code::DraAllocationMismatch);
        let shown = format!("NVML shows {}, {}", uuids[0], uuids[1]);
        assert!(r.message.contains(&shown), "{}", r.message);
        assert!(
            r.message
                .contains(&format!("the claim has {}, GPU-claimed", uuids[0]))
                || r.message
                    .contains(&format!("the claim has GPU-claimed, {}", uuids[0])),
            "{}",
            r.message
        );
    }

    #[test]
    fn a_missing_gpu_fails_fast_naming_the_count_and_the_bus_ids() {
        let gpus: Vec<GpuInfo> = (0..7).map(h200).collect();
        let p = plan(|p| p.expected_gpus = Some((8, CountSource::Capacity)));
        let j = judge_seen(&p, &gpus, &SystemInfo::default());
        assert!(j.fail_fast);
        assert_eq!(j.facts.verdict, Verdict::Fail);
        let r = &j.facts.reasons[0];
        assert_eq!(r.code, Code::GpuCountMismatch);
        assert_eq!(r.action, gpuval_crds::Action::RebootNode);
        assert!(
            r.message.starts_with("7 GPUs visible, 8 expected (the node's nvidia.com/gpu capacity): NVML sees 0000:18:00.0, 0000:19:00.0,"),
            "{}",
            r.message
        );
        assert_eq!((j.facts.expected_gpus, j.facts.gpus_seen), (Some(8), 7));

        // With the slots listed, the missing one is named.
        let listed: Vec<String> = (0..8).map(|i| h200(i).pci_bus_id).collect();
        let p = plan(|p| {
            p.expect.gpu_count = Some(8);
            p.expect.pci_bus_ids = listed;
        });
        let without_3: Vec<GpuInfo> = (0..8).filter(|i| *i != 3).map(h200).collect();
        let j = judge_seen(&p, &without_3, &SystemInfo::default());
        assert_eq!(j.facts.missing_bus_ids, ["0000:1b:00.0"]);
        assert!(
            j.facts.reasons[0]
                .message
                .contains("no GPU at 0000:1b:00.0 (spec.expect.pciBusIds)")
        );
        assert!(
            j.facts.reasons[0]
                .message
                .contains("(spec.expect.gpuCount)")
        );
        assert_eq!(j.facts.reasons[0].code, Code::GpuCountUnexpected);
    }

    /// A count the spec asks for (`expect.gpuCount: 9` on a node of 8, a typo) is a finding of
    /// the spec, not of the hardware: it says so, is of the Spec category and recommends no
    /// action on the node; the same shortfall against the node's own capacity stays hardware.
    #[test]
    fn a_count_the_spec_expects_is_the_specs_finding_with_no_node_action() {
        let gpus: Vec<GpuInfo> = (0..8).map(h200).collect();
        let p = plan(|p| p.expect.gpu_count = Some(9));
        let j = judge_seen(&p, &gpus, &SystemInfo::default());
        assert!(j.fail_fast);
        let r = &j.facts.reasons[0];
        assert_eq!(r.code, Code::GpuCountUnexpected);
        assert_eq!(r.action, gpuval_crds::Action::None);
        assert!(r.message.contains("spec.expect.gpuCount"), "{}", r.message);
        assert!(r.message.contains("not a measured fault"), "{}", r.message);
        assert_eq!(
            gpuval_crds::Evidence::of_codes(r.code.as_str()),
            gpuval_crds::Evidence::Spec
        );
        let p = plan(|p| p.expected_gpus = Some((9, CountSource::Capacity)));
        let r = &judge_seen(&p, &gpus, &SystemInfo::default()).facts.reasons[0];
        assert_eq!(r.code, Code::GpuCountMismatch);
        assert_eq!(
            gpuval_crds::Evidence::of_codes(r.code.as_str()),
            gpuval_crds::Evidence::Hardware
        );
        // The modes the spec expects act on nothing either.
        for code in [
            Code::EccModeUnexpected,
            Code::MigModeUnexpected,
            Code::GpuBusIdMismatch,
        ] {
            assert_eq!(code.action(), gpuval_crds::Action::None, "{code}");
            assert_eq!(code.evidence(), gpuval_crds::Evidence::Spec, "{code}");
        }
    }

    #[test]
    fn the_right_count_passes_and_a_moved_gpu_is_named() {
        let gpus: Vec<GpuInfo> = (0..8).map(h200).collect();
        let j = judge_seen(
            &plan(|p| p.expect.gpu_count = Some(8)),
            &gpus,
            &SystemInfo::default(),
        );
        assert!(!j.fail_fast);
        assert_eq!(j.facts.verdict, Verdict::Pass);
        let j = judge_seen(&plan(|_| {}), &gpus, &SystemInfo::default());
        assert!(
            !j.fail_fast && j.facts.expected_gpus.is_none(),
            "no expectation: not judged"
        );

        let p = plan(|p| p.expect.pci_bus_ids = vec!["18:00.0".into(), "0000:AA:00.0".into()]);
        let j = judge_seen(&p, &gpus[..2], &SystemInfo::default());
        assert!(j.fail_fast);
        assert_eq!(j.facts.reasons[0].code, Code::GpuBusIdMismatch);
        assert_eq!(
            j.facts.reasons[0].message,
            "a GPU of spec.expect.pciBusIds is missing: no GPU at 0000:aa:00.0; NVML sees GPUs at 0000:19:00.0 instead; the checks were not run"
        );
    }

    #[test]
    fn modes_are_judged_against_the_expectation() {
        let gpus = vec![
            with_health(0, |h| {
                h.ecc_enabled = Some(true);
                h.mig_mode = Some(false);
                h.persistence_mode = Some(false);
            }),
            with_health(1, |h| {
                h.ecc_enabled = Some(false);
                h.mig_mode = Some(true);
                h.persistence_mode = Some(false);
            }),
            with_health(2, |_| {}),
        ];
        let j = judge_seen(&plan(|_| {}), &gpus, &SystemInfo::default());
        let got: Vec<(u32, Code, Severity, &str)> = j
            .gpu_reasons
            .iter()
            .map(|(g, r)| (*g, r.code, r.severity, r.message.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    1,
                    Code::EccModeUnexpected,
                    Severity::Fail,
                    "GPU1: ECC is off, expected On (spec.expect.eccMode)"
                ),
                (
                    1,
                    Code::MigModeUnexpected,
                    Severity::Fail,
                    "GPU1: MIG mode is on, expected Off (spec.expect.migMode)"
                ),
            ]
        );
        assert!(!j.fail_fast, "modes fail the GPU, not before the checks");
        let p = plan(|p| p.expect.persistence_mode = ModeExpectation::On);
        let j = judge_seen(&p, &gpus[..1], &SystemInfo::default());
        assert_eq!(j.gpu_reasons[0].1.code, Code::PersistenceModeUnexpected);
        assert_eq!(j.gpu_reasons[0].1.severity, Severity::Warn);
    }

    #[test]
    fn versions_come_from_the_driver_and_the_gpus() {
        let gpus = vec![
            with_health(0, |h| h.vbios_version = Some("96.00.99.00.01".into())),
            with_health(1, |h| h.vbios_version = Some("96.00.89.00.01".into())),
            with_health(2, |h| h.vbios_version = Some("96.00.99.00.01".into())),
        ];
        let system = SystemInfo {
            driver_version: Some("570.86.15".into()),
            cuda_driver_version: Some("12.8".into()),
            nccl_version: Some("2.28.3".into()),
            ..Default::default()
        };
        let j = judge_seen(&plan(|_| {}), &gpus, &system);
        let v = &j.facts.versions;
        assert_eq!(v.driver.as_deref(), Some("570.86.15"));
        assert_eq!(v.vbios.as_deref(), Some("96.00.99.00.01+96.00.89.00.01"));
        assert_eq!(
            (v.cuda.as_deref(), v.nccl.as_deref()),
            (Some("12.8"), Some("2.28.3"))
        );
        assert_eq!(j.facts.verdict, Verdict::Warn);
        assert_eq!(j.facts.reasons[0].code, Code::VbiosMixed);
        assert!(!j.fail_fast);
    }

    /// A GPU left out by CUDA_VISIBLE_DEVICES is a Warn naming the variable; one CUDA cannot
    /// see with nothing restricting it is a Fail.
    #[test]
    fn gpus_hidden_from_cuda_are_named_with_why() {
        let hidden = [HiddenGpu {
            index: 3,
            uuid: "GPU-3".into(),
            pci_bus_id: "00000000:1B:00.0".into(),
        }];
        let p = Plan::new(Checks::default(), Thresholds::default());
        let visible = CudaDevices {
            visible: Some("0,1,2".into()),
        };
        let j = judge(&p, &[], &hidden, &visible, &SystemInfo::default());
        assert_eq!(j.facts.verdict, Verdict::Warn);
        assert_eq!(j.facts.reasons[0].code, Code::GpuExcludedFromCuda);
        assert!(
            j.facts.reasons[0]
                .message
                .contains("GPU3 (GPU-3, 00000000:1B:00.0) is listed by NVML but not visible to CUDA: CUDA_VISIBLE_DEVICES=0,1,2 leaves it out"),
            "{}",
            j.facts.reasons[0].message
        );
        assert_eq!(
            j.facts.hidden_gpus[0].reason,
            "CUDA_VISIBLE_DEVICES=0,1,2 leaves it out"
        );
        let j = judge(
            &p,
            &[],
            &hidden,
            &CudaDevices::default(),
            &SystemInfo::default(),
        );
        assert_eq!(j.facts.verdict, Verdict::Fail);
        assert_eq!(j.facts.reasons[0].code, Code::GpuInvisibleToCuda);
    }
}
