//! Failed GPUs written back where DRA-aware schedulers look (pure): a KEP-5055
//! `DeviceTaintRule` per GPU that failed in a node's latest result, selecting its device in the
//! DRA driver's slices (driver, pool, device), its taint naming the reason code, its labels the
//! node and the validation. A GPU that passes again (or a node whose latest result passed) has
//! its rule removed. The shell lists the node's rules, fetches the result and applies the plan.

use std::collections::BTreeSet;

use gpuval_crds::{NodeReport, Verdict, labels};
use serde_json::{Value, json};

use crate::decide::reconcile::allocation::DraGpu;

/// The taint key of a GPU gpuval failed; agent claims tolerate it, so a failed GPU is
/// validated again (and its rule removed when it passes).
pub const TAINT_KEY: &str = "gpuval.io/gpu-failed";
/// The taint's effect: no new claim gets the device; pods running on it stay.
pub const EFFECT: &str = "NoSchedule";
/// The annotation with the failure in words.
pub const MESSAGE_ANNOTATION: &str = "gpuval.io/message";
/// The longest message kept in the annotation.
const MAX_MESSAGE: usize = 512;

/// One GPU that failed: its UUID, first failing code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedGpu {
    pub uuid: String,
    pub code: String,
    pub message: String,
}

/// The GPUs that failed (hardware verdict Fail) in `report`, with their first failure.
pub fn failed_gpus(report: &NodeReport) -> Vec<FailedGpu> {
    report
        .gpus
        .iter()
        .filter(|g| g.verdict == Verdict::Fail)
        .map(|g| {
            let first = g
                .reasons
                .iter()
                .find(|r| r.severity == gpuval_crds::Severity::Fail)
                .or_else(|| g.reasons.first());
            FailedGpu {
                uuid: g.uuid.clone(),
                code: first
                    .map(|r| r.code.as_str().to_string())
                    .unwrap_or_default(),
                message: first.map(|r| r.message.clone()).unwrap_or_default(),
            }
        })
        .collect()
}

/// The rule of one device, named for its pool and device (at most 253 characters).
pub fn rule_name(pool: &str, device: &str) -> String {
    let raw = format!("gpuval-{pool}-{device}").to_ascii_lowercase();
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    gpuval_crds::result::shortened(clean, gpuval_crds::names::DNS1123_SUBDOMAIN_MAX)
}

/// The rules node `node` should have after `validation`'s result: one per failed GPU that the
/// driver `driver` publishes (a failed GPU in no slice gets none), as objects of `api_version`.
pub fn desired(
    api_version: &str,
    driver: &str,
    validation: &str,
    node: &str,
    failed: &[FailedGpu],
    published: &[DraGpu],
) -> Vec<Value> {
    failed
        .iter()
        .filter_map(|f| {
            let gpu = published
                .iter()
                .find(|g| g.uuid.as_deref() == Some(&f.uuid))?;
            let message: String = format!("{validation}: {}", f.message)
                .chars()
                .take(MAX_MESSAGE)
                .collect();
            Some(json!({
                "apiVersion": api_version,
                "kind": "DeviceTaintRule",
                "metadata": {
                    "name": rule_name(&gpu.pool, &gpu.device),
                    "labels": {
                        labels::MANAGED_BY_KEY: labels::MANAGED_BY,
                        labels::NODE: labels::node_value(node),
                        labels::VALIDATION: labels::node_value(validation),
                    },
                    "annotations": {MESSAGE_ANNOTATION: message},
                },
                "spec": {
                    "deviceSelector": {"driver": driver, "pool": gpu.pool, "device": gpu.device},
                    "taint": {"key": TAINT_KEY, "value": f.code, "effect": EFFECT},
                },
            }))
        })
        .collect()
}

/// The rule names of the GPUs `report` passed (a GPU that could not be tested, verdict Error
/// or Skipped, has not passed again).
pub fn passed_rules(report: &NodeReport, published: &[DraGpu]) -> BTreeSet<String> {
    report
        .gpus
        .iter()
        .filter(|g| matches!(g.verdict, Verdict::Pass | Verdict::Warn))
        .filter_map(|g| {
            let gpu = published
                .iter()
                .find(|p| p.uuid.as_deref() == Some(&g.uuid))?;
            Some(rule_name(&gpu.pool, &gpu.device))
        })
        .collect()
}

/// The names among `existing` (the node's rules) to delete: those `want` no longer has whose
/// GPU passed (`passed`; None: the whole node passed).
pub fn stale(
    existing: &[String],
    want: &[Value],
    passed: Option<&BTreeSet<String>>,
) -> Vec<String> {
    let keep: BTreeSet<&str> = want
        .iter()
        .filter_map(|w| w["metadata"]["name"].as_str())
        .collect();
    existing
        .iter()
        .filter(|n| !keep.contains(n.as_str()))
        .filter(|n| passed.is_none_or(|p| p.contains(*n)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use gpuval_crds::{GpuReport, Reason};

    use super::*;

    fn gpu(index: i32, verdict: Verdict, reasons: Vec<Reason>) -> GpuReport {
        GpuReport {
            index,
            uuid: format!("GPU-{index}"),
            verdict,
            reasons,
            ..serde_json::from_value(json!({"index": 0, "uuid": "", "name": "H200",
                "memoryTotalMib": 1, "verdict": "Pass"}))
            .unwrap()
        }
    }

    fn published(n: usize) -> Vec<DraGpu> {
        (0..n)
            .map(|i| DraGpu {
                pool: "node-a".into(),
                device: format!("gpu-{i}"),
                uuid: Some(format!("GPU-{i}")),
            })
            .collect()
    }

    fn report(gpus: Vec<GpuReport>) -> NodeReport {
        NodeReport {
            gpus,
            ..serde_json::from_value(json!({"simulated": false, "backend": "cuda",
                "agentVersion": "1", "startedAt": "", "finishedAt": "", "verdict": "Fail"}))
            .unwrap()
        }
    }

    #[test]
    fn a_failed_gpu_gets_a_rule_for_its_device_naming_the_code_and_validation() {
        let mem = Reason::new(
            gpuval_crds::Code::MemoryMismatch,
            "GPU1 memory: 2 mismatched words",
        );
        let r = report(vec![
            gpu(0, Verdict::Pass, vec![]),
            gpu(1, Verdict::Fail, vec![mem]),
            gpu(2, Verdict::Error, vec![]),
        ]);
        let failed = failed_gpus(&r);
        assert_eq!(failed.len(), 1, "Error is not a hardware verdict");
        let want = desired(
            "resource.k8s.io/v1beta2",
            "gpu.nvidia.com",
            "acceptance",
            "node-a",
            &failed,
            &published(3),
        );
        assert_eq!(want.len(), 1);
        let rule = &want[0];
        assert_eq!(rule["metadata"]["name"], "gpuval-node-a-gpu-1");
        assert_eq!(
            rule["spec"]["deviceSelector"],
            json!({"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"})
        );
        assert_eq!(
            rule["spec"]["taint"],
            json!({"key": TAINT_KEY, "value": "MemoryMismatch", "effect": "NoSchedule"})
        );
        assert_eq!(rule["metadata"]["labels"][labels::VALIDATION], "acceptance");
        assert!(
            rule["metadata"]["annotations"][MESSAGE_ANNOTATION]
                .as_str()
                .unwrap()
                .starts_with("acceptance: GPU1 memory")
        );
        // A GPU in no slice has no device to taint.
        assert!(desired("v", "d", "v", "n", &failed, &published(1)).is_empty());
    }

    #[test]
    fn rules_of_gpus_that_pass_again_are_stale() {
        let existing = vec![
            "gpuval-node-a-gpu-1".to_string(),
            "gpuval-node-a-gpu-2".into(),
        ];
        let failed = vec![FailedGpu {
            uuid: "GPU-2".into(),
            code: "MemoryMismatch".into(),
            message: String::new(),
        }];
        let want = desired("v", "d", "v", "node-a", &failed, &published(3));
        assert_eq!(stale(&existing, &want, None), ["gpuval-node-a-gpu-1"]);
        assert_eq!(stale(&existing, &[], None), existing, "a node that passed");
        // GPU 1 could not be tested this time: its rule stays.
        let r = report(vec![
            gpu(0, Verdict::Pass, vec![]),
            gpu(1, Verdict::Error, vec![]),
        ]);
        let passed = passed_rules(&r, &published(3));
        assert_eq!(passed.len(), 1);
        assert!(stale(&existing, &[], Some(&passed)).is_empty());
        let r = report(vec![gpu(1, Verdict::Warn, vec![])]);
        let passed = passed_rules(&r, &published(3));
        assert_eq!(
            stale(&existing, &[], Some(&passed)),
            ["gpuval-node-a-gpu-1"]
        );
    }

    #[test]
    fn rule_names_are_dns_subdomains() {
        let n = rule_name("Node_A", "gpu-0");
        assert_eq!(n, "gpuval-node-a-gpu-0");
        assert!(gpuval_crds::names::is_dns1123_subdomain(&rule_name(
            &"x".repeat(300),
            "gpu-0"
        )));
    }
}
